"""Verification inputs: what one target forward over every active row's ``[last token] + tree`` takes, the mask being
:func:`~hf_specdraft.core.tree.tree_mask` of the tree rooted at the last token (``[-1] + [p + 1 for p in parents]``).
One row keeps the model's causal mask for a chain (SDPA's fast path) and takes a mask per layer type for a tree
(:class:`LayerWindows`); a padded batch pads every row's tree to the widest (:func:`batch_verify_inputs`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

from .rows import Row
from .tree import DraftTree, tree_mask

WINDOWED = ("sliding_attention", "chunked_attention")  # transformers' names for layer types with a window


class LayerWindows:
    """What a model's attention masks depend on, read once per call (asking costs more than a step's mask): the layer
    types, each windowed layer's window, whether it takes a mask per layer type (Mistral-style: one) and the dtype."""

    def __init__(self, model):
        config = model.config.get_text_config()
        declared = getattr(config, "layer_types", None)
        self.per_type, self.dtype = declared is not None, model.dtype
        self.types, self.windows = [], {}  # windows: {layer: window}
        # without a window in the config, no windowed layer can be built (Llama, GPT-2)
        window = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
        if window or any(kind in WINDOWED for kind in declared or ()):
            self.types, kwargs = get_layer_types_and_kwargs(config)
            # kwargs cover the model's layers; a config's layer_types may list more (reduced test configs): not read
            self.windows = {
                i: kw["sliding_window"] for i, (kind, kw) in enumerate(zip(self.types, kwargs)) if kind in WINDOWED
            }
        self.windowed = bool(self.windows)

    def masks(self, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, cache=None):
        """The tree mask each attention layer takes: ``mask`` `(B, 1, Q, K)` covers every cached key plus the queries,
        at ``query_positions`` `(B, Q)` and ``key_positions`` `(K,)` or `(B, K)`. A windowed layer attends from position
        ``p`` only to keys ``> p - window`` (chunked, Llama 4: in ``p``'s chunk), each node at its own position; a
        sliding-window layer of ``cache`` hands the attention only its newest keys (``None``: every column), every key a
        node may see among them. Returns ``mask`` (no windowed layer), ``{layer type: (B, 1, Q, K_t) mask}`` or one."""
        if not self.windowed:
            return mask
        masks = {}
        for i, kind in enumerate(self.types):
            window = self.windows.get(i)
            if kind in masks or window is None:  # a layer type's mask is the same in each of its layers
                masks.setdefault(kind, mask)
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
) -> dict:
    """``input_ids``, ``attention_mask`` and ``position_ids`` of one forward over every row's ``[last token] + tree``:
    `(A, Q)` ids (``Q = 1 + max N_a``, padded slots hold token 0), an additive mask `(A, 1, Q, columns + Q)` (a padded
    slot sees only itself) and `(A, Q)` positions; row ``a`` occupies the last ``rows[a].cached`` of ``columns``."""
    width = 1 + max(len(t) for t in trees)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    positions = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.full((len(rows), 1, width, columns + width), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[:, 0, :, columns:].diagonal(dim1=-2, dim2=-1).fill_(0)  # padded slots see themselves (all -inf would be NaN)
    for a, (row, tree) in enumerate(zip(rows, trees)):
        q = 1 + len(tree)
        ids[a, 0] = row.ids[0, -1]
        ids[a, 1:q] = tree.tokens.to(device)
        row_mask, row_positions = tree_mask([-1] + [p + 1 for p in tree.parent_list], row.cached, dtype, device)
        positions[a, :q] = row_positions[0]
        positions[a, q:] = row.cached
        mask[a, 0, :q, columns - row.cached : columns + q] = row_mask[0, 0]  # the row's cached columns, then its tree
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def single_row_inputs(windows: LayerWindows, input_ids: torch.LongTensor, cache: DynamicCache, tree: DraftTree) -> dict:
    """Inputs of the forward over ``[last token] + tree`` for one unpadded row that owns ``cache`` (covering
    ``input_ids[:, :-1]``): a chain keeps the model's own causal mask, a tree takes the tree mask, per layer type."""
    verify_ids = torch.cat([input_ids[:, -1:], tree.tokens.to(input_ids.device)[None]], dim=-1)
    if tree.is_chain:  # an empty tree too
        return {"input_ids": verify_ids}
    past = input_ids.shape[1] - 1
    mask, positions = tree_mask([-1] + [p + 1 for p in tree.parent_list], past, windows.dtype, input_ids.device)
    keys = torch.cat([torch.arange(past, device=input_ids.device), positions[0]])
    return {
        "input_ids": verify_ids,
        "attention_mask": windows.masks(mask, positions, keys, cache),
        "position_ids": positions,
    }
