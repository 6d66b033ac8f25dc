"""Freed host memory handed back between calls, on request (hf_specdraft/core/memory.py): off by default, set by
``HF_SPECDRAFT_TRIM_MIB`` checked before a call starts, and run outside every lock another thread waits on."""

from __future__ import annotations

import ctypes.util
import threading

import pytest
import torch

from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft import speculative_generate
from hf_specdraft.core import memory
from hf_specdraft.core.static_layout import static_lock


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
    monkeypatch.setattr(memory, "_glibc", lambda: libc)
    monkeypatch.setattr(memory, "_floor", None)
    monkeypatch.setattr(memory, "resident_mib", lambda: resident[0])
    monkeypatch.delenv("HF_SPECDRAFT_TRIM_MIB", raising=False)
    return resident, libc


def test_a_trim_runs_once_the_process_grew_past_its_floor(fake_process):
    resident, libc = fake_process
    after_call = lambda: memory.after_call(memory.TRIM_MIB)  # noqa: E731
    assert after_call() is None and memory._floor == 1000.0  # the first call sets the floor, its working set included
    for grown in (10.0, 31.0):  # below the threshold: nothing
        resident[0] = 1000.0 + grown
        assert after_call() is None and libc.trims == 0
    resident[0] = 1000.0 + memory.TRIM_MIB + 1
    assert after_call() == pytest.approx(30.0) and libc.trims == 1
    assert memory._floor == pytest.approx(1003.0)  # the trim could not get under the floor: the rest is live
    libc.gives = 60.0
    resident[0] = 1040.0
    assert after_call() == pytest.approx(60.0) and resident[0] == 980.0 and memory._floor == pytest.approx(1003.0)
    resident[0] = 1010.0  # the next call takes back the pages the trim gave: within the threshold of the floor, no trim
    assert after_call() is None and libc.trims == 2
    resident[0] = 900.0  # the process shrank (a model freed): growth counts from there
    assert after_call() is None and memory._floor == 900.0


def test_the_threshold_is_set_by_environment(fake_process, monkeypatch):
    resident, libc = fake_process
    assert memory.trim_threshold_mib() is None  # unset: never trims
    for off in ("", "0", "0.0"):
        monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", off)
        assert memory.trim_threshold_mib() is None
    memory.after_call(None)
    resident[0] += 500
    assert memory.after_call(None) is None and libc.trims == 0 and memory._floor is None  # off: nothing is even read
    monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", "5")
    assert memory.trim_threshold_mib() == 5.0
    memory.after_call(5.0)
    resident[0] += 6
    assert memory.after_call(5.0) is not None and libc.trims == 1
    for wrong in ("lots", "-1", "nan", "inf"):
        monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", wrong)
        with pytest.raises(ValueError, match=r"HF_SPECDRAFT_TRIM_MIB must be unset, 0 .* or a positive number of MiB"):
            memory.trim_threshold_mib()


def test_nothing_happens_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_glibc", lambda: None)
    assert memory.release_freed_memory() is None and memory.after_call(memory.TRIM_MIB) is None


def test_glibc_is_found_without_a_search(monkeypatch):
    """The C library already loaded (``CDLL(None)``), not ``ctypes.util.find_library``, which starts a subprocess."""
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: pytest.fail("find_library searched for a library"))
    memory._glibc.__wrapped__()


def calls_with_a_forward_counter(target):
    forwards = []
    target.register_forward_pre_hook(lambda module, args: forwards.append(1))
    return forwards


def test_a_call_trims_nothing_by_default(monkeypatch):
    """Unset, the heap is left alone: no trim, not even a read of the resident size."""
    monkeypatch.delenv("HF_SPECDRAFT_TRIM_MIB", raising=False)
    monkeypatch.setattr(memory, "_glibc", lambda: FakeLibc([1000.0], gives=30.0))
    monkeypatch.setattr(memory, "_floor", 0.0)
    monkeypatch.setattr(memory, "resident_mib", lambda: pytest.fail("the resident size was read"))
    monkeypatch.setattr(memory, "_trim", lambda libc: pytest.fail("the heap was trimmed"))
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    reference = greedy_reference(target, x, 8)
    out = speculative_generate(
        target, x, candidate_generator=OracleDrafter(reference), max_new_tokens=8, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, reference) and "released_mib" not in out.speculative_stats.extra


@pytest.mark.parametrize("wrong", ["lots", "-1"])
def test_a_malformed_setting_fails_before_any_forward(monkeypatch, wrong):
    """The setting is checked when the call starts, so a wrong value loses no generated output."""
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    reference = greedy_reference(target, x, 8)
    forwards = calls_with_a_forward_counter(target)
    monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", wrong)
    with pytest.raises(ValueError, match="HF_SPECDRAFT_TRIM_MIB"):
        speculative_generate(target, x, candidate_generator=OracleDrafter(reference), max_new_tokens=8)
    assert not forwards


def held_elsewhere(lock) -> bool:
    """Whether ``lock`` is held (by this thread or another): another thread cannot take it at once."""
    taken = []

    def probe():
        taken.append(lock.acquire(blocking=False))
        if taken[0]:
            lock.release()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return not taken[0]


@pytest.mark.parametrize("cache", [None, "static"])
def test_the_trim_runs_outside_every_lock(monkeypatch, cache):
    """Opted in, the trim runs after the call released the target's static caches, and outside the module's own lock:
    a concurrent call never waits for ``malloc_trim``."""
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    reference = greedy_reference(target, x, 8)
    held = []

    class LockCheckingLibc:
        def malloc_trim(self, pad: int) -> int:
            held.append((held_elsewhere(static_lock(target)), held_elsewhere(memory._lock)))
            return 1

    monkeypatch.setenv("HF_SPECDRAFT_TRIM_MIB", "1e-9")
    monkeypatch.setattr(memory, "_glibc", lambda: LockCheckingLibc())
    monkeypatch.setattr(memory, "_floor", 0.0)
    monkeypatch.setattr(memory, "resident_mib", lambda: 100.0)
    kwargs = {} if cache is None else {"cache_implementation": cache}
    out = speculative_generate(target, x, candidate_generator=OracleDrafter(reference), max_new_tokens=8, **kwargs)
    assert torch.equal(out, reference)
    assert held == [(False, False)], "malloc_trim ran while the static caches' or the memory module's lock was held"


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
    out = speculative_generate(
        target, x, candidate_generator=OracleDrafter(reference), max_new_tokens=12, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, reference) and out.speculative_stats.extra["released_mib"] >= 0.0
    assert memory.release_freed_memory() >= 0.0
