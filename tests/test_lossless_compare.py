"""benchmarks.studies.lossless: a greedy output against target-only greedy, a bf16 near tie told from a lost token."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from benchmarks.studies.lossless import compare_greedy


class FixedLogits:
    """A stand-in target whose next-token logits are always ``logits`` (read by compare_greedy where outputs part)."""

    def __init__(self, logits, dtype=torch.bfloat16):
        self.logits, self.dtype = torch.tensor(logits), dtype

    def __call__(self, ids):
        return SimpleNamespace(logits=self.logits.expand(1, ids.shape[1], -1))


def test_identical_outputs():
    ids = torch.tensor([[5, 6, 7, 8]])
    assert compare_greedy(FixedLogits([0.0, 1.0]), 2, ids, ids.clone()) == {"identical": True}


def test_a_near_tie_resolved_the_other_way_is_told_from_a_lost_token():
    reference, other = torch.tensor([[5, 6, 1, 3]]), torch.tensor([[5, 6, 2, 3]])
    tie = compare_greedy(FixedLogits([0.0, 8.0, 8.0 - 1 / 64]), 2, reference, other)  # within a bf16 step or two of 8
    assert not tie["identical"] and tie["first_difference"] == 0 and tie["near_tie"]
    lost = compare_greedy(FixedLogits([0.0, 8.0, 6.0]), 2, reference, other)
    assert not lost["near_tie"] and lost["top2_gap"] == 2.0
    # not a top-two
    assert not compare_greedy(FixedLogits([0.0, 8.0, 8.0, 0.0]), 2, reference, torch.tensor([[5, 6, 3, 3]]))["near_tie"]
    shorter = compare_greedy(FixedLogits([0.0, 8.0, 7.0]), 2, reference, reference[:, :3])
    assert not shorter["identical"] and shorter["first_difference"] == 1 and not shorter["near_tie"]
