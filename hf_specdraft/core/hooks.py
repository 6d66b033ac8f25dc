"""What a higher layer lends a lower one, filled in by the package's composition root (``hf_specdraft/__init__.py``).

The core imports no method and each method only the core, so where one method ships another's code the root wires
them: a GLIDE checkpoint carries CAPE's ``custom_generate/`` loop through :data:`custom_generate_writer`, which
:func:`hf_specdraft.glide.model_card.save_glide_checkpoint` calls. The slot lives here, in a module that imports
nothing, so the root sets it on ``import hf_specdraft`` without importing either method (the package imports lazily),
and any later import of the glide package, however deep, finds it set.
"""

from __future__ import annotations

custom_generate_writer = (
    None  # writer(directory) writes custom_generate/ into a checkpoint; None: checkpoints carry none
)
