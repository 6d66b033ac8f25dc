"""The embedded default: a small real target LM trained by the project, its plain draft, tokenizer and tasks.

    >>> from hf_specdraft.defaults import load_default
    >>> bundle = load_default()          # the checkpoint shipped inside the package  # doctest: +SKIP
    >>> bundle.target, bundle.draft, bundle.tokenizer  # doctest: +SKIP
"""

from .loading import CHECKPOINT_DIR, DefaultBundle, check_recipe, load_default

__all__ = ["CHECKPOINT_DIR", "DefaultBundle", "check_recipe", "load_default"]
