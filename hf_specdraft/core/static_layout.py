"""The static path's cache layout: every row at its own length in the fixed buffers of ``cache_implementation="static"``
(:class:`StaticLayout`), verified in one forward per bucket, compiled where transformers would
(:mod:`~hf_specdraft.core.compiled`); warm-up per bucket, and what it all cost. Beside it, the choice of a call's layout
among the three (:func:`layout_for`: this module extends :mod:`~hf_specdraft.core.layouts`' interface).

Each graph (one per verification bucket, :mod:`~hf_specdraft.core.static_verify`) is warmed up once and reused by
every later call whose cache fits: the cache is kept per model (:func:`static_target`) and held by one call at a time
(:func:`static_call`). Prefill stays eager, as in transformers.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref

import torch
from transformers import CompileConfig, GenerationConfig
from transformers.cache_utils import get_layer_types_and_kwargs

from .compiled import compile_config_for, compiled_call, record_capture
from .host import to_device
from .layouts import CacheLayout, OwnedRow, SharedBatch
from .rows import Row
from .static_cache import StaticRowsCache
from .support import no_logits_kwargs, with_cache
from .target_state import prefill_states, rows_of
from .static_verify import BUCKETS, bucket_for, cap_nodes, static_prefill_inputs, static_verify_inputs, warm_up_inputs
from .tree import DraftTree
from .verify import WINDOWED_LAYER_TYPES, may_window

_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {role: its last StaticRowsCache}, reused when it fits
MIN_CACHE_COLUMNS = 256  # a cache holds at least this many columns, and grows by doubling: a new size is a new graph
# per bucket (minutes on a CPU), so calls with other prompt lengths should find the cache they need already there
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
    """Hold ``model``'s static caches for one call: a concurrent static call on the same target waits here (a cache is
    one request's state; sharing it would mix two requests' keys). Draft caches the call takes on the way
    (:func:`hold_draft`) are released with it."""
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


class StaticLayout(CacheLayout):
    """The static cache's layout (:class:`~hf_specdraft.core.layouts.CacheLayout`): every row at its own length in fixed
    buffers, verified in one forward per bucket, compiled where transformers would compile.

    Args:
        model: the target. cache: its :class:`~hf_specdraft.core.static_cache.StaticRowsCache`.
        compile_config: ``None`` runs the forward eagerly.
        one_row: one unpadded row (:attr:`~hf_specdraft.core.layouts.CacheLayout.one_row`), not a padded batch.
    """

    def __init__(self, model, cache: StaticRowsCache, compile_config: CompileConfig | None,
                 buckets: tuple[int, ...] = BUCKETS, one_row: bool = True):
        super().__init__(model)
        self.cache, self.buckets, self.one_row = cache, buckets, one_row
        self.compiled, self.compile_config = compile_config is not None, compile_config
        self.call = compiled_call(model, compile_config) if self.compiled else model.__call__
        self.warm_up_seconds: dict[int, float] = {}  # bucket -> seconds of its first (compiling) forwards in this call
        self.drafts: list = []  # the drafts' own static caches (StaticDraftCache) where they compile too
        if not hasattr(cache, "warmed"):
            cache.warmed = set()  # buckets already compiled and run on this cache (by this or an earlier call)

    @property
    def max_nodes(self) -> int:
        """The most tree nodes one row verifies: the widest bucket but the last token."""
        return self.buckets[-1] - 1

    def bucket(self, tokens: int) -> int:
        """The width a forward over ``tokens`` tokens per row runs at: its bucket when compiled, itself when eager."""
        return bucket_for(tokens, self.buckets) if self.compiled else min(tokens, self.buckets[-1])

    def prefill(self, input_ids: torch.LongTensor, rows: list[Row], request) -> float:
        """Every row's prompt but its newest token into the cache (eager), with the states ``request`` asks kept on the
        rows (:func:`~hf_specdraft.core.target_state.prefill_states`). Returns seconds."""
        started = time.perf_counter()
        if input_ids.shape[1] > 1:
            self.cache.set_prefilling(True)  # attends to its own states; ring layers keep the newest of them
            try:
                out = self.model(**static_prefill_inputs(self.model, self.cache, input_ids, [row.pad for row in rows]),
                                 **with_cache(self.model, self.cache), use_cache=True, **no_logits_kwargs(self.model), **request.kwargs)
            finally:
                self.cache.set_prefilling(False)
            if request.hidden:
                prefill_states(out.hidden_states, rows)
        self.cache.set_committed(input_ids.shape[1] - 1)
        self.costs["widest_repacked"] = self.costs["holes_columns"] = self.cache.max_cache_len
        return time.perf_counter() - started

    def compile_drafts(self, rows: list[Row], generation_config: GenerationConfig) -> None:
        """On the compiled path of a batch-1 call, each drafter that can (``compiles_draft``) drafts on a static cache
        of its own, compiled like this one (:mod:`~hf_specdraft.core.draft_cache`); one whose draft another thread's
        call holds drafts eagerly."""
        if not (self.compiled and self.one_row):
            return
        for row in rows:
            if row.traits.compiles_draft:
                try:
                    made = row.generator.compile_draft(generation_config, self.compile_config, self.cache)
                except StaticCacheBusy:
                    continue
                self.drafts.extend(made if isinstance(made, list) else [made])

    def linears(self):
        """Eager, the target's few-row linears (:class:`~hf_specdraft.core.layouts.CacheLayout`); compiled, its own
        kernels."""
        return contextlib.nullcontext() if self.compiled else super().linears()

    def controller_limits(self, longest: int, widest: float) -> tuple[int, object, object]:
        """The controller weighs each γ at the cost of its bucket, and never drafts past the widest."""
        return min(longest, self.max_nodes // int(widest)), self.bucket, (self.compiled, self.max_nodes)

    def before_steps(self, request) -> None:
        """Every bucket compiles (and on CUDA is captured) before the first step of the first call, so no step ever
        compiles, whatever tree a drafter proposes, in this call or a later one; the drafts' buckets too."""
        self.warm_up(self.buckets[-1], request.kwargs)
        for draft in self.drafts:
            draft.prepare()

    def finish(self, stats) -> None:
        """What the static path compiled, and what its first forwards cost; the cache is kept for the next call, which
        overwrites it: not handed out."""
        drafts = [draft for draft in self.drafts if draft is not None]
        stats.extra["static_cache"] = {"compiled": self.compiled, "buckets": list(self.buckets),
                                       "warm_up_seconds": {str(b): s for b, s in self.warm_up_seconds.items()},
                                       "draft_compiled": bool(drafts),
                                       "draft_warm_up_seconds": {str(b): s for d in drafts for b, s in d.warm_up_seconds.items()}}
        return None

    def drafter_cache(self, a: int, row: Row):
        """Row ``row``'s committed text in the cache, as views a drafter reads (GLIDE's glimpse)."""
        return self.cache.row_view(row.index, row.pad, len(row.tokens) - 1)

    def fit(self, tree: DraftTree) -> DraftTree:
        return cap_nodes(tree, self.max_nodes)

    def warm_up(self, largest_tokens: int, extra: dict | None = None) -> None:
        """Compile and run every bucket up to the one holding ``largest_tokens`` once (on dummies written where no row's
        state lives, :func:`warm_up_inputs`), so the call's own steps never compile. ``extra``: what the drafters ask of
        the forward (:mod:`~hf_specdraft.core.target_state`): a graph of its own, returning those states too."""
        if self.compiled and not self.cache.layers[0].is_initialized:  # buffers are allocated by an eager forward, never in a graph
            self._dummy(self.buckets[0], compiled=False)
        for bucket in self.buckets:
            if bucket > self.bucket(min(largest_tokens, self.buckets[-1])):
                break
            if graph_key(bucket, extra) in self.cache.warmed or not self.compiled:
                continue
            self.capture(bucket, lambda b=bucket: self._dummy(b, compiled=True, extra=extra), graph_key(bucket, extra))

    def capture(self, bucket: int, run, key=None) -> None:
        """``run()`` a bucket's compiled forward until it is compiled (and on CUDA captured); its seconds are recorded, and
        kept out of the costs the controller learns (:func:`~hf_specdraft.core.compiled.captured_seconds`)."""
        started = time.perf_counter()
        for _ in range(3 if self.model.device.type == "cuda" else 1):  # CUDA graphs record on a later run than the first
            run()
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        self.cache.warmed.add(bucket if key is None else key)
        seconds = time.perf_counter() - started
        self.warm_up_seconds[bucket] = seconds
        record_capture(seconds)

    def _dummy(self, width: int, compiled: bool, extra: dict | None = None) -> None:
        """One forward of ``width`` dummy tokens per row where no row's state lives (:func:`warm_up_inputs`): compiles
        (and on CUDA captures) a bucket, or allocates the buffers eagerly. Safe at any point of a call."""
        inputs = warm_up_inputs(self.model, self.cache, width, self.model.device)
        if compiled:
            self._forward(extra, **inputs)
        else:
            self.model(**inputs, **with_cache(self.model, self.cache), use_cache=True)

    @property
    def graphs(self) -> bool:
        """Whether the forward replays CUDA graphs (compiled on CUDA): its outputs then live in the graphs' pool."""
        return self.compiled and self.model.device.type == "cuda"

    def _forward(self, extra: dict | None = None, **inputs) -> tuple[torch.Tensor, tuple | None]:
        """The bucket's forward: logits, and the ``hidden_states`` that ``extra`` asks for (else ``None``)."""
        extra = extra or {}
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs were consumed
        out = self.call(**inputs, **with_cache(self.model, self.cache), use_cache=True, **extra)
        hidden = out.hidden_states if extra.get("output_hidden_states") else None
        if not self.graphs:
            return out.logits, hidden
        # a CUDA graph's outputs live in its pool and the next replay overwrites them: the loop keeps logits (acceptance,
        # output_logits) and states (the drafters) across a step, so they are copied out
        return out.logits.clone(), None if hidden is None else tuple(None if h is None else h.clone() for h in hidden)

    def verify(self, rows: list[Row], trees: list[DraftTree], extra: dict) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """One forward over every row's ``[last token] + tree``, padded to a bucket, with ``extra`` (what the drafters
        ask of it). Returns float32 logits `(A, Q, V)`, the verified ids `(A, Q)` and the asked hidden states (or
        ``None``) of the active ``rows``, in their order (on the device: nothing is read back)."""
        width = self.bucket(1 + max(len(tree) for tree in trees))
        if self.compiled and graph_key(width, extra) not in self.cache.warmed:
            self.warm_up(width, extra)  # a bucket no warm-up covered: compiled here (safe mid-call), its time reported
        inputs = static_verify_inputs(self.model, self.cache, rows, trees, width, fixed=self.compiled)
        (logits, hidden), ids = self._forward(extra, **inputs), inputs["input_ids"]
        if len(rows) < self.cache.num_rows:
            index = to_device([row.index for row in rows], logits.device)
            logits, ids = logits.index_select(0, index), ids.index_select(0, index)
            hidden = None if hidden is None else rows_of(hidden, index)
        return logits.float(), ids, hidden

    def keep(self, rows: list[Row], cached: list[int], kept: list[list[int]], survivors: list[int]) -> None:
        """Each row's accepted path moved into place (``cached[a]``: the columns row ``a``'s text held before the step,
        so its step began at column ``pad + cached[a]``); the committed length is ``len(row.tokens) - 1`` after emission."""
        for row, columns, nodes in zip(rows, cached, kept):
            self.cache.keep(row.index, row.pad + columns, nodes)
        self.cache.set_committed(max(len(row.tokens) - 1 for row in rows))


def graph_key(bucket: int, extra: dict | None):
    """What a compiled graph is kept under: its bucket, and what the drafters ask of the forward (another graph)."""
    return bucket if not extra else (bucket, repr(sorted(extra.items())))


def ring_windows(model, widest: int, columns: int) -> dict[int, tuple[int, int]]:
    """``{layer: (window, ring)}`` for the target's sliding-window and chunked layers whose ring (``window + widest``
    bucket) is shorter than a full row of ``columns``: their static buffers stay the window's size at any length."""
    if not may_window(model):
        return {}
    types, kwargs = get_layer_types_and_kwargs(model.config.get_text_config())
    windows = {}
    for i, kind in enumerate(types):
        window = kwargs[i].get("sliding_window") if kind in WINDOWED_LAYER_TYPES else None
        if window and window + widest < columns:
            windows[i] = (window, window + widest)
    return windows


def layout_for(model, generation_config: GenerationConfig, rows: list[Row]) -> CacheLayout:
    """The call's cache layout: the static buffers (held by this call; a batch-1 draft compiles on its own static cache
    where its drafter can, :meth:`StaticLayout.compile_drafts`), one unpadded row's own ``DynamicCache``, or a padded
    batch's shared one."""
    one_row = len(rows) == 1 and rows[0].pad == 0
    if generation_config.cache_implementation != "static":
        return OwnedRow(model) if one_row else SharedBatch(model)
    static = static_target(model, generation_config, len(rows), one_row=one_row)
    static.compile_drafts(rows, generation_config)
    return static


def static_target(model, generation_config: GenerationConfig, batch_size: int, role: str = "target",
                  buckets: tuple[int, ...] = BUCKETS, one_row: bool = True) -> StaticLayout:
    """The static path of ``model`` in ``role`` ("target", or "draft" for a draft's own cache) for a call of
    ``batch_size`` rows: the cache it had in that role reused when it fits, or a new one of ``P + max_new_tokens +
    widest bucket`` columns rounded up to a power of two, at least :data:`MIN_CACHE_COLUMNS`."""
    config = model.config.get_text_config()
    needed = generation_config.max_length + buckets[-1]
    caches = _CACHES.setdefault(model, {})
    cache = caches.get(role)
    if cache is None or not cache.fits(batch_size, needed, model.device, model.dtype):
        columns = max(MIN_CACHE_COLUMNS, 1 << (needed - 1).bit_length())
        windows = ring_windows(model, buckets[-1], columns) if role == "target" else None
        cache = StaticRowsCache(config.num_hidden_layers, batch_size, columns, windows, scratch=buckets[-1])
        cache.windowed, cache.mask_dtype = may_window(model), model.dtype  # read once: the model is slow to ask
        caches[role] = cache
    return StaticLayout(model, cache, compile_config_for(model, generation_config), buckets, one_row)
