"""GLIDE's decoding options (the model's shape lives in :class:`~hf_specdraft.glide.GlideConfig`). §5.1 fixes γ = 5;
the default here is ``"auto"``: the loop picks γ every step from measured acceptance and costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.drafting import AUTO, draft_length
from ..core.validation import check_copy_options


@dataclass(frozen=True)
class GlideDraftingConfig:
    """How :class:`~hf_specdraft.glide.GlideCandidateGenerator` drafts.

    Args:
        num_draft_tokens: γ, the chain GLIDE drafts per step (§5.1: 5), or ``"auto"``: chosen every step.
        copy_from_context: when the text's last ``copy_from_context`` tokens (or more) occurred earlier in it, draft the
            tokens that followed their most recent longest occurrence (Max-Gram's match, CS Drafting §3.3) instead of
            running GLIDE for that step; 0 or ``False`` never copies, ``True`` is the default, 1. With ``"auto"`` at
            batch 1 the controller weighs each copy against GLIDE's own step; elsewhere a copy needs a 2-token match.
        max_copy_tokens: how many tokens a copy proposes at most. ``None``: with ``"auto"`` at batch 1 the controller
            decides per step; in a batch ``max(COPY_TOKENS, γ)``; with a fixed γ, γ. An int caps the copy.
        copy_from_table: where the text offers no copy, copy the chain of the checkpoint's copy table (what most often
            followed the text's last few tokens in the target's own answers, ``python -m recipes.copy_table``), if it
            has one; only with ``"auto"`` at batch 1, where the controller weighs each copy. ``False``: never.
    """

    num_draft_tokens: int | str = AUTO  # the best γ depends on the machine's cost curve (§5.1 fixes 5 on a GPU)
    # a one-token match's copy is right about as often as GLIDE's first token, at no draft cost, and the controller
    # declines a match bin's copies where they do worse (copying: 1.21x -> 1.43x on chat, cpu-state-glide.json)
    copy_from_context: int = 1
    max_copy_tokens: int | None = None  # the longest copy; None: γ when γ is fixed, the controller's choice with "auto"
    copy_from_table: bool = True

    def __post_init__(self):
        draft_length(self.num_draft_tokens)  # a positive int or "auto"; a clear ValueError otherwise
        if isinstance(self.copy_from_context, bool):  # False: never copy; True: copy after the default match length
            object.__setattr__(self, "copy_from_context", type(self).copy_from_context if self.copy_from_context else 0)
        check_copy_options(self.copy_from_context, self.max_copy_tokens)
        if not isinstance(self.copy_from_table, bool):
            raise TypeError(f"copy_from_table must be a bool, got {type(self.copy_from_table).__name__}")
