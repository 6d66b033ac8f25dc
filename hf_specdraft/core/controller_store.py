"""What the draft-length controller learned, kept on disk so that a new process starts where the last one left off.

Within a process the next call resumes from what the controller (:mod:`~hf_specdraft.core.controller`) learned; this
module keeps it in ``$HF_SPECDRAFT_CONTROLLER_FILE``, by default ``$HF_SPECDRAFT_CACHE/controller.json``
(``~/.cache/hf_specdraft``), so a later process skips the probing steps (about 5 % of a first 48-token GLIDE call on a
2-core CPU). An entry holds for one machine (CPU model, torch build, CPU count, GPU name) and one pair's shapes and
checkpoint names, and a digest of their weights, so a checkpoint retrained in place starts afresh (:func:`entry_key`).
Set the variable empty to keep nothing on disk.

The helpers first in this module serve every such file (this store, and :mod:`~hf_specdraft.core.projection`'s
calibrations): where it is (:func:`cache_file`), which machine an entry holds for (:func:`machine_id`), and reading and
replacing JSON safely (:func:`read_json`, :func:`write_json`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
import time
import weakref
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


MAX_ENTRIES = 256  # the file keeps the most recently saved entries


def store_file() -> Path | None:
    """The store's file (see the module docstring); ``None`` when ``$HF_SPECDRAFT_CONTROLLER_FILE`` is set empty."""
    return cache_file("HF_SPECDRAFT_CONTROLLER_FILE", "controller.json")


FORMAT = 1  # the state's layout; an entry of another format is not read


_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> weights_digest, read once per model
DIGEST_VALUES = 4096  # values read, evenly spaced, from each of a model's first and last two parameters


def weights_digest(model: torch.nn.Module) -> str:
    """A short digest of ``model``'s weights (values evenly spaced through its first and last two parameters), so
    that a checkpoint retrained under the same name and shape is told apart; computed once per model object.
    Parameters that are not plain tensors in memory (offloaded to ``meta``, sharded) give ``"-"``."""
    try:
        return _DIGESTS[model]
    except (KeyError, TypeError):
        pass
    params = [p for _, p in model.named_parameters()]
    digest = hashlib.sha1()
    for p in params[:2] + params[-2:]:
        if type(p.data) is not torch.Tensor or p.device.type == "meta":
            digest = None
            break
        flat = p.detach().reshape(-1)
        digest.update(flat[:: max(1, flat.numel() // DIGEST_VALUES)].float().cpu().numpy().tobytes())
    value = "-" if digest is None else digest.hexdigest()[:12]
    try:
        _DIGESTS[model] = value
    except TypeError:
        pass
    return value


def identity(model) -> str:
    """A model's class, shape, checkpoint name and :func:`weights_digest` (what its acceptance depends on), or a
    class's name."""
    if isinstance(model, type):
        return model.__qualname__
    config = getattr(model, "config", None)
    if config is None:
        return type(model).__qualname__
    shape = [getattr(config, name, None) for name in ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")]
    weights = f" weights {weights_digest(model)}" if isinstance(model, torch.nn.Module) else ""
    return f"{type(model).__qualname__} {shape} {getattr(config, '_name_or_path', '')!r}{weights}"


def describe(model) -> str:
    """:func:`identity`, and for a model its dtype and where it runs (what its costs depend on too)."""
    if isinstance(model, type) or getattr(model, "config", None) is None:
        return identity(model)
    device = getattr(model, "device", None)
    where = device.type if isinstance(device, torch.device) else "cpu"
    if where == "cuda":
        where = torch.cuda.get_device_name(device)
    return f"{identity(model)} {getattr(model, 'dtype', '')} on {where}"


def entry_key(model, anchor, drafter_name: str, options: tuple) -> str:
    """The file's key of one target, drafter and call setting on this machine."""
    return f"{machine_id()} || target {describe(model)} || {drafter_name} over {describe(anchor)} || {options!r} || format {FORMAT}"


def belongs_to(key: str, model) -> bool:
    """Whether an :func:`entry_key` is one of this machine's entries for the target ``model`` (in any dtype or device)."""
    return key.startswith(f"{machine_id()} || target {identity(model)} ")


def load_state(key: str) -> dict | None:
    """The state saved under ``key``, or ``None``."""
    path = store_file()
    if path is None:
        return None
    entry = read_json(path).get(key)
    return entry.get("state") if isinstance(entry, dict) and isinstance(entry.get("state"), dict) else None


def _when(entry) -> float:
    saved = entry.get("saved") if isinstance(entry, dict) else None
    return saved if isinstance(saved, (int, float)) else 0.0


def save_state(key: str, state: dict, path: Path | None = None) -> None:
    """Save ``state`` (JSON-able) under ``key`` in ``path`` (default :func:`store_file`): read, merge, atomic replace.
    A cache write never fails a call: a read-only directory or an odd file only skips it."""
    path = store_file() if path is None else path
    if path is None:
        return
    try:
        data = read_json(path)
        data[key] = {"saved": time.time(), "state": state}
        if len(data) > MAX_ENTRIES:
            data = dict(sorted(data.items(), key=lambda item: _when(item[1]))[-MAX_ENTRIES:])
        write_json(path, data)
    except Exception:  # noqa: BLE001 - a cache
        pass


def drop_states(model=None) -> None:
    """Remove this machine's entries for the target ``model`` (any dtype or device), or (``None``) all of this
    machine's entries; other machines' entries in a shared file stay."""
    path = store_file()
    if path is None or not path.is_file():
        return
    try:
        mine = (lambda k: k.startswith(f"{machine_id()} || ")) if model is None else (lambda k: belongs_to(k, model))
        write_json(path, {k: v for k, v in read_json(path).items() if not mine(k)})
    except Exception:  # noqa: BLE001 - a cache
        pass
