"""The loop's own host time and host-device crossings per step, on a target that costs next to nothing.

    python benchmarks/verification/static/loop_overhead.py --label after \\
        --output benchmarks/verification/static/loop-overhead-cpu.json
    python benchmarks/verification/static/loop_overhead.py --label gpu --device cuda --dtype bf16 --target default \\
        --output $OUT/loop-overhead-gpu.json

A 1-layer, 32-wide Llama (vocabulary 96) and drafters that cost nothing: an always-right 5-token chain (6 tokens a
step) and a 16-node tree (4 levels of the right token and 3 wrong siblings), their tokens host data. Every forward of
the target is timed and taken out, so what is left per step is the loop's own work: building the step's inputs and
masks, acceptance, emission, stop checks, statistics, cache compaction. Measured on the ``DynamicCache`` path and the
static path (eager, and compiled with dynamo's ``eager`` backend: the graphs of the real path, without codegen).
The crossings are counted in a separate run of the same calls (``tests/syncs.py``'s ``SyncCounter``; steps
after the first two). On CUDA every timed forward is synchronized before and after (what is left is the host's own
work), the compiled path uses transformers' ``CompileConfig()`` (inductor, CUDA graphs), and ``--target default`` adds
the embedded default (SmolLM2-135M) beside the near-free target: the loop's time against a real verify forward.

Each row gives ``loop_ms_per_step`` (the call's whole time but its forwards and prefill, over its steps: the call's
fixed costs, ``generate``'s own preparation included, spread over ~20 steps), ``step_ms`` (the time inside the steps
alone, but their forwards: what each further step costs) and ``call_fixed_ms`` (the rest, once a call).
``--label`` names the code measured; runs with other labels already in ``--output`` are kept,
so a "before" run on an older checkout and an "after" run sit side by side (this file and ``tests/syncs.py``
are copied there).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

from hf_specdraft import speculative_generate
from hf_specdraft.core import static_layout
from hf_specdraft.core import loop as loop_module
from hf_specdraft.core.drafting import TreeCandidateGenerator
from hf_specdraft.core.tree import DraftTree

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))  # the crossing counter is a test instrument
from syncs import SyncCounter

VOCAB, NEW_TOKENS, REPEATS = 96, 120, 7


class Always(TreeCandidateGenerator):
    """Knows the target's greedy continuation; ``siblings`` wrong tokens beside the right one on ``depth`` levels."""

    reads_target_cache = False

    def __init__(self, reference: list[int], depth: int, siblings: int, vocab: int = VOCAB):
        super().__init__()
        self.reference, self.depth, self.siblings, self.vocab = reference, depth, siblings, vocab

    def propose(self, input_ids, target_cache=None):
        start = input_ids.shape[1]
        tokens, parents, parent = [], [], -1
        for right in self.reference[start : start + self.depth]:
            for k in range(self.siblings):
                tokens.append((right + 1 + k) % self.vocab)
                parents.append(parent)
            tokens.append(right)
            parents.append(parent)
            parent = len(tokens) - 1
        return DraftTree(tokens, parents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="what code is measured, e.g. before / after")
    parser.add_argument("--output", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument(
        "--target", default="tiny", choices=["tiny", "default"], help="default: also the embedded default"
    )
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed calls per row (the median is kept)")
    args = parser.parse_args()
    globals()["REPEATS"] = args.repeats
    device, dtype = torch.device(args.device), torch.bfloat16 if args.dtype == "bf16" else torch.float32
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=512,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    targets = {
        "tiny": (
            LlamaForCausalLM(config).eval().to(device, dtype),
            torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(1)),
        )
    }
    if args.target == "default":
        from hf_specdraft.defaults import load_default

        bundle = load_default()
        targets["smollm2"] = (
            bundle.target.to(device, dtype),
            bundle.tokenizer("def quicksort(arr):\n", return_tensors="pt").input_ids,
        )
    rows = []
    for name, (target, ids) in targets.items():
        rows += measure(name, target, ids.to(device), cuda)
    write(args, rows)


def measure(name: str, target, ids: torch.Tensor, cuda: bool) -> list[dict]:
    """The rows of one target: each drafter on each path."""
    vocab = target.config.vocab_size
    reference = target.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
    forwards: list[float] = []
    for owner in (static_layout.StaticLayout,):
        original = owner._forward

        def timed(self, *args, __original=original, **inputs):
            sync()
            started = time.perf_counter()
            out = __original(self, *args, **inputs)
            sync()
            forwards.append(time.perf_counter() - started)
            return out

        owner._forward = timed
    plain_forward = LlamaForCausalLM.forward

    @functools.wraps(plain_forward)  # the loop reads the forward's signature
    def timed_forward(self, *a, **k):
        sync()
        started = time.perf_counter()
        out = plain_forward(self, *a, **k)
        sync()
        forwards.append(time.perf_counter() - started)
        return out

    def sync():
        if cuda:
            torch.cuda.synchronize()

    steps_seconds: list[float] = []  # inside speculative_steps: the steps alone, without the call's fixed costs
    plain_steps = loop_module.speculative_steps

    def timed_steps(*a, **k):
        started = time.perf_counter()
        out = plain_steps(*a, **k)
        steps_seconds.append(time.perf_counter() - started)
        return out

    loop_module.speculative_steps = timed_steps
    rows = []
    # CPU: dynamo's graphs, no codegen
    compiling = CompileConfig() if cuda else CompileConfig(backend="eager", mode=None)
    paths = {
        "dynamic": {},
        "static": {"cache_implementation": "static", "disable_compile": True},
        "static-compiled": {"cache_implementation": "static", "compile_config": compiling},
    }
    for drafter, (depth, siblings) in {"chain-5": (5, 0), "tree-16": (4, 3)}.items():
        for path, kwargs in paths.items():

            def call(**extra):
                return speculative_generate(
                    target,
                    ids,
                    candidate_generator=Always(reference, depth, siblings, vocab),
                    max_new_tokens=NEW_TOKENS,
                    return_dict_in_generate=True,
                    **kwargs,
                    **extra,
                )

            call()
            if path == "dynamic":
                LlamaForCausalLM.forward = timed_forward
            loop_ms, step_ms, call_ms = [], [], []
            for _ in range(REPEATS):
                forwards.clear()
                steps_seconds.clear()
                started = time.perf_counter()
                out = call()
                total = time.perf_counter() - started
                steps = len(out.speculative_stats.steps)
                # one verification forward a step (the dynamic path's prefill is timed too)
                verify = sum(forwards[-steps:])
                loop_ms.append(1000 * (total - verify - out.speculative_stats.prefill_seconds) / steps)
                step_ms.append(1000 * (steps_seconds[-1] - verify) / steps)
                call_ms.append(1000 * (total - steps_seconds[-1] - out.speculative_stats.prefill_seconds))
            forward_ms = 1000 * verify / steps
            LlamaForCausalLM.forward = plain_forward
            with SyncCounter() as syncs:
                counted = call()
            later = syncs.per_step[2:]
            row = {
                "target": name,
                "drafter": drafter,
                "path": path,
                "steps": steps,
                "loop_ms_per_step": statistics.median(loop_ms),
                "loop_ms_per_step_runs": loop_ms,
                "step_ms": statistics.median(step_ms),
                "step_ms_runs": step_ms,
                "call_fixed_ms": statistics.median(call_ms),
                "forward_ms": forward_ms,
                "syncs_per_step": statistics.mean(later),
                "syncs_per_step_max": max(later),
                "token_identical": counted.sequences[0].tolist() == reference[: counted.sequences.shape[1]],
                "syncs_first_two_steps": syncs.per_step[:2],
                "syncs_where": dict(sorted(syncs.where.items(), key=lambda kv: -kv[1])[:12]),
            }
            rows.append(row)
            print(
                {k: v for k, v in row.items() if k not in ("syncs_where", "loop_ms_per_step_runs", "step_ms_runs")},
                flush=True,
            )
    owner._forward, LlamaForCausalLM.forward = original, plain_forward
    loop_module.speculative_steps = plain_steps
    return rows


def write(args, rows: list[dict]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip("\t: ")
    run = {"label": args.label, "commit": commit, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    if args.device.startswith("cuda"):
        cpu += f"; {torch.cuda.get_device_name()}"
    result = {
        "meta": {
            "cpu": cpu,
            "device": args.device,
            "threads": torch.get_num_threads(),
            "dtype": args.dtype,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "target": "tiny: LlamaForCausalLM, 1 layer, hidden 32, vocab 96 (random); smollm2: the embedded default",
            "max_new_tokens": NEW_TOKENS,
            "repeats": REPEATS,
            "command": "python benchmarks/verification/static/loop_overhead.py --label LABEL --output FILE",
        },
        "runs": [],
    }
    if args.output and os.path.exists(args.output):
        previous = json.load(open(args.output))
        result["runs"] = [r for r in previous.get("runs", []) if r["label"] != args.label]
    result["runs"].append(run)
    if args.output:
        with open(args.output, "w") as f:
            f.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
