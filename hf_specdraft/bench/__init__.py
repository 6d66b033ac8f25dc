"""Benchmark harness: methods side by side on the embedded default's held-out tasks."""

from .harness import PROFILES, BenchConfig, format_table, run_bench
from .methods import METHODS, BenchContext, Method, register_method

__all__ = [
    "METHODS",
    "PROFILES",
    "BenchConfig",
    "BenchContext",
    "Method",
    "format_table",
    "register_method",
    "run_bench",
]
