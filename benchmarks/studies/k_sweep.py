"""Search the cascade's K matrix for a target and its drafts (Chen et al. 2024, Algorithm 1, §5.1).

The paper tunes K per model family (its FLAN-T5 and LLaMA settings differ); the defaults here are the
official code's. This runs a grid of K matrices through the bench harness on the same prompts, in one
run, and ranks them by SWI from the parameter-count heuristic (deterministic: it counts calls, not
seconds), with the measured-cost SWI and the wall-time ratio beside it. It tunes on task items after the
bench's own 20 prompts, so a K chosen here is then measured on prompts it was not chosen on::

    python -m benchmarks.studies.k_sweep --drafts 2 --num-prompts 8 --output benchmarks/results/cpu-k-sweep.json
    # a CPU where verifying more than ~4 tokens costs extra (bench.projection): the target reviews <= 4 tokens
    python -m benchmarks.studies.k_sweep --drafts 1 --grid short --gammas 2,3,4 --num-prompts 5 --max-new-tokens 48 \
        --output benchmarks/results/cpu-k-sweep-short.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from benchmarks import methods  # noqa: F401  (registers the cascade-1draft / cascade-2drafts baselines)
from hf_specdraft.bench.harness import BenchConfig, run_bench
from hf_specdraft.bench.methods import METHODS, Method, cascade_run, register_method, speculative_run
from hf_specdraft.cascade.max_gram import MAX_GRAM_TOKENS
from hf_specdraft.core.drafting import DraftModelCandidateGenerator
from hf_specdraft.defaults.tasks import build_tasks


GRIDS = ("paper", "short", "mag")


def k_grid(num_drafts: int, grid: str = "paper") -> list[list[list[int]]]:
    """Candidate K matrices for one or two neural drafts + Max-Gram.

    ``grid="paper"``: budgets around the official code's (MaG's row keeps its 10 tokens), for hardware where
    verifying 15 tokens costs about one. ``grid="short"`` (one draft, reviewing 4 MaG tokens a forward): for hardware
    where verification cost grows past a few tokens (a small target on a CPU: ``bench.projection``):
    ``K[0] = (a, b)`` with ``2 <= a + b <= 4``. Algorithm 1's base case returns all of MaG's tokens at once, so a
    non-zero MaG budget adds MaG's whole draft (``max_gram_tokens``, the paper's 10) to the level: ``grid="mag"``
    (one draft) crosses a few short K with MaG lengths (``register_grid``'s ``max_gram_tokens``), each level asking
    MaG once.
    """
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
    if grid in ("short", "mag") and num_drafts != 1:
        raise ValueError(f"the {grid} grid is for one neural draft (num_drafts=1)")
    if grid == "short":
        return [[[a, b], [0, 4]] for a in (1, 2, 3, 4) for b in (0, 1, 2, 3) if 2 <= a + b <= 4]
    if grid == "mag":
        return [[[a, b], [0, 1]] for a, b in ((2, 0), (3, 0), (1, 1), (2, 1))]
    if num_drafts == 1:
        return [[[k, m], [0, 10]] for k, m in itertools.product((1, 2, 3, 5, 8), (4, 10))]
    if num_drafts == 2:
        return [[[a, b, 10], [0, c, 10], [0, 0, 10]] for a, b, c in itertools.product((3, 5), (2, 6, 14), (1, 3))]
    raise ValueError(f"num_drafts must be 1 or 2, got {num_drafts!r}")


def register_grid(
    num_drafts: int, grid: str = "paper", max_gram_tokens: tuple[int, ...] = (MAX_GRAM_TOKENS,)
) -> dict[str, list[list[int]]]:
    """Register one bench method per K matrix and MaG length; returns {method name: K}."""
    names = {}
    for k_matrix, mag in itertools.product(k_grid(num_drafts, grid), max_gram_tokens):
        name = f"cascade-{num_drafts}d-K{json.dumps(k_matrix, separators=(',', ':'))}" + (
            f"-mag{mag}" if mag != MAX_GRAM_TOKENS else ""
        )

        def run(ctx, k=k_matrix, mag=mag):
            drafts = [ctx.draft] if num_drafts == 1 else [ctx.draft, ctx.extras["small_draft"]]
            return cascade_run(ctx, drafts, k, max_gram_tokens=mag)

        if name not in METHODS:
            register_method(
                Method(
                    name,
                    run,
                    requires=("draft",) if num_drafts == 1 else ("draft", "small_draft"),
                    description=f"CS drafting, K = {k_matrix}, MaG {mag} tokens",
                )
            )
        names[name] = k_matrix
    return names


def register_draft_gammas(gammas: tuple[int, ...] = (2, 3, 4, 5, 8)) -> list[str]:
    """Plain speculative decoding with each γ: the SD baseline gets the same tuning as the cascade's K."""
    names = []
    for gamma in gammas:
        name = f"draft-model-gamma{gamma}"
        if name not in METHODS:
            register_method(
                Method(
                    name,
                    lambda ctx, g=gamma: speculative_run(
                        ctx, candidate_generator=DraftModelCandidateGenerator(ctx.draft, num_draft_tokens=g)
                    ),
                    requires=("draft",),
                    description=f"plain draft γ={gamma}",
                )
            )
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    from hf_specdraft.defaults import load_default

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafts", type=int, default=2, choices=(1, 2), help="neural drafts in the cascade")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument(
        "--skip-prompts",
        type=int,
        default=20,
        help="tune on the task's items after the first N (the bench's own prompts), so K is not chosen on them",
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--grid",
        default="paper",
        choices=GRIDS,
        help="see k_grid: short keeps the target's review to <= 4 tokens; mag crosses short K with --max-gram-tokens",
    )
    parser.add_argument(
        "--max-gram-tokens",
        default=str(MAX_GRAM_TOKENS),
        help="MaG's draft lengths to cross with the grid (comma-separated)",
    )
    parser.add_argument(
        "--gammas", default="2,3,5,8", help="the plain draft's γ values run beside the grid (SD baseline)"
    )
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        gammas = tuple(int(g) for g in args.gammas.split(","))
        lengths = tuple(int(m) for m in args.max_gram_tokens.split(","))
        if any(g < 1 for g in gammas) or any(m < 1 for m in lengths):
            raise ValueError(
                f"--gammas and --max-gram-tokens must be positive integers, got {args.gammas!r} and "
                f"{args.max_gram_tokens!r}"
            )
        names = register_grid(args.drafts, args.grid, lengths)
        gammas = register_draft_gammas(gammas)
    except ValueError as error:
        parser.error(str(error))
    baseline = gammas + ["cascade-1draft"] + (["cascade-2drafts"] if args.drafts == 2 else [])
    config = BenchConfig(
        methods=("target-only", *baseline, *names), num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens
    )
    items = build_tasks("completion", count=args.skip_prompts + args.num_prompts, seed=config.seed)[args.skip_prompts :]
    result = run_bench(load_default(), config, items=items)
    result["meta"]["prompts"] = (
        f"completion items {args.skip_prompts}..{args.skip_prompts + args.num_prompts - 1} (seed {config.seed})"
    )
    result["meta"]["command"] = "python -m benchmarks.studies.k_sweep " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    result["k_matrices"] = names
    result["ranking"] = sorted(names, key=lambda n: -(result["summary"][n]["swi_parameters"] or 0))
    result["draft_model_ranking"] = sorted(gammas, key=lambda n: -(result["summary"][n]["swi_parameters"] or 0))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    for name in [*baseline, *result["ranking"]]:
        s = result["summary"][name]
        cells = [
            f"{label} {'-' if s[key] is None else format(s[key], '.3f')}"
            for label, key in (
                ("SWI(params)", "swi_parameters"),
                ("SWI(measured)", "swi_measured"),
                ("tok/call", "tokens_per_target_call"),
                ("speedup", "speedup_vs_target_only"),
            )
        ]
        print(f"{name:60s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
