"""hf_specdraft: speculative decoding methods for 🤗 Transformers causal LMs.

    >>> from hf_specdraft import speculative_generate
    >>> out = target.generate(input_ids, custom_generate=speculative_generate, draft_model=draft,
    ...                       max_new_tokens=64)  # doctest: +SKIP

``import hf_specdraft`` loads no method and not torch (PEP 562): each public name imports its module when first taken.
What one method lends another is wired here: GLIDE checkpoints ship CAPE's loop (:func:`write_glide_custom_generate`),
and taking :func:`speculative_generate` imports :mod:`.glide`, which registers GLIDE with the Auto classes and as the
drafter of ``draft_model=<a GLIDE model>`` (so a GLIDE draft loaded with ``trust_remote_code`` still glimpses the
target).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_MODULES = {  # the module (relative to this package) -> the public names it defines
    ".cape": ("CapeCandidateGenerator", "CapeConfig"),
    ".cascade": ("CascadeCandidateGenerator", "CascadeConfig", "MaxGramCandidateGenerator"),
    ".casd": ("CasdCandidateGenerator", "CasdConfig", "casd_generate"),
    ".glide": ("GlideCandidateGenerator", "GlideConfig", "GlideForCausalLM"),
    ".core.acceptance": ("ConditionalAcceptance", "speculative_sampling"),
    ".core.drafting": ("DraftModelCandidateGenerator", "TreeCandidateGenerator"),
    ".core.loop": ("SpeculativeGenerateOutput", "speculative_generate"),
    ".core.projection": ("few_token_linears",),
    ".core.state_drafting": ("StateReadingDrafter",),
    ".core.stats": ("SpeculativeStats", "expected_speedup"),
    ".core.target_state": ("TargetState",),
    ".core.tree": ("DraftTree",),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}


def write_glide_custom_generate(directory):
    """CAPE's ``custom_generate/`` folder for a GLIDE checkpoint (the card tags it, so no README of its own): pass it
    as ``save_glide_checkpoint(..., custom_generate=write_glide_custom_generate)`` or to ``train_glide``."""
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
