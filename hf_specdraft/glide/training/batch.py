"""One batch of training or held-out windows and what the frozen target says about them (:class:`GlideBatch`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class GlideBatch:
    """One batch as the loss and the held-out scorer read it: the windows and what the frozen target says about them.

    p is given either whole (``target_logits``, computed on the fly) or as its top k (``topk_ids`` / ``topk_probs``,
    read from a store); position t of each holds p for the token after ``input_ids[:, t]``.

    Args:
        input_ids: `(B, T)` the windows.
        target_past_key_values: per target layer ``(keys, values)`` `(B, kv_heads, T, head_dim)` (post-RoPE; ``(None,
            None)`` for a layer no one reads), or `None` when nobody glimpses (a vanilla drafter).
        target_logits: `(B, T, V)` the target's next-token logits, or `None`.
        topk_ids: `(B, T, k)` the target's k most likely next tokens, most likely first, or `None`.
        topk_probs: `(B, T, k)` their probabilities under p, or `None`.
        target_hidden: `(B, T, hidden_size)` the target's last hidden state (after its final norm), or `None` (read by a
            ``state_input`` GLIDE only).
    """

    input_ids: torch.Tensor
    target_past_key_values: Sequence | None = None
    target_logits: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_probs: torch.Tensor | None = None
    target_hidden: torch.Tensor | None = None
