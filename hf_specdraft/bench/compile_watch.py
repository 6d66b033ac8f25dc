"""What torch compiled between two moments: a timed run that compiled measured the compiler, not the method.

:func:`compile_counters` reads the process' counters (:data:`COUNTERS`: dynamo's graphs, frames, recompiles told from
its last 64 compilation metrics, graph breaks, inductor's cudagraph skips, and CUDA graphs recorded, seen by a compile
callback); :func:`compiled_between` keeps what moved between two readings. Every name is read with a default, so a
torch version that renames one reads 0 for it instead of failing.
"""

from __future__ import annotations

import torch

COUNTERS = ("unique_graphs", "frames_compiled", "recompiles", "graph_breaks", "cudagraph_skips", "cudagraphs_recorded")
_RECORDED = [0]  # CUDA graphs recorded since the callback was registered


def _on_compile_start(args=None) -> None:
    if getattr(getattr(args, "callback_trigger", None), "name", None) == "CUDAGRAPH_RECORDING":
        _RECORDED[0] += 1


def _watch_cudagraph_recordings() -> None:
    """Register :func:`_on_compile_start` with dynamo (again after ``torch._dynamo.reset()``)."""
    handler = getattr(torch._dynamo, "callback_handler", None)
    if handler is not None and _on_compile_start not in getattr(handler, "start_callbacks", [_on_compile_start]):
        handler.register_start_callback(_on_compile_start)


def _recompiles() -> list:
    """Dynamo's kept compilation metrics that were recompiles (objects: a later reading tells new ones by identity)."""
    try:
        metrics = torch._dynamo.utils.get_compilation_metrics()
    except (AttributeError, RuntimeError):
        return []
    return [m for m in metrics if getattr(m, "recompile_reason", None)]


def compile_counters() -> dict:
    """One reading of the counters (see the module docstring); pass two to :func:`compiled_between`."""
    _watch_cudagraph_recordings()
    counters = torch._dynamo.utils.counters
    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "frames_compiled": int(counters["frames"].get("total", 0)),
        "recompiles": _recompiles(),
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


def add_counts(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """``total`` with ``more``'s counts added (both as :func:`compiled_between` returns them)."""
    return {name: total.get(name, 0) + more.get(name, 0) for name in COUNTERS if total.get(name, 0) + more.get(name, 0)}


# a timed run is invalid when any of these moved: it compiled a graph, or recorded a CUDA graph, inside its timing
COMPILING = ("unique_graphs", "frames_compiled", "recompiles", "cudagraphs_recorded")


def compiled(moved: dict[str, int]) -> bool:
    """Whether a window's counts (:func:`compiled_between`) show compiling or CUDA-graph recording."""
    return any(moved.get(name, 0) for name in COMPILING)
