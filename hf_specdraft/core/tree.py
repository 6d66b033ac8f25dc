"""Token trees: the data a drafter proposes, and the buffers that verify it in one target forward.

A tree is *data*: ``tokens[i]`` and ``parents[i] < i`` (``-1``: a child of the last accepted token, the root). It is
verified (SpecInfer, Miao et al. 2023; Medusa, Cai et al. 2024) in one forward over ``[last token] + tokens``, each
node at position ``prefix_len + depth`` seeing the verified prefix and its own ancestors.

    >>> tree = DraftTree(tokens=torch.tensor([5, 6, 7]), parents=torch.tensor([-1, -1, 0]))
    >>> tree.depth.tolist()
    [0, 0, 1]
    >>> tree_buffers(tree.parent_list)[0].int().tolist()
    [[1, 0, 0], [0, 1, 0], [1, 0, 1]]
"""

from __future__ import annotations

from functools import cached_property

import torch

from .host import host_tensor, stage


class DraftTree:
    """A drafter's proposal.

    Args:
        tokens (`torch.LongTensor` of shape `(N,)`, or a list of ints): proposed ids, where the drafter made them
            (:attr:`token_list`: on the host, once known: given as a list, or from the step's read-back).
        parents (list of ints, or `torch.LongTensor` of shape `(N,)`, read once): each node's parent (``-1``: root).
        draft_probs (`torch.FloatTensor` of shape `(N, V)`, *optional*): q at each node's position, for speculative
            sampling (Leviathan et al. 2023, Algorithm 1) and lenient acceptance.
        sampled (`torch.BoolTensor` of shape `(N,)`, *optional*): True where the token was *drawn* from its q row (not
            picked, e.g. a CAPE expansion token), verified by multi-branch rejection sampling.
    """

    def __init__(self, tokens, parents, draft_probs: torch.Tensor | None = None, sampled=None):
        self.token_list: list[int] | None = list(tokens) if isinstance(tokens, (list, tuple)) else None
        if self.token_list is None:  # host tokens become a tensor only when asked (a host drafter's step needs none)
            self.tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        self.parent_list: list[int] = (
            [int(p) for p in parents] if isinstance(parents, (list, tuple, range)) else parents.reshape(-1).tolist()
        )
        n = len(self.token_list) if self.token_list is not None else self.tokens.shape[0]
        if len(self.parent_list) != n:
            raise ValueError(f"tokens and parents must have the same length, got {n} and {len(self.parent_list)}")
        if any(p < -1 or p >= i for i, p in enumerate(self.parent_list)):
            raise ValueError(f"parents must satisfy -1 <= parents[i] < i (topological order), got {self.parent_list}")
        if draft_probs is not None and draft_probs.shape[0] != n:
            raise ValueError(f"draft_probs must have one row per token ({n}), got shape {tuple(draft_probs.shape)}")
        self.draft_probs = draft_probs
        self.sampled = None if sampled is None else torch.as_tensor(sampled, dtype=torch.bool).reshape(-1)
        if self.sampled is not None and (self.sampled.shape[0] != n or draft_probs is None):
            raise ValueError(
                f"sampled must have one flag per token ({n}) and needs draft_probs, got "
                f"{self.sampled.shape[0]} flags and draft_probs={'None' if draft_probs is None else 'set'}"
            )
        self.origin: DraftTree | None = None  # the tree this one was cut from, keeping its leading nodes (select)
        self.known_tokens: list[int] | None = None  # a prefix of the tokens, known on the host (learn_tokens)
        self.chain_confidences: list[float] | None = None  # the draft's q of each chain token, read by its stop rule
        self.copied = False  # copied from the text, no draft model ran (GLIDE's copy_from_context): CAPE keeps it

    def __repr__(self) -> str:
        tokens = self.token_list if self.token_list is not None else f"<{len(self)} on {self.tokens.device}>"
        return f"DraftTree(tokens={tokens}, parents={self.parent_list})"

    @cached_property
    def tokens(self) -> torch.Tensor:
        """``(N,)`` long: the tokens where the drafter made them (host tokens: a CPU tensor, made when first asked)."""
        return host_tensor(self.token_list)

    @cached_property
    def parents(self) -> torch.Tensor:
        """``(N,)`` long on the tokens' device (made from :attr:`parent_list` when first asked)."""
        return torch.tensor(self.parent_list, dtype=torch.long, device=self.tokens.device)

    @cached_property
    def depth_list(self) -> list[int]:
        """Depth of each node (host); children of the root have depth 0."""
        depth = []
        for p in self.parent_list:
            depth.append(0 if p < 0 else depth[p] + 1)
        return depth

    @property
    def depth(self) -> torch.Tensor:
        """``(N,)`` depth of each node on the tokens' device; children of the root have depth 0."""
        return torch.tensor(self.depth_list, dtype=torch.long, device=self.tokens.device)

    @property
    def levels(self) -> int:
        """How deep the tree reaches: its longest path (0 for an empty tree)."""
        return max(self.depth_list) + 1 if self.parent_list else 0

    def select(self, index, parents) -> DraftTree:
        """The nodes ``index`` (ints, or `(M,)`) with their q rows and flags, under new ``parents``. A leading range is
        sliced (no index reaches the device) and keeps this tree as its :attr:`origin` (:meth:`learn_tokens`)."""
        index = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        leading = index == list(range(len(index)))
        pick = slice(0, len(index)) if leading else torch.tensor(index).to(self.tokens.device, non_blocking=True)
        probs = None if self.draft_probs is None else self.draft_probs[pick]
        sampled = None if self.sampled is None else self.sampled[pick if leading else index]
        tokens = [self.token_list[i] for i in index] if self.token_list is not None else self.tokens[pick]
        tree = DraftTree(tokens, parents, probs, sampled)
        tree.copied = self.copied  # a part of a copy from the text is one too
        tree.origin = self if leading else None
        return tree

    def learn_tokens(self, tokens: list[int]) -> None:
        """The tokens, read back: kept as :attr:`token_list`, and as the known prefix of every tree this one leads (a
        drafter that re-syncs its cache compares its own proposal with the accepted text)."""
        self.token_list = tokens
        origin = self.origin
        while origin is not None:
            origin.known_tokens = tokens
            origin = origin.origin

    @classmethod
    def chain(cls, tokens, draft_probs: torch.Tensor | None = None, sampled: torch.Tensor | None = None) -> DraftTree:
        """A single branch: ``tokens`` ``(k,)`` (a tensor or a list), each the child of the previous one."""
        n = len(tokens) if isinstance(tokens, (list, tuple)) else torch.as_tensor(tokens).numel()
        return cls(tokens, list(range(-1, n - 1)), draft_probs, sampled)

    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> DraftTree:
        return cls(torch.zeros(0, dtype=torch.long, device=device), [])

    def __len__(self) -> int:
        return len(self.parent_list)

    @property
    def is_chain(self) -> bool:
        return self.parent_list == list(range(-1, len(self) - 1))

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive); ``[]`` for ``node = -1``."""
        path, parents = [], self.parent_list
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    def chain_nodes(self) -> list[int]:
        """Node indices of the first-child path from the root (a drafter's greedy chain, which CAPE widens)."""
        nodes = []
        for i, p in enumerate(self.parent_list):
            if p == (nodes[-1] if nodes else -1):
                nodes.append(i)
        return nodes

    def main_chain(self) -> DraftTree:
        """The first-child path from the root (a drafter's greedy chain): a chain-only loop verifies it."""
        nodes = self.chain_nodes()
        return self.select(nodes, list(range(-1, len(nodes) - 1)))

    def merge_duplicates(self) -> DraftTree:
        """Duplicate siblings (same parent and token) merged into the first, which keeps its q row and flag and adopts
        the others' children (``self`` when none repeat): under sampling two copies would both match the row's one
        target sample, and the deeper of their subtrees would bias the output."""
        if self.is_chain:
            return self
        keep, remap, parents, new_index = [], [], [], {}
        tokens = self.token_list if self.token_list is not None else self.tokens.tolist()
        for parent, token in zip(self.parent_list, tokens):
            key = (remap[parent] if parent >= 0 else -1, token)
            if key not in new_index:
                new_index[key] = len(keep)
                keep.append(len(remap))
                parents.append(key[0])
            remap.append(new_index[key])
        return self if len(keep) == len(self) else self.select(keep, parents)

    def truncate_depth(self, max_depth: int) -> DraftTree:
        """Drop nodes at depth ``>= max_depth`` (the length budget); parents stay topological."""
        if len(self) <= max_depth:  # no node can be that deep
            return self
        keep = [i for i, d in enumerate(self.depth_list) if d < max_depth]
        remap = {-1: -1} | {old: new for new, old in enumerate(keep)}
        return self if len(keep) == len(self) else self.select(keep, [remap[self.parent_list[i]] for i in keep])


def fit_proposal(tree: DraftTree, generator, vocab: int, room: int, traits, max_nodes: int | None = None) -> DraftTree:
    """A proposal with duplicate siblings merged, cut to ``room - 1`` levels (``room``: tokens left before max_length,
    one of them the target's own) and to its first ``max_nodes`` nodes (the static path's widest bucket). Its ids are
    checked against the vocabulary here where they are on the host or ``traits`` (the drafter's ``DrafterTraits``) let
    them exceed it (a forward would fail on them), else at the step's read-back (``loop.read_back``)."""
    tree = tree.merge_duplicates().truncate_depth(room - 1)
    if tree.token_list is not None:
        check_vocab(tree.token_list, vocab, generator)
    elif len(tree) and not traits.tokens_in_vocab:
        check_vocab([int(tree.tokens.max()), int(tree.tokens.min())], vocab, generator)
    if max_nodes is not None and len(tree) > max_nodes:
        tree = tree.select(range(max_nodes), tree.parent_list[:max_nodes])
    return tree


def check_vocab(tokens: list[int], vocab: int, generator) -> None:
    """A ``ValueError`` naming the drafter (``generator.name``) when a proposed id lies outside the vocabulary."""
    if any(not 0 <= t < vocab for t in tokens):
        raise ValueError(f"{generator.name} proposed token ids outside the target's vocabulary [0, {vocab})")


def tree_buffers(parents: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Ancestor-or-self matrix and depths of a tree of topological ``parents`` (``-1``: the root), in plain Python (a
    torch op per node costs more than the whole walk): ``ancestors[i, j]`` `(N, N)` bool (host) is True when node ``j``
    is node ``i`` or one of its ancestors."""
    n = len(parents)
    flat = bytearray(n * n)  # row-major (N, N) bools, one byte each
    depth: list[int] = []
    for i, p in enumerate(parents):  # rows are built from already-finished parent rows
        if p >= 0:
            flat[i * n : i * n + n] = flat[p * n : p * n + n]
        flat[i * n + i] = 1
        depth.append(depth[p] + 1 if p >= 0 else 0)
    if not n:
        return torch.zeros(0, 0, dtype=torch.bool), depth
    return torch.frombuffer(flat, dtype=torch.bool).view(n, n), depth


def tree_mask(
    parents, prefix_length: int, dtype: torch.dtype, device: torch.device, queries: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The library's one tree mask (verification, a draft scoring a beam tree), built on the host and copied once
    without a sync (device ops per node cost more than a forward). Each of the ``N`` nodes (``parents``: a list or a
    tensor, read once; ``-1``: the prefix) sees the ``prefix_length`` cached tokens and its ancestors-or-self. Returns
    an additive mask `(1, 1, queries, prefix_length + N)` in ``dtype`` (a bool mask is silently wrong with eager
    attention) for the last ``queries`` nodes (default all), and *all* nodes' positions ``prefix_length + depth``
    `(1, N)` long."""
    ancestors, depth = tree_buffers(parents if isinstance(parents, list) else parents.tolist())
    n = len(depth)
    queries = n if queries is None else queries
    mask = torch.zeros(queries, prefix_length + n, dtype=dtype)
    mask[:, prefix_length:].masked_fill_(~ancestors[n - queries :], torch.finfo(dtype).min)
    positions = host_tensor([prefix_length + d for d in depth], (1, n))
    return stage(None, "mask", mask[None, None], device), stage(None, "positions", positions, device)
