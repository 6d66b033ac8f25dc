"""Cascade Speculative Drafting with Max-Gram (Chen et al. 2024); usage: docs/methods.md."""

from .bigram import build_bigram_table, load_bigram_table, save_bigram_table
from .cascade import CascadeCandidateGenerator, default_k_matrix, lenient_review, validate_k_matrix
from .config import CascadeConfig
from .factory import build_cascade_for_bench, build_max_gram_for_bench
from .max_gram import MaxGramCandidateGenerator, longest_suffix_match, max_gram_draft
from .swi import cascade_swi, measure_cost_coefficients, parameter_cost_coefficients, swi_from_stats, swi_report

__all__ = [
    "CascadeCandidateGenerator",
    "CascadeConfig",
    "MaxGramCandidateGenerator",
    "build_bigram_table",
    "build_cascade_for_bench",
    "build_max_gram_for_bench",
    "cascade_swi",
    "default_k_matrix",
    "lenient_review",
    "load_bigram_table",
    "longest_suffix_match",
    "max_gram_draft",
    "measure_cost_coefficients",
    "parameter_cost_coefficients",
    "save_bigram_table",
    "swi_from_stats",
    "swi_report",
    "validate_k_matrix",
]
