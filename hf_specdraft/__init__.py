"""hf_specdraft: speculative decoding methods for 🤗 Transformers causal LMs.

    >>> from hf_specdraft import speculative_generate
    >>> out = target.generate(input_ids, custom_generate=speculative_generate, draft_model=draft, max_new_tokens=64)  # doctest: +SKIP
"""

from .acceptance import ConditionalAcceptance, speculative_sampling
from .drafting import DraftModelCandidateGenerator, TreeCandidateGenerator
from .generation import SpeculativeGenerateOutput, speculative_generate
from .metrics import SpeculativeStats, expected_speedup, standardized_walltime_improvement
from .tree import DraftTree

__version__ = "0.1.0"

__all__ = [
    "ConditionalAcceptance",
    "DraftModelCandidateGenerator",
    "DraftTree",
    "SpeculativeGenerateOutput",
    "SpeculativeStats",
    "TreeCandidateGenerator",
    "expected_speedup",
    "speculative_generate",
    "speculative_sampling",
    "standardized_walltime_improvement",
]
