"""A static KV cache the loop owns (``cache_implementation="static"``, docs/static-cache.md): one buffer
`(B, H, max_cache_len, D)` a layer, reused by later calls of the same shape. Row ``b`` keeps its text at columns
``[pad_b, len(row.ids) - 1)``; a step writes ``[last token] + tree``, padded to a bucket of ``Q`` tokens, past that;
:meth:`StaticRowsCache.keep` moves the accepted columns into place. Nothing is rewound: the mask hides the columns past
a row's text (transformers' ``StaticCache`` writes at one length for the whole batch and cannot crop).
"""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .host import host_tensor, stage, to_device
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
        """Layer ``i``'s `(keys, values)` views, or ``None`` when its shape is not the storage's (it keeps its own)."""
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

    def __init__(self, owner, max_cache_len: int, ring: int | None = None, window: int | None = None, scratch: int = 0):
        super().__init__()
        # a windowed layer keeps `ring` = window + widest bucket columns, column c in slot c % ring (a step never
        # overwrites a key its queries can see), then `scratch` slots no column maps to, for warm-up dummies
        self.max_cache_len, self.ring, self.window = max_cache_len, ring, window
        self.scratch = scratch if ring is not None else 0
        self.write_index: torch.Tensor | None = None  # (B, 1, Q, 1) long: the slots this forward writes
        self.owner: StaticRowsCache = owner  # what every layer attends to is set there, once for all
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
        if self.owner.prefilling:
            return key_states, value_states
        visible = self.owner.visible
        if visible is not None and self.ring is None:
            return self.keys[:, :, :visible], self.values[:, :, :visible]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.owner.prefilling:
            return query_length, 0
        if self.ring is not None:
            return self.ring + self.scratch, 0
        return (self.max_cache_len if self.owner.visible is None else self.owner.visible), 0

    def get_seq_length(self) -> int:
        return 0 if not self.is_initialized else self.owner.committed

    def get_max_length(self) -> int:
        return self.max_cache_len


class StaticRowsCache(Cache):
    """The loop's static cache for a batch of ``batch_size`` rows, ``max_cache_len`` columns each.

    Args:
        num_layers: the target's decoder layers.
        batch_size: rows, fixed for the cache's life (finished rows stay, writing into their own unused columns).
        max_cache_len: columns per row: the longest padded prompt plus new tokens plus the widest bucket.
    """

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        max_cache_len: int,
        layer_windows: LayerWindows,
        windows: dict[int, tuple[int, int]] | None = None,
        scratch: int = 0,
    ):
        windows = windows or {}  # layer -> (window, ring): the windowed layers kept on rings
        super().__init__(
            layers=[
                StaticRowsLayer(self, max_cache_len, *reversed(windows.get(i, (None, None))), scratch=scratch)
                for i in range(num_layers)
            ]
        )
        self.num_rows, self.max_cache_len, self.scratch = batch_size, max_cache_len, scratch
        self.visible: int | None = None  # eager forwards attend to the first `visible` columns; None: all
        self.prefilling = False  # the prefill (on an empty cache) attends to its own states only
        self.committed = 0  # the longest row's committed columns (informative: every forward takes its own mask)
        full = [layer for layer in self.layers if layer.ring is None]
        self.storage = LayerStorage(len(full))
        for i, layer in enumerate(full):
            layer.storage = (self.storage, i)
        self.rings = sorted({layer.ring for layer in self.layers if layer.ring is not None})
        self.has_rings = bool(self.rings)
        # a compiled forward's inputs and each ring's (B, 1, Q, 1) write slots, by name and shape (stage)
        self.inputs: dict[tuple, torch.Tensor] = {}
        self.warmed: set = set()  # graphs (buckets) already compiled and run on this cache, by this or an earlier call
        self.buckets: dict[int, BucketInputs] = {}  # each bucket's inputs (staging), edited step to step
        self.layer_windows = layer_windows  # what the model's masks depend on, read once by the cache's owner
        self.mask_dtype, self.windowed = layer_windows.dtype, layer_windows.windowed  # windowed: masks per layer type
        types = layer_windows.types
        self.kind_rings = {kind: layer.ring for kind, layer in zip(types, self.layers) if layer.ring is not None}

    def masks(self, mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, starts=None):
        """The model's masks (host, in its dtype, per layer type where windows apply) from ``mask`` `(B, Q, L)` bool or
        `(B, 1, Q, L)` additive; with ``starts`` `(B,)` (each row's first written column), over the rings' slots."""
        if mask.dtype == torch.bool:
            mask = additive(mask[:, None], self.mask_dtype)
        masks = self.layer_windows.masks(mask, query_positions, key_positions)
        return masks if starts is None or not self.has_rings else self.onto_rings(masks, mask.shape[2], starts)

    def onto_rings(self, masks, width: int, starts: torch.Tensor | None = None):
        """Masks over the ring layers' slots (scratch slots unseen), from ``masks`` over the columns `(B, 1, Q, L)` (a
        dict by layer type, or one mask). Slot ``c`` of a ring of ``R`` holds, for row ``b`` writing columns
        ``starts[b] .. starts[b] + width - 1``, the newest column ``s ≡ c (mod R)`` up to the last of them (``s < 0``,
        never written: blocked). ``starts=None``: a warm-up's, dummy ``q`` seeing only the scratch slot ``R + q``."""

        def onto_slots(mask: torch.Tensor, ring: int) -> torch.Tensor:
            if starts is None:
                seen = torch.arange(ring + self.scratch)[None] == ring + torch.arange(width)[:, None]  # (Q, R + S)
                return additive(seen.expand(self.num_rows, 1, width, ring + self.scratch), self.mask_dtype)
            batch, _, queries, columns = mask.shape
            slots = torch.arange(ring, device=mask.device)
            last = starts.to(mask.device)[:, None] + width - 1
            held = slots + ring * torch.div(last - slots, ring, rounding_mode="floor")  # (B, R)
            picked = mask.gather(-1, held.clamp(0, columns - 1)[:, None, None, :].expand(batch, 1, queries, ring))
            low = torch.finfo(mask.dtype).min
            picked = picked.masked_fill(~((held >= 0) & (held < columns))[:, None, None, :], low)
            return torch.nn.functional.pad(picked, (0, self.scratch), value=low)  # the scratch slots, blocked

        if not isinstance(masks, dict):
            return onto_slots(masks, self.rings[0])
        return {
            kind: onto_slots(mask, self.kind_rings[kind]) if kind in self.kind_rings else mask
            for kind, mask in masks.items()
        }

    def staging(self, bucket: int, device: torch.device) -> BucketInputs:
        """Bucket ``bucket``'s :class:`BucketInputs` on ``device``, kept from the last step (edited in place)."""
        inputs = self.buckets.get(bucket)
        if inputs is None or inputs.device != torch.device(device) or inputs.host_mask.dtype != self.mask_dtype:
            inputs = self.buckets[bucket] = BucketInputs(
                self.num_rows, bucket, self.max_cache_len, self.mask_dtype, device
            )
        return inputs

    def bucket_inputs(self, bucket: int, device, rows=None, trees=None, width=None, length=None) -> dict:
        """Bucket ``bucket``'s forward inputs at their fixed addresses (:meth:`staging`), filled for ``rows`` verifying
        ``trees`` (``None``: a warm-up's dummies), the layers writing at their write columns. ``length``: an eager
        forward's, cut to its first ``width`` queries and ``length`` columns."""
        inputs = self.staging(bucket, device)
        self.visible = length
        on_device = inputs.fill_warm_up() if rows is None else inputs.fill(rows, trees)
        ids, positions, mask = inputs.input_ids, inputs.position_ids, inputs.attention_mask
        write_index = inputs.write_index
        if length is not None:  # an eager forward: its own queries, the columns the rows reach
            ids, positions, write_index = ids[:, :width], positions[:, :width], write_index[:, :, :width]
            mask = mask[:, :, :width, :length]
        for b, tree in on_device:
            ids[b, 1 : 1 + len(tree)].copy_(tree.tokens)
        for layer in self.layers:  # a cache without rings: every layer writes at the bucket's columns
            layer.write_index = write_index
        return {"input_ids": ids, "position_ids": positions, "attention_mask": mask}

    def set_write_columns(self, starts: list[int], width: int, device: torch.device, scratch: bool = False) -> None:
        """The next forward writes row ``b``'s ``width`` states at columns ``starts[b] ..`` (a ring layer: their slots;
        ``scratch``: a warm-up's, at the rings' scratch slots), staged in a fixed buffer per width (:attr:`inputs`)."""
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
            slots = columns if ring is None else columns.remainder(ring)
            if scratch and ring is not None:
                slots = (ring + torch.arange(width)).expand(len(starts), width)
            index = stage(self.inputs, f"write_index.{ring}", slots[:, None, :, None], device)
            for layer in self.layers:
                if layer.ring == ring:
                    layer.write_index = index

    def forward_inputs(self, starts, ids, positions, mask, device, fixed: bool, scratch: bool = False) -> dict:
        """The next forward writes at columns ``starts[b] ..`` (:meth:`set_write_columns`); its host ``input_ids``,
        ``position_ids`` `(B, Q)` and ``attention_mask`` staged on ``device`` (in :attr:`inputs` when ``fixed``)."""
        self.set_write_columns(starts, ids.shape[1], device, scratch)
        buffers = self.inputs if fixed else None
        named = zip(("input_ids", "position_ids", "attention_mask"), (ids, positions, mask))
        return {name: stage(buffers, name, value, device) for name, value in named}

    def keep(self, row: int, start: int, kept: list[int]) -> None:
        """Row ``row`` keeps the verified columns ``start + kept[i]`` at ``start + i`` (``kept[0] = 0``: its last token;
        a first-child chain is in place): one ``index_copy_`` for the full layers' storage, else one a tensor."""
        dst = [start + i for i, k in enumerate(kept) if k != i]
        if not dst:
            return
        src = [start + k for i, k in enumerate(kept) if k != i]
        device = self.layers[0].keys.device
        index = {
            ring: to_device([c if ring is None else c % ring for c in src + dst], device)
            for ring in [None, *self.rings]
        }
        if self.storage.buffer is not None:  # every full layer in it at once: (2, N, H, L, D) of this row
            s, d = index[None][: len(src)], index[None][len(src) :]
            view = self.storage.buffer[:, :, row]
            view.index_copy_(3, d, view.index_select(3, s))
        for layer in self.layers:
            if layer.is_initialized and not layer.in_storage:
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
def verify_block(parents: tuple[int, ...], width: int, dtype: torch.dtype) -> tuple:
    """What ``[last token] + tree`` sees of its own columns in a forward padded to ``width``: `(Q, Q)` bits of an
    additive mask in ``dtype`` (NumPy, as :func:`blocked_mask`'s; query ``1 + i`` is node ``i``, seeing its
    ancestors-or-self, a dummy only itself), and each query's depth (0: the last token, the dummies). Kept per tree
    shape (a drafter repeats its shapes): shared, read-only."""
    n = len(parents)
    ancestors, depths = tree_buffers([-1] + [0 if p < 0 else p + 1 for p in parents])  # the last token as the root
    seen = torch.zeros(width, width, dtype=torch.bool)
    seen[: 1 + n, : 1 + n] = ancestors
    seen.diagonal()[1 + n :] = True
    return additive(seen, dtype).view(BITS[dtype.itemsize]).numpy(), tuple(depths + [0] * (width - 1 - n))


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An additive mask in ``dtype`` (host): ``0`` where ``visible``, ``finfo(dtype).min`` elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)


def blocked_mask(shape: tuple[int, ...], dtype: torch.dtype, pin_memory: bool = False):
    """A host additive mask of ``shape`` in ``dtype``, every entry blocked, and a NumPy view of its bits: assigning 0
    there makes entries visible (under a microsecond a slice, against 5-10 µs a torch op; bf16 needs no NumPy dtype)."""
    mask = torch.full(shape, torch.finfo(dtype).min, dtype=dtype, pin_memory=pin_memory)
    return mask, mask.view(BITS[dtype.itemsize]).numpy()


class BucketInputs:
    """The inputs of one bucket's forward (``width`` = ``Q`` tokens a row) on a static cache of ``batch`` rows x
    ``length`` columns, at fixed addresses on ``device`` (CUDA graphs replay on them): ``input_ids``, ``position_ids``
    `(B, Q)`, ``write_index`` `(B, 1, Q, 1)` and ``attention_mask`` `(B, 1, Q, L)` in ``dtype``."""

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
        self.copied = None  # CUDA: an event after the last step's copies (the staging buffers are free again)

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

    def fill(self, rows, trees) -> list:
        """Every slot's inputs for one step: ``rows`` (``row.index`` its slot, ``row.tokens`` its host text,
        ``row.pad``) each verifying ``[last token] + tree``; a slot of no row verifies dummies in its first columns.
        Returns ``(slot, tree)`` for the trees whose tokens are on the device, for the caller to copy in."""
        self._ready()
        bits, packed, width, dtype = self.mask_bits, self.packed, self.width, self.host_mask.dtype
        on_device, active = [], {row.index: (row, tree) for row, tree in zip(rows, trees)}
        for b in range(self.batch):
            if b not in active:  # dummies in the slot's first columns, each seeing only itself
                if self.slots[b] != "dummy":
                    bits[b] = self.blocked
                    bits[b, 0, range(width), range(width)] = 0
                    packed[0, b], packed[1, b], packed[2, b] = 0, 0, range(width)
                    self.slots[b] = "dummy"
                continue
            row, tree = active[b]
            n, start, pad = len(tree), len(row.tokens) - 1, row.pad
            block, depths = verify_block(tuple(tree.parent_list), width, dtype)
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
        return on_device

    def fill_warm_up(self) -> list:
        """Dummies at every row's last ``Q`` columns, each seeing only itself at position 0: a warm-up forward."""
        self._ready()
        bits, packed, width, length = self.mask_bits, self.packed, self.width, self.length
        bits[:] = self.blocked
        columns = range(length - width, length)
        bits[:, 0, range(width), columns] = 0
        packed[0], packed[1], packed[2] = 0, 0, columns
        self.slots = [None] * self.batch  # the next step rebuilds every slot
        self._send()
        return []
