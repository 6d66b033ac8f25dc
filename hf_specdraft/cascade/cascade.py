"""Cascade Speculative Drafting (CS Drafting): vertical and horizontal cascades (Chen et al. 2024, §3, Algorithm 1).

Drafters, largest first: neural drafts ``M_d1 … M_dn`` (``drafts[0..n-1]``), then Max-Gram (MaG, §3.3); the target
reviews last, in the loop, exactly (lossless).

- *horizontal cascade* (§3.2): at one level, drafter ``i`` extends the draft until it is ``k_1 + … + k_i`` tokens past
  the level's prefix, so the cheap drafters produce the late, rarely accepted tokens.
- *vertical cascade* (§3.1): a neural drafter never decodes autoregressively; it reviews the draft of the cascade below
  it (sub-matrix ``K[i+1:, i+1:]``) in one forward, keeps the accepted prefix and adds its own next token.
- ``K`` `(n+1, n+1)`, upper triangular: row 0 holds the per-drafter budgets of the level the target reviews, as in the
  official code (the paper's Table 2 ``k_12`` is ``K[0, 0] + K[0, 1]``); a zero skips that drafter at that level.
- lenience ``l`` (§3.1): ``x`` passes a draft's review when it is the reviewer's argmax or ``q(x) <= l * p(x)``; never
  for MaG's raw tokens (§5.2). Reviews sample (:func:`lenient_review_sampling`) under ``do_sample=True``.
- calls are counted as ``"draft0"``, ``"draft1"``, … and ``"max_gram"`` (SWI's costs, §5.1).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..core.acceptance import lenient_review, lenient_review_sampling
from ..core.drafting import DraftRequest, TreeCandidateGenerator, check_same_device, check_same_vocab, draft_length
from ..core.tree import DraftTree
from ..core.cache import resync_cache
from ..core.draft_cache import DynamicDraftCache, StaticDraftCache
from ..core.validation import method_config
from .bigram import target_bigram_table
from .config import CascadeConfig
from .max_gram import MAX_GRAM_TOKENS, MaxGramCandidateGenerator

UNBOUNDED = 2**62  # no length limit known (propose called outside generate): the budgets alone bound the draft


def default_k_matrix(num_drafts: int) -> list[list[int]]:
    """The official code's settings: ``[[5, 10], [0, 10]]`` (one draft, its LLaMA example) and ``[[5, 14, 10],
    [0, 1, 10], [0, 0, 10]]`` (two drafts, its FLAN-T5 config); otherwise every draft 5 and MaG 10 per level."""
    if num_drafts == 2:
        return [[5, 14, 10], [0, 1, 10], [0, 0, 10]]
    return [[0] * i + [5] * (num_drafts - i) + [MAX_GRAM_TOKENS] for i in range(num_drafts + 1)]


def validate_k_matrix(k_matrix, num_drafts: int) -> list[list[int]]:
    """``k_matrix`` for ``num_drafts`` neural drafts + MaG as nested int lists, else a ``ValueError``."""
    size = num_drafts + 1
    try:
        matrix = torch.as_tensor(k_matrix)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"k_matrix must be a square matrix of ints, got {k_matrix!r}") from err
    if matrix.dim() != 2 or tuple(matrix.shape) != (size, size):
        raise ValueError(
            f"k_matrix must have shape ({size}, {size}) for {num_drafts} draft(s) + Max-Gram, got shape "
            f"{tuple(matrix.shape)}"
        )
    if matrix.dtype == torch.bool or matrix.is_complex() or not bool((matrix == matrix.long()).all()):
        raise ValueError(f"k_matrix entries must be integers, got {matrix.tolist()}")
    matrix = matrix.long()
    if bool((matrix < 0).any()):
        raise ValueError(f"k_matrix entries must be >= 0 (token budgets), got {matrix.tolist()}")
    if bool(torch.tril(matrix, diagonal=-1).any()):
        raise ValueError(
            "k_matrix must be upper-triangular (entries below the diagonal are never used and must be 0), got "
            f"{matrix.tolist()}"
        )
    if int(matrix[0].sum()) == 0:
        raise ValueError(
            "k_matrix's first row (the budgets of the level the target reviews) sums to 0, so nothing would be "
            f"drafted: {matrix.tolist()}"
        )
    return matrix.tolist()


class CascadeCandidateGenerator(TreeCandidateGenerator):
    """CS Drafting (Chen et al. 2024, Algorithm 1) as a chain drafter; the target's review is the loop's verification.

    Args:
        drafts: neural drafts ``[M_d1, …, M_dn]``, largest first, each sharing the target's vocabulary.
        config: a :class:`~hf_specdraft.cascade.CascadeConfig` (K, lenience, Max-Gram's length, γ cap); or pass
            its fields as keywords (``k_matrix=``, ``lenience=``, ``max_gram_tokens=``, ``num_draft_tokens=``).
        bigram_table (`torch.LongTensor` of shape `(V,)`, *optional*): MaG's fallback.
        max_gram: a ready :class:`MaxGramCandidateGenerator` instead of ``bigram_table`` / ``max_gram_tokens``.
    """

    reads_target_cache = False  # never reads the target's cache
    compiles_draft = True  # compile_draft: every draft's forwards on a static cache of its own

    def __init__(
        self,
        drafts: list[PreTrainedModel],
        config: CascadeConfig | None = None,
        bigram_table: torch.Tensor | None = None,
        max_gram: MaxGramCandidateGenerator | None = None,
        **options,
    ):
        super().__init__()
        if not isinstance(drafts, (list, tuple)) or not drafts:
            raise ValueError(
                "drafts must be a non-empty list of draft models, largest first (for Max-Gram alone use "
                "MaxGramCandidateGenerator)"
            )
        for i, draft in enumerate(drafts):
            if not isinstance(draft, PreTrainedModel):
                raise TypeError(f"drafts[{i}] must be a transformers PreTrainedModel, got {type(draft).__name__}")
        self.config = method_config(CascadeConfig, config, options)
        if max_gram is not None and not isinstance(max_gram, MaxGramCandidateGenerator):
            raise TypeError(f"max_gram must be a MaxGramCandidateGenerator, got {type(max_gram).__name__}")
        self.drafts = list(drafts)
        self.controller_anchor = self.drafts[0]  # what the loop's controller state belongs to across calls
        k_matrix = default_k_matrix(len(drafts)) if self.config.k_matrix is None else self.config.k_matrix
        self.k_matrix = validate_k_matrix(k_matrix, len(drafts))
        self.max_gram = max_gram or MaxGramCandidateGenerator(bigram_table, self.config.max_gram_tokens)
        cap = self.config.num_draft_tokens
        # "auto": the loop's controller sets the cap every step, up to all row 0's budgets can propose; outside the
        # loop (propose called directly) there is no cap, as in the paper
        self.max_draft_tokens = sum(self.k_matrix[0])
        self.num_draft_tokens, self.adaptive_draft_length = draft_length(cap, start=None) if cap else (None, False)
        self.max_length: int | None = None  # set by prepare: drafting past generate's max_length is wasted
        self._reset()

    def _reset(self) -> None:
        self.caches = [DynamicDraftCache(d) for d in self.drafts]
        self.seen = [torch.zeros(0, dtype=torch.long, device=d.device) for d in self.drafts]  # tokens each cache covers

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        super().prepare(target, generation_config)
        for i, draft in enumerate(self.drafts):
            check_same_vocab(target, draft, argument=f"drafts[{i}]")
            check_same_device(target, draft, argument=f"drafts[{i}]")
        self.max_gram.prepare(target, generation_config)
        self.max_length = generation_config.max_length
        self._reset()

    @torch.no_grad()
    def draft_tree(self, request: DraftRequest) -> DraftTree:
        """Algorithm 1 from the top (``isFirstCall``), stopping before the target's review: a chain of at most γ,
        without q (the target verifies by exact match)."""
        text = request.input_ids[0]
        # the loop keeps room for its bonus token
        limit = UNBOUNDED if self.max_length is None else self.max_length - 1
        cap = request.num_draft_tokens or self.num_draft_tokens
        if cap is not None:
            limit = min(limit, text.numel() + cap)
        cur_gen, _ = self.cascade_step(0, text, torch.zeros(0, device=text.device), limit)
        return DraftTree.chain(cur_gen[text.numel() : limit])

    def cascade_step(
        self, level: int, cur_gen: torch.LongTensor, cur_probs: torch.Tensor, limit: int
    ) -> tuple[torch.LongTensor, torch.Tensor]:
        """``CascadeSpeculativeDraftingStep`` (Algorithm 1) for ``drafts[level:]`` + MaG, ``curK = K[level:, level:]``,
        reviewed by the target (``level == 0``) or ``drafts[level - 1]``; level ``n + 1``: MaG. ``cur_gen`` `(L + j,)`:
        the text and the ``j`` tokens drafted so far, ``cur_probs`` `(j,)` their ``q(x)``, extended up to ``limit``."""
        if level == len(self.drafts) + 1:  # the base case: MaG's tokens, whose q(x) is inf (never lenient)
            count = min(self.max_gram.num_draft_tokens, limit - cur_gen.numel())
            if count <= 0:
                return cur_gen, cur_probs
            tokens = self.max_gram.draft(cur_gen, count).to(cur_gen.device)
            self.count_call("max_gram")
            inf = torch.full((tokens.numel(),), float("inf"), device=cur_probs.device)
            return torch.cat([cur_gen, tokens]), torch.cat([cur_probs, inf])
        budgets = self.k_matrix[level][level:]  # [k_1, …] for drafters drafts[level:] + MaG
        prefix_length = cur_gen.numel()
        goal = prefix_length
        for i, k in enumerate(budgets):  # horizontal cascade: largest drafter first
            goal = min(goal + k, limit)
            while cur_gen.numel() < goal:  # vertical cascade: drafter level+i reviews the cascade below it
                before = cur_gen.numel()
                cur_gen, cur_probs = self.cascade_step(level + i + 1, cur_gen, cur_probs, limit)
                if cur_gen.numel() == before:  # MaG found nothing (no match, no bigram table)
                    break
        if level == 0:
            return cur_gen, cur_probs  # the target reviews in the decoding loop, with lenience 1
        return self.review(level - 1, cur_gen, cur_probs, prefix_length)

    def review(
        self, index: int, cur_gen: torch.LongTensor, cur_probs: torch.Tensor, review_index: int
    ) -> tuple[torch.LongTensor, torch.Tensor]:
        """``review(M_d, curGen, curProbs, l)``: ``drafts[index]`` reviews ``cur_gen[review_index:]`` in one forward,
        keeps the accepted prefix and appends its own next token; kept tokens carry its ``p(x)`` as their ``q(x)``."""
        logits = self.draft_logits(index, cur_gen, review_index)  # (k+1, V)
        p = self.draft_distribution(logits, cur_gen[None])
        base = cur_gen.numel() - cur_probs.numel()  # the accepted text's length
        candidates, q = cur_gen[review_index:].to(p.device), cur_probs[review_index - base :]
        if self.generation_config.do_sample:
            accepted, token = lenient_review_sampling(p, candidates, q, self.config.lenience)
            next_token = torch.tensor([token], device=p.device)
        else:
            accepted = lenient_review(p, candidates, q, self.config.lenience)
            next_token = p[accepted].argmax(-1, keepdim=True)
        kept = torch.cat([candidates[:accepted], next_token])
        kept_q = p[torch.arange(accepted + 1, device=p.device), kept].to(cur_probs.device)
        cur_gen = torch.cat([cur_gen[: review_index + accepted], next_token.to(cur_gen.device)])
        return cur_gen, torch.cat([cur_probs[: review_index - base], kept_q])

    def draft_logits(self, index: int, cur_gen: torch.LongTensor, review_index: int) -> torch.Tensor:
        """Logits `(len(cur_gen) - review_index + 1, V)` of ``drafts[index]`` at positions ``review_index - 1 …``; its
        cache is cropped to the common prefix with the text it last saw (at most ``review_index - 1``), then fed."""
        draft, cache = self.drafts[index], self.caches[index]  # its own cache, dynamic or static (compile_draft)
        ids = cur_gen.to(draft.device)
        keep = resync_cache(cache, self.seen[index], ids, limit=review_index - 1)
        logits = cache.logits(ids[None, keep:], ids.numel() - review_index + 1)
        self.seen[index] = ids  # invariant: the cache covers self.seen[index]
        self.count_call(f"draft{index}")
        return logits

    def compile_draft(
        self, generation_config: GenerationConfig, compile_config, target_cache
    ) -> list[StaticDraftCache]:
        """A batch-1 compiled call: each draft on its own static cache, one role per level (a model may sit at two)."""
        self.caches = [
            StaticDraftCache(draft, generation_config, compile_config, role=f"cascade{i}")
            for i, draft in enumerate(self.drafts)
        ]
        return self.caches


def build_cascade_for_bench(
    target: PreTrainedModel, drafts: list, bigram_table: torch.Tensor | str | Path | None = None, **options
) -> CascadeCandidateGenerator:
    """CS Drafting with ``drafts`` + Max-Gram for the benchmark harness, vocabularies checked now rather than at
    generate. ``options``: :class:`~hf_specdraft.cascade.CascadeConfig` fields."""
    generator = CascadeCandidateGenerator(drafts, bigram_table=target_bigram_table(target, bigram_table), **options)
    for i, draft in enumerate(generator.drafts):
        check_same_vocab(target, draft, argument=f"drafts[{i}]")
    return generator
