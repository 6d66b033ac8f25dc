"""CAPE: confidence-aware proposal expansion (Du et al. 2024, §4.2), with the fixed-K (§5.4) and beam (§5.3) ablations.

Usage: docs/methods.md; ``write_custom_generate(directory)`` ships greedy CAPE as a checkpoint's ``custom_generate/``.
"""

from ..core.drafting import DraftModelTreeScorer
from .beam import beam_search_proposal
from .candidate_generator import CapeCandidateGenerator, build_cape_for_bench
from .config import CapeConfig
from .expansion import expand_proposal, expansion_sizes
from .packaging import write_custom_generate

__all__ = [
    "CapeCandidateGenerator",
    "CapeConfig",
    "DraftModelTreeScorer",
    "beam_search_proposal",
    "build_cape_for_bench",
    "expand_proposal",
    "expansion_sizes",
    "write_custom_generate",
]
