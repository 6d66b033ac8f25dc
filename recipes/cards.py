"""Model cards of the shipped drafters, from the measurements that judged them: per group of held-out requests.

The numbers come from two runs over the project's held-out prompts (``hf_specdraft/defaults/spec_prompts.jsonl``):

- ``python -m benchmarks.studies.group_agreement``: greedy agreement at draft steps 1-3, each given the earlier ones,
  teacher-forced on the target's answers, and the first step's agreement in the loop (γ = 1, copying off);
- ``hf-specdraft bench --prompts``: the default call's speedup and mean accepted length per group (optional).

    python -m recipes.cards hf_specdraft/defaults/checkpoint_smollm2/glide --study group-agreement.json --name glide \\
        --bench spec-prompts.json --method glide+copy-auto
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GROUP_NAMES = {
    "multi-turn": "multi-turn conversation",
    "qa": "question answering",
    "math_reasoning": "math reasoning",
    "rag": "retrieval-augmented generation",
}


def group_card_metrics(study: dict, name: str, bench: dict | None = None, method: str | None = None) -> dict:
    """The card's evaluation lines for drafter ``name`` of a group-agreement ``study`` (and ``method``'s row of a
    ``bench`` run with ``--prompts``), one line per group of requests."""
    if name not in study.get("drafters", {}):
        raise ValueError(f"name must be one of the study's drafters {sorted(study.get('drafters', {}))}, got {name!r}")
    drafter, meta = study["drafters"][name], study["meta"]
    metrics = {
        "held-out requests": f"{meta['requests']} ({meta['prompts']}), the target answering "
        f"{meta['max_new_tokens']} tokens greedily; {meta['cpu']}, {meta['threads']} threads"
    }
    for group, steps in drafter["teacher_forced_steps_1_3"].items():
        line = " / ".join(f"{value:.3f}" for value in steps)
        in_loop = drafter.get("in_loop_step_1", {}).get(group)
        if in_loop is not None:
            line += f"; step 1 in the loop {in_loop['agreement']:.3f}"
        metrics[f"{GROUP_NAMES.get(group, group)}: greedy agreement at draft steps 1 / 2 / 3"] = line
    if bench is not None:
        if method is None:
            raise ValueError("method is required with bench: the bench row to report (e.g. 'glide+copy-auto')")
        for group, result in bench["categories"].items():
            row = result["methods"].get(method)
            if row is not None:
                metrics[f"{GROUP_NAMES.get(group, group)}: `{method}` vs plain generate (speedup, MAL)"] = (
                    f"{row['speedup_vs_target_only']:.2f}x, {row['mal']:.2f}"
                )
    return metrics


def rewrite_card(checkpoint: str | Path, metrics: dict) -> Path:
    """Regenerate ``checkpoint``'s model card with ``metrics``; its data and training stages from its training log."""
    from hf_specdraft.defaults.smollm2 import HUB_ID
    from hf_specdraft.glide import GlideForCausalLM
    from hf_specdraft.glide.model_card import write_model_card

    from .drafters import LICENSE
    from .smollm2_drafters import DATASET

    checkpoint = Path(checkpoint)
    model = GlideForCausalLM.from_pretrained(checkpoint)
    log = json.loads((checkpoint / "training_log.json").read_text())
    write_model_card(
        model.config,
        checkpoint,
        base_model=HUB_ID,
        dataset=DATASET,
        metrics=metrics,
        training_log=log,
        custom_generate=not model.config.state_input,
        license=LICENSE,
    )
    return checkpoint / "README.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a drafter checkpoint directory (its README.md is rewritten)")
    parser.add_argument("--study", required=True, help="python -m benchmarks.studies.group_agreement's JSON")
    parser.add_argument("--name", required=True, help="the drafter's name in the study (--drafter NAME=PATH)")
    parser.add_argument("--bench", help="hf-specdraft bench --prompts' JSON")
    parser.add_argument("--method", help="with --bench: the row to report")
    ns = parser.parse_args(argv)
    if not (Path(ns.checkpoint) / "training_log.json").is_file():
        parser.error(f"{ns.checkpoint!r} holds no training_log.json: not a drafter this project trained")
    try:
        metrics = group_card_metrics(
            json.loads(Path(ns.study).read_text()),
            ns.name,
            json.loads(Path(ns.bench).read_text()) if ns.bench else None,
            ns.method,
        )
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {rewrite_card(ns.checkpoint, metrics)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
