"""Counting what crosses the host-device line in the loop's own code: the measure of a GPU-grade step (a test
instrument: the tests and ``benchmarks/verification/static/loop_overhead.py`` use it; the package never does).

A CUDA step is fast when the host queues the whole step and waits once (gpt-fast's speculative step reads back the
accepted length and the next token, about two syncs). Every ``tensor.item()``, ``tolist()``, ``bool(tensor)``,
``int(tensor)`` of a device tensor waits for the GPU to drain its queue, and so does a copy from pageable host memory
onto the device (``tensor.to(device)``, ``torch.tensor(..., device=...)``): CUDA synchronizes the stream before such a
copy. A step should make one or two of them; the loop makes exactly one read-back per step under greedy decoding.

On a CPU there is no device to tell apart, and ``torch.profiler`` sees no op for ``tolist()`` or a same-device
``to()``. So :class:`SyncCounter` counts at the Python level, the way a test counts allocations: it wraps the Tensor
methods that read a tensor on the host or copy one onto a device, and counts the calls made *from hf_specdraft's own
code* (transformers' model code runs inside the compiled graph on the real path). It counts every such call, on any
tensor: on a CPU a host tensor looks like a device tensor, so the count is an upper bound of a GPU's. Host data is
kept in Python lists for that reason, and host tensors reach the device only through
:func:`~hf_specdraft.core.host.copy_to_device` (pinned memory, no sync), which it does not count.

    >>> with SyncCounter() as syncs:  # doctest: +SKIP
    ...     speculative_generate(target, ids, draft_model=draft, cache_implementation="static")
    >>> syncs.per_step[2:]  # doctest: +SKIP
    [1, 1, 1, ...]
"""

from __future__ import annotations

import os
import sys

import torch

import hf_specdraft
from hf_specdraft.core import loop

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu")  # device -> host
FACTORIES = ("tensor", "as_tensor")  # torch.tensor(..., device=...): a copy from pageable host memory
_ROOT = os.path.dirname(os.path.abspath(hf_specdraft.__file__))  # the package whose code is counted (the one imported)


def _names_a_device(args, kwargs) -> bool:
    if "device" in kwargs:
        return kwargs["device"] is not None
    first = args[0] if args else None
    return isinstance(first, (torch.device, str, int, torch.Tensor)) and not isinstance(first, bool)


class SyncCounter:
    """Counts host-device crossings made by hf_specdraft's code while it is active (a context manager).

    Attributes:
        total (`int`): every counted call.
        per_step (`list[int]`): counted calls in each :func:`~hf_specdraft.core.loop.speculative_step`, in order.
        where (`dict[str, int]`): ``"file:line method"`` -> calls, to find them.
    """

    def __init__(self):
        self.total, self.per_step, self.where = 0, [], {}
        self._saved: list[tuple[object, str, object]] = []
        self._in_step = None

    def _count(self, name: str) -> None:
        frame = sys._getframe(2)
        path = frame.f_code.co_filename
        if not path.startswith(_ROOT):
            return
        self.total += 1
        if self._in_step is not None:
            self._in_step += 1
        key = f"{os.path.relpath(path, _ROOT)}:{frame.f_lineno} {name}"
        self.where[key] = self.where.get(key, 0) + 1

    def _wrap(self, owner, name: str, when=None) -> None:
        original = getattr(owner, name)
        counter = self

        def wrapped(*args, **kwargs):
            if when is None or when(args[1:] if owner is torch.Tensor else args, kwargs):
                counter._count(name)
            return original(*args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, wrapped)

    def _wrap_steps(self) -> None:
        original, counter = loop.speculative_step, self

        def step(*args, **kwargs):
            outer, counter._in_step = counter._in_step, 0
            try:
                return original(*args, **kwargs)
            finally:
                counter.per_step.append(counter._in_step)
                counter._in_step = outer

        self._saved.append((loop, "speculative_step", original))
        loop.speculative_step = step

    def __enter__(self) -> SyncCounter:
        for name in READS:
            self._wrap(torch.Tensor, name)
        self._wrap(torch.Tensor, "to", _names_a_device)  # host -> device, counted when a device is named
        for name in FACTORIES:
            self._wrap(torch, name, lambda args, kwargs: kwargs.get("device") is not None)
        self._wrap(torch, "equal")
        self._wrap_steps()
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
