"""The linear layers of a few-token forward on CPU, in whichever orientation the CPU's BLAS runs fastest.

Verification runs the target over ``1 + N`` tokens (N ≈ 2–16). Each ``linear(h, W)`` of those few rows, ``h``
`(M, d_in)` and ``W`` `(d_out, d_in)`, can also be computed as ``W @ h.T``, and which is faster depends on the CPU
(docs/cpu-notes.md). So with ``"auto"`` a few-row linear runs ``W @ h.T`` (a one-row input as two rows) only where
:func:`transposed_is_faster` timed it at least 10 % faster on this machine. Only plain CPU fp32 / fp64 ``nn.Linear``
layers are wrapped; the sums differ only in their blocking (≤ 1e-4 on the default's logits).
"""

from __future__ import annotations

import contextlib
import statistics
import timeit
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from .controller_store import cache_file, machine_id, read_json, write_json

ORIENTATIONS = ("auto", "transposed", "linear")
MAX_CALIBRATED_ROWS = 64  # past this a forward is an ordinary GEMM (a prefill): linear's own path
SWITCH_MARGIN = 0.9  # W @ h.T must beat linear by 10 % in calibration: noise never moves a model off its own path
CALIBRATION_REPEATS = 5
CALIBRATION_BYTES = 64 * 2**20  # more than a 2-core VM's cache share: calibration streams weights as a forward does
MAX_CALIBRATION_COPIES = 256  # tiny test models' weights: a few hundred suffice, thousands would only take time
_FASTER_TRANSPOSED: dict[tuple, bool] = {}
_ON_DISK = {"loaded": False}  # whether this process has read the calibration file yet


def calibration_file() -> Path | None:
    """Where calibrations persist across processes: ``$HF_SPECDRAFT_CALIBRATION_FILE``, else
    ``$HF_SPECDRAFT_CACHE/few_token_linears.json``; ``None`` when the variable is set empty (no file)."""
    return cache_file("HF_SPECDRAFT_CALIBRATION_FILE", "few_token_linears.json")


def _disk_key(key: tuple) -> str:
    shape, dtype, rows, threads = key
    return f"{'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')} rows={rows} threads={threads}"


def _save_disk(key: tuple, faster: bool) -> None:
    """Add one calibration to the file (read, merge, atomic replace); a read-only cache directory only skips it."""
    path = calibration_file()
    if path is None:
        return
    with contextlib.suppress(OSError):
        data = read_json(path)
        data.setdefault(machine_id(), {})[_disk_key(key)] = faster
        write_json(path, data)


def transposed_is_faster(weight: torch.Tensor, rows: int) -> bool:
    """Whether ``W @ h.T`` beats ``linear(h, W)`` for ``rows`` rows on this machine, timed once per weight shape,
    dtype, row count and thread count (interleaved, median of ``CALIBRATION_REPEATS``), and kept per machine in
    :func:`calibration_file`. Timed on copies of ``weight`` over ``CALIBRATION_BYTES``, so every weight streams from
    memory as in a forward (from the cache a one-row ``linear`` looked as fast as the two-row product)."""
    key = (tuple(weight.shape), weight.dtype, rows, torch.get_num_threads())
    if not _ON_DISK["loaded"]:
        _ON_DISK.update(loaded=True, stored=read_json(calibration_file()).get(machine_id(), {}))
    if key not in _FASTER_TRANSPOSED and _disk_key(key) in _ON_DISK["stored"]:  # measured by an earlier process
        _FASTER_TRANSPOSED[key] = bool(_ON_DISK["stored"][_disk_key(key)])
    if key not in _FASTER_TRANSPOSED:
        hidden = torch.randn(rows, weight.shape[1], dtype=weight.dtype, generator=torch.Generator().manual_seed(rows))
        copies = min(MAX_CALIBRATION_COPIES, max(1, -(-CALIBRATION_BYTES // (weight.numel() * weight.element_size()))))
        with torch.no_grad():
            weights = [weight.detach().clone() for _ in range(copies)]
            linear = timeit.Timer(lambda: [nn.functional.linear(hidden, w) for w in weights])
            transposed = timeit.Timer(lambda: [_transposed_product(w, hidden) for w in weights])
            linear.timeit(1), transposed.timeit(1)  # warm-up: first-call allocations
            # interleaved, so a burst of other work hits both
            pairs = [(linear.timeit(1), transposed.timeit(1)) for _ in range(CALIBRATION_REPEATS)]
            by_linear, by_transposed = zip(*pairs)
        _FASTER_TRANSPOSED[key] = statistics.median(by_transposed) < SWITCH_MARGIN * statistics.median(by_linear)
        _save_disk(key, _FASTER_TRANSPOSED[key])
    return _FASTER_TRANSPOSED[key]


def _transposed_product(weight: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``linear(flat, weight)`` as ``W @ h.T``: ``flat`` `(M, d_in)` -> `(M, d_out)`; one row as two (see above)."""
    if flat.shape[0] == 1:
        return torch.matmul(weight, flat.repeat(2, 1).T)[:, :1].T.contiguous()
    return torch.matmul(weight, flat.T).T.contiguous()  # the BLAS' fast orientation for small M on some CPUs


def calibrated_choices() -> list[dict]:
    """What :func:`transposed_is_faster` measured so far in this process (benchmarks record it)."""
    return [
        dict(weight=list(shape), dtype=str(dtype).removeprefix("torch."), rows=rows, threads=threads, transposed=fast)
        for (shape, dtype, rows, threads), fast in sorted(_FASTER_TRANSPOSED.items(), key=str)
    ]


def _transposed_linear(module: nn.Linear, original, orientation: str):
    # input shape -> whether W @ h.T runs it, decided once per shape: a verification's linears then pay one dict
    # lookup over the model's own (the checks and the calibration lookup on every call cost ~3 % of a forward)
    plan: dict[torch.Size, bool] = {}

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        transposed = plan.get(hidden_states.shape)
        if transposed is False:
            return original(hidden_states)
        if hidden_states.requires_grad or (module.weight.requires_grad and torch.is_grad_enabled()):
            return original(hidden_states)
        if transposed is None:
            transposed = plan[hidden_states.shape] = _runs_transposed(module.weight, hidden_states.shape, orientation)
            if not transposed:
                return original(hidden_states)
        rows = hidden_states.numel() // hidden_states.shape[-1]
        out = _transposed_product(module.weight, hidden_states.reshape(rows, hidden_states.shape[-1]))  # (M, d_out)
        if module.bias is not None:
            out = out + module.bias
        return out.reshape(*hidden_states.shape[:-1], out.shape[-1])

    return forward


def _runs_transposed(weight: torch.Tensor, shape: torch.Size, orientation: str) -> bool:
    """Whether an input of ``shape`` `(..., M, d_in)` runs as ``W @ h.T`` under ``orientation``."""
    rows = shape.numel() // max(shape[-1], 1) if len(shape) else 0
    if len(shape) < 2 or rows < 1:
        return False
    return orientation == "transposed" or (rows <= MAX_CALIBRATED_ROWS and transposed_is_faster(weight, rows))


def _swappable(module: nn.Module) -> bool:
    """A plain CPU float ``nn.Linear`` whose forward nobody wrapped (no accelerate hook, adapter or quantization)."""
    return (
        type(module) is nn.Linear
        and module.weight.device.type == "cpu"
        and "forward" not in vars(module)
        and not hasattr(module, "_hf_hook")
        and module.weight.dtype in (torch.float32, torch.float64)
    )


@contextlib.contextmanager
def few_token_linears(model: nn.Module, orientation: str = "auto") -> Iterator[int]:
    """Compute the plain CPU fp32 ``nn.Linear`` layers of ``model`` as ``W @ h.T`` inside the block (a one-row input as
    two rows), where that is faster on this machine: for a few-token verification and, on CPUs whose one-row product
    runs on one core, for plain decoding too (``with few_token_linears(model): model.generate(...)``).

    Args:
        model: a model, or any module of it (``model.get_output_embeddings()``: the output projection alone).
        orientation: ``"auto"`` (default): per weight shape and row count, whichever orientation
            :func:`transposed_is_faster` measured faster (the model's own ``linear`` unless ``W @ h.T`` wins by 10 %);
            ``"transposed"``: always ``W @ h.T`` up to any row count; ``"linear"``: nothing changes.

    Yields how many modules it wrapped (0 on GPU and with ``"linear"``); restores their own forward on exit.
    """
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    swapped = [m for m in model.modules() if _swappable(m)] if orientation != "linear" else []
    for module in swapped:
        module.forward = _transposed_linear(module, module.forward, orientation)
    try:
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward
