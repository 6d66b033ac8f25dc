"""Timing discipline of the bench harness (hf_specdraft.bench.timing): medians, spread, busy-machine verdicts."""

from __future__ import annotations

import pytest

from hf_specdraft.bench import METHODS, BenchConfig
from hf_specdraft.bench.harness import format_table, speed_word, summarize
from hf_specdraft.bench.timing import (
    BUSY_CORES,
    EXTREME_RANGE,
    NOISY_RANGE,
    QUIET_CORES,
    cpu_reading,
    other_cores,
    relative_range,
    spread,
    verdict,
    warning_text,
)


def test_other_cores_subtracts_own_time():
    # 2 CPUs, 1 s: 200 jiffies in all, 190 busy, 1 s of them ours -> 0.9 of a core went to others
    start = (1000, 5000, 2, 3.0)
    assert other_cores(start, (1190, 5200, 2, 4.0), 100) == (pytest.approx(0.9), 2)
    assert other_cores(start, (1050, 5200, 2, 4.0), 100) == (0.0, 2)  # never negative (jiffy rounding)
    assert other_cores(start, start, 100) == (0.0, 2)
    assert other_cores(None, start) is None  # no /proc/stat


def test_verdict_flags_competition_for_our_cores_only():
    assert verdict((0.05, 2), threads=2, timing_noise=0.03)["reliable"]
    busy = verdict((0.95, 2), threads=2, timing_noise=0.03)
    assert not busy["reliable"] and "0.9 of 2 CPU cores" in busy["warnings"][0]
    assert verdict((0.95, 8), threads=2, timing_noise=0.03)["reliable"]  # 6 cores were free: no competition
    noisy = verdict(None, threads=2, timing_noise=0.4)
    assert not noisy["reliable"] and noisy["other_cpu_cores"] is None and "40%" in warning_text(noisy)
    assert warning_text(verdict(None, 2, 0.0)) == ""


def test_monitor_reads_this_machine():
    load = other_cores(cpu_reading(), cpu_reading())
    assert load is None or (load[0] >= 0 and load[1] >= 1)


def test_spread_and_range():
    assert relative_range([1.0]) == 0.0
    assert relative_range([1.0, 1.2, 1.1]) == pytest.approx(0.2 / 1.1)
    s = spread([0.8, 1.0, 1.2, 1.4])
    assert s["min"] == 0.8 and s["max"] == 1.4 and s["q1"] <= s["median"] <= s["q3"]


def _record(method, prompt, repeat, seconds, tokens=(1, 2, 3)):
    record = {
        "method": method,
        "prompt": prompt,
        "repeat": repeat,
        "seconds": seconds,
        "new_tokens": len(tokens),
        "target_calls": 3,
    }
    return record if repeat else {**record, "tokens": list(tokens), "edit_similarity": 1.0}


def test_summary_uses_the_median_of_repeats_and_reports_the_spread():
    records = []
    for prompt, (base, fast) in enumerate([((1.0, 1.0, 9.0), (0.5, 0.5, 0.5)), ((2.0, 2.0, 2.0), (4.0, 4.0, 0.1))]):
        for repeat in range(3):  # one outlier per prompt: the median ignores it
            records += [
                _record("target-only", prompt, repeat, base[repeat]),
                _record("m", prompt, repeat, fast[repeat]),
            ]
    summary = summarize(records, ("target-only", "m"))
    assert summary["m"]["repeats"] == 3 and summary["m"]["prompts"] == 2
    assert summary["m"]["speedup_vs_target_only"] == pytest.approx((1.0 + 2.0) / (0.5 + 4.0))
    assert summary["m"]["speedup_spread"]["min"] == pytest.approx(0.5) and summary["m"]["speedup_spread"][
        "max"
    ] == pytest.approx(2.0)
    assert summary["m"]["tokens_per_second"] == pytest.approx(6 / 4.5)
    table = format_table(summary, {**verdict((1.0, 2), 2, 0.0), "repeats": 3})
    assert (
        table.startswith("WARNING: these speed ratios are unreliable")
        and "0.50-2.00" in table
        and "slowdown 1.50x" in table
    )


def test_summary_adds_the_ratio_against_the_fast_baseline_when_it_ran():
    records = []
    for prompt, (base, fast, m) in enumerate([(2.0, 1.0, 0.5), (4.0, 3.0, 1.5)]):
        records += [
            _record("target-only", prompt, 0, base),
            _record("target-only+linears", prompt, 0, fast),
            _record("m", prompt, 0, m),
        ]
    summary = summarize(records, ("target-only", "target-only+linears", "m"))
    assert summary["m"]["speedup_vs_target_only"] == pytest.approx(6.0 / 2.0)
    assert summary["m"]["speedup_vs_target_only_linears"] == pytest.approx(4.0 / 2.0)
    assert summary["target-only+linears"]["speedup_vs_target_only_linears"] == pytest.approx(1.0)
    assert "speedup_vs_target_only_linears" not in summarize(records[:1] + records[2:3], ("target-only", "m"))["m"]
    table = format_table(summary).splitlines()
    # m's row: 3x against plain target-only, 2x against the fast one
    assert "vs +linears" in table[0] and "2.00x" in table[-1]
    assert "vs +linears" not in format_table(summarize(records[:1] + records[2:3], ("target-only", "m")))


def test_speed_words():
    assert speed_word(1.3) == "1.30x faster" and speed_word(0.5) == "slowdown 2.00x" and speed_word(1.0) == "same speed"


@pytest.mark.parametrize(
    "field, value", [("repeats", 0), ("num_prompts", 0), ("max_new_tokens", 0), ("repeats", 1.5), ("warmup", -1)]
)
def test_zero_is_not_unset(field, value):
    with pytest.raises(ValueError, match=field):
        BenchConfig(**{field: value})


def test_noise_is_judged_against_what_the_baseline_itself_shows():
    """A few short prompts move by 15 % and more on a quiet machine; only a spread beyond twice the
    baseline's own (and beyond NOISY_RANGE) says 'unreliable'."""
    assert verdict(None, 2, timing_noise=0.20, baseline_noise=0.12)["reliable"]  # within 2 x 12 %
    noisy = verdict(None, 2, timing_noise=0.30, baseline_noise=0.12)
    assert not noisy["reliable"] and "more than 24%" in noisy["warnings"][0] and noisy["baseline_noise"] == 0.12
    assert not verdict(None, 2, timing_noise=0.20, baseline_noise=0.0)["reliable"]  # a steady baseline: 15 % is the bar


def test_demo_legend_lines_up_long_names():
    from hf_specdraft.cli import legend

    text = legend({"target-only": "plain", "cascade-1draft-tuned": "a cascade " * 20})
    lines = text.splitlines()
    methods = lines[lines.index("methods:") + 1 :]
    column = 2 + len("cascade-1draft-tuned") + 2  # every description starts past the longest name
    assert methods[0] == "  target-only" + " " * (column - 2 - len("target-only")) + "plain"
    assert methods[1].startswith("  cascade-1draft-tuned  a cascade") and len(methods) > 2
    # wrapped lines hang under it
    assert all(line[:column].strip() == "" and line[column] != " " for line in methods[2:])
    assert all(len(line) <= 100 for line in lines)


def test_work_that_changed_between_repeats_is_not_noise():
    """An adaptive method that drafts otherwise in another repeat (other target forwards) moves its time for
    a reason that is not noise; on an idle machine (target-only steady) that alone must not say 'unreliable'."""
    from hf_specdraft.bench.harness import _repeat_speedups, run_noise, same_work_prompts

    records = []
    for prompt in range(2):
        for repeat, (seconds, calls) in enumerate([(0.5, 16), (0.7, 13), (0.6, 14)]):  # the controller chose otherwise
            records += [
                _record("target-only", prompt, repeat, 1.0),
                {**_record("auto", prompt, repeat, seconds), "target_calls": calls},
            ]
    summary = summarize(records, ("target-only", "auto"))
    assert same_work_prompts([r for r in records if r["method"] == "auto"]) == set()
    assert summary["auto"]["prompts_with_varying_work"] == 2 and summary["auto"]["timing_noise"] is None
    auto, base = ([r for r in records if r["method"] == m] for m in ("auto", "target-only"))
    assert relative_range(_repeat_speedups(auto, base, {0, 1})) > 0.3  # what the old rule called noise
    assert run_noise(summary) is None and verdict(None, 2, run_noise(summary), baseline_noise=0.0)["reliable"]
    # the same times with the same work in every repeat: that is the clock moving, and it is flagged
    steady = [{**r, "target_calls": 3} for r in records]
    noisy = summarize(steady, ("target-only", "auto"))
    assert noisy["auto"]["prompts_with_varying_work"] == 0 and noisy["auto"]["timing_noise"] == pytest.approx(
        (2 - 1 / 0.7) / (1 / 0.6)
    )
    assert not verdict(None, 2, run_noise(noisy), baseline_noise=0.0)["reliable"]


def test_only_prompts_with_the_same_work_count_towards_the_noise():
    records = []
    for repeat in range(3):
        records += [
            _record("target-only", 0, repeat, 1.0),
            _record("target-only", 1, repeat, 1.0),
            _record("auto", 0, repeat, (0.5, 0.5, 0.5)[repeat]),  # same work, steady time
            {**_record("auto", 1, repeat, (0.2, 0.9, 0.5)[repeat]), "target_calls": 2 + repeat},
        ]  # work changed
    summary = summarize(records, ("target-only", "auto"))
    assert summary["auto"]["timing_noise"] == 0.0  # prompt 0's speedup was 2.0 in every repeat
    assert summary["auto"]["prompts_with_varying_work"] == 1


def test_without_a_method_that_repeated_its_work_the_baseline_is_the_measure():
    assert verdict(None, 2, timing_noise=None, baseline_noise=0.05)["reliable"]
    noisy = verdict(None, 2, timing_noise=None, baseline_noise=0.25)
    assert not noisy["reliable"] and "target-only's own time moved by 25%" in noisy["warnings"][0]
    assert "no method repeated its work" in format_table({}, {**noisy, "repeats": 3})


def test_a_timed_run_that_compiled_marks_its_row_invalid(tmp_path):
    from benchmarks.report.render import bench_section, timing_line

    records = []
    for repeat in range(2):
        records += [
            _record("target-only", 0, repeat, 1.0),
            {**_record("m", 0, repeat, 0.5), "compiles": {}},
            {**_record("c", 0, repeat, 0.5), "compiles": {"unique_graphs": 2, "recompiles": 1} if repeat else {}},
        ]
    summary = summarize(records, ("target-only", "m", "c"))
    assert summary["m"]["valid"] and summary["target-only"]["valid"]
    assert not summary["c"]["valid"] and summary["c"]["timed_runs_compiled"] == 1
    assert summary["c"]["compiled_while_timed"] == {"unique_graphs": 2, "recompiles": 1}
    timing = {**verdict(None, 2, 0.0), "repeats": 2, "warmup_prompts": 1, "invalid_methods": ["c"]}
    table = format_table(summary, timing)
    assert "INVALID: compiled" in table and "c compiled in 1 of its timed runs (2 unique_graphs, 1 recompiles)" in table
    result = {
        "meta": {
            "hardware": "CPU",
            "dtype": "float32",
            "batch_size": 1,
            "task": "completion",
            "num_prompts": 1,
            "max_new_tokens": 8,
            "seed": 0,
            "versions": {"torch": "t", "transformers": "t"},
            "target_parameters": 1e6,
        },
        "summary": summary,
        "timing": timing,
    }
    section = bench_section("run", result)
    assert (
        "| c **(invalid: compiled while timed)** |" in section
        and "| m |" in section
        and "**Invalid: c compiled" in timing_line(timing)
    )


def test_compile_counters_see_a_graph_and_a_recompile():
    import torch

    from hf_specdraft.bench.timing import compile_counters, compiled, compiled_between

    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    before = compile_counters()
    double(torch.ones(3))
    double(torch.ones(5))  # another shape: a recompile
    moved = compiled_between(before, compile_counters())
    assert moved["unique_graphs"] == 2 and moved["recompiles"] == 1 and compiled(moved)
    again = compile_counters()
    double(torch.ones(5))
    assert compiled_between(again, compile_counters()) == {}


def test_the_warm_up_runs_the_longest_prompts_at_the_timed_length(monkeypatch):
    """Static caches are sized by the prompt + max_new_tokens + the widest bucket, so the untimed warm-up
    runs every method on the longest prompts at the timed length: no timed run needs a bigger cache (or new graphs)."""
    from types import SimpleNamespace

    import torch

    from benchmarks import methods  # noqa: F401  (the lab's -compiled rows)
    from hf_specdraft.bench import harness

    seen = []

    def fake_run_one(method, ctx, counter):
        seen.append((method, ctx.prompt_ids.shape[1], ctx.max_new_tokens))
        return {"seconds": 0.5, "compiles": {"unique_graphs": 1} if method == "max-gram-auto-compiled" else {}}

    monkeypatch.setattr(harness, "run_one", fake_run_one)
    contexts = [
        SimpleNamespace(prompt_ids=torch.zeros(1, n, dtype=torch.long), max_new_tokens=64) for n in (30, 200, 90)
    ]
    config = BenchConfig(methods=("target-only", "max-gram-auto-compiled"), max_new_tokens=64, warmup=2)
    warm = harness.warm_up(contexts, config, counter=None)
    assert seen == [
        ("target-only", 200, 64),
        ("max-gram-auto-compiled", 200, 64),
        ("target-only", 90, 64),
        ("max-gram-auto-compiled", 90, 64),
    ]
    assert warm["warmup_prompt_tokens"] == [200, 90] and warm["warmup_max_new_tokens"] == 64
    assert warm["warmup_compiles"] == {"target-only": {}, "max-gram-auto-compiled": {"unique_graphs": 2}}
    assert warm["warmup_seconds"] == {"target-only": 1.0, "max-gram-auto-compiled": 1.0}  # both prompts' runs
    assert harness.warm_up(contexts, BenchConfig(methods=("target-only",), warmup=0), None)["warmup_prompts"] == 0


@pytest.mark.slow  # ~60 s: dynamo traces the tiny target's buckets (eager backend), twice
def test_after_the_warm_up_no_timed_run_compiles_and_every_controller_resumed(tiny_default, monkeypatch):
    """End to end on the tiny default: prompts of 169, 92 and 207 tokens at 24 new tokens need a 512-column
    cache (the old warm-up, 8 tokens on the first prompt, sized 256: 169 + 8 + 64 columns), a compiled static method
    whose γ controller the warm-up primes. Without a warm-up the first timed runs compile, and the row says so."""
    from transformers import CompileConfig

    from benchmarks import methods  # the lab's -compiled rows
    from hf_specdraft.bench import run_bench
    from hf_specdraft.defaults import load_default

    def eager_everywhere():
        config = CompileConfig(backend="eager")  # dynamo's graphs without inductor's minutes on a CPU
        config._compile_all_devices = True
        return config

    monkeypatch.setattr(methods, "compile_everywhere", eager_everywhere)
    bundle = load_default(tiny_default[0])
    chosen = ("target-only", "max-gram-auto-compiled")
    result = run_bench(
        bundle, BenchConfig(methods=chosen, num_prompts=3, max_new_tokens=24, warmup=1, repeats=2), warn=False
    )
    assert result["timing"]["warmup_compiles"]["max-gram-auto-compiled"]["unique_graphs"] >= 1
    assert result["timing"]["invalid_methods"] == [] and all(s["valid"] for s in result["summary"].values())
    assert result["summary"]["max-gram-auto-compiled"]["controller_resumed"] == 1.0
    assert result["summary"]["max-gram-auto-compiled"]["equals_target_only"] == 1.0
    import torch

    torch._dynamo.reset()  # a fresh process' state: nothing compiled yet
    cold = run_bench(
        bundle, BenchConfig(methods=chosen, num_prompts=1, max_new_tokens=24, warmup=0, repeats=1), warn=False
    )
    assert cold["timing"]["invalid_methods"] == ["max-gram-auto-compiled"]


@pytest.mark.slow  # ~20 s: the loop's first call in a process calibrates its linears and the controller's curve
def test_the_demo_s_warm_up_primes_the_controller(tiny_default):
    """The γ controller remembers per process what a call learned; the demo's warm-up (the longest prompt at
    the timed length) leaves it primed, so even the first timed run starts from a learned state."""
    from hf_specdraft.bench import run_bench
    from hf_specdraft.cli import DEMO_METHODS
    from hf_specdraft.core.controller_store import forget
    from hf_specdraft.defaults import load_default

    bundle = load_default(tiny_default[0])
    forget(bundle.target)  # nothing learned by earlier tests
    auto = [
        m
        for m in DEMO_METHODS["completion"]
        if m.endswith("-auto") and METHODS[m].available(bundle.extras, bundle.draft is not None)
    ]
    auto = auto[:1]  # the demo's first default call (GLIDE's): one is enough to see the warm-up's effect
    assert auto
    result = run_bench(
        bundle,
        BenchConfig(methods=("target-only", *auto), num_prompts=2, max_new_tokens=8, warmup=1, repeats=2),
        warn=False,
    )
    assert all(result["summary"][m]["controller_resumed"] == 1.0 for m in auto), {
        m: result["summary"][m]["controller_resumed"] for m in auto
    }


@pytest.mark.parametrize("cpus, threads", [(2, 2), (8, 2), (4, 1)])
@pytest.mark.parametrize(
    "baseline_noise", [0.0, 0.05, EXTREME_RANGE / 2 + 0.05], ids=["steady", "moving", "past-half-extreme"]
)
def test_a_quiet_machine_s_own_variation_is_no_warning(cpus, threads, baseline_noise):
    """The demo's rule, from its definition: the speedups' spread warns past max(NOISY_RANGE, 2 x the baseline's
    spread); on a quiet machine (other processes within QUIET_CORES of the cores this one left free) only past
    EXTREME_RANGE as well; a competitor (past BUSY_CORES) warns however steady the clock. Each boundary is probed just
    below and just above."""
    eps = 0.01
    free = cpus - threads
    loose = max(NOISY_RANGE, 2 * baseline_noise)  # the bar where the load is unknown or the machine not quiet
    quiet_bar = max(loose, EXTREME_RANGE)
    assert EXTREME_RANGE > NOISY_RANGE and QUIET_CORES < BUSY_CORES  # a quiet machine is given more room, not less

    def reliable(other, noise):
        load = None if other is None else (other, cpus)
        return verdict(load, threads, timing_noise=noise, baseline_noise=baseline_noise)["reliable"]

    for quiet in (0.0, free + QUIET_CORES):  # idle, and at the quiet limit
        assert reliable(quiet, quiet_bar - eps), (quiet, quiet_bar)
        assert not reliable(quiet, quiet_bar + eps), (quiet, quiet_bar)
        warning = verdict((quiet, cpus), threads, timing_noise=quiet_bar + eps, baseline_noise=baseline_noise)[
            "warnings"
        ]
        assert len(warning) == 1 and f"more than {quiet_bar:.0%}" in warning[0]
    some_load = free + (QUIET_CORES + BUSY_CORES) / 2  # not quiet, not a competitor: the plain noise bar
    for other in (some_load, None):  # and where the load is unknown (no /proc/stat)
        assert reliable(other, loose - eps) and not reliable(other, loose + eps), (other, loose)
    competitor = free + BUSY_CORES + eps
    assert not reliable(competitor, 0.0) and reliable(free + BUSY_CORES, 0.0)
