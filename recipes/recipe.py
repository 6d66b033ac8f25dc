"""Recipes for the embedded default: tokenizer, target LM and plain draft, and how long each trains.

A recipe fully determines a training run (with the corpus versions it records), and its hash is stored
beside the shipped checkpoint so a reader can check what produced it.

- ``default``: the shipped CPU target. ~16M parameters, compiled fp32 training on 2 CPU cores.
- ``gpu``: the ``gpu`` bench profile's bigger target (≥ 100M parameters, bf16, minutes on one H200).
- ``tiny``: trains in seconds, for tests only. Plumbing; never reported as a measurement.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ModelRecipe:
    """Shape of a Llama-architecture model (grouped-query attention: ``num_key_value_heads`` < heads)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be divisible by "
                f"num_key_value_heads={self.num_key_value_heads}"
            )


@dataclass(frozen=True)
class TrainSchedule:
    """One model's optimisation: AdamW with warmup + cosine decay (to ``min_lr_ratio`` of the peak)."""

    steps: int
    batch_size: int  # sequences per optimiser step (split into micro-batches of ``micro_batch_size``)
    micro_batch_size: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    checkpoint_every: int = 200  # a usable checkpoint exists even if a long CPU run is cut short

    def __post_init__(self):
        if self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size={self.batch_size} must be a multiple of micro_batch_size={self.micro_batch_size}"
            )


@dataclass(frozen=True)
class Recipe:
    name: str
    vocab_size: int
    seq_len: int
    target: ModelRecipe
    draft: ModelRecipe
    target_schedule: TrainSchedule
    draft_schedule: TrainSchedule
    tokenizer_chars: int  # characters of train text the BPE trainer reads
    max_train_chars: int | None  # None: tokenize the whole train split
    eval_windows: int  # held-out windows of seq_len for perplexity
    eval_prompts: int  # held-out prompts for the repetition check
    compile: bool  # torch.compile the training forward (≈1.8x on CPU)
    seed: int = 0
    packages: tuple[str, ...] = field(
        default=("transformers", "torch", "accelerate", "huggingface_hub", "tokenizers", "safetensors", "tqdm")
    )
    # A second target stage: a warm restart (fresh warmup + cosine) from the bf16 checkpoint of the first.
    # It lets a CPU recipe grow run by run without retraining what is already trained.
    target_continuation: TrainSchedule | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["target_continuation"] is None:  # recipes without a second stage keep the hashes they were trained under
            del d["target_continuation"]
        return d

    def hash(self) -> str:
        """sha256 of the canonical JSON form; stored in the checkpoint's ``recipe.json``."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


RECIPES: dict[str, Recipe] = {
    "default": Recipe(
        name="default",
        vocab_size=8192,
        seq_len=256,
        # 15.7M parameters: the largest that sees ≈6M tokens in about an hour on 2 CPU cores (compiled fp32).
        target=ModelRecipe(
            hidden_size=384, num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2, intermediate_size=1024
        ),
        # 2.3M parameters, 2 layers: the "plain small draft", clearly weaker than the target.
        draft=ModelRecipe(
            hidden_size=192, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1, intermediate_size=512
        ),
        target_schedule=TrainSchedule(
            steps=750, batch_size=32, micro_batch_size=16, learning_rate=2e-3, warmup_steps=40
        ),
        draft_schedule=TrainSchedule(
            steps=400, batch_size=32, micro_batch_size=32, learning_rate=3e-3, warmup_steps=20
        ),
        tokenizer_chars=30_000_000,
        max_train_chars=None,
        eval_windows=256,
        eval_prompts=32,
        compile=True,
        # Second stage: ≈11M more tokens (≈1.5 hours on 2 cores).
        target_continuation=TrainSchedule(
            steps=1400, batch_size=32, micro_batch_size=16, learning_rate=1.2e-3, warmup_steps=50, checkpoint_every=200
        ),
    ),
    "gpu": Recipe(
        name="gpu",
        vocab_size=8192,
        seq_len=512,
        # ≈110M parameters, bf16; ≤ 6 minutes on one H200.
        target=ModelRecipe(
            hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4, intermediate_size=3072
        ),
        draft=ModelRecipe(
            hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768
        ),
        target_schedule=TrainSchedule(
            steps=3000, batch_size=64, micro_batch_size=64, learning_rate=1e-3, warmup_steps=150, checkpoint_every=1000
        ),
        draft_schedule=TrainSchedule(
            steps=1500, batch_size=64, micro_batch_size=64, learning_rate=2e-3, warmup_steps=75, checkpoint_every=1000
        ),
        tokenizer_chars=30_000_000,
        max_train_chars=None,
        eval_windows=512,
        eval_prompts=64,
        compile=True,
    ),
    "tiny": Recipe(
        name="tiny",
        vocab_size=512,
        seq_len=64,
        target=ModelRecipe(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128
        ),
        draft=ModelRecipe(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64
        ),
        target_schedule=TrainSchedule(
            steps=30, batch_size=8, micro_batch_size=4, learning_rate=3e-3, warmup_steps=3, checkpoint_every=1000
        ),
        draft_schedule=TrainSchedule(
            steps=20, batch_size=8, micro_batch_size=8, learning_rate=3e-3, warmup_steps=2, checkpoint_every=1000
        ),
        tokenizer_chars=300_000,
        max_train_chars=600_000,
        eval_windows=16,
        eval_prompts=4,
        compile=False,
    ),
}


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name]


def check_recipe(path: str | Path) -> bool:
    """Whether ``path/recipe.json`` (a :mod:`recipes.training` output directory) holds the hash of the recipe of the
    same name in this version."""
    meta = json.loads((Path(path) / "recipe.json").read_text())
    return meta["hash"] == get_recipe(meta["recipe"]["name"]).hash()


# GLIDE and its vanilla twin (same shape, no cross-attention) for each target recipe (Du et al. 2024, §4.1, §5.2): a
# configuration of hf_specdraft.glide.train_glide. "model": GlideConfig.from_target_config's keywords (one layer:
# Appendix E, targets up to 13B); "training": GlideTrainingArguments' (block size and seed its defaults: the config's
# L = 5, §4.1, and 0). Both drafters train on the same token stream for the same steps: the comparison isolates the
# glimpse.
GLIDE_RECIPES: dict[str, dict[str, dict]] = {
    # ≈3M parameters; the frozen target's forward dominates each step on CPU (≈36 minutes on 2 cores; vanilla ≈15).
    "default": {
        "model": {"hidden_size": 256, "num_hidden_layers": 1},
        "training": {
            "max_steps": 1000,
            "per_device_batch_size": 32,
            "seq_len": 256,
            "learning_rate": 2e-3,
            "warmup_steps": 20,
        },
    },
    "gpu": {
        "model": {"hidden_size": 512, "num_hidden_layers": 1},
        "training": {
            "max_steps": 2000,
            "per_device_batch_size": 64,
            "seq_len": 512,
            "learning_rate": 1e-3,
            "warmup_steps": 100,
        },
    },
    "tiny": {
        "model": {"hidden_size": 32, "num_hidden_layers": 1},
        "training": {
            "max_steps": 10,
            "per_device_batch_size": 4,
            "seq_len": 64,
            "learning_rate": 3e-3,
            "warmup_steps": 2,
        },
    },
}


# The cascade's second, smaller neural draft (Chen et al. 2024, §3.1: drafts of decreasing size).
# Kept out of Recipe so the shipped target's recipe hash stays what trained it.
SMALL_DRAFT_RECIPES: dict[str, tuple[ModelRecipe, TrainSchedule]] = {
    "default": (
        ModelRecipe(
            hidden_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256
        ),
        TrainSchedule(steps=200, batch_size=32, micro_batch_size=32, learning_rate=3e-3, warmup_steps=10),
    ),
    "gpu": (
        ModelRecipe(
            hidden_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256
        ),
        TrainSchedule(
            steps=1000, batch_size=64, micro_batch_size=64, learning_rate=3e-3, warmup_steps=50, checkpoint_every=1000
        ),
    ),
    "tiny": (
        ModelRecipe(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, intermediate_size=32
        ),
        TrainSchedule(
            steps=10, batch_size=8, micro_batch_size=8, learning_rate=3e-3, warmup_steps=2, checkpoint_every=1000
        ),
    ),
}
