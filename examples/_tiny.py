"""``--tiny``: the repository's tiny training recipe (``recipes/training.py``, seconds on a CPU), so the examples run
anywhere from a source checkout.

The tiny models are plumbing, not measurements. They are trained once into ``$HF_SPECDRAFT_CACHE/tiny-default``
(``~/.cache/hf_specdraft/tiny-default``) and reused by every example; ``HF_SPECDRAFT_TINY_DIR`` points them at
another directory (the tests train one there).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # recipes/ lies beside examples/, outside the installed package


def tiny_default_dir() -> Path:
    """A ``python -m recipes.training --recipe tiny`` directory: target, plain draft, GLIDE and the bigram table."""
    cache = Path(os.environ.get("HF_SPECDRAFT_CACHE", Path.home() / ".cache" / "hf_specdraft"))
    path = Path(os.environ.get("HF_SPECDRAFT_TINY_DIR") or cache / "tiny-default")
    if not (path / "recipe.json").is_file():  # written last: its presence means the run finished
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from recipes.recipe import get_recipe
        from recipes.training import train_default

        train_default(get_recipe("tiny"), path, parts=("draft", "target", "glide"))
    return path


def tiny_bundle():
    """The tiny default loaded in float32 on the CPU (exact greedy comparisons)."""
    from hf_specdraft.defaults import load_default

    return load_default(tiny_default_dir(), device="cpu")
