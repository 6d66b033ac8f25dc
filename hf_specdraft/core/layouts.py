"""Where the target's cache lives during a call: one declared interface, :class:`CacheLayout`, and one object of it per
call, so the loop's step (:func:`~hf_specdraft.core.loop.speculative_step`) holds no branch on the layout.

* :class:`OwnedRow`: one unpadded row owns a ``DynamicCache`` (compacted in place after each step);
* :class:`SharedBatch`: a padded batch shares one right-aligned ``DynamicCache`` (repacked each step);
* :class:`~hf_specdraft.core.static_layout.StaticLayout`: the static buffers of ``cache_implementation="static"``.

The call's setup picks one (:func:`~hf_specdraft.core.static_layout.layout_for`). The layout also answers what differs
between one row and a batch: the statistics and the fields the call returns (:meth:`CacheLayout.call_stats`,
:meth:`CacheLayout.result_fields`). gpt-fast's speculative step is short because its cache is one object; these are
the loop's.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache, GenerationConfig

from .cache import compact_cache, repack_cache, row_cache
from .host import host_tensor
from .projection import few_token_linears
from .rows import Row
from .stats import SpeculativeStats
from .support import TargetSupport
from .target_state import prefill_states
from .tree import DraftTree
from .verify import LayerWindows, batch_verify_inputs, single_row_inputs


class CacheLayout:
    """What the step asks of the target's cache, whatever its layout.

    Attributes:
        one_row (`bool`): one unpadded row (its chain may stop on its draft's confidence; the call returns its scores,
            logits and cache), not a padded batch.
        together: the batch proposer drafting every row in one draft forward per token (:meth:`batch_proposer`), or
            ``None``: each row's drafter proposes on its own.
        max_nodes (`int`, *optional*): the most tree nodes one row verifies (the static path's widest bucket), or
            ``None``: no limit.
        costs (`dict`): what the layout cost over the call, for a batch's statistics: ``repack_seconds`` and ``steps``
            (gathers), ``widest_repacked`` (the widest the repacked cache got), ``holes_columns`` (how wide a cache
            masking rejected columns in place would have grown from the prompt: every step's verified width, summed).
    """

    one_row = True
    together = None
    max_nodes = None

    def __init__(self, model):
        self.model = model
        self.costs = {"repack_seconds": 0.0, "steps": 0, "widest_repacked": 0, "holes_columns": 0}
        self.target_forwards = 0  # verification forwards, each serving every active row

    def prefill(self, input_ids: torch.LongTensor, rows: list[Row], request) -> float:
        """Every row's prompt but its newest token into the cache (the states ``request`` asks kept on the rows).
        Returns seconds."""
        raise NotImplementedError

    def drafter_cache(self, a: int, row: Row):
        """What active row ``a``'s drafter reads of the target's cache (its committed text), read-only."""
        raise NotImplementedError

    def batch_drafter_cache(self, active: list[Row]) -> tuple:
        """What :attr:`together` reads of the target's cache: the cache and each active row's cached columns (asked
        only of a layout that builds a batch proposer)."""
        raise NotImplementedError

    def verify(
        self, rows: list[Row], trees: list[DraftTree], extra: dict
    ) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """One forward over every row's ``[last token] + tree``, with ``extra`` (what the drafters ask of it,
        :mod:`~hf_specdraft.core.target_state`). Returns float32 logits `(A, Q, V)`, the verified ids `(A, Q)` and the
        asked ``hidden_states`` (or ``None``), on the device."""
        raise NotImplementedError

    def count_step(self, width: int) -> None:
        """Count one verification forward of ``width`` columns per row (:attr:`costs`); each layout's :meth:`verify`
        counts its own."""
        self.target_forwards += 1
        self.costs["holes_columns"] += width  # what a cache that only masks rejected columns would have grown by

    def keep(self, rows: list[Row], cached: list[int], kept: list[list[int]], survivors: list[int]) -> None:
        """Each row keeps its cached text and its ``kept`` verified columns (0: its last token, ``1 + i``: node ``i``);
        ``cached[a]``: the columns row ``a`` held before the step; only ``survivors`` (active indices) stay."""
        raise NotImplementedError

    def leave(self, rows: list[Row], active: list[Row]) -> None:
        """Rows done before any step (their prompt already at ``max_length``) leave the cache."""

    def batch_proposer(self, drafters: list) -> None:
        """Where the layout and ``drafters`` allow, :attr:`together`: one proposer drafting every row in one draft
        forward per token."""

    def controller_limits(self, longest: int, widest: float) -> tuple[int, object, object]:
        """``(longest γ, bucket, setting)`` for the γ controller: the longest chain it may choose, how a width is
        rounded for its cost curve (``None``: not), and what of the layout changes costs (part of its state's key)."""
        return longest, None, False

    def linears(self):
        """The context the steps run in: the target's few-row linears
        (:func:`~hf_specdraft.core.projection.few_token_linears`) where its own kernels would be slower; a compiled
        forward picks its own."""
        return few_token_linears(self.model)

    def before_steps(self, rows: list[Row], request, generation_config: GenerationConfig) -> None:
        """Run once before the call's first step (the static path compiles every bucket, and its drafts, there)."""

    def call_stats(self, rows: list[Row]) -> SpeculativeStats:
        """The call's statistics: one row's own; a padded batch's rows merged (``row_stats`` keeps each) with what the
        layout cost (``extra["cache_layout"]``) and ``extra["batch_forwards"]``: the rows' own statistics count a batch
        forward once in every row it served."""
        if self.one_row:
            return rows[0].out.stats
        stats = SpeculativeStats.merge([row.out.stats for row in rows])
        forwards = {"target": self.target_forwards, "draft": None if self.together is None else self.together.forwards}
        stats.extra.update(batch_size=len(rows), cache_layout=dict(self.costs), batch_forwards=forwards)
        return stats

    def result_fields(self, rows: list[Row], generation_config: GenerationConfig) -> dict:
        """What :class:`~hf_specdraft.core.outputs.SpeculativeGenerateOutput` carries besides the sequences, the
        statistics and the cache: one row's scores and logits (where asked), a padded batch's ``row_stats``."""
        if not self.one_row:
            return {"row_stats": tuple(row.out.stats for row in rows)}
        out = rows[0].out
        return {
            "scores": tuple(out.scores) if generation_config.output_scores else None,
            "logits": tuple(out.logits) if generation_config.output_logits else None,
        }

    def finish(self, stats) -> DynamicCache | None:
        """After the last step: what of the layout goes into ``stats``, and the cache the call returns (or ``None``)."""
        return None


class DynamicLayout(CacheLayout):
    """A layout on a ``DynamicCache`` (``cache``): its forward, the model's own (the masks in the model's dtype), taking
    what the call read of the model (``support``, :class:`~hf_specdraft.core.support.TargetSupport`)."""

    def __init__(self, model, cache: DynamicCache, support: TargetSupport):
        super().__init__(model)
        self.cache, self.with_cache = cache, {support.cache_argument: cache}
        self.prefill_kwargs = support.prefill_kwargs  # what a prefill adds (logits_to_keep=1 where the model takes it)
        self.windows = LayerWindows(model)  # what the masks depend on (asked once: the model walks its parameters)

    def _forward(self, inputs: dict, extra: dict):
        self.count_step(inputs["input_ids"].shape[1])
        out = self.model(**inputs, **self.with_cache, use_cache=True, **extra)
        return out.logits.float(), inputs["input_ids"], out.hidden_states if extra.get("output_hidden_states") else None


class OwnedRow(DynamicLayout):
    """One unpadded row that owns its ``DynamicCache`` (its columns are all of them,
    :func:`~hf_specdraft.core.cache.target_cache`)."""

    def prefill(self, input_ids: torch.LongTensor, rows: list[Row], request) -> float:
        start = time.perf_counter()
        if input_ids.shape[1] > 1:
            out = self.model(
                input_ids=input_ids[:, :-1],
                **self.with_cache,
                use_cache=True,
                **self.prefill_kwargs,
                **request.kwargs,
            )
            if request.hidden:
                prefill_states(out.hidden_states, rows)
        return time.perf_counter() - start

    def drafter_cache(self, a: int, row: Row) -> DynamicCache:
        return self.cache

    def verify(self, rows, trees, extra):
        inputs = single_row_inputs(self.windows, rows[0].ids, self.cache, trees[0])
        return self._forward(inputs, extra)

    def keep(self, rows, cached, kept, survivors):
        """The row is compacted, finished or not: the returned cache covers ``sequences[:, :-1]``."""
        columns = cached[0]  # the row's verified columns start where its cached text ends
        compact_cache(self.cache, host_tensor([*range(columns), *(columns + k for k in kept[0])]))

    def finish(self, stats) -> DynamicCache:
        return self.cache


class SharedBatch(DynamicLayout):
    """A padded batch sharing one right-aligned ``DynamicCache`` (:func:`~hf_specdraft.core.cache.croppable_cache`: full
    layers, repacked by index), repacked each step (finished rows leave it): the :class:`CacheLayout` costs record
    ``repack_seconds`` and ``steps`` (gathers) and ``widest_repacked``."""

    one_row = False

    def __init__(self, model, cache: DynamicCache, support: TargetSupport):
        super().__init__(model, cache, support)
        self._columns = 0  # the cache's width at the step's verification (keep reads it)

    def prefill(self, input_ids: torch.LongTensor, rows: list[Row], request) -> float:
        start = time.perf_counter()
        if input_ids.shape[1] > 1:
            device = input_ids.device
            mask = (
                torch.arange(input_ids.shape[1], device=device)[None]
                >= torch.tensor([r.pad for r in rows], device=device)[:, None]
            ).long()
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self.model(
                input_ids=input_ids[:, :-1],
                attention_mask=mask[:, :-1],
                position_ids=positions[:, :-1],
                **self.with_cache,
                use_cache=True,
                **self.prefill_kwargs,
                **request.kwargs,
            )
            for layer in (
                self.cache.layers
            ):  # padding columns hold whatever the model computed there; masked, but NaN would leak
                if layer.keys is not None:  # a KV-shared layer holds nothing of its own
                    layer.keys, layer.values = layer.keys.nan_to_num(), layer.values.nan_to_num()
            if request.hidden:
                prefill_states(out.hidden_states, rows)
        self.costs["widest_repacked"] = self.costs["holes_columns"] = self.cache.get_seq_length()
        return time.perf_counter() - start

    def drafter_cache(self, a: int, row: Row) -> DynamicCache:
        return row_cache(self.cache, a, row)

    def batch_drafter_cache(self, active: list[Row]) -> tuple[DynamicCache, list[int]]:
        return self.cache, [row.cached for row in active]

    def verify(self, rows, trees, extra):
        ids, mask, positions = batch_verify_inputs(
            rows, trees, self.cache.get_seq_length(), self.windows.dtype, rows[0].device
        )
        self._columns = self.cache.get_seq_length()  # invariant: row a holds the last rows[a].cached of these columns
        return self._forward({"input_ids": ids, "attention_mask": mask, "position_ids": positions}, extra)

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

    def leave(self, rows: list[Row], active: list[Row]) -> None:
        if len(active) < len(rows):
            columns = self.cache.get_seq_length()
            repack_cache(
                self.cache,
                [torch.arange(columns - row.cached, columns) for row in active],
                torch.tensor([row.index for row in active], dtype=torch.long),
            )

    def batch_proposer(self, drafters: list) -> None:
        self.together = drafters[0].batch_drafter(drafters)

    def finish(self, stats) -> None:
        return None  # the batch's cache is not handed out (rows left it as they finished)
