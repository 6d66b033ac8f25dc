"""Train the default target's GLIDE and vanilla drafters (``hf-specdraft train-default --parts glide,vanilla``).

Each lands in ``<default dir>/glide`` or ``<default dir>/vanilla`` as a Hub-ready GLIDE checkpoint (with
``training_log.json``, a model card and ``recipe.json``), trained on the default's train token stream.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from .recipe import GLIDE_RECIPES, Recipe


def train_default_drafter(kind: str, output_dir: Path, recipe: Recipe, train_ids: torch.Tensor) -> dict:
    """Train ``kind`` ("glide" or "vanilla") for the target in ``output_dir/target``; returns its training log."""
    from ..glide import GlideConfig, GlideForCausalLM, GlideTrainingArguments, train_glide

    if kind not in ("glide", "vanilla"):
        raise ValueError(f"kind must be 'glide' or 'vanilla', got {kind!r}")
    spec = GLIDE_RECIPES[recipe.name]
    target = AutoModelForCausalLM.from_pretrained(output_dir / "target", dtype=torch.float32).eval()
    config = GlideConfig.from_target_config(target.config, num_hidden_layers=spec.num_hidden_layers, hidden_size=spec.hidden_size,
                                            cross_attention=kind == "glide", tie_word_embeddings=True, block_size=spec.block_size)
    torch.manual_seed(spec.seed)
    model = GlideForCausalLM(config)
    args = GlideTrainingArguments(output_dir=str(output_dir / kind), max_steps=spec.steps, seq_len=spec.seq_len,
                                  per_device_batch_size=spec.batch_size, learning_rate=spec.learning_rate, warmup_steps=spec.warmup_steps,
                                  seed=spec.seed, dataset_name="hf-specdraft embedded default train split (stdlib + dependency source)")
    log = train_glide(target, model, train_ids.long(), args)
    (output_dir / kind / "recipe.json").write_text(json.dumps({"recipe": spec.to_dict(), "hash": spec.hash(), "target_recipe": recipe.name}, indent=1) + "\n")
    return log
