"""Compiling the static path's forwards by transformers' rules: which ``CompileConfig`` a call compiles with
(:func:`compile_config_for`), the compiled ``model.__call__`` kept per model and config (:func:`compiled_call`), and the
seconds spent compiling and capturing, which the loop keeps out of the costs it learns (:func:`captured_seconds`).

Compiling follows transformers' rules (``GenerationMixin``'s ``_valid_auto_compile_criteria``): automatic on CUDA,
forced or tuned elsewhere by ``compile_config=CompileConfig(...)``, off with ``disable_compile=True``. The forward is
``torch.compile(model.__call__)`` as transformers compiles it, with ``dynamic=False`` unless the config says otherwise:
one graph per verification bucket (:mod:`~hf_specdraft.core.static_verify`), warmed up once by the static layout
(:mod:`~hf_specdraft.core.static_layout`) and reused by every later call whose cache fits.
"""

from __future__ import annotations

import copy
import threading
import weakref

import torch
from transformers import CompileConfig, GenerationConfig

from .static_verify import BUCKETS

RECOMPILE_LIMIT = 4 * len(BUCKETS)  # graphs dynamo may keep per code object: every bucket at a few cache sizes
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {compile config's fields: compiled __call__}
_CAPTURED = threading.local()  # seconds the current thread has spent compiling and capturing buckets


def captured_seconds() -> float:
    """Seconds this thread has spent compiling and capturing buckets (target's and drafts'): the loop subtracts what a
    step spent so, so that a bucket first needed mid-call never reaches the controller's costs or ``controller.json``."""
    return getattr(_CAPTURED, "seconds", 0.0)


def record_capture(seconds: float) -> None:
    """Add ``seconds`` spent compiling or capturing a bucket to this thread's count (:func:`captured_seconds`)."""
    _CAPTURED.seconds = captured_seconds() + seconds


def compiled_call(model, compile_config: CompileConfig):
    """``torch.compile(model.__call__)`` with ``compile_config``, made once per model and config and kept beside the model.

    Kept apart from transformers' ``get_compiled_call`` (which holds one compiled call per model and rebuilds it when
    the config changes): the loop's ``dynamic=False`` config and transformers' own default would otherwise replace each
    other's on every alternation (a bench running both), and each rebuild compiles again."""
    key = repr(sorted(compile_config.to_dict().items()))
    calls = _COMPILED.setdefault(model, {})
    if torch._dynamo.config.recompile_limit < RECOMPILE_LIMIT:  # dynamo's default 8 would fall back to eager silently
        torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT  # once a second cache size is compiled
    if key not in calls:
        calls[key] = torch.compile(model.__call__, **compile_config.to_dict())
    return calls[key]


def compile_config_for(model, generation_config: GenerationConfig) -> CompileConfig | None:
    """The ``CompileConfig`` the verification forward compiles with, or ``None`` for eager (transformers' rules)."""
    if generation_config.disable_compile:
        return None
    config = generation_config.compile_config
    if config is None and model.device.type != "cuda":
        return None  # as transformers: automatic on CUDA only; a CompileConfig forces it elsewhere
    if config is not None and not isinstance(config, CompileConfig):
        raise TypeError(f"compile_config must be a transformers.CompileConfig, got {type(config).__name__}")
    config = copy.deepcopy(config) if config is not None else CompileConfig()
    if config.dynamic is None:
        config.dynamic = False  # one graph per bucket: fixed shapes, never a dynamic-shape recompile
    return config
