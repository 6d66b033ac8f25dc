"""The output projection of a few-token forward on CPU, computed the way the CPU BLAS does it fast.

Verification runs the target over ``1 + N`` tokens (N ≈ 2–16). On CPU the vocabulary projection of those
few rows, ``linear(h, W)`` with ``h`` `(M, d)` and ``W`` `(V, d)`, takes MKL's small-M GEMM path, which
for a large vocabulary is 2–4× slower than the same product written as ``W @ h.T``: measured on the 2-core
CI machine for SmolLM2's head (V = 49,152, d = 576), fp32, torch 2.13 (median µs of 30 calls)::

    M                  1      2      3      6      8     16
    linear(h, W)    10.4   23.4   34.7   35.1   24.6   26.1   ms
    W @ h.T         10.3    7.7   10.8    8.4    9.4   17.2   ms

On the default target that is a third of a 6-token verification forward (`python -m
hf_specdraft.bench.projection`). :func:`few_token_projection` swaps the output embedding's forward
for the transposed product while the loop runs, through the model's own forward (so soft-capping,
logit scales and ``logits_to_keep`` still apply), for CPU ``nn.Linear`` heads only and for more than
one row; a one-row forward (and every GPU) keeps ``linear``. Both are fp32 dot products of the same
numbers; only the summation blocking differs (≤ 1e-4 on the default's logits), as it already does between
a 1-row and a 6-row ``linear``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def _transposed_linear(module: nn.Linear, original):
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.numel() // max(hidden_states.shape[-1], 1)
        if hidden_states.dim() < 2 or rows <= 1 or hidden_states.requires_grad or module.weight.requires_grad and torch.is_grad_enabled():
            return original(hidden_states)
        flat = hidden_states.reshape(rows, hidden_states.shape[-1])  # (M, d)
        logits = torch.matmul(module.weight, flat.T).T  # (M, V): the BLAS' fast orientation for small M
        if module.bias is not None:
            logits = logits + module.bias
        return logits.reshape(*hidden_states.shape[:-1], logits.shape[-1])

    return forward


@contextlib.contextmanager
def few_token_projection(model: nn.Module) -> Iterator[bool]:
    """Compute ``model``'s output projection as ``W @ h.T`` for multi-row forwards inside the block.

    Applies only where it pays and cannot change which module runs: the output embedding is a plain
    ``nn.Linear`` on CPU whose forward nobody has wrapped (no accelerate hook, no quantized layer). Yields
    whether it applied. Restores the module's own forward on exit, also on error.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    applies = (type(head) is nn.Linear and head.weight.device.type == "cpu" and "forward" not in vars(head)
               and not hasattr(head, "_hf_hook") and head.weight.dtype in (torch.float32, torch.float64))
    if not applies:
        yield False
        return
    head.forward = _transposed_linear(head, head.forward)
    try:
        yield True
    finally:
        del head.forward
