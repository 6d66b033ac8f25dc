"""Cascade Speculative Drafting with Max-Gram (Chen et al. 2024); usage: docs/methods.md."""

from ..core.acceptance import lenient_review
from .bigram import build_bigram_table, load_bigram_table, save_bigram_table
from .cascade import CascadeCandidateGenerator, build_cascade_for_bench, default_k_matrix, validate_k_matrix
from .config import CascadeConfig
from .max_gram import MaxGramCandidateGenerator, build_max_gram_for_bench, longest_suffix_match, max_gram_draft

__all__ = [
    "CascadeCandidateGenerator",
    "CascadeConfig",
    "MaxGramCandidateGenerator",
    "build_bigram_table",
    "build_cascade_for_bench",
    "build_max_gram_for_bench",
    "default_k_matrix",
    "lenient_review",
    "load_bigram_table",
    "longest_suffix_match",
    "max_gram_draft",
    "save_bigram_table",
    "validate_k_matrix",
]
