"""A drafter's own cache and its forward behind one interface, :class:`DraftCache`, so a drafter drafts the same way on
a dynamic cache (:class:`DynamicDraftCache`) or, in a batch-1 call on the compiled static path, a static one whose feeds
run padded to a bucket of :data:`DRAFT_BUCKETS` through its compiled forward (:class:`StaticDraftCache`; a longer feed,
the prompt, runs eagerly on the same cache). docs/static-cache.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from transformers import CompileConfig, DynamicCache, GenerationConfig

from .cache import croppable_cache
from .host import stage
from .static_layout import hold_draft, static_target
from .support import support_of, with_cache

DRAFT_BUCKETS = (1, 2, 4, 8, 16)  # tokens per draft feed: one drafted token, or the accepted tokens after a step


class DraftCache:
    """A draft model's cache and forward, as a drafter drafts on it: ``get_seq_length()`` and ``crop(max_length)``
    (transformers' convention: a negative ``max_length`` drops that many) re-sync it to the accepted text (a static
    crop only moves the committed length back); ``logits(feed, rows, extra)`` writes ``feed`` `(1, n)` after the
    covered tokens and returns the draft's logits `(rows, V)` at its last ``rows`` tokens (``extra``: :meth:`glimpse`'s
    answer).

    Args:
        draft_model: the draft.
        reads: ``(target_cache, committed) -> extra``: what the draft's forwards read of the target at a step (GLIDE's
            glimpse; ``committed``: the target's text but its newest token, ``None``: all of it), in the form
            ``logits``' ``extra`` takes on this cache; ``None`` (the default): the draft reads nothing of it.
    """

    def __init__(self, draft_model, reads: Callable | None = None):
        self.model, self.reads = draft_model, reads

    def glimpse(self, target_cache, committed: int | None):
        """What this step's forwards read of the target (the ``reads`` the drafter gave), or ``None``."""
        return None if self.reads is None else self.reads(target_cache, committed)

    def forward(self, feed: torch.LongTensor, extra=None) -> torch.Tensor:
        """The draft's logits `(1, V)` after ``feed`` `(1, n)`."""
        return self.logits(feed, 1, extra)


class DynamicDraftCache(DraftCache):
    """The draft's own ``DynamicCache`` (default :func:`~hf_specdraft.core.cache.croppable_cache`). ``extra``: more
    keyword inputs of the draft's forward."""

    def __init__(self, draft_model, reads: Callable | None = None, past_key_values: DynamicCache | None = None):
        super().__init__(draft_model, reads)
        self.past_key_values = croppable_cache(draft_model) if past_key_values is None else past_key_values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.past_key_values.get_seq_length(layer_idx)

    def crop(self, max_length: int) -> None:
        self.past_key_values.crop(max_length)

    def logits(self, feed: torch.LongTensor, rows: int, extra=None) -> torch.Tensor:
        own = with_cache(self.model, self.past_key_values)
        out = self.model(input_ids=feed, **own, use_cache=True, logits_to_keep=rows, **(extra or {}))
        return out.logits[0, -rows:]


class StaticDraftCache(DraftCache):
    """The draft's static cache and compiled forward for one batch-1 call. ``extra``: ``columns (Q,) -> dict`` of more
    inputs of fixed shape for queries at those sequence indices (GLIDE's glimpse of the target's static buffers).

    Args:
        draft_model: the draft. generation_config: the call's (``max_length`` sizes the cache).
        compile_config: how the draft's forward compiles (the loop's). reads: as :class:`DraftCache`'s.
    """

    def __init__(
        self,
        draft_model,
        generation_config: GenerationConfig,
        compile_config: CompileConfig,
        role: str = "draft",
        reads: Callable | None = None,
    ):
        super().__init__(draft_model, reads)
        # StaticCacheBusy while another call drafts or verifies with this model: the caller stays eager
        hold_draft(draft_model)
        config = copy.copy(generation_config)
        config.compile_config, config.disable_compile = compile_config, False
        self.static = static_target(draft_model, config, 1, support_of(draft_model), role=role, buckets=DRAFT_BUCKETS)
        self.length = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        self.length = self.length + max_length if max_length < 0 else min(self.length, max_length)

    @torch.no_grad()
    def logits(self, feed: torch.LongTensor, rows: int, extra=None) -> torch.Tensor:
        """Float32 logits `(rows, V)` (:meth:`DraftCache.logits`)."""
        start, n, static = self.length, feed.shape[1], self.static
        compiled = static.compiled and static.cache.layers[0].is_initialized and n <= DRAFT_BUCKETS[-1]
        logits = self._run(feed[0], start, static.bucket(n) if compiled else n, compiled, extra, rows)
        self.length = start + n
        return (logits[0, n - rows : n] if compiled else logits[0, -rows:]).float()

    def prepare(self) -> None:
        """Before the loop's first step: allocate the buffers and compile (on CUDA: capture) every bucket on dummy
        tokens in the cache's last columns, where no feed writes, so no drafting step compiles (the controller's draft
        costs never hold a compile)."""
        extra, length = self.glimpse(None, None), self.static.cache.max_cache_len
        zeros = torch.zeros(DRAFT_BUCKETS[-1], dtype=torch.long)
        self.static.warm_up(
            DRAFT_BUCKETS[-1], dummy=lambda b, compiled: self._run(zeros[:b], length - b, b, compiled, extra)
        )

    def _run(self, tokens: torch.Tensor, start: int, width: int, compiled: bool, extra, rows: int = 1) -> torch.Tensor:
        """One forward of ``tokens`` (padded to ``width``) written at columns ``start ..``; the logits of every query
        when compiled (a fixed shape), of the last ``rows`` when eager."""
        cache = self.static.cache
        length = cache.max_cache_len if compiled else start + width
        cache.visible = None if compiled else length
        columns = start + torch.arange(width)
        keys = torch.arange(length)
        visible = keys[None, None, :] <= columns[None, :, None]  # causal: the committed text and the feed up to itself
        device, buffers = self.model.device, cache.inputs if compiled else None
        ids, mask = torch.zeros(1, width, dtype=torch.long), cache.masks(visible, columns[None], keys)
        inputs = cache.forward_inputs([start], ids, columns[None], mask, device, compiled)
        inputs["input_ids"][0, : tokens.shape[0]].copy_(tokens)  # the feed stays where it was drafted: no read-back
        for name, value in (extra(columns) if extra is not None else {}).items():
            inputs[name] = stage(buffers, name, value, device) if name.endswith("attention_mask") else value
        if compiled:
            return self.static._forward(**inputs)[0]
        return self.model(**inputs, **with_cache(self.model, cache), use_cache=True, logits_to_keep=rows).logits
