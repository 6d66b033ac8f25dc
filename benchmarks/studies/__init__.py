"""Studies and sweeps: ``python -m benchmarks.studies.<name>`` from the repository root (README.md lists them)."""

from __future__ import annotations

import json
import time
from pathlib import Path


def save_run(bundle, output: str | Path, command: str, body: dict, **meta) -> dict:
    """Write one study's run as JSON to ``output``: ``meta`` (the bench's
    :func:`~hf_specdraft.bench.harness.environment`, date, the command, then ``meta``'s items) and ``body``'s items
    beside it. Returns what it wrote."""
    from hf_specdraft.bench import harness

    date = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    result = {"meta": {**harness.environment(bundle), "date": date, "command": command, **meta}, **body}
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(json.dumps(result, indent=1) + "\n")
    return result
