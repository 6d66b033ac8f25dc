"""The static path of a call (:class:`StaticLayout`, docs/static-cache.md): every row at its own length in the fixed
buffers of ``cache_implementation="static"`` (:class:`~hf_specdraft.core.static_cache.StaticRowsCache`), verified in
fixed shapes and compiled by transformers' rules; and the choice of a call's layout (:func:`layout_for`).

A step verifies ``[last token] + tree`` padded to the smallest bucket ``Q >= 1 + N`` (:data:`BUCKETS`, one graph each)
with masked dummy nodes, as Medusa, Sequoia and SGLang do: ``input_ids`` and ``position_ids`` `(B, Q)`, the write
columns `(B, Q)`, and an additive mask `(B, 1, Q, max_cache_len)` where each node sees its row's text and its ancestors
(SpecInfer, Miao et al. 2023), built on the host and moved once. Finished rows keep their slot and verify dummies.

Compiling follows ``GenerationMixin``'s rules: automatic on CUDA, forced elsewhere by ``compile_config``, off with
``disable_compile=True`` (:func:`compile_config_for`). Each bucket is warmed up once and reused by later calls whose
cache fits (:func:`static_target`), one call at a time (:func:`static_call`). Prefill stays eager.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import weakref

import torch
from transformers import CompileConfig, DynamicCache, GenerationConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .cache import croppable_cache, target_cache
from .host import host_tensor, stage, to_device
from .layouts import CacheLayout, OwnedRow, SharedBatch
from .rows import Row
from .static_cache import StaticRowsCache, blocked_mask, verify_block
from .support import TargetSupport
from .target_state import prefill_states
from .tree import DraftTree
from .verify import LayerWindows

BUCKETS = (2, 4, 8, 16, 32, 64)  # verified tokens per row; one compiled graph each, captured on first use
# a cache holds at least this many columns, and grows by doubling (a new size compiles every bucket again)
MIN_CACHE_COLUMNS = 256
RECOMPILE_LIMIT = 4 * len(BUCKETS)  # graphs dynamo may keep per code object: every bucket at a few cache sizes
_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {role: its last StaticRowsCache}
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {compile config's fields: its __call__}
_CAPTURED = threading.local()  # seconds the current thread has spent compiling and capturing buckets
_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> the lock of its static caches (every role)
_LOCKS_GUARD = threading.Lock()
_HELD = threading.local()  # the draft locks the current thread's static call holds (released when the call ends)


class StaticCacheBusy(RuntimeError):
    """A draft's static cache is in use by another thread's call: the drafter then drafts eagerly."""


def static_lock(model) -> threading.RLock:
    """The lock a static call holds on ``model``'s static caches for its whole length. Reentrant: one call may use a
    model as target and draft."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(model, threading.RLock())


@contextlib.contextmanager
def static_call(model):
    """Hold ``model``'s static caches (one request's state) for one call: a concurrent static call waits here. Draft
    caches taken on the way (:func:`hold_draft`) are released with it."""
    lock = static_lock(model)
    with lock:
        outer, _HELD.locks = getattr(_HELD, "locks", None), []
        try:
            yield
        finally:
            for held in reversed(_HELD.locks):
                held.release()
            _HELD.locks = outer


def hold_draft(model) -> None:
    """Take ``model``'s static caches for the current call as a draft, without waiting (a wait could deadlock two calls
    that use two models in swapped roles); :class:`StaticCacheBusy` when another call holds them."""
    lock = static_lock(model)
    if getattr(_HELD, "locks", None) is None:
        raise StaticCacheBusy("a draft's static cache is taken inside a static call only")
    if not lock.acquire(blocking=False):
        raise StaticCacheBusy(f"{type(model).__name__}'s static caches are in use by another call")
    _HELD.locks.append(lock)


def captured_seconds() -> float:
    """Seconds this thread has spent compiling and capturing buckets, which the loop keeps out of the controller's
    costs."""
    return getattr(_CAPTURED, "seconds", 0.0)


def compiled_call(model, compile_config: CompileConfig):
    """``torch.compile(model.__call__)`` with ``compile_config``, made once per model and config. Not transformers'
    ``get_compiled_call``, which keeps one per model: alternating with transformers' own config would recompile."""
    key = repr(sorted(compile_config.to_dict().items()))
    calls = _COMPILED.setdefault(model, {})
    if torch._dynamo.config.recompile_limit < RECOMPILE_LIMIT:  # dynamo's default 8 would fall back to eager silently
        torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT  # once a second cache size is compiled
    if key not in calls:
        calls[key] = torch.compile(model.__call__, **compile_config.to_dict())
    return calls[key]


def compile_config_for(model, generation_config: GenerationConfig) -> CompileConfig | None:
    """The ``CompileConfig`` the verification forward compiles with, or ``None`` for eager (transformers' rules)."""
    if generation_config.disable_compile:
        return None
    config = generation_config.compile_config
    if config is None and model.device.type != "cuda":
        return None  # as transformers: automatic on CUDA only; a CompileConfig forces it elsewhere
    if config is not None and not isinstance(config, CompileConfig):
        raise TypeError(f"compile_config must be a transformers.CompileConfig, got {type(config).__name__}")
    config = copy.deepcopy(config) if config is not None else CompileConfig()
    if config.dynamic is None:
        config.dynamic = False  # one graph per bucket: fixed shapes, never a dynamic-shape recompile
    return config


def bucket_for(tokens: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket holding ``tokens`` verified tokens per row."""
    if tokens > buckets[-1]:
        raise ValueError(f"{tokens} tokens per row do not fit the largest verification bucket {buckets[-1]}")
    return next(bucket for bucket in buckets if bucket >= tokens)


class StaticLayout(CacheLayout):
    """The static cache's layout (:class:`~hf_specdraft.core.layouts.CacheLayout`).

    Args:
        model: the target. cache: its :class:`~hf_specdraft.core.static_cache.StaticRowsCache`.
        support: what the call reads of ``model`` (:class:`~hf_specdraft.core.support.TargetSupport`).
        compile_config: ``None`` runs the forward eagerly.
        one_row: one unpadded row, not a padded batch.
    """

    def __init__(
        self,
        model,
        cache: StaticRowsCache,
        support: TargetSupport,
        compile_config: CompileConfig | None,
        buckets: tuple[int, ...] = BUCKETS,
        one_row: bool = True,
    ):
        super().__init__(model)
        self.cache, self.buckets, self.one_row = cache, buckets, one_row
        self.compiled, self.compile_config = compile_config is not None, compile_config
        self.call = compiled_call(model, compile_config) if self.compiled else model.__call__
        self.device, self.with_cache = model.device, {support.cache_argument: cache}
        self.prefill_kwargs = support.prefill_kwargs
        self.warm_up_seconds: dict[int, float] = {}  # bucket -> seconds of its first (compiling) forwards in this call
        self.drafts: list = []  # the drafts' own static caches (StaticDraftCache) where they compile too
        if not hasattr(cache, "warmed"):
            cache.warmed = set()  # buckets already compiled and run on this cache (by this or an earlier call)

    @property
    def max_nodes(self) -> int:
        """The most tree nodes one row verifies: the widest bucket but the last token."""
        return self.buckets[-1] - 1

    @property
    def graphs(self) -> bool:
        """Whether the forward replays CUDA graphs (compiled on CUDA): its outputs then live in the graphs' pool."""
        return self.compiled and self.device.type == "cuda"

    def bucket(self, tokens: int) -> int:
        """The width a forward over ``tokens`` tokens per row runs at: its bucket when compiled, itself when eager."""
        return bucket_for(tokens, self.buckets) if self.compiled else min(tokens, self.buckets[-1])

    def prefill(self, input_ids: torch.LongTensor, rows: list[Row], request) -> float:
        """Every row's prompt but its newest token into the cache, eagerly at columns ``0 .. P - 2`` (row ``b``'s column
        ``j >= pad_b`` at position ``j - pad_b``; a padding column sees only itself). Returns seconds."""
        started, cache = time.perf_counter(), self.cache
        batch, width = input_ids.shape[0], input_ids.shape[1] - 1
        if width:
            cache.set_visible(width)  # the prefill is eager: it attends to its own columns only
            cache.set_committed(0)
            cache.set_write_columns([0] * batch, width, input_ids.device)
            inputs = {"input_ids": input_ids[:, :-1]}
            pads = [row.pad for row in rows]
            if batch > 1 or pads[0] or cache.windowed:  # else the model's own causal mask (SDPA's fast path)
                columns, pad = torch.arange(width), torch.tensor(pads)[:, None]
                positions = (columns[None] - pad).clamp(min=0)
                visible = (columns[None, None] >= pad[:, :, None]) & (columns[None, None] <= columns[None, :, None])
                visible |= columns[None, None] == columns[None, :, None]
                mask = cache.masks(visible, positions, columns[None] - pad)
                inputs["position_ids"] = stage(None, "position_ids", positions, input_ids.device)
                inputs["attention_mask"] = stage(None, "attention_mask", mask, input_ids.device)
            cache.set_prefilling(True)  # attends to its own states; ring layers keep the newest of them
            try:
                out = self.model(**inputs, **self.with_cache, use_cache=True, **self.prefill_kwargs, **request.kwargs)
            finally:
                cache.set_prefilling(False)
            if request.hidden:
                prefill_states(out.hidden_states, rows)
        cache.set_committed(width)
        self.costs["widest_repacked"] = self.costs["holes_columns"] = cache.max_cache_len
        return time.perf_counter() - started

    def linears(self):
        """Eager, the target's few-row linears (:class:`~hf_specdraft.core.layouts.CacheLayout`); compiled, its own
        kernels."""
        return contextlib.nullcontext() if self.compiled else super().linears()

    def controller_limits(self, longest: int, widest: float) -> tuple[int, object, object]:
        """The controller weighs each γ at the cost of its bucket, and never drafts past the widest."""
        return min(longest, self.max_nodes // int(widest)), self.bucket, (self.compiled, self.max_nodes)

    def before_steps(self, rows: list[Row], request, generation_config: GenerationConfig) -> None:
        """Every bucket compiles (on CUDA: is captured) before the first step, so no step compiles. A compiled batch-1
        call gives each drafter that ``compiles_draft`` a static cache of its own
        (:mod:`~hf_specdraft.core.draft_cache`); one whose draft another call holds drafts eagerly."""
        self.warm_up(self.buckets[-1], request.kwargs)
        for row in rows if self.compiled and self.one_row else []:
            if row.traits.compiles_draft:
                try:
                    made = row.generator.compile_draft(generation_config, self.compile_config, self.cache)
                except StaticCacheBusy:
                    continue
                # None: this drafter drafts eagerly here (GLIDE over ring layers)
                self.drafts.extend(d for d in (made if isinstance(made, list) else [made]) if d is not None)
        for draft in self.drafts:
            draft.prepare()

    def finish(self, stats) -> None:
        """What the static path compiled and what its first forwards cost; the cache stays for the next call."""
        stats.extra["static_cache"] = {
            "compiled": self.compiled,
            "buckets": list(self.buckets),
            "warm_up_seconds": {str(b): s for b, s in self.warm_up_seconds.items()},
            "draft_compiled": bool(self.drafts),
            "draft_warm_up_seconds": {str(b): s for d in self.drafts for b, s in d.static.warm_up_seconds.items()},
        }

    def drafter_cache(self, a: int, row: Row) -> DynamicCache:
        """Row ``row``'s committed text, columns ``[pad, len(tokens) - 1)``, as a `(1, H, n, D)` ``DynamicCache`` of
        views (no copy) that a drafter reads (GLIDE's glimpse). A ring layer gives its newest ``window - 1`` columns in
        order (copies), as a trimmed sliding layer."""
        b, start, stop = row.index, row.pad, len(row.tokens) - 1
        view = DynamicCache()
        view.layers = []
        for layer in self.cache.layers:
            own = DynamicLayer() if layer.ring is None else DynamicSlidingWindowLayer(sliding_window=layer.window)
            if layer.is_initialized:
                columns = slice(start, stop)
                if layer.ring is not None:
                    columns = torch.arange(max(start, stop - layer.window + 1), stop, device=layer.keys.device)
                    columns = columns % layer.ring
                    own.cumulative_length = stop - start
                own.dtype, own.device, own.is_initialized = layer.keys.dtype, layer.keys.device, True
                own.keys, own.values = layer.keys[b : b + 1, :, columns], layer.values[b : b + 1, :, columns]
            view.layers.append(own)
        return view

    def warm_up(self, largest_tokens: int, extra: dict | None = None) -> None:
        """Compile and run every bucket up to the one holding ``largest_tokens`` on dummies (:meth:`_dummy`). ``extra``:
        what the drafters ask of the forward, a graph of its own."""
        if self.compiled and not self.cache.layers[0].is_initialized:  # buffers are allocated eagerly, never in a graph
            self._dummy(self.buckets[0], compiled=False)
        for bucket in self.buckets:
            if bucket > self.bucket(min(largest_tokens, self.buckets[-1])):
                break
            if graph_key(bucket, extra) in self.cache.warmed or not self.compiled:
                continue
            self.capture(bucket, lambda b=bucket: self._dummy(b, compiled=True, extra=extra), graph_key(bucket, extra))

    def capture(self, bucket: int, run, key=None) -> None:
        """``run()`` a bucket's forward until it is compiled (on CUDA: captured), its seconds recorded
        (:func:`captured_seconds`)."""
        started = time.perf_counter()
        for _ in range(3 if self.device.type == "cuda" else 1):  # CUDA graphs record on a later run than the first
            run()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.cache.warmed.add(bucket if key is None else key)
        seconds = time.perf_counter() - started
        self.warm_up_seconds[bucket] = seconds
        _CAPTURED.seconds = captured_seconds() + seconds

    def _dummy(self, width: int, compiled: bool, extra: dict | None = None) -> None:
        """One forward of ``width`` dummy tokens per row where no row's state lives (the full layers' last columns, the
        ring layers' scratch slots), each seeing only itself at position 0 (a query that saw nothing would write NaN).
        Compiles a bucket, or allocates the buffers eagerly; safe at any point of a call."""
        cache, device = self.cache, self.device
        batch, length = cache.num_rows, cache.max_cache_len
        if not cache.windowed:  # the very buffers the bucket's steps fill
            inputs = cache.bucket_inputs(width, device)
        else:
            cache.set_visible(None)
            own = torch.arange(length - width, length)[:, None] == torch.arange(length)[None]  # (Q, L)
            zeros = torch.zeros(batch, width, dtype=torch.long)  # the dummies' ids and positions
            masks = cache.masks(own.expand(batch, width, length), zeros, torch.zeros(batch, length, dtype=torch.long))
            masks = cache.scratch_masks(masks, width) if cache.has_rings else masks
            inputs = cache.forward_inputs([length - width] * batch, zeros, zeros, masks, device, True, scratch=True)
        if compiled:
            self._forward(extra, **inputs)
        else:
            self.model(**inputs, **self.with_cache, use_cache=True)

    def _forward(self, extra: dict | None = None, **inputs) -> tuple[torch.Tensor, tuple | None]:
        """The bucket's forward: logits, and the ``hidden_states`` that ``extra`` asks for (else ``None``)."""
        extra = extra or {}
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs were consumed
        out = self.call(**inputs, **self.with_cache, use_cache=True, **extra)
        hidden = out.hidden_states if extra.get("output_hidden_states") else None
        if not self.graphs:
            return out.logits, hidden
        # a CUDA graph's outputs live in its pool and the next replay overwrites them: the loop keeps logits
        # (acceptance, output_logits) and states (the drafters) across a step, so they are copied out
        return out.logits.clone(), None if hidden is None else tuple(None if h is None else h.clone() for h in hidden)

    def verify(
        self, rows: list[Row], trees: list[DraftTree], extra: dict
    ) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """One forward over every row's ``[last token] + tree``, padded to a bucket, with ``extra`` (what the drafters
        ask of it). Returns float32 logits `(A, Q, V)`, the verified ids `(A, Q)` and the asked hidden states (or
        ``None``) of the active ``rows``, in their order (on the device: nothing is read back)."""
        width = self.bucket(1 + max(len(tree) for tree in trees))
        self.count_step(width)
        if self.compiled and graph_key(width, extra) not in self.cache.warmed:
            self.warm_up(width, extra)  # a bucket no warm-up covered: compiled here (safe mid-call), its time reported
        if not self.compiled or self.cache.windowed:
            inputs = self._verify_inputs(rows, trees, width)
        else:
            inputs = self.cache.bucket_inputs(width, rows[0].device, rows, trees)
        # the active rows' slots, sent before the forward (no sync either way)
        index = to_device([row.index for row in rows], rows[0].device) if len(rows) < self.cache.num_rows else None
        (logits, hidden), ids = self._forward(extra, **inputs), inputs["input_ids"]
        if index is not None:
            logits, ids = logits.index_select(0, index), ids.index_select(0, index)
            hidden = None if hidden is None else tuple(h if h is None else h.index_select(0, index) for h in hidden)
        return logits.float(), ids, hidden

    def _verify_inputs(self, rows: list[Row], trees: list[DraftTree], width: int) -> dict:
        """Inputs of one verification forward of every slot, ``width`` tokens each, built afresh from host lists (eager,
        attending to the columns the rows reach only; or a windowed target's); sets the cache's write columns."""
        cache, fixed = self.cache, self.compiled
        batch, dtype = cache.num_rows, cache.mask_dtype
        length = cache.max_cache_len if fixed else max(width, *(len(row.tokens) - 1 + width for row in rows))
        cache.set_visible(None if fixed else length)
        mask, bits = blocked_mask((batch, 1, width, length), dtype)  # made visible through its bits (NumPy)
        ids, positions, starts = [[0] * width for _ in range(batch)], [[0] * width for _ in range(batch)], [0] * batch
        keys = torch.arange(length).repeat(batch, 1) if cache.windowed else None  # each column's position, per row
        active, on_device = {row.index for row in rows}, []
        for b in range(batch):
            if b not in active:  # a finished slot: dummies at its own first columns, each seeing itself
                bits[b, 0, range(width), range(width)] = 0
        for row, tree in zip(rows, trees):
            b, n, start = row.index, len(tree), len(row.tokens) - 1
            block, depths = verify_block(tuple(tree.parent_list), width)
            ids[b][0] = row.tokens[-1]
            if tree.token_list is not None:
                ids[b][1 : 1 + n] = tree.token_list
            elif n:
                on_device.append((b, tree))
            cached = start - row.pad
            positions[b] = [cached + d for d in depths]
            starts[b] = start
            bits[b, 0, :, row.pad : start] = 0
            bits[b, 0, :, start : start + width][block.numpy()] = 0
            if keys is not None:
                keys[b] -= row.pad
                keys[b, start : start + width] = host_tensor(positions[b])
        ids = host_tensor([t for row in ids for t in row], (batch, width))
        positions = host_tensor([p for row in positions for p in row], (batch, width))
        masks = mask if keys is None else cache.masks(mask, positions, keys, starts=host_tensor(starts))
        inputs = cache.forward_inputs(starts, ids, positions, masks, rows[0].device, fixed)
        for b, tree in on_device:
            inputs["input_ids"][b, 1 : 1 + len(tree)].copy_(tree.tokens)
        return inputs

    def keep(self, rows: list[Row], cached: list[int], kept: list[list[int]], survivors: list[int]) -> None:
        """Each row's accepted path moved into place (its step began at column ``pad + cached[a]``)."""
        for row, columns, nodes in zip(rows, cached, kept):
            self.cache.keep(row.index, row.pad + columns, nodes)
        self.cache.set_committed(max(len(row.tokens) - 1 for row in rows))


def graph_key(bucket: int, extra: dict | None):
    """What a compiled graph is kept under: its bucket, and what the drafters ask of the forward (another graph)."""
    return bucket if not extra else (bucket, repr(sorted(extra.items())))


@contextlib.contextmanager
def layout_for(model, generation_config: GenerationConfig, rows: list[Row], support: TargetSupport):
    """The call's cache layout, for the length of the call: the static buffers (held by this call,
    :func:`static_call`), one unpadded row's own ``DynamicCache``, or a padded batch's shared one. ``support``: what the
    call read of ``model`` (:func:`~hf_specdraft.core.support.target_support`)."""
    one_row = len(rows) == 1 and rows[0].pad == 0
    if generation_config.cache_implementation == "static":
        with static_call(model):
            yield static_target(model, generation_config, len(rows), support, one_row=one_row)
    else:
        # repacked by index, or compacted
        cache = croppable_cache(model) if not one_row else target_cache(model, support.convolution_only)
        yield OwnedRow(model, cache, support) if one_row else SharedBatch(model, cache, support)


def static_target(
    model,
    generation_config: GenerationConfig,
    batch_size: int,
    support: TargetSupport,
    role: str = "target",
    buckets: tuple[int, ...] = BUCKETS,
    one_row: bool = True,
) -> StaticLayout:
    """The static path of ``model`` in ``role`` ("target", or "draft" for a draft's own cache) for a call of
    ``batch_size`` rows (``support``: what the call reads of ``model``): the cache it had in that role reused when it
    fits, or a new one of ``P + max_new_tokens + widest bucket`` columns rounded up to a power of two, at least
    :data:`MIN_CACHE_COLUMNS`. A target's windowed layers keep a ring of ``window + widest bucket`` columns
    (:meth:`~hf_specdraft.core.verify.LayerWindows.rings`)."""
    compile_config = compile_config_for(model, generation_config)
    windows = LayerWindows(model)  # read once a call, as a DynamicCache's layouts do: the model is slow to ask
    needed = generation_config.max_length + buckets[-1]
    caches = _CACHES.setdefault(model, {})
    cache = caches.get(role)
    if cache is None or not cache.fits(batch_size, needed, model.device, model.dtype):
        columns = max(MIN_CACHE_COLUMNS, 1 << (needed - 1).bit_length())
        cache = caches[role] = StaticRowsCache(
            model.config.get_text_config().num_hidden_layers,
            batch_size,
            columns,
            windows.rings(buckets[-1], columns) if role == "target" else None,
            scratch=buckets[-1],
            layer_windows=windows,
        )
    return StaticLayout(model, cache, support, compile_config, buckets, one_row)
