"""A static KV cache the loop owns (``cache_implementation="static"``, docs/static-cache.md): one buffer
`(B, H, max_cache_len, D)` a layer, allocated once and reused by later calls of the same shape.

Row ``b`` keeps its text at columns ``[pad_b, len(row.ids) - 1)``. A step writes ``[last token] + tree``, padded to a
bucket of ``Q`` tokens, past that; acceptance moves the accepted columns into place with one ``index_copy_``
(:meth:`StaticRowsCache.keep`, as Sequoia compacts); nothing is rewound, and the mask hides the columns past a row's
text (as gpt-fast does). transformers' ``StaticCache`` writes at one length for the whole batch and cannot crop.

A compiled forward's inputs sit in fixed buffers per bucket, edited in place from step to step (:class:`BucketInputs`,
as SGLang's CUDA-graph runner keeps one per batch size): a row's mask changes only where its text grew and in its tree
block, edited through NumPy views of host staging buffers (well under a microsecond, against 5-10 µs a torch op).
"""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .host import copy_to_device, host_tensor, on_device, stage, to_device
from .tree import tree_buffers
from .verify import LayerWindows

BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # a float dtype's item size -> the integer dtype of its bits
MAX_BLOCKS = 1024  # distinct tree shapes kept per bucket (a chain drafter has a handful, a CAPE tree a few hundred)


class LayerStorage:
    """One buffer `(2, N, B, H, L, D)` holding the keys and values of a cache's ``N`` full layers, when they share one
    shape: a step's :meth:`StaticRowsCache.keep` then moves a row's columns in every layer with one ``index_select`` and
    one ``index_copy_`` (per-layer tensors take four ops a layer: 120 small kernels a step on a 30-layer target)."""

    def __init__(self, layers: int):
        self.layers, self.buffer = layers, None

    def views(self, i: int, keys_shape: tuple, values_dim: int, dtype: torch.dtype, device: torch.device):
        """Layer ``i``'s `(keys, values)` views, or ``None`` when its shape is not the storage's (it allocates its
        own)."""
        if keys_shape[-1] != values_dim:
            return None
        if self.buffer is None:
            self.buffer = torch.zeros(2, self.layers, *keys_shape, dtype=dtype, device=device)
        if (self.buffer.shape[2:], self.buffer.dtype, self.buffer.device) != (torch.Size(keys_shape), dtype, device):
            return None
        return self.buffer[0, i], self.buffer[1, i]


class StaticRowsLayer(CacheLayerMixin):
    """One layer's static buffers. Writes go to the columns the cache was given for this forward
    (:meth:`StaticRowsCache.set_write_columns`), one per row and query: rows write at lengths of their own."""

    is_compileable = True
    is_sliding = False  # windowed layers see their window through the mask, on a ring of their own (below)

    def __init__(self, max_cache_len: int, ring: int | None = None, window: int | None = None, scratch: int = 0):
        super().__init__()
        # a windowed layer keeps `ring` = window + widest bucket columns, column c in slot c % ring (a step never
        # overwrites a key its queries can see), then `scratch` slots no column maps to, for warm-up dummies
        self.max_cache_len, self.ring, self.window = max_cache_len, ring, window
        self.scratch = scratch if ring is not None else 0
        self.write_index: torch.Tensor | None = None  # (B, 1, Q, 1) long: the slots this forward writes
        self.committed = 0  # the longest row's committed columns (informative: every forward takes its own mask)
        self.visible: int | None = None  # eager forwards attend to the first `visible` columns; None: all
        self.prefilling = False  # the prefill (on an empty cache) attends to its own states only
        self.storage: tuple[LayerStorage, int] | None = None  # full layers: the cache's storage, this layer's index
        self.in_storage = False  # whether keys and values are views of that storage

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        batch, heads = key_states.shape[:2]
        size = self.ring + self.scratch if self.ring is not None else self.max_cache_len
        shape = (batch, heads, size, key_states.shape[-1])
        views = self.storage and self.storage[0].views(
            self.storage[1], shape, value_states.shape[-1], self.dtype, self.device
        )
        self.in_storage = views is not None
        self.keys, self.values = views or (
            torch.zeros(shape, dtype=self.dtype, device=self.device),
            torch.zeros(batch, heads, size, value_states.shape[-1], dtype=self.dtype, device=self.device),
        )
        if not torch.compiler.is_compiling():  # fixed addresses: CUDA graphs replay on these very buffers
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write `(B, H, Q, D)` states at the cache's write columns; return the whole buffers (masks hide the rest)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        index, keys, values = self.write_index, key_states, value_states  # a ring layer's index holds slots already
        if self.ring is not None and keys.shape[-2] > self.ring:  # only a prefill is wider: its newest columns stay
            index, keys, values = index[:, :, -self.ring :], keys[:, :, -self.ring :], values[:, :, -self.ring :]
        self.keys.scatter_(2, index.expand_as(keys), keys)
        self.values.scatter_(2, index.expand_as(values), values)
        if self.prefilling:
            return key_states, value_states
        if self.visible is not None and self.ring is None:
            return self.keys[:, :, : self.visible], self.values[:, :, : self.visible]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.prefilling:
            return query_length, 0
        if self.ring is not None:
            return self.ring + self.scratch, 0
        return (self.max_cache_len if self.visible is None else self.visible), 0

    def get_seq_length(self) -> int:
        return 0 if not self.is_initialized else self.committed

    def get_max_length(self) -> int:
        return self.max_cache_len


class StaticRowsCache(Cache):
    """The loop's static cache for a batch of ``batch_size`` rows, ``max_cache_len`` columns each.

    Args:
        num_layers: the target's decoder layers.
        batch_size: rows, fixed for the cache's life (finished rows stay, writing into their own unused columns).
        max_cache_len: columns per row: the longest padded prompt plus new tokens plus the widest bucket.
    """

    is_compileable = True

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        max_cache_len: int,
        windows: dict[int, tuple[int, int]] | None = None,
        scratch: int = 0,
        layer_windows: LayerWindows | None = None,
    ):
        windows = windows or {}  # layer -> (window, ring): the windowed layers kept on rings
        super().__init__(
            layers=[
                StaticRowsLayer(max_cache_len, *reversed(windows.get(i, (None, None))), scratch=scratch)
                for i in range(num_layers)
            ]
        )
        self.num_rows, self.max_cache_len, self.scratch = batch_size, max_cache_len, scratch
        full = [layer for layer in self.layers if layer.ring is None]
        self.storage = LayerStorage(len(full))
        for i, layer in enumerate(full):
            layer.storage = (self.storage, i)
        self.rings = sorted({layer.ring for layer in self.layers if layer.ring is not None})
        self.has_rings = bool(self.rings)
        self._write_buffers: dict[tuple, torch.Tensor] = {}  # (ring or None, Q) -> its fixed (B, 1, Q, 1) buffer
        self.inputs: dict[tuple, torch.Tensor] = {}  # a compiled forward's inputs by name and shape (stage)
        self.buckets: dict[int, BucketInputs] = {}  # without windowed layers: each bucket's inputs, edited step to step
        self.layer_windows = layer_windows  # what the model's masks depend on, read once by the cache's owner
        self.mask_dtype = torch.float32 if layer_windows is None else layer_windows.dtype
        self.windowed = layer_windows is None or layer_windows.windowed  # whether masks differ per layer type
        types = [] if layer_windows is None else layer_windows.types
        self.kind_rings = {kind: layer.ring for kind, layer in zip(types, self.layers) if layer.ring is not None}

    def masks(
        self,
        mask: torch.Tensor,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        starts: torch.Tensor | None = None,
    ):
        """The model's masks (host, in its dtype) from ``mask`` `(B, Q, L)` bool (seen) or `(B, 1, Q, L)` additive, per
        layer type where windows apply; with ``starts`` `(B,)` (each row's first written column), the ring layers' over
        their slots (:meth:`onto_rings`)."""
        if mask.dtype == torch.bool:
            mask = additive(mask[:, None], self.mask_dtype)
        masks = mask if self.layer_windows is None else self.layer_windows.masks(mask, query_positions, key_positions)
        return masks if starts is None or not self.has_rings else self.onto_rings(masks, starts, mask.shape[2])

    def onto_rings(self, masks, starts: torch.Tensor, width: int):
        """Masks over a ring layer's slots, gathered from masks over the columns `(B, 1, Q, L)`; scratch slots unseen.

        Slot ``c`` of a ring of ``R`` holds, for row ``b`` writing columns ``starts[b] .. starts[b] + width - 1``, the
        newest column ``s ≡ c (mod R)`` up to the last of them; ``s < 0`` (never written) is blocked."""

        def onto_slots(mask: torch.Tensor, ring: int) -> torch.Tensor:
            batch, _, queries, columns = mask.shape
            slots = torch.arange(ring, device=mask.device)
            last = starts.to(mask.device)[:, None] + width - 1
            held = slots + ring * torch.div(last - slots, ring, rounding_mode="floor")  # (B, R)
            picked = mask.gather(-1, held.clamp(0, columns - 1)[:, None, None, :].expand(batch, 1, queries, ring))
            low = torch.finfo(mask.dtype).min
            picked = picked.masked_fill(~((held >= 0) & (held < columns))[:, None, None, :], low)
            blocked = torch.full((batch, 1, queries, self.scratch), low, dtype=mask.dtype, device=mask.device)
            return torch.cat([picked, blocked], dim=-1)

        return self._per_ring(masks, onto_slots)

    def scratch_masks(self, masks, width: int):
        """A warm-up's masks on the ring layers: dummy ``q`` wrote scratch slot ``ring + q`` and sees only it."""

        def scratch_mask(mask, ring: int) -> torch.Tensor:
            seen = torch.arange(ring + self.scratch)[None] == ring + torch.arange(width)[:, None]  # (Q, R + S)
            return additive(seen.expand(self.num_rows, 1, width, ring + self.scratch), self.mask_dtype)

        return self._per_ring(masks, scratch_mask)

    def _per_ring(self, masks, make):
        """``make(mask, ring)`` for each ring layer type's mask in ``masks`` (a dict by type, or one mask)."""
        if not isinstance(masks, dict):
            return make(masks, self.rings[0])
        return {
            kind: make(mask, self.kind_rings[kind]) if kind in self.kind_rings else mask for kind, mask in masks.items()
        }

    def bucket_inputs(self, width: int, device: torch.device, rows=None, trees=None) -> dict:
        """The inputs of bucket ``width``'s forward at their fixed addresses (:class:`BucketInputs`, edited in place
        from the last step), filled for ``rows`` verifying ``trees`` (``None``: a warm-up's dummies); the cache then
        writes at their write columns."""
        inputs = self.buckets.get(width)
        if inputs is None or inputs.device != torch.device(device) or inputs.host_mask.dtype != self.mask_dtype:
            inputs = self.buckets[width] = BucketInputs(
                self.num_rows, width, self.max_cache_len, self.mask_dtype, device
            )
        self.set_visible(None)
        if rows is None:
            inputs.fill_warm_up()
        else:
            inputs.fill(rows, trees)
        for layer in self.layers:  # a cache without rings: every layer writes at the bucket's columns
            layer.write_index = inputs.write_index
        return inputs.inputs()

    def set_write_columns(self, starts: list[int], width: int, device: torch.device, scratch: bool = False) -> None:
        """The next forward writes row ``b``'s ``width`` states at columns ``starts[b] ..`` (a ring layer: their slots),
        built on the host into a fixed buffer per width. ``scratch``: a warm-up's dummies, at the ring layers' scratch
        slots."""
        last = max(starts) + width
        if (
            len(starts) != self.num_rows
            or last > self.max_cache_len
            or min(starts) < 0
            or (scratch and width > self.scratch and self.rings)
        ):
            raise ValueError(
                f"write columns of {len(starts)} rows x {width} up to {last - 1} do not fit a static cache of "
                f"{self.num_rows} rows x {self.max_cache_len} columns"
            )
        columns = host_tensor([c for start in starts for c in range(start, start + width)], (len(starts), width))
        for ring in [None, *self.rings]:
            if ring is None:
                slots = columns
            elif scratch:
                slots = (ring + torch.arange(width)).expand(len(starts), width)
            else:
                slots = columns.remainder(ring)
            buffer = self._write_buffers.get((ring, width))
            if buffer is None or not on_device(buffer, device):
                buffer = torch.zeros(len(starts), 1, width, 1, dtype=torch.long, device=device)
                torch._dynamo.mark_static_address(buffer)
                self._write_buffers[(ring, width)] = buffer
            copy_to_device(buffer, slots[:, None, :, None])
            for layer in self.layers:
                if layer.ring == ring:
                    layer.write_index = buffer

    def forward_inputs(self, starts, ids, positions, mask, device, fixed: bool, scratch: bool = False) -> dict:
        """The next forward writes at columns ``starts[b] ..`` (:meth:`set_write_columns`); its ``input_ids`` and
        ``position_ids`` `(B, Q)` and ``attention_mask`` (:meth:`masks`), host tensors, staged on ``device``: into
        :attr:`inputs`' fixed buffers when ``fixed`` (a compiled forward's), else fresh."""
        self.set_write_columns(starts, ids.shape[1], device, scratch)
        buffers = self.inputs if fixed else None
        named = zip(("input_ids", "position_ids", "attention_mask"), (ids, positions, mask))
        return {name: stage(buffers, name, value, device) for name, value in named}

    def set_visible(self, columns: int | None) -> None:
        """Eager forwards attend to the first ``columns`` columns only (no compiled graph needs the full buffer);
        ``None`` for the whole buffer, the fixed shape a compiled forward takes."""
        for layer in self.layers:
            layer.visible = columns

    def set_prefilling(self, prefilling: bool) -> None:
        for layer in self.layers:
            layer.prefilling = prefilling

    def set_committed(self, columns: int) -> None:
        for layer in self.layers:
            layer.committed = columns

    def keep(self, row: int, start: int, kept: list[int]) -> None:
        """Row ``row`` keeps the verified columns ``start + kept[i]`` at ``start + i`` (``kept[0] = 0``: its last
        token; a first-child chain is already in place): one ``index_copy_`` for every full layer in a
        :class:`LayerStorage`, else one per tensor."""
        dst = [start + i for i, k in enumerate(kept) if k != i]
        if not dst:
            return
        src = [start + k for i, k in enumerate(kept) if k != i]
        device = self.layers[0].keys.device
        index = {
            ring: to_device([c if ring is None else c % ring for c in src + dst], device)
            for ring in [None, *self.rings]
        }
        stored = self.storage.buffer is not None and all(
            layer.in_storage for layer in self.layers if layer.ring is None
        )
        if stored:  # every full layer at once: (2, N, H, L, D) of this row
            s, d = index[None][: len(src)], index[None][len(src) :]
            view = self.storage.buffer[:, :, row]
            view.index_copy_(3, d, view.index_select(3, s))
        for layer in self.layers:
            if layer.is_initialized and not (stored and layer.ring is None):
                s, d = index[layer.ring][: len(src)], index[layer.ring][len(src) :]
                layer.keys[row].index_copy_(1, d, layer.keys[row].index_select(1, s))
                layer.values[row].index_copy_(1, d, layer.values[row].index_select(1, s))

    def fits(self, batch_size: int, max_cache_len: int, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether a later call of ``batch_size`` rows needing ``max_cache_len`` columns can reuse this cache."""
        layer = self.layers[0]
        return (
            batch_size == self.num_rows
            and max_cache_len <= self.max_cache_len
            and (not layer.is_initialized or (layer.device == device and layer.dtype == dtype))
        )


@functools.lru_cache(maxsize=MAX_BLOCKS)
def verify_block(parents: tuple[int, ...], width: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """What ``[last token] + tree`` sees of its own ``width`` columns in a verification forward padded to ``width``:
    `(Q, Q)` bool (host), query 0 the last accepted token, query ``1 + i`` node ``i``, each seeing its ancestors-or-self
    (SpecInfer), a dummy query ``j > N`` only its own column; and each query's depth (0 for the last token and the
    dummies, ``1 + depth(i)`` for node ``i``), ``Q`` entries. Kept per tree shape (a drafter repeats its shapes): the
    results are shared, read-only."""
    n = len(parents)
    ancestors, depths = tree_buffers([-1] + [0 if p < 0 else p + 1 for p in parents])  # the last token as the root
    block = torch.zeros(width, width, dtype=torch.bool)
    block[: 1 + n, : 1 + n] = ancestors
    block.diagonal()[1 + n :] = True
    return block, tuple(depths + [0] * (width - 1 - n))


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive mask in ``dtype`` (host): ``0`` where ``visible``, ``finfo(dtype).min`` elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)


def blocked_mask(shape: tuple[int, ...], dtype: torch.dtype, pin_memory: bool = False):
    """A host additive mask of ``shape`` in ``dtype``, every entry blocked (``finfo(dtype).min``), and a NumPy view of
    its bits: assigning 0 there makes entries visible (well under a microsecond a slice, against 5-10 µs a torch op;
    bf16 needs no NumPy dtype)."""
    mask = torch.full(shape, torch.finfo(dtype).min, dtype=dtype, pin_memory=pin_memory)
    return mask, mask.view(BITS[dtype.itemsize]).numpy()


class BucketInputs:
    """The inputs of one bucket's forward on a static cache of ``batch`` rows x ``length`` columns.

    Args:
        width: the bucket ``Q`` (tokens verified per row). dtype: the mask's (the model's). device: the forward's.

    Attributes:
        input_ids, position_ids (`(B, Q)` long), write_index (`(B, 1, Q, 1)` long), attention_mask (`(B, 1, Q, L)`):
            the forward's inputs, at fixed addresses (CUDA graphs replay on them).
    """

    def __init__(self, batch: int, width: int, length: int, dtype: torch.dtype, device: torch.device):
        self.batch, self.width, self.length, self.device = batch, width, length, torch.device(device)
        cuda = self.device.type == "cuda"
        self.host_mask, self.mask_bits = blocked_mask((batch, 1, width, length), dtype, pin_memory=cuda)
        self.blocked = int(self.mask_bits.flat[0])  # the bits of a blocked entry, as a signed integer
        self.host_packed = torch.zeros(3, batch, width, dtype=torch.long, pin_memory=cuda)  # ids, positions, writes
        self.packed = self.host_packed.numpy()
        self.attention_mask = self.host_mask.to(device) if cuda else self.host_mask
        self.all_packed = self.host_packed.to(device) if cuda else self.host_packed
        self.input_ids, self.position_ids = self.all_packed[0], self.all_packed[1]
        self.write_index = self.all_packed[2].view(batch, 1, width, 1)
        for tensor in (self.attention_mask, self.all_packed, self.input_ids, self.position_ids, self.write_index):
            torch._dynamo.mark_static_address(tensor)
        self.slots: list = [None] * batch  # what each slot's mask holds: (pad, start), "dummy", or None (rebuild it)
        self.blocks: dict[tuple, tuple] = {}  # tree shape -> (tree_block, depths): see tree_block
        self.copied = None  # CUDA: an event after the last step's copies (the staging buffers are free again)

    def inputs(self) -> dict:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": self.attention_mask}

    def _ready(self) -> None:
        """Wait until the last copies out of the staging buffers have run (at once: a step reads back first)."""
        if self.copied is not None:
            self.copied.synchronize()

    def _send(self) -> None:
        if self.device.type == "cuda":
            self.attention_mask.copy_(self.host_mask, non_blocking=True)
            self.all_packed.copy_(self.host_packed, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record()

    def fill(self, rows, trees) -> None:
        """Every slot's inputs for one step: ``rows`` (``row.index`` its slot, ``row.tokens`` its host text,
        ``row.pad``) each verifying ``[last token] + tree``; slots of no row (finished) verify dummies written into
        their own first columns, each seeing only itself. Trees whose tokens are still on the device are copied there,
        device to device."""
        self._ready()
        bits, packed, width = self.mask_bits, self.packed, self.width
        on_device, active = [], {row.index: (row, tree) for row, tree in zip(rows, trees)}
        for b in range(self.batch):
            if b not in active:
                self._dummy_slot(b)
                continue
            row, tree = active[b]
            n, start, pad = len(tree), len(row.tokens) - 1, row.pad
            block, depths = self.tree_block(tree.parent_list)
            held = self.slots[b]
            if held is None or held == "dummy" or held[0] != pad or held[1] > start:  # another call's row, or none yet
                bits[b] = self.blocked
                bits[b, 0, :, pad:start] = 0
            elif held[1] < start:  # the text grew: every query now sees the columns the last step accepted
                bits[b, 0, :, held[1] : start] = 0
            bits[b, 0, :, start : start + width] = block
            self.slots[b] = (pad, start)
            ids = packed[0, b]
            ids[0] = row.tokens[-1]
            if tree.token_list is not None:
                ids[1 : 1 + n] = tree.token_list
            elif n:
                on_device.append((b, tree))
            ids[1 + n :] = 0
            cached = start - pad
            packed[1, b] = [cached + d for d in depths]
            packed[2, b] = range(start, start + width)
        self._send()
        for b, tree in on_device:
            self.input_ids[b, 1 : 1 + len(tree)].copy_(tree.tokens)

    def _dummy_slot(self, b: int) -> None:
        if self.slots[b] == "dummy":
            return
        bits, packed, width = self.mask_bits, self.packed, self.width
        bits[b] = self.blocked
        bits[b, 0, range(width), range(width)] = 0
        packed[0, b], packed[1, b], packed[2, b] = 0, 0, range(width)
        self.slots[b] = "dummy"

    def fill_warm_up(self) -> None:
        """Dummies at the last ``Q`` columns of every row (past any row's text and step), each seeing only itself at
        position 0: a warm-up forward that compiles (and captures) the bucket without touching a row's state."""
        self._ready()
        bits, packed, width, length = self.mask_bits, self.packed, self.width, self.length
        bits[:] = self.blocked
        columns = range(length - width, length)
        bits[:, 0, range(width), columns] = 0
        packed[0], packed[1], packed[2] = 0, 0, columns
        self.slots = [None] * self.batch  # the next step rebuilds every slot
        self._send()

    def tree_block(self, parents: list[int]) -> tuple:
        """A tree's :func:`verify_block` as mask bits `(Q, Q)`, and its queries' depths; kept per tree shape: a drafter
        repeats its shapes."""
        key = tuple(parents)
        found = self.blocks.get(key)
        if found is not None:
            return found
        seen, depths = verify_block(key, self.width)
        block = torch.full(seen.shape, self.blocked, dtype=BITS[self.host_mask.element_size()]).masked_fill_(seen, 0)
        if len(self.blocks) >= MAX_BLOCKS:
            self.blocks.clear()
        self.blocks[key] = found = (block.numpy(), depths)
        return found
