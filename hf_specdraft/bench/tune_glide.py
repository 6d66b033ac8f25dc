"""Tune GLIDE's γ and CAPE's verification budget for a target on this hardware (glide_cape §5.1, §5.3).

The paper fixes γ = 5 and a 32-token budget for 7B-33B targets on GPUs, where a 32-token verification costs
about what a 1-token one does. On a small target on a CPU it does not (SmolLM2-135M, 2 cores: 6 tokens ≈ 1.3×,
32 tokens ≈ 2× a one-token forward), so both are tuned here — on completion items after the bench's own
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
CAPE_SETTINGS = ((2, 8), (3, 8), (3, 12), (5, 12), (5, 32))  # (γ, budget)


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


def main(argv: list[str] | None = None) -> int:
    from ..defaults import load_default

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--skip-prompts", type=int, default=20, help="tune on the items after the bench's own first N")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    for flag, value in (("--num-prompts", args.num_prompts), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            parser.error(f"{flag} must be a positive int, got {value}")
    gammas, capes = register_grid()
    config = BenchConfig(methods=("target-only", *gammas, *capes), num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens)
    items = build_tasks("completion", count=args.skip_prompts + args.num_prompts, seed=config.seed)[args.skip_prompts :]
    result = run_bench(load_default(), config, items=items)
    result["meta"]["prompts"] = f"completion items {args.skip_prompts}..{args.skip_prompts + args.num_prompts - 1} (seed {config.seed})"
    result["meta"]["command"] = "python -m hf_specdraft.bench.tune_glide " + " ".join(sys.argv[1:] if argv is None else argv)
    speed = lambda n: -result["summary"][n]["speedup_vs_target_only"]  # noqa: E731
    result["gamma_ranking"], result["cape_ranking"] = sorted(gammas, key=speed), sorted(capes, key=speed)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    for name in [*result["gamma_ranking"], *result["cape_ranking"]]:
        s = result["summary"][name]
        print(f"{name:36s} speedup {s['speedup_vs_target_only']:.3f}  MAL {s['mean_accepted_length']:.2f}  "
              f"draft ms/step {s['draft_ms_per_step']:.1f}  verified/step {s['verification_tokens_per_step']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
