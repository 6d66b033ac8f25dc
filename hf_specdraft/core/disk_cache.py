"""The files in ``$HF_SPECDRAFT_CACHE`` (default ``~/.cache/hf_specdraft``) that carry what one process measured to the
next: where each one is, which machine an entry holds for, and reading and replacing a JSON file safely.

Used by :mod:`~hf_specdraft.core.projection` (``few_token_linears``' calibrations) and
:mod:`~hf_specdraft.core.controller_store` (what the draft-length controller learned).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import tempfile
from pathlib import Path

import torch


def cache_file(variable: str, name: str) -> Path | None:
    """``$variable`` when set (``None`` when set empty: nothing on disk), else ``$HF_SPECDRAFT_CACHE/name``."""
    explicit = os.environ.get(variable)
    if explicit is not None:
        return Path(explicit) if explicit else None
    return Path(os.environ.get("HF_SPECDRAFT_CACHE") or Path.home() / ".cache" / "hf_specdraft") / name


@functools.lru_cache(maxsize=1)
def machine_id() -> str:
    """The CPU model and torch build what was measured holds for (another CPU or BLAS is measured anew)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} | torch {torch.__version__} | {os.cpu_count()} CPUs"


def read_json(path: Path | None) -> dict:
    """The JSON object in ``path``; ``{}`` when there is none, or it is unreadable or half-written (measure again)."""
    try:
        data = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict) -> None:
    """Replace ``path`` with ``data`` at once, through a temporary file of this writer's own in the same directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as f:
            f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
