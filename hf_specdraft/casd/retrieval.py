"""The draft tree 𝕋 retrieved from the pool (the CASD paper, Algorithm 1 line 7, eq. 2; REST, He et al. 2024): the
``max_nodes`` most frequent nodes of the trie of what followed the text's longest suffix in the context.

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


def top_trie_nodes(rows: np.ndarray, max_nodes: int) -> tuple[np.ndarray, ...]:
    """The ``max_nodes`` most frequent nodes of the trie of ``rows`` `(k, m)` (sorted, ``-1`` after a row's end),
    ties: shallower, then earlier. Returns `(ids, tokens, parents, depth, counts)`, each `(num_kept,)` int64.

    A node at depth ``d`` spans the contiguous rows sharing their first ``d + 1`` tokens. A node never ranks above its
    parent and the ``max_nodes``-th best rank only improves, so a node that leaves the top set never returns, nor does
    any descendant: its rows are dropped at once (bounding the work on contexts with many distinct continuations).
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
        count = int(real.sum())
        local = np.where(real, np.cumsum(real) - 1, -1)  # new node index per group, -1 for ended rows
        new = [size + np.arange(count), token[real], owner[alive[start[real]]], np.full(count, d), span[real]]
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
    """The ``max_nodes`` best of ``nodes`` (ids, tokens, parents, depth, counts) by (frequency desc, depth, id)."""
    if nodes[0].size <= max_nodes:
        return nodes
    ids, depth, counts = nodes[0], nodes[3], nodes[4]
    rank = ((k - counts) * (m + 1) + depth) * total + ids  # one int64 key: smaller is better
    best = np.argpartition(rank, max_nodes - 1)[:max_nodes]
    return [x[best] for x in nodes]


def merge_continuations(continuations: np.ndarray, max_nodes: int, rows_sorted: bool = False) -> DraftTree:
    """REST's pruned trie: the CPU draft tree of the ``max_nodes`` most frequent prefixes of ``continuations`` `(k, m)`
    (``-1``-padded; ``rows_sorted``: already in lexicographic order). Ranking by (frequency desc, depth asc) keeps
    every kept node's ancestors; ordering by (depth, frequency desc) makes the main chain the most frequent one."""
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
    rows = pool.continuations(positions, length, config.max_draft_length, config.max_matches)
    return merge_continuations(rows, config.max_nodes, rows_sorted=True)


def merge_trees(first: DraftTree, others, max_nodes: int) -> DraftTree:
    """``first``, topped up with the missing nodes of each tree of ``others`` in order while it has fewer than
    ``max_nodes`` (a node whose parent could not be added is skipped); ``first`` keeps its nodes and order."""
    tokens, parents = first.tokens.tolist(), first.parents.tolist()
    for tree in others:
        if len(tokens) >= max_nodes:  # before the next tree is built
            break
        parents += [p + len(tokens) if p >= 0 else -1 for p in tree.parents.tolist()]
        merged = DraftTree(tokens + tree.tokens.tolist(), parents).merge_duplicates()  # first occurrences, in order
        tokens, parents = merged.token_list[:max_nodes], merged.parent_list[:max_nodes]
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))


def retrieve(pool: DraftPool, sequence, config: CasdConfig) -> tuple[DraftTree, int]:
    """𝕋 ← R(p): `(tree, match_length)` for ``sequence`` `(L,)` in ``pool`` (empty and 0 without a match); with
    ``config.fill_from_shorter_suffixes`` a smaller tree is topped up with the trees of ever shorter suffixes."""
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
    shorter = pool.shorter_matches(sequence, longest, config.min_suffix_length)
    trees = (_tree_of(pool, positions, length, config) for length, positions in shorter)
    return merge_trees(tree, trees, config.max_nodes), longest
