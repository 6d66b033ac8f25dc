"""Plots for BENCHMARKS.md, drawn from the bench JSON files (never from numbers typed by hand).

    # writes benchmarks/plots/<result>-{speedup,acceptance,expansion}.png, then BENCHMARKS.md
    python -m benchmarks.report

For each result file of ``hf-specdraft bench``:

- ``<name>-speedup.png``: wall-time speedup of every method against target-only decoding in the same run;
- ``<name>-acceptance.png``: acceptance by draft position (entry i: of the steps that drafted at least i tokens
  deep, the fraction that accepted at least i), averaged over prompts, for the methods that report statistics;
- ``<name>-expansion.png``: the distribution of CAPE's expansion-set sizes K over every step and drafted position
  (Du et al. 2024, §4.2), for the methods whose records carry ``stats.extra.expansion_sizes``.

Figures are drawn with matplotlib's Agg canvas on ``Figure`` objects, so no pyplot state or display is touched.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

PLOT_KINDS = ("speedup", "acceptance", "expansion")  # file suffixes, in the order the report shows them


def save_figure(figure, path: Path, title: str, fontsize: int = 10) -> Path:
    """Title ``figure`` (a pyplot figure), lay it out, write it to ``path`` (folders made) at 120 dpi and close it."""
    import matplotlib.pyplot as plt

    figure.suptitle(title, fontsize=fontsize)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def load_results(results_dir: str | Path) -> dict[str, dict]:
    """The bench results in ``results_dir`` (JSON files with ``meta``, ``summary`` and ``records``), by file stem."""
    results = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and {"meta", "summary", "records"} <= set(data):  # skips e.g. overhead-cpu.json
            results[path.stem] = data
    return results


def acceptance_by_position(result: dict) -> dict[str, list[float]]:
    """Per method with statistics: the mean over prompts of ``acceptance_by_position`` at each draft position."""
    per_method: dict[str, list[list[float]]] = {}
    for record in result["records"]:
        rates = record.get("stats", {}).get("acceptance_by_position")
        if rates:
            per_method.setdefault(record["method"], []).append(rates)
    curves = {}
    for method, runs in per_method.items():
        depth = max(len(r) for r in runs)
        curves[method] = [sum(r[i] for r in runs if len(r) > i) / sum(len(r) > i for r in runs) for i in range(depth)]
    return curves


def expansion_size_counts(result: dict) -> dict[str, Counter]:
    """Per CAPE-style method: how often each expansion-set size K occurred, over all steps and drafted positions."""
    counts: dict[str, Counter] = {}
    for record in result["records"]:
        steps = record.get("stats", {}).get("extra", {}).get("expansion_sizes")
        if steps is not None:
            counts.setdefault(record["method"], Counter()).update(k for step in steps for k in step)
    return {method: c for method, c in counts.items() if c}


def _figure(width: float = 7.0, height: float = 4.0):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("plots need matplotlib: pip install 'hf-specdraft[bench]'") from error
    figure = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _subtitle(result: dict) -> str:
    meta = result["meta"]
    return (
        f"{meta['hardware']}, {meta['dtype']}, task {meta['task']}, {meta['num_prompts']} prompts x "
        f"{meta['max_new_tokens']} tokens"
    )


def plot_speedup(result: dict, path: Path) -> Path:
    """Bar chart of ``speedup_vs_target_only`` per method (1.0 = target-only decoding)."""
    methods = list(result["summary"])
    speedups = [result["summary"][m]["speedup_vs_target_only"] for m in methods]
    figure = _figure(max(6.0, 0.6 * len(methods) + 2), 4.0)
    ax = figure.add_subplot()
    bars = ax.bar(methods, speedups, color=["0.6" if m == "target-only" else "C0" for m in methods])
    ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.axhline(1.0, color="k", linewidth=0.8, linestyle="--")
    ax.set_ylabel("speedup vs target-only (wall time)")
    ax.set_title(f"Speedup per method\n{_subtitle(result)}", fontsize=9)
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    figure.savefig(path)
    return path


def plot_acceptance_by_position(result: dict, path: Path) -> Path | None:
    """Lines of acceptance rate against draft position, one per method; `None` when no method has statistics."""
    curves = acceptance_by_position(result)
    if not curves:
        return None
    figure = _figure()
    ax = figure.add_subplot()
    for method, rates in curves.items():
        ax.plot(range(1, len(rates) + 1), rates, marker="o", markersize=3, label=method)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (mean over prompts)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"Acceptance by draft position\n{_subtitle(result)}", fontsize=9)
    ax.legend(fontsize=7, ncols=2)
    figure.savefig(path)
    return path


def plot_expansion_sizes(result: dict, path: Path) -> Path | None:
    """Histogram of CAPE's expansion-set sizes K (fraction of drafted positions); `None` when no method records them."""
    counts = expansion_size_counts(result)
    if not counts:
        return None
    sizes = sorted(set().union(*counts.values()))
    width = 0.8 / len(counts)
    figure = _figure()
    ax = figure.add_subplot()
    for i, (method, c) in enumerate(counts.items()):
        total = sum(c.values())
        ax.bar(
            [s + (i - (len(counts) - 1) / 2) * width for s in sizes],
            [c[s] / total for s in sizes],
            width=width,
            label=method,
        )
    ax.set_xticks(sizes)
    ax.set_xlabel("expansion-set size K at a drafted position")
    ax.set_ylabel("fraction of drafted positions")
    ax.set_title(f"CAPE expansion-set sizes\n{_subtitle(result)}", fontsize=9)
    ax.legend(fontsize=7)
    figure.savefig(path)
    return path


def plot_paths(name: str, out_dir: str | Path) -> dict[str, Path]:
    """Where :func:`make_plots` writes the plots of result ``name``, by kind."""
    return {kind: Path(out_dir) / f"{name}-{kind}.png" for kind in PLOT_KINDS}


def make_plots(results_dir: str | Path = "benchmarks/results", out_dir: str | Path = "benchmarks/plots") -> list[Path]:
    """Draw every plot the results in ``results_dir`` support into ``out_dir``; returns the files written."""
    drawers = {"speedup": plot_speedup, "acceptance": plot_acceptance_by_position, "expansion": plot_expansion_sizes}
    written = []
    for name, result in load_results(results_dir).items():
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for kind, path in plot_paths(name, out_dir).items():
            if drawers[kind](result, path) is not None:
                written.append(path)
            elif path.exists():  # the result no longer supports this plot: a stale file would still be linked
                path.unlink()
    return written
