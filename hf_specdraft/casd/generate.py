"""The CASD user call, question and context apart (the CASD paper, Algorithm 1, §4.4): the draft pool holds the *full*
context, the prompt holds it as it is or compressed (:func:`llmlingua2_compressor`), whose dropped passages the pool
can still draft.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedModel

from ..core.loop import SpeculativeGenerateOutput, speculative_generate
from ..core.stats import SpeculativeStats
from .candidate_generator import CasdCandidateGenerator, casd_acceptance, tokenize_context
from .configuration_casd import CasdConfig
from .pool import context_token_ids

# Task-neutral; Table 7 of the CASD paper lists the per-dataset templates (all put the context before the question).
DEFAULT_PROMPT_TEMPLATE = "{context}\n\n{question}"
LLMLINGUA2_MODEL = "microsoft/llmlingua-2-xlm-roberta-large-meetingbank"  # the compressor of the CASD paper, §4.4


def compress_context(context: str, compressor: Callable[[str], str]) -> str:
    """Algorithm 1 lines 2–3: d_q ← Compress(d_q), for the prompt only."""
    if not callable(compressor):
        raise TypeError(
            f"compressor must be a callable taking the context text and returning text, got {type(compressor).__name__}"
        )
    compressed = compressor(context)
    if not isinstance(compressed, str):
        raise ValueError(f"compressor must return text (str), got {type(compressed).__name__}")
    return compressed


@dataclass
class CasdInputs:
    """What :func:`build_casd_inputs` prepares."""

    prompt_ids: torch.Tensor  # (1, P): the prompt p = q + d_q (Algorithm 1 line 5), its context possibly compressed
    context_ids: object  # np.ndarray (n,): the full context, for the draft pool (line 1)
    prompt_text: str | None = None  # the prompt as text, when a tokenizer built it


def _is_missing(question) -> bool:
    """No question: None or empty ids (context-only prompts such as code completion)."""
    if isinstance(question, torch.Tensor):
        return question.numel() == 0
    return question is None or (not isinstance(question, str) and np.asarray(question).size == 0)


def _as_text(value, tokenizer, argument: str) -> str:
    if _is_missing(value):
        return ""
    return value if isinstance(value, str) else tokenizer.decode(context_token_ids(value, argument).tolist())


def build_casd_inputs(
    tokenizer, question, context, compressor: Callable[[str], str] | None = None, prompt_template: str | None = None
) -> CasdInputs:
    """Prompt ids and pool ids for one request (Algorithm 1 lines 1–5); arguments as :func:`casd_generate`. Without a
    tokenizer both are ids and the prompt is ``context + question``."""
    if tokenizer is None:
        if compressor is not None:
            raise ValueError("compressor works on text: pass the target's tokenizer to casd_generate to use one")
        if prompt_template is not None:
            raise ValueError("prompt_template needs a tokenizer; without one the prompt is context ids + question ids")
        context_ids = context_token_ids(context, "context")
        parts = [torch.from_numpy(context_ids)]
        if not _is_missing(question):
            parts.append(torch.from_numpy(context_token_ids(question, "question")))
        return CasdInputs(torch.cat(parts)[None], context_ids)
    context_ids = tokenize_context(context, tokenizer)
    context_text = _as_text(context, tokenizer, "context")
    if compressor is not None:
        context_text = compress_context(context_text, compressor)
    template = DEFAULT_PROMPT_TEMPLATE if prompt_template is None else prompt_template
    try:
        prompt_text = template.format(context=context_text, question=_as_text(question, tokenizer, "question"))
    except (KeyError, IndexError) as error:
        raise ValueError(
            f"prompt_template may only use the fields {{context}} and {{question}}, got {template!r}"
        ) from error
    prompt_ids = tokenizer(prompt_text, return_tensors="pt")["input_ids"]
    return CasdInputs(prompt_ids, context_ids, prompt_text)


@dataclass
class CasdGenerateOutput:
    """Result of :func:`casd_generate`."""

    sequences: torch.Tensor  # (1, P + n): prompt + generated tokens
    prompt_length: int  # P
    text: str | None = None  # the generated tokens decoded (when a tokenizer was given)
    speculative_stats: SpeculativeStats | None = None  # per-step statistics (mean accepted length, ...)
    match_lengths: list[int] = field(default_factory=list)  # matched suffix length per step (0: nothing retrieved)


def casd_generate(
    model: PreTrainedModel,
    tokenizer,
    question,
    *,
    context,
    threshold: float = 0.1,
    top_k: int | None = None,
    strict: bool = False,
    compressor: Callable[[str], str] | None = None,
    prompt_template: str | None = None,
    config: CasdConfig | None = None,
    **generate_kwargs,
) -> CasdGenerateOutput:
    """Context-aware speculative decoding of one request (the CASD paper, Algorithm 1).

    Args:
        model: the target causal LM.
        tokenizer: its tokenizer, or None when ``question`` and ``context`` are token ids.
        question: the query q (text or ids; None for context-only prompts).
        context: the relevant context d_q (text or ids). The draft pool always holds all of it.
        threshold: δ in (0, 1) of eq. 3.
        top_k: k of the mixed rule (eq. 4), or None.
        strict: exact verification (lossless context lookup decoding) instead of eq. 3/4.
        compressor: optional ``text -> text`` prompt compressor for the context (§4.4).
        prompt_template: a ``str.format`` template with ``{context}`` and ``{question}`` fields (needs a tokenizer).
        config: retrieval options (:class:`CasdConfig`).
        generate_kwargs: passed to ``generate`` (``max_new_tokens``, ``eos_token_id``, ``do_sample``, …).
    """
    acceptance = casd_acceptance(threshold, top_k, strict)
    inputs = build_casd_inputs(tokenizer, question, context, compressor, prompt_template)
    generator = CasdCandidateGenerator(inputs.context_ids, config=config)
    prompt_ids = inputs.prompt_ids.to(model.device)
    out = speculative_generate(
        model, prompt_ids, candidate_generator=generator, acceptance=acceptance, **generate_kwargs
    )
    sequences = out.sequences if isinstance(out, SpeculativeGenerateOutput) else out
    length = prompt_ids.shape[1]
    text = None if tokenizer is None else tokenizer.decode(sequences[0, length:].tolist(), skip_special_tokens=True)
    return CasdGenerateOutput(sequences, length, text, getattr(generator, "last_stats", None), generator.match_lengths)


def llmlingua2_compressor(
    rate: float = 1 / 3, model_name: str = LLMLINGUA2_MODEL, device_map: str = "cpu", **compress_kwargs
) -> Callable[[str], str]:
    """A ``text -> text`` LLMLingua-2 compressor (Pan et al. 2024; the CASD paper, §4.4) for ``casd_generate``. Needs
    ``pip install "hf-specdraft[casd]"``. ``rate``: the kept fraction of the context's tokens, in (0, 1] (1/3 = "3×");
    ``compress_kwargs`` go to ``PromptCompressor.compress_prompt``."""
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 < rate <= 1:
        raise ValueError(f"rate must be in (0, 1] (the kept fraction of the context), got {rate!r}")
    try:
        from llmlingua import PromptCompressor
    except ImportError as error:
        raise ImportError(
            'llmlingua2_compressor needs the optional dependency llmlingua: pip install "hf-specdraft[casd]"'
        ) from error
    compressor = PromptCompressor(model_name=model_name, use_llmlingua2=True, device_map=device_map)

    def compress(text: str) -> str:
        return compressor.compress_prompt([text], rate=rate, **compress_kwargs)["compressed_prompt"]

    return compress
