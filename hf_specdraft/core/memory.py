"""Freed host memory handed back to the system between calls, so a long-running process does not grow call by call.

Calls of varied lengths allocate and free host buffers of ever new sizes (activations, logits, the per-shape kernels
of oneDNN on CPU). glibc's ``malloc`` keeps much of what is freed in its arenas for reuse, fragmented, so a process's
resident memory creeps up over hundreds of calls although little of it is live (+90 MiB after 350 varied default
calls on a 2-core Xeon VM, of which ``malloc_trim(0)`` gave back all but a few MiB;
``benchmarks/verification/memory-49-cpu*.json``). After every call :func:`after_call` reads the process's resident
size (one read of ``/proc/self/statm``) and, once it has grown ``HF_SPECDRAFT_TRIM_MIB`` (default 32) past its floor,
calls glibc's ``malloc_trim(0)``. The floor is where the first call left the process, a call's working set included:
it is not lowered to what a trim leaves, since the next call takes those pages back (trimming down to it would trim
after every call and fault the pages in again every time), but it follows the process down when a call ends lower (a
model freed) and up when a trim cannot bring it back under the floor (memory that is live, such as a model loaded).
Nothing happens where glibc or ``/proc`` is missing (macOS, Windows, musl); ``HF_SPECDRAFT_TRIM_MIB=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

TRIM_MIB = 32  # growth past the last trim that triggers the next: small against a model, rare against a call's buffers

_lock = threading.Lock()
_floor: float | None = None  # resident MiB a call may end at without a trim, less the threshold (after_call)
_libc = None  # glibc, once found; False where there is none


def resident_mib() -> float | None:
    """The process's resident set in MiB (``/proc/self/statm``), or ``None`` where there is no ``/proc``."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def trim_threshold_mib() -> float:
    """``HF_SPECDRAFT_TRIM_MIB`` (MiB of growth that triggers a trim; 0 never trims), default :data:`TRIM_MIB`."""
    value = os.environ.get("HF_SPECDRAFT_TRIM_MIB", "")
    try:
        mib = float(value) if value.strip() else TRIM_MIB
    except ValueError:
        raise ValueError(f"HF_SPECDRAFT_TRIM_MIB must be a number of MiB (0: never trim), got {value!r}") from None
    if mib < 0:
        raise ValueError(f"HF_SPECDRAFT_TRIM_MIB must be >= 0 (0: never trim), got {value!r}")
    return mib


def _glibc():
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
            _libc = lib if lib is not None and hasattr(lib, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc or None


def _trim(libc) -> tuple[float | None, float | None]:
    """``malloc_trim(0)``; the resident MiB before and after it."""
    before = resident_mib()
    libc.malloc_trim(0)
    return before, resident_mib()


def release_freed_memory() -> float | None:
    """Hand the memory glibc's ``malloc`` holds freed back to the system now (``malloc_trim(0)``). Returns the MiB given
    back, or ``None`` where there is no glibc."""
    libc = _glibc()
    if libc is None:
        return None
    with _lock:
        before, after = _trim(libc)
    return None if before is None or after is None else max(before - after, 0.0)


def after_call() -> float | None:
    """What the loop runs when a call ends: a trim once the process has grown the threshold past its floor (see the
    module docstring). Returns the MiB the trim gave back, ``None`` when none ran."""
    global _floor
    threshold = trim_threshold_mib()
    libc = _glibc()
    if not threshold or libc is None:
        return None
    now = resident_mib()
    if now is None:
        return None
    with _lock:
        if _floor is None or now < _floor:
            _floor = now
            return None
        if now - _floor < threshold:
            return None
        before, after = _trim(libc)
        if after is not None:
            _floor = max(_floor, after)  # what a trim cannot give back is live: the floor moves up to it
    return None if before is None or after is None else max(before - after, 0.0)
