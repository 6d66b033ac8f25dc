"""Choosing γ at run time (``num_draft_tokens="auto"``; docs/usage.md, "Draft length"): each step, the draft length
that maximizes expected new tokens per second on this machine,

    γ* = argmax_γ  E[tokens | γ] / (γ · d + v(γ + 1)),    E[tokens | γ] = 1 + Σ_{i=1..γ} Π_{j=1..i} a_j

over ``1 .. max_draft_tokens``: ``a_j`` the decayed acceptance rate of draft position ``j`` given the ones before it,
``d`` the measured seconds per drafted token, ``v(n)`` those of a verification forward over ``n`` tokens (Leviathan et
al. 2023 §3.4 choose γ from the same ratio with a fixed cost coefficient). A tree drafter also picks its width; a chain
drafter that knows q also stops each draft on its confidence (:meth:`DraftLengthController.keep_drafting`, as SpecDec++
and EAGLE-2 do).
"""

from __future__ import annotations

import operator
from itertools import accumulate
from statistics import fmean, linear_regression

from .validation import check_int

PRIOR_ACCEPTANCE = 0.6  # the prior of a_0, replaced within a few steps by what the draft achieves
PRIOR_WEIGHT = 1.0  # pseudo-count of each a_j's prior (the position before it)
DECAY = 0.95  # how much of the acceptance counts each step keeps
CONFIDENCE_BINS = 10  # â(c) is measured for draft tokens in ten bins of their probability c
CONFIDENCE_PRIOR_WEIGHT = 2.0  # pseudo-count of each bin's prior, the bin's middle confidence (a calibrated draft)
PRIOR_SLOPE = 0.1  # v(n + 1) / v(1) - v(n) / v(1) before two lengths are measured: a 2-core CPU's few-token forward
EXPLORE_EVERY = 8  # every 8th step drafts one more or one less than the best: the cost curve stays measured near it
# a copy's suffix-match lengths, binned (lower edges): a longer match tends to run on longer (cpu-copy-acceptance*.json:
# accepted per copy 2.6-2.8 after a 2-token match, 6.4 after 16 or more on chat); a one-token match is Max-Gram's
COPY_MATCH_BINS = (1, 2, 3, 5, 8, 16)
TABLE_BIN = len(COPY_MATCH_BINS)  # the bin after them: chains copied from a checkpoint's table (core/ngram_table.py)
COPY_PRIOR = 0.6  # the prior of a copy's first token being right, in every match bin, replaced within a few copies
COPY_START = 6  # tokens copied while the cost curve is not measured yet


def _expected(rates: list[float]) -> list[float]:
    """Expected new tokens ``1 + Σ_{i<=n} Π_{j<=i} r_j`` of a draft of each length ``n = 0 .. len(rates)``, its
    positions accepted at ``rates`` given the ones before (the target's own token always comes)."""
    return list(accumulate(accumulate(rates, operator.mul), operator.add, initial=1.0))


class DraftLengthController:
    """Picks γ, and a tree's budget, for every step of one ``generate`` call (see the module docstring for the rule).

    Args:
        max_draft_tokens: the longest draft considered.
        widths: the tree budgets considered, in nodes per chain token: ``(1.0,)`` for a chain drafter, ``(1.0, 2.0)``
            for a tree drafter with an ``"auto"`` budget (CAPE), each with acceptance counts of its own.
        bucket: on the static cache, the width a forward over ``n`` tokens really runs at
            (:func:`~hf_specdraft.core.static_layout.bucket_for`): γ is weighed at that cost, never causing a compile.
        max_copy_tokens: the longest copy from the text (:meth:`copy_length`), by default ``max_draft_tokens``.
    """

    def __init__(
        self,
        max_draft_tokens: int = 8,
        widths: tuple[float, ...] = (1.0,),
        bucket=None,
        max_copy_tokens: int | None = None,
    ):
        check_int("max_draft_tokens", max_draft_tokens)
        check_int("max_copy_tokens", max_copy_tokens, allow_none=True, what="None: max_draft_tokens")
        self.max_draft_tokens, self.widths = max_draft_tokens, tuple(widths)
        self.max_copy_tokens = max_copy_tokens or max_draft_tokens
        self.bucket = bucket or (lambda tokens: tokens)  # tokens verified -> the forward's real width (static buckets)
        # per width option, per draft position j (0-based): times judged and times accepted, decayed
        self.tries = [[0.0] * max_draft_tokens for _ in self.widths]
        self.hits = [[0.0] * max_draft_tokens for _ in self.widths]
        self.measured_width = list(self.widths)  # tree nodes per chain token each option actually produced
        self.draft_per_token: float | None = None  # seconds per drafted token
        self.verify: dict[int, float] = {}  # tokens verified -> seconds of that forward
        self.verify_samples: dict[int, int] = {}  # tokens verified -> forwards timed
        self.steps = 0
        self.option = len(self.widths) - 1  # the width option of the step being run
        self.choices: list[int] = []
        self.confidence_stops = False  # set by the loop for a drafter that asks keep_drafting after every token
        self.bin_tries = [0.0] * CONFIDENCE_BINS  # draft tokens of each confidence bin judged, and accepted (decayed)
        self.bin_hits = [0.0] * CONFIDENCE_BINS
        self.stop_tokens = [0.0] * len(self.widths)  # per width, what confidence-stopped steps gave and cost (decayed)
        self.stop_seconds = [0.0] * len(self.widths)
        # copies from the text (copy_length): per match bin, per position, times judged and accepted (decayed)
        self.copy_tries = [[0.0] * self.max_copy_tokens for _ in range(TABLE_BIN + 1)]
        self.copy_hits = [[0.0] * self.max_copy_tokens for _ in range(TABLE_BIN + 1)]
        self._copy_bin = 0  # the match bin of the copy this step proposed
        # per bin, copies declined in a row (every EXPLORE_EVERY-th is taken, so a bin's rates stay measured)
        self._declined = [0] * (TABLE_BIN + 1)
        self._reader = None  # (the cost curve it read, cost_curve's function)
        self._draft_costs: list[float] | None = None  # this step's j · d + v(j + 1) for j = 0 .. max_draft_tokens
        self._asked = False  # whether this step's drafter called keep_drafting
        self.agree_seconds = None  # tensor parallel (core.distributed): (draft, verify) seconds -> the slowest rank's

    def budget(self, gamma: int) -> int | None:
        """The tree budget (nodes) of a step drafting γ under the current option; ``None`` for a chain drafter."""
        return None if self.widths == (1.0,) else max(gamma, round(self.widths[self.option] * gamma))

    def acceptance(self, option: int | None = None) -> list[float]:
        """``a_j`` for every draft position (of one width option, default the current one)."""
        option = self.option if option is None else option
        return self._rates(self.hits[option], self.tries[option], PRIOR_ACCEPTANCE)

    @staticmethod
    def _rates(hits: list[float], tries: list[float], prior: float) -> list[float]:
        """Each position's rate ``(hits + PRIOR_WEIGHT · r) / (tries + PRIOR_WEIGHT)``, shrunk towards ``r``, the rate
        of the position before it (the first's: ``prior``)."""
        return list(
            accumulate(zip(hits, tries), lambda r, c: (c[0] + PRIOR_WEIGHT * r) / (c[1] + PRIOR_WEIGHT), initial=prior)
        )[1:]

    def cost_curve(self):
        """v(n), the seconds of a verification forward over ``n`` tokens, as a function: measured, or read off a line
        through the measured lengths, never decreasing in ``n`` (noise only slows a forward: one slow sample must not
        make every longer draft look dear for good). Fitted once and kept until a forward is timed."""
        key = (tuple(self.verify.items()), tuple(self.verify_samples.items()))
        if self._reader is not None and self._reader[0] == key:
            return self._reader[1]
        twice = {k: v for k, v in self.verify.items() if self.verify_samples.get(k, 2) >= 2}
        # a width timed once (maybe with kernel set-up) reads no higher than the line through those timed twice
        above = self._fit(twice) if len(twice) >= 2 else lambda n: float("inf")
        read = {k: v if k in twice else min(v, above(k)) for k, v in self.verify.items()}
        settled, low = {}, float("inf")
        for k in sorted(read, reverse=True):
            low = settled[k] = min(low, read[k])
        line, widths, known = self._fit(settled), sorted(settled), dict(settled)

        def seconds(n: int) -> float:
            if n not in known:  # read off the line, between the measured neighbours
                shorter = max((settled[k] for k in widths if k < n), default=0.0)
                longer = min((settled[k] for k in widths if k > n), default=float("inf"))
                known[n] = min(max(line(n), shorter), longer)
            return known[n]

        self._reader = (key, seconds)
        return seconds

    @staticmethod
    def _fit(verify: dict[int, float]):
        """v(n) read off a line through the measured lengths (``PRIOR_SLOPE`` from a single one), as a function."""
        known = sorted(verify)
        if not known:
            return lambda n: 0.0
        if len(known) == 1:
            k = known[0]
            return lambda n: verify[k] * max(1 + PRIOR_SLOPE * (n - k), 0.5)
        seconds = [verify[k] for k in known]
        slope = max(linear_regression(known, seconds).slope, 0.0)  # least squares
        mean_n, mean_v, floor = fmean(known), fmean(seconds), min(seconds)
        return lambda n: max(mean_v + slope * (n - mean_n), floor)

    def rates(self, option: int, verify=None) -> list[float]:
        """Expected new tokens per second of a step drafting γ = 1 .. ``max_draft_tokens`` under one width ``option`` (a
        tree of about width · γ nodes); ``verify``: :meth:`cost_curve`'s function."""
        tokens, costs = _expected(self.acceptance(option)), self._costs(self.measured_width[option], verify)
        return [tokens[g] / costs[g] for g in range(1, len(tokens))]

    def _costs(self, width: float, verify=None) -> list[float]:
        """``j · d + v(1 + max(j, width · j))``: the seconds of a step drafting ``j = 0 .. max_draft_tokens`` tokens, a
        tree of about width · j nodes."""
        d, verify = self.draft_per_token or 0.0, verify or self.cost_curve()
        return [j * d + verify(self.bucket(max(j, round(width * j)) + 1)) for j in range(self.max_draft_tokens + 1)]

    def _count(self, tries: list[list], hits: list[list], k: int, drafted: int, accepted: list[int]) -> None:
        """Decay ``tries[k]`` and ``hits[k]`` and add a step's outcome (positions up to the first rejected one)."""
        tries[k], hits[k] = [t * DECAY for t in tries[k]], [h * DECAY for h in hits[k]]
        for count in accepted:
            for j in range(min(count + 1, drafted, len(tries[k]))):
                tries[k][j] += 1
                hits[k][j] += j < count

    def copy_length(self, match: int, available: int) -> int:
        """How many of the ``available`` tokens that followed an earlier occurrence of the text's last ``match`` tokens
        to copy as this step's draft (``copy_from_context``; ``match`` 0: a chain from the drafter's copy table, counted
        in a bin of its own); ``0``: draft with the model instead. A copy of ``n`` is
        worth ``(1 + Σ_{i<=n} Π_{j<=i} c_j) / v(n + 1)`` tokens per second (``c_j``: the ``a_j`` rule per bin of
        ``COPY_MATCH_BINS``); the best ``n`` is copied where it beats the drafter's own rate, and every
        ``EXPLORE_EVERY``-th declined copy anyway (so a bin's rates stay measured)."""
        self._copy_bin = (
            TABLE_BIN if match == 0 else max(i for i, e in enumerate(COPY_MATCH_BINS) if match >= e or i == 0)
        )
        top = min(available, self.max_copy_tokens)
        if top < 1:
            return 0
        if len(self.verify) < 2:
            return min(top, COPY_START)
        verify, b = self.cost_curve(), self._copy_bin
        tokens = _expected(self._rates(self.copy_hits[b], self.copy_tries[b], COPY_PRIOR)[:top])
        rates = [tokens[n] / verify(self.bucket(n + 1)) for n in range(1, len(tokens))]
        best = 1 + max(range(len(rates)), key=rates.__getitem__)
        o = self.option  # the drafter's own steps' tokens per second: realized if confidence-stopped, else expected
        stopped = self.confidence_stops and self.stop_seconds[o] > 0
        own = self.stop_tokens[o] / self.stop_seconds[o] if stopped else max(self.rates(o, verify))
        if rates[best - 1] >= own:
            self._declined[b] = 0
            return best
        self._declined[b] += 1
        return best if self._declined[b] % EXPLORE_EVERY == 0 else 0

    def accepted_given(self, confidence: float) -> float:
        """``â(c)``: the measured rate at which draft tokens of about probability ``c`` are accepted."""
        b = min(int(confidence * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)
        prior = (b + 0.5) / CONFIDENCE_BINS
        return (self.bin_hits[b] + CONFIDENCE_PRIOR_WEIGHT * prior) / (self.bin_tries[b] + CONFIDENCE_PRIOR_WEIGHT)

    @property
    def stops_this_step(self) -> bool:
        """Whether this step's draft stops on its confidence (:meth:`keep_drafting`): once the cost curve is known."""
        return self._draft_costs is not None

    def keep_drafting(self, confidences: list[float]) -> bool:
        """Whether to draft another token after ``confidences`` (this step's drafted tokens' probabilities ``c_i``).
        The path survives with ``P_j = Π_{i<=j} â(c_i)`` (:meth:`accepted_given`); drafting goes on while some longer
        draft, its unseen positions at their rates ``a``, beats ``R_j = (1 + Σ P_i) / (j · d + v(j + 1))``. ``True``
        while the cost curve is not measured yet."""
        if self._draft_costs is None:
            return True
        self._asked = True
        j = len(confidences)
        if j >= self.max_draft_tokens:
            return False
        # the drafted tokens at their confidences' rates, the unseen ones at the chain's a_j
        tokens = _expected([self.accepted_given(c) for c in confidences] + self.acceptance(0)[j:])
        costs = self._draft_costs
        return any(tokens[n] / costs[n] > tokens[j] / costs[j] for n in range(j + 1, self.max_draft_tokens + 1))

    def choose(self) -> int:
        """γ for the next step (and :attr:`option`, the step's tree width); with :attr:`confidence_stops`, the cap. A
        tree drafter that stops on confidence runs the width whose steps realized the most tokens per second; one step
        in every ``EXPLORE_EVERY`` runs another width."""
        top, last = self.max_draft_tokens, len(self.widths) - 1
        self._draft_costs, self._asked = None, False
        if len(self.verify) < 2:  # the first steps measure two points of the cost curve: a short and a longer draft
            gamma, self.option = min(1 if not self.verify else 3, top), last if not self.verify else 0
        elif self.confidence_stops:  # each draft stops on its own confidence (keep_drafting), up to the longest
            if last:  # a tree drafter: the width whose stopped steps realized the most tokens per second (unrun: first)
                rates = [t / s if s else float("inf") for t, s in zip(self.stop_tokens, self.stop_seconds)]
                self.option = max(range(len(self.widths)), key=rates.__getitem__)
                if self.steps % EXPLORE_EVERY == EXPLORE_EVERY // 2 - 1:  # and the other widths, in turn
                    self.option = self._other_width()
            self._draft_costs, gamma = self._costs(self.widths[self.option]), top  # arms keep_drafting; the longest
        else:
            verify = self.cost_curve()
            rates = [self.rates(o, verify) for o in range(len(self.widths))]
            gamma, self.option = max(
                ((g, o) for o in range(len(self.widths)) for g in range(1, top + 1)),
                key=lambda c: rates[c[1]][c[0] - 1],
            )
            phase = self.steps % EXPLORE_EVERY
            if phase == EXPLORE_EVERY - 1:  # probe beside the best γ, alternating sides
                gamma = min(max(gamma + (1 if (self.steps // EXPLORE_EVERY) % 2 == 0 else -1), 1), top)
            elif phase == EXPLORE_EVERY // 2 - 1 and last:  # and the other tree widths, in turn, each at its own best γ
                self.option = self._other_width()
                gamma = max(range(1, top + 1), key=lambda g: rates[self.option][g - 1])
        self.choices.append(gamma)
        return gamma

    def _other_width(self) -> int:
        """The width option an exploring step runs instead: each of the others in turn."""
        return (self.option + 1 + (self.steps // EXPLORE_EVERY) % (len(self.widths) - 1)) % len(self.widths)

    def observe(
        self,
        drafted: int,
        accepted: list[int],
        draft_seconds: float,
        verify_seconds: float,
        verify_tokens: int,
        on_chain: list[int] | None = None,
        confidences: list[list[float]] | None = None,
        copied: bool = False,
    ) -> None:
        """One step's outcome, under the current :attr:`option`.

        Args:
            drafted: the step's deepest draft (γ for chains). accepted: tokens of its draft each row accepted.
            draft_seconds: the step's drafting time (all rows). verify_seconds: its verification forward's time.
            verify_tokens: tokens per row that forward verified (``1 + γ`` for a chain, ``1 +`` nodes for a tree).
            on_chain: for a tree step, how many tokens of its first-child chain each row's path starts with: counted
                for the chain option (width 1) too, so its acceptance is measured on every step.
            confidences: each row's drafted tokens' probabilities (a tree: its chain's), counted into ``â(c)``'s bins.
            copied: a draft copied from the text (:meth:`copy_length`): it counts for that match bin and ``v`` only.
        """
        if self.agree_seconds is not None:
            draft_seconds, verify_seconds = self.agree_seconds(draft_seconds, verify_seconds)
        self.steps += 1
        old, samples = self.verify.get(verify_tokens), self.verify_samples.get(verify_tokens, 0)
        if old is None:  # the cost curve v
            self.verify[verify_tokens] = verify_seconds
        elif samples == 1:  # the second forward at this width: the first may have carried one-time costs
            self.verify[verify_tokens] = min(old, verify_seconds)
        else:  # a running average; one sample moves it up by at most 30 % (a spike of another process's load)
            self.verify[verify_tokens] = 0.7 * old + 0.3 * min(verify_seconds, 2 * old)
        self.verify_samples[verify_tokens] = samples + 1
        if self.choices and (copied or self._draft_costs is not None):
            self.choices[-1] = drafted  # what a copy or a confidence-stopped step drafted, not the cap it was given
        if copied:
            return self._count(self.copy_tries, self.copy_hits, self._copy_bin, drafted, accepted)
        o = self.option
        self._count(self.tries, self.hits, o, drafted, accepted)
        if confidences is not None:  # the confidence bins: every judged draft token, accepted or not
            self.bin_tries = [t * DECAY for t in self.bin_tries]
            self.bin_hits = [h * DECAY for h in self.bin_hits]
            for count, row in zip(accepted if on_chain is None else on_chain, confidences):
                for j, c in enumerate(row[: count + 1]):
                    b = min(int(c * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)
                    self.bin_tries[b] += 1
                    self.bin_hits[b] += j < count
        if self._draft_costs is not None:  # the width's realized rate, weighed against the other widths'
            self.stop_tokens[o] = DECAY * self.stop_tokens[o] + 1 + sum(accepted) / len(accepted)
            self.stop_seconds[o] = DECAY * self.stop_seconds[o] + draft_seconds / len(accepted) + verify_seconds
        if self._draft_costs is not None and self.choices and drafted and not self._asked:
            self.confidence_stops = False  # a drafter that says it stops on confidence but never asked: choose γ again
        if on_chain is not None and o != 0 and self.widths[0] == 1.0:
            self._count(self.tries, self.hits, 0, drafted, on_chain)
        if drafted:
            self.measured_width[o] = 0.7 * self.measured_width[o] + 0.3 * max((verify_tokens - 1) / drafted, 1.0)
            per_token, before = draft_seconds / drafted, self.draft_per_token
            self.draft_per_token = per_token if before is None else 0.7 * before + 0.3 * per_token


# what a call passes on to the next (core/controller_store.py)
_CARRIED = tuple(
    "verify verify_samples draft_per_token measured_width tries hits bin_tries bin_hits stop_tokens stop_seconds "
    "copy_tries copy_hits".split()
)
_ADDED = ("copy_tries", "copy_hits")  # fields a state saved by an earlier version lacks
