"""A step's clock and its γ behind one object: drafting and verification costs as the device sees them (a first
compile's seconds kept out), and the controller that chooses γ from them
(:class:`~hf_specdraft.core.controller.DraftLengthController`).

On CUDA a forward returns once its kernels are queued, so a host clock would see verification as nearly free and the
controller would pick γ wrong: :class:`StepClock` records CUDA events there (read after the step's one read-back, when
they have completed, so no sync), the host clock elsewhere.
"""

from __future__ import annotations

import time

import torch

from .static_layout import captured_seconds
from .controller import DraftLengthController
from .emission import chain_accepted
from .rows import Row
from .tree import DraftTree


class StepClock:
    """Marks on the timeline of ``device`` (where the forwards run: CUDA events) or the host's (elsewhere)."""

    def __init__(self, device: torch.device | str):
        self.events = torch.device(device).type == "cuda"

    def mark(self):
        """A point in time: a recorded ``torch.cuda.Event`` on CUDA, ``perf_counter()`` seconds elsewhere."""
        if not self.events:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end, share: int = 1) -> float:
        """Seconds from ``start`` to ``end`` (``share``: a batch forward's rows); waits for ``end`` on CUDA."""
        if not self.events:
            return (end - start) / share
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / share


class StepMeter:
    """Times one step at a time on ``clock`` and, with a ``controller`` (``num_draft_tokens="auto"``; ``None``: a fixed
    γ), chooses what every row's request carries before the step (:attr:`choice`) and learns from the step after it."""

    def __init__(self, clock: StepClock, controller: DraftLengthController | None = None):
        self.clock, self.controller = clock, controller
        self._captured = self._in_draft = self._in_verify = 0.0
        self.choice: tuple = (None, None, None, None)  # the step's γ, budget, stop, copy rules (None: the drafter's)
        self._start = None
        self._draft_marks: list[tuple] = []
        self._verify_marks: tuple | None = None

    def begin(self) -> None:
        """Before drafting: what the controller chooses for this step's requests: γ, a tree's budget and, for one row
        whose chain stops on its confidence, the stop rule (once the cost curve is measured) and the copy rule."""
        self._draft_marks = []
        controller = self.controller
        if controller is not None:
            gamma, stops = controller.choose(), controller.confidence_stops
            stop = controller.keep_drafting if stops and controller.stops_this_step else None
            self.choice = (gamma, controller.budget(gamma), stop, controller.copy_length if stops else None)
        self._captured = captured_seconds()

    def start_drafting(self) -> None:
        """A row's drafting (or one batch proposal's) starts."""
        self._start = self.clock.mark()

    def drafted(self, rows: int = 0) -> None:
        """The drafting started last is done: one row's, or one batch proposal's for ``rows`` rows (each a share)."""
        end = self.clock.mark()
        self._draft_marks += [(self._start, end, rows)] * rows if rows else [(self._start, end)]
        self._in_draft = captured_seconds() - self._captured

    def verify(self, run, *args):
        """``run(*args)`` (the step's one target forward) between two marks; its result."""
        start = self.clock.mark()
        out = run(*args)
        self._verify_marks = (start, self.clock.mark())
        self._in_verify = captured_seconds() - self._captured - self._in_draft
        return out

    def seconds(self) -> tuple[list[float], float]:
        """Each row's drafting seconds and the verify forward's, without any compile's seconds."""
        rows = len(self._draft_marks)
        draft = [max(0.0, self.clock.seconds(*marks) - self._in_draft / rows) for marks in self._draft_marks]
        return draft, max(0.0, self.clock.seconds(*self._verify_marks) - self._in_verify)

    def learn(
        self, active: list[Row], trees: list[DraftTree], kept: list[list[int]], accepted: list[int], width: int
    ) -> None:
        """After accepting: the controller learns what each row accepted (and what a widened tree's chain alone would
        have), the chain's confidences, and what drafting and the forward over ``width`` tokens cost."""
        controller = self.controller
        if controller is None:
            return
        draft, forward = self.seconds()
        copied = [tree.copied for tree in trees]  # copies from the text (copy_from_context), not the model's draft
        if any(copied) and not all(copied):  # some rows copied: the drafting rows alone teach the model's rates
            rows = [a for a, c in enumerate(copied) if not c]
            active, trees, kept, accepted = ([seq[a] for a in rows] for seq in (active, trees, kept, accepted))
        widens = len(controller.widths) > 1 and all(row.traits.widens_chain for row in active)
        # what the chain alone would have accepted (a path cut at eos or max_length says nothing of the chain)
        on_chain = [chain_accepted(t, n) for t, n, c in zip(trees, kept, accepted) if len(n) - 1 == c] if widens else []
        confidences = None  # the drafted chain's tokens' probabilities (a tree's chain: judged by on_chain)
        if controller.confidence_stops and len(trees[0]) and (on_chain or not widens):
            drafted = active[0].generator.drafted_confidences(trees[0])
            confidences = None if drafted is None else [drafted]
        depth = max(tree.levels for tree in trees)  # the chain a tree's nodes hang on
        copied = all(copied)
        controller.observe(
            depth, accepted, sum(draft), forward, width, on_chain or None, None if copied else confidences, copied
        )
