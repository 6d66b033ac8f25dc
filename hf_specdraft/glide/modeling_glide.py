"""GLIDE, the glimpse draft model (Du et al. 2024, "GLIDE with a CAPE", §4.1, Figure 2).

Every layer is self-attention → **cross-attention to the target's KV cache** → MLP. The cross-attention has only query
and output projections: the cached keys are already rotated, so the queries are rotated with the *target's* RoPE at
their absolute positions. Draft layer m reads target layer ``N_T - N_D + m`` unless ``config.target_layer_ids`` says
otherwise. A draft token at position j sees target keys k with ``k < j`` at inference (the target caches the verified
prefix only: "KV cache delay"), and ``block(k) < block(j)`` in training (Mask_Block, L = 5), which simulates that delay.

Ships with checkpoints as trust_remote_code: imports only ``torch``, ``transformers`` and its flat siblings. With a
stock target (batch size 1)::

    glide = AutoModelForCausalLM.from_pretrained("you/glide-for-x", trust_remote_code=True)
    glide.attach(target)  # a forward pre-hook records the target's live KV cache
    out = target.generate(**inputs, assistant_model=glide, max_new_tokens=64)
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import Cache, DynamicCache, GenerationMixin, LlamaConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    eager_attention_forward,
    rotate_half,
)

from .configuration_glide import GlideConfig
from .target_binding import TargetBindingMixin, passed_cache

# transformers 5.24 renamed the cache argument of every forward (and the outputs' cache field) from
# ``past_key_values`` to ``cache``: read once here, so this file runs on either side of the rename
ATTENTION_CACHE_ARGUMENT = (
    "cache" if "cache" in inspect.signature(LlamaAttention.forward).parameters else "past_key_values"
)
OUTPUT_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def read_target_layer(
    target_past_key_values, layer_idx: int, config: GlideConfig, kv_heads: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """Keys and values `(B, kv_heads, S, head_dim)` (post-RoPE) of target layer ``layer_idx`` from the target's cache (a
    transformers ``Cache``, or per layer ``(keys, values)`` pairs as training passes) and the sequence index of their
    first entry (non-zero for a trimmed sliding-window layer), or `None` when it is empty. ``kv_heads``: all the
    target's by default, this rank's share under tensor parallelism."""
    if hasattr(target_past_key_values, "layers"):  # a transformers Cache
        layers = target_past_key_values.layers
        if not layers:  # a lazily built DynamicCache() before its first update: nothing cached yet
            return None
    elif isinstance(target_past_key_values, Sequence) and not isinstance(target_past_key_values, (str, bytes)):
        layers = target_past_key_values
    else:
        raise TypeError(
            "target_past_key_values must be a transformers Cache or a sequence of (keys, values) pairs, "
            f"got {type(target_past_key_values).__name__}"
        )
    if layer_idx >= len(layers):
        raise ValueError(
            f"target_past_key_values has {len(layers)} layers but GLIDE reads target layer {layer_idx} "
            f"(built for a {config.target_num_hidden_layers}-layer target)"
        )
    layer = layers[layer_idx]
    if isinstance(layer, (tuple, list)):
        keys, values = layer[:2]
    elif hasattr(layer, "keys") and hasattr(layer, "values"):
        keys, values = layer.keys, layer.values
    else:
        raise ValueError(
            f"layer {layer_idx} of target_past_key_values ({type(layer).__name__}) has no readable keys/values; "
            "GLIDE needs an attention KV cache such as transformers' DynamicCache"
        )
    if keys is None or keys.numel() == 0:
        return None
    # sliding-window layers keep only the newest keys
    offset = int(layer.get_seq_length()) - keys.shape[-2] if hasattr(layer, "get_seq_length") else 0
    expected = (config.target_num_key_value_heads if kv_heads is None else kv_heads, config.target_head_dim)
    if keys.dim() != 4 or (keys.shape[1], keys.shape[3]) != expected or values.shape != keys.shape:
        split = (
            f" (this rank's {expected[0]} of the target's {config.target_num_key_value_heads} KV heads: GLIDE is "
            "split by tensor parallelism, and so must the target be, over as many ranks)"
            if expected[0] != config.target_num_key_value_heads
            else ""
        )
        raise ValueError(
            f"target_past_key_values layer {layer_idx} has keys {tuple(keys.shape)} / values {tuple(values.shape)}; "
            f"GLIDE expects (batch, {expected[0]}, seq, {expected[1]}) for the target it was built for{split}"
        )
    return keys, values, offset


def cross_attention_mask(
    query_index: torch.Tensor,
    key_index: torch.Tensor,
    block_size: int | None,
    dtype: torch.dtype,
    padding_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which target keys (sequence indices ``key_index`` `(S,)`) each draft query (``query_index`` `(q,)`) may glimpse:
    ``k < j`` at inference (``block_size`` None), ``block(k) < block(j)`` in training; ``padding_mask`` `(B, >S)`.

    Returns:
        `(mask, visible)`: additive mask `(B|1, 1, q, S)` and `(B|1, q, 1)` 1.0 where the query sees at least one key
        (rows seeing nothing get a zero output, not NaN).
    """
    limit = (
        query_index if block_size is None else torch.div(query_index, block_size, rounding_mode="floor") * block_size
    )
    allowed = (key_index[None, :] < limit[:, None])[None]  # (1, q, S)
    if padding_mask is not None and padding_mask.dim() == 2 and padding_mask.shape[-1] > int(key_index.max()):
        allowed = allowed & padding_mask[:, key_index].bool()[:, None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None], allowed.any(-1, keepdim=True).to(dtype)


def self_attention_mask(
    past_seen: int, q_len: int, padding_mask: torch.Tensor | None, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """Additive causal mask `(B|1, 1, q, past_seen + q)` of GLIDE's own self-attention, or `None` when a single
    unpadded query may see everything (the fast path of every drafting step)."""
    if q_len == 1 and padding_mask is None:
        return None
    key_index = torch.arange(past_seen + q_len, device=device)
    allowed = (key_index[None, :] <= (past_seen + torch.arange(q_len, device=device))[:, None])[None]  # (1, q, kv)
    if padding_mask is not None:
        if padding_mask.shape[-1] != past_seen + q_len:
            raise ValueError(
                f"attention_mask covers {padding_mask.shape[-1]} tokens; it must cover the cached and new tokens "
                f"({past_seen + q_len})"
            )
        allowed = allowed & padding_mask[:, None, :].to(device).bool()
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def draft_vocab_rows(config: GlideConfig) -> int:
    """Rows of the embedding and LM head: the full vocabulary, or the reduced one plus a row for all other ids."""
    return config.vocab_size if config.draft_token_ids is None else len(config.draft_token_ids) + 1


class GlideCrossAttention(nn.Module):
    """The glimpse (GLIDE §4.1): ``Q^{m,j} = H^m W_j`` to the target's ``h`` query heads of size ``d_k``, then
    ``softmax(Q K^T / sqrt(d_k)) V`` over one target layer's cached K/V (GQA via ``repeat_kv``) and ``W^O``; no key or
    value projections. Under tensor parallelism each rank's query heads read its own cache shard."""

    def __init__(self, config: GlideConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.target_layer_idx = config.target_layer_ids[layer_idx]
        self.head_dim = config.target_head_dim
        self.num_key_value_groups = config.target_num_attention_heads // config.target_num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        width = config.target_num_attention_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=config.attention_bias)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.attention_bias)
        # Gemma 4's assistant attention: each query head RMS-normed, its weight the only scale
        if not config.self_attention:
            self.q_norm = LlamaRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.scaling = 1.0

    def forward(
        self,
        hidden_states: torch.Tensor,
        target_past_key_values,
        kv_heads: int,
        target_position_embeddings: tuple[torch.Tensor, torch.Tensor],
        query_index: torch.Tensor,
        block_size: int | None = None,
        padding_mask: torch.Tensor | None = None,
        target_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``hidden_states`` `(B, q, hidden)` -> `(B, q, hidden)`; zeros when the target cache is absent or empty.
        ``kv_heads``: [`read_target_layer`]'s. ``target_attention_mask`` `(B, 1, q, S)` (additive, batched drafting)
        replaces the rule ``k < j``."""
        target_kv = None
        if target_past_key_values is not None:
            target_kv = read_target_layer(target_past_key_values, self.target_layer_idx, self.config, kv_heads)
        if target_kv is None:
            return torch.zeros_like(hidden_states)
        keys, values, offset = target_kv
        batch, q_len, _ = hidden_states.shape
        query = self.q_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        if hasattr(self, "q_norm"):
            query = self.q_norm(query)
        query = query.transpose(1, 2)  # (B, this rank's heads, q, d_k)
        cos, sin = target_position_embeddings  # (B, q, d_k): the target's RoPE at the queries' absolute positions
        query = query * cos.unsqueeze(1) + rotate_half(query) * sin.unsqueeze(1)
        if keys.shape[0] not in (1, batch):
            raise ValueError(f"target_past_key_values has batch size {keys.shape[0]} but the draft input has {batch}")
        keys, values = (t.to(device=query.device, dtype=query.dtype).expand(batch, -1, -1, -1) for t in (keys, values))
        if target_attention_mask is not None:
            mask = target_attention_mask.to(query.dtype)
            visible = (mask > torch.finfo(mask.dtype).min / 2).any(-1)[:, 0, :, None].to(query.dtype)
        else:
            key_index = torch.arange(keys.shape[-2], device=query.device) + offset
            mask, visible = cross_attention_mask(query_index, key_index, block_size, query.dtype, padding_mask)
        dropout = self.config.attention_dropout if self.training else 0.0
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation or "eager", eager_attention_forward
        )
        output, _ = attention(self, query, keys, values, mask, dropout=dropout, scaling=self.scaling)
        return self.o_proj(output.reshape(batch, q_len, -1)) * visible


class GlideDecoderLayer(GradientCheckpointingLayer):
    """Self-attention → cross-attention to the target KV (absent in the vanilla drafter) → MLP, pre-norm residuals.
    Without self-attention it is Gemma 4's assistant layer: RMS-normed query heads, a norm after each sub-layer."""

    def __init__(self, config: GlideConfig, layer_idx: int):
        super().__init__()
        if config.self_attention:
            self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.self_attn = LlamaAttention(config=config, layer_idx=layer_idx)
        if config.cross_attention:
            self.cross_attn_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.cross_attn = GlideCrossAttention(config, layer_idx)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        if not config.self_attention:  # Gemma 4's sandwich norms
            if config.cross_attention:
                self.post_cross_attn_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.post_feedforward_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cache: Cache | None = None,
        **glimpse,
    ) -> torch.Tensor:
        """``glimpse``: the keyword arguments of :meth:`GlideCrossAttention.forward` after ``hidden_states``."""
        if hasattr(self, "self_attn"):
            attended, _ = self.self_attn(
                self.input_layernorm(hidden_states),
                position_embeddings=position_embeddings,
                attention_mask=attention_mask,
                **{ATTENTION_CACHE_ARGUMENT: cache},
            )
            hidden_states = hidden_states + attended
        if hasattr(self, "cross_attn"):
            glimpsed = self.cross_attn(self.cross_attn_layernorm(hidden_states), **glimpse)
            if hasattr(self, "post_cross_attn_layernorm"):
                glimpsed = self.post_cross_attn_layernorm(glimpsed)
            hidden_states = hidden_states + glimpsed
        fed = self.mlp(self.post_attention_layernorm(hidden_states))
        if hasattr(self, "post_feedforward_layernorm"):
            fed = self.post_feedforward_layernorm(fed)
        return hidden_states + fed


class GlidePreTrainedModel(PreTrainedModel):
    config_class = GlideConfig
    config: GlideConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["GlideDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache", "target_past_key_values"]
    # no flash or flex attention (transformers' default): the cross-attention needs an arbitrary mask over target keys
    _supports_sdpa = True

    @classmethod
    def maybe_distribute_model(cls, model, distributed_config, mesh_manager):
        """``from_pretrained(..., tp_plan="auto")``: refuse, before any weight is read, a GLIDE whose heads cannot be
        split over the tensor-parallel ranks like its target's (:meth:`GlideConfig.check_tensor_parallel`)."""
        if mesh_manager is not None and distributed_config is not None and (distributed_config.tp_size or 1) > 1:
            model.config.check_tensor_parallel(distributed_config.tp_size)
        return super().maybe_distribute_model(model, distributed_config, mesh_manager)


class GlideModel(GlidePreTrainedModel):
    """The GLIDE decoder stack (no LM head)."""

    def __init__(self, config: GlideConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id if config.draft_token_ids is None else None
        self.embed_tokens = nn.Embedding(draft_vocab_rows(config), config.hidden_size, self.padding_idx)
        # target id -> draft row; ids outside the draft vocabulary share the last row
        if config.draft_token_ids is not None:
            to_draft = torch.full((config.vocab_size,), len(config.draft_token_ids), dtype=torch.long)
            to_draft[torch.tensor(config.draft_token_ids)] = torch.arange(len(config.draft_token_ids))
            # saved: from_pretrained builds modules on the meta device
            self.register_buffer("target_to_draft", to_draft)
        if config.state_input:  # Gemma 4's assistant / EAGLE: [embedding ; state] in, the next step's state out
            self.pre_projection = nn.Linear(
                config.hidden_size + config.target_hidden_size, config.hidden_size, bias=False
            )
            self.post_projection = nn.Linear(config.hidden_size, config.target_hidden_size, bias=False)
        self.layers = nn.ModuleList([GlideDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        if config.cross_attention:  # the target's RoPE, which rotated its cached keys (only these settings enter)
            names = ("hidden_size", "num_attention_heads", "head_dim", "max_position_embeddings")
            rotary = LlamaConfig(
                rope_parameters=dict(config.target_rope_parameters),
                **{n: getattr(config, f"target_{n}") for n in names},
            )
            self.target_rotary_emb = LlamaRotaryEmbedding(config=rotary)
        self.post_init()

    @property
    def kv_heads_per_rank(self) -> int:
        """The target KV heads the cross-attentions read on this rank: all, or under tensor parallelism their ``q_proj``
        shard's."""
        if not self.config.cross_attention:
            return self.config.target_num_key_value_heads
        cross = self.layers[0].cross_attn
        weight = cross.q_proj.weight
        rows = weight.to_local().shape[0] if hasattr(weight, "to_local") else weight.shape[0]  # a DTensor's local shard
        return rows // (cross.head_dim * cross.num_key_value_groups)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        target_past_key_values=None,
        cross_attention_block_size: int | None = None,
        target_attention_mask: torch.Tensor | None = None,
        target_hidden_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """
        Args:
            input_ids (`torch.LongTensor` of shape `(B, q)`): tokens at sequence indices ``past .. past+q-1``.
            attention_mask (`torch.Tensor` of shape `(B, past+q)`, *optional*): 2D padding mask (or a prepared 4D one).
            position_ids (`torch.LongTensor` of shape `(B, q)`, *optional*): RoPE positions (``past + arange(q)``).
            past_key_values (`Cache`, *optional*): GLIDE's own self-attention cache (also taken as ``cache``).
            target_past_key_values (*optional*): the target's cache ([`read_target_layer`]); `None`: nothing to glimpse.
            cross_attention_block_size (`int`, *optional*): training only: the block-wise mask's L (§4.1).
            target_attention_mask (`torch.Tensor` of shape `(B, 1, q, S)`, *optional*): additive mask of the target keys
                each query glimpses, given outright.
            target_hidden_states (`torch.Tensor` of shape `(B, q, target_hidden_size)`): with ``state_input`` only: the
                target's last hidden state before each token (zeros before the first), or ``GlideOutput.draft_state``.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            rows = input_ids if self.config.draft_token_ids is None else self.target_to_draft[input_ids]
            inputs_embeds = self.embed_tokens(rows)
        if self.config.state_input:
            expected = (*inputs_embeds.shape[:2], self.config.target_hidden_size)
            got = None if target_hidden_states is None else tuple(target_hidden_states.shape)
            if got != expected:
                raise ValueError(
                    f"target_hidden_states must be {expected} (batch, tokens, target_hidden_size) for a GLIDE built "
                    f"with state_input=True, got {got}: hf_specdraft's speculative_generate(target, ids, "
                    "draft_model=glide) hands the target's state over; transformers' assisted decoding cannot"
                )
            states = target_hidden_states.to(device=inputs_embeds.device, dtype=inputs_embeds.dtype)
            inputs_embeds = self.pre_projection(torch.cat([inputs_embeds, states], dim=-1))
        elif target_hidden_states is not None:
            raise ValueError("target_hidden_states is read only by a GLIDE built with state_input=True")
        past_key_values = passed_cache(past_key_values, cache)
        if use_cache and past_key_values is None and self.config.self_attention:
            past_key_values = DynamicCache(config=self.config)
        past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        query_index = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen
        if not self.config.self_attention and position_ids is not None:
            # Gemma 4's assistant layout: a query stands at the position of the target state it reads, and sees the
            # target's keys up to and including it
            query_index = position_ids[0] + 1
        if position_ids is None:
            position_ids = query_index[None]
        padding_mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
        if padding_mask is not None and bool(padding_mask.bool().all()):
            padding_mask = None  # no padding: the plain causal mask (and the mask-free single-query path) applies
        causal_mask = attention_mask if attention_mask is not None and attention_mask.dim() == 4 else None
        if self.config.self_attention and causal_mask is None:
            causal_mask = self_attention_mask(
                past_seen, inputs_embeds.shape[1], padding_mask, inputs_embeds.dtype, inputs_embeds.device
            )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)
        glimpse = {}
        if self.config.cross_attention:
            glimpse = dict(
                target_past_key_values=target_past_key_values,
                kv_heads=self.kv_heads_per_rank,
                target_position_embeddings=self.target_rotary_emb(hidden_states, position_ids),
                query_index=query_index,
                block_size=cross_attention_block_size,
                padding_mask=padding_mask,
                target_attention_mask=target_attention_mask,
            )
        for layer in self.layers:
            # the cache by name: gradient checkpointing drops it (GradientCheckpointingLayer)
            hidden_states = layer(hidden_states, causal_mask, position_embeddings, cache=past_key_values, **glimpse)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden_states), **{OUTPUT_CACHE_FIELD: past_key_values}
        )


@dataclass
class GlideOutput(CausalLMOutputWithPast):
    """[`CausalLMOutputWithPast`] plus, for a ``state_input`` GLIDE, ``draft_state`` `(B, q, target_hidden_size)`: the
    state its next draft step reads (``post_projection`` of the last hidden state, at every position kept)."""

    draft_state: torch.Tensor | None = None


class GlideForCausalLM(TargetBindingMixin, GlidePreTrainedModel, GenerationMixin):
    """GLIDE with an LM head: drafts in stock assisted decoding once bound with :meth:`attach`, or through
    hf_specdraft's ``GlideCandidateGenerator``, which hands it the target cache explicitly."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}  # tensor parallelism: every rank gets the whole logits, as Llama's

    def __init__(self, config: GlideConfig):
        super().__init__(config)
        self.model = GlideModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, draft_vocab_rows(config), bias=False)
        if config.draft_token_ids is not None:
            self.register_buffer("draft_token_ids", torch.tensor(config.draft_token_ids, dtype=torch.long))
        if config.copy_table_size:  # what followed each short context in the target's text (copied from, not run)
            self.register_buffer("copy_table_keys", torch.zeros(config.copy_table_size, dtype=torch.long))
            self.register_buffer("copy_table_tokens", torch.zeros(config.copy_table_size, dtype=torch.int32))
        self.post_init()
        if self.generation_config is not None:  # §5.1: γ = 5, fixed, every step (stock assisted decoding reads these)
            self.generation_config.num_assistant_tokens = 5
            self.generation_config.num_assistant_tokens_schedule = "constant"
            self.generation_config.assistant_confidence_threshold = 0.0

    def to_target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """`(..., draft rows)` logits of a reduced draft vocabulary -> `(..., vocab_size)`: the target's ids, with
        every id GLIDE cannot propose at the dtype's minimum (its probability is exactly 0). Identity without one."""
        if self.config.draft_token_ids is None:
            return draft_logits
        full = draft_logits.new_full(
            (*draft_logits.shape[:-1], self.config.vocab_size), torch.finfo(draft_logits.dtype).min
        )
        return full.index_copy_(-1, self.draft_token_ids, draft_logits[..., : self.draft_token_ids.numel()])

    def check_target(self, target) -> None:
        """Raise `ValueError` unless ``target`` (a model or its config) is the kind of target GLIDE was built for."""
        problems = self.config.target_mismatches(getattr(target, "config", target))
        if problems:
            name = f" ({self.config.target_name_or_path})" if self.config.target_name_or_path else ""
            raise ValueError(
                f"the target given is not the target this GLIDE was built for{name}:\n  " + "\n  ".join(problems)
            )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        target_past_key_values=None,
        cross_attention_block_size: int | None = None,
        target_attention_mask: torch.Tensor | None = None,
        draft_rows: bool = False,
        target_hidden_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> GlideOutput:
        """
        Args (the others as [`GlideModel.forward`]; ``target_past_key_values`` defaults to the attached target's cache):
            labels (`torch.LongTensor` of shape `(B, q)`, *optional*): next-token targets (shifted inside; -100: none).
            logits_to_keep (`int`, *optional*): compute logits for the last ``logits_to_keep`` positions only (0: all).
            draft_rows (`bool`, *optional*): logits over GLIDE's own output rows (a reduced vocabulary's ids, then
                "another token"), as training scores them; no ``labels``.

        Returns:
            [`GlideOutput`]: ``logits`` `(B, q or logits_to_keep, vocab or rows)`, ``draft_state`` at those positions.
        """
        if draft_rows and labels is not None:
            raise ValueError("labels score logits over the target's vocabulary: leave draft_rows=False to pass them")
        use_cache = use_cache if use_cache is not None else self.config.use_cache and not self.training
        outputs = self.model(
            input_ids,
            attention_mask,
            position_ids,
            passed_cache(past_key_values, cache),
            inputs_embeds,
            use_cache,
            self._attached_cache(target_past_key_values),
            cross_attention_block_size,
            target_attention_mask,
            target_hidden_states,
        )
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep  # 0: all
        hidden_states = outputs.last_hidden_state[:, kept]
        logits = self.lm_head(hidden_states)
        logits = logits if draft_rows else self.to_target_logits(logits)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        draft_state = self.model.post_projection(hidden_states) if self.config.state_input else None
        return GlideOutput(
            loss=loss, logits=logits, draft_state=draft_state, **{OUTPUT_CACHE_FIELD: outputs.get(OUTPUT_CACHE_FIELD)}
        )


GlideForCausalLM.register_for_auto_class("AutoModelForCausalLM")  # save_pretrained writes auto_map and copies this file

__all__ = [
    "GlideCrossAttention",
    "GlideDecoderLayer",
    "GlideForCausalLM",
    "GlideModel",
    "GlideOutput",
    "GlidePreTrainedModel",
]
