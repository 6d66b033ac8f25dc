"""The linear layers of a few-token forward on CPU, in whichever orientation the CPU's BLAS runs fastest.

Verification runs the target over ``1 + N`` tokens (N ≈ 2–16). On CPU each ``linear(h, W)`` of those few rows, ``h``
`(M, d_in)` and ``W`` `(d_out, d_in)`, can also be computed as ``W @ h.T``, and which is faster depends on the CPU. On
2-core AMD EPYC VMs ``linear`` took MKL's small-M GEMM path, 1.5–4× slower than ``W @ h.T``; SmolLM2's vocabulary
projection (49,152 × 576, fp32, torch 2.13, median of 30 calls)::

    M                  1      2      3      6      8     16
    linear(h, W)    10.4   23.4   34.7   35.1   24.6   26.1   ms
    W @ h.T         10.3    7.7   10.8    8.4    9.4   17.2   ms

On a 2-core AVX-512 Xeon VM (same torch and MKL) it is the other way round (that projection: 2.3 / 2.3 / 4.4 ms with
``linear`` at M = 1 / 2 / 4, 2.3 / 6.7 / 5.5 ms as ``W @ h.T``). So it is measured: by default
(``orientation="auto"``) a few-row linear runs ``W @ h.T`` only where :func:`transposed_is_faster` timed it at least
10 % faster for that weight shape and row count on this machine (once per process, on copies of the weight).

A one-row ``linear`` is a matrix-vector product, which MKL ran on one core on the AMD VM (fp32), while two rows as
``W @ h.T`` use both: a one-row input is computed as two (the row twice, the first column kept) where that times
faster (2.4-3.1x there, streamed like a forward; in bf16 the matrix-vector path was faster, and bf16 weights are left
alone). With every linear so computed, a whole forward over 2 new tokens cost 0.96× the model's own one-token forward
on that VM (1.65× without; ``python -m benchmarks.studies.projection``), and plain greedy ``generate`` inside
:func:`few_token_linears` ran 16.5 → 22.8 tokens/s, token-identical: there it is the fair target-only baseline the
bench runs (``target-only+linears``).

:func:`few_token_linears` wraps the forward of every plain CPU fp32 / fp64 ``nn.Linear`` of a model inside the block
(through the model's own forward, so soft-capping, logit scales and ``logits_to_keep`` still apply); GPUs and
bf16 / fp16 weights keep ``linear``. Both are fp32 dot products of the same numbers; only the summation blocking
differs (≤ 1e-4 on the default's logits), as it already does between a 1-row and a 6-row ``linear``.

This module imports torch and its sibling ``controller_store`` (the files on disk) only:
:func:`hf_specdraft.cape.write_custom_generate` writes it, as it is, into the ``custom_generate/`` folder a checkpoint
ships.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterable, Iterator
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


def _load_disk() -> None:
    """Fill this process' calibrations from the file once, for this machine only."""
    if _ON_DISK["loaded"]:
        return
    _ON_DISK["loaded"] = True
    stored = read_json(calibration_file()).get(machine_id(), {})
    for key in list(_FASTER_TRANSPOSED):  # keys measured here already win
        stored.pop(_disk_key(key), None)
    _ON_DISK["stored"] = stored


def _save_disk(key: tuple, faster: bool) -> None:
    """Add one calibration to the file (read, merge, atomic replace); a read-only cache directory only skips it."""
    path = calibration_file()
    if path is None:
        return
    try:
        data = read_json(path)
        data.setdefault(machine_id(), {})[_disk_key(key)] = faster
        write_json(path, data)
    except OSError:
        pass


def _seconds(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def transposed_is_faster(weight: torch.Tensor, rows: int) -> bool:
    """Whether ``W @ h.T`` beats ``linear(h, W)`` for ``rows`` rows on this machine, timed once per weight shape,
    dtype, row count and thread count (both interleaved, median of ``CALIBRATION_REPEATS``).

    Timed as a forward runs them: on copies of ``weight`` together over ``CALIBRATION_BYTES``, each used once per pass,
    so every weight streams from memory (from the cache a one-row ``linear`` looked as fast as the two-row product;
    streamed, on the AMD VM, it was 2.4-2.7x slower). Takes ~0.1 s per shape and row count the first time (1-3 s for a
    model's generation), microseconds after; the answers persist per CPU model and torch build in
    :func:`calibration_file`, so a later process on the same machine measures nothing again."""
    key = (tuple(weight.shape), weight.dtype, rows, torch.get_num_threads())
    _load_disk()
    if key not in _FASTER_TRANSPOSED and _disk_key(key) in _ON_DISK.get("stored", {}):  # measured by an earlier process
        _FASTER_TRANSPOSED[key] = bool(_ON_DISK["stored"][_disk_key(key)])
    if key not in _FASTER_TRANSPOSED:
        hidden = torch.randn(rows, weight.shape[1], dtype=weight.dtype, generator=torch.Generator().manual_seed(rows))
        copies = min(MAX_CALIBRATION_COPIES, max(1, -(-CALIBRATION_BYTES // (weight.numel() * weight.element_size()))))
        with torch.no_grad():
            weights = [weight.detach().clone() for _ in range(copies)]
            linear = lambda: [nn.functional.linear(hidden, w) for w in weights]  # noqa: E731
            transposed = lambda: [_transposed_product(w, hidden) for w in weights]  # noqa: E731
            linear(), transposed()  # warm-up: first-call allocations
            seconds = {"linear": [], "transposed": []}
            for _ in range(CALIBRATION_REPEATS):  # interleaved, so a burst of other work hits both
                seconds["linear"].append(_seconds(linear))
                seconds["transposed"].append(_seconds(transposed))
        median = {name: statistics.median(times) for name, times in seconds.items()}
        _FASTER_TRANSPOSED[key] = median["transposed"] < SWITCH_MARGIN * median["linear"]
        _save_disk(key, _FASTER_TRANSPOSED[key])
    return _FASTER_TRANSPOSED[key]


def _transposed_product(weight: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``linear(flat, weight)`` as ``W @ h.T``: ``flat`` `(M, d_in)` -> `(M, d_out)`, laid out as linear's; one row as
    two (a two-column GEMM streams the weight on both cores where MKL's matrix-vector product used one)."""
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
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.numel() // max(hidden_states.shape[-1], 1)
        if (
            hidden_states.dim() < 2
            or rows < 1
            or hidden_states.requires_grad
            or (module.weight.requires_grad and torch.is_grad_enabled())
        ):
            return original(hidden_states)
        if orientation == "auto" and (rows > MAX_CALIBRATED_ROWS or not transposed_is_faster(module.weight, rows)):
            return original(hidden_states)
        out = _transposed_product(module.weight, hidden_states.reshape(rows, hidden_states.shape[-1]))  # (M, d_out)
        if module.bias is not None:
            out = out + module.bias
        return out.reshape(*hidden_states.shape[:-1], out.shape[-1])

    return forward


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
    """Compute the plain CPU fp32 ``nn.Linear`` layers of ``model`` as ``W @ h.T`` inside the block (a one-row input as
    two rows), where that is faster on this machine: for a few-token verification and, on CPUs whose one-row product
    runs on one core, for plain decoding too (``with few_token_linears(model): model.generate(...)``).

    Args:
        orientation: ``"auto"`` (default): per weight shape and row count, whichever orientation
            :func:`transposed_is_faster` measured faster (the model's own ``linear`` unless ``W @ h.T`` wins by 10 %);
            ``"transposed"``: always ``W @ h.T`` up to any row count; ``"linear"``: nothing changes.

    Applies only where it cannot change which code runs (see the module docstring). Yields how many modules it wrapped
    (0 on GPU and with ``"linear"``); restores their own forward on exit, also on error.
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
