"""The linear layers of a few-token forward on CPU, computed the way the CPU BLAS does them fast.

Verification runs the target over ``1 + N`` tokens (N ≈ 2–16). On CPU each ``linear(h, W)`` of those few
rows, ``h`` `(M, d_in)` and ``W`` `(d_out, d_in)`, takes MKL's small-M GEMM path, which is 1.5–4× slower
than the same product written as ``W @ h.T``. For the vocabulary projection of SmolLM2 (49,152 × 576),
fp32, torch 2.13, on the 2-core CI machine (median of 30 calls)::

    M                  1      2      3      6      8     16
    linear(h, W)    10.4   23.4   34.7   35.1   24.6   26.1   ms
    W @ h.T         10.3    7.7   10.8    8.4    9.4   17.2   ms

and for the 210 projections of its 30 decoder layers (q, k, v, o, gate, up, down; weights streamed from
memory, as in a forward; median of 7 passes)::

    M                  1      2      4      6      8     12
    linear(h, W)    56.0   87.9   97.4   80.8   79.7  101.6   ms
    W @ h.T         58.2   41.2   45.5   64.3   68.8   87.7   ms

A one-row ``linear`` is a matrix-vector product that streams each weight once; a few-row one should cost
about the same, and as ``W @ h.T`` it does. :func:`few_token_linears` swaps the forward of every plain CPU
``nn.Linear`` of a model for the transposed product while the loop runs (through the model's own forward,
so soft-capping, logit scales and ``logits_to_keep`` still apply); a one-row forward (and every GPU) keeps
``linear``. Both are fp32 dot products of the same numbers; only the summation blocking differs (≤ 1e-4 on
the default's logits), as it already does between a 1-row and a 6-row ``linear``.

A whole forward of the default target over n new tokens on a 96-token cache, relative to a one-token
forward (``python -m hf_specdraft.bench.projection``, median of 15, same machine)::

    n                        2      3      4      6      8     12     32
    model's own           1.65   2.05   1.96   1.83   1.85   1.97   2.61
    output projection     1.53   1.76   1.74   1.70   1.80   2.03   2.66
    every linear          0.96   1.21   1.07   1.39   1.49   1.88   2.30

A one-token ``linear`` runs on one core here (a matrix-vector product); two rows as ``W @ h.T`` use both,
which is why n = 2 costs less than n = 1.

This module imports torch only: :func:`hf_specdraft.cape.write_custom_generate` writes it, as it is, into the
``custom_generate/`` folder a checkpoint ships.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn


def _transposed_linear(module: nn.Linear, original):
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.numel() // max(hidden_states.shape[-1], 1)
        if hidden_states.dim() < 2 or rows <= 1 or hidden_states.requires_grad or (module.weight.requires_grad and torch.is_grad_enabled()):
            return original(hidden_states)
        flat = hidden_states.reshape(rows, hidden_states.shape[-1])  # (M, d_in)
        out = torch.matmul(module.weight, flat.T).T.contiguous()  # (M, d_out): the BLAS' fast orientation for small M; laid out as linear's
        if module.bias is not None:
            out = out + module.bias
        return out.reshape(*hidden_states.shape[:-1], out.shape[-1])

    return forward


def _swappable(module: nn.Module) -> bool:
    """A plain CPU float ``nn.Linear`` whose forward nobody has wrapped (no accelerate hook, no adapter, no quantized layer)."""
    return (type(module) is nn.Linear and module.weight.device.type == "cpu" and "forward" not in vars(module)
            and not hasattr(module, "_hf_hook") and module.weight.dtype in (torch.float32, torch.float64))


@contextlib.contextmanager
def _transposed(modules: Iterable[nn.Module]) -> Iterator[int]:
    swapped = [m for m in modules if _swappable(m)]
    for module in swapped:
        module.forward = _transposed_linear(module, module.forward)
    try:
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward


@contextlib.contextmanager
def few_token_linears(model: nn.Module) -> Iterator[int]:
    """Compute every plain CPU ``nn.Linear`` of ``model`` as ``W @ h.T`` for multi-row inputs inside the block.

    Applies only to modules where it cannot change which code runs (see the module docstring); others keep
    their forward. Yields how many modules it swapped (0 on GPU). Restores each module's own forward on exit,
    also on error.
    """
    with _transposed(model.modules()) as swapped:
        yield swapped


@contextlib.contextmanager
def few_token_projection(model: nn.Module) -> Iterator[bool]:
    """The same for the output embedding alone (what the loop used before :func:`few_token_linears`; the
    verification-cost benchmark shows both). Yields whether it applied."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    with _transposed([head] if head is not None else []) as swapped:
        yield bool(swapped)
