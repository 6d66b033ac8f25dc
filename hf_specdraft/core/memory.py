"""Freed host memory handed back to the system between calls, on request, so a long-running process does not grow.

glibc's ``malloc`` keeps much of what calls of varied lengths free in its arenas, fragmented (+90 MiB after 350 varied
calls on a 2-core Xeon VM, nearly all given back by ``malloc_trim(0)``). Off by default, as ``malloc_trim`` holds every
arena's lock while it runs: ``HF_SPECDRAFT_TRIM_MIB`` (MiB, e.g. ``32``) turns it on. After a call
:func:`after_call` trims once the resident size has grown that much past its floor (where the first call left the
process; it moves down with the process, and up when a trim cannot get under it), outside every lock.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

# the opt-in: MiB of growth past the floor that triggers a trim (unset, empty or 0: never)
ENV = "HF_SPECDRAFT_TRIM_MIB"
TRIM_MIB = 32  # the threshold the memory measurements ran with: small against a model, rare against a call's buffers

_lock = threading.Lock()  # guards _floor and _trimming only: never held while malloc_trim runs
_floor: float | None = None  # resident MiB a call may end at without a trim, less the threshold (after_call)
_trimming = False  # a thread is trimming now: others skip theirs rather than wait


def resident_mib() -> float | None:
    """The process's resident set in MiB (``/proc/self/statm``), or ``None`` where there is no ``/proc``."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def trim_threshold_mib() -> float | None:
    """The MiB of growth past the floor that triggers a trim, from ``HF_SPECDRAFT_TRIM_MIB`` (``None``: off). Read
    before a call starts, so a malformed value raises ``ValueError`` before any forward."""
    value = os.environ.get(ENV, "")
    if not value.strip():
        return None
    try:
        mib = float(value)
    except ValueError:
        mib = float("nan")
    if not mib >= 0 or mib == float("inf"):  # NaN, negative or infinite
        raise ValueError(
            f"{ENV} must be unset, 0 (never trim: the default) or a positive number of MiB (e.g. {TRIM_MIB}), "
            f"got {value!r}"
        )
    return mib or None


@functools.cache
def _glibc():
    """The process's own C library when it is glibc (``CDLL(None)``: no search, no subprocess), else ``None``."""
    try:
        lib = ctypes.CDLL(None)
    except (OSError, TypeError):  # TypeError: Windows takes no None
        return None
    return lib if hasattr(lib, "malloc_trim") else None


def _trim(libc) -> tuple[float | None, float | None]:
    """``malloc_trim(0)``; the MiB it gave back and the resident MiB after it (``None``: not known)."""
    before = resident_mib()
    libc.malloc_trim(0)
    after = resident_mib()
    return (None if before is None or after is None else max(before - after, 0.0)), after


def release_freed_memory() -> float | None:
    """Hand the memory glibc's ``malloc`` holds freed back to the system now (``malloc_trim(0)``), whatever
    ``HF_SPECDRAFT_TRIM_MIB`` says. Returns the MiB given back, or ``None`` where there is no glibc."""
    libc = _glibc()
    return None if libc is None else _trim(libc)[0]


def after_call(threshold: float | None) -> float | None:
    """After a call has ended and released its locks: a trim once the process has grown ``threshold`` MiB past its
    floor (``None``: off). Returns the MiB given back, or ``None`` when no trim ran."""
    global _floor, _trimming
    libc = _glibc() if threshold else None
    now = None if libc is None else resident_mib()
    if now is None:
        return None
    with _lock:
        if _floor is None or now < _floor:
            _floor = now
            return None
        if now - _floor < threshold or _trimming:
            return None
        _trimming = True
    given = after = None
    try:
        given, after = _trim(libc)  # outside the lock: no thread waits for it
    finally:
        with _lock:
            _trimming = False
            if after is not None:
                _floor = max(_floor, after)  # what a trim cannot give back is live: the floor moves up to it
    return given
