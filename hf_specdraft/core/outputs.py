"""What a call returns, as ``generate`` does: the sequences, or :class:`SpeculativeGenerateOutput` with statistics."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.utils import ModelOutput

from .rows import Row
from .stats import SpeculativeStats
from .support import CACHE_FIELD


@dataclass
class SpeculativeGenerateOutput(ModelOutput):
    """``return_dict_in_generate=True`` result.

    Args:
        sequences (`torch.LongTensor` of shape `(B, L)`): prompt + generated tokens (finished rows padded on the right).
        scores (`tuple(torch.FloatTensor)`, *optional*): processed target scores `(1, V)` per token (``output_scores``).
        logits (`tuple(torch.FloatTensor)`, *optional*): raw target logits `(1, V)` per token (``output_logits``).
        cache: the target cache, covering ``sequences[:, :-1]`` (``past_key_values`` on transformers 5.23, as
            ``generate``'s outputs name it).
        speculative_stats (:class:`~hf_specdraft.core.stats.SpeculativeStats`): per-step statistics (of every row, for a
            padded batch).
        row_stats (`tuple(SpeculativeStats)`, *optional*): a padded batch's statistics per row.
    """

    sequences: torch.LongTensor | None = None
    scores: tuple[torch.FloatTensor, ...] | None = None
    logits: tuple[torch.FloatTensor, ...] | None = None
    if CACHE_FIELD == "cache":  # transformers >= 5.24 (whose ModelOutput still answers .past_key_values)
        cache: DynamicCache | None = None
    else:
        past_key_values: DynamicCache | None = None
    speculative_stats: SpeculativeStats | None = None
    row_stats: tuple[SpeculativeStats, ...] | None = None


def assemble_result(rows: list[Row], generator, generation_config: GenerationConfig, layout, chosen: dict):
    """The call's result: the sequences, or :class:`SpeculativeGenerateOutput` (``layout`` answers what differs between
    one row and a padded batch; ``chosen``: what the γ controller chose)."""
    for row in rows:
        row.stats.settle()
        row.stats.drafter_calls = dict(row.generator.forward_calls)  # transformers' own generators count none
    stats, fields = layout.call_result(rows, generation_config)
    if chosen.get("draft_lengths"):  # num_draft_tokens="auto": the γ chosen at every step, and whether it resumed
        stats.extra.update(chosen)
    for drafter in {id(g): g for g in (generator if isinstance(generator, (list, tuple)) else [generator])}.values():
        drafter.finish_call(stats)
    pad_token = generation_config.pad_token_id
    if isinstance(pad_token, torch.Tensor):
        pad_token = int(pad_token.flatten()[0])
    if pad_token is None and len({row.ids.shape[1] for row in rows}) > 1:
        raise ValueError(
            "rows finished at different lengths and generation_config.pad_token_id is None: set pad_token_id "
            "(e.g. tokenizer.pad_token_id or the eos token id) to pad the finished rows"
        )
    # (B, longest), rows in batch order (row.index), those that finished early padded on the right
    ids = [row.ids[0] for row in rows]
    sequences = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=pad_token or 0)
    cache = layout.finish(stats)  # the static path's record; the cache a single row hands out
    if not generation_config.return_dict_in_generate:
        return sequences
    return SpeculativeGenerateOutput(sequences=sequences, **{CACHE_FIELD: cache}, speculative_stats=stats, **fields)
