"""BENCHMARKS.md, its plots and the README's headline table, rendered from the committed JSON results (never typed by
hand). Run from the repository root::

    python -m benchmarks.report               # BENCHMARKS.md + benchmarks/plots/*.png from benchmarks/results/*.json,
                                              # and the README's headline table from benchmarks/demo/*.json,
                                              # its per-group table from benchmarks/demo/groups.json
"""

from .headline import groups_table, write_groups, write_headline
from .plots import make_plots, save_figure
from .render import render, write_report

__all__ = ["groups_table", "make_plots", "render", "save_figure", "write_groups", "write_headline", "write_report"]
