"""CASD: context-aware speculative decoding (the CASD paper, an anonymous ICLR 2025 submission; docs/references.md).

Drafts are retrieved from the request's own context and verified exactly (``strict``, lossless) or by the conditional
rule ``p(x) > max(δ, p(eos))`` (eq. 3), optionally with top-k membership (eq. 4). Usage: docs/methods.md.
"""

from .candidate_generator import CasdCandidateGenerator, build_casd_for_bench, casd_acceptance, tokenize_context
from .configuration_casd import CasdConfig
from .generate import (
    CasdGenerateOutput,
    CasdInputs,
    build_casd_inputs,
    casd_generate,
    compress_context,
    llmlingua2_compressor,
)
from .pool import DraftPool, build_suffix_array
from .retrieval import merge_continuations, retrieve

__all__ = [
    "CasdCandidateGenerator",
    "CasdConfig",
    "CasdGenerateOutput",
    "CasdInputs",
    "DraftPool",
    "build_casd_for_bench",
    "build_casd_inputs",
    "build_suffix_array",
    "casd_acceptance",
    "casd_generate",
    "compress_context",
    "llmlingua2_compressor",
    "merge_continuations",
    "retrieve",
    "tokenize_context",
]
