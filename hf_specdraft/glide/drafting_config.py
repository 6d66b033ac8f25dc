"""GLIDE's decoding options (the model's shape lives in :class:`~hf_specdraft.glide.GlideConfig`).

Reference: Du et al. 2024, "GLIDE with a CAPE" (../shared/papers/glide_cape.txt), §5.1: γ = 5 draft tokens per
step, fixed.

    >>> GlideDraftingConfig(num_draft_tokens=3).num_draft_tokens
    3
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..core.validation import check_int


@dataclass(frozen=True)
class GlideDraftingConfig:
    """How :class:`~hf_specdraft.glide.GlideCandidateGenerator` drafts.

    Args:
        num_draft_tokens: γ, the chain GLIDE drafts per step (§5.1: 5; the SmolLM2 bench tunes 3).
    """

    num_draft_tokens: int = 5  # §5.1

    def __post_init__(self):
        check_int("num_draft_tokens", self.num_draft_tokens, what="γ, tokens drafted per step")

    def to_dict(self) -> dict:
        return asdict(self)
