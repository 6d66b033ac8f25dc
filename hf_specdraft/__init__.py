"""hf_specdraft: speculative decoding methods for 🤗 Transformers causal LMs.

    >>> from hf_specdraft import speculative_generate
    >>> out = target.generate(input_ids, custom_generate=speculative_generate, draft_model=draft,
    ...                       max_new_tokens=64)  # doctest: +SKIP

Layers: the core (``hf_specdraft.core``: the loop and its steps) imports no method; each method package (glide, cape,
cascade, casd) imports only the core; this module, ``defaults``, ``bench`` and the CLI compose them
(``tests/test_layers.py`` checks it). What one method lends another is wired here.

``import hf_specdraft`` loads no method and not torch (PEP 562): each public name below imports its module when it is
first taken, so ``hf-specdraft --help`` answers at once. The wiring costs nothing at import:

- GLIDE checkpoints ship CAPE's loop: :func:`write_glide_custom_generate` is the writer ``hf-specdraft train-glide``
  passes to ``train_glide`` / ``save_glide_checkpoint`` (``custom_generate=``), importing :mod:`.cape.packaging` when
  a checkpoint is saved;
- ``import hf_specdraft.glide`` registers GLIDE with ``AutoConfig`` / ``AutoModelForCausalLM`` (its checkpoints load
  without ``trust_remote_code``) and as the drafter of ``speculative_generate(draft_model=<a GLIDE model>)``; taking
  :func:`speculative_generate` from here imports it too, so a GLIDE draft loaded with ``trust_remote_code`` still
  glimpses the target.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {  # public name -> the module (relative to this package) that defines it
    "CapeCandidateGenerator": ".cape",
    "CapeConfig": ".cape",
    "CascadeCandidateGenerator": ".cascade",
    "CascadeConfig": ".cascade",
    "CasdCandidateGenerator": ".casd",
    "CasdConfig": ".casd",
    "ConditionalAcceptance": ".core.acceptance",
    "DraftModelCandidateGenerator": ".core.drafting",
    "DraftTree": ".core.tree",
    "GlideCandidateGenerator": ".glide",
    "GlideConfig": ".glide",
    "GlideForCausalLM": ".glide",
    "MaxGramCandidateGenerator": ".cascade",
    "SpeculativeGenerateOutput": ".core.loop",
    "SpeculativeStats": ".core.stats",
    "StateReadingDrafter": ".core.state_drafting",
    "TargetState": ".core.target_state",
    "TreeCandidateGenerator": ".core.drafting",
    "casd_generate": ".casd",
    "expected_speedup": ".core.stats",
    "few_token_linears": ".core.projection",
    "speculative_generate": ".core.loop",
    "speculative_sampling": ".core.acceptance",
    "standardized_walltime_improvement": ".core.stats",
}


def write_glide_custom_generate(directory):
    """CAPE's ``custom_generate/`` folder for a GLIDE checkpoint (the card tags it, so no README of its own): the
    writer to pass as ``save_glide_checkpoint(..., custom_generate=write_glide_custom_generate)`` (or to
    ``train_glide``)."""
    from .cape.packaging import write_custom_generate

    return write_custom_generate(directory, readme=False)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name == "speculative_generate":
        importlib.import_module(".glide", __name__)  # GLIDE's drafter registered before any draft_model= meets it
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = sorted(_EXPORTS)
