"""The linear layers of a few-token forward on CPU, in whichever orientation the CPU's BLAS runs fastest.

Verification runs the target over ``1 + N`` tokens (N ≈ 2–16). On CPU each ``linear(h, W)`` of those few
rows, ``h`` `(M, d_in)` and ``W`` `(d_out, d_in)`, can also be computed as ``W @ h.T``; which is faster depends
on the CPU. On the 2-core AMD EPYC VMs of earlier sessions ``linear`` took MKL's small-M GEMM path, 1.5–4×
slower than ``W @ h.T``; for the vocabulary projection of SmolLM2 (49,152 × 576), fp32, torch 2.13 (median
of 30 calls)::

    M                  1      2      3      6      8     16
    linear(h, W)    10.4   23.4   34.7   35.1   24.6   26.1   ms
    W @ h.T         10.3    7.7   10.8    8.4    9.4   17.2   ms

and for the 210 projections of its 30 decoder layers (q, k, v, o, gate, up, down; weights streamed from
memory, as in a forward; median of 7 passes)::

    M                  1      2      4      6      8     12
    linear(h, W)    56.0   87.9   97.4   80.8   79.7  101.6   ms
    W @ h.T         58.2   41.2   45.5   64.3   68.8   87.7   ms

On a 2-core AVX-512 Intel Xeon VM (2026-11-25, same torch and MKL) it is the other way round: the
vocabulary projection took 2.3 / 2.3 / 4.4 ms with ``linear`` at M = 1 / 2 / 4 and 2.3 / 6.7 / 5.5 ms as
``W @ h.T``, and a whole verification forward over 2 tokens cost 1.03× a one-token forward with the model's own
linears against 2.24× transposed. So :func:`few_token_linears` measures it: by default (``orientation="auto"``)
each few-row linear runs ``W @ h.T`` only where :func:`transposed_is_faster` timed it at least 10 % faster for
that weight shape and row count on this machine (timed once per process, on the layer's own weight).

A one-row ``linear`` is a matrix-vector product that streams each weight once; a few-row one should cost
about the same, and on the AMD VM as ``W @ h.T`` it did. :func:`few_token_linears` wraps the forward of every plain CPU
``nn.Linear`` of a model while the loop runs (through the model's own forward,
so soft-capping, logit scales and ``logits_to_keep`` still apply); a one-row forward (and every GPU) keeps
``linear``. Both are fp32 dot products of the same numbers; only the summation blocking differs (≤ 1e-4 on
the default's logits), as it already does between a 1-row and a 6-row ``linear``.

A whole forward of the default target over n new tokens on a 96-token cache, relative to a one-token
forward (``python -m hf_specdraft.bench.projection``, median of 15, the AMD VM)::

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
import statistics
import time
from collections.abc import Iterable, Iterator

import torch
from torch import nn

ORIENTATIONS = ("auto", "transposed", "linear")
MAX_CALIBRATED_ROWS = 64  # past this a forward is an ordinary GEMM (a prefill): linear's own path
SWITCH_MARGIN = 0.9  # W @ h.T must beat linear by 10 % in calibration: noise never moves a model off its own path
CALIBRATION_REPEATS = 5
_FASTER_TRANSPOSED: dict[tuple, bool] = {}


def _seconds(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def transposed_is_faster(weight: torch.Tensor, rows: int) -> bool:
    """Whether ``W @ h.T`` beats ``linear(h, W)`` for ``rows`` rows on this machine, timed once per weight shape,
    dtype, row count and thread count on ``weight`` itself (both interleaved, median of ``CALIBRATION_REPEATS``).

    The answer depends on the CPU's BLAS kernels: 2-4x in favour of the transposed product on the AMD EPYC VMs
    measured in the module docstring, 1.5-3x against it on an AVX-512 Xeon (both fp32, MKL, torch 2.13), so it is
    measured, not assumed. Takes ~0.1 s the first time for a 49K-row vocabulary projection, microseconds after."""
    key = (tuple(weight.shape), weight.dtype, rows, torch.get_num_threads())
    if key not in _FASTER_TRANSPOSED:
        hidden = torch.randn(rows, weight.shape[1], dtype=weight.dtype, generator=torch.Generator().manual_seed(rows))
        with torch.no_grad():
            linear = lambda: nn.functional.linear(hidden, weight)  # noqa: E731
            transposed = lambda: torch.matmul(weight, hidden.T).T.contiguous()  # noqa: E731
            linear(), transposed()  # warm-up: first-call allocations
            seconds = {"linear": [], "transposed": []}
            for _ in range(CALIBRATION_REPEATS):  # interleaved, so a burst of other work hits both
                seconds["linear"].append(_seconds(linear))
                seconds["transposed"].append(_seconds(transposed))
        _FASTER_TRANSPOSED[key] = statistics.median(seconds["transposed"]) < SWITCH_MARGIN * statistics.median(seconds["linear"])
    return _FASTER_TRANSPOSED[key]


def calibrated_choices() -> list[dict]:
    """What :func:`transposed_is_faster` measured so far in this process (benchmarks record it)."""
    return [{"weight": list(shape), "dtype": str(dtype).removeprefix("torch."), "rows": rows, "threads": threads, "transposed": faster}
            for (shape, dtype, rows, threads), faster in sorted(_FASTER_TRANSPOSED.items(), key=str)]


def _transposed_linear(module: nn.Linear, original, orientation: str):
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.numel() // max(hidden_states.shape[-1], 1)
        if hidden_states.dim() < 2 or rows <= 1 or hidden_states.requires_grad or (module.weight.requires_grad and torch.is_grad_enabled()):
            return original(hidden_states)
        if orientation == "auto" and (rows > MAX_CALIBRATED_ROWS or not transposed_is_faster(module.weight, rows)):
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
def _transposed(modules: Iterable[nn.Module], orientation: str = "auto") -> Iterator[int]:
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    swapped = [m for m in modules if _swappable(m)] if orientation != "linear" else []
    for module in swapped:
        module.forward = _transposed_linear(module, module.forward, orientation)
    try:
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward


@contextlib.contextmanager
def few_token_linears(model: nn.Module, orientation: str = "auto") -> Iterator[int]:
    """Compute the plain CPU ``nn.Linear`` layers of ``model`` as ``W @ h.T`` for multi-row inputs inside the block,
    where that is faster on this machine.

    Args:
        orientation: ``"auto"`` (default): per weight shape and row count, whichever orientation
            :func:`transposed_is_faster` measured faster (the model's own ``linear`` unless ``W @ h.T`` wins by 10 %);
            ``"transposed"``: always ``W @ h.T`` for 2+ rows; ``"linear"``: nothing changes.

    Applies only to modules where it cannot change which code runs (see the module docstring); others keep
    their forward. Yields how many modules it wrapped (0 on GPU and with ``"linear"``). Restores each module's own
    forward on exit, also on error.
    """
    with _transposed(model.modules(), orientation) as swapped:
        yield swapped


@contextlib.contextmanager
def few_token_projection(model: nn.Module, orientation: str = "auto") -> Iterator[bool]:
    """The same for the output embedding alone (what the loop used before :func:`few_token_linears`; the
    verification-cost benchmark shows both). Yields whether it applied."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    with _transposed([head] if head is not None else [], orientation) as swapped:
        yield bool(swapped)
