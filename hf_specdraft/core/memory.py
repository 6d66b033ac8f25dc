"""Freed host memory handed back to the system between calls, on request, so a long-running process does not grow call by
call.

Calls of varied lengths allocate and free host buffers of ever new sizes (activations, logits, the per-shape kernels
of oneDNN on CPU). glibc's ``malloc`` keeps much of what is freed in its arenas for reuse, fragmented, so a process's
resident memory creeps up over hundreds of calls although little of it is live (+90 MiB after 350 varied default
calls on a 2-core Xeon VM, of which ``malloc_trim(0)`` gave back all but a few MiB;
``benchmarks/verification/memory-49-cpu*.json``).

Off by default: ``malloc_trim`` takes every arena's lock while it runs, so other threads of the process wait on
``malloc`` meanwhile, a side effect a library should not impose on its host. Set ``HF_SPECDRAFT_TRIM_MIB`` to a
number of MiB (``32`` is what the measurements used) to turn it on: every call then checks the setting before it
starts (a malformed value raises ``ValueError`` before any forward), and after it ends :func:`after_call` reads the
process's resident size (one read of ``/proc/self/statm``) and, once it has grown that many MiB past its floor, calls
glibc's ``malloc_trim(0)``. The trim runs after the call has released the model's static caches and outside any lock
another thread waits on (one thread trims at a time; another that finishes meanwhile skips its trim). The floor is
where the first call left the process, a call's working set included: it is not lowered to what a trim leaves, since
the next call takes those pages back (trimming down to it would trim after every call and fault the pages in again
every time), but it follows the process down when a call ends lower (a model freed) and up when a trim cannot bring it
back under the floor (memory that is live, such as a model loaded). With the setting at ``N`` a process's resident
memory ends a call at most ``N`` MiB above its floor plus what is live. Nothing happens where glibc or ``/proc`` is
missing (macOS, Windows, musl).
"""
from __future__ import annotations

import ctypes
import os
import threading

ENV = "HF_SPECDRAFT_TRIM_MIB"  # the opt-in: MiB of growth past the floor that triggers a trim (unset, empty or 0: never)
TRIM_MIB = 32  # the threshold the memory measurements ran with: small against a model, rare against a call's buffers

_lock = threading.Lock()  # guards _floor and _trimming only: never held while malloc_trim runs
_floor: float | None = None  # resident MiB a call may end at without a trim, less the threshold (after_call)
_trimming = False  # a thread is trimming now: others skip theirs rather than wait
_libc = None  # glibc, once found; False where there is none


def resident_mib() -> float | None:
    """The process's resident set in MiB (``/proc/self/statm``), or ``None`` where there is no ``/proc``."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def trim_threshold_mib() -> float | None:
    """The MiB of growth past the floor that triggers a trim, from ``HF_SPECDRAFT_TRIM_MIB``; ``None`` when trimming is
    off (the variable unset, empty or ``0``: the default). The loop reads it before a call starts, so a malformed value
    fails before any forward: ``ValueError`` naming the variable and what it takes."""
    value = os.environ.get(ENV, "")
    if not value.strip():
        return None
    try:
        mib = float(value)
    except ValueError:
        mib = float("nan")
    if not mib >= 0 or mib == float("inf"):  # NaN, negative or infinite
        raise ValueError(f"{ENV} must be unset, 0 (never trim: the default) or a positive number of MiB (e.g. {TRIM_MIB}), "
                         f"got {value!r}")
    return mib or None


def _glibc():
    """The process's own C library when it is glibc (``CDLL(None)``: the symbols already loaded, no search, no
    subprocess), else ``None``."""
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(None)
        except (OSError, TypeError):  # TypeError: Windows takes no None
            lib = None
        _libc = lib if lib is not None and hasattr(lib, "malloc_trim") else False
    return _libc or None


def _trim(libc) -> tuple[float | None, float | None]:
    """``malloc_trim(0)``; the resident MiB before and after it."""
    before = resident_mib()
    libc.malloc_trim(0)
    return before, resident_mib()


def release_freed_memory() -> float | None:
    """Hand the memory glibc's ``malloc`` holds freed back to the system now (``malloc_trim(0)``), whatever
    ``HF_SPECDRAFT_TRIM_MIB`` says. Returns the MiB given back, or ``None`` where there is no glibc."""
    libc = _glibc()
    if libc is None:
        return None
    before, after = _trim(libc)
    return None if before is None or after is None else max(before - after, 0.0)


def after_call(threshold: float | None) -> float | None:
    """What the loop runs when a call has ended and released its locks, with the ``threshold`` it read before the call
    (:func:`trim_threshold_mib`; ``None``: off, nothing is read or trimmed): a trim once the process has grown
    ``threshold`` MiB past its floor (see the module docstring). Returns the MiB the trim gave back, ``None`` when none
    ran."""
    global _floor, _trimming
    if not threshold:
        return None
    libc = _glibc()
    if libc is None:
        return None
    now = resident_mib()
    if now is None:
        return None
    with _lock:
        if _floor is None or now < _floor:
            _floor = now
            return None
        if now - _floor < threshold or _trimming:
            return None
        _trimming = True
    before = after = None
    try:
        before, after = _trim(libc)  # outside the lock: no thread waits for it
    finally:
        with _lock:
            _trimming = False
            if after is not None:
                _floor = max(_floor, after)  # what a trim cannot give back is live: the floor moves up to it
    return None if before is None or after is None else max(before - after, 0.0)
