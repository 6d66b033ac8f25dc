"""GLIDE's training: everything that makes a GLIDE draft, nothing a trained one needs to decode (that lives one level
up, in ``hf_specdraft.glide``, and is what a checkpoint's ``trust_remote_code`` files are written from; no file here
ever ships in a checkpoint).

    batch.py        GlideBatch: one batch of training or held-out windows and what the frozen target says about them
    unrolled.py     draft steps unrolled over whole windows ("training-time test"), one forward per step
    objective.py    the training objective: windows (TargetWindows: the target runs), target KV, the loss (p whole or
                    top-k)
    store.py        the distillation store: the target's KV and top-k computed once (write_store), read as StoreWindows
    trainer.py      train_glide / GlideTrainingArguments: the one loop (on the fly or from a store), accelerate, resume
    data.py         --data files and 🤗 datasets (text, or conversations through the chat template)
    regenerate.py   the target writes the responses (sequence-level self-distillation, Appendix B), sharded
    evaluation.py   held-out teacher-forced α, greedy agreement and tokens per target forward
    command.py      ``hf-specdraft train-glide``, also ``accelerate launch -m hf_specdraft.glide.training``

The public names below are imported on first use (training pulls in accelerate and huggingface_hub's cards).
"""

from __future__ import annotations

import importlib

_EXPORTS = {"GlideTrainingArguments": "trainer", "train_glide": "trainer", "main": "command", "build_parser": "command",
            "load_data": "data", "token_stream": "objective"}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
