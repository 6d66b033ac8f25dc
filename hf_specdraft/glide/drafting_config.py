"""GLIDE's decoding options (the model's shape lives in :class:`~hf_specdraft.glide.GlideConfig`).

Reference: Du et al. 2024, "GLIDE with a CAPE", §5.1: γ = 5 draft tokens per step, fixed. The
default here is ``"auto"``: the loop picks γ every step from the acceptance and costs it measures
(:mod:`hf_specdraft.core.controller`); an int is honoured exactly.

    >>> GlideDraftingConfig(num_draft_tokens=3).num_draft_tokens
    3
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..core.drafting import AUTO, draft_length
from ..core.validation import check_copy_options


@dataclass(frozen=True)
class GlideDraftingConfig:
    """How :class:`~hf_specdraft.glide.GlideCandidateGenerator` drafts.

    Args:
        num_draft_tokens: γ, the chain GLIDE drafts per step (§5.1: 5), or ``"auto"``: chosen every step.
        copy_from_context: when the text's last ``copy_from_context`` tokens (or more) occurred earlier in it, draft the
            tokens that followed their most recent longest occurrence (Max-Gram's match, CS Drafting §3.3) instead of
            running GLIDE for that step (CAPE leaves such a step's chain as it is); 0 or ``False`` never copies,
            ``True`` is the default. Default 1, Max-Gram's match: with ``"auto"`` at batch 1 the controller weighs each
            copy by how often copies after a match that long were right, against GLIDE's own step; elsewhere (a fixed
            γ, a batch) a copy needs a 2-token match, after which the target's text mostly goes on as it did.
        max_copy_tokens: how many tokens a copy proposes at most. ``None`` (the default): with ``"auto"`` at batch 1
            the controller decides per step whether to copy and how much, from how often such copies were right and
            what verification costs (:meth:`~hf_specdraft.core.controller.DraftLengthController.copy_length`); in a
            batch ``max(COPY_TOKENS, γ)``; with a fixed γ, γ. An int caps the copy (the controller's choice under it).
    """

    num_draft_tokens: int | str = AUTO  # the best γ depends on the machine's cost curve (§5.1 fixes 5 on a GPU)
    # copying lifted the default call 1.20x -> 1.26x (completion), 1.21x -> 1.43x (chat) in cpu-state-glide.json; a
    # 2-token match's copy keeps 2.6-2.8 tokens where GLIDE's step keeps 1.2-1.6 (cpu-copy-acceptance-match2.json); on
    # natural language a one-token match's copy is right about as often as GLIDE's first token, at no draft cost, and
    # the controller declines a match bin's copies where they do worse
    copy_from_context: int = 1
    max_copy_tokens: int | None = None  # the longest copy; None: γ when γ is fixed, the controller's choice with "auto"

    def __post_init__(self):
        draft_length(self.num_draft_tokens)  # a positive int or "auto"; a clear ValueError otherwise
        if isinstance(self.copy_from_context, bool):  # False: never copy; True: copy after the default match length
            object.__setattr__(self, "copy_from_context", type(self).copy_from_context if self.copy_from_context else 0)
        check_copy_options(self.copy_from_context, self.max_copy_tokens)

    def to_dict(self) -> dict:
        return asdict(self)
