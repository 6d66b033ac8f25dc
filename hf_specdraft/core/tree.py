"""Token trees: the data a drafter proposes, and the buffers that verify it in one target forward.

A tree is *data*: ``tokens[i]`` and ``parents[i]`` for nodes ``i = 0..N-1``, with ``parents[i] < i`` and
``-1`` for a node whose parent is the last accepted token (the "root", which is not part of the tree).
A chain is the tree ``parents = [-1, 0, 1, ...]``. Verification (SpecInfer, Miao et al. 2023; Medusa,
Cai et al. 2024) runs ``[last token] + tokens`` through the target with a mask in which each node sees
the verified prefix and its own ancestors, at position ``prefix_len + depth``.

    >>> tree = DraftTree(tokens=torch.tensor([5, 6, 7]), parents=torch.tensor([-1, -1, 0]))
    >>> tree.depth.tolist()
    [0, 0, 1]
    >>> build_tree_buffers(tree.parents)[0].int().tolist()
    [[1, 0, 0], [0, 1, 0], [1, 0, 1]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """A drafter's proposal.

    Args:
        tokens (`torch.LongTensor` of shape `(N,)`): proposed token ids.
        parents (`torch.LongTensor` of shape `(N,)`): index of each node's parent, ``-1`` for children of
            the last accepted token. Topological: ``parents[i] < i``.
        draft_probs (`torch.FloatTensor` of shape `(N, V)`, *optional*): q, the draft distribution each
            token was drawn from (row ``i`` is the distribution at node ``i``'s position). Needed for
            speculative sampling (Leviathan et al. 2023, Algorithm 1) and lenient acceptance.
        sampled (`torch.BoolTensor` of shape `(N,)`, *optional*): True where the node's token was *drawn* from its
            ``draft_probs`` row (not picked, e.g. a CAPE expansion token or a beam). Under sampling, trees with it are
            verified by multi-branch rejection sampling (:func:`~hf_specdraft.core.acceptance.tree_rejection_sampling`).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    draft_probs: torch.Tensor | None = None
    sampled: torch.Tensor | None = None

    def __post_init__(self):
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long).reshape(-1)
        self.parents = torch.as_tensor(self.parents, dtype=torch.long, device=self.tokens.device).reshape(-1)
        if self.tokens.shape != self.parents.shape:
            raise ValueError(f"tokens and parents must have the same length, got {self.tokens.numel()} and {self.parents.numel()}")
        index = torch.arange(self.parents.numel(), device=self.parents.device)
        if bool(((self.parents < -1) | (self.parents >= index)).any()):
            raise ValueError(f"parents must satisfy -1 <= parents[i] < i (topological order), got {self.parents.tolist()}")
        if self.draft_probs is not None and self.draft_probs.shape[0] != self.tokens.numel():
            raise ValueError(f"draft_probs must have one row per token ({self.tokens.numel()}), got shape {tuple(self.draft_probs.shape)}")
        if self.sampled is not None:
            self.sampled = torch.as_tensor(self.sampled, dtype=torch.bool, device=self.tokens.device).reshape(-1)
            if self.sampled.shape != self.tokens.shape or self.draft_probs is None:
                raise ValueError(f"sampled must have one flag per token ({self.tokens.numel()}) and needs draft_probs, got "
                                 f"{self.sampled.numel()} flags and draft_probs={'None' if self.draft_probs is None else 'set'}")

    def select(self, index: torch.Tensor, parents: torch.Tensor) -> DraftTree:
        """The nodes ``index`` `(M,)` (with their q rows and flags) under new ``parents`` `(M,)`."""
        probs = None if self.draft_probs is None else self.draft_probs[index]
        sampled = None if self.sampled is None else self.sampled[index]
        return DraftTree(self.tokens[index], parents, probs, sampled)

    @classmethod
    def chain(cls, tokens: torch.Tensor, draft_probs: torch.Tensor | None = None, sampled: torch.Tensor | None = None) -> DraftTree:
        """A single branch: ``tokens`` ``(k,)``, each the child of the previous one."""
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        return cls(tokens, torch.arange(tokens.numel(), device=tokens.device) - 1, draft_probs, sampled)

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> DraftTree:
        return cls(torch.zeros(0, dtype=torch.long, device=device), torch.zeros(0, dtype=torch.long, device=device))

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def depth(self) -> torch.Tensor:
        """``(N,)`` depth of each node; children of the root have depth 0."""
        return build_tree_buffers(self.parents)[1]

    @property
    def is_chain(self) -> bool:
        return bool((self.parents == torch.arange(len(self), device=self.parents.device) - 1).all())

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive); ``[]`` for ``node = -1``."""
        path, parents = [], self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    def chain_nodes(self) -> list[int]:
        """Node indices of the first-child path from the root (a drafter's greedy chain, which CAPE widens)."""
        nodes, parent = [], -1
        for i, p in enumerate(self.parents.tolist()):
            if p == parent:
                nodes.append(i)
                parent = i
        return nodes

    def main_chain(self) -> DraftTree:
        """The first-child path from the root (a drafter's greedy chain): a chain-only loop verifies it."""
        nodes = self.chain_nodes()
        index = torch.tensor(nodes, dtype=torch.long, device=self.tokens.device)
        return self.select(index, torch.arange(len(nodes), device=self.tokens.device) - 1)

    def merge_duplicates(self) -> DraftTree:
        """The same tree with duplicate siblings (same parent, same token) merged into the first of them.

        The merged node keeps the first duplicate's q row and flag, and the other duplicates' children become its
        children (themselves merged in turn). Verification needs unique siblings: under sampling each
        verified row draws one target sample, so two copies of a token would both match it and the walk
        would pick the deeper of their independently verified subtrees, a choice among draws that biases
        the output. Returns ``self`` when no siblings repeat.
        """
        if self.is_chain:
            return self
        keep: list[int] = []
        new_index: dict[tuple[int, int], int] = {}
        remap: list[int] = []
        parents = []
        for parent, token in zip(self.parents.tolist(), self.tokens.tolist()):
            key = (remap[parent] if parent >= 0 else -1, token)
            if key not in new_index:
                new_index[key] = len(keep)
                keep.append(len(remap))
                parents.append(key[0])
            remap.append(new_index[key])
        if len(keep) == len(self):
            return self
        index = torch.tensor(keep, dtype=torch.long, device=self.tokens.device)
        return self.select(index, torch.tensor(parents, dtype=torch.long, device=self.tokens.device))

    def truncate_depth(self, max_depth: int) -> DraftTree:
        """Drop nodes at depth ``>= max_depth`` (the length budget); parents stay topological."""
        keep = (self.depth < max_depth).nonzero().flatten()
        if keep.numel() == len(self):
            return self
        remap = torch.full((len(self),), -1, dtype=torch.long, device=self.parents.device)
        remap[keep] = torch.arange(keep.numel(), device=keep.device)
        parents = self.parents[keep]
        return self.select(keep, torch.where(parents >= 0, remap[parents.clamp(min=0)], parents))


def build_tree_buffers(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestor-or-self matrix and depths of a tree.

    Args:
        parents (`torch.LongTensor` of shape `(N,)`): topological parent indices (``-1`` = root).

    Returns:
        `(ancestors, depth)`: ``ancestors[i, j]`` is True when node ``j`` is node ``i`` or one of its
        ancestors (`(N, N)` bool); ``depth`` `(N,)` long.
    """
    n = parents.numel()
    ancestors = torch.eye(n, dtype=torch.bool, device=parents.device)
    depth = torch.zeros(n, dtype=torch.long, device=parents.device)
    for i, p in enumerate(parents.tolist()):  # rows are built from already-finished parent rows
        if p >= 0:
            ancestors[i] |= ancestors[p]
            depth[i] = depth[p] + 1
    return ancestors, depth


def tree_mask(parents: torch.Tensor, prefix_length: int, dtype: torch.dtype, device: torch.device,
              queries: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask and positions for tree nodes on top of a cached prefix: each node sees the prefix and its ancestors-or-self.

    The one tree mask of the library: verification (:func:`tree_attention_inputs`) and a draft scoring a beam tree
    (:class:`~hf_specdraft.core.drafting.DraftModelTreeScorer`) both build theirs here.

    Args:
        parents (`torch.LongTensor` of shape `(N,)`): every node of the tree (``-1``: a child of the prefix).
        prefix_length (`int`): tokens in the cache before the tree, at positions ``0 .. prefix_length - 1``.
        queries (`int`, *optional*): only the last ``queries`` nodes are fed (the others are cached); default all.

    Returns:
        `(attention_mask, position_ids)`: an additive float mask `(1, 1, queries, prefix_length + N)` in ``dtype`` (0
        where attended, ``finfo.min`` where blocked; a bool mask is silently wrong with eager attention) and the
        positions ``prefix_length + depth`` of *all* N nodes, `(1, N)` long (the queries' are the last ``queries``).
    """
    ancestors, depth = build_tree_buffers(parents.to(device))
    n = parents.numel()
    queries = n if queries is None else queries
    allowed = torch.zeros(queries, prefix_length + n, dtype=torch.bool, device=device)
    allowed[:, :prefix_length] = True
    allowed[:, prefix_length:] = ancestors[n - queries :]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None], (prefix_length + depth)[None]
