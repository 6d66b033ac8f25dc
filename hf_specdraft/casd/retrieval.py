"""Context-aware drafting: the draft tree 𝕋 retrieved from the pool (the CASD paper, Algorithm 1 line 7, eq. 2).

Step by step (REST, He et al. 2024, which CASD uses for retrieval):

1. :meth:`DraftPool.match` — the longest suffix of the current sequence (16 down to 2) that occurs in
   the context;
2. :meth:`DraftPool.continuations` — the tokens after each occurrence;
3. :func:`merge_continuations` — a trie of those continuations whose nodes count how many continuations
   pass through them (:func:`top_trie_nodes`); the ``max_nodes`` most frequent nodes form the tree.

    >>> pool = DraftPool([7, 8, 1, 2, 7, 8, 1, 3, 7, 8, 1, 2])
    >>> tree, length = retrieve(pool, [5, 7, 8], CasdConfig(max_draft_length=2))
    >>> length, tree.tokens.tolist(), tree.parents.tolist()
    (2, [1, 2, 3], [-1, 0, 0])
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..core.drafting import AUTO
from ..core.tree import DraftTree
from .configuration_casd import PAPER_MAX_NODES, CasdConfig
from .pool import DraftPool


def _node_rank(counts: np.ndarray, depth: np.ndarray, ids: np.ndarray, k: int, m: int, total: int) -> np.ndarray:
    """(frequency desc, depth asc, id asc) as one int64 key: smaller is better."""
    return ((k - counts) * (m + 1) + depth) * total + ids


def top_trie_nodes(rows: np.ndarray, max_nodes: int) -> tuple[np.ndarray, ...]:
    """The ``max_nodes`` most frequent nodes of the trie of ``rows`` (ties: shallower, then earlier).

    The rows are sorted, so a node at depth ``d`` spans the contiguous rows sharing their first ``d + 1`` tokens; the
    trie is walked depth by depth. A node never ranks above its parent and the ``max_nodes``-th best rank only
    improves, so a node that leaves the top set never returns, nor does any descendant: its rows are dropped at once
    (bounding the work on contexts with many distinct continuations).

    ``rows`` `(k, m)`: sorted continuations, ``-1`` after a row's end (it sorts first: no token follows padding).
    Returns `(ids, tokens, parents, depth, counts)` of the kept nodes, each `(num_kept,)` int64, ``parents`` as node
    ids (``-1`` at depth 0).
    """
    k, m = rows.shape
    by_depth = np.ascontiguousarray(rows.T)  # (m, k)
    boundary = np.ones((m, k), dtype=bool)
    np.not_equal(by_depth[:, 1:], by_depth[:, :-1], out=boundary[:, 1:])
    for d in range(1, m):  # a change at depth d-1 changes every longer prefix
        boundary[d] |= boundary[d - 1]
    total = k * m + 1  # bound on node ids
    kept = [np.zeros(0, dtype=np.int64) for _ in range(5)]  # ids, tokens, parents, depth, counts of the top set
    alive, owner, size = np.arange(k), np.full(k, -1, dtype=np.int64), 0
    for d in range(m):
        if not boundary[d:, alive[1:]].any():  # the alive rows agree to the end: the rest is one chain
            chain = by_depth[d:, alive[0]]
            chain = chain[: int(np.argmax(chain < 0))] if bool((chain < 0).any()) else chain
            if chain.size == 0:  # the alive rows all end here
                break
            ids = size + np.arange(chain.size)
            parents = np.concatenate([owner[alive[:1]], ids[:-1]])
            new = [ids, chain, parents, d + np.arange(chain.size), np.full(chain.size, alive.size)]
            return _top([np.concatenate(pair) for pair in zip(kept, new)], max_nodes, k, m, total)
        start = np.flatnonzero(boundary[d, alive])  # alive rows are whole groups of kept depth-(d-1) nodes
        span = np.diff(start, append=alive.size)
        token = by_depth[d, alive[start]]
        real = token >= 0
        local = np.where(real, np.cumsum(real) - 1, -1)  # new node index per group, -1 for ended rows
        new = [
            size + np.arange(int(real.sum())),
            token[real],
            owner[alive[start[real]]],
            np.full(int(real.sum()), d),
            span[real],
        ]
        kept = _top([np.concatenate(pair) for pair in zip(kept, new)], max_nodes, k, m, total)
        in_top = np.zeros(new[0].size + 1, dtype=bool)  # over this depth's new nodes; the last slot is "ended"
        in_top[kept[0][kept[3] == d] - size] = True
        row_node = np.repeat(local, span)
        stay = in_top[row_node]  # row_node = -1 reads the "ended" slot
        owner[alive[stay]] = row_node[stay] + size
        alive = alive[stay]
        size += new[0].size
        if alive.size == 0:
            break
    return tuple(kept)


def _top(nodes: list[np.ndarray], max_nodes: int, k: int, m: int, total: int) -> list[np.ndarray]:
    """The ``max_nodes`` best of ``nodes`` (ids, tokens, parents, depth, counts), by :func:`_node_rank`."""
    if nodes[0].size <= max_nodes:
        return nodes
    best = np.argpartition(_node_rank(nodes[4], nodes[3], nodes[0], k, m, total), max_nodes - 1)[:max_nodes]
    return [x[best] for x in nodes]


def merge_continuations(continuations: np.ndarray, max_nodes: int, rows_sorted: bool = False) -> DraftTree:
    """The draft tree of the ``max_nodes`` most frequent continuation prefixes (REST's pruned trie).

    Nodes are ranked by (frequency desc, depth asc), which keeps every kept node's ancestors, and ordered by (depth,
    frequency desc): each node's most frequent child comes first, so :meth:`DraftTree.main_chain` is the most
    frequent continuation and ties between accepted paths of equal depth go to the more frequent one.

    ``continuations`` `(k, m)`: token ids, ``-1``-padded (``rows_sorted``: already in lexicographic order, as
    :meth:`DraftPool.continuations` returns them). Returns a CPU :class:`~hf_specdraft.core.tree.DraftTree`.
    """
    if continuations.size == 0:
        return DraftTree.empty()
    if not rows_sorted:
        continuations = continuations[np.lexsort(continuations.T[::-1])]  # lexsort's last key is the primary one
    ids, tokens, parents, depth, counts = top_trie_nodes(continuations, max_nodes)
    if ids.size == 0:
        return DraftTree.empty()
    order = np.lexsort((ids, -counts, depth))  # (depth, frequency desc, id): parents first
    ids, tokens, parents = ids[order], tokens[order], parents[order]
    position = {node: i for i, node in enumerate(ids.tolist())}
    new_parents = [position[p] if p >= 0 else -1 for p in parents.tolist()]
    return DraftTree(torch.from_numpy(tokens), torch.tensor(new_parents, dtype=torch.long))


def _tree_of(pool: DraftPool, positions: np.ndarray, length: int, config: CasdConfig) -> DraftTree:
    """The frequency tree of the continuations of the occurrences at ``positions`` `(k,)`."""
    return merge_continuations(
        pool.continuations(positions, length, config.max_draft_length, config.max_matches),
        config.max_nodes,
        rows_sorted=True,
    )


def add_nodes(tokens: list[int], parents: list[int], tree: DraftTree, max_nodes: int) -> None:
    """Add the nodes of ``tree`` missing from the tree (``tokens``, ``parents``), in ``tree``'s order,
    while fewer than ``max_nodes``; a node whose parent could not be added is skipped. In place."""
    index = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}
    mapped = []  # node of ``tree`` -> node of the merged tree, or None
    for token, parent in zip(tree.tokens.tolist(), tree.parents.tolist()):
        merged_parent = -1 if parent < 0 else mapped[parent]
        node = None if merged_parent is None else index.get((merged_parent, token))
        if node is None and merged_parent is not None and len(tokens) < max_nodes:
            node = index[(merged_parent, token)] = len(tokens)
            tokens.append(token)
            parents.append(merged_parent)
        mapped.append(node)


def retrieve(pool: DraftPool, sequence, config: CasdConfig) -> tuple[DraftTree, int]:
    """𝕋 ← R(p) (the CASD paper, Algorithm 1 line 7, eq. 2): `(tree, match_length)` for ``sequence`` `(L,)` (prompt +
    generated tokens, an array, tensor or list; its last ``config.max_suffix_length`` read) in ``pool``, empty and 0
    when no suffix of at least ``min_suffix_length`` tokens occurs there with a continuation.

    With ``config.fill_from_shorter_suffixes`` a tree smaller than ``max_nodes`` is topped up with the trees of ever
    shorter suffixes; the longest match's tree keeps its nodes and order, so its main chain stays the tree's.
    """
    if config.max_nodes == AUTO:  # outside the loop's controller: the paper's tree size
        config = replace(config, max_nodes=PAPER_MAX_NODES)
    if isinstance(sequence, torch.Tensor):
        sequence = sequence.reshape(-1)[-config.max_suffix_length :].cpu().numpy()
    longest, positions = pool.match(sequence, config.min_suffix_length, config.max_suffix_length)
    if longest == 0:
        return DraftTree.empty(), 0
    tree = _tree_of(pool, positions, longest, config)
    if not config.fill_from_shorter_suffixes or len(tree) >= config.max_nodes:
        return tree, longest
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    for length, positions in pool.shorter_matches(sequence, longest, config.min_suffix_length):
        add_nodes(tokens, parents, _tree_of(pool, positions, length, config), config.max_nodes)
        if len(tokens) >= config.max_nodes:
            break
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long)), longest
