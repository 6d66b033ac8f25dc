"""``--tiny``: the embedded default's tiny recipe (hf_specdraft.defaults, seconds on a CPU), so the examples run anywhere.

The tiny models are plumbing, not measurements. They are trained once into ``$HF_SPECDRAFT_CACHE/tiny-default``
(``~/.cache/hf_specdraft/tiny-default``) and reused by every example; ``HF_SPECDRAFT_TINY_DIR`` points them at
another directory (the tests train one there).
"""

from __future__ import annotations

import os
from pathlib import Path


def tiny_default_dir() -> Path:
    """A ``train-default --recipe tiny`` directory holding target, plain draft, GLIDE and the bigram table."""
    from hf_specdraft.defaults.recipe import get_recipe
    from hf_specdraft.defaults.training import train_default

    cache = Path(os.environ.get("HF_SPECDRAFT_CACHE", Path.home() / ".cache" / "hf_specdraft"))
    path = Path(os.environ.get("HF_SPECDRAFT_TINY_DIR") or cache / "tiny-default")
    if not (path / "recipe.json").is_file():  # written last: its presence means the run finished
        train_default(get_recipe("tiny"), path, parts=("draft", "target", "glide"))
    return path


def tiny_bundle():
    """The tiny default loaded in float32 on the CPU (exact greedy comparisons)."""
    from hf_specdraft.defaults import load_default

    return load_default(tiny_default_dir(), device="cpu")
