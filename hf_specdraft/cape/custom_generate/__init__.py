"""The templates of the ``custom_generate/`` folder a checkpoint carries (greedy CAPE with only torch and
transformers), which :func:`hf_specdraft.cape.write_custom_generate` copies with the core modules they import."""
