"""``python -m benchmarks.report [--results-dir DIR] [--output FILE]``: BENCHMARKS.md, its plots and the README's
headline and per-group tables (the README beside ``--output``), from the repository root."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .headline import write_groups, write_headline
from .render import write_report


def main(argv: list[str] | None = None) -> int:
    """Render the report; a missing or empty results directory is one line on stderr and exit status 2."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--results-dir", default="benchmarks/results", help="the bench JSON files")
    parser.add_argument("--output", default="BENCHMARKS.md", help="the report; the README beside it gets the headline")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.output, args.results_dir)
    except ValueError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path} (plots in {Path(args.results_dir).parent / 'plots'})")
    demo_dir = Path(args.results_dir).parent / "demo"
    if write_headline(Path(args.output).parent / "README.md", demo_dir):
        print(f"wrote the README's headline table from {demo_dir}")
    if write_groups(Path(args.output).parent / "README.md", demo_dir / "groups.json"):
        print(f"wrote the README's per-group table from {demo_dir / 'groups.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
