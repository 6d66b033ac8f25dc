"""BENCHMARKS.md, its plots and the README's headline table, rendered from the committed JSON results (never typed by
hand). Run from the repository root::

    python -m benchmarks.report               # BENCHMARKS.md + benchmarks/plots/*.png from benchmarks/results/*.json,
                                              # and the README's headline table from benchmarks/demo/*.json
"""

from .headline import write_headline
from .plots import make_plots, save_figure
from .render import render, write_report

__all__ = ["make_plots", "render", "save_figure", "write_headline", "write_report"]
