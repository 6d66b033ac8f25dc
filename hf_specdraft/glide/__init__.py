"""GLIDE: a draft model that glimpses the target's KV cache (Du et al. 2024, "GLIDE with a CAPE", §4.1).

Files are listed in docs/layout.md; ``training/`` (``train_glide``, ``GlideTrainingArguments``) is imported on first
use and never shipped in a checkpoint. Decode with ``glide.attach(target)`` then ``target.generate(...,
assistant_model=glide)``, with a checkpoint's ``custom_generate/`` (:func:`save_glide_checkpoint`), or with
``speculative_generate(target, input_ids, candidate_generator=GlideCandidateGenerator(glide))``.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM

from ..core.drafting import register_drafter
from .candidate_generator import GlideCandidateGenerator, check_target_cache
from .configuration_glide import GlideConfig
from .model_card import save_glide_checkpoint, write_model_card
from .drafting_config import GlideDraftingConfig
from .modeling_glide import GlideForCausalLM, GlideModel, GlidePreTrainedModel

_TRAINING = ("GlideTrainingArguments", "train_glide")

# speculative_generate(draft_model=glide) glimpses the target
register_drafter(GlideConfig.model_type, GlideCandidateGenerator)


def register_auto_classes() -> None:
    """Register GLIDE with ``AutoConfig`` / ``AutoModelForCausalLM``: GLIDE checkpoints then load without
    ``trust_remote_code``."""
    AutoConfig.register(GlideConfig.model_type, GlideConfig, exist_ok=True)
    AutoModelForCausalLM.register(GlideConfig, GlideForCausalLM, exist_ok=True)


register_auto_classes()  # importing hf_specdraft.glide (anything of GLIDE's) is enough to load GLIDE checkpoints


def __getattr__(name: str):
    if name in _TRAINING:  # training pulls in accelerate and huggingface_hub cards: import on first use
        from . import training

        return getattr(training, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "GlideCandidateGenerator",
    "GlideConfig",
    "GlideDraftingConfig",
    "GlideForCausalLM",
    "GlideModel",
    "GlidePreTrainedModel",
    "GlideTrainingArguments",
    "check_target_cache",
    "register_auto_classes",
    "save_glide_checkpoint",
    "train_glide",
    "write_model_card",
]
