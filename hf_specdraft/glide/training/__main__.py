"""``python -m hf_specdraft.glide.training`` (and ``accelerate launch -m hf_specdraft.glide.training``) ran GLIDE's
training in earlier releases. The command is ``hf-specdraft train-glide`` now, which also writes CAPE's custom_generate/
folder into the checkpoint; this entry says so instead of failing with Python's own message."""

import sys

sys.exit(
    "python -m hf_specdraft.glide.training is now `hf-specdraft train-glide` (the same options); with several "
    "processes: accelerate launch -m hf_specdraft train-glide ..."
)
