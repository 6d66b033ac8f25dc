"""Freed host memory handed back between calls (hf_specdraft/core/memory.py)."""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft import speculative_generate
from hf_specdraft.core import memory


class FakeLibc:
    """glibc's malloc_trim, counted; it gives back ``gives`` MiB of the fake resident size."""

    def __init__(self, resident: list[float], gives: float):
        self.resident, self.gives, self.trims = resident, gives, 0

    def malloc_trim(self, pad: int) -> int:
        self.trims += 1
        self.resident[0] -= self.gives
        return 1


@pytest.fixture
def fake_process(monkeypatch):
    resident = [1000.0]
    libc = FakeLibc(resident, gives=30.0)
    monkeypatch.setattr(memory, "_libc", libc)
    monkeypatch.setattr(memory, "_floor", None)
    monkeypatch.setattr(memory, "resident_mib", lambda: resident[0])
    monkeypatch.delenv("HF_SPECDRAFT_TRIM_MIB", raising=False)
    return resident, libc


def test_a_trim_runs_once_the_process_grew_past_its_floor(fake_process):
    resident, libc = fake_process
    assert memory.after_call() is None and memory._floor == 1000.0  # the first call sets the floor, its working set included
    for grown in (10.0, 31.0):  # below the threshold: nothing
        resident[0] = 1000.0 + grown
        assert memory.after_call() is None and libc.trims == 0
    resident[0] = 1000.0 + memory.TRIM_MIB + 1
    assert memory.after_call() == pytest.approx(30.0) and libc.trims == 1
    assert memory._floor == pytest.approx(1003.0)  # the trim could not get under the floor: the rest is live
    libc.gives = 60.0
    resident[0] = 1040.0
    assert memory.after_call() == pytest.approx(60.0) and resident[0] == 980.0 and memory._floor == pytest.approx(1003.0)
    resident[0] = 1010.0  # the next call takes back the pages the trim gave: within the threshold of the floor, no trim
    assert memory.after_call() is None and libc.trims == 2
    resident[0] = 900.0  # the process shrank (a model freed): growth counts from there
    assert memory.after_call() is None and memory._floor == 900.0


def test_the_threshold_is_set_by_environment(fake_process, monkeypatch):
    resident, libc = fake_process
    monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", "0")  # never
    memory.after_call()
    resident[0] += 500
    assert memory.after_call() is None and libc.trims == 0
    monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", "5")
    memory.after_call()
    resident[0] += 6
    assert memory.after_call() is not None and libc.trims == 1
    for wrong in ("lots", "-1"):
        monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", wrong)
        with pytest.raises(ValueError, match="HF_SPECDRAFT_TRIM_MIB"):
            memory.after_call()


def test_nothing_happens_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_libc", False)
    assert memory.release_freed_memory() is None and memory.after_call() is None


def test_a_call_reports_what_its_end_gave_back(monkeypatch):
    """On this Linux machine: with a threshold below any growth every call's end trims, says so in its statistics, and
    the output is still the target's own."""
    if memory._glibc() is None or memory.resident_mib() is None:
        pytest.skip("no glibc or /proc here")
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    reference = greedy_reference(target, x, 12)
    monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", "1e-9")
    monkeypatch.setattr(memory, "_floor", 0.0)
    out = speculative_generate(target, x, candidate_generator=OracleDrafter(reference), max_new_tokens=12, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference) and out.speculative_stats.extra["released_mib"] >= 0.0
    assert memory.release_freed_memory() >= 0.0
