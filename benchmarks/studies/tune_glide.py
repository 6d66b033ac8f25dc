"""Tune GLIDE's γ and CAPE's verification budget for a target on this hardware (Du et al. 2024, §5.1, §5.3).

The paper fixes γ = 5 and a 32-token budget for 7B-33B targets on GPUs, where a 32-token verification costs
about what a 1-token one does. On a small target on a CPU it does not, and the cost curve differs between CPUs
(SmolLM2-135M, 2 cores: 2–4 tokens ≈ 1.0–1.1×, 6 ≈ 1.4× a one-token forward on an AMD EPYC VM; 2–3 tokens ≈ 1.0–1.1×,
4 ≈ 1.5× on an AVX-512 Xeon VM; ``python -m benchmarks.studies.projection``), so both are tuned per machine — on
completion items after the bench's own prompts, ranked by wall-time ratio against target-only in the same run (methods
interleaved)::

    python -m benchmarks.studies.tune_glide --num-prompts 6 --output benchmarks/results/cpu-tune-glide.json
"""

from __future__ import annotations

from hf_specdraft.bench.methods import METHODS, Method, register_method, speculative_run, with_expansion_sizes
from .tuning import run_tuning, tuning_parser

GAMMAS = (1, 2, 3, 4, 5)
# (γ, budget): a budget of B verifies ≤ B + 1 tokens
CAPE_SETTINGS = ((1, 2), (2, 2), (1, 3), (2, 3), (2, 5), (3, 5), (3, 7), (4, 7), (3, 12))


def register_grid() -> tuple[list[str], list[str]]:
    """One bench method per GLIDE γ and per (γ, CAPE budget); returns the two lists of names."""
    from hf_specdraft.cape import build_cape_for_bench
    from hf_specdraft.glide import GlideCandidateGenerator

    gammas, capes = [], []
    for gamma in GAMMAS:
        name = f"glide-gamma{gamma}"
        if name not in METHODS:
            register_method(
                Method(
                    name,
                    lambda ctx, g=gamma: speculative_run(
                        ctx, candidate_generator=GlideCandidateGenerator(ctx.extras["glide"], num_draft_tokens=g)
                    ),
                    requires=("glide",),
                    description=f"GLIDE γ={gamma}",
                )
            )
        gammas.append(name)
    for gamma, budget in CAPE_SETTINGS:
        name = f"glide+cape-gamma{gamma}-budget{budget}"
        if name not in METHODS:
            register_method(
                Method(
                    name,
                    lambda ctx, g=gamma, b=budget: with_expansion_sizes(
                        ctx,
                        build_cape_for_bench(
                            GlideCandidateGenerator(ctx.extras["glide"], num_draft_tokens=g), budget=b
                        ),
                    ),
                    requires=("glide",),
                    description=f"GLIDE γ={gamma} + CAPE, budget {budget}",
                )
            )
        capes.append(name)
    return gammas, capes


def main(argv: list[str] | None = None) -> int:
    gammas, capes = register_grid()
    run_tuning(
        tuning_parser(__doc__.split("\n")[0]),
        argv,
        "completion",
        {"gamma": gammas, "cape": capes},
        "benchmarks.studies.tune_glide",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
