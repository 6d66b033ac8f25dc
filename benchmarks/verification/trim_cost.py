"""What does trimming the heap between calls cost the default call? (hf_specdraft/core/memory.py.)

Runs the README's default call over the same varied prompts as ``memory_growth.py`` (8-400 prompt tokens, 4-32 new
tokens), in blocks that alternate the trim on (``HF_SPECDRAFT_TRIM_MIB`` at 32, ``TRIM_MIB``) and off (``0``, the
library's default), each block the same calls in the same order, and compares the blocks' seconds. A trim's cost lands
partly in the next call (the pages it gave back are faulted in again), so blocks, not single calls, are compared.

    python benchmarks/verification/trim_cost.py --output benchmarks/verification/trim-cost-cpu.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=25, help="calls per block")
    parser.add_argument("--blocks", type=int, default=4, help="blocks per setting, alternating")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True)
    ns = parser.parse_args(argv)
    from hf_specdraft import speculative_generate
    from hf_specdraft.bench.harness import cpu_model
    from hf_specdraft.core.memory import TRIM_MIB
    from hf_specdraft.defaults import load_default
    from memory_growth import varied_calls  # this folder's script: the same calls

    bundle = load_default()
    target, glide, tokenizer = bundle.target, bundle.extras["glide"], bundle.tokenizer
    calls = list(itertools.islice(varied_calls(tokenizer, ns.seed), ns.calls))

    def block(trim_mib: str) -> tuple[float, int]:
        os.environ["HF_SPECDRAFT_TRIM_MIB"] = trim_mib
        trims, began = 0, time.perf_counter()
        for ids, new in calls:
            out = speculative_generate(target, ids, draft_model=glide, max_new_tokens=new, return_dict_in_generate=True)
            trims += out.speculative_stats.extra.get("released_mib") is not None
        return time.perf_counter() - began, trims

    for ids, new in calls[: ns.warmup]:
        speculative_generate(target, ids, draft_model=glide, max_new_tokens=new)
    runs = {"on": [], "off": []}
    for b in range(ns.blocks):
        for setting in ("on", "off") if b % 2 == 0 else ("off", "on"):
            seconds, trims = block(str(TRIM_MIB) if setting == "on" else "0")
            runs[setting].append({"seconds": round(seconds, 3), "trims": trims})
            print(setting, runs[setting][-1], flush=True)
    on, off = (statistics.median(r["seconds"] for r in runs[k]) for k in ("on", "off"))
    result = {
        "command": "python benchmarks/verification/trim_cost.py "
        + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "machine": {
            "cpu": cpu_model(),
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "calls_per_block": ns.calls,
        "blocks": ns.blocks,
        "trim_mib": TRIM_MIB,
        "runs": runs,
        "median_seconds_on": round(on, 3),
        "median_seconds_off": round(off, 3),
        "on_over_off": round(on / off, 4),
    }
    Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"trim on / off: {result['on_over_off']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
