"""Where the target's cache lives during a call: one object per layout, each with the same few methods, so the loop's
step (:func:`~hf_specdraft.core.loop.speculative_step`) holds no branch on the layout.

* :class:`OwnedRow`: one unpadded row owns a ``DynamicCache`` (compacted in place after each step);
* :class:`SharedBatch`: a padded batch shares one right-aligned ``DynamicCache`` (repacked each step);
* :class:`~hf_specdraft.core.compiled.StaticTarget`: the static buffers of ``cache_implementation="static"``.

Each offers ``drafter_cache(a, row)`` (what row ``a``'s drafter reads of the target cache), ``fit(tree)`` (the layout's
limit on a tree), ``verify(rows, trees, extra) -> (logits, ids, hidden_states)`` (one forward over every row's ``[last token] + tree``,
with ``extra``: what the drafters ask of it, :mod:`~hf_specdraft.core.target_state`; float32 logits `(A, Q, V)`, the
verified token ids `(A, Q)` and the asked ``hidden_states`` or ``None``, on the device) and ``keep(rows, starts, kept,
survivors)`` (each row keeps its verified prefix and accepted path). gpt-fast's speculative step is short because
its cache is one object; these are the loop's.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from .cache import keep_columns, row_cache
from .host import host_tensor
from .rows import Row
from .tree import DraftTree
from .verify import verify_inputs


class OwnedRow:
    """One unpadded row that owns its ``DynamicCache`` (its columns are all of them)."""

    shared = False

    def __init__(self, model, cache: DynamicCache):
        self.model, self.cache = model, cache
        self.dtype = model.dtype  # the masks' (asked once: the model walks its parameters to answer)

    def drafter_cache(self, a: int, row: Row) -> DynamicCache:
        return self.cache

    def fit(self, tree: DraftTree) -> DraftTree:
        return tree

    def verify(self, rows: list[Row], trees: list[DraftTree], extra: dict) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        self._columns = self.cache.get_seq_length() if self.shared else rows[0].cached  # invariant: row a holds the last rows[a].cached
        inputs = verify_inputs(self.model, self.cache, rows, trees, self.shared, self.dtype)
        out = self.model(**inputs, past_key_values=self.cache, use_cache=True, **extra)
        return out.logits.float(), inputs["input_ids"], out.hidden_states if extra.get("output_hidden_states") else None  # (A, Q, V)

    def keep(self, rows: list[Row], cached: list[int], kept: list[list[int]], survivors: list[int]) -> None:
        """Each row keeps its cached text and its ``kept`` verified columns (0: its last token, ``1 + i``: node ``i``);
        ``cached[a]``: the columns row ``a`` held before the step. A row that owns the cache is compacted (finished or
        not: the returned cache covers ``sequences[:, :-1]``)."""
        columns = self._columns
        keep = [host_tensor([*range(columns - c, columns), *(columns + k for k in nodes)]) for c, nodes in zip(cached, kept)]
        keep_columns(self.cache, keep, survivors, self.shared)


class SharedBatch(OwnedRow):
    """A padded batch sharing one right-aligned ``DynamicCache``, repacked each step (finished rows leave it).

    ``cost`` records what the layout cost, for the call's statistics: ``repack_seconds`` and ``steps`` (gathers),
    ``widest_repacked`` (the widest the repacked cache got)."""

    shared = True

    def __init__(self, model, cache: DynamicCache, cost: dict):
        super().__init__(model, cache)
        self.cost = cost
        self.together = None  # a batch proposer drafting every row in one forward per token, where the drafters allow

    def drafter_cache(self, a: int, row: Row) -> DynamicCache:
        return row_cache(self.cache, a, row)

    def keep(self, rows: list[Row], cached: list[int], kept: list[list[int]], survivors: list[int]) -> None:
        started = time.perf_counter()
        super().keep(rows, cached, kept, survivors)
        if survivors:
            self.cost["repack_seconds"] += time.perf_counter() - started
            self.cost["steps"] += 1
            self.cost["widest_repacked"] = max(self.cost["widest_repacked"], self.cache.get_seq_length())
            if self.together is not None and len(survivors) < len(rows):
                self.together.keep_rows(survivors)
