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
TEMPLATE = Path(__file__).with_name("model_card_template.md")  # the card's text (Jinja2, rendered by huggingface_hub)


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


def training_stages(training_log: dict) -> list[dict]:
    """Every stage of a drafter's training, oldest first, the log's own run last (``earlier_stages``, or in older logs
    ``stage_1``)."""
    earlier = training_log.get("earlier_stages") or ([training_log["stage_1"]] if training_log.get("stage_1") else [])
    return [stage for stage in (*earlier, training_log) if stage and stage.get("steps")]


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
    """Render ``output_dir/README.md`` from ``model_card_template.md``: metadata (base model, data, tags), usage,
    shape, training, results.

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
    log = training_log or {}
    card = ModelCard.from_template(
        data,
        template_path=str(TEMPLATE),
        config=config,
        base_model=base_model,
        target=base_model or "<target>",
        repo=repo_id or "<this repo>",
        dataset=dataset,
        log=log,
        stages=training_stages(log)[:-1] if log.get("steps") else [],
        metrics=metrics or {},
        custom_generate=custom_generate,
        state_input=getattr(config, "state_input", False),
        self_attention=getattr(config, "self_attention", True),
    )
    card.save(str(Path(output_dir) / "README.md"))
    return card
