"""GLIDE's training objective (GLIDE §4.1 "Block-wise Attention Mask", Appendix B): the data as windows of tokens, what
the frozen target says about them (its KV cache, its next-token distribution), and the draft's loss against it.

p is the target's next-token distribution, q GLIDE's (Leviathan et al. 2023, Algorithm 1).

What the target says comes from a :class:`WindowSource`, so that :func:`~.trainer.train_glide` and
:func:`~.evaluation.teacher_forced_alpha` read either one alike:

    TargetWindows   windows of a token stream; the frozen target runs over each batch (KV + full logits)
    StoreWindows    windows of a precomputed store (store.py): the target's KV and top-k, read, never recomputed
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from accelerate.utils import extract_model_from_parallel
from transformers import DynamicCache, PreTrainedModel

from ...core.support import with_cache
from .batch import GlideBatch
from .unrolled import unrolled_passes

__all__ = [
    "GlideBatch",
    "TargetWindows",
    "WindowSource",
    "glide_loss",
    "target_memory",
    "target_probs",
    "token_stream",
    "window_source",
]


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
        pieces = []
        for document in data:
            pieces.append(torch.as_tensor(list(document), dtype=torch.long))
            if eos_token_id is not None:
                pieces.append(torch.tensor([eos_token_id]))
        if not pieces:
            raise ValueError("data is empty")
        return torch.cat(pieces)
    raise TypeError(
        "data must be a token-id tensor, a sequence of token-id sequences or a dataset with input_ids, got "
        f"{type(data).__name__}"
    )


@torch.no_grad()
def target_memory(target: PreTrainedModel, input_ids: torch.Tensor, with_logits: bool, with_hidden: bool = False):
    """Run the frozen target over whole windows: its per-layer ``(keys, values)`` and, optionally, logits and its last
    hidden state.

    Returns:
        `(kv, logits)`: ``kv[l]`` = ``(keys, values)`` `(B, kv_heads, T, head_dim)` of target layer l (post-RoPE,
        exactly what the cache holds at inference), and `(B, T, V)` logits or `None`; with ``with_hidden``,
        `(kv, logits, hidden)` with ``hidden`` `(B, T, hidden_size)` the target's last hidden state (after its final
        norm: what its LM head reads, ``hidden_states[-1]``).
    """
    cache = DynamicCache(config=target.config)
    cache.activate_past_recording()  # sliding-window layers keep every position, as in assisted decoding
    extra = {"output_hidden_states": [-1]} if with_hidden else {}
    outputs = target(
        input_ids=input_ids,
        **with_cache(target, cache),
        use_cache=True,
        logits_to_keep=0 if with_logits else 1,
        **extra,
    )
    kv = tuple((getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in cache.layers)
    logits = outputs.logits if with_logits else None
    return (kv, logits, outputs.hidden_states[-1]) if with_hidden else (kv, logits)


class WindowSource:
    """Numbered windows and what the frozen target says about them, a batch of rows at a time.

    Attributes:
        seq_len: tokens per window.
        tokens: the tokens the windows are cut from (the training log's ``train_tokens_available``).
    """

    seq_len: int
    tokens: int

    def __len__(self) -> int:
        """How many rows there are (training draws rows uniformly)."""
        raise NotImplementedError

    def check(self, glide) -> None:
        """Raise `ValueError` for data ``glide`` cannot train on (before anything runs)."""
        raise NotImplementedError

    def batch(self, target, glide, rows: torch.Tensor, device, with_kv: bool, with_p: bool) -> GlideBatch:
        """Rows ``rows`` `(B,)` on ``device``, with the target's KV of the layers ``glide`` reads (``with_kv``) and p
        (``with_p``)."""
        raise NotImplementedError


class TargetWindows(WindowSource):
    """Windows of a token stream whose target side the frozen target computes on the fly, batch by batch.

    Row i is ``stream[i * stride : i * stride + seq_len]``: with ``stride=1`` (training) every offset is a row, so a
    random row is a random window; with ``stride=seq_len`` (held-out scoring) the rows are non-overlapping.
    """

    def __init__(self, stream: torch.Tensor, seq_len: int, stride: int = 1):
        self.stream, self.seq_len, self.stride = token_stream(stream), seq_len, stride
        self.tokens = self.stream.numel()

    def __len__(self) -> int:
        return max(0, (self.tokens - self.seq_len) // self.stride + 1)

    def check(self, glide) -> None:
        """Raise `ValueError` for a stream shorter than a window or holding ids outside GLIDE's target vocabulary."""
        if self.tokens < self.seq_len:
            raise ValueError(f"data holds {self.tokens} tokens, fewer than seq_len={self.seq_len}")
        if int(self.stream.max()) >= glide.config.vocab_size or int(self.stream.min()) < 0:
            raise ValueError(f"data has token ids outside the target's vocabulary [0, {glide.config.vocab_size})")

    def batch(self, target, glide, rows: torch.Tensor, device, with_kv: bool, with_p: bool) -> GlideBatch:
        """Rows ``rows`` `(B,)` on ``device``, the target run over them if GLIDE glimpses (``with_kv``) or learns p."""
        starts = rows[:, None] * self.stride + torch.arange(self.seq_len)
        input_ids = self.stream[starts].to(device)  # (B, T)
        state = bool(glide.config.state_input)
        if not (with_kv or with_p or state):
            return GlideBatch(input_ids)
        kv, logits, *hidden = target_memory(target, input_ids, with_p, with_hidden=state)
        return GlideBatch(input_ids, kv if with_kv else None, logits, target_hidden=hidden[0] if state else None)


def window_source(data, glide, seq_len: int) -> WindowSource:
    """``data`` as a checked window source: token ids (:func:`token_stream`'s kinds) become :class:`TargetWindows` of
    ``seq_len`` (the target runs every step); a source (:class:`~.store.StoreWindows`) is taken as it is, its windows
    ``seq_len`` long."""
    if isinstance(data, WindowSource):
        if data.seq_len != seq_len:
            raise ValueError(
                f"seq_len={seq_len} but the data's windows hold {data.seq_len} tokens: set seq_len={data.seq_len}"
            )
        source = data
    else:
        eos = glide.config.eos_token_id if isinstance(glide.config.eos_token_id, int) else None
        source = TargetWindows(token_stream(data, eos), seq_len)
    source.check(glide)
    return source


def _draft_rows(glide, target_ids: torch.Tensor) -> torch.Tensor:
    """Target ids -> GLIDE's output rows: themselves, or for a reduced vocabulary (``draft_token_ids``) their row, every
    id outside it the last row ("another token")."""
    return target_ids if glide.config.draft_token_ids is None else glide.model.target_to_draft[target_ids]


def target_probs(glide, batch: GlideBatch, temperature: float = 1.0) -> torch.Tensor | None:
    """p at ``temperature`` over GLIDE's output rows `(B, T, rows)`, or `None` when the batch has no p.

    From the target's logits, ``softmax(logits / τ)``; from its top k, their probabilities renormalised at τ
    (``softmax(log p_topk / τ)``, the same as the logits' when k is the whole vocabulary). A reduced-vocabulary GLIDE's
    last row takes the mass of every id outside its vocabulary.
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


def glide_loss(model, batch: GlideBatch, block_size: int, args) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy with the block-wise mask (§4.1), mixed with token-level distillation (Appendix B):
    ``(1 - w) · CE(labels, q) + w · τ² · KL(p || q)``, ``w = args.distillation_weight``, ``τ =
    args.distillation_temperature``, p whole or as its top k (:func:`target_probs`) at every position of the window
    (the labels stop one short). A ``state_input`` GLIDE (or ``args.unrolled_steps > 1``) trains over its draft steps
    unrolled (:mod:`.unrolled`), the loss the mean over the steps. A reduced-vocabulary GLIDE trains over its own rows
    (every id outside it is the last row, for the labels and p): its logits over target ids put the dtype's minimum
    there, which a loss would turn into ~1e38. ``model`` is GLIDE or GLIDE as accelerate prepared it (its own forward
    runs, for autocast and gradient synchronisation).
    """
    glide = extract_model_from_parallel(model)
    steps = args.draft_steps(glide.config)
    if glide.config.state_input or steps > 1:
        passes = unrolled_passes(model, batch, steps)
    else:
        logits = model(
            input_ids=batch.input_ids,
            target_past_key_values=batch.target_past_key_values,
            cross_attention_block_size=block_size,
            use_cache=False,
            draft_rows=True,
        ).logits  # (B, T, rows): the draft's own rows
        passes = [(1, logits, torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device))]
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
