"""Inputs of a call, checked before any forward: the prompt, its padding, the generation setup, one drafter per row and
each row's own logits processors. Semantics follow transformers' batched ``generate`` (left padding with an
``attention_mask``). A transformers ``CandidateGenerator`` is wrapped here, once: the loop sees one kind of drafter.
"""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel
from transformers.generation import CandidateGenerator, LogitsProcessorList
from transformers.generation.logits_process import (
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)

from .acceptance import ConditionalAcceptance
from .drafting import DRAFTERS, DraftModelCandidateGenerator, TreeCandidateGenerator
from .state_drafting import StateReadingDrafter, TransformersCandidateGenerator, reads_target_state
from .support import CACHE_FIELD, output_cache
from .validation import check_copy_options


def check_input_ids(input_ids, model) -> None:
    """A 2-D integer tensor of ids the model's embedding holds; a clear `ValueError` naming what is wrong otherwise."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(
            "input_ids must be a 2-D LongTensor of shape (B, L), got "
            f"{type(input_ids).__name__} {getattr(input_ids, 'shape', '')}"
        )
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids holds no rows: pass at least one prompt")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}")
    vocab = getattr(model.get_input_embeddings(), "num_embeddings", None)
    if vocab is not None:
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab:
            raise ValueError(
                f"input_ids holds token id {low if low < 0 else high}, outside the model's vocabulary [0, {vocab}): "
                "was the prompt tokenized with another model's tokenizer?"
            )


def check_target_model(model) -> None:
    """The target must be a loaded transformers causal LM; a clear `TypeError` naming what was passed otherwise."""
    if isinstance(model, str):
        raise TypeError(
            f"model must be the loaded target model, got the string {model!r}: load it first, e.g. "
            f"model = AutoModelForCausalLM.from_pretrained({model!r})"
        )
    if not isinstance(model, PreTrainedModel) or not callable(getattr(model, "generate", None)):
        raise TypeError(
            "model must be a transformers PreTrainedModel with generate() (the target causal LM), got "
            f"{type(model).__name__}"
        )


def check_unmarked_padding(input_ids: torch.Tensor, lengths: torch.Tensor, pad_token_id) -> None:
    """Refuse a batch whose rows begin with different numbers of pad tokens while the attention mask calls them tokens
    (``generate`` infers no mask when ``pad_token_id`` is ``eos_token_id``, and only warns). Equal runs (a shared BOS
    that happens to be the pad token) are not padding."""
    if input_ids.shape[0] < 2 or pad_token_id is None or bool((lengths < input_ids.shape[1]).any()):
        return  # one row, no pad token, or a mask that marks padding: nothing unmarked
    pad = int(pad_token_id.flatten()[0]) if isinstance(pad_token_id, torch.Tensor) else int(pad_token_id)
    leading = (input_ids == pad).long().cumprod(-1).sum(-1)  # pad tokens before each row's first other token
    rows = (leading > leading.min()).nonzero().flatten().tolist()
    if rows:
        raise ValueError(
            f"input_ids rows {rows} begin with pad tokens (pad_token_id={pad}) but no attention_mask marks them as "
            "padding: pass the tokenizer's attention_mask with the batch, e.g. speculative_generate(model, "
            "**tokenizer(prompts, padding=True, return_tensors='pt'), ...) with tokenizer.padding_side = 'left'"
        )


def check_padding(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """The prompt lengths `(B,)` of a left-padded batch; a clear `ValueError` for any other mask."""
    batch, length = input_ids.shape
    if attention_mask is None:
        return torch.full((batch,), length, dtype=torch.long)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}, got "
            f"{type(attention_mask).__name__} {tuple(getattr(attention_mask, 'shape', ()))}"
        )
    mask = attention_mask.detach().cpu()
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token); got other values")
    lengths = mask.long().sum(-1)
    empty = (lengths == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"attention_mask rows {empty} are all padding: every prompt needs a token")
    left_padded = torch.arange(length)[None] >= (length - lengths)[:, None]
    if not torch.equal(mask.bool(), left_padded):
        raise ValueError(
            "attention_mask is not left padding: speculative decoding appends to the right of every row, so pad "
            "prompts on the left (tokenizer.padding_side = 'left', as for transformers' batched generate)"
        )
    return lengths


def check_generation_setup(generation_config: GenerationConfig, model_kwargs: dict, acceptance) -> None:
    """What generate may hand the loop that speculative decoding cannot honour, refused by name before any forward."""
    if generation_config.num_beams > 1 or generation_config.num_return_sequences > 1:
        raise ValueError(
            "num_beams and num_return_sequences must be 1 for speculative decoding (generate expands the batch by them)"
        )
    implementation = generation_config.cache_implementation
    if implementation not in (None, "dynamic", "static"):
        raise ValueError(
            f"cache_implementation={implementation!r} is not supported by speculative decoding: leave it unset "
            "(a DynamicCache the loop compacts) or pass 'static' (a static cache the loop owns, compiled on CUDA)"
        )
    passed, static = output_cache(model_kwargs), implementation == "static"
    if passed is not None and (not (static or isinstance(passed, DynamicCache)) or passed.get_seq_length() > 0):
        raise ValueError(
            f"{CACHE_FIELD} must be empty or absent, got a {type(passed).__name__} holding "
            f"{passed.get_seq_length()} tokens: speculative decoding builds its own cache "
            "(cache_implementation='static' selects a static one)"
        )
    # use_cache=False (MPT's config default) is not refused: the loop verifies against its own cache either way
    if acceptance is not None and not isinstance(acceptance, ConditionalAcceptance):
        raise TypeError(f"acceptance must be None or a ConditionalAcceptance, got {type(acceptance).__name__}")


def check_batch_setup(generation_config: GenerationConfig, streamer, batch: int) -> None:
    """What the batched loop does not do, refused by name before any forward."""
    if streamer is not None and batch > 1:
        raise ValueError("a streamer takes one sequence: stream with batch size 1, or drop streamer= for a batch")
    if generation_config.output_scores or generation_config.output_logits:
        raise ValueError(
            "output_scores / output_logits are per-step tensors of the whole batch, which rows that accept different "
            "numbers of tokens do not share: leave them off with a padded batch (batch size 1 unpadded supports them)"
        )


def resolve_generator(
    candidate_generator, draft_model, num_draft_tokens, copy_from_context=None, max_copy_tokens=None
) -> TreeCandidateGenerator | list[TreeCandidateGenerator]:
    """The drafter of a call: ``candidate_generator`` checked (a list: one per row; transformers' own wrapped), or the
    registered drafter of ``draft_model`` with the call's copy options."""
    check_copy_options(copy_from_context, max_copy_tokens, allow_none=True)
    if candidate_generator is not None and (copy_from_context is not None or max_copy_tokens is not None):
        raise ValueError(
            "copy_from_context= and max_copy_tokens= configure the drafter speculative_generate builds for "
            "draft_model=; with candidate_generator=, set them on the drafter, e.g. "
            "GlideCandidateGenerator(glide, copy_from_context=0)"
        )
    if candidate_generator is not None and draft_model is not None:
        raise ValueError("pass either candidate_generator= or draft_model=, not both")
    if candidate_generator is None and draft_model is None:
        raise ValueError(
            "speculative_generate needs a drafter: pass candidate_generator=<CandidateGenerator> or "
            "draft_model=<causal LM>"
        )
    if draft_model is not None:
        if isinstance(draft_model, str):
            raise TypeError(
                f"draft_model must be a loaded model, got the string {draft_model!r}: load it first, e.g. "
                f"draft_model=AutoModelForCausalLM.from_pretrained({draft_model!r})"
            )
        if not isinstance(draft_model, PreTrainedModel):
            raise TypeError(f"draft_model must be a transformers PreTrainedModel, got {type(draft_model).__name__}")
        return drafter_for(draft_model, num_draft_tokens, copy_from_context, max_copy_tokens)
    if isinstance(candidate_generator, (list, tuple)):  # one drafter per row of a batch
        if not candidate_generator:
            raise ValueError("candidate_generator is an empty list: give one drafter per row of input_ids")
        drafters = {id(g): resolve_generator(g, None, num_draft_tokens) for g in candidate_generator}
        return [drafters[id(g)] for g in candidate_generator]  # listed twice stays one object (row_drafters refuses it)
    if not isinstance(candidate_generator, CandidateGenerator):
        raise TypeError(
            "candidate_generator must be a transformers CandidateGenerator (or a list of one per row), got "
            f"{type(candidate_generator).__name__}"
        )
    if isinstance(candidate_generator, TreeCandidateGenerator):
        return candidate_generator
    return TransformersCandidateGenerator(candidate_generator)


def drafter_for(draft_model, num_draft_tokens, copy_from_context, max_copy_tokens) -> TreeCandidateGenerator:
    """The drafter of ``draft_model``: transformers' own for Gemma 4's assistants and DFlash drafters, the one
    registered for its model type (GLIDE's, which alone take the copy options), else a
    :class:`~hf_specdraft.core.drafting.DraftModelCandidateGenerator`."""
    options = {"copy_from_context": copy_from_context, "max_copy_tokens": max_copy_tokens}
    kind = getattr(draft_model.config, "model_type", None)
    if kind in DRAFTERS and not reads_target_state(draft_model):
        copying = {name: value for name, value in options.items() if value is not None}
        return DRAFTERS[kind](draft_model, num_draft_tokens=num_draft_tokens, **copying)
    asked = [f"{name}={value!r}" for name, value in options.items() if value is not None and value != 0]
    if asked:
        raise ValueError(
            f"{', '.join(asked)}: a {kind!r} draft model does not copy from the context (GLIDE-family drafts, "
            f"model_type 'glide', do); leave copy_from_context and max_copy_tokens unset, or copy_from_context=False"
        )
    if reads_target_state(draft_model):
        return StateReadingDrafter(draft_model, num_draft_tokens)
    return DraftModelCandidateGenerator(draft_model, num_draft_tokens=num_draft_tokens)


def row_drafters(generator, batch: int) -> list[TreeCandidateGenerator]:
    """One drafter per row: ``generator`` itself for one row, a list as given (its drafters resolved and checked by
    :func:`resolve_generator`), else forks of one drafter."""
    if isinstance(generator, (list, tuple)):
        if len(generator) != batch:
            raise ValueError(
                f"candidate_generator lists {len(generator)} drafters for a batch of {batch} rows: give one per row"
            )
        if batch > 1 and len({id(g) for g in generator}) != batch:
            raise ValueError(
                "candidate_generator lists the same drafter object twice: each row needs its own (drafter.fork())"
            )
        return list(generator)
    if batch == 1:
        return [generator]
    return [generator.fork() for _ in range(batch)]


def row_processors(processors: LogitsProcessorList, row: int, batch: int) -> LogitsProcessorList:
    """Row ``row``'s own copy of ``generate``'s logits processors, built for the whole batch: state kept per batch row
    is cut to that row (the repetition penalty's padding lengths, ``prefix_allowed_tokens_fn``'s batch id,
    classifier-free guidance's context); every processor is copied shallowly, so state made on its first call is the
    row's own."""
    if batch == 1:
        return processors
    own = LogitsProcessorList()
    for processor in processors:
        mine = copy.copy(processor)
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(
            processor.prompt_ignore_length, torch.Tensor
        ):
            mine.prompt_ignore_length = processor.prompt_ignore_length[row : row + 1]
        elif isinstance(processor, PrefixConstrainedLogitsProcessor):
            allowed = processor._prefix_allowed_tokens_fn
            mine._prefix_allowed_tokens_fn = lambda batch_id, sent, allowed=allowed: allowed(row + batch_id, sent)
        elif isinstance(processor, UnbatchedClassifierFreeGuidanceLogitsProcessor):
            context = dict(processor.unconditional_context)
            for key in ("input_ids", "attention_mask"):
                if isinstance(context[key], torch.Tensor) and context[key].shape[0] == batch:
                    context[key] = context[key][row : row + 1]
            mine.unconditional_context = context
        own.append(mine)
    return own
