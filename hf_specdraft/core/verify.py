"""Verification inputs: what one target forward over every active row's ``[last token] + tree`` takes.

A tree is verified in one forward (SpecInfer, Miao et al. 2023; Medusa, Cai et al. 2024): node ``i`` sits at position
``past + 1 + depth[i]`` and sees the verified prefix, the last accepted token and its own ancestors. Two layouts:

* **one row that owns the cache** (batch 1, unpadded): a chain keeps the model's own causal mask (the fast SDPA
  path), a tree takes the float tree mask and explicit positions, windowed per layer type
  (:class:`LayerWindows`: sliding-window and chunked layers verify trees at any length);
* **a padded batch** sharing one right-aligned cache (:mod:`hf_specdraft.core.cache`): every row's tree padded to
  the widest, one 4D mask (:func:`batch_verify_inputs`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

from .rows import Row
from .support import with_cache
from .tree import DraftTree, tree_mask

WINDOWED_LAYER_TYPES = ("sliding_attention", "chunked_attention")  # transformers' names for layers with a window


def tree_attention_inputs(
    tree: DraftTree, past_length: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask and positions to verify ``[last token] + tree.tokens`` on top of a cache of ``past_length``.

    The last accepted token sits at position ``past_length`` and sees the whole cache; node ``i`` sits at
    ``past_length + 1 + depth[i]`` and sees the cache, the last token and its ancestors-or-self: the tree with the
    last token as its root, through :func:`tree_mask`.

    Returns:
        `(attention_mask, position_ids)`: an additive float mask `(1, 1, 1+N, past_length+1+N)` in
        ``dtype`` and `(1, 1+N)` long positions.
    """
    return tree_mask([-1] + [0 if p < 0 else p + 1 for p in tree.parent_list], past_length, dtype, device)


class LayerWindows:
    """What a model's attention masks depend on, read once per call from its config (asking it costs more than a step's
    mask): the layer types, the window of each sliding-window or chunked layer, whether the model takes one mask per
    layer type (a dict; Mistral-style configs without ``layer_types`` window every layer and take one tensor), and the
    masks' dtype (the model's)."""

    def __init__(self, model):
        config = model.config.get_text_config()
        declared = getattr(config, "layer_types", None)
        self.per_type, self.dtype = declared is not None, model.dtype
        self.types, self.windows = [], {}  # windows: {layer: window}
        # without a window in the config, no windowed layer can be built (Llama, GPT-2)
        if (
            getattr(config, "sliding_window", None)
            or getattr(config, "attention_chunk_size", None)
            or any(kind in WINDOWED_LAYER_TYPES for kind in declared or ())
        ):
            self.types, kwargs = get_layer_types_and_kwargs(config)
            # kwargs cover the model's layers; a config's layer_types may list more (reduced test configs): not read
            self.windows = {
                i: kw["sliding_window"]
                for i, (kind, kw) in enumerate(zip(self.types, kwargs))
                if kind in WINDOWED_LAYER_TYPES
            }
        self.windowed = bool(self.windows)

    def rings(self, widest: int, columns: int) -> dict[int, tuple[int, int]]:
        """``{layer: (window, ring)}`` for the windowed layers whose ring (``window + widest`` bucket) is shorter than a
        row of ``columns``: their static buffers stay the window's size at any length."""
        return {
            i: (window, window + widest) for i, window in self.windows.items() if window and window + widest < columns
        }

    def masks(self, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, cache=None):
        """The tree mask each attention layer takes (on ``cache``; ``None``: every column of ``mask`` is handed over).

        A windowed layer attends from a query at position ``p`` only to keys at positions ``> p - window``
        (transformers' ``sliding_window_overlay``; chunked, Llama 4: keys in ``p``'s chunk of ``window`` positions),
        each tree node counted at its own position. A sliding-window cache layer hands the attention only its newest
        keys (``cache.get_mask_sizes``): its mask keeps only their columns. Every key a tree node may see is among them,
        since every node sits at or after the last accepted position.

        Args:
            mask: additive float mask `(B, 1, Q, K)` over every cached key plus the queries.
            query_positions: `(B, Q)` long, as passed to the model.
            key_positions: `(K,)` or `(B, K)` long, the position of each of ``mask``'s columns.

        Returns:
            ``mask`` (no windowed layer), a dict ``{layer type: (B, 1, Q, K_type) mask}``, or one windowed mask.
        """
        if not self.windowed:
            return mask
        masks = {}
        for i, kind in enumerate(self.types):
            if kind in masks:
                continue
            window = self.windows.get(i)
            if window is None:
                masks[kind] = mask
                continue
            handed = mask.shape[-1] if cache is None else cache.get_mask_sizes(query_positions.shape[-1], i)[0]
            keys = key_positions[..., -handed:].to(mask.device).unsqueeze(-2)
            query = query_positions[:, :, None].to(mask.device)
            # (B, Q, K)
            inside = (query // window == keys // window) if kind == "chunked_attention" else (query - keys < window)
            masks[kind] = mask[..., -handed:].masked_fill(~inside[:, None], torch.finfo(mask.dtype).min)
        return masks if self.per_type else masks[self.types[0]]


def batch_verify_inputs(
    rows: list[Row], trees: list[DraftTree], columns: int, dtype: torch.dtype, device: torch.device
):
    """Inputs of one target forward over every row's ``[last token] + tree``, trees padded to the widest.

    Args:
        rows: the ``A`` active rows; row ``a`` occupies the last ``rows[a].cached`` of the cache's ``columns``.
        trees: one proposal per row, ``N_a`` nodes.

    Returns:
        `(input_ids, attention_mask, position_ids)`: `(A, Q)` tokens with ``Q = 1 + max N_a`` (padded slots hold
        token 0), an additive float mask `(A, 1, Q, columns + Q)` (each node sees its row's cached columns, its last
        token and its ancestors; a padded slot sees only itself) and `(A, Q)` positions.
    """
    width = 1 + max(len(t) for t in trees)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    positions = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.full((len(rows), 1, width, columns + width), torch.finfo(dtype).min, dtype=dtype, device=device)
    diagonal = torch.arange(width, device=device)
    mask[:, 0, diagonal, columns + diagonal] = 0  # padded slots see themselves (a row of all -inf would be NaN)
    for a, (row, tree) in enumerate(zip(rows, trees)):
        q = 1 + len(tree)
        ids[a, 0] = row.ids[0, -1]
        ids[a, 1:q] = tree.tokens.to(device)
        row_mask, row_positions = tree_attention_inputs(tree, row.cached, dtype, device)
        positions[a, :q] = row_positions[0]
        positions[a, q:] = row.cached
        mask[a, 0, :q, columns - row.cached : columns] = row_mask[0, 0, :, : row.cached]
        mask[a, 0, :q, columns : columns + q] = row_mask[0, 0, :, row.cached :]
    return ids, mask, positions


def single_row_inputs(windows: LayerWindows, input_ids: torch.LongTensor, cache: DynamicCache, tree: DraftTree) -> dict:
    """Inputs of the forward over ``[last token] + tree`` for one unpadded row that owns ``cache`` (covering
    ``input_ids[:, :-1]``): a chain keeps the model's own causal mask, a tree takes the tree mask, per layer type."""
    verify_ids = torch.cat([input_ids[:, -1:], tree.tokens.to(input_ids.device)[None]], dim=-1)
    if not len(tree) or tree.is_chain:
        return {"input_ids": verify_ids}
    mask, positions = tree_attention_inputs(tree, input_ids.shape[1] - 1, windows.dtype, input_ids.device)
    keys = torch.cat([torch.arange(input_ids.shape[1] - 1, device=input_ids.device), positions[0]])
    return {
        "input_ids": verify_ids,
        "attention_mask": windows.masks(mask, positions, keys, cache),
        "position_ids": positions,
    }


def verify_tree(model, input_ids: torch.LongTensor, cache: DynamicCache, tree: DraftTree) -> torch.Tensor:
    """One target forward over ``[last token] + tree`` on a cache covering ``input_ids[:, :-1]`` `(1, L)`. Returns
    float32 logits `(1+N, V)`: row 0 scores the token after the last one, row ``1+i`` the token after node ``i``."""
    inputs = single_row_inputs(LayerWindows(model), input_ids, cache, tree)
    return model(**inputs, **with_cache(model, cache), use_cache=True).logits[0].float()
