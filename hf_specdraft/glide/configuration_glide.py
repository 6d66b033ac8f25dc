"""GLIDE configuration (Du et al. 2024, "GLIDE with a CAPE", §4.1, Appendices A and E).

GLIDE's layers cross-attend to the *target's* KV cache, so its config describes two models: the draft itself
(``hidden_size``, ``num_hidden_layers``, …) and the target whose cache it reads (``target_*``), which lets a checkpoint
refuse a target it cannot read (:meth:`GlideConfig.target_mismatches`). Ships with checkpoints as trust_remote_code: it
imports only ``transformers`` and the standard library.
"""

from __future__ import annotations

import copy
from typing import Any

from transformers import PretrainedConfig

_SHAPES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
# What must agree between a GLIDE checkpoint and its target: the cross-attention's queries are shaped (and rotated) for
# these, and the drafted token ids must mean the same thing.
_TARGET_FIELDS = ("model_type", *_SHAPES, "rope_parameters")


def _rope_parameters(config, layer_ids: list[int] | None = None) -> dict[str, Any]:
    """The RoPE of the target layers GLIDE reads (``layer_ids`` None: the last), as one flat ``rope_parameters`` dict;
    a target with one RoPE per layer type (Gemma 3) gives that of the read layers' type."""
    rope = getattr(config, "rope_parameters", None)
    if rope is None:  # configs written before transformers 5 kept rope_theta / rope_scaling apart
        rope = dict(getattr(config, "rope_scaling", None) or {})
        rope.setdefault("rope_type", rope.pop("type", "default"))
        rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope = copy.deepcopy(dict(rope))
    if any(isinstance(value, dict) for value in rope.values()):
        layer_types = getattr(config, "layer_types", None) or []
        ids = layer_ids if layer_ids is not None else [config.num_hidden_layers - 1]
        kinds = {layer_types[i] for i in ids if 0 <= i < len(layer_types)}
        if len(kinds) != 1 or not isinstance(rope.get(next(iter(kinds))), dict):
            raise ValueError(
                f"target_config has per-layer-type RoPE settings ({sorted(rope)}) and GLIDE reads target layers {ids} "
                f"of types {sorted(kinds)}; pass target_layer_ids whose layers share one type (one RoPE for GLIDE's "
                "queries)"
            )
        rope = rope[next(iter(kinds))]
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            f"target_config rotates only part of each head (partial_rotary_factor={rope['partial_rotary_factor']}); "
            "GLIDE supports targets with full-head RoPE (Llama, Mistral, Qwen2/3, ...)"
        )
    return rope


def _text_config(target_config) -> PretrainedConfig:
    if not isinstance(target_config, PretrainedConfig):
        raise TypeError(f"target_config must be a transformers PretrainedConfig, got {type(target_config).__name__}")
    return target_config.get_text_config()


def target_description(target_config, layer_ids: list[int] | None = None) -> dict[str, Any]:
    """The ``_TARGET_FIELDS`` of a target's (text) config, as :class:`GlideConfig` records them for the target
    layers ``layer_ids`` it reads."""
    text = _text_config(target_config)
    return {
        "model_type": text.model_type,
        "num_hidden_layers": text.num_hidden_layers,
        "hidden_size": text.hidden_size,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
        "head_dim": getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        "vocab_size": text.vocab_size,
        "rope_parameters": _rope_parameters(text, layer_ids),
    }


class GlideConfig(PretrainedConfig):
    r"""Configuration of a [`GlideForCausalLM`] (GLIDE §4.1, Figure 2). Defaults describe the paper's GLIDE for a
    Vicuna-7B target (Appendix A); build one for your own target with [`GlideConfig.from_target_config`]. Every option
    is a keyword argument, each field below says what it is and why its default; ``target_*`` record the target whose KV
    cache GLIDE reads.
    """

    model_type = "glide"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    # Tensor parallelism (``tp_plan="auto"``), split like a Llama target: each rank's cross-attention holds the query
    # heads of the GQA groups whose KV heads the target's colwise ``k_proj`` / ``v_proj`` left in that rank's cache, so
    # every rank glimpses its own shard; the output projections are rowwise (one all-reduce each).
    base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.o_proj": "rowwise",
        "layers.*.cross_attn.q_proj": "colwise",
        "layers.*.cross_attn.o_proj": "rowwise",
        "layers.*.mlp.gate_proj": "colwise",
        "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    }

    # the fields: transformers makes a config a dataclass and writes its __init__
    vocab_size: int = 32000  # the target's vocabulary: GLIDE drafts token ids the target verifies
    hidden_size: int = 4096  # d_D; Appendix E: a wide single layer beats a deep narrow draft (4096 for 7B/13B targets)
    intermediate_size: int = 11008  # MLP width (from_target_config: the target's ratio to hidden_size)
    num_hidden_layers: int = 1  # N_D; Appendix E: 1 up to 13B targets, 2 for 33B (every layer is sequential latency)
    num_attention_heads: int = 32  # heads of the draft's own self-attention
    num_key_value_heads: int | None = None  # its KV heads (None: num_attention_heads, the draft is small)
    head_dim: int | None = None  # its head size (None: hidden_size // num_attention_heads)
    hidden_act: str = "silu"  # MLP activation (Llama's SwiGLU)
    max_position_embeddings: int = 4096  # the longest position the draft's RoPE is set up for (the target's by default)
    initializer_range: float = 0.02  # std of the normal init: GLIDE is trained from scratch (§4.1)
    rms_norm_eps: float = 1e-6
    use_cache: bool = True  # keep the draft's own self-attention KV cache while drafting
    tie_word_embeddings: bool = False  # share the input embedding and LM head (saves vocab × hidden for small drafts)
    # RoPE of the draft's *self*-attention (rope_type, rope_theta, …); from_target_config: the target's
    rope_parameters: dict | None = None
    attention_bias: bool = False  # bias in the attention projections (Llama has none)
    attention_dropout: float = 0.0  # attention dropout while training
    mlp_bias: bool = False  # bias in the MLP projections
    cross_attention: bool = True  # False: the paper's "Vanilla Drafter" (§5.2, Figure 4), the same model without it
    target_layer_ids: list[int] | None = None  # the target layer (0-based) each draft layer reads; §4.1's N_T - N_D + m
    block_size: int = 5  # L of the block-wise cross-attention mask in training (§4.1): it simulates the KV-cache delay
    target_model_type: str = "llama"  # the target's model_type (an architecture check, not an identity check)
    target_num_hidden_layers: int = 32  # N_T, layers of the target
    target_hidden_size: int = 4096
    target_num_attention_heads: int = 32  # h: the cross-attention projects to h × d_k (§4.1, Q^{m,j} = H^m W_j)
    target_num_key_value_heads: int | None = None  # KV heads of the target's cache (GQA; None: its attention heads)
    target_head_dim: int | None = None  # d_k of the cached target keys (None: target_hidden_size // its heads)
    target_vocab_size: int | None = None  # None: vocab_size
    target_max_position_embeddings: int | None = None  # RoPE scaling types read it (None: max_position_embeddings)
    # the cross-attention's queries are rotated as the cached keys were (None: theta 10000)
    target_rope_parameters: dict | None = None
    target_name_or_path: str | None = None  # informational: the checkpoint GLIDE was trained against (cards, errors)
    # a reduced draft vocabulary (FR-Spec, EAGLE-3): the target ids GLIDE can propose; the embedding and LM head hold
    # len(draft_token_ids) + 1 rows (the last: every other input token), logits are scattered back to vocab_size with
    # other ids at the dtype's minimum. None: the full vocabulary
    draft_token_ids: list[int] | None = None
    # read the target's state (Gemma 4's assistant, EAGLE): the first draft step's input is
    # pre_projection([embedding(x_t) ; h_{t-1}]), h_{t-1} the target's last hidden state; later steps the draft's own
    # post_projection of its last hidden state
    state_input: bool = False
    # False (state_input only): Gemma 4's assistant layout, cross-attention and MLP only, no cache of its own
    # (hf-specdraft export writes it)
    self_attention: bool = True
    # a table of what followed each short context in the target's own text (core.ngram_table), copied from where the
    # request's text offers no copy; its buffers copy_table_keys / copy_table_tokens hold this many entries (0: none)
    copy_table_size: int = 0
    copy_table_orders: list[int] | None = None  # the context lengths its keys were built for
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        for prefix in ("", "target_"):  # the draft's and the target's attention: MHA and hidden // heads by default
            heads = getattr(self, f"{prefix}num_attention_heads")
            if getattr(self, f"{prefix}num_key_value_heads") is None:
                setattr(self, f"{prefix}num_key_value_heads", heads)
            if getattr(self, f"{prefix}head_dim") is None:
                setattr(self, f"{prefix}head_dim", getattr(self, f"{prefix}hidden_size") // max(heads, 1))
        for name in ("vocab_size", "max_position_embeddings"):  # the target's: the draft's by default
            if getattr(self, f"target_{name}") is None:
                setattr(self, f"target_{name}", getattr(self, name))
        self.rope_parameters = copy.deepcopy(self.rope_parameters)
        default_rope = {"rope_type": "default", "rope_theta": 10000.0}
        self.target_rope_parameters = copy.deepcopy(self.target_rope_parameters) or default_rope
        if self.draft_token_ids is not None:
            self.draft_token_ids = [int(i) for i in self.draft_token_ids]
        if self.target_layer_ids is None:  # §4.1: l = N_T - N_D + m, the top target layers (0-based here)
            top = self.target_num_hidden_layers - self.num_hidden_layers
            self.target_layer_ids = [top + m for m in range(self.num_hidden_layers)]
        if isinstance(self.target_layer_ids, (list, tuple)):
            self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        self._validate()
        super().__post_init__(**kwargs)
        absent = [f".{kind}_attn." for kind in ("cross", "self") if not getattr(self, f"{kind}_attention")]
        if absent:  # the plan names only the sub-layers this GLIDE has
            self.base_model_tp_plan = {
                k: v for k, v in type(self).base_model_tp_plan.items() if not any(a in k for a in absent)
            }

    def _validate(self) -> None:
        names = (*_SHAPES, "intermediate_size", "max_position_embeddings", "block_size")
        for name in (*names, *(f"target_{n}" for n in _SHAPES)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for prefix in ("", "target_"):
            heads = getattr(self, f"{prefix}num_attention_heads")
            kv_heads = getattr(self, f"{prefix}num_key_value_heads")
            if heads % kv_heads:
                raise ValueError(
                    f"{prefix}num_attention_heads ({heads}) must be a multiple of "
                    f"{prefix}num_key_value_heads ({kv_heads})"
                )
        if self.target_head_dim % 2:
            raise ValueError(f"target_head_dim must be even (RoPE rotates pairs), got {self.target_head_dim}")
        for name in ("cross_attention", "state_input", "self_attention"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if not self.self_attention and not self.state_input:
            raise ValueError(
                "self_attention=False needs state_input=True: without its own cache and the target's state a draft "
                "step would not see the token before it"
            )
        if self.vocab_size != self.target_vocab_size:  # the logits' size, also with a reduced draft_token_ids
            raise ValueError(
                f"vocab_size ({self.vocab_size}) must equal target_vocab_size ({self.target_vocab_size}): GLIDE drafts "
                "the target's tokens"
            )
        if not isinstance(self.target_rope_parameters, dict) or "rope_theta" not in self.target_rope_parameters:
            raise ValueError(
                "target_rope_parameters must be a dict with rope_type and rope_theta, "
                f"got {self.target_rope_parameters!r}"
            )
        if self.draft_token_ids is not None:
            ids = self.draft_token_ids
            if not ids or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= self.vocab_size:
                raise ValueError(
                    f"draft_token_ids must be distinct ids in [0, vocab_size={self.vocab_size}), at least one"
                )
        size, orders = self.copy_table_size, self.copy_table_orders
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"copy_table_size must be an int >= 0 (0: no table), got {size!r}")
        if size and (not orders or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in orders)):
            raise ValueError(f"copy_table_orders must list the table's context lengths (ints >= 1), got {orders!r}")
        ids = self.target_layer_ids
        if not isinstance(ids, list) or len(ids) != self.num_hidden_layers:
            raise ValueError(
                f"target_layer_ids must list one target layer per draft layer ({self.num_hidden_layers}), got {ids!r}"
            )
        if self.cross_attention and any(not 0 <= i < self.target_num_hidden_layers for i in ids):
            raise ValueError(
                f"target_layer_ids must lie in [0, target_num_hidden_layers={self.target_num_hidden_layers}), got {ids}"
            )

    @classmethod
    def from_target_config(
        cls,
        target_config: PretrainedConfig,
        num_hidden_layers: int = 1,
        hidden_size: int | None = None,
        num_attention_heads: int | None = None,
        intermediate_size: int | None = None,
        cross_attention: bool = True,
        target_layer_ids: list[int] | None = None,
        **kwargs,
    ) -> GlideConfig:
        """A GLIDE config that matches ``target_config`` (a Llama/Mistral/Qwen2-style decoder config).

        Args:
            target_config: the target's config; its shapes, vocabulary and RoPE are recorded.
            num_hidden_layers: N_D (Appendix E: 1 up to 13B targets, 2 for 33B).
            hidden_size: d_D; defaults to the target's hidden size (Appendix A: 4096 for 7B/13B targets).
            num_attention_heads: self-attention heads; defaults to ``hidden_size // target head_dim``.
            intermediate_size: MLP width; defaults to the target's MLP/hidden ratio times ``hidden_size``.
            cross_attention: `False` for the vanilla drafter (§5.2).
            target_layer_ids: target layer read by each draft layer; defaults to ``N_T - N_D + m``.
            kwargs: any other [`GlideConfig`] argument (``tie_word_embeddings``, ``block_size``, …).
        """
        text = _text_config(target_config)
        if target_layer_ids is None:  # §4.1: l = N_T - N_D + m, the top target layers (0-based here)
            target_layer_ids = [text.num_hidden_layers - num_hidden_layers + m for m in range(num_hidden_layers)]
        target = target_description(target_config, target_layer_ids)
        hidden_size = hidden_size if hidden_size is not None else target["hidden_size"]
        if num_attention_heads is None:
            if hidden_size % target["head_dim"]:
                raise ValueError(
                    f"hidden_size ({hidden_size}) is not a multiple of the target's head_dim ({target['head_dim']}); "
                    "pass num_attention_heads"
                )
            num_attention_heads = hidden_size // target["head_dim"]
        if intermediate_size is None:
            ratio = getattr(text, "intermediate_size", None) or 4 * target["hidden_size"]
            intermediate_size = max(1, round(hidden_size * ratio / target["hidden_size"]))
        defaults = dict(
            vocab_size=target["vocab_size"],
            hidden_act=getattr(text, "hidden_act", "silu"),
            max_position_embeddings=getattr(text, "max_position_embeddings", 4096),
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            rope_parameters=copy.deepcopy(target["rope_parameters"]),  # same positions, same rotary settings
            **{name: getattr(text, name, None) for name in ("pad_token_id", "bos_token_id", "eos_token_id")},
            target_name_or_path=getattr(target_config, "_name_or_path", None) or None,
        )
        return cls(
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=num_attention_heads,
            cross_attention=cross_attention,
            target_layer_ids=target_layer_ids,
            target_max_position_embeddings=getattr(text, "max_position_embeddings", None),
            **{f"target_{name}": value for name, value in target.items()},  # the _TARGET_FIELDS, recorded
            **{**defaults, **kwargs},
        )

    def check_tensor_parallel(self, tp_size: int) -> None:
        """Raise `ValueError` unless every head count GLIDE splits under tensor parallelism divides by ``tp_size``
        (else transformers' colwise split gives the last rank a shorter slice, and its queries meet another's keys)."""
        if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
            raise ValueError(f"tp_size must be a positive int, got {tp_size!r}")
        prefixes = ("", "target_") if self.cross_attention else ("",)
        names = [f"{p}{n}" for p in prefixes for n in ("num_attention_heads", "num_key_value_heads")]
        uneven = [f"{name}={getattr(self, name)}" for name in names if getattr(self, name) % tp_size]
        if uneven:
            raise ValueError(
                f"this GLIDE cannot be split over tp_size={tp_size} tensor-parallel ranks like its target: "
                f"{', '.join(uneven)} {'is' if len(uneven) == 1 else 'are'} not a multiple of {tp_size} (GLIDE's "
                f"self-attention has {self.num_attention_heads} query / {self.num_key_value_heads} KV heads; the "
                f"target it reads has {self.target_num_attention_heads} query / {self.target_num_key_value_heads} KV "
                f"heads). Build GLIDE with head counts that divide by {tp_size} (GlideConfig.from_target_config(..., "
                "num_attention_heads=...)), or run it beside a target that is not split"
            )

    def target_mismatches(self, target_config: PretrainedConfig) -> list[str]:
        """Human-readable differences between the recorded target and ``target_config`` (empty: compatible)."""
        actual = target_description(target_config, self.target_layer_ids)
        recorded = {name: getattr(self, f"target_{name}") for name in _TARGET_FIELDS}
        return [
            f"{name}: GLIDE was built for {recorded[name]!r}, the target has {actual[name]!r}"
            for name in _TARGET_FIELDS
            if recorded[name] != actual[name]
        ]


GlideConfig.register_for_auto_class()  # save_pretrained writes auto_map["AutoConfig"] and copies this file
