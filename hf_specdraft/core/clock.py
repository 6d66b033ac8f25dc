"""Timing a step's drafting and verification as the device sees them.

On a CPU a forward has run when the call returns, so ``time.perf_counter()`` around it is its cost. On CUDA the call
returns once its kernels are queued: a host clock measures the launches, and the forward's own time is paid later,
at the first read-back, outside the span. The controller would then see verification as nearly free and pick γ
wrong. :class:`StepClock` records CUDA events instead (no sync: they are read after the step's one read-back, by
when every event before it has completed); elsewhere it reads the host clock.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    """Marks on the device's timeline (CUDA events) or the host's (elsewhere).

    Args:
        device: where the forwards run.
    """

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
        """Seconds from ``start`` to ``end`` (divided by ``share``: a batch forward's rows). On CUDA, read after the work
        up to ``end`` is done (waits for it otherwise)."""
        if not self.events:
            return (end - start) / share
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / share
