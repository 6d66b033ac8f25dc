"""hf_specdraft: speculative decoding methods for 🤗 Transformers causal LMs.

    >>> from hf_specdraft import speculative_generate
    >>> out = target.generate(input_ids, custom_generate=speculative_generate, draft_model=draft, max_new_tokens=64)  # doctest: +SKIP

Layers: the core (``hf_specdraft.core``: the loop and its steps) imports no method; each
method package (glide, cape, cascade, casd) imports only the core; this module, ``defaults``, ``bench`` and the CLI
compose them (``tests/test_layers.py`` checks it). What one method lends another is wired here.
"""

from functools import partial

from .core.acceptance import ConditionalAcceptance, speculative_sampling
from .cape import CapeCandidateGenerator, CapeConfig
from .cascade import CascadeCandidateGenerator, CascadeConfig, MaxGramCandidateGenerator
from .casd import CasdCandidateGenerator, CasdConfig, casd_generate
from .core.drafting import DraftModelCandidateGenerator, TreeCandidateGenerator
from .core.loop import SpeculativeGenerateOutput, speculative_generate
from .cape.packaging import write_custom_generate
from .glide import GlideCandidateGenerator, GlideConfig, GlideForCausalLM, register_auto_classes
from .glide.model_card import set_custom_generate_writer
from .core.stats import SpeculativeStats, expected_speedup, standardized_walltime_improvement
from .core.projection import few_token_linears
from .core.tree import DraftTree

__version__ = "0.1.0"

register_auto_classes()  # AutoConfig / AutoModelForCausalLM load GLIDE checkpoints without trust_remote_code
set_custom_generate_writer(partial(write_custom_generate, readme=False))  # GLIDE checkpoints ship CAPE's loop (the card tags it)

__all__ = [
    "CapeCandidateGenerator",
    "CapeConfig",
    "CascadeCandidateGenerator",
    "CascadeConfig",
    "CasdCandidateGenerator",
    "CasdConfig",
    "ConditionalAcceptance",
    "DraftModelCandidateGenerator",
    "DraftTree",
    "GlideCandidateGenerator",
    "GlideConfig",
    "GlideForCausalLM",
    "MaxGramCandidateGenerator",
    "SpeculativeGenerateOutput",
    "SpeculativeStats",
    "TreeCandidateGenerator",
    "casd_generate",
    "expected_speedup",
    "few_token_linears",
    "speculative_generate",
    "speculative_sampling",
    "standardized_walltime_improvement",
]
