"""The linear layers of a few-token forward on CPU, each computed by whichever kernel this CPU's BLAS runs fastest.

Each ``linear(h, W)`` of a verification's few rows (``h`` `(M, d_in)`, ``W`` `(d_out, d_in)`) can run as the model's
own ``linear``, as ``W @ h.T`` or by MKL's packed GEMM (``W`` packed once, kept while it lives), and which is fastest
depends on the CPU (docs/cpu-notes.md). Only plain CPU fp32 / fp64 ``nn.Linear`` layers are wrapped (packed: fp32
with MKL); the sums differ only in their blocking (≤ 1e-4 on the default's logits).
"""

from __future__ import annotations

import contextlib
import statistics
import timeit
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .controller_store import cache_file, machine_id, read_json, write_json

ORIENTATIONS = ("auto", "transposed", "packed", "linear")
KERNELS = ("linear", "transposed", "packed")  # what "auto" chooses from, per weight shape and row count
MAX_CALIBRATED_ROWS = 64  # past this a forward is an ordinary GEMM (a prefill): linear's own path
SWITCH_MARGIN = 0.9  # another kernel must beat linear by 10 %: noise never moves a model off its own path
CALIBRATION_REPEATS = 5
CALIBRATION_BYTES = 64 * 2**20  # more than a 2-core VM's cache share: calibration streams weights as a forward does
MAX_CALIBRATION_COPIES = 256  # tiny test models' weights: a few hundred suffice, thousands would only take time
PACKING_HEADROOM = 2 * 2**30  # a weight is packed only while this much memory stays free beside its packed copy
_FASTEST: dict[tuple, str] = {}
_ON_DISK = {"loaded": False}  # whether this process has read the calibration file yet
# weight -> (its version and storage when packed, the packed copy or None where memory was short)
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def calibration_file() -> Path | None:
    """Where calibrations persist across processes: ``$HF_SPECDRAFT_CALIBRATION_FILE``, else
    ``$HF_SPECDRAFT_CACHE/few_token_linears.json``; ``None`` when the variable is set empty (no file)."""
    return cache_file("HF_SPECDRAFT_CALIBRATION_FILE", "few_token_linears.json")


def _disk_key(key: tuple) -> str:
    shape, dtype, rows, threads = key
    return f"{'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')} rows={rows} threads={threads}"


def _save_disk(key: tuple, kernel: str) -> None:
    """Add one calibration to the file (read, merge, atomic replace); a read-only cache directory only skips it."""
    path = calibration_file()
    if path is None:
        return
    with contextlib.suppress(OSError):
        data = read_json(path)
        data.setdefault(machine_id(), {})[_disk_key(key)] = kernel
        write_json(path, data)


def _kernels(weight: torch.Tensor) -> tuple[str, ...]:
    """The kernels ``weight`` can run: MKL packs fp32 weights only."""
    return KERNELS if weight.dtype == torch.float32 and torch.backends.mkl.is_available() else KERNELS[:2]


def fastest_kernel(weight: torch.Tensor, rows: int) -> str:
    """Which of :data:`KERNELS` runs ``linear(h, weight)`` for ``rows`` rows fastest here (``"linear"`` unless another
    wins by 10 %), timed once per weight shape, dtype, row count and thread count (interleaved, median of
    ``CALIBRATION_REPEATS``, on copies of ``weight`` over ``CALIBRATION_BYTES`` so that weights stream from memory as
    in a forward) and kept per machine in :func:`calibration_file` (an older entry, a bool, is timed again)."""
    key = (tuple(weight.shape), weight.dtype, rows, torch.get_num_threads())
    if not _ON_DISK["loaded"]:
        _ON_DISK.update(loaded=True, stored=read_json(calibration_file()).get(machine_id(), {}))
    if key not in _FASTEST and _ON_DISK["stored"].get(_disk_key(key)) in _kernels(weight):  # an earlier process's
        _FASTEST[key] = _ON_DISK["stored"][_disk_key(key)]
    if key not in _FASTEST:
        _save_disk(key, _FASTEST.setdefault(key, _time_kernels(weight, rows)))
    return _FASTEST[key]


def _time_kernels(weight: torch.Tensor, rows: int) -> str:
    hidden = torch.randn(rows, weight.shape[1], dtype=weight.dtype, generator=torch.Generator().manual_seed(rows))
    copies = min(MAX_CALIBRATION_COPIES, max(1, -(-CALIBRATION_BYTES // (weight.numel() * weight.element_size()))))
    with torch.no_grad():
        weights = [weight.detach().clone() for _ in range(copies)]
        kernels = [k for k in _kernels(weight) if k != "packed" or packed_weight(weights[0]) is not None]
        timers = {k: timeit.Timer(lambda k=k: [_product(k, w, hidden) for w in weights]) for k in kernels}
        for timer in timers.values():  # warm-up: first-call allocations, and the copies' packing
            timer.timeit(1)
        times = {kernel: [] for kernel in timers}
        for _ in range(CALIBRATION_REPEATS):  # interleaved, so a burst of other work hits every kernel
            for kernel, timer in timers.items():
                times[kernel].append(timer.timeit(1))
    medians = {kernel: statistics.median(seconds) for kernel, seconds in times.items()}
    best = min(medians, key=medians.get)
    return best if medians[best] < SWITCH_MARGIN * medians["linear"] else "linear"


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` in MKL's packed layout, packed on first use and again after an in-place change; ``None`` where the
    packed copy would leave less than ``PACKING_HEADROOM`` of memory free (the caller then runs ``linear``)."""
    stamp = (weight._version, weight.data_ptr())
    held = _PACKED.get(weight)
    if held is None or held[0] != stamp:
        free = float("inf")  # Linux's MemAvailable; unknown elsewhere
        with contextlib.suppress(OSError, StopIteration), open("/proc/meminfo") as meminfo:
            free = 1024 * int(next(line for line in meminfo if line.startswith("MemAvailable:")).split()[1])
        fits = free - weight.numel() * weight.element_size() > PACKING_HEADROOM
        held = (stamp, torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), 8) if fits else None)
        _PACKED[weight] = held
    return held[1]


def _product(kernel: str, weight: torch.Tensor, flat: torch.Tensor) -> torch.Tensor | None:
    """``linear(flat, weight)`` by ``kernel``: ``flat`` `(M, d_in)` -> `(M, d_out)`; ``None`` where ``weight`` could not
    be packed. ``W @ h.T`` takes one row as two (see above). MKL's packed layout serves any M: the row count passed is
    the input's own, so torch never falls back to ``weight``."""
    if kernel == "linear":
        return nn.functional.linear(flat, weight)
    if kernel == "packed":
        packed = packed_weight(weight)
        return None if packed is None else torch.ops.mkl._mkl_linear(flat, packed, weight, None, flat.shape[0])
    if flat.shape[0] == 1:
        return torch.matmul(weight, flat.repeat(2, 1).T)[:, :1].T.contiguous()
    return torch.matmul(weight, flat.T).T.contiguous()  # the BLAS' fast orientation for small M on some CPUs


def calibrated_choices() -> list[dict]:
    """What :func:`fastest_kernel` measured so far in this process (benchmarks record it)."""
    return [
        dict(weight=list(shape), dtype=str(dtype).removeprefix("torch."), rows=rows, threads=threads, kernel=kernel)
        for (shape, dtype, rows, threads), kernel in sorted(_FASTEST.items(), key=str)
    ]


def _fast_linear(module: nn.Linear, original, orientation: str):
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.numel() // max(hidden_states.shape[-1], 1)
        grad = hidden_states.requires_grad or (module.weight.requires_grad and torch.is_grad_enabled())
        if hidden_states.dim() < 2 or rows < 1 or grad or rows > MAX_CALIBRATED_ROWS and orientation == "auto":
            return original(hidden_states)
        kernel = fastest_kernel(module.weight, rows) if orientation == "auto" else orientation
        flat = hidden_states.reshape(rows, hidden_states.shape[-1])
        # None: linear, packed where MKL cannot, or too little memory to pack this weight
        out = _product(kernel, module.weight, flat) if kernel in _kernels(module.weight)[1:] else None  # (M, d_out)
        if out is None:
            return original(hidden_states)
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
def few_token_linears(model: nn.Module, orientation: str = "auto") -> Iterator[int]:
    """Compute the plain CPU float ``nn.Linear`` layers of ``model`` inside the block by the kernel this machine runs
    fastest per row count: for a few-token verification, and on some CPUs for plain decoding too
    (``with few_token_linears(model): model.generate(...)``).

    Args:
        model: a model, or any module of it (``model.get_output_embeddings()``: the output projection alone).
        orientation: ``"auto"`` (default): per weight shape and row count, the kernel :func:`fastest_kernel` measured
            fastest (the model's own ``linear`` unless another wins by 10 %); ``"transposed"``: always ``W @ h.T``,
            ``"packed"``: always MKL's packed GEMM (fp32 weights, CPUs with MKL; others keep ``linear``), up to any
            row count; ``"linear"``: nothing changes. A packed copy (the weight's size) lives as long as its weight;
            no weight is packed where that would leave under 2 GiB free.

    Yields how many modules it wrapped (0 on GPU and with ``"linear"``); restores their own forward on exit.
    """
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    swapped = [m for m in model.modules() if _swappable(m)] if orientation != "linear" else []
    for module in swapped:
        module.forward = _fast_linear(module, module.forward, orientation)
    try:
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward
