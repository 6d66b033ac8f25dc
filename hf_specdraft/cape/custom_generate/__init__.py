"""The ``custom_generate/`` folder a checkpoint carries: greedy CAPE decoding with only torch and transformers.

:func:`hf_specdraft.cape.write_custom_generate` copies these files, with the core modules they import, into
``<checkpoint>/custom_generate/``; this ``__init__.py`` only makes the folder part of the installed package.
"""
