"""Which models the loop can verify drafts for, asked of the model's config and of the cache transformers builds.

Tree verification needs a KV cache whose positions can be gathered to the accepted path, an attention that takes a 4-D
mask, and a forward that takes a cache. Attention-only models verify trees; ALiBi models and short-convolution hybrids
chains only (:func:`chains_only`); models with a recurrent state, which transformers' ``crop`` does not roll back, are
refused before any forward (:func:`check_target`). The groups, model by model: docs/architectures.md.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import ModelOutput

# DummyLayer: a KV-shared layer (Gemma 4's E-models, Gemma 3n) holds nothing of its own and reads the keys and values
# its producer layer cached, which the loop compacts like any other attention layer
ATTENTION_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer", "DummyLayer")
# Model types whose greedy output under this loop did not match their own ``generate`` in the architecture grid
# (tests/test_architectures.py): refused by name until the cause is found, never decoded wrongly in silence.
MISMATCHED_MODEL_TYPES = {
    **dict.fromkeys(
        ("roberta", "roberta-prelayernorm", "camembert", "data2vec-text", "xlm-roberta", "xlm-roberta-xl"),
        "used as a decoder, its speculative output did not match its own generate (RoBERTa-style embeddings)",
    ),
    "cpmant": "its forward prepends its own prompt positions, so its cache does not line up with input_ids",
    "prophetnet": "its decoder takes one token per forward once it has a cache, and a verification feeds several",
    "dory": "its looped layers attend over cached states of earlier loops, which a verification's tree mask misses",
    "xlm": "its forward keeps its own dict of cached states, not a transformers Cache the loop can compact",
}
ALIBI_MODEL_TYPES = ("bloom", "mpt")  # ALiBi bias built from a 2-D mask (Falcon: only with config.alibi)
CONVOLUTION_LAYER_TYPES = ("conv",)  # layer_types whose state is a short window of inputs, which crop restores exactly


# the names a model ``forward`` takes its KV cache under, newest first (transformers 5.24 renamed past_key_values)
CACHE_ARGUMENTS = ("cache", "past_key_values")
# the name this transformers gives the cache in model outputs, generate's outputs and its model_kwargs
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


@functools.cache
def cache_argument(cls: type) -> str | None:
    """The keyword a model class's ``forward`` takes its KV cache under (:data:`CACHE_ARGUMENTS`), or None."""
    parameters = inspect.signature(cls.forward).parameters
    return next((name for name in CACHE_ARGUMENTS if name in parameters), None)


def with_cache(model: nn.Module, cache) -> dict:
    """The keyword argument that hands ``model`` its cache (:func:`cache_argument`), on any transformers."""
    return {cache_argument(type(model)) or "past_key_values": cache}


def output_cache(outputs):
    """The cache a model output or a ``model_kwargs`` dict carries, under either name."""
    if isinstance(outputs, ModelOutput):  # maps the old name itself on 5.24, with a deprecation warning
        return outputs.get(CACHE_FIELD)
    cache = outputs.get("cache")
    return cache if cache is not None else outputs.get("past_key_values")


def model_type(model: PreTrainedModel) -> str:
    return getattr(model.config.get_text_config(), "model_type", None) or model.config.model_type


def cache_layer_names(model: PreTrainedModel) -> list[str]:
    """Class names of the layers of the ``DynamicCache`` transformers builds for ``model``."""
    return [type(layer).__name__ for layer in DynamicCache(config=model.config).layers]


def cache_window(cache: DynamicCache) -> int | None:
    """The smallest window of the cache's sliding-window (or chunked) layers; None without such layers."""
    windows = [layer.sliding_window for layer in cache.layers if type(layer).__name__ == "DynamicSlidingWindowLayer"]
    return min(windows) if windows else None


def check_batch_target(model: PreTrainedModel, generation_config, chains: str | None) -> None:
    """Raise a `ValueError` where ``model`` cannot verify a padded batch: ``chains`` (:func:`chains_only`), or a
    sliding window shorter than ``max_length`` on a ``DynamicCache``."""
    name, length = type(model).__name__, generation_config.max_length
    if chains:  # ALiBi, or a convolution state (per sequence)
        raise ValueError(f"{name} cannot verify a padded batch: {chains}; run one unpadded prompt at a time")
    window = cache_window(DynamicCache(config=model.config))
    if window is not None and length > window and generation_config.cache_implementation != "static":
        raise ValueError(
            f"{name} has a sliding window of {window} tokens and max_length is {length}: batched "
            "speculative decoding on a DynamicCache supports windowed targets only within one window; "
            "lower max_new_tokens, pass cache_implementation='static' (windows by mask), or run one "
            "unpadded prompt at a time"
        )


def recurrent_state(model: PreTrainedModel) -> str | None:
    """Why ``model``'s cache cannot be rolled back to an accepted prefix (or the loop is known not to match it)."""
    if model_type(model) in MISMATCHED_MODEL_TYPES:
        return MISMATCHED_MODEL_TYPES[model_type(model)]
    if cache_argument(type(model)) is None:
        return "its forward takes no KV cache (no cache to verify drafts against and roll back)"
    if convolution_only(model):
        return None
    if getattr(type(model), "_is_stateful", False):  # transformers' own flag for models with a recurrent state
        return "its cache holds a recurrent state, which cannot be rolled back to the accepted tokens"
    names = [name for name in cache_layer_names(model) if name not in ATTENTION_LAYERS]
    if not names:
        return None
    return (
        f"its cache holds {sorted(set(names))} layers, whose recurrent state transformers' crop does not roll back "
        "to the accepted tokens (a rejected draft would stay in the state)"
    )


def convolution_only(model: PreTrainedModel) -> bool:
    """Every non-attention layer is a short convolution (LFM2 ``conv``): crop restores it exactly, chains work."""
    types = getattr(model.config.get_text_config(), "layer_types", None) or []
    other = {t for t in types if "attention" not in t}
    return bool(other) and other <= set(CONVOLUTION_LAYER_TYPES)


def chains_only(model: PreTrainedModel) -> str | None:
    """Why ``model`` verifies trees as chains (its first-child path), or None when it verifies trees."""
    if model_type(model) in ALIBI_MODEL_TYPES or getattr(model.config.get_text_config(), "alibi", False):
        return "ALiBi attention takes a 2-D mask only"
    if convolution_only(model):
        return "convolution layers roll back by crop only"
    return None


def check_target(model: PreTrainedModel, argument: str = "model") -> None:
    """Raise a `ValueError` naming the model type when speculative decoding cannot run on ``model`` exactly."""
    why = recurrent_state(model)
    if why is not None:
        raise ValueError(
            f"{argument} is a {model_type(model)!r} model, which speculative decoding refuses: {why}. Supported: "
            "attention-based causal LMs (LFM2-style convolution hybrids and ALiBi models with chains only); see "
            "the README's Architectures section"
        )


@dataclass(frozen=True)
class TargetSupport:
    """What a call reads of its target, asked once (its config and signatures are slow to ask)."""

    cache_argument: str  # the keyword its forward takes its cache under
    chains: str | None  # why it verifies trees as chains (chains_only), or None
    convolution_only: bool  # its only non-attention layers are short convolutions
    prefill_kwargs: dict  # what a prefill forward adds (logits_to_keep=1 where it takes it)


def support_of(model: PreTrainedModel) -> TargetSupport:
    """What the loop reads of ``model``, without refusing it (a draft's static cache asks too)."""
    # logits_to_keep=1 where the forward takes it: a prefill needs the cache, not V logits per token
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    argument = cache_argument(type(model)) or "past_key_values"
    return TargetSupport(argument, chains_only(model), convolution_only(model), keep)


def target_support(model: PreTrainedModel) -> TargetSupport:
    """:func:`check_target`, then :func:`support_of`."""
    check_target(model)
    return support_of(model)
