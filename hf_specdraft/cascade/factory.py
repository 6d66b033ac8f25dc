"""Constructors for the benchmark harness: a target, its drafts and a bigram table in, a drafter out."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from ..core.drafting import check_same_vocab, output_vocab_size
from .bigram import load_bigram_table
from .cascade import CascadeCandidateGenerator
from .max_gram import MaxGramCandidateGenerator, check_bigram_table


def _table(target: PreTrainedModel, bigram_table: torch.Tensor | str | Path | None) -> torch.Tensor | None:
    """A tensor, or a path written by ``save_bigram_table``, checked against the target's vocabulary."""
    if bigram_table is None:
        return None
    if isinstance(bigram_table, (str, Path)):
        bigram_table = load_bigram_table(bigram_table)
    return check_bigram_table(bigram_table, output_vocab_size(target)).to(target.device)


def build_max_gram_for_bench(
    target: PreTrainedModel, bigram_table: torch.Tensor | str | Path | None = None, **options
) -> MaxGramCandidateGenerator:
    """Max-Gram alone; ``options``: ``num_draft_tokens`` (default "auto"; the paper fixes 10), ``max_match_length``."""
    return MaxGramCandidateGenerator(_table(target, bigram_table), **options)


def build_cascade_for_bench(
    target: PreTrainedModel, drafts: list, bigram_table: torch.Tensor | str | Path | None = None, **options
) -> CascadeCandidateGenerator:
    """CS Drafting with ``drafts`` (largest first) + Max-Gram, vocabularies checked now rather than at generate.
    ``options``: :class:`~hf_specdraft.cascade.CascadeConfig` fields."""
    generator = CascadeCandidateGenerator(drafts, bigram_table=_table(target, bigram_table), **options)
    for i, draft in enumerate(generator.drafts):
        check_same_vocab(target, draft, argument=f"drafts[{i}]")
    return generator
