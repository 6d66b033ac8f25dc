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
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, get_layer_types_and_kwargs

WINDOWED_LAYER_TYPES = ("sliding_attention", "chunked_attention")  # transformers' names for layers with a window


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
            verified by multi-branch rejection sampling (:func:`~hf_specdraft.acceptance.tree_rejection_sampling`).
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

    def main_chain(self) -> DraftTree:
        """The first-child path from the root (a drafter's greedy chain): a chain-only loop verifies it."""
        nodes, parent, parents = [], -1, self.parents.tolist()
        for i, p in enumerate(parents):
            if p == parent:
                nodes.append(i)
                parent = i
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
    (:class:`~hf_specdraft.drafting.DraftModelTreeScorer`) both build theirs here.

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


def tree_attention_inputs(tree: DraftTree, past_length: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask and positions to verify ``[last token] + tree.tokens`` on top of a cache of ``past_length``.

    The last accepted token sits at position ``past_length`` and sees the whole cache; node ``i`` sits at
    ``past_length + 1 + depth[i]`` and sees the cache, the last token and its ancestors-or-self: the tree with the
    last token as its root, through :func:`tree_mask`.

    Returns:
        `(attention_mask, position_ids)`: an additive float mask `(1, 1, 1+N, past_length+1+N)` in
        ``dtype`` and `(1, 1+N)` long positions.
    """
    parents = tree.parents.to(device)
    rooted = torch.cat([parents.new_full((1,), -1), torch.where(parents < 0, 0, parents + 1)])
    return tree_mask(rooted, past_length, dtype, device)


def layer_masks(model, cache: DynamicCache, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor):
    """The tree mask each attention layer of ``model`` takes on ``cache``.

    Without sliding-window or chunked layers this is ``mask`` itself. With them, transformers' models take one
    mask per ``config.layer_types`` entry (a dict; Mistral-style configs without ``layer_types`` window every
    layer and take one tensor). A windowed layer attends from a query at position ``p`` only to keys at positions
    ``> p - window`` (transformers' ``sliding_window_overlay``; chunked, Llama 4: keys in ``p``'s chunk of
    ``window`` positions), each tree node counted at its own position. A sliding-window cache layer hands the
    attention only its newest keys (``cache.get_mask_sizes``): its mask keeps only their columns. Every key a
    tree node may see is among them, since every node sits at or after the last accepted position.

    Args:
        mask: additive float mask `(1, 1, Q, K)` over every cached key plus the queries.
        query_positions: `(1, Q)` long, as passed to the model.
        key_positions: `(K,)` long, the position of each of ``mask``'s columns.

    Returns:
        ``mask``, or a dict ``{layer type: (1, 1, Q, K_type) mask}``, or one windowed mask.
    """
    config = model.config.get_text_config()
    declared = getattr(config, "layer_types", None) or ()
    if not (getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
            or any(kind in WINDOWED_LAYER_TYPES for kind in declared)):
        return mask  # no windowed layer can be built from this config (Llama, GPT-2, ...): nothing to ask per layer
    types, kwargs = get_layer_types_and_kwargs(config)
    windowed = {i for i, t in enumerate(types) if t in WINDOWED_LAYER_TYPES}
    if not windowed:
        return mask
    q = query_positions.shape[-1]
    masks = {}
    for i, kind in enumerate(types):
        if kind in masks:
            continue
        if i not in windowed:
            masks[kind] = mask
            continue
        window = kwargs[i]["sliding_window"]
        handed = cache.get_mask_sizes(q, i)[0]  # a sliding cache layer hands over only its newest keys
        keys, query = key_positions[-handed:].to(mask.device), query_positions[0, :, None].to(mask.device)
        inside = (query // window == keys // window) if kind == "chunked_attention" else (query - keys < window)
        masks[kind] = mask[..., -handed:].masked_fill(~inside[None, None], torch.finfo(mask.dtype).min)
    return masks if getattr(config, "layer_types", None) is not None else masks[types[0]]


def compact_cache(cache: DynamicCache, keep: torch.Tensor) -> None:
    """Keep only the sequence positions ``keep`` `(M,)` of every layer of ``cache``, in place.

    When ``keep`` is ``arange(M)`` this is a crop. Otherwise keys/values are gathered with
    ``index_select`` on the sequence dimension; cached keys are post-RoPE, and the kept tree nodes were
    rotated at ``prefix_len + depth``, which is exactly their final sequence position. A sliding-window
    layer holds only its newest keys: its indices are shifted by what it no longer holds, and afterwards it
    is trimmed back to the ``window - 1`` keys the next forward can see (:func:`trim_windows`).
    """
    length = cache.get_seq_length()
    m = keep.numel()
    if m == length:
        trim_windows(cache)
        return
    if bool((keep == torch.arange(m, device=keep.device)).all()):
        cache.crop(m - length)  # transformers 5.23 crops by a negative count of tokens to drop (sliding layers too)
        trim_windows(cache)
        return
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel():
            shift = length - layer.keys.shape[-2]  # positions a sliding-window layer no longer holds
            index = keep.to(layer.keys.device)
            index = index[index >= shift] - shift
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
            if hasattr(layer, "cumulative_length"):  # sliding-window layers count the tokens seen
                layer.cumulative_length = m
    trim_windows(cache)


def trim_windows(cache: DynamicCache) -> None:
    """Drop the keys no later forward can see from sliding-window layers that record their past.

    With past recording on (the loop turns it on, so that a rejected branch never pushes a key out of
    the window), such a layer keeps every key until a crop. After compaction only the newest
    ``window - 1`` are ever seen again, so the cache stays the window's size at any length.
    """
    for layer in cache.layers:
        window = getattr(layer, "sliding_window", None)
        if window and getattr(layer, "is_initialized", False) and layer.keys.shape[-2] > window - 1 >= 0 and layer.cumulative_length >= window:
            layer.keys = layer.keys[:, :, -window + 1 :]
            layer.values = layer.values[:, :, -window + 1 :]


def croppable_cache(model) -> DynamicCache:
    """A cache for a draft that is cropped back to the accepted text every step, at any length.

    The layers transformers builds for ``model``, with each sliding-window (or chunked) layer replaced by a full
    one: such a layer drops the keys a crop past its window would need. transformers' own sliding masks select
    the window on a full layer, and tree masks get it from :func:`~hf_specdraft.tree.layer_masks`. A draft is
    small, so keeping its whole past costs little; the target keeps its windows (the loop trims them).
    """
    cache = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
    return cache


def common_prefix(seen: torch.Tensor, ids: torch.Tensor, limit: int | None = None) -> int:
    """How many of a draft cache's tokens ``seen`` `(S,)` a re-sync to the accepted text ``ids`` `(L,)` keeps: their common
    prefix, never past ``limit`` (default ``L - 1``: the newest token is fed again for its logits)."""
    seen = seen.to(ids.device)
    m = min(seen.numel(), ids.numel())
    differ = (seen[:m] != ids[:m]).nonzero()
    return min(int(differ[0]) if differ.numel() else m, ids.numel() - 1 if limit is None else limit)


def resync_cache(cache: DynamicCache, seen: torch.Tensor, ids: torch.Tensor, limit: int | None = None) -> int:
    """Crop a draft's own cache (covering the 1-D tokens ``seen``) back to its common prefix with the accepted text
    ``ids`` `(L,)`, never past ``limit`` (default ``L - 1``: the newest token is fed again for its logits).

    Every drafter that keeps its cache across steps (draft model, GLIDE, CAPE's beam scorer, the cascade's drafts,
    the shipped CAPE loop) re-syncs this way after verification. Returns the kept length: feed ``ids[keep:]`` next.
    """
    keep = common_prefix(seen, ids, limit)
    if cache.get_seq_length() > keep:
        cache.crop(keep - cache.get_seq_length())  # transformers 5.23 crops by a negative count too
    return keep

