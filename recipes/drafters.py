"""Train the default target's GLIDE and vanilla drafters (``python -m recipes.training --parts glide,vanilla``).

Each lands in ``<default dir>/glide`` or ``<default dir>/vanilla`` as a Hub-ready GLIDE checkpoint (with
``training_log.json``, a model card and ``recipe.json``), trained on the default's train token stream.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from .recipe import GLIDE_RECIPES, Recipe

LICENSE = "apache-2.0"  # the shipped drafters' weights carry the project's license (pyproject.toml)


def train_default_drafter(kind: str, output_dir: Path, recipe: Recipe, train_ids: torch.Tensor) -> dict:
    """Train ``kind`` ("glide" or "vanilla") for the target in ``output_dir/target``; returns its training log."""
    from hf_specdraft import write_glide_custom_generate
    from hf_specdraft.glide import GlideConfig, GlideForCausalLM, GlideTrainingArguments, train_glide

    if kind not in ("glide", "vanilla"):
        raise ValueError(f"kind must be 'glide' or 'vanilla', got {kind!r}")
    spec = GLIDE_RECIPES[recipe.name]
    target = AutoModelForCausalLM.from_pretrained(output_dir / "target", dtype=torch.float32).eval()
    args = GlideTrainingArguments(
        output_dir=str(output_dir / kind),
        **spec["training"],
        license=LICENSE,
        dataset_name="hf-specdraft embedded default train split (stdlib + dependency source)",
    )
    config = GlideConfig.from_target_config(
        target.config, **spec["model"], cross_attention=kind == "glide", tie_word_embeddings=True
    )
    torch.manual_seed(args.seed)
    log = train_glide(
        target, GlideForCausalLM(config), train_ids.long(), args, custom_generate=write_glide_custom_generate
    )
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    (output_dir / kind / "recipe.json").write_text(
        json.dumps({"recipe": spec, "hash": digest, "target_recipe": recipe.name}, indent=1) + "\n"
    )
    return log


def write_drafter_cards(
    output_dir: str | Path, bench_json: str | Path, agreement_json: str | Path | None = None
) -> list[Path]:
    """Rewrite the model cards of ``output_dir``'s GLIDE and vanilla drafters with the numbers a bench run measured.

    Reads the rows of a ``hf-specdraft bench`` result on this default (``bench_json``) that use each drafter
    (GLIDE alone, with CAPE, in stock assisted decoding; the vanilla drafter; the small draft in the two-draft
    cascade) and records α, mean accepted length, c, E(speedup) and the wall-time ratio; with ``agreement_json`` (the
    result of ``python -m benchmarks.studies.state_glide``) also each drafter's greedy agreement at draft steps 1-3,
    each given the earlier ones, and α at step 1. Returns the cards written.

        python -m recipes.drafters hf_specdraft/defaults/checkpoint_smollm2 benchmarks/results/cpu-completion.json \
            benchmarks/verification/cpu-state-glide.json
    """
    from hf_specdraft.glide import GlideConfig
    from hf_specdraft.glide.model_card import write_model_card

    output_dir, result = Path(output_dir), json.loads(Path(bench_json).read_text())
    agreement = json.loads(Path(agreement_json).read_text()) if agreement_json is not None else None
    meta, summary, written = result["meta"], result["summary"], []
    for kind, rows in (
        ("glide", ("glide", "glide+cape", "stock-assisted-glide")),
        ("vanilla", ("vanilla", "stock-assisted")),
        ("small", ("cascade-2drafts",)),
    ):
        folder = output_dir / kind
        if not (folder / "config.json").is_file() or rows[0] not in summary:
            continue
        from benchmarks.methods import METHODS  # the package's rows and the lab's (glide, glide+cape, cascade-2drafts)

        drafts = ", ".join(sorted(set(meta.get("draft_dtypes", {}).values())))
        dtype = meta["dtype"] + (f" (drafters {drafts})" if drafts else "")
        metrics = {
            "measured on": f"{meta['hardware']}, {dtype}, target {meta.get('target', 'not recorded')}, "
            f"{meta['num_prompts']} held-out prompts of task `{meta['task']}` x {meta['max_new_tokens']} tokens, "
            f"greedy ({meta['date']})"
        }
        for row in rows:
            s = summary.get(row)
            if s is None:
                continue
            cells = {
                "α (1 - TV(p, q))": s.get("alpha"),
                "accepted / judged positions": s.get("position_acceptance_rate"),
                "mean accepted length": s["mean_accepted_length"],
                "c": s.get("cost_coefficient"),
                "E(speedup)": s.get("expected_speedup"),
                "wall-time speedup vs target-only": s["speedup_vs_target_only"],
                "vs target-only with few_token_linears": s.get("speedup_vs_target_only_linears"),
            }
            described = f" ({METHODS[row].description})" if row in METHODS else ""
            metrics[f"{row}{described}"] = ", ".join(
                f"{name} {value:.3f}" for name, value in cells.items() if value is not None
            )
        measured = (agreement or {}).get("drafters", {}).get(kind)
        if measured:
            steps = " / ".join(f"{a:.3f}" for a in measured["agreement_by_step"])
            metrics["greedy agreement at draft steps 1 / 2 / 3, each given the earlier ones"] = (
                f"{steps}; α at step 1 {measured['alpha_step_1']:.3f} (teacher-forced on {agreement['heldout_tokens']} "
                f"tokens the target wrote for held-out prompts; hf-specdraft's `{agreement_json}`)"
            )
        config = GlideConfig.from_pretrained(folder)
        log = (
            json.loads((folder / "training_log.json").read_text()) if (folder / "training_log.json").is_file() else None
        )
        write_model_card(
            config,
            folder,
            base_model=config.target_name_or_path,
            dataset=(log or {}).get("arguments", {}).get("dataset_name"),
            metrics=metrics,
            training_log=log,
            license=LICENSE,
        )
        written.append(folder / "README.md")
    return written


if __name__ == "__main__":
    import sys

    if len(sys.argv) not in (3, 4):
        raise SystemExit("usage: python -m recipes.drafters CHECKPOINT_DIR BENCH_JSON [AGREEMENT_JSON]")
    for card in write_drafter_cards(*sys.argv[1:]):
        print(f"wrote {card}")
