"""Load the embedded default (or any directory ``train-default`` wrote) as transformers objects."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .recipe import get_recipe

CHECKPOINT_DIR = Path(__file__).parent / "checkpoint"


@dataclass
class DefaultBundle:
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    path: Path
    info: dict = field(default_factory=dict)  # recipe.json + training_log.json evaluation
    extras: dict = field(default_factory=dict)  # further shipped drafters / tables, by bench name (e.g. "bigram_table")


def check_recipe(path: str | Path = CHECKPOINT_DIR) -> bool:
    """Whether ``path/recipe.json`` holds the hash of the recipe of the same name in this version."""
    meta = json.loads((Path(path) / "recipe.json").read_text())
    return meta["hash"] == get_recipe(meta["recipe"]["name"]).hash()


def load_default(path: str | Path | None = None, dtype: torch.dtype | None = None, device: str | torch.device | None = None) -> DefaultBundle:
    """Load target, plain draft and tokenizer from a ``train-default`` output directory.

    Args:
        path: the directory; defaults to the checkpoint shipped inside the package.
        dtype: defaults to float32 on CPU (exact greedy comparisons) and bfloat16 on CUDA.
        device: defaults to CUDA when available.

    Raises:
        ValueError: ``path`` is not a directory holding ``target/`` and ``tokenizer/``.
    """
    path = Path(path) if path is not None else CHECKPOINT_DIR
    if not (path / "target" / "config.json").is_file() or not (path / "tokenizer").is_dir():
        raise ValueError(f"{str(path)!r} is not an embedded-default directory (expected target/ and tokenizer/ from `hf-specdraft train-default`)")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)

    def load(sub: str) -> PreTrainedModel:
        return AutoModelForCausalLM.from_pretrained(path / sub, dtype=dtype).to(device).eval()

    draft = load("draft") if (path / "draft" / "config.json").is_file() else None
    info = {}
    for name in ("recipe.json", "training_log.json"):
        if (path / name).is_file():
            data = json.loads((path / name).read_text())
            info[name.removesuffix(".json")] = data if name == "recipe.json" else {k: v for k, v in data.items() if k not in ("target", "draft")}
    extras = {}
    if (path / "bigram.safetensors").is_file():  # Max-Gram's fallback table (hf-specdraft build-bigram)
        from ..cascade.bigram import load_bigram_table

        extras["bigram_table"] = load_bigram_table(path / "bigram.safetensors", device=device)
    if (path / "small_draft" / "config.json").is_file():  # the cascade's second, smaller draft
        extras["small_draft"] = load("small_draft")
    for kind in ("glide", "vanilla"):  # GLIDE and its vanilla twin, when trained for this target
        if (path / kind / "config.json").is_file():
            from ..glide import GlideForCausalLM

            extras[kind] = GlideForCausalLM.from_pretrained(path / kind, dtype=dtype).to(device).eval()
    return DefaultBundle(load("target"), draft, AutoTokenizer.from_pretrained(path / "tokenizer"), path, info, extras)
