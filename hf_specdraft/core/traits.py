"""What a drafter declares to the loop (:class:`DrafterTraits`), kept on each row of a call."""

from __future__ import annotations

from dataclasses import dataclass, field

AUTO_MAX = 8  # the longest draft the controller considers


@dataclass(frozen=True)
class DrafterTraits:
    """What a drafter declares to the loop, read once per call (:func:`~hf_specdraft.core.drafting.traits_of`): class attributes (or properties) of
    :class:`TreeCandidateGenerator`, which every hf_specdraft drafter sets where it differs; a plain transformers
    ``CandidateGenerator`` has the defaults (and its own ``requires_model_outputs``)."""

    adaptive_draft_length: bool = False  # num_draft_tokens="auto": the loop's controller picks γ every step
    adaptive_budget: bool = False  # a tree drafter whose node budget the controller picks too
    max_draft_tokens: int = AUTO_MAX  # the longest γ the controller considers for it
    stops_on_confidence: bool = False  # a chain that asks the loop's stop rule after every drafted token
    widens_chain: bool = False  # its trees are a chain plus leaves (CAPE): the controller learns what the chain alone accepts
    reads_target_cache: bool = True  # propose() reads the target's cache (the loop builds a view only for those)
    tokens_in_vocab: bool = False  # its tokens come from a draft checked to share the target's vocabulary
    requires_model_outputs: bool = False  # it reads the target's state (core.target_state)
    model_kwargs_overrides: dict = field(default_factory=dict)  # what it asks of the target's forward (core.target_state)
    compiles_draft: bool = False  # it has compile_draft: on the compiled static path its draft runs on a static cache of its own
