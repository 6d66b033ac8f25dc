"""GLIDE's training: everything that makes a GLIDE draft and nothing a trained one needs to decode (no file here ships
in a checkpoint; docs/layout.md lists them). The public names are imported on first use (training pulls in accelerate).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "GlideTrainingArguments": "trainer",
    "train_glide": "trainer",
    "main": "command",
    "build_parser": "command",
    "load_data": "data",
    "token_stream": "objective",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
