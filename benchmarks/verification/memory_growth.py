"""Does the default call's process grow over many calls of varied lengths? (The memory check of docs/cpu-notes.md.)

Runs the README's default call (``speculative_generate(target, ids, draft_model=glide)`` on the embedded default) over
``--calls`` prompts of varied lengths (held-out code cut at random points, 8 to 400 tokens) and varied
``max_new_tokens`` (4 to 32), after ``--warmup`` calls of the same kind, and records the process's resident memory
(``VmRSS``) every ``--every`` calls. Freed buffers of ever new sizes stay in glibc's arenas and per-shape kernel caches
(oneDNN's primitive cache on CPU) grow until their capacity; the loop trims the heap once the process grew
``HF_SPECDRAFT_TRIM_MIB`` past its floor (:mod:`hf_specdraft.core.memory`). The trim is off in the library by default;
this script turns it on at ``--trim-mib`` (32 unless told, the setting the documented bound was measured with; ``0``:
off) so that it keeps measuring that bound. The JSON says where the process settles. ``--method plain`` runs
``target.generate`` alone; ``--trim`` records the size after a ``malloc_trim(0)`` at every sample too.

    python benchmarks/verification/memory_growth.py --output benchmarks/verification/memory-49-cpu.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import time
from pathlib import Path

import torch
import transformers


def rss_mib() -> float:
    """The process's resident set size in MiB (Linux ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def varied_calls(tokenizer, seed: int):
    """Endless varied calls: ``(ids, max_new_tokens)``, ids `(1, L)` cut from held-out code at random (L in 8..400),
    ``max_new_tokens`` in 4..32."""
    from hf_specdraft.defaults.tasks import build_tasks

    texts = [
        tokenizer(item.prompt + item.reference, add_special_tokens=False).input_ids
        for item in build_tasks("completion", count=60)
    ]
    stream = [token for text in texts for token in text]
    rng = random.Random(seed)
    while True:
        length = rng.randint(8, 400)
        start = rng.randrange(0, len(stream) - length)
        yield torch.tensor([stream[start : start + length]]), rng.randint(4, 32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True)
    parser.add_argument(
        "--method",
        choices=("default", "plain"),
        default="default",
        help="default: the README's call; plain: target.generate alone, to tell the loop's growth from torch's",
    )
    parser.add_argument(
        "--trim",
        action="store_true",
        help="at each sample also call glibc's malloc_trim(0) and record the size after it: "
        "growth that trim gives back is freed memory the allocator kept, not live memory",
    )
    parser.add_argument(
        "--trim-mib",
        default="32",
        help="HF_SPECDRAFT_TRIM_MIB for the loop's own trim between calls (0: off, the library's default)",
    )
    ns = parser.parse_args(argv)
    os.environ["HF_SPECDRAFT_TRIM_MIB"] = ns.trim_mib  # explicit: the library trims only when asked
    from hf_specdraft import speculative_generate
    from hf_specdraft.bench.harness import cpu_model
    from hf_specdraft.core.memory import trim_threshold_mib
    from hf_specdraft.defaults import load_default

    bundle = load_default()
    target, glide, tokenizer = bundle.target, bundle.extras["glide"], bundle.tokenizer
    calls = varied_calls(tokenizer, ns.seed)
    trims: list = []  # each call's released_mib (None: no trim at its end)

    def call() -> tuple[int, int]:
        ids, new = next(calls)
        if ns.method == "plain":
            target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        else:
            out = speculative_generate(target, ids, draft_model=glide, max_new_tokens=new, return_dict_in_generate=True)
            trims.append(out.speculative_stats.extra.get("released_mib"))
        return ids.shape[1], new

    libc = ctypes.CDLL("libc.so.6") if ns.trim else None

    samples = []
    began = time.time()
    for n in range(1, ns.warmup + ns.calls + 1):
        call()
        if n == ns.warmup or (n > ns.warmup and (n - ns.warmup) % ns.every == 0):
            samples.append(
                {
                    "calls_after_warmup": n - ns.warmup,
                    "rss_mib": round(rss_mib(), 1),
                    "seconds": round(time.time() - began, 1),
                }
            )
            if libc is not None:
                libc.malloc_trim(0)
                samples[-1]["rss_after_trim_mib"] = round(rss_mib(), 1)
            print(samples[-1], flush=True)
    base = samples[0]["rss_mib"]
    trimmed = sum(t is not None for t in trims[ns.warmup :])
    result = {
        "command": "python benchmarks/verification/memory_growth.py "
        + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "machine": {
            "cpu": cpu_model(),
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "trim_threshold_mib": trim_threshold_mib(),
        "calls_that_trimmed": trimmed,
        "dtypes": {"target": str(target.dtype), "glide": str(glide.dtype)},
        "glide": {
            "state_input": getattr(glide.config, "state_input", False),
            "self_attention": getattr(glide.config, "self_attention", True),
        },
        "method": ns.method,
        "malloc_trim_at_samples": ns.trim,
        "allocator_env": {
            k: os.environ[k]
            for k in ("MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "LD_PRELOAD")
            if k in os.environ
        },
        "calls": ns.calls,
        "warmup": ns.warmup,
        "prompt_tokens": [8, 400],
        "max_new_tokens": [4, 32],
        "onednn_primitive_cache_capacity": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "default (1024)"),
        "rss_after_warmup_mib": base,
        "rss_end_mib": samples[-1]["rss_mib"],
        "growth_mib": round(samples[-1]["rss_mib"] - base, 1),
        "max_growth_mib": round(max(s["rss_mib"] for s in samples) - base, 1),
        "samples": samples,
    }
    Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"growth after warm-up: {result['growth_mib']} MiB (max {result['max_growth_mib']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
