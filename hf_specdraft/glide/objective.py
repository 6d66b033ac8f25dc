"""GLIDE's training objective (GLIDE §4.1 "Block-wise Attention Mask", Appendix B): the data as a token stream, random
windows of it, the frozen target's KV cache over a window, and the draft's loss against it.

p is the target's next-token distribution, q GLIDE's (Leviathan et al. 2023, Algorithm 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel


def token_stream(data, eos_token_id: int | None = None) -> torch.Tensor:
    """Training data as one 1-D LongTensor of token ids (documents joined by eos when there is one).

    Args:
        data: a 1-D tensor (already a stream), a 2-D tensor `(N, T)` (rows joined), a sequence of token-id
            sequences, or a mapping / 🤗 ``datasets.Dataset`` with an ``"input_ids"`` column.
    """
    if not isinstance(data, torch.Tensor) and hasattr(data, "__getitem__") and not isinstance(data, Sequence):
        try:
            data = data["input_ids"]
        except (KeyError, TypeError, IndexError) as error:
            raise TypeError(f"data has no 'input_ids' column: {error}") from error
    if isinstance(data, torch.Tensor):
        if data.dim() not in (1, 2) or data.is_floating_point():
            raise ValueError(f"data must be an integer tensor of shape (T,) or (N, T), got {data.dtype} {tuple(data.shape)}")
        return data.reshape(-1).long()
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        pieces = []
        for document in data:
            pieces.append(torch.as_tensor(list(document), dtype=torch.long))
            if eos_token_id is not None:
                pieces.append(torch.tensor([eos_token_id]))
        if not pieces:
            raise ValueError("data is empty")
        return torch.cat(pieces)
    raise TypeError(f"data must be a token-id tensor, a sequence of token-id sequences or a dataset with input_ids, got {type(data).__name__}")


def sample_windows(stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """``(batch_size, seq_len)`` random windows of ``stream``."""
    starts = torch.randint(0, stream.numel() - seq_len + 1, (batch_size,), generator=generator)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


@torch.no_grad()
def target_memory(target: PreTrainedModel, input_ids: torch.Tensor, with_logits: bool):
    """Run the frozen target over whole windows: its per-layer ``(keys, values)`` and, optionally, logits.

    Returns:
        `(kv, logits)`: ``kv[l]`` = ``(keys, values)`` `(B, kv_heads, T, head_dim)` of target layer l (post-RoPE,
        exactly what the cache holds at inference), and `(B, T, V)` logits or `None`.
    """
    cache = DynamicCache(config=target.config)
    cache.activate_past_recording()  # sliding-window layers keep every position, as in assisted decoding
    outputs = target(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=0 if with_logits else 1)
    kv = tuple((getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in cache.layers)
    return kv, outputs.logits if with_logits else None


def glide_loss(glide, input_ids, kv, target_logits, block_size: int, args) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy with the block-wise mask (§4.1), mixed with token-level distillation (Appendix B).

    ``args`` holds ``distillation_weight`` and ``distillation_temperature`` (a :class:`GlideTrainingArguments`).
    A GLIDE with a reduced vocabulary (``draft_token_ids``) is trained over its own rows: every target id outside it is
    its last row ("another token"), for the labels and for p (its probability mass summed there). Its logits over the
    target's vocabulary put the dtype's minimum on those ids, which a loss over target ids would turn into ~1e38.
    """
    draft_ids = getattr(glide.config, "draft_token_ids", None)
    hidden = glide.model(input_ids=input_ids, target_past_key_values=kv, cross_attention_block_size=block_size,
                         use_cache=False).last_hidden_state
    logits = glide.lm_head(hidden)[:, :-1].float()  # (B, T - 1, rows): the draft's own rows
    labels = input_ids[:, 1:] if draft_ids is None else glide.model.target_to_draft[input_ids[:, 1:]]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    parts = {"ce": ce.detach()}
    if target_logits is None:
        return ce, parts
    tau = args.distillation_temperature
    log_q = torch.log_softmax(logits / tau, dim=-1)
    p = torch.softmax(target_logits[:, :-1].float() / tau, dim=-1)
    if draft_ids is not None:  # p over the draft's rows: its ids, then everything else in the last row
        kept = p[..., glide.draft_token_ids]
        p = torch.cat([kept, (1 - kept.sum(-1, keepdim=True)).clamp_min(0)], dim=-1)
    kl = (torch.xlogy(p, p) - p * log_q).sum(-1).mean() * tau**2
    parts["kl"] = kl.detach()
    w = args.distillation_weight
    return (1 - w) * ce + w * kl, parts
