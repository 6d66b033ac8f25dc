"""Does the default call's process grow over many calls of varied lengths? (#49's memory check.)

Runs the README's default call (``speculative_generate(target, ids, draft_model=glide)`` on the embedded default) over
``--calls`` prompts of varied lengths (held-out code cut at random points, 8 to 400 tokens) and varied ``max_new_tokens``
(4 to 32), after ``--warmup`` calls of the same kind, and records the process's resident memory (``VmRSS``) every
``--every`` calls. Per-shape kernel caches (oneDNN's primitive cache on CPU, for one) grow with every new shape until
their capacity; the JSON says where the process settles.

    python benchmarks/verification/memory_growth.py --output benchmarks/verification/memory-49-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

import torch


def rss_mib() -> float:
    """The process's resident set size in MiB (Linux ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True)
    ns = parser.parse_args(argv)
    from hf_specdraft import speculative_generate
    from hf_specdraft.bench.harness import cpu_model
    from hf_specdraft.defaults import load_default
    from hf_specdraft.defaults.tasks import build_tasks

    bundle = load_default()
    target, glide, tokenizer = bundle.target, bundle.extras["glide"], bundle.tokenizer
    texts = [tokenizer(item.prompt + item.reference, add_special_tokens=False).input_ids for item in build_tasks("completion", count=60)]
    stream = [token for text in texts for token in text]
    rng = random.Random(ns.seed)

    def call() -> tuple[int, int]:
        length = rng.randint(8, 400)
        start = rng.randrange(0, len(stream) - length)
        ids = torch.tensor([stream[start : start + length]])
        new = rng.randint(4, 32)
        speculative_generate(target, ids, draft_model=glide, max_new_tokens=new)
        return length, new

    samples = []
    began = time.time()
    for n in range(1, ns.warmup + ns.calls + 1):
        call()
        if n == ns.warmup or (n > ns.warmup and (n - ns.warmup) % ns.every == 0):
            samples.append({"calls_after_warmup": n - ns.warmup, "rss_mib": round(rss_mib(), 1), "seconds": round(time.time() - began, 1)})
            print(samples[-1], flush=True)
    base = samples[0]["rss_mib"]
    result = {
        "command": "python benchmarks/verification/memory_growth.py " + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "machine": {"cpu": cpu_model(), "threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__},
        "dtypes": {"target": str(target.dtype), "glide": str(glide.dtype)},
        "glide": {"state_input": getattr(glide.config, "state_input", False), "self_attention": getattr(glide.config, "self_attention", True)},
        "calls": ns.calls, "warmup": ns.warmup, "prompt_tokens": [8, 400], "max_new_tokens": [4, 32],
        "onednn_primitive_cache_capacity": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "default (1024)"),
        "rss_after_warmup_mib": base, "rss_end_mib": samples[-1]["rss_mib"], "growth_mib": round(samples[-1]["rss_mib"] - base, 1),
        "max_growth_mib": round(max(s["rss_mib"] for s in samples) - base, 1), "samples": samples,
    }
    Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"growth after warm-up: {result['growth_mib']} MiB (max {result['max_growth_mib']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
