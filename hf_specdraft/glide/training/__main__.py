"""``accelerate launch -m hf_specdraft.glide.training ...`` (or ``python -m``): ``hf-specdraft train-glide``."""

import sys

from .command import main

sys.exit(main())
