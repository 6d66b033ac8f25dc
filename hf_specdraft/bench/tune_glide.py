"""Tune GLIDE's γ and CAPE's verification budget for a target on this hardware (glide_cape §5.1, §5.3).

The paper fixes γ = 5 and a 32-token budget for 7B-33B targets on GPUs, where a 32-token verification costs
about what a 1-token one does. On a small target on a CPU it does not (SmolLM2-135M, 2 cores, the loop's transposed linears:
2–4 tokens ≈ 1.0–1.1×, 6 ≈ 1.4×, 12 ≈ 1.9×, 32 ≈ 2.3× a one-token forward), so both are tuned here — on completion items after the bench's own
prompts, ranked by wall-time ratio against target-only measured in the same run (methods interleaved)::

    python -m hf_specdraft.bench.tune_glide --num-prompts 6 --output benchmarks/results/cpu-tune-glide.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..defaults.tasks import build_tasks
from .harness import BenchConfig, run_bench
from .methods import METHODS, Method, _speculative, _with_expansion_sizes, register_method

GAMMAS = (1, 2, 3, 4, 5)
CAPE_SETTINGS = ((1, 3), (2, 3), (2, 5), (3, 7), (4, 7), (3, 12))  # (γ, budget): a budget of B verifies ≤ B + 1 tokens


def register_grid() -> tuple[list[str], list[str]]:
    """One bench method per GLIDE γ and per (γ, CAPE budget); returns the two lists of names."""
    from ..cape import build_cape_for_bench
    from ..glide import GlideCandidateGenerator

    gammas, capes = [], []
    for gamma in GAMMAS:
        name = f"glide-gamma{gamma}"
        if name not in METHODS:
            register_method(Method(name, lambda ctx, g=gamma: _speculative(ctx, candidate_generator=GlideCandidateGenerator(ctx.extras["glide"], g)),
                                   requires=("glide",), description=f"GLIDE γ={gamma}", cost_models=lambda e: {"draft": e["glide"]}))
        gammas.append(name)
    for gamma, budget in CAPE_SETTINGS:
        name = f"glide+cape-gamma{gamma}-budget{budget}"
        if name not in METHODS:
            register_method(Method(name, lambda ctx, g=gamma, b=budget: _with_expansion_sizes(
                ctx, build_cape_for_bench(GlideCandidateGenerator(ctx.extras["glide"], g), budget=b)),
                requires=("glide",), description=f"GLIDE γ={gamma} + CAPE, budget {budget}", cost_models=lambda e: {"draft": e["glide"]}))
        capes.append(name)
    return gammas, capes


def tuning_parser(description: str, skip_prompts: int = 20, max_new_tokens: int = 48) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--skip-prompts", type=int, default=skip_prompts, help="tune on the items after the bench's own first N")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--output", type=Path, default=None)
    return parser


def run_tuning(parser: argparse.ArgumentParser, argv: list[str] | None, task: str, grids: dict[str, list[str]], module: str) -> dict:
    """Run target-only and every method of ``grids`` side by side on ``task`` items after the bench's own; rank each
    grid by wall-time ratio (``result["<grid>_ranking"]``), print the rankings, write ``--output``; return the result."""
    from ..defaults import load_default

    args = parser.parse_args(argv)
    for flag, value in (("--num-prompts", args.num_prompts), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            parser.error(f"{flag} must be a positive int, got {value}")
    if args.skip_prompts < 0:
        parser.error(f"--skip-prompts must be 0 or more, got {args.skip_prompts}")
    methods = [name for grid in grids.values() for name in grid]
    config = BenchConfig(task=task, methods=("target-only", *methods), num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens)
    items = build_tasks(task, count=args.skip_prompts + args.num_prompts, seed=config.seed,
                        context_prompt_chars=config.context_prompt_chars)[args.skip_prompts :]
    result = run_bench(load_default(), config, items=items)
    result["meta"]["prompts"] = f"{task} items {args.skip_prompts}..{args.skip_prompts + args.num_prompts - 1} (seed {config.seed})"
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
            print(f"{name:36s} speedup {s['speedup_vs_target_only']:.3f}  MAL {s['mean_accepted_length']:.2f}  "
                  f"draft ms/step {s['draft_ms_per_step']:.1f}  verified/step {s['verification_tokens_per_step']:.1f}")
    return result


def main(argv: list[str] | None = None) -> int:
    gammas, capes = register_grid()
    run_tuning(tuning_parser(__doc__.split("\n")[0]), argv, "completion", {"gamma": gammas, "cape": capes}, "hf_specdraft.bench.tune_glide")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
