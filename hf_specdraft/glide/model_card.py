"""A Hub-ready GLIDE checkpoint: model files, the model card (huggingface_hub ``ModelCard``) and ``custom_generate/``.

:func:`save_glide_checkpoint` writes the weights, ``config.json`` with ``auto_map`` and the trust_remote_code files,
``README.md`` and CAPE's ``custom_generate/`` (greedy GLIDE+CAPE, Du et al. 2024, §4.2); with only transformers
installed, the directory (or its Hub copy) then decodes the target::

    target.generate(**inputs, custom_generate="glide-out", trust_remote_code=True, max_new_tokens=64)
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

# what save_glide_checkpoint's card_info may hold
CARD_INFO_KEYS = ("dataset", "metrics", "training_log", "repo_id", "license")
# what a training run leaves in its output directory that is no part of the published model
LOCAL_ONLY = ["checkpoint-last*/**", "regenerated/**", "runs/**"]


def check_license(license) -> None:
    """Raise a `ValueError` unless ``license`` is `None` or a non-empty str (a Hub license id)."""
    if license is not None and (not isinstance(license, str) or not license.strip()):
        raise ValueError(f"license must be None or a Hub license id such as 'apache-2.0', got {license!r}")


def _hub_id(name: str | None) -> str | None:
    """``name`` when it looks like a Hub repo id (``org/name``, not a local path), else `None`."""
    if not name or os.path.exists(name) or name.startswith((".", "/", "~")) or name.count("/") != 1:
        return None
    return name


def save_glide_checkpoint(
    glide, directory, target_name: str | None = None, card_info: dict | None = None, custom_generate=None
) -> Path:
    """Save ``glide`` as a checkpoint that runs on the Hub with only transformers installed: through
    ``target.generate(custom_generate=...)`` (GLIDE+CAPE) or ``assistant_model=glide`` after ``glide.attach(target)``.

    Args:
        glide: a GLIDE model ([`GlideForCausalLM`], or the same class loaded with ``trust_remote_code``).
        directory: the checkpoint directory (created if missing; files there are replaced).
        target_name (`str`, *optional*): the target's Hub id or path; defaults to ``glide.config.target_name_or_path``.
            A Hub id becomes the card's ``base_model``.
        card_info (`dict`, *optional*): more for the card, keys among ``dataset``, ``metrics``, ``training_log``,
            ``repo_id`` (the Hub id the usage snippets load) and ``license``; see [`write_model_card`].
        custom_generate (`Callable`, *optional*): ``writer(directory)`` writing the checkpoint's ``custom_generate/``
            (``hf_specdraft.write_glide_custom_generate`` for CAPE's); `None`: no folder (the card then says so).

    Returns:
        `Path`: the checkpoint directory.
    """
    if custom_generate is not None and not callable(custom_generate):
        raise TypeError(
            f"custom_generate must be callable as writer(directory) or None, got {type(custom_generate).__name__}"
        )
    if getattr(getattr(glide, "config", None), "model_type", None) != "glide" or not hasattr(glide, "save_pretrained"):
        raise TypeError(f"glide must be a GLIDE model (config.model_type 'glide'), got {type(glide).__name__}")
    card_info = dict(card_info or {})
    unknown = sorted(set(card_info) - set(CARD_INFO_KEYS))
    if unknown:
        raise ValueError(f"card_info keys {unknown} are not understood; use {list(CARD_INFO_KEYS)}")
    if target_name is not None and (not isinstance(target_name, str) or not target_name):
        raise ValueError(f"target_name must be a non-empty str (the target's Hub id or path), got {target_name!r}")
    directory = Path(directory)
    glide.save_pretrained(directory)  # weights, config.json with auto_map, modeling_glide.py and its flat siblings
    # the folder's own drafter feeds tokens only: a GLIDE reading the target's state runs through hf_specdraft's loop
    writer = None if getattr(glide.config, "state_input", False) else custom_generate
    write_model_card(
        glide.config,
        directory,
        base_model=target_name or glide.config.target_name_or_path,
        custom_generate=writer is not None,
        **card_info,
    )
    if writer is not None:
        writer(directory)
    return directory


def _usage_lines(config, base_model: str | None, repo_id: str | None, custom_generate: bool) -> list[str]:
    """The card's usage snippet: GLIDE+CAPE through ``custom_generate``, then GLIDE through ``assistant_model``."""
    target, repo = base_model or "<target>", repo_id or "<this repo>"
    lines = [
        "## Usage",
        "",
        "```python",
        "import torch",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        "# float32: in bf16 a tree-verification forward and a one-token forward round differently, so greedy texts can "
        "part",
        f'target = AutoModelForCausalLM.from_pretrained("{target}", dtype=torch.float32)',
        f'inputs = AutoTokenizer.from_pretrained("{target}")("The quick brown fox", return_tensors="pt")',
    ]
    if custom_generate:
        lines += [
            "",
            "# GLIDE + CAPE (tree verification), with only transformers installed; greedy, batch size 1",
            f'out = target.generate(**inputs, custom_generate="{repo}", trust_remote_code=True, max_new_tokens=128)',
        ]
    if getattr(config, "state_input", False):  # transformers' assisted decoding hands a draft model no state
        lines += [
            "",
            "# GLIDE reads the target's last hidden state: hf_specdraft's loop hands it over (pip install "
            "hf-specdraft)",
            "from hf_specdraft import speculative_generate",
            f'glide = AutoModelForCausalLM.from_pretrained("{repo}", trust_remote_code=True)',
            "out = speculative_generate(target, inputs.input_ids, draft_model=glide, max_new_tokens=128)",
            "```",
            "",
        ]
        if not getattr(config, "self_attention", True):
            lines += [
                "In Gemma 4's assistant layout: `hf-specdraft export` writes it as a checkpoint vLLM serves (method "
                "`mtp`).",
                "",
            ]
        return lines
    assisted = ["out = target.generate(**inputs, assistant_model=glide, max_new_tokens=128)"]
    if config.cross_attention:
        assisted = ["glide.attach(target)  # the draft reads the target's live KV cache", *assisted, "glide.detach()"]
    lines += [
        "",
        "# GLIDE in transformers' own assisted decoding",
        f'glide = AutoModelForCausalLM.from_pretrained("{repo}", trust_remote_code=True)',
        *assisted,
        "```",
        "",
    ]
    if custom_generate:
        lines += [
            "`custom_generate/` options (keyword arguments of `generate`): `num_draft_tokens` (γ, default 5), "
            "`verification_budget` (default 32), `expansion_schedule` (default ((.3, 7), (.6, 5), (.8, 3), (1., 1))). "
            "In float32 its output equals the target's greedy decoding.",
            "",
        ]
    return lines


def training_stages(training_log: dict) -> list[dict]:
    """Every stage of a drafter's training, oldest first, the log's own run last (``earlier_stages``, or in older logs
    ``stage_1``)."""
    earlier = training_log.get("earlier_stages") or ([training_log["stage_1"]] if training_log.get("stage_1") else [])
    return [stage for stage in (*earlier, training_log) if stage and stage.get("steps")]


def _training_lines(config, dataset: str | None, training_log: dict | None) -> list[str]:
    lines = ["## Training", "", f"- data: {dataset or 'not recorded'}"]
    if training_log and training_log.get("steps"):
        last, args = training_log["steps"][-1], training_log.get("arguments", {})
        for number, stage in enumerate(training_stages(training_log)[:-1], start=1):
            head = stage["steps"][-1]
            lines.append(
                f"- stage {number}: {head['step']} steps, {head.get('tokens', '?')} tokens, final loss {head['loss']}, "
                f"{stage.get('train_seconds')} s; then, from its weights:"
            )
        lines += [
            f"- {last['step']} steps, {last['tokens']} tokens, final loss {last['loss']}, "
            f"{training_log.get('train_seconds')} s on {training_log.get('processes', 1)} process(es); block-wise mask "
            f"L = {args.get('block_size') or config.block_size}, lr {args.get('learning_rate')}, distillation weight "
            f"{args.get('distillation_weight', 0.0)}"
        ]
    regen = (training_log or {}).get("regeneration")
    if regen:
        temperature = regen.get("temperature")
        sampling = f"temperature {temperature}, top-p {regen.get('top_p')}" if temperature else "greedy (temperature 0)"
        lines.append(
            "- responses regenerated by the target (sequence-level self-distillation, Du et al. 2024, Appendix B): "
            f"{sampling}, up to {regen.get('max_new_tokens')} new tokens, {regen.get('examples')} examples"
            + {"last": ", the last assistant turn of each conversation", "each": ", every assistant turn"}.get(
                regen.get("kind") == "messages" and regen.get("turns"), ""
            )
        )
    return lines


def _evaluation_lines(config, metrics: dict | None, training_log: dict | None) -> list[str]:
    """The held-out evaluation the run measured (:mod:`.evaluation`), the vanilla twin's beside it, then ``metrics``."""
    lines = []
    evaluation = (training_log or {}).get("eval")
    if evaluation:
        block = (training_log.get("arguments") or {}).get("block_size") or config.block_size
        lines += [
            f"Held-out data at step {evaluation.get('step')} ({evaluation.get('eval_positions')} positions; α = mean "
            f"Σ_x min(p, q), Leviathan et al. 2023, teacher-forced with the block-wise mask L = {block}):",
            "",
            f"- α: {evaluation.get('alpha')}",
            f"- greedy agreement: {evaluation.get('greedy_agreement')}",
        ]
        if evaluation.get("tokens_per_forward") is not None:
            loop = "hf_specdraft's loop, greedy, default γ"
            lines.append(f"- tokens per target forward ({loop}): {evaluation['tokens_per_forward']}")
    twin = (training_log or {}).get("vanilla_twin")
    if twin and twin.get("eval"):
        scores, per_forward = twin["eval"], twin["eval"].get("tokens_per_forward")
        lines.append(
            f"- vanilla twin (no cross-attention, data: {twin.get('dataset')}): α {scores.get('alpha')}, "
            f"greedy agreement {scores.get('greedy_agreement')}"
            + (f", tokens per target forward {per_forward}" if per_forward else "")
        )
    lines += [f"- {name.replace('_', ' ')}: {value}" for name, value in (metrics or {}).items()]
    return lines or ["- not measured yet"]


def push_checkpoint(output_dir, repo_id: str) -> str:
    """Upload a checkpoint directory but ``LOCAL_ONLY`` to the Hub repo ``repo_id`` (created if missing); returns the
    commit URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=str(output_dir),
        commit_message="Upload GLIDE draft model",
        ignore_patterns=LOCAL_ONLY,
    )
    return str(getattr(commit, "commit_url", commit))


def write_model_card(
    config,
    output_dir,
    base_model: str | None = None,
    dataset: str | None = None,
    metrics: dict | None = None,
    training_log: dict | None = None,
    repo_id: str | None = None,
    custom_generate: bool = True,
    license: str | None = None,
) -> ModelCard:
    """Generate ``output_dir/README.md``: metadata (base model, data, tags), usage, shape, training, results.

    Args:
        config: the GLIDE config.
        base_model: the target (a Hub id goes into the ``base_model`` metadata; a local path only into the text).
        dataset: the training data (a Hub id goes into ``datasets`` metadata).
        metrics: measured numbers, e.g. ``acceptance_rate``, ``mean_accepted_length``, ``hardware``.
        training_log: the log :func:`train_glide` returns (steps, loss, time, ``eval``, ``regeneration``,
            ``vanilla_twin``).
        repo_id: the Hub id the usage snippets load (default ``"<this repo>"``).
        custom_generate: whether the checkpoint carries CAPE's ``custom_generate/`` (adds its tag and snippet).
        license: the weights' license as a Hub license id (``"apache-2.0"``, ...); `None` leaves it out.

    Raises:
        ValueError: ``license`` is not a non-empty str.
    """
    check_license(license)
    kind = "GLIDE" if config.cross_attention else "vanilla drafter (GLIDE without cross-attention)"
    tags = ["speculative-decoding", "glide", "draft-model", "hf-specdraft", "custom_code"] + (
        ["custom_generate", "cape"] if custom_generate else []
    )
    data = ModelCardData(
        base_model=_hub_id(base_model),
        datasets=[_hub_id(dataset)] if _hub_id(dataset) else None,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=tags,
        license=license,
    )
    intro = "A draft model for speculative decoding (Du et al. 2024, *GLIDE with a CAPE*, §4.1): " + (
        "each layer cross-attends to the target model's KV cache."
        if config.cross_attention
        else "no cross-attention; a baseline for GLIDE."
    )
    if getattr(config, "state_input", False):
        intro += (
            " It also reads the target's last hidden state: `[embedding ; state]` in at the first draft step, its own "
            "projected state after (Gemma 4's assistant, EAGLE), trained over unrolled draft steps."
        )
    if custom_generate:
        intro += (
            " `custom_generate/` adds CAPE (§4.2): each drafted position is widened by the draft's confidence and "
            "all candidates are verified as one tree."
        )
    lines = [
        f"# {kind} draft model for `{base_model or config.target_model_type}`",
        "",
        intro,
        "",
        *_usage_lines(config, base_model, repo_id, custom_generate),
        "## Architecture",
        "",
        "| | |",
        "|---|---|",
        f"| layers / hidden size | {config.num_hidden_layers} / {config.hidden_size} |",
        f"| target layers read | {config.target_layer_ids if config.cross_attention else '-'} |",
        f"| target state in / own self-attention | {'yes' if getattr(config, 'state_input', False) else 'no'} / "
        f"{'yes' if getattr(config, 'self_attention', True) else 'no (Gemma 4 assistant layout)'} |",
        f"| target | {config.target_model_type}, {config.target_num_hidden_layers} layers, "
        f"{config.target_num_attention_heads} heads ({config.target_num_key_value_heads} KV), head_dim "
        f"{config.target_head_dim}, vocab {config.target_vocab_size} |",
        "",
        *_training_lines(config, dataset, training_log),
        "",
        "## Evaluation",
        "",
    ]
    lines += _evaluation_lines(config, metrics, training_log)
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")
    card.save(str(Path(output_dir) / "README.md"))
    return card
