"""Fixed-shape verification on the static cache: a few token-count buckets, trees padded with masked dummy nodes.

A compiled forward is one graph per input shape, so a step verifies ``[last token] + tree`` padded to the smallest
bucket ``Q >= 1 + N`` (:data:`BUCKETS`). Every forward on the static cache takes explicit inputs built here, on the
CPU and moved once (a GPU forward is bound by launches, so no per-node kernel is spent on them):

* ``input_ids`` `(B, Q)`, ``position_ids`` `(B, Q)`: node ``i`` of row ``b`` at position ``cached_b + 1 + depth[i]``;
* the write columns `(B, Q)`: row ``b`` writes at ``len(row.ids) - 1`` onward, past its committed text;
* an additive mask `(B, 1, Q, max_cache_len)` (one per layer type for windowed models): each node sees its row's text,
  the last token and its ancestors (SpecInfer, Miao et al. 2023); a dummy node sees only itself; columns past a row's
  text hold stale states and are never seen.

Medusa, Sequoia and SGLang verify fixed-size trees the same way. Rows that already finished keep their batch slot
(the shapes stay fixed): they verify dummies written into their own first columns, which nothing reads any more.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import get_layer_types_and_kwargs

from .rows import Row
from .host import host_tensor, stage
from .tree import DraftTree, tree_buffers
from .verify import layer_masks, may_window

BUCKETS = (2, 4, 8, 16, 32, 64)  # verified tokens per row; one compiled graph each, captured on first use


def bucket_for(tokens: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket holding ``tokens`` verified tokens per row."""
    for bucket in buckets:
        if bucket >= tokens:
            return bucket
    raise ValueError(f"{tokens} tokens per row do not fit the largest verification bucket {buckets[-1]}")


def cap_nodes(tree: DraftTree, nodes: int) -> DraftTree:
    """The tree's first ``nodes`` nodes (topological order keeps every parent): the widest bucket's limit."""
    if len(tree) <= nodes:
        return tree
    return tree.select(range(nodes), tree.parent_list[:nodes])


def additive(masks, dtype: torch.dtype):
    """A float mask (or a dict of them) built on the host as ``0`` / ``finfo(float32).min``, in ``dtype`` (host)."""
    if isinstance(masks, dict):
        return {kind: additive(mask, dtype) for kind, mask in masks.items()}
    return torch.zeros(masks.shape, dtype=dtype).masked_fill_(masks < 0, torch.finfo(dtype).min)


class _Columns:
    """Stands in for the cache while masks are built over ``n`` columns (the ring layers' own are gathered afterwards)."""

    def __init__(self, n: int):
        self.n = n

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.n, 0


def masks_for(model, cache, visible: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor,
              starts: torch.Tensor | None = None):
    """The model's masks (host, in its dtype) from ``visible`` `(B, Q, L)` bool, per layer type where windows apply
    (:func:`layer_masks`); with ``starts`` `(B,)` (each row's first written column), windowed layers kept on rings get
    theirs (:func:`onto_rings`). Callers put them on the device with :func:`~hf_specdraft.core.host.stage`."""
    base = torch.zeros(visible.shape, dtype=torch.float32).masked_fill_(~visible, torch.finfo(torch.float32).min)[:, None]
    masks = additive(layer_masks(model, _Columns(visible.shape[-1]), base, query_positions, key_positions), model.dtype)
    if cache is None:
        return masks
    if starts is not None and getattr(cache, "has_rings", False):
        masks = onto_rings(model, cache, masks, starts, visible.shape[1])
    return masks


def onto_rings(model, cache, masks, starts: torch.Tensor, width: int):
    """Masks over a ring layer's slots, gathered from masks over the columns `(B, 1, Q, L)`.

    Slot ``c`` of a ring of ``R`` holds, for row ``b`` writing columns ``starts[b] .. starts[b] + width - 1``, the newest
    column ``s ≡ c (mod R)`` up to the last of them; ``s < 0`` (never written) is blocked."""
    types, _ = get_layer_types_and_kwargs(model.config.get_text_config())
    rings = {kind: layer.ring for kind, layer in zip(types, cache.layers) if layer.ring is not None}

    def gather(mask: torch.Tensor, ring: int) -> torch.Tensor:
        batch, _, queries, columns = mask.shape
        slots = torch.arange(ring, device=mask.device)
        last = starts.to(mask.device)[:, None] + width - 1
        held = slots + ring * torch.div(last - slots, ring, rounding_mode="floor")  # (B, R)
        valid = (held >= 0) & (held < columns)
        picked = mask.gather(-1, held.clamp(0, columns - 1)[:, None, None, :].expand(batch, 1, queries, ring))
        return picked.masked_fill(~valid[:, None, None, :], torch.finfo(mask.dtype).min)

    def onto_slots(mask: torch.Tensor, ring: int) -> torch.Tensor:  # the ring's slots, then its scratch slots: never seen
        blocked = torch.full((*mask.shape[:-1], cache.scratch), torch.finfo(mask.dtype).min, dtype=mask.dtype, device=mask.device)
        return torch.cat([gather(mask, ring), blocked], dim=-1)

    if isinstance(masks, dict):
        return {kind: onto_slots(mask, rings[kind]) if kind in rings else mask for kind, mask in masks.items()}
    return onto_slots(masks, next(iter(rings.values())))


def warm_up_inputs(model, cache, width: int, device: torch.device) -> dict:
    """Inputs of a warm-up forward of ``width`` dummy tokens per row, each seeing only itself, written where no row's
    state lives: the full layers' last columns (past any row's text and step) and the ring layers' scratch slots.

    Every key a dummy sees sits at its own position 0, so no window or chunk blocks it (a query that saw nothing
    would write NaN states, which a later full-buffer forward multiplies by its zero weights)."""
    batch, length = cache.num_rows, cache.max_cache_len
    cache.set_visible(None)
    if not cache.windowed:  # the very buffers the bucket's steps fill (static_inputs)
        inputs = cache.bucket_inputs(width, device)
        inputs.fill_warm_up()
        cache.use_write_index(inputs.write_index)
        return inputs.inputs()
    cache.set_write_columns([length - width] * batch, width, device, scratch=True)
    own = torch.arange(length - width, length)[:, None] == torch.arange(length)[None]  # (Q, L)
    positions = torch.zeros(batch, width, dtype=torch.long)
    masks = masks_for(model, None, own.expand(batch, width, length), positions, torch.zeros(batch, length, dtype=torch.long))
    if cache.has_rings:
        types, _ = get_layer_types_and_kwargs(model.config.get_text_config())
        rings = {kind: layer.ring for kind, layer in zip(types, cache.layers) if layer.ring is not None}

        def scratch_mask(ring: int) -> torch.Tensor:  # dummy q wrote scratch slot ring + q
            seen = torch.arange(ring + cache.scratch)[None] == ring + torch.arange(width)[:, None]  # (Q, R + S)
            return additive(torch.where(seen, 0.0, -1.0).expand(batch, 1, width, ring + cache.scratch), model.dtype)

        if isinstance(masks, dict):
            masks = {kind: scratch_mask(rings[kind]) if kind in rings else mask for kind, mask in masks.items()}
        else:
            masks = scratch_mask(next(iter(rings.values())))
    return {"input_ids": stage(cache.inputs, "input_ids", torch.zeros(batch, width, dtype=torch.long), device),
            "position_ids": stage(cache.inputs, "position_ids", positions, device),
            "attention_mask": stage(cache.inputs, "attention_mask", masks, device)}


def static_prefill_inputs(model, cache, input_ids: torch.LongTensor, pads: list[int]) -> dict:
    """Inputs of the prefill over every row's prompt but its newest token, written at columns ``0 .. P - 2``.

    Row ``b``'s token at column ``j >= pad_b`` sits at position ``j - pad_b`` and sees columns ``pad_b .. j``; a
    padding column sees only itself (finite, never seen again)."""
    batch, width = input_ids.shape[0], input_ids.shape[1] - 1
    columns = torch.arange(width)
    pad = torch.tensor(pads)[:, None]
    positions = (columns[None] - pad).clamp(min=0)
    cache.set_visible(width)  # the prefill is eager: it attends to its own columns only
    cache.set_committed(0)
    cache.set_write_columns([0] * batch, width, input_ids.device)
    if batch == 1 and not pads[0] and not may_window(model):
        return {"input_ids": input_ids[:, :-1]}  # one unpadded row, no window: the model's own causal mask (SDPA's fast path)
    keys = torch.arange(width)
    visible = (keys[None, None] >= pad[:, :, None]) & (keys[None, None] <= columns[None, :, None])
    visible |= keys[None, None] == columns[None, :, None]
    key_positions = keys[None] - pad
    return {"input_ids": input_ids[:, :-1], "position_ids": stage(None, "position_ids", positions, input_ids.device),
            "attention_mask": stage(None, "attention_mask", masks_for(model, cache, visible, positions, key_positions), input_ids.device)}


def static_verify_inputs(model, cache, rows: list[Row], trees: list[DraftTree], width: int, fixed: bool = True) -> dict:
    """Inputs of one verification forward of every batch slot, ``width`` tokens each.

    Built on the host from host data (each row's tokens, each tree's parents) and staged onto the device without a
    sync (:func:`~hf_specdraft.core.host.stage`); a tree whose tokens are still on the device (a draft's
    argmax) is copied there, device to device.

    Args:
        rows: the active rows (``row.index`` is the batch slot); ``trees``: their proposals, ``1 + N <= width``.
        fixed: attend to the whole buffer (a compiled graph's fixed shape; ``width`` is a bucket, and the inputs go
            to fixed buffers); otherwise, eager, to the columns the rows reach only, as cheap as a DynamicCache.

    Returns:
        ``input_ids`` `(B, width)` (every slot's), ``position_ids`` and ``attention_mask`` for the model; the write
        columns are set on ``cache``.
    """
    batch = cache.num_rows
    length = cache.max_cache_len if fixed else max(width, *(len(row.tokens) - 1 + width for row in rows))
    cache.set_visible(None if fixed else length)
    if not cache.windowed:
        if not fixed:
            return _unwindowed_verify_inputs(model, cache, rows, trees, width, length)
        inputs = cache.bucket_inputs(width, rows[0].device)  # edited in place from the last step (static_inputs)
        inputs.fill(rows, trees)
        cache.use_write_index(inputs.write_index)
        return inputs.inputs()
    ids = torch.zeros(batch, width, dtype=torch.long)
    positions = torch.zeros(batch, width, dtype=torch.long)
    starts = [0] * batch  # finished slots write their own first columns
    keys = torch.arange(length)
    key_positions = keys.repeat(batch, 1)
    visible = torch.zeros(batch, width, length, dtype=torch.bool)
    visible[:, torch.arange(width), torch.arange(width)] = True
    on_device = []  # (slot, tree) whose tokens are copied on the device
    for row, tree in zip(rows, trees):
        b, n, start, cached = row.index, len(tree), len(row.tokens) - 1, len(row.tokens) - 1 - row.pad
        ancestors, depth = tree_buffers([-1] + [0 if p < 0 else p + 1 for p in tree.parent_list])
        ids[b, 0] = row.tokens[-1]
        if tree.token_list is not None:
            ids[b, 1 : 1 + n] = torch.tensor(tree.token_list, dtype=torch.long)
        elif n:
            on_device.append((b, tree))
        positions[b] = cached
        positions[b, : 1 + n] += torch.tensor(depth)
        starts[b] = start
        key_positions[b] -= row.pad
        key_positions[b, start : start + width] = positions[b]
        visible[b] = False
        visible[b, :, row.pad : start] = True
        visible[b, : 1 + n, start : start + 1 + n] = ancestors
        dummies = torch.arange(1 + n, width)
        visible[b, dummies, start + dummies] = True
    device = rows[0].device
    buffers = cache.inputs if fixed else None
    cache.set_write_columns(starts, width, device)
    ids = stage(buffers, "input_ids", ids, device)
    for b, tree in on_device:
        ids[b, 1 : 1 + len(tree)].copy_(tree.tokens)
    masks = masks_for(model, cache, visible, positions, key_positions, starts=torch.tensor(starts))
    return {"input_ids": ids, "position_ids": stage(buffers, "position_ids", positions, device),
            "attention_mask": stage(buffers, "attention_mask", masks, device)}


def _unwindowed_verify_inputs(model, cache, rows: list[Row], trees: list[DraftTree], width: int, length: int) -> dict:
    """:func:`static_verify_inputs` of an eager forward (its width changes every step) for a target without windowed
    layers: one additive mask written in place and the ids and positions made from host lists, a dozen torch ops a step
    (a loop of per-node ops cost more than a CPU's verification forward of a tiny model)."""
    batch, dtype = cache.num_rows, cache.mask_dtype
    mask = torch.full((batch, 1, width, length), torch.finfo(dtype).min, dtype=dtype)
    ids, positions, starts = [[0] * width for _ in range(batch)], [[0] * width for _ in range(batch)], [0] * batch
    active, on_device = {row.index for row in rows}, []
    for b in range(batch):
        if b not in active:  # a finished slot: dummies at its own first columns, each seeing itself
            mask[b, 0].diagonal()[:width] = 0
    for row, tree in zip(rows, trees):
        b, n, start = row.index, len(tree), len(row.tokens) - 1
        ancestors, depth = tree_buffers([-1] + [0 if p < 0 else p + 1 for p in tree.parent_list])
        ids[b][0] = row.tokens[-1]
        if tree.token_list is not None:
            ids[b][1 : 1 + n] = tree.token_list
        elif n:
            on_device.append((b, tree))
        cached = start - row.pad
        positions[b] = [cached + d for d in depth] + [cached] * (width - 1 - n)
        starts[b] = start
        mask[b, 0, :, row.pad : start] = 0
        mask[b, 0, : 1 + n, start : start + 1 + n].masked_fill_(ancestors, 0)
        mask[b, 0].diagonal(start)[1 + n : width] = 0  # dummy nodes see only themselves
    device = rows[0].device
    cache.set_write_columns(starts, width, device)
    ids = stage(None, "input_ids", host_tensor([t for row in ids for t in row], (batch, width)), device)
    for b, tree in on_device:
        ids[b, 1 : 1 + len(tree)].copy_(tree.tokens)
    positions = host_tensor([p for row in positions for p in row], (batch, width))
    return {"input_ids": ids, "position_ids": stage(None, "position_ids", positions, device),
            "attention_mask": stage(None, "attention_mask", mask, device)}
