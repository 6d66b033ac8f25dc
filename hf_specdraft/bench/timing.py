"""Timing a user can trust: medians of repeats (as ``torch.utils.benchmark`` and pyperf), spread, and a loud word
when the machine is busy: other processes' CPU use (``/proc/stat`` minus our own) beyond the cores our threads leave
free, or speedups that move between repeats where a method repeated its work exactly (docs/benchmarks.md). A timed
run that compiled timed the compiler: :func:`compile_counters` reads torch's counters, a renamed one as 0.
"""

from __future__ import annotations

import os
import statistics

import torch

BUSY_CORES = 0.25  # other processes took a quarter core more than our threads left free: they competed with us
NOISY_RANGE = 0.15  # a speedup that moves by more than 15 % between repeats cannot be quoted to two digits
# what a quiet VM's own daemons take (an idle 2-core Xeon VM: 0.1 core, its demo's speedups still moving by 18 %):
# below it, a moving speedup is the machine's own variation, and only an extreme one says the run is unreliable
QUIET_CORES = 0.15
EXTREME_RANGE = 0.35


def cpu_reading() -> tuple[int, int, int, float] | None:
    """(busy, total) jiffies of all CPUs since boot, the number of CPUs, and our own CPU seconds (user, system,
    children's user and system); None without /proc/stat. Two readings give :func:`other_cores`."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        fields = [int(v) for v in lines[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is counted in user)
    cpus = sum(line.startswith("cpu") and line[3:4].isdigit() for line in lines)
    return total - idle, total, cpus, sum(os.times()[:4])


def other_cores(start, end, ticks_per_second: int | None = None) -> tuple[float, int] | None:
    """(how many cores' worth of time went to other processes from reading ``start`` to ``end``, ``(busy − own) /
    total × cpus``, and the CPUs); None if not measurable."""
    if start is None or end is None:
        return None
    busy, total, _, own = (b - a for a, b in zip(start, end))
    others = (busy - own * (ticks_per_second or os.sysconf("SC_CLK_TCK"))) / total if total > 0 else 0.0
    return min(max(others, 0.0), 1.0) * end[2], end[2]


def relative_range(values: list[float]) -> float:
    """(max − min) / median of repeated timings; 0 for a single one."""
    median = statistics.median(values) if len(values) > 1 else 0.0
    return (max(values) - min(values)) / median if median else 0.0


def spread(values: list[float]) -> dict:
    """min, quartiles and max of per-prompt ratios."""
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"min": min(values), "q1": quartiles[0], "median": quartiles[1], "q3": quartiles[2], "max": max(values)}


def verdict(
    load: tuple[float, int] | None, threads: int, timing_noise: float | None, baseline_noise: float = 0.0
) -> dict:
    """Whether a run's ratios can be trusted, and why not. ``load``: :func:`other_cores`; ``timing_noise``:
    how far the speedups moved between repeats (None: no method repeated its work); ``baseline_noise``: how far
    target-only's own time moved. A speedup is a ratio of two such times, so noise counts beyond both
    :data:`NOISY_RANGE` and twice the baseline's, and on a quiet machine (:data:`QUIET_CORES`) only beyond
    :data:`EXTREME_RANGE`; without a ``timing_noise``, target-only's own time beyond :data:`NOISY_RANGE` is the sign."""
    warnings = []
    other, cpus = load if load is not None else (None, None)
    free = max(cpus - threads, 0) if cpus is not None else None
    if other is not None and other > free + BUSY_CORES:
        warnings.append(
            f"other processes used {other:.1f} of {cpus} CPU cores during the run while this one ran {threads} threads "
            f"({free} left free)"
        )
    threshold = max(NOISY_RANGE, 2 * baseline_noise)
    if other is not None and other <= free + QUIET_CORES:  # a quiet machine: its own variation, not a competitor
        threshold = max(threshold, EXTREME_RANGE)
    if timing_noise is not None and timing_noise > threshold:
        warnings.append(
            f"the speedups moved by {timing_noise:.0%} between repeats (median over methods, where they repeated "
            f"their work), more than {threshold:.0%} (target-only's own time moved by {baseline_noise:.0%})"
        )
    elif timing_noise is None and baseline_noise > NOISY_RANGE:
        warnings.append(
            f"target-only's own time moved by {baseline_noise:.0%} between repeats, more than {NOISY_RANGE:.0%} "
            "(no other method repeated its work exactly, so its speedups cannot tell noise apart)"
        )
    return {
        "other_cpu_cores": other,
        "cpu_cores": cpus,
        "threads": threads,
        "timing_noise": timing_noise,
        "baseline_noise": baseline_noise,
        "reliable": not warnings,
        "warnings": warnings,
    }


def warning_text(timing: dict) -> str:
    """The loud line a command prints above an unreliable table (empty when reliable)."""
    if timing["reliable"]:
        return ""
    reasons = "; ".join(timing["warnings"])
    return (
        f"WARNING: these speed ratios are unreliable: {reasons}. Close other programs (or wait for them) and run again."
    )


# --- what torch compiled between two moments -------------------------------------------------------------------------

# dynamo's graphs, frames, recompiles (told from its last 64 compilation metrics) and graph breaks, inductor's cudagraph
# skips, and the CUDA graphs recorded (seen by a compile callback)
COUNTERS = ("unique_graphs", "frames_compiled", "recompiles", "graph_breaks", "cudagraph_skips", "cudagraphs_recorded")
_RECORDED = [0]  # CUDA graphs recorded since the callback was registered


def _on_compile_start(args=None) -> None:
    if getattr(getattr(args, "callback_trigger", None), "name", None) == "CUDAGRAPH_RECORDING":
        _RECORDED[0] += 1


def compile_counters() -> dict:
    """One reading of the counters (see the module docstring); pass two to :func:`compiled_between`."""
    handler = getattr(torch._dynamo, "callback_handler", None)  # registered again after torch._dynamo.reset()
    if handler is not None and _on_compile_start not in getattr(handler, "start_callbacks", [_on_compile_start]):
        handler.register_start_callback(_on_compile_start)
    try:
        metrics = torch._dynamo.utils.get_compilation_metrics()
    except (AttributeError, RuntimeError):
        metrics = []
    counters = torch._dynamo.utils.counters
    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "frames_compiled": int(counters["frames"].get("total", 0)),
        # the kept compilation metrics that were recompiles (objects: a later reading tells new ones by identity)
        "recompiles": [m for m in metrics if getattr(m, "recompile_reason", None)],
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0)),
        "cudagraphs_recorded": _RECORDED[0],
    }


def compiled_between(before: dict, after: dict) -> dict[str, int]:
    """``{counter: increase}`` from reading ``before`` to ``after``, counters that stayed left out."""
    seen = {id(m) for m in before["recompiles"]}
    moved = {name: after[name] - before[name] for name in COUNTERS if name != "recompiles"}
    moved["recompiles"] = sum(id(m) not in seen for m in after["recompiles"])
    return {name: moved[name] for name in COUNTERS if moved[name] > 0}


# a timed run is invalid when any of these moved: it compiled a graph, or recorded a CUDA graph, inside its timing
COMPILING = ("unique_graphs", "frames_compiled", "recompiles", "cudagraphs_recorded")


def compiled(moved: dict[str, int]) -> bool:
    """Whether a window's counts (:func:`compiled_between`) show compiling or CUDA-graph recording."""
    return any(moved.get(name, 0) for name in COMPILING)
