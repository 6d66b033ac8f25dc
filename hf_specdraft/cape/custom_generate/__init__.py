"""The ``custom_generate/`` folder a checkpoint carries: greedy CAPE decoding with only torch and transformers.

These files are copied verbatim into ``<checkpoint>/custom_generate/`` by
:func:`hf_specdraft.cape.write_custom_generate`, with the library's own ``projection.py``, ``tree.py``,
``acceptance.py`` and ``cape/expansion_sets.py`` beside them; transformers loads ``generate.py`` and its flat
siblings as remote code (``target.generate(..., custom_generate=<checkpoint>, trust_remote_code=True)``).
Written there, they import nothing from hf_specdraft (here, ``generate.py`` takes those four from the installed
library). This ``__init__.py`` only makes the folder part of the installed package; it is not copied.
"""
