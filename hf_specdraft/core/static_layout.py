"""The static path of a call (:class:`StaticLayout`, docs/static-cache.md), every row at its own length in the fixed
buffers of a :class:`~hf_specdraft.core.static_cache.StaticRowsCache`, and the choice of a call's layout
(:func:`layout_for`). A step verifies ``[last token] + tree`` padded with masked dummies to the smallest bucket
``Q >= 1 + N`` (:data:`BUCKETS`: one compiled graph each, warmed up once and reused by later calls whose cache fits).
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
from .host import stage, to_device
from .layouts import CacheLayout, OwnedRow, SharedBatch
from .rows import Row
from .static_cache import StaticRowsCache
from .support import TargetSupport
from .target_state import prefill_states
from .tree import DraftTree
from .verify import LayerWindows

BUCKETS = (2, 4, 8, 16, 32, 64)  # verified tokens per row; one compiled graph each, captured on first use
MIN_CACHE_COLUMNS = 256  # a cache's fewest columns; it grows by doubling (a new size compiles every bucket again)
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
    """The lock a static call holds on ``model``'s static caches (reentrant: a call may use it as target and draft)."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(model, threading.RLock())


@contextlib.contextmanager
def static_call(model):
    """Hold ``model``'s static caches (one request's state) for one call: a concurrent static call waits here. Draft
    caches taken on the way (:func:`hold_draft`) are released with it."""
    with static_lock(model):
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
    """Seconds this thread has spent compiling and capturing buckets (kept out of the controller's costs)."""
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
    """The ``CompileConfig`` the verification forward compiles with, or ``None`` for eager (transformers' rules; its
    ``GenerationConfig.validate`` refuses a ``compile_config`` of another type)."""
    if generation_config.disable_compile:
        return None
    config = generation_config.compile_config
    if config is None and model.device.type != "cuda":
        return None  # as transformers: automatic on CUDA only; a CompileConfig forces it elsewhere
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
        self.graphs = self.compiled and self.device.type == "cuda"  # CUDA graphs replay: outputs live in their pool
        self.max_nodes = buckets[-1] - 1  # the most tree nodes one row verifies: the widest bucket but the last token
        self.prefill_kwargs = support.prefill_kwargs
        self.warm_up_seconds: dict[int, float] = {}  # bucket -> seconds of its first (compiling) forwards in this call
        self.drafts: list = []  # the drafts' own static caches (StaticDraftCache) where they compile too

    def bucket(self, tokens: int) -> int:
        """The width a forward over ``tokens`` tokens per row runs at: its bucket when compiled, itself when eager."""
        return bucket_for(tokens, self.buckets) if self.compiled else min(tokens, self.buckets[-1])

    def prefill(self, input_ids: torch.LongTensor, rows: list[Row], request) -> float:
        """Every row's prompt but its newest token into the cache, eagerly at columns ``0 .. P - 2`` (row ``b``'s column
        ``j >= pad_b`` at position ``j - pad_b``; a padding column sees only itself). Returns seconds."""
        started, cache = time.perf_counter(), self.cache
        batch, width = input_ids.shape[0], input_ids.shape[1] - 1
        if width:
            cache.visible, cache.committed = width, 0  # the prefill is eager: it attends to its own columns only
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
            cache.prefilling = True  # attends to its own states; ring layers keep the newest of them
            try:
                out = self.model(**inputs, **self.with_cache, use_cache=True, **self.prefill_kwargs, **request.kwargs)
            finally:
                cache.prefilling = False
            if request.hidden:
                prefill_states(out.hidden_states, rows)
        cache.committed = width
        self.costs["widest_repacked"] = self.costs["holes_columns"] = cache.max_cache_len
        return time.perf_counter() - started

    def linears(self):
        """Eager, the target's few-row linears (as :class:`CacheLayout`'s); compiled, its own kernels."""
        return contextlib.nullcontext() if self.compiled else super().linears()

    def controller_limits(self, longest: int, widest: float) -> tuple[int, object, object]:
        """The controller weighs each γ at the cost of its bucket, and never drafts past the widest."""
        return min(longest, self.max_nodes // int(widest)), self.bucket, (self.compiled, self.max_nodes)

    def before_steps(self, rows: list[Row], request, generation_config: GenerationConfig) -> None:
        """Every bucket compiles (on CUDA: is captured) before the first step; in a compiled batch-1 call each drafter
        that ``compiles_draft`` gets a static cache of its own (one whose draft another call holds drafts eagerly)."""
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
        views for a drafter to read (GLIDE's glimpse); a ring layer's newest ``window - 1`` columns copied in order."""
        b, start, stop = row.index, row.pad, len(row.tokens) - 1
        view = DynamicCache()  # no layers of its own yet
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

    def warm_up(self, largest_tokens: int, extra: dict | None = None, dummy=None) -> None:
        """Compile (on CUDA: capture) every bucket up to the one holding ``largest_tokens`` on dummies, timed
        (:func:`captured_seconds`). ``extra``: what the drafters ask of the forward (a graph of its own);
        ``dummy(width, compiled)``: one forward of ``width`` dummies per row (default :meth:`_dummy`)."""
        if not self.compiled:
            return
        dummy = dummy or (lambda width, compiled: self._dummy(width, compiled, extra))
        if not self.cache.layers[0].is_initialized:  # buffers are allocated eagerly, never in a graph
            dummy(self.buckets[0], False)
        last = bucket_for(min(largest_tokens, self.buckets[-1]), self.buckets)
        for bucket in (b for b in self.buckets if b <= last and graph_key(b, extra) not in self.cache.warmed):
            started = time.perf_counter()
            for _ in range(3 if self.device.type == "cuda" else 1):  # CUDA graphs record on a later run than the first
                dummy(bucket, True)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.cache.warmed.add(graph_key(bucket, extra))
            self.warm_up_seconds[bucket] = seconds = time.perf_counter() - started
            _CAPTURED.seconds = captured_seconds() + seconds

    def _dummy(self, width: int, compiled: bool, extra: dict | None = None) -> None:
        """One forward of ``width`` dummies a row where no row's state lives (the full layers' last columns, the rings'
        scratch slots), each seeing itself at position 0 (seeing nothing writes NaN); safe at any point of a call."""
        cache, device = self.cache, self.device
        batch, length = cache.num_rows, cache.max_cache_len
        if not cache.windowed:  # the very buffers the bucket's steps fill
            inputs = cache.bucket_inputs(width, device)
        else:
            cache.visible = None
            own = torch.arange(length - width, length)[:, None] == torch.arange(length)[None]  # (Q, L)
            zeros = torch.zeros(batch, width, dtype=torch.long)  # the dummies' ids and positions
            masks = cache.masks(own.expand(batch, width, length), zeros, torch.zeros(batch, length, dtype=torch.long))
            masks = cache.onto_rings(masks, width) if cache.has_rings else masks
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

    def verify(self, rows: list[Row], trees: list[DraftTree], extra: dict) -> tuple:
        """One forward over every row's ``[last token] + tree``, padded to a bucket, with ``extra`` (what the drafters
        ask of it). Returns float32 logits `(A, Q, V)`, the verified ids `(A, Q)` and the asked hidden states (or
        ``None``) of the active ``rows``, in their order (on the device: nothing is read back)."""
        width = self.bucket(1 + max(len(tree) for tree in trees))
        self.count_step(width)
        if self.compiled and graph_key(width, extra) not in self.cache.warmed:
            self.warm_up(width, extra)  # a bucket no warm-up covered: compiled here (safe mid-call), its time reported
        inputs = self._verify_inputs(rows, trees, width)
        # the active rows' slots, sent before the forward (no sync either way)
        index = to_device([row.index for row in rows], rows[0].device) if len(rows) < self.cache.num_rows else None
        (logits, hidden), ids = self._forward(extra, **inputs), inputs["input_ids"]
        if index is not None:
            logits, ids = logits.index_select(0, index), ids.index_select(0, index)
            hidden = None if hidden is None else tuple(h if h is None else h.index_select(0, index) for h in hidden)
        return logits.float(), ids, hidden

    def _verify_inputs(self, rows: list[Row], trees: list[DraftTree], width: int) -> dict:
        """Every slot's ``width`` verified inputs, staged in its bucket's inputs (cut to the columns the rows reach when
        eager; a windowed target's masks made per layer type on the host)."""
        cache, device, length, bucket = self.cache, rows[0].device, None, width  # compiled: every column, a bucket
        if not self.compiled:
            length = max(width, *(len(row.tokens) - 1 + width for row in rows))
            bucket = bucket_for(width, self.buckets)
        if not cache.windowed:
            return cache.bucket_inputs(bucket, device, rows, trees, width, length)
        staging = cache.staging(bucket, "cpu")
        on_device = staging.fill(rows, trees)
        ids, positions, columns = staging.host_packed[:, :, :width]
        keys = torch.arange(length or cache.max_cache_len).repeat(cache.num_rows, 1)  # each column's position, per row
        for row in rows:
            start = len(row.tokens) - 1
            keys[row.index] -= row.pad
            keys[row.index, start : start + width] = positions[row.index]
        masks = cache.masks(staging.host_mask[:, :, :width, : keys.shape[1]], positions, keys, starts=columns[:, 0])
        cache.visible = length
        inputs = cache.forward_inputs(columns[:, 0].tolist(), ids, positions, masks, device, self.compiled)
        for b, tree in on_device:
            inputs["input_ids"][b, 1 : 1 + len(tree)].copy_(tree.tokens)
        return inputs

    def keep(self, rows: list[Row], cached: list[int], kept: list[list[int]], survivors: list[int]) -> None:
        """Each row's accepted path moved into place (its step began at column ``pad + cached[a]``)."""
        for row, columns, nodes in zip(rows, cached, kept):
            self.cache.keep(row.index, row.pad + columns, nodes)
        self.cache.committed = max(len(row.tokens) - 1 for row in rows)


def graph_key(bucket: int, extra: dict | None):
    """What a compiled graph is kept under: its bucket, and what the drafters ask of the forward (another graph)."""
    return bucket if not extra else (bucket, repr(sorted(extra.items())))


@contextlib.contextmanager
def layout_for(model, generation_config: GenerationConfig, rows: list[Row], support: TargetSupport):
    """The call's cache layout while it runs: the static buffers (held by this call, :func:`static_call`), one unpadded
    row's own ``DynamicCache``, or a padded batch's shared one (``support``: what the call read of ``model``)."""
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
    """The static path of ``model`` in ``role`` ("target", or "draft" for a draft's own cache) for ``batch_size`` rows:
    the cache it had in that role where it fits, else one of ``P + max_new_tokens + widest bucket`` columns rounded up
    to a power of two (at least :data:`MIN_CACHE_COLUMNS`). A target's windowed layers keep a ring of ``window + widest
    bucket`` columns where that is shorter than a row: their buffers stay the window's size at any length."""
    windows = LayerWindows(model)  # read once a call, as a DynamicCache's layouts do: the model is slow to ask
    needed = generation_config.max_length + buckets[-1]
    caches = _CACHES.setdefault(model, {})
    cache = caches.get(role)
    if cache is None or not cache.fits(batch_size, needed, model.device, model.dtype):
        columns = max(MIN_CACHE_COLUMNS, 1 << (needed - 1).bit_length())
        rings = {i: (w, w + buckets[-1]) for i, w in windows.windows.items() if w and w + buckets[-1] < columns}
        cache = caches[role] = StaticRowsCache(
            model.config.get_text_config().num_hidden_layers,
            batch_size,
            columns,
            windows,
            rings if role == "target" else None,
            scratch=buckets[-1],
        )
    return StaticLayout(model, cache, support, compile_config_for(model, generation_config), buckets, one_row)
