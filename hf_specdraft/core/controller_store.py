"""What the draft-length controller learned, kept on disk so that a new process starts where the last one left off.

The controller (:mod:`~hf_specdraft.core.controller`) learns the machine's cost curve, the draft's cost and the
acceptance of a target and drafter while it runs. Within a process the next call resumes from it; this module keeps
the same state in ``$HF_SPECDRAFT_CONTROLLER_FILE``, by default ``$HF_SPECDRAFT_CACHE/controller.json`` (``~/.cache/
hf_specdraft``), so the first call of a later process skips the probing steps and the uninformed start (about 5 % of
a first 48-token GLIDE call on a 2-core CPU). An entry holds for one machine (CPU model, torch build, CPU count, and
the GPU's name on CUDA) and one pair's shapes and checkpoint names (:func:`entry_key`); the acceptance it carries
decays within a few dozen steps, so a different text soon outweighs it. Set the variable empty to keep nothing on disk.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from .projection import machine_id

MAX_ENTRIES = 256  # the file keeps the most recently saved entries


def store_file() -> Path | None:
    """``$HF_SPECDRAFT_CONTROLLER_FILE``, else ``$HF_SPECDRAFT_CACHE/controller.json`` (default ``~/.cache/hf_specdraft``);
    ``None`` when the variable is set empty."""
    explicit = os.environ.get("HF_SPECDRAFT_CONTROLLER_FILE")
    if explicit is not None:
        return Path(explicit) if explicit else None
    return Path(os.environ.get("HF_SPECDRAFT_CACHE") or Path.home() / ".cache" / "hf_specdraft") / "controller.json"


def describe(model) -> str:
    """A model's class, shape and checkpoint name (what its costs and acceptance depend on), or a class's name."""
    if isinstance(model, type):
        return model.__qualname__
    config = getattr(model, "config", None)
    if config is None:
        return type(model).__qualname__
    shape = [getattr(config, name, None) for name in ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")]
    device = getattr(model, "device", None)
    where = device.type if isinstance(device, torch.device) else "cpu"
    if where == "cuda":
        where = torch.cuda.get_device_name(device)
    return f"{type(model).__qualname__} {shape} {getattr(config, '_name_or_path', '')!r} {getattr(model, 'dtype', '')} on {where}"


def entry_key(model, anchor, drafter_name: str, options: tuple) -> str:
    """The file's key of one target, drafter and call setting on this machine."""
    return f"{machine_id()} || target {describe(model)} || {drafter_name} over {describe(anchor)} || {options!r}"


def belongs_to(key: str, target_description: str) -> bool:
    """Whether an :func:`entry_key` is one of this machine's entries for the target :func:`describe` gave."""
    return key.startswith(f"{machine_id()} || target {target_description} || ")


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):  # unreadable or half-written: start afresh
        return {}
    return data if isinstance(data, dict) else {}


def load_state(key: str) -> dict | None:
    """The state saved under ``key``, or ``None``."""
    path = store_file()
    if path is None:
        return None
    entry = _read(path).get(key)
    return entry.get("state") if isinstance(entry, dict) and isinstance(entry.get("state"), dict) else None


def save_state(key: str, state: dict) -> None:
    """Save ``state`` (JSON-able) under ``key``: read, merge, atomic replace; a read-only cache directory only skips it."""
    path = store_file()
    if path is None:
        return
    try:
        data = _read(path)
        data[key] = {"saved": time.time(), "state": state}
        if len(data) > MAX_ENTRIES:
            data = dict(sorted(data.items(), key=lambda item: item[1].get("saved", 0) if isinstance(item[1], dict) else 0)[-MAX_ENTRIES:])
        _write(path, data)
    except OSError:
        pass


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    partial.replace(path)


def drop_states(target_description: str | None = None) -> None:
    """Remove the entries of one target (its :func:`describe`) on this machine, or (``None``) the whole file."""
    path = store_file()
    if path is None or not path.is_file():
        return
    try:
        if target_description is None:
            path.unlink()
            return
        _write(path, {k: v for k, v in _read(path).items() if not belongs_to(k, target_description)})
    except OSError:
        pass
