"""GLIDE's training objective (GLIDE §4.1 "Block-wise Attention Mask", Appendix B): windows of tokens, what the frozen
target says about them (its KV cache, p) and the draft's loss against it. p is the target's next-token distribution, q
GLIDE's (Leviathan et al. 2023, Algorithm 1). A :class:`WindowSource` says where the target's side comes from:
:class:`TargetWindows` runs the target over each batch, :class:`~.store.StoreWindows` reads a precomputed store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from accelerate.utils import extract_model_from_parallel
from transformers import DynamicCache, PreTrainedModel

from ...core.support import with_cache
from .unrolled import unrolled_passes


@dataclass
class GlideBatch:
    """One batch of windows and what the frozen target says about them: position t holds p for the token after
    ``input_ids[:, t]``, whole (``target_logits``, on the fly) or as its top k (from a store)."""

    input_ids: torch.Tensor  # (B, T) the windows
    # per target layer (keys, values) (B, kv_heads, T, head_dim), post-RoPE ((None, None) for a layer no one reads);
    # None when nobody glimpses
    target_past_key_values: Sequence | None = None
    target_logits: torch.Tensor | None = None  # (B, T, V) the target's next-token logits
    topk_ids: torch.Tensor | None = None  # (B, T, k) the target's k most likely next tokens, most likely first
    topk_probs: torch.Tensor | None = None  # (B, T, k) their probabilities under p
    target_hidden: torch.Tensor | None = None  # (B, T, hidden_size) the target's last hidden state (after its norm)


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
            raise ValueError(
                f"data must be an integer tensor of shape (T,) or (N, T), got {data.dtype} {tuple(data.shape)}"
            )
        return data.reshape(-1).long()
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        eos = [] if eos_token_id is None else [eos_token_id]
        pieces = [torch.as_tensor([*map(int, document), *eos], dtype=torch.long) for document in data]
        if not pieces:
            raise ValueError("data is empty")
        return torch.cat(pieces)
    raise TypeError(
        "data must be a token-id tensor, a sequence of token-id sequences or a dataset with input_ids, got "
        f"{type(data).__name__}"
    )


@torch.no_grad()
def target_memory(target: PreTrainedModel, input_ids: torch.Tensor, with_logits: bool, with_hidden: bool = False):
    """Run the frozen target over whole windows `(B, T)`: `(kv, logits, hidden)`, with ``kv[l]`` = ``(keys, values)``
    `(B, kv_heads, T, head_dim)` of target layer l (post-RoPE, as the cache holds them), logits `(B, T, V)` and the last
    hidden state `(B, T, hidden_size)` (after the final norm), the last two `None` unless asked for."""
    cache = DynamicCache(config=target.config)
    cache.activate_past_recording()  # sliding-window layers keep every position, as in assisted decoding
    outputs = target(
        input_ids=input_ids,
        **with_cache(target, cache),
        use_cache=True,
        logits_to_keep=0 if with_logits else 1,
        **({"output_hidden_states": [-1]} if with_hidden else {}),
    )
    kv = tuple((getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in cache.layers)
    return kv, outputs.logits if with_logits else None, outputs.hidden_states[-1] if with_hidden else None


class WindowSource:
    """Numbered windows of ``seq_len`` tokens (cut from ``tokens`` tokens) and what the frozen target says about them.

    ``len(source)`` rows (training draws them uniformly); ``check(glide)`` raises `ValueError` for data ``glide``
    cannot train on; ``batch(target, glide, rows, device, with_kv, with_p)`` is a :class:`GlideBatch` of rows `(B,)`,
    with the target's KV of the layers ``glide`` reads (``with_kv``) and p (``with_p``).
    """

    seq_len: int
    tokens: int


class TargetWindows(WindowSource):
    """Windows of a token stream whose target side the frozen target computes batch by batch: row i is
    ``stream[i * stride : i * stride + seq_len]``, every offset in training (``stride=1``), non-overlapping windows for
    held-out scoring (``stride=seq_len``)."""

    def __init__(self, stream: torch.Tensor, seq_len: int, stride: int = 1):
        self.stream, self.seq_len, self.stride = token_stream(stream), seq_len, stride
        self.tokens = self.stream.numel()

    def __len__(self) -> int:
        return max(0, (self.tokens - self.seq_len) // self.stride + 1)

    def check(self, glide) -> None:
        if self.tokens < self.seq_len:
            raise ValueError(f"data holds {self.tokens} tokens, fewer than seq_len={self.seq_len}")
        if int(self.stream.max()) >= glide.config.vocab_size or int(self.stream.min()) < 0:
            raise ValueError(f"data has token ids outside the target's vocabulary [0, {glide.config.vocab_size})")

    def batch(self, target, glide, rows: torch.Tensor, device, with_kv: bool, with_p: bool) -> GlideBatch:
        starts = rows[:, None] * self.stride + torch.arange(self.seq_len)
        input_ids = self.stream[starts].to(device)  # (B, T)
        state = bool(glide.config.state_input)
        if not (with_kv or with_p or state):
            return GlideBatch(input_ids)
        kv, logits, hidden = target_memory(target, input_ids, with_p, with_hidden=state)
        return GlideBatch(input_ids, kv if with_kv else None, logits, target_hidden=hidden)


def window_source(data, glide, seq_len: int) -> WindowSource:
    """``data`` as a checked window source: token ids (:func:`token_stream`'s kinds) become :class:`TargetWindows` of
    ``seq_len``; a source is taken as it is."""
    if not isinstance(data, WindowSource):
        eos = glide.config.eos_token_id if isinstance(glide.config.eos_token_id, int) else None
        data = TargetWindows(token_stream(data, eos), seq_len)
    elif data.seq_len != seq_len:
        raise ValueError(
            f"seq_len={seq_len} but the data's windows hold {data.seq_len} tokens: set seq_len={data.seq_len}"
        )
    data.check(glide)
    return data


def _draft_rows(glide, target_ids: torch.Tensor) -> torch.Tensor:
    """Target ids -> GLIDE's output rows: themselves, or for a reduced vocabulary their row (the last: any other id)."""
    return target_ids if glide.config.draft_token_ids is None else glide.model.target_to_draft[target_ids]


def target_probs(glide, batch: GlideBatch, temperature: float = 1.0) -> torch.Tensor | None:
    """p at ``temperature`` over GLIDE's output rows `(B, T, rows)`, or `None` when the batch has no p.

    From the top k: ``softmax(log p_topk / τ)``, the logits' p when k is the whole vocabulary. A reduced-vocabulary
    GLIDE's last row takes the mass of every id outside its vocabulary.
    """
    if batch.target_logits is not None:
        p = torch.softmax(batch.target_logits.float() / temperature, dim=-1)  # (B, T, V)
        if glide.config.draft_token_ids is None:
            return p
        rows = p.new_zeros(*p.shape[:-1], glide.lm_head.out_features)
        return rows.index_add_(-1, glide.model.target_to_draft, p)
    if batch.topk_ids is None:
        return None
    p = torch.softmax(batch.topk_probs.float().log() / temperature, dim=-1)  # (B, T, k), renormalised over the k
    rows = p.new_zeros(*p.shape[:-1], glide.lm_head.out_features)
    return rows.scatter_add_(-1, _draft_rows(glide, batch.topk_ids.long()), p)


def draft_passes(model, batch: GlideBatch, block_size: int, steps: int = 1):
    """:func:`~.unrolled.unrolled_passes`' ``(k, logits (B, T, rows), valid (T,))``; a one-step GLIDE without
    ``state_input`` runs one forward with the block-wise mask of L = ``block_size`` (§4.1), valid everywhere."""
    if extract_model_from_parallel(model).config.state_input or steps > 1:
        return unrolled_passes(model, batch, steps)
    logits = model(
        input_ids=batch.input_ids,
        target_past_key_values=batch.target_past_key_values,
        cross_attention_block_size=block_size,
        use_cache=False,
        draft_rows=True,
    ).logits
    return [(1, logits, torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device))]


def glide_loss(model, batch: GlideBatch, block_size: int, args) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy with the block-wise mask (§4.1), mixed with token-level distillation (Appendix B):
    ``(1 - w) · CE(labels, q) + w · τ² · KL(p || q)`` with ``w``, ``τ`` the distillation weight and temperature.

    Unrolled draft steps (:mod:`.unrolled`) average their losses. A reduced-vocabulary GLIDE trains over its own rows:
    its logits over target ids put the dtype's minimum outside them, which a loss would turn into ~1e38. ``model`` may
    be GLIDE as accelerate prepared it (its own forward runs, for autocast and gradient synchronisation).
    """
    glide = extract_model_from_parallel(model)
    steps = args.unrolled_steps or (2 if glide.config.state_input else 1)
    passes = draft_passes(model, batch, block_size, steps)
    tau, w = args.distillation_temperature, args.distillation_weight
    p = target_probs(glide, batch, tau) if w > 0 else None
    labels = _draft_rows(glide, batch.input_ids[:, 1:])
    total, parts = 0.0, {}
    for k, logits, valid in passes:
        logits = logits.float()
        suffix = "" if steps == 1 else f"_{k}"
        scored = valid[:-1]  # the last position has no label in the window
        ce = torch.nn.functional.cross_entropy(
            logits[:, :-1][:, scored].reshape(-1, logits.shape[-1]), labels[:, scored].reshape(-1)
        )
        parts["ce" + suffix] = ce.detach()
        if p is None:
            total = total + ce
            continue
        log_q = torch.log_softmax(logits[:, valid] / tau, dim=-1)
        kl = (torch.xlogy(p[:, valid], p[:, valid]) - p[:, valid] * log_q).sum(-1).mean() * tau**2
        parts["kl" + suffix] = kl.detach()
        total = total + (1 - w) * ce + w * kl
    return total / steps, parts
