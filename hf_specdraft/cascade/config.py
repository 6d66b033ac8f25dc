"""The cascade's options (Chen et al. 2024: §3.1 vertical cascade and lenience, §3.2 horizontal, §3.3 Max-Gram)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.acceptance import check_lenience
from ..core.drafting import draft_length
from ..core.validation import check_int
from .max_gram import MAX_GRAM_TOKENS


@dataclass(frozen=True)
class CascadeConfig:
    """How :class:`~hf_specdraft.cascade.CascadeCandidateGenerator` drafts.

    Args:
        k_matrix: ``K``, `(n+1, n+1)` upper-triangular per-drafter budgets for ``n`` drafts + Max-Gram (see
            :mod:`hf_specdraft.cascade.cascade`). ``None``: :func:`~hf_specdraft.cascade.default_k_matrix`.
        lenience: ``l >= 1`` for reviews by drafts (§3.1); 1 is exact review. Never applied when the target reviews.
        max_gram_tokens: tokens Max-Gram proposes per call (§3.3: a fixed 10).
        num_draft_tokens: cap on the tokens proposed to the target per step (γ). ``"auto"`` (the default): the loop's
            controller picks it every step from measured acceptance and costs, up to what row 0 of K can propose;
            an int is honoured exactly; ``None``: the budgets alone (the paper's setting).
    """

    k_matrix: list[list[int]] | None = None
    lenience: float = 1.0  # §3.1: l = 1 reviews exactly; Table 2 tunes it per task
    max_gram_tokens: int = MAX_GRAM_TOKENS
    num_draft_tokens: int | str | None = "auto"

    def __post_init__(self):
        object.__setattr__(self, "lenience", check_lenience(self.lenience))
        check_int("max_gram_tokens", self.max_gram_tokens)
        if self.num_draft_tokens is not None:
            draft_length(self.num_draft_tokens)  # a positive int or "auto", named in the error
