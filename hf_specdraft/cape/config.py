"""CAPE's options (Du et al. 2024, §4.2 proposal expansion, §5.3 beam-search baseline, §5.4 fixed-size expansion)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.drafting import AUTO
from ..core.validation import check_int
from .expansion_sets import DEFAULT_SCHEDULE, check_schedule

MODES = ("confidence", "fixed", "beam")


@dataclass(frozen=True)
class CapeConfig:
    """How :class:`~hf_specdraft.cape.CapeCandidateGenerator` widens a drafted chain.

    Args:
        schedule (`tuple[tuple[float, int], ...]`): S(p) as ``(upper_bound, K)`` bins: a drafted position whose
            confidence p = max q falls in ``(previous_bound, upper_bound]`` gets ``K`` extra tokens. Bounds increase
            strictly up to 1.0; ``K`` never grows with confidence (§4.2 and Figure 1(b)).
        budget (`int` or ``"auto"``): most tokens verified per step besides the last accepted one: the chain plus
            all expansion sets, earlier positions first (or the beam tree); §5.3 uses 32. ``"auto"`` (the default):
            the loop's controller chooses, per step, the chain alone or twice its length by measured costs and
            acceptance.
        mode (`str`): ``"confidence"`` (CAPE), ``"fixed"`` (every position gets ``fixed_k`` extra tokens, §5.4) or
            ``"beam"`` (beam-search expansion, the §5.3 baseline, with extra draft forwards).
        fixed_k (`int`): K for ``mode="fixed"``; 4 is "the average size of the practical expansion sets" (§5.4).
        beam_width (`int`): beams for ``mode="beam"``; 4 as in §5.3.
    """

    schedule: tuple[tuple[float, int], ...] = DEFAULT_SCHEDULE
    budget: int | str = AUTO  # §5.3 fixes 32 on a GPU (Medusa: 64); what pays depends on the machine's cost curve
    mode: str = "confidence"
    fixed_k: int = 4  # §5.4: the mean size of CAPE's expansion sets
    beam_width: int = 4  # §5.3: GLIDE+BeamSearch with beam size 4

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "schedule", check_schedule(self.schedule))
        if self.budget != AUTO:
            check_int("budget", self.budget, what="tokens verified per step (or 'auto')")
        check_int("fixed_k", self.fixed_k, minimum=0)
        check_int("beam_width", self.beam_width)

    def budget_for(self, length: int) -> int:
        """The budget of a step whose chain has ``length`` tokens: the set one, or twice the chain for ``"auto"``."""
        return 2 * length if self.budget == AUTO else self.budget

    def check_chain_length(self, length: int) -> None:
        """Raise when a chain of ``length`` drafted tokens does not fit the budget."""
        if length > self.budget_for(length):
            raise ValueError(
                f"budget={self.budget} is smaller than the drafted chain ({length} tokens): CAPE verifies the whole "
                f"chain plus its expansion sets, so raise budget to at least {length} or draft fewer tokens"
            )
