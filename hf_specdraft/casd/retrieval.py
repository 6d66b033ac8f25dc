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


def merge_continuations(continuations: np.ndarray, max_nodes: int, rows_sorted: bool = False) -> DraftTree:
    """REST's pruned trie: the CPU draft tree of the ``max_nodes`` most frequent prefixes of ``continuations`` `(k, m)`
    (``-1``-padded; ``rows_sorted``: already in lexicographic order), ties: shallower, then earlier.

    A node at depth ``d`` is a group of contiguous sorted rows sharing their first ``d + 1`` tokens. It never ranks
    above its parent, so the kept nodes hold every kept node's ancestors; ordered by (depth, frequency desc), the main
    chain is the most frequent continuation.
    """
    if continuations.size == 0:
        return DraftTree.empty()
    if not rows_sorted:
        continuations = continuations[np.lexsort(continuations.T[::-1])]  # lexsort's last key is the primary one
    k, m = continuations.shape
    by_depth = continuations.T  # (m, k)
    boundary = np.ones((m, k), dtype=bool)
    np.not_equal(by_depth[:, 1:], by_depth[:, :-1], out=boundary[:, 1:])
    boundary = np.logical_or.accumulate(boundary, axis=0)  # a change at depth d-1 changes every longer prefix
    group = np.cumsum(boundary.ravel()).reshape(m, k) - 1  # (m, k): each row's group at each depth
    depth, start = np.nonzero(boundary)  # each group's depth and first row; its index is its id
    last = np.append(depth[1:] != depth[:-1], True)  # the last group of a depth ends at row k
    counts = np.where(last, k, np.append(start[1:], k)) - start
    tokens = by_depth[depth, start]
    kept = np.flatnonzero(tokens >= 0)  # rows that ended before a depth make no node there
    if kept.size > max_nodes:
        rank = ((k - counts[kept]) * (m + 1) + depth[kept]) * tokens.size + kept  # one int64 key: smaller is better
        kept = kept[np.argpartition(rank, max_nodes - 1)[:max_nodes]]
    if kept.size == 0:
        return DraftTree.empty()
    kept = kept[np.lexsort((kept, -counts[kept], depth[kept]))]  # (depth, frequency desc, id): parents first
    position = np.full(tokens.size, -1)
    position[kept] = np.arange(kept.size)
    parents = np.where(depth[kept] > 0, position[group[np.maximum(depth[kept] - 1, 0), start[kept]]], -1)
    return DraftTree(torch.from_numpy(tokens[kept]), torch.from_numpy(parents))


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
