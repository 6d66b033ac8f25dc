"""Where the target's cache lives during a call: one interface, :class:`CacheLayout`, and one object of it per call
(:func:`~hf_specdraft.core.static_layout.layout_for`), so the step holds no branch on the layout (as gpt-fast's cache):
:class:`OwnedRow`, :class:`SharedBatch` or :class:`~hf_specdraft.core.static_layout.StaticLayout`.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.cache_utils import DynamicLayer

from .cache import compact_cache, repack_cache
from .host import host_tensor
from .projection import few_token_linears
from .rows import Row
from .stats import SpeculativeStats
from .support import TargetSupport
from .target_state import prefill_states
from .tree import DraftTree
from .verify import LayerWindows, batch_verify_inputs, single_row_inputs


class CacheLayout:
    """What the step asks of the target's cache, and what differs between one row and a batch, whatever the layout.

    Attributes:
        one_row (`bool`): one unpadded row (the call returns its scores, logits and cache), not a padded batch.
        together: the batch proposer drafting every row in one draft forward per token, or ``None``.
        max_nodes (`int`, *optional*): the most tree nodes one row verifies (the static path's widest bucket).
        costs (`dict`): a batch's costs over the call: ``repack_seconds`` and ``steps`` (gathers), ``widest_repacked``,
            ``holes_columns`` (how wide a cache masking rejected columns in place would have grown from the prompt).
    """

    one_row = True
    together = None
    max_nodes = None

    def __init__(self, model):
        self.model = model
        self.costs = {"repack_seconds": 0.0, "steps": 0, "widest_repacked": 0, "holes_columns": 0}
        self.target_forwards = 0  # verification forwards, each serving every active row

    def prefill(self, input_ids: torch.LongTensor, rows: list[Row], request) -> float:
        """Every row's prompt but its newest token into the cache (the states ``request`` asks kept); seconds."""
        raise NotImplementedError

    def drafter_cache(self, a: int, row: Row):
        """What active row ``a``'s drafter reads of the target's cache (its committed text), read-only."""
        raise NotImplementedError

    def verify(self, rows: list[Row], trees: list[DraftTree], extra: dict) -> tuple:
        """One forward over every row's ``[last token] + tree``, with ``extra`` (what the drafters ask of it). Returns
        float32 logits `(A, Q, V)`, the verified ids `(A, Q)` and the asked ``hidden_states`` (or ``None``)."""
        raise NotImplementedError

    def count_step(self, width: int) -> None:
        """Count a verification forward of ``width`` columns a row (what a cache masking rejected columns grows by)."""
        self.target_forwards += 1
        self.costs["holes_columns"] += width

    def keep(self, rows: list[Row], cached: list[int], kept: list[list[int]], survivors: list[int]) -> None:
        """Each row keeps its cached text and its ``kept`` verified columns (0: its last token, ``1 + i``: node ``i``);
        ``cached[a]``: the columns row ``a`` held before the step; only ``survivors`` (active indices) stay."""
        raise NotImplementedError

    def batch_proposer(self, drafters: list) -> None:
        """Sets :attr:`together` where the layout and ``drafters`` allow."""

    def controller_limits(self, longest: int, widest: float) -> tuple[int, object, object]:
        """``(longest γ, bucket, setting)`` for the γ controller: the longest chain it may choose, how a width is
        rounded for its cost curve (``None``: not), and what of the layout changes costs (part of its state's key)."""
        return longest, None, False

    def linears(self):
        """The context the steps run in: the target's few-row linears (where its own kernels would be slower)."""
        return few_token_linears(self.model)

    def before_steps(self, rows: list[Row], request, generation_config: GenerationConfig) -> None:
        """Run once before the call's first step (the static path compiles every bucket, and its drafts, there)."""

    def call_result(self, rows: list[Row], generation_config: GenerationConfig) -> tuple[SpeculativeStats, dict]:
        """The call's statistics and the output's other fields: one row's own, with its scores and logits (where asked);
        a padded batch's rows' merged, with ``extra["cache_layout"]`` (:attr:`costs`), ``extra["batch_forwards"]`` (the
        rows count a batch forward once in every row it served) and each row's (``row_stats``)."""
        if self.one_row:
            row = rows[0]
            return row.stats, {
                "scores": tuple(row.scores) if generation_config.output_scores else None,
                "logits": tuple(row.logits) if generation_config.output_logits else None,
            }
        stats = SpeculativeStats.merge([row.stats for row in rows])
        forwards = {"target": self.target_forwards, "draft": None if self.together is None else self.together.forwards}
        stats.extra.update(batch_size=len(rows), cache_layout=dict(self.costs), batch_forwards=forwards)
        return stats, {"row_stats": tuple(row.stats for row in rows)}

    def finish(self, stats) -> DynamicCache | None:
        """After the last step: what of the layout goes into ``stats``; the cache handed out (a batch's: none)."""
        return None


class DynamicLayout(CacheLayout):
    """A layout on a ``DynamicCache``, run by the model's own forward (masks in its dtype)."""

    def __init__(self, model, cache: DynamicCache, support: TargetSupport):
        super().__init__(model)
        self.cache, self.with_cache = cache, {support.cache_argument: cache, "use_cache": True}
        self.prefill_kwargs = support.prefill_kwargs  # what a prefill adds (logits_to_keep=1 where the model takes it)
        self.windows = LayerWindows(model)  # what the masks depend on (asked once: the model walks its parameters)

    def prefill(self, input_ids: torch.LongTensor, rows: list[Row], request) -> float:
        start = time.perf_counter()
        if input_ids.shape[1] > 1:
            padding = {}
            if not self.one_row:  # each row's text from its first unpadded column, at positions from 0
                pads = torch.tensor([r.pad for r in rows], device=input_ids.device)
                mask = (torch.arange(input_ids.shape[1], device=input_ids.device)[None] >= pads[:, None]).long()
                padding = {"attention_mask": mask[:, :-1], "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)[:, :-1]}
            out = self.model(
                input_ids=input_ids[:, :-1], **padding, **self.with_cache, **self.prefill_kwargs, **request.kwargs
            )
            # padding columns hold whatever the model computed there: masked, but NaN would leak
            for layer in self.cache.layers if padding else ():
                if layer.keys is not None:  # a KV-shared layer holds nothing of its own
                    layer.keys, layer.values = layer.keys.nan_to_num(), layer.values.nan_to_num()
            if request.hidden:
                prefill_states(out.hidden_states, rows)
        if not self.one_row:
            self.costs["widest_repacked"] = self.costs["holes_columns"] = self.cache.get_seq_length()
        return time.perf_counter() - start

    def _forward(self, inputs: dict, extra: dict):
        self.count_step(inputs["input_ids"].shape[1])
        out = self.model(**inputs, **self.with_cache, **extra)
        return out.logits.float(), inputs["input_ids"], out.hidden_states if extra.get("output_hidden_states") else None


class OwnedRow(DynamicLayout):
    """One unpadded row that owns its ``DynamicCache`` (:func:`~hf_specdraft.core.cache.target_cache`)."""

    def drafter_cache(self, a: int, row: Row) -> DynamicCache:
        return self.cache

    def verify(self, rows, trees, extra):
        return self._forward(single_row_inputs(self.windows, rows[0].ids, self.cache, trees[0]), extra)

    def keep(self, rows, cached, kept, survivors):
        """The row is compacted, finished or not: the returned cache covers ``sequences[:, :-1]``."""
        columns = cached[0]  # the row's verified columns start where its cached text ends
        compact_cache(self.cache, host_tensor([*range(columns), *(columns + k for k in kept[0])]))

    def finish(self, stats) -> DynamicCache:
        return self.cache


class SharedBatch(DynamicLayout):
    """A padded batch sharing one right-aligned ``DynamicCache`` (:func:`~hf_specdraft.core.cache.croppable_cache`: full
    layers), repacked by index each step (finished rows leave it)."""

    one_row = False
    _columns = 0  # the cache's width at the step's verification (keep reads it)

    def drafter_cache(self, a: int, row: Row) -> DynamicCache:
        """Row ``a``'s part of the cache as its own `(1, H, n_a, D)` cache of views (no copy)."""
        view, columns = DynamicCache(), self.cache.get_seq_length()  # a DynamicCache() holds no layers yet
        for layer in self.cache.layers:
            own = DynamicLayer()
            if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
                own.dtype, own.device, own.is_initialized = layer.keys.dtype, layer.keys.device, True
                own.keys = layer.keys[a : a + 1, :, columns - row.cached :]
                own.values = layer.values[a : a + 1, :, columns - row.cached :]
            view.layers.append(own)
        return view

    def batch_drafter_cache(self, active: list[Row]) -> tuple[DynamicCache, list[int]]:
        """What :attr:`together` reads of the target's cache: the cache and each active row's cached columns."""
        return self.cache, [row.cached for row in active]

    def verify(self, rows, trees, extra):
        self._columns = self.cache.get_seq_length()  # invariant: row a holds the last rows[a].cached of these columns
        return self._forward(batch_verify_inputs(rows, trees, self._columns, self.windows.dtype, rows[0].device), extra)

    def keep(self, rows, cached, kept, survivors):
        if not survivors:
            return
        started, columns = time.perf_counter(), self._columns
        keep = [host_tensor([*range(columns - cached[a], columns), *(columns + k for k in kept[a])]) for a in survivors]
        repack_cache(self.cache, keep, torch.tensor(survivors, dtype=torch.long))
        self.costs["repack_seconds"] += time.perf_counter() - started
        self.costs["steps"] += 1
        self.costs["widest_repacked"] = max(self.costs["widest_repacked"], self.cache.get_seq_length())
        if self.together is not None and len(survivors) < len(rows):
            self.together.keep_rows(survivors)

    def batch_proposer(self, drafters: list) -> None:
        self.together = drafters[0].batch_drafter(drafters)
