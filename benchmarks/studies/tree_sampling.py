"""Trees under sampling: multi-branch rejection sampling vs token matching, on the default target (one run).

GLIDE + CAPE with ``do_sample=True`` (temperature 1, no top-k / top-p) on held-out completion prompts. The same
trees are verified two ways, each run seeded alike per prompt:

- ``rejection``: :func:`~hf_specdraft.core.acceptance.tree_rejection_sampling` (the loop's default for trees that carry
  q and ``sampled`` flags): a drawn chain token passes with ``min(1, p/q)``;
- ``matching``: the same drafter with its trees' ``sampled`` flags dropped, so the loop falls back to token
  matching (a node passes when it equals the target's own sample at its parent's row).

Both are lossless; the figure is how many drafted tokens each accepts. GLIDE's chain with speculative sampling
is the reference row::

    python -m benchmarks.studies.tree_sampling --num-prompts 10 --output benchmarks/sampling/cpu-tree-sampling.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from hf_specdraft.bench.harness import environment, prompt_ids
from benchmarks.methods import CAPE_BUDGET, CAPE_GAMMA, GLIDE_GAMMA
from hf_specdraft.core.drafting import TreeCandidateGenerator
from hf_specdraft.core.loop import speculative_generate
from hf_specdraft.core.stats import SpeculativeStats
from hf_specdraft.core.tree import DraftTree


class WithoutSampledFlags(TreeCandidateGenerator):
    """Wraps a drafter and drops the ``sampled`` flags of its trees: the loop then verifies them by token matching."""

    def __init__(self, drafter: TreeCandidateGenerator):
        super().__init__()
        self.drafter = drafter

    def prepare(self, target, generation_config) -> None:
        super().prepare(target, generation_config)
        self.drafter.prepare(target, generation_config)

    def propose(self, input_ids, target_cache=None) -> DraftTree:
        tree = self.drafter.propose(input_ids, target_cache)
        self.forward_calls = dict(self.drafter.forward_calls)
        return DraftTree(tree.tokens, tree.parents, tree.draft_probs)


def main(argv: list[str] | None = None) -> int:
    from hf_specdraft.cape import build_cape_for_bench
    from hf_specdraft.defaults import load_default
    from hf_specdraft.defaults.tasks import build_tasks
    from hf_specdraft.glide import GlideCandidateGenerator

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    for flag, value in (("--num-prompts", args.num_prompts), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            parser.error(f"{flag} must be a positive int, got {value}")
    bundle = load_default()
    glide = bundle.extras["glide"]
    drafters = {
        "glide (chain, speculative sampling)": lambda: GlideCandidateGenerator(glide, num_draft_tokens=GLIDE_GAMMA),
        "glide+cape, rejection": lambda: build_cape_for_bench(
            GlideCandidateGenerator(glide, num_draft_tokens=CAPE_GAMMA), budget=CAPE_BUDGET
        ),
        "glide+cape, matching": lambda: WithoutSampledFlags(
            build_cape_for_bench(GlideCandidateGenerator(glide, num_draft_tokens=CAPE_GAMMA), budget=CAPE_BUDGET)
        ),
    }
    items = build_tasks("completion", count=args.num_prompts, seed=args.seed)
    sampling = {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "max_new_tokens": args.max_new_tokens,
        "eos_token_id": bundle.tokenizer.eos_token_id,
        "pad_token_id": bundle.tokenizer.pad_token_id,
    }
    stats: dict[str, list[SpeculativeStats]] = {name: [] for name in drafters}
    seconds = dict.fromkeys(drafters, 0.0)
    for index, item in enumerate(tqdm(items, desc="tree sampling")):
        ids = prompt_ids(bundle.tokenizer, item)
        for name, make in drafters.items():
            torch.manual_seed(args.seed * 1000 + index)
            start = time.perf_counter()
            out = speculative_generate(
                bundle.target, ids, candidate_generator=make(), return_dict_in_generate=True, **sampling
            )
            seconds[name] += time.perf_counter() - start
            stats[name].append(out.speculative_stats)
    summary = {}
    for name, runs in stats.items():
        merged = SpeculativeStats.merge(runs)
        summary[name] = {
            "mean_accepted_length": merged.mean_accepted_length,
            "accepted_tokens": merged.accepted_tokens,
            "steps": merged.num_steps,
            "new_tokens": merged.new_tokens,
            "position_acceptance_rate": merged.position_acceptance_rate,
            "alpha": merged.alpha,
            "verification_tokens_per_step": merged.verification_tokens_per_step,
            "tokens_per_second": merged.new_tokens / seconds[name],
        }
    result = {
        "meta": {
            **environment(bundle),
            "task": "completion",
            "num_prompts": len(items),
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "sampling": {k: v for k, v in sampling.items() if k not in ("eos_token_id", "pad_token_id")},
            "cape": {"gamma": CAPE_GAMMA, "budget": CAPE_BUDGET},
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": "python -m benchmarks.studies.tree_sampling " + " ".join(sys.argv[1:] if argv is None else argv),
        },
        "summary": summary,
    }
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    for name, s in summary.items():
        print(
            f"{name:38s} MAL {s['mean_accepted_length']:.2f}  accepted/judged {s['position_acceptance_rate']:.3f}  "
            f"tok/s {s['tokens_per_second']:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
