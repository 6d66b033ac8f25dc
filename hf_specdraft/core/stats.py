"""Statistics of a speculative decoding call, and the papers' speedup formulas.

- α, the paper's acceptance rate (Du et al. 2024, §5.1 after Leviathan et al. 2023): ``E[Σ_v min(p(v), q(v))] =
  1 - TV(p, q)`` over the judged chain positions (up to the first rejection). ``None`` without the draft's q (n-gram
  lookups, CASD) and for trees (more than one candidate).
- position acceptance rate: accepted / judged positions (greedy: how often the draft's token is the target's).
- accepted per drafted: accepted draft tokens / drafted depth; not an α (positions after a rejection count as failures).
- mean accepted length τ: tokens emitted per target forward (accepted + the target's own token).
- expected speedup: Leviathan et al. 2023 eq. 1, as used in Du et al. 2024, §5.1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import islice

import torch

from .tree import DraftTree


@dataclass
class StepRecord:
    drafted: int  # depth of the proposal (chain length for chains)
    tree_size: int  # tokens sent to verification besides the last accepted one
    accepted: int  # draft tokens accepted (the target's bonus token not counted)
    emitted: int  # tokens appended this step (accepted + bonus, after length / eos truncation)
    draft_seconds: float
    verify_seconds: float
    judged: int = 0  # drafted positions the target judged: accepted ones plus the first rejected one, if any
    # Σ_v min(p, q) at each judged chain position (None: no q, or a tree; on the device until SpeculativeStats.settle)
    overlaps: list[float] | None = None
    copied: bool = False  # copied from the text (a GLIDE drafter's copy_from_context), not drafted by a model


def _total(name: str) -> property:
    """A property summing field ``name`` of every step."""
    return property(lambda self: sum(getattr(s, name) for s in self.steps), doc=f"Σ of every step's ``{name}``.")


# the figures of SpeculativeStats.summary() after "steps", in order: properties, or methods called without arguments
SUMMARY = (
    "new_tokens drafted_tokens accepted_tokens judged_tokens alpha alpha_positions "
    "position_acceptance_rate accepted_per_drafted mean_accepted_length verification_tokens_per_step "
    "acceptance_by_position draft_seconds verify_seconds prefill_seconds drafter_calls"
).split()


@dataclass(repr=False)
class SpeculativeStats:
    """Per-step records of one ``speculative_generate`` call, with the summary figures."""

    steps: list[StepRecord] = field(default_factory=list)
    prefill_seconds: float = 0.0
    drafter_calls: dict[str, int] = field(default_factory=dict)  # per-model forward counts (cascade, SWI)
    extra: dict = field(default_factory=dict)  # method-specific records (e.g. CAPE's expansion-set sizes)

    def settle(self) -> None:
        """Read every step's overlaps left on the device in one read."""
        pending = [s for s in self.steps if isinstance(s.overlaps, torch.Tensor)]
        if not pending:
            return
        values = iter(torch.cat([s.overlaps.reshape(-1).float() for s in pending]).tolist())
        for record in pending:
            record.overlaps = list(islice(values, record.overlaps.numel()))

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    drafted_tokens = _total("drafted")
    accepted_tokens = _total("accepted")
    new_tokens = _total("emitted")
    judged_tokens = _total("judged")
    draft_seconds = _total("draft_seconds")
    verify_seconds = _total("verify_seconds")

    @property
    def alpha(self) -> float | None:
        """The paper's α: mean ``1 - TV(p, q)`` over judged chain positions with q (``None`` without any)."""
        overlaps = [o for s in self.steps if s.overlaps for o in s.overlaps]
        return sum(overlaps) / len(overlaps) if overlaps else None

    @property
    def alpha_positions(self) -> int:
        """How many judged positions :attr:`alpha` averages over."""
        return sum(len(s.overlaps) for s in self.steps if s.overlaps)

    @property
    def position_acceptance_rate(self) -> float:
        """Accepted / judged drafted positions: the per-token acceptance the run saw (0 when nothing was judged)."""
        judged = self.judged_tokens
        return self.accepted_tokens / judged if judged else 0.0

    @property
    def accepted_per_drafted(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted); not the paper's α, see the module docstring."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """τ: tokens emitted per target forward (1.0 = no gain over target-only decoding)."""
        return self.new_tokens / self.num_steps if self.num_steps else 0.0

    @property
    def verification_tokens_per_step(self) -> float:
        return sum(s.tree_size + 1 for s in self.steps) / self.num_steps if self.num_steps else 0.0

    def acceptance_by_position(self) -> list[float]:
        """Entry ``i``: among steps that drafted ≥ i+1 tokens deep, the fraction that accepted ≥ i+1."""
        depth = max((s.drafted for s in self.steps), default=0)
        tried = [[s for s in self.steps if s.drafted > i] for i in range(depth)]
        return [sum(s.accepted > i for s in steps) / len(steps) for i, steps in enumerate(tried)]

    def summary(self) -> dict:
        """Every summary figure by name (:data:`SUMMARY`), then copied steps and :attr:`extra` where there are any."""
        figures = {"steps": self.num_steps}
        for name in SUMMARY:
            value = getattr(self, name)
            figures[name] = value() if callable(value) else dict(value) if isinstance(value, dict) else value
        if any(s.copied for s in self.steps):
            figures["copied_steps"] = sum(s.copied for s in self.steps)
        return {**figures, "extra": self.extra} if self.extra else figures

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "steps": [asdict(s) for s in self.steps]}

    def __repr__(self) -> str:
        """One line of the figures a user reads first; the rest: :attr:`steps`, :meth:`summary`, :meth:`to_dict`."""
        figures = [f"steps={self.num_steps}", f"new_tokens={self.new_tokens}"]
        if self.num_steps:
            figures.append(f"mean_accepted_length={self.mean_accepted_length:.2f}")
            figures.append(f"accepted/drafted={self.accepted_tokens}/{self.drafted_tokens}")
        if self.alpha is not None:
            figures.append(f"alpha={self.alpha:.3f}")
        figures.append(f"draft={self.draft_seconds:.2f}s verify={self.verify_seconds:.2f}s")
        if "batch_size" in self.extra:
            figures.append(f"batch_size={self.extra['batch_size']}")
        return f"SpeculativeStats({', '.join(figures)})"

    @classmethod
    def merge(cls, stats: list[SpeculativeStats]) -> SpeculativeStats:
        merged = cls()
        for s in stats:
            merged.steps.extend(s.steps)
            merged.prefill_seconds += s.prefill_seconds
            for name, count in s.drafter_calls.items():
                merged.drafter_calls[name] = merged.drafter_calls.get(name, 0) + count
        return merged


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``Σ_v min(p(v), q(v)) = 1 - TV(p, q)``, the probability that speculative sampling accepts a token drawn from q
    (Leviathan et al. 2023, §3.3). ``p``, ``q`` `(..., V)` -> `(...)`."""
    return torch.minimum(p, q).sum(-1)


def expected_speedup(alpha: float, num_draft_tokens: int, cost_coefficient: float) -> float:
    """Expected walltime improvement factor ``(1 - α^(γ+1)) / ((1 - α)(γ c + 1))`` (Leviathan et al. 2023, Theorem
    3.8; Du et al. 2024, §5.1): α the acceptance rate, γ the proposal length, c draft / target forward time."""
    gamma, c = num_draft_tokens, cost_coefficient
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha (the acceptance rate) must be in [0, 1], got {alpha}")
    if gamma < 0 or c < 0:
        raise ValueError(f"num_draft_tokens and cost_coefficient must be >= 0, got {gamma} and {c}")
    expected_tokens = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return expected_tokens / (gamma * c + 1)


def record_step(
    stats: SpeculativeStats,
    rows,
    tree: DraftTree,
    path: list[int],
    emitted: int,
    draft_seconds: float,
    verify_seconds: float,
) -> None:
    """One step's record (``rows``: the row's :class:`~hf_specdraft.core.emission.TargetRows`). Its overlaps: ``1 -
    TV(p, q)`` at the judged positions of a chain with q, left on the device until :meth:`SpeculativeStats.settle`."""
    drafted, accepted = tree.levels, min(len(path), emitted)
    judged = accepted + 1 if accepted == len(path) and accepted < drafted else accepted  # + the first rejected position
    q, overlaps = tree.draft_probs, None
    if judged and q is not None and tree.is_chain and q.shape[-1] == rows.logits.shape[-1]:
        p = torch.stack([rows.probs(i) for i in range(judged)])
        q = q[:judged] if q.device == p.device else q[:judged].to(p.device)  # no copy (nor a counted read) when there
        overlaps = overlap(p, q.float())
    stats.steps.append(
        StepRecord(drafted, len(tree), accepted, emitted, draft_seconds, verify_seconds, judged, overlaps, tree.copied)
    )
