"""What the draft-length controller learned, kept for the next call (:func:`recall`, :func:`remember`, :func:`forget`)
and on disk for a new process (docs/usage.md, "Draft length"; a later process skips the probing steps): an entry per
machine, pair of models (:func:`entry_key`) and call setting. The file helpers also serve
:mod:`~hf_specdraft.core.projection`'s calibrations.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import hashlib
import json
import os
import platform
import tempfile
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .controller import _ADDED, _CARRIED

if TYPE_CHECKING:
    from .controller import DraftLengthController


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
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
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
STORE = ("HF_SPECDRAFT_CONTROLLER_FILE", "controller.json")  # the file, by default $HF_SPECDRAFT_CACHE/controller.json
FORMAT = 1  # the state's layout; an entry of another format is not read


_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> weights_digest, read once per model
DIGEST_VALUES = 4096  # values read, evenly spaced, from each of a model's first and last two parameters


def weights_digest(model: torch.nn.Module) -> str:
    """A short digest of ``model``'s weights (values evenly spaced through its first and last two parameters), so
    that a checkpoint retrained under the same name and shape is told apart; computed once per model object.
    Parameters that are not plain tensors in memory (offloaded to ``meta``, sharded) give ``"-"``."""
    if model not in _DIGESTS:
        params = list(model.parameters())
        digest = hashlib.sha1()
        for p in params[:2] + params[-2:]:
            if type(p.data) is not torch.Tensor or p.device.type == "meta":
                digest = None
                break
            flat = p.detach().reshape(-1)
            digest.update(flat[:: max(1, flat.numel() // DIGEST_VALUES)].float().cpu().numpy().tobytes())
        _DIGESTS[model] = "-" if digest is None else digest.hexdigest()[:12]
    return _DIGESTS[model]


def identity(model) -> str:
    """A model's class, shape, checkpoint name and :func:`weights_digest` (what acceptance depends on); for a
    class, its name."""
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
    target, drafter = describe(model), describe(anchor)
    return f"{machine_id()} || target {target} || {drafter_name} over {drafter} || {options!r} || format {FORMAT}"


def mine(key: str, model=None) -> bool:
    """Whether an :func:`entry_key` is one of this machine's entries (for the target ``model``, any dtype or device)."""
    return key.startswith(f"{machine_id()} || " + ("" if model is None else f"target {identity(model)} "))


def save_state(key: str, state: dict, path: Path) -> None:
    """Save ``state`` (JSON-able) under ``key`` in ``path``; a failed write is skipped (a cache)."""
    with contextlib.suppress(Exception):
        data = read_json(path)
        data[key] = {"saved": time.time(), "state": state}
        if len(data) > MAX_ENTRIES:  # the newest entries stay (an unreadable time counts as the oldest)
            when = {k: v.get("saved") if isinstance(v, dict) else None for k, v in data.items()}
            when = {k: t if isinstance(t, (int, float)) else 0.0 for k, t in when.items()}
            data = dict(sorted(data.items(), key=lambda item: when[item[0]])[-MAX_ENTRIES:])
        write_json(path, data)


_MEMORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target model -> {key: (anchor ref, state)}


def _memory_key(drafter, controller: DraftLengthController, setting: tuple):
    """Who a controller's state belongs to: the drafter's anchor (its draft model, or its class), the drafter's class
    (CAPE over GLIDE and GLIDE alone learn apart), the options weighed, and the call's ``setting`` (batch size, cache,
    sampling, device and dtype: what else changes costs or acceptance)."""
    anchor = type(drafter) if drafter.controller_anchor is None else drafter.controller_anchor
    return anchor, (type(drafter).__qualname__, id(anchor), controller.widths, controller.max_draft_tokens, setting)


def _fits(value, fresh) -> bool:
    """Whether a saved field's ``value`` has the shape of the fresh controller's field ``fresh``."""
    if isinstance(fresh, list):
        return isinstance(value, list) and len(value) == len(fresh) and all(map(_fits, value, fresh))
    if isinstance(fresh, dict):  # the cost curve: seconds >= 0
        return isinstance(value, dict) and all(_fits(v, 0.0) and v >= 0 for v in value.values())
    if fresh is None:
        return value is None or (_fits(value, 0.0) and value >= 0)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _restore(controller: DraftLengthController, state: dict) -> bool:
    """Set ``controller``'s carried fields from a saved ``state``; ``False``, and nothing set, when any field does not
    fit (a file written by another version, or edited)."""
    restored = {}
    try:
        for name in _CARRIED:
            if name not in state and name in _ADDED:  # a file from before the field existed: it starts fresh
                continue
            value, fresh = state.get(name), getattr(controller, name)
            if isinstance(fresh, dict) and isinstance(value, dict):  # JSON keys come back as strings
                value = {int(k): v for k, v in value.items()}
            if not _fits(value, fresh):
                return False
            restored[name] = value
    except (TypeError, ValueError, AttributeError):
        return False
    vars(controller).update(restored)
    return True


def recall(controller: DraftLengthController, model, drafter, setting: tuple = ()) -> bool:
    """Start ``controller`` from what the last call of ``model`` with this drafter and ``setting`` learned (in this
    process, else on disk). Returns whether it did."""
    anchor, key = _memory_key(drafter, controller, setting)
    try:
        remembered = _MEMORY.get(model, {}).get(key)
    except TypeError:  # a model that cannot be weakly referenced
        return False
    if remembered is not None and remembered[0]() is anchor:  # not an id reused by another object
        vars(controller).update(copy.deepcopy(remembered[1]))
        return True
    # the file's key: shapes and names, not ids
    entry = read_json(cache_file(*STORE)).get(entry_key(model, anchor, key[0], key[2:]))
    saved = entry.get("state") if isinstance(entry, dict) else None
    return isinstance(saved, dict) and _restore(controller, saved)


SAVE_EVERY = 30.0  # seconds between two saves of an entry (a loop of short calls does not rewrite the file each time)
_SAVED: dict[str, float] = {}  # disk key -> when this process last saved it
_PENDING: dict[str, tuple] = {}  # disk key -> (its file, the newest state not saved yet): saved when the process exits


@atexit.register
def _save_pending() -> None:
    while _PENDING:
        key, (path, state) = _PENDING.popitem()
        save_state(key, state, path)


def remember(controller: DraftLengthController, model, drafter, setting: tuple = ()) -> None:
    """Keep what ``controller`` learned for the next call of ``model`` with this drafter and ``setting``, in this
    process (while the model lives) and on disk."""
    if not controller.verify:
        return
    anchor, key = _memory_key(drafter, controller, setting)
    state = {name: copy.deepcopy(getattr(controller, name)) for name in _CARRIED}
    try:
        kept = _MEMORY.setdefault(model, {})
        for stale in [k for k, (ref, _) in kept.items() if ref() is None]:  # draft models since deleted
            del kept[stale]
        kept[key] = (weakref.ref(anchor), state)
    except TypeError:  # a model or anchor that cannot be weakly referenced: nothing is kept
        return
    path = cache_file(*STORE)
    if path is None:
        return
    disk_key = entry_key(model, anchor, key[0], key[2:])
    _PENDING.pop(disk_key, None)
    if time.monotonic() - _SAVED.get(disk_key, float("-inf")) >= SAVE_EVERY:
        _SAVED[disk_key] = time.monotonic()
        save_state(disk_key, state, path)
    else:
        _PENDING[disk_key] = (path, state)


def forget(model=None) -> None:
    """Drop what the controller learned for ``model`` (any dtype or device) or (``None``) every model, in this process
    and in this machine's entries on disk: the next call measures afresh."""
    _SAVED.clear()
    try:
        if model is None:
            _MEMORY.clear()
        else:
            _MEMORY.pop(model, None)
    except TypeError:
        raise TypeError(
            f"forget(model) takes a model (the target passed to generate) or None, got {type(model).__name__}"
        ) from None
    for key in [k for k in _PENDING if mine(k, model)]:
        del _PENDING[key]
    path = cache_file(*STORE)
    with contextlib.suppress(Exception):  # a cache
        if path is not None and path.is_file():
            write_json(path, {k: v for k, v in read_json(path).items() if not mine(k, model)})
