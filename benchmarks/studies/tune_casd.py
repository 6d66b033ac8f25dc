"""Tune CASD's draft-tree size for a target on this hardware (the CASD paper, §3: the tree 𝕋 of eq. 2, REST's 64 nodes).

CASD inherits REST's 64 draft nodes per step, chosen where verifying 64 tokens costs what one does (a GPU).
On a CPU it does not (SmolLM2-135M, 2 cores: 12 tokens ≈ 1.9×, 32 ≈ 2.3× a one-token forward, see
``python -m benchmarks.studies.projection``), so the tree's node budget is tuned here, strict (lossless)
verification, on ``context`` items after the bench's own prompts, ranked by wall-time ratio against
target-only measured in the same run (methods interleaved)::

    python -m benchmarks.studies.tune_casd --num-prompts 6 --output benchmarks/results/cpu-tune-casd.json
"""

from __future__ import annotations

from hf_specdraft.bench.methods import METHODS, Method, casd_run, register_method
from .tuning import run_tuning, tuning_parser

MAX_NODES = (4, 8, 16, 32, 64)


def register_grid() -> list[str]:
    """One bench method per CASD node budget (strict verification); returns their names."""
    names = []
    for nodes in MAX_NODES:
        name = f"casd-strict-nodes{nodes}"
        if name not in METHODS:
            register_method(
                Method(
                    name,
                    lambda ctx, n=nodes: casd_run(ctx, strict=True, max_nodes=n),
                    tasks=("context",),
                    description=f"CASD strict, at most {nodes} draft nodes per step",
                )
            )
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = tuning_parser(__doc__.split("\n")[0], skip_prompts=8)
    run_tuning(parser, argv, "context", {"nodes": register_grid()}, "benchmarks.studies.tune_casd")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
