"""Max-Gram (MaG): the statistical drafter at the bottom of a cascade (Chen et al. 2024, §3.3, App. A).

MaG proposes the tokens that followed the longest earlier occurrence of the text's suffix (tensor ops on the text's
device, :func:`~hf_specdraft.core.suffix_match.longest_suffix_match`); when the last token never occurred before, the
chain of an argmax bigram table (:mod:`hf_specdraft.cascade.bigram`).

    >>> seq = torch.tensor([5, 6, 7, 8, 1, 6, 7, 9, 2, 5, 6, 7])
    >>> longest_suffix_match(seq)  # "5 6 7" ends at position 2; "6 7" at 6 is shorter
    (2, 3)
    >>> max_gram_draft(seq, 3).tolist()
    [8, 1, 6]
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..core.drafting import DraftRequest, TreeCandidateGenerator, draft_length, output_vocab_size
from ..core.suffix_match import longest_suffix_match
from ..core.tree import DraftTree
from ..core.validation import check_int
from .bigram import check_bigram_table, target_bigram_table

# §5.2 "we use MaG to generate 10 tokens at once, as it is rare for more than 10 tokens to be accepted"
MAX_GRAM_TOKENS = 10


def max_gram_draft(
    sequence: torch.LongTensor,
    num_tokens: int = MAX_GRAM_TOKENS,
    bigram_table: torch.LongTensor | None = None,
    max_match_length: int | None = None,
) -> torch.LongTensor:
    """One Max-Gram proposal (§3.3, Appendix A): the ``num_tokens`` tokens `(num_tokens,)` that followed the longest
    match of ``sequence`` `(L,)`; with none, the chain of ``bigram_table`` `(V,)` from the last token, or `(0,)`. The
    copy may run into the tokens it is proposing (as in LZ77): a match ``d`` tokens back proposes
    ``sequence[j + 1 + (i mod d)]``, what re-running MaG on the extended text finds (the official code searches twice).
    """
    end, _ = longest_suffix_match(sequence, max_match_length)
    if end >= 0:
        distance = sequence.numel() - 1 - end
        return sequence[end + 1 + torch.arange(num_tokens, device=sequence.device) % distance]
    if bigram_table is None or sequence.numel() == 0:
        return sequence[:0]
    # the table's chain (ids outside it map to themselves): a loop over the budget, not the text, on the device
    out = torch.empty(num_tokens, dtype=torch.long, device=bigram_table.device)
    token, size = sequence[-1].to(bigram_table.device), bigram_table.numel()
    for i in range(num_tokens):
        token = torch.where(token < size, bigram_table[token.clamp(max=size - 1)], token)
        out[i] = token
    return out.to(sequence.device)


class MaxGramCandidateGenerator(TreeCandidateGenerator):
    """Max-Gram alone as a drafter (Chen et al. 2024, §3.3): no model, near-zero cost; calls count as ``"max_gram"``.

    Args:
        bigram_table (`torch.LongTensor` of shape `(V,)`, *optional*): argmax bigram fallback, e.g. from
            :func:`~hf_specdraft.cascade.bigram.load_bigram_table`. Shorter than the target's vocabulary
            is fine (the missing ids map to themselves); longer, or holding ids outside it, is an error.
        num_draft_tokens: γ, tokens per proposal (the paper's MaG uses a fixed 10); ``"auto"`` (the default): the loop
            picks 1-10 every step from measured acceptance and verification costs (a cascade reads 10).
        max_match_length: see :func:`longest_suffix_match`.
    """

    reads_target_cache = False  # never reads the target's cache
    max_draft_tokens = MAX_GRAM_TOKENS  # the longest draft the loop's controller considers for it

    def __init__(
        self,
        bigram_table: torch.Tensor | None = None,
        num_draft_tokens: int | str = "auto",
        max_match_length: int | None = 256,
    ):
        super().__init__()
        self.num_draft_tokens, self.adaptive_draft_length = draft_length(num_draft_tokens, start=MAX_GRAM_TOKENS)
        check_int("max_match_length", max_match_length, allow_none=True)
        self.bigram_table = check_bigram_table(bigram_table) if bigram_table is not None else None
        self.max_match_length = max_match_length

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        super().prepare(target, generation_config)
        if self.bigram_table is not None:
            check_bigram_table(self.bigram_table, output_vocab_size(target))

    def draft(self, sequence: torch.LongTensor, num_tokens: int | None = None) -> torch.LongTensor:
        """``num_tokens`` (default γ) tokens to follow ``sequence`` `(L,)`; counted as one ``"max_gram"`` call."""
        table = self.bigram_table
        if table is not None and table.device != sequence.device:
            table = self.bigram_table = table.to(sequence.device)
        self.count_call("max_gram")
        return max_gram_draft(sequence, num_tokens or self.num_draft_tokens, table, self.max_match_length)

    @torch.no_grad()
    def draft_tree(self, request: DraftRequest) -> DraftTree:
        """A chain of the request's γ tokens (its own where the controller chose none)."""
        return DraftTree.chain(self.draft(request.input_ids[0], request.num_draft_tokens))


def build_max_gram_for_bench(
    target: PreTrainedModel, bigram_table: torch.Tensor | str | Path | None = None, **options
) -> MaxGramCandidateGenerator:
    """Max-Gram alone for the benchmark harness, ``bigram_table`` (a tensor or a file) checked against ``target`` now;
    ``options``: ``num_draft_tokens`` (default "auto"; the paper fixes 10), ``max_match_length``."""
    return MaxGramCandidateGenerator(target_bigram_table(target, bigram_table), **options)
