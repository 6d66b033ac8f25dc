"""GLIDE's training: everything that makes a GLIDE draft and nothing a trained one needs to decode (no file here ships
in a checkpoint; docs/layout.md lists them). ``hf_specdraft.glide`` imports this package on first use (training pulls
in accelerate).
"""

from .command import build_parser, main
from .data import load_data
from .objective import token_stream
from .trainer import GlideTrainingArguments, train_glide

__all__ = ["GlideTrainingArguments", "build_parser", "load_data", "main", "token_stream", "train_glide"]
