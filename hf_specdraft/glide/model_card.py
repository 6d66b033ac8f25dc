"""The model card a GLIDE checkpoint ships with (huggingface_hub ``ModelCard``): metadata, usage, shape, training, results.

    card = write_model_card(glide.config, "glide-out", base_model="meta-llama/Llama-3.2-1B", dataset="my corpus",
                            metrics={"acceptance_rate": 0.61, "expected_speedup": 1.8})
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData


def _hub_id(name: str | None) -> str | None:
    """``name`` when it looks like a Hub repo id (``org/name``, not a local path), else `None`."""
    if not name or os.path.exists(name) or name.startswith((".", "/", "~")) or name.count("/") != 1:
        return None
    return name


def write_model_card(config, output_dir, base_model: str | None = None, dataset: str | None = None,
                     metrics: dict | None = None, training_log: dict | None = None) -> ModelCard:
    """Generate ``output_dir/README.md``: metadata (base model, data, tags) and what the checkpoint is and measured.

    Args:
        config: the GLIDE config.
        base_model: the target (a Hub id goes into the ``base_model`` metadata; a local path only into the text).
        dataset: the training data (a Hub id goes into ``datasets`` metadata).
        metrics: measured numbers, e.g. ``acceptance_rate``, ``mean_accepted_length``, ``expected_speedup``,
            ``walltime_speedup``, ``num_draft_tokens``, ``hardware``.
        training_log: the log :func:`train_glide` returns (steps, final loss, time).
    """
    kind = "GLIDE" if config.cross_attention else "vanilla drafter (GLIDE without cross-attention)"
    data = ModelCardData(base_model=_hub_id(base_model), datasets=[_hub_id(dataset)] if _hub_id(dataset) else None,
                         library_name="transformers", pipeline_tag="text-generation",
                         tags=["speculative-decoding", "glide", "draft-model", "hf-specdraft", "custom_code"])
    lines = [f"# {kind} draft model for `{base_model or config.target_model_type}`", "",
             "A draft model for speculative decoding (Du et al. 2024, *GLIDE with a CAPE*, §4.1): "
             + ("each layer cross-attends to the target model's KV cache." if config.cross_attention else "no cross-attention; a baseline for GLIDE."),
             "", "## Usage", "", "```python",
             "from transformers import AutoModelForCausalLM",
             f'target = AutoModelForCausalLM.from_pretrained("{base_model or "<target>"}")',
             'glide = AutoModelForCausalLM.from_pretrained("<this repo>", trust_remote_code=True)',
             *(["glide.attach(target)  # the draft reads the target's live KV cache"] if config.cross_attention else []),
             "out = target.generate(**inputs, assistant_model=glide, max_new_tokens=128)", "```", "",
             "## Architecture", "", "| | |", "|---|---|",
             f"| layers / hidden size | {config.num_hidden_layers} / {config.hidden_size} |",
             f"| target layers read | {config.target_layer_ids if config.cross_attention else '-'} |",
             f"| target | {config.target_model_type}, {config.target_num_hidden_layers} layers, {config.target_num_attention_heads} heads "
             f"({config.target_num_key_value_heads} KV), head_dim {config.target_head_dim}, vocab {config.target_vocab_size} |",
             "", "## Training", "", f"- data: {dataset or 'not recorded'}"]
    if training_log and training_log.get("steps"):
        last, args = training_log["steps"][-1], training_log.get("arguments", {})
        lines += [f"- {last['step']} steps, {last['tokens']} tokens, final loss {last['loss']}, {training_log.get('train_seconds')} s "
                  f"on {training_log.get('processes', 1)} process(es); block-wise mask L = {args.get('block_size') or config.block_size}, "
                  f"lr {args.get('learning_rate')}, distillation weight {args.get('distillation_weight', 0.0)}"]
    lines += ["", "## Evaluation", ""]
    lines += [f"- {name.replace('_', ' ')}: {value}" for name, value in (metrics or {}).items()] or ["- not measured yet"]
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")
    card.save(str(Path(output_dir) / "README.md"))
    return card
