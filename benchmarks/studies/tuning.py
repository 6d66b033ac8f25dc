"""What every tuning run shares (tune_glide, tune_casd): its arguments, and running a grid of bench methods beside
target-only on task items the bench does not report, ranked by wall-time ratio."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hf_specdraft.bench.harness import BenchConfig, run_bench
from hf_specdraft.defaults.tasks import build_tasks


def tuning_parser(description: str, skip_prompts: int = 20, max_new_tokens: int = 48) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument(
        "--skip-prompts", type=int, default=skip_prompts, help="tune on the items after the bench's own first N"
    )
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--output", type=Path, default=None)
    return parser


def run_tuning(
    parser: argparse.ArgumentParser, argv: list[str] | None, task: str, grids: dict[str, list[str]], module: str
) -> dict:
    """Run target-only and every method of ``grids`` side by side on ``task`` items after the bench's own; rank each
    grid by wall-time ratio (``result["<grid>_ranking"]``), print the rankings, write ``--output``; return it."""
    from hf_specdraft.defaults import load_default

    args = parser.parse_args(argv)
    for flag, value in (("--num-prompts", args.num_prompts), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            parser.error(f"{flag} must be a positive int, got {value}")
    if args.skip_prompts < 0:
        parser.error(f"--skip-prompts must be 0 or more, got {args.skip_prompts}")
    methods = [name for grid in grids.values() for name in grid]
    config = BenchConfig(
        task=task, methods=("target-only", *methods), num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens
    )
    items = build_tasks(
        task,
        count=args.skip_prompts + args.num_prompts,
        seed=config.seed,
        context_prompt_chars=config.context_prompt_chars,
    )[args.skip_prompts :]
    result = run_bench(load_default(), config, items=items)
    result["meta"]["prompts"] = (
        f"{task} items {args.skip_prompts}..{args.skip_prompts + args.num_prompts - 1} (seed {config.seed})"
    )
    result["meta"]["command"] = f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)
    speed = lambda n: -result["summary"][n]["speedup_vs_target_only"]  # noqa: E731
    for grid, names in grids.items():
        result[f"{grid}_ranking"] = sorted(names, key=speed)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    for grid in grids:
        for name in result[f"{grid}_ranking"]:
            s = result["summary"][name]
            print(
                f"{name:36s} speedup {s['speedup_vs_target_only']:.3f}  MAL {s['mean_accepted_length']:.2f}  "
                f"draft ms/step {s['draft_ms_per_step']:.1f}  verified/step {s['verification_tokens_per_step']:.1f}"
            )
    return result
