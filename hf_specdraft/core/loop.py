"""The one speculative decoding loop every drafter shares, for any batch size: propose → verify → accept → emit → keep.

The only module that touches transformers' generation internals: it runs as a ``custom_generate`` callable
(``target.generate(ids, custom_generate=speculative_generate, draft_model=draft)``), so ``generate`` prepares the
config, processors and stopping criteria as for its own methods; a direct call goes through ``target.generate`` itself.

Invariant at the start of every step (:func:`speculative_step`): each active row's text but its newest token sits in the
target cache, in its last ``row.cached`` columns (one unpadded row owns the cache; a padded batch shares it,
right-aligned). Rows stop at different times and leave the batch; each row's greedy output equals its batch-1
``generate(do_sample=False)``. Notation: p target distribution, q draft distribution (Leviathan et al. 2023).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation import CandidateGenerator

from .acceptance import ConditionalAcceptance
from .emission import HostStops, accept_row
from .layouts import CacheLayout
from .meter import StepClock, StepMeter
from .controller import DraftLengthController
from .controller_store import recall, remember
from .memory import after_call, trim_threshold_mib
from .distributed import RankAgreement
from .drafting import DraftRequest, output_vocab_size, traits_of
from .inputs import (
    check_batch_setup,
    check_generation_setup,
    check_input_ids,
    check_padding,
    check_target_model,
    check_unmarked_padding,
    resolve_generator,
    row_drafters,
    row_processors,
)
from .outputs import SpeculativeGenerateOutput, assemble_result
from .static_layout import layout_for
from .rows import Row, call_rows
from .support import check_batch_target, target_support
from .target_state import StateRequest, joined, kept_states
from .tree import DraftTree, check_vocab, fit_proposal


__all__ = ["SpeculativeGenerateOutput", "speculative_generate", "speculative_step", "speculative_steps"]


def speculative_generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor | None = None,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    candidate_generator: CandidateGenerator | None = None,
    draft_model: PreTrainedModel | None = None,
    num_draft_tokens: int | str = "auto",
    acceptance: ConditionalAcceptance | None = None,
    token_streamer=None,
    copy_from_context: int | bool | None = None,
    max_copy_tokens: int | None = None,
    **kwargs,
):
    """Speculative decoding with any drafter, as a ``custom_generate`` callable or a direct call.

    Args:
        model: the target causal LM.
        input_ids (`torch.LongTensor` of shape `(B, L)`): the prompts, left-padded with ``attention_mask`` when `B > 1`.
        candidate_generator: any ``transformers.generation.CandidateGenerator``; hf_specdraft drafters
            (:class:`~hf_specdraft.core.drafting.TreeCandidateGenerator`) may propose trees.
        draft_model: shortcut for ``candidate_generator=DraftModelCandidateGenerator(draft_model, num_draft_tokens)``,
            or the drafter registered for its model type (:func:`~hf_specdraft.core.drafting.register_drafter`).
        num_draft_tokens: γ for ``draft_model``; ``"auto"`` (the default): chosen every step from the measured
            acceptance and costs (:mod:`~hf_specdraft.core.controller`).
        copy_from_context: for a GLIDE-family ``draft_model``, the shortest suffix match of the text it copies the
            continuation of instead of drafting; ``False`` or 0: never copy; ``None`` (the default):
            ``generation_config.copy_from_context`` where set, else the drafter's default (2). A draft that never
            copies takes only ``False`` / 0.
        max_copy_tokens: the longest copy from the context; ``None``: ``generation_config.max_copy_tokens`` where set,
            else γ when ``num_draft_tokens`` is fixed, the controller's choice with "auto".
        acceptance: ``None`` for exact verification (lossless), or a
            :class:`~hf_specdraft.core.acceptance.ConditionalAcceptance` (CASD).
        token_streamer: a transformers streamer. ``generate(custom_generate=...)`` drops its own ``streamer=`` before
            calling a custom callable, so pass it under this name there; a direct call also accepts ``streamer=``.
        kwargs: anything ``generate`` takes (``max_new_tokens``, ``do_sample``, ``eos_token_id``, …).

    Returns:
        `torch.LongTensor` `(B, L + n)`, or :class:`SpeculativeGenerateOutput` with
        ``return_dict_in_generate=True``.
    """
    prepared = (
        isinstance(logits_processor, LogitsProcessorList)
        and isinstance(stopping_criteria, StoppingCriteriaList)
        and isinstance(generation_config, GenerationConfig)
        and "use_cache" in kwargs
    )
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    check_target_model(model)
    check_input_ids(input_ids, model)
    config = generation_config if draft_model is not None else None  # it carries the copy options a call leaves unset
    if copy_from_context is None:
        copy_from_context = getattr(config, "copy_from_context", None)
    if max_copy_tokens is None:
        max_copy_tokens = getattr(config, "max_copy_tokens", None)
    generator = resolve_generator(  # a bad drafter fails here, before generate
        candidate_generator, draft_model, num_draft_tokens, copy_from_context, max_copy_tokens
    )
    if prepared:  # called by transformers' generate(custom_generate=speculative_generate)
        return _speculative_loop(
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            generator,
            acceptance,
            token_streamer,
            kwargs,
        )
    check_padding(kwargs.get("attention_mask"), input_ids)  # a mask of another shape or padded on the right fails here
    max_new_tokens = kwargs.get("max_new_tokens")
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens <= 0):
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    streamer = kwargs.pop("streamer", None) or token_streamer
    return model.generate(
        input_ids,
        generation_config=generation_config,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        custom_generate=speculative_generate,
        candidate_generator=candidate_generator,
        draft_model=draft_model,
        num_draft_tokens=num_draft_tokens,
        acceptance=acceptance,
        token_streamer=streamer,
        copy_from_context=copy_from_context,
        max_copy_tokens=max_copy_tokens,
        **kwargs,
    )


@torch.no_grad()
def _speculative_loop(
    model,
    input_ids,
    logits_processor,
    stopping_criteria,
    generation_config,
    generator,
    acceptance,
    streamer,
    model_kwargs,
):
    """Check the call, set it up on its layout, prefill, run :func:`speculative_steps`, return the result."""
    lengths = check_padding(model_kwargs.get("attention_mask"), input_ids)
    check_unmarked_padding(input_ids, lengths, generation_config.pad_token_id)
    trim = trim_threshold_mib()  # the opt-in heap trim: a bad value fails here
    support = target_support(model)  # recurrent-state models are refused before any forward
    chains = support.chains  # ALiBi / convolution targets verify the tree's first-child chain (refused in a batch)
    batch, padded = input_ids.shape
    if batch > 1 or int(lengths[0]) < padded:  # a batch, or one left-padded prompt: rows share a right-aligned cache
        check_batch_setup(generation_config, streamer, batch)
        check_batch_target(model, generation_config, chains)
    check_generation_setup(generation_config, model_kwargs, acceptance)
    ranks = RankAgreement.of(model)  # a tensor-parallel target: every rank must decide alike
    if chains and generation_config.cache_implementation == "static":
        raise ValueError(
            f"cache_implementation='static' verifies with explicit 4-D masks, which {type(model).__name__} cannot take "
            f"({chains}): leave cache_implementation unset for this model"
        )
    processors = [row_processors(logits_processor, r, batch) for r in range(batch)]
    rows = call_rows(input_ids, lengths, row_drafters(generator, batch), processors)
    if chains:
        rows[0].stats.extra.update(trees_verified_as_chains=0, chains_only=f"{type(model).__name__}: {chains}")
    # the static path holds its cache for the whole call (a concurrent static call on this model waits)
    with layout_for(model, generation_config, rows, support) as layout:
        step = setup_call(model, layout, rows, stopping_criteria, generation_config, acceptance, streamer, ranks)
        if streamer is not None:
            streamer.put(input_ids.cpu())
        prefill = step.cache.prefill(input_ids, rows, step.request)
        for row in rows:
            row.stats.prefill_seconds = prefill / len(rows)
        # the static path compiles every bucket (and batch-1 drafts) here, outside the steps' costs
        step.cache.before_steps(rows, step.request, generation_config)
        # few-token linears are timed per rank: off under tensor parallelism, where every rank must decide alike
        with contextlib.nullcontext() if ranks is not None else step.cache.linears():
            chosen = speculative_steps(step, list(rows))  # generate refuses a prompt at max_length: all take a step
        if streamer is not None:
            streamer.end()
        out = assemble_result(rows, generator, generation_config, step.cache, chosen)
    released = after_call(trim)  # opted in: freed host memory back to the system, outside the static caches' lock
    if released is not None and isinstance(out, SpeculativeGenerateOutput) and out.speculative_stats is not None:
        out.speculative_stats.extra["released_mib"] = round(released, 1)
    return out


@dataclass(frozen=True)
class Step:
    """The call, set up once (:func:`setup_call`) and taken by every step: the target, its cache layout, how tokens are
    judged and when rows stop, what the drafters ask of the target's forwards, and the step's meter (clock and γ)."""

    model: PreTrainedModel
    cache: CacheLayout  # one row or a batch, owned or static: what changes during the call lives here
    generation_config: GenerationConfig
    stops: HostStops
    request: StateRequest  # what the drafters read of the target's forwards (empty: nothing more is computed)
    meter: StepMeter  # the step's clock and, with "auto" drafters, its γ controller
    vocab: int  # the target's output vocabulary (asked once: the model's config is slow to ask)
    acceptance: ConditionalAcceptance | None = None
    streamer: object = None
    controller_key: tuple | None = None  # what the controller's state is kept under for the next call


def setup_call(
    model,
    layout: CacheLayout,
    rows: list[Row],
    stopping_criteria,
    generation_config: GenerationConfig,
    acceptance,
    streamer,
    ranks: RankAgreement | None,
) -> Step:
    """Bind every row's drafter to the call and gather the call into one :class:`Step`."""
    for row in rows:
        row.generator.prepare(model, generation_config)
        row.traits = traits_of(row.generator)
    controller, key = call_controller(model, layout, rows, generation_config, ranks)
    if ranks is not None and generation_config.do_sample:
        ranks.check_random_state(model.device)
    request = StateRequest(model, [row.generator for row in rows], [row.traits for row in rows])
    stops, meter = HostStops(stopping_criteria, generation_config), StepMeter(StepClock(model.device), controller)
    vocab = output_vocab_size(model)
    return Step(model, layout, generation_config, stops, request, meter, vocab, acceptance, streamer, key)


def speculative_steps(step: Step, active: list[Row]) -> dict:
    """Speculative steps until every row is done. Returns, with a controller, ``draft_lengths`` (the γ it chose at every
    step) and ``controller_resumed`` (whether it resumed the last call's state)."""
    drafters = [row.generator for row in active]
    if not any(row.traits.requires_model_outputs for row in active):  # a batch proposer hands no state on
        step.cache.batch_proposer(drafters)  # where the layout allows (a padded batch)
    while active:
        active = speculative_step(step, active)
    controller = step.meter.controller
    if controller is None:
        return {}
    remember(controller, step.model, drafters[0], step.controller_key)
    return {"draft_lengths": controller.choices, "controller_resumed": controller.resumed}


def call_controller(
    model, layout: CacheLayout, rows: list[Row], generation_config: GenerationConfig, ranks: RankAgreement | None
) -> tuple[DraftLengthController | None, tuple | None]:
    """With ``num_draft_tokens="auto"`` drafters, the call's γ (and tree budget) controller, resumed from the last call,
    and the key its state is kept under; else ``None``s."""
    if not all(row.traits.adaptive_draft_length for row in rows):
        return None, None
    widths = (1.0, 2.0) if all(row.traits.adaptive_budget for row in rows) else (1.0,)
    longest, bucket, layout_setting = layout.controller_limits(rows[0].traits.max_draft_tokens, max(widths))
    # a copy from the text costs no draft forward: up to twice the longest draft (the static path's buckets stop there)
    controller = DraftLengthController(
        longest, widths, bucket=bucket, max_copy_tokens=longest if bucket is not None else 2 * longest
    )
    key = (len(rows), layout_setting, bool(generation_config.do_sample), str(model.device), str(model.dtype))
    controller.resumed = recall(controller, model, rows[0].generator, key)
    if ranks is not None:  # tensor parallelism: rank 0's state, the slowest rank's seconds, so every rank picks one γ
        ranks.align(controller)
    # the chain stops on its draft's confidence (controller.keep_drafting, in each step's request)
    controller.confidence_stops = layout.one_row and rows[0].traits.stops_on_confidence
    return controller, key


def speculative_step(step: Step, active: list[Row]) -> list[Row]:
    """One step of every active row: propose, verify in one forward, read back once, accept, keep. Returns the rows
    still active. Tree metadata, stop checks and statistics are host data; the clock and γ sit behind ``step.meter``."""
    meter = step.meter
    cached = [row.cached for row in active]  # before this step: row a's last cached[a] columns of the cache
    trees = draft_rows(step, active)  # propose
    logits, verified, hidden = meter.verify(step.cache.verify, active, trees, step.request.kwargs)  # (A, Q, V), (A, Q)
    kept, accepted = accept_rows(step, active, trees, logits, verified, hidden)  # read back once, accept, emit, record
    meter.learn(active, trees, kept, accepted, logits.shape[1])
    survivors = [a for a, row in enumerate(active) if not row.done]
    step.cache.keep(active, cached, kept, survivors)  # keep
    return [active[a] for a in survivors]


def accept_rows(
    step: Step, active: list[Row], trees: list[DraftTree], logits, verified, hidden
) -> tuple[list[list[int]], list[int]]:
    """After the step's one read-back, every row accepts a path and emits it; a row whose drafter reads the target's
    state keeps the states of its kept columns. Returns each row's kept columns and accepted count."""
    choices = read_back(step, active, trees, logits, verified)
    draft_seconds, forward_seconds = step.meter.seconds()
    kept, accepted, share = [], [], forward_seconds / len(active)  # each row's share of the verification forward
    for a, (row, tree) in enumerate(zip(active, trees)):
        choice = None if choices is None else choices[a]
        kept_nodes, count = accept_row(step, row, logits[a, : 1 + len(tree)], tree, choice, draft_seconds[a], share)
        kept.append(kept_nodes)
        accepted.append(count)
        if hidden is not None and row.traits.requires_model_outputs:
            row.states, row.matched = joined(row.states, kept_states(hidden, a, kept_nodes)), len(kept_nodes) - 1
    return kept, accepted


def read_back(step: Step, active: list[Row], trees: list[DraftTree], logits: torch.Tensor, verified: torch.Tensor):
    """The step's one device -> host read under greedy decoding without processors: every row's verified tokens (where
    the tree's are not on the host yet) and the target's argmax at every verified position. Returns the argmax per row,
    or ``None`` where acceptance reads scores itself (sampling, processors)."""
    if step.generation_config.do_sample or any(len(row.processor) for row in active):
        return None
    if all(tree.token_list is not None for tree in trees):  # every token on the host already: the argmax alone
        return logits.argmax(-1).tolist()
    host = torch.stack([verified[:, : logits.shape[1]], logits.argmax(-1)]).tolist()  # (2, A, Q)
    for row_ids, tree, row in zip(host[0], trees, active):
        if tree.token_list is None:
            tree.learn_tokens(row_ids[1 : 1 + len(tree)])
            check_vocab(tree.token_list, logits.shape[-1], row.generator)
    return host[1]


def draft_rows(step: Step, active: list[Row]) -> list[DraftTree]:
    """Every active row's proposal for its :class:`~hf_specdraft.core.drafting.DraftRequest`, fitted to its room before
    ``max_length`` and to the layout's ``max_nodes``: each row's drafter on its view of the target cache, or one batch
    proposer for all rows (the layout's ``together``)."""
    step.meter.begin()  # the step's clock starts; γ (and the rules) every request carries, when the controller chooses
    config, meter, limit, vocab = step.generation_config, step.meter, step.cache.max_nodes, step.vocab
    together = step.cache.together
    if together is None:
        trees = []
        for a, row in enumerate(active):
            meter.start_drafting()
            view = step.cache.drafter_cache(a, row) if row.traits.reads_target_cache else None
            state = row.target_state() if step.request else None
            request = DraftRequest(row.text, row.tokens[row.pad :], view, state, *meter.choice)
            room = config.max_length - len(row.tokens)
            tree = fit_proposal(row.generator.draft_tree(request), row.generator, vocab, room, row.traits, limit)
            if "chains_only" in row.stats.extra and not tree.is_chain:  # ALiBi / convolution: the first-child chain
                tree = tree.main_chain()
                row.stats.extra["trees_verified_as_chains"] += 1
            trees.append(tree)
            meter.drafted()
        return trees
    meter.start_drafting()
    requests = [DraftRequest(row.text, row.tokens[row.pad :], None, None, *meter.choice) for row in active]
    proposals = together.propose(requests, step.cache.batch_drafter_cache(active))
    trees = [
        fit_proposal(tree, row.generator, vocab, config.max_length - len(row.tokens), row.traits, limit)
        for row, tree in zip(active, proposals)
    ]
    meter.drafted(rows=len(active))
    return trees
