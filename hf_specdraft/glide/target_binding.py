"""GLIDE bound to a live target, for transformers' stock assisted decoding (Du et al. 2024, §4.1, "KV cache delay").

``target.generate(..., assistant_model=glide)`` never hands a draft the target's cache, so
:meth:`TargetBindingMixin.attach` records it with a forward pre-hook on the target, and GLIDE's forward glimpses it
when no ``target_past_key_values`` is passed. Ships beside ``modeling_glide.py`` as trust_remote_code.
"""

from __future__ import annotations

import weakref

from torch import nn


def passed_cache(past_key_values, cache):
    """The cache a forward call was handed: ``cache=`` from transformers 5.24 on, ``past_key_values=`` before."""
    if past_key_values is not None and cache is not None and past_key_values is not cache:
        raise ValueError("pass the cache once, as cache= or as past_key_values=, not two different caches")
    return cache if cache is not None else past_key_values


class _TargetBinding:
    """What :meth:`TargetBindingMixin.attach` keeps: the target (weakly), its hook, and its live cache as last seen."""

    def __init__(self, target: nn.Module):
        self.target = weakref.ref(target)
        self.cache = None  # the cache object of the target's latest forward call
        self.unglimpsed = False  # GLIDE's own cache was built in a round with nothing to glimpse (the first)
        self.handle = target.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        cache = passed_cache(kwargs.get("past_key_values"), kwargs.get("cache"))
        if cache is not None:
            self.cache = cache


class TargetBindingMixin:
    """``attach`` / ``detach`` and the ``generate`` that keeps GLIDE in step with stock assisted decoding (mixed into
    :class:`GlideForCausalLM` ahead of ``PreTrainedModel``; relies on its ``config`` and ``check_target``)."""

    _glide_binding: _TargetBinding | None = None

    def attach(self, target: nn.Module) -> "TargetBindingMixin":
        """Bind GLIDE to ``target`` for ``target.generate(..., assistant_model=glide)``: a forward pre-hook records the
        target's live cache, which at drafting time covers the verified prefix. Replaces a previous binding."""
        if not isinstance(target, nn.Module) or not hasattr(target, "config"):
            raise TypeError(f"target must be a transformers model, got {type(target).__name__}")
        if getattr(self.config, "state_input", False):
            raise ValueError(
                "this GLIDE reads the target's hidden state (state_input=True), which transformers' assisted decoding "
                "does not hand to a draft model: call speculative_generate(target, ids, draft_model=glide), or "
                "target.generate(ids, custom_generate=speculative_generate, draft_model=glide)"
            )
        self.check_target(target)
        self.detach()
        if self.config.cross_attention:
            self._glide_binding = _TargetBinding(target)
        return self

    def detach(self) -> None:
        """Remove the hook :meth:`attach` placed on the target (no-op when not attached)."""
        if self._glide_binding is not None:
            self._glide_binding.handle.remove()  # the target then holds no reference to the binding or its cache
            self._glide_binding = None

    @property
    def attached_target(self) -> nn.Module | None:
        return None if self._glide_binding is None else self._glide_binding.target()

    def _attached_cache(self, target_past_key_values):
        """The target cache a forward glimpses: explicit, else the attached target's (None before its first forward)."""
        if not self.config.cross_attention or target_past_key_values is not None:
            return target_past_key_values
        if self._glide_binding is None:
            raise ValueError(
                "GLIDE has no target attached: call glide.attach(target) before target.generate(..., "
                "assistant_model=glide), or pass target_past_key_values= (hf_specdraft's GlideCandidateGenerator does)"
            )
        return self._glide_binding.cache

    def adjust_generation_fn(self, *args, **kwargs):
        """Keep GLIDE's own ``generate``: the checkpoint's ``custom_generate/`` decodes its *target*, and transformers
        would install it as the loaded GLIDE's ``generate``, which stock assisted decoding calls to draft."""
        super().adjust_generation_fn(*args, **kwargs)
        self.__dict__.pop("generate", None)

    def generate(self, *args, **kwargs):
        """``GenerationMixin.generate``, once per assisted-decoding round, kept in step with the attached target.

        The first round comes before the target has run, so GLIDE drafts it without a glimpse; the next empties GLIDE's
        own cache so the prefix is fed again glimpsing (with two or more layers, layers >= 1 depend on layer 0's
        glimpse). Later rounds must find the target cache covering ``input_ids[:, :-1]``, else GLIDE is attached to
        another model."""
        binding, own = self._glide_binding, passed_cache(kwargs.get("past_key_values"), kwargs.get("cache"))
        if binding is None:
            if self.config.cross_attention and kwargs.get("target_past_key_values") is None:
                self._attached_cache(None)  # raises: no target attached
        elif own is None:
            binding.cache, binding.unglimpsed = None, self.config.num_hidden_layers > 1
        else:
            if binding.unglimpsed and binding.cache is not None:
                own.crop(-own.get_seq_length())  # rebuilt from the prompt on, every layer glimpsing
                binding.unglimpsed = False
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            covered = None if binding.cache is None else binding.cache.get_seq_length()
            if input_ids is not None and covered != input_ids.shape[-1] - 1:
                raise ValueError(
                    f"GLIDE is attached to a {type(binding.target()).__name__} whose cache covers {covered} "
                    f"tokens, but it is asked to continue {input_ids.shape[-1]} tokens: call glide.attach(model) "
                    "with the model you call generate on"
                )
        return super().generate(*args, **kwargs)
