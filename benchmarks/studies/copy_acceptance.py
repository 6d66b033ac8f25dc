"""How far do GLIDE's copies from the text run before the target leaves them? (What the copy rule has to learn.)

Runs GLIDE on the embedded default with a fixed γ and every copy ``max(COPY_TOKENS, γ)`` tokens (``max_copy_tokens``:
not sized by the controller, so how far each copy was right is seen up to that length) over held-out prompts of each
task, and records per step whether it was a copy, the length of the suffix match it copied after, and how many tokens
were accepted. Acceptance only: no timing, so it may run beside other work.

    python -m benchmarks.studies.copy_acceptance --output benchmarks/verification/cpu-copy-acceptance.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
from pathlib import Path

import torch
import transformers

from hf_specdraft import GlideCandidateGenerator, speculative_generate
from hf_specdraft.bench.harness import cpu_model, prompt_ids
from hf_specdraft.core.suffix_match import longest_suffix_match
from hf_specdraft.defaults import load_default
from hf_specdraft.defaults.tasks import build_tasks
from hf_specdraft.glide import candidate_generator


def match_lengths(drafter: GlideCandidateGenerator) -> list[int]:
    """Wraps ``drafter``'s copy step so each proposal's suffix-match length is recorded (0: GLIDE drafted)."""
    seen, copy = [], drafter._copy

    def recorded(input_ids):
        tree = copy(input_ids)
        seen.append(
            longest_suffix_match(input_ids[0], max_match_length=candidate_generator.COPY_MATCH_CAP)[1]
            if tree is not None
            else 0
        )
        return tree

    drafter._copy = recorded
    return seen


def summarize(steps: list[dict]) -> dict:
    copies = [s for s in steps if s["match"]]
    by_match = collections.defaultdict(list)
    for s in copies:
        by_match[min(s["match"], 16)].append(s["accepted"])  # 16: 16 or longer
    return {
        "steps": len(steps),
        "copy_steps": len(copies),
        "mean_accepted_copy": round(sum(s["accepted"] for s in copies) / max(len(copies), 1), 3),
        "mean_accepted_glide": round(
            sum(s["accepted"] for s in steps if not s["match"]) / max(len(steps) - len(copies), 1), 3
        ),
        "copies_accepted_whole": sum(s["accepted"] == s["drafted"] for s in copies),
        "copy_accepted_histogram": dict(sorted(collections.Counter(s["accepted"] for s in copies).items())),
        "copy_by_match_length": {
            k: {"copies": len(v), "mean_accepted": round(sum(v) / len(v), 3)} for k, v in sorted(by_match.items())
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="completion,chat")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--num-draft-tokens", type=int, default=8, help="the fixed γ: copies are max(COPY_TOKENS, γ) tokens"
    )
    parser.add_argument(
        "--copy-from-context", type=int, default=3, help="the shortest suffix match copied after (GlideDraftingConfig)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", required=True)
    ns = parser.parse_args(argv)
    bundle = load_default()
    target, glide, tokenizer = bundle.target, bundle.extras["glide"], bundle.tokenizer
    result = {
        "command": "python -m benchmarks.studies.copy_acceptance "
        + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "machine": {
            "cpu": cpu_model(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "num_draft_tokens": ns.num_draft_tokens,
        "copy_from_context": ns.copy_from_context,
        "copy_tokens": max(candidate_generator.COPY_TOKENS, ns.num_draft_tokens),
        "num_prompts": ns.num_prompts,
        "max_new_tokens": ns.max_new_tokens,
        "seed": ns.seed,
        "tasks": {},
    }
    for task in ns.tasks.split(","):
        steps = []
        for item in build_tasks(task, count=ns.num_prompts, seed=ns.seed):
            drafter = GlideCandidateGenerator(
                glide,
                num_draft_tokens=ns.num_draft_tokens,
                copy_from_context=ns.copy_from_context,
                max_copy_tokens=result["copy_tokens"],
            )
            matches = match_lengths(drafter)
            out = speculative_generate(
                target,
                prompt_ids(tokenizer, item),
                candidate_generator=drafter,
                max_new_tokens=ns.max_new_tokens,
                return_dict_in_generate=True,
            )
            for match, step in zip(matches, out.speculative_stats.steps):
                steps.append({"match": match, "drafted": step.drafted, "accepted": step.accepted})
        result["tasks"][task] = summarize(steps)
        print(task, json.dumps(result["tasks"][task]), flush=True)
    Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.output).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
