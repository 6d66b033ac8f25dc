"""The one speculative decoding loop every drafter shares, for any batch size: propose → verify → accept → emit → compact.

This is the only module that touches transformers' generation internals. It runs as transformers'
supported ``custom_generate`` callable, so ``generate`` prepares the generation config, the logits
processors and the stopping criteria exactly as it does for its own decoding methods::

    out = target.generate(input_ids, custom_generate=speculative_generate, draft_model=draft, max_new_tokens=64)

or called directly (it then goes through ``target.generate`` itself)::

    out = speculative_generate(target, input_ids, candidate_generator=MyDrafter(), max_new_tokens=64)

A call decodes ``B >= 1`` rows (:class:`~hf_specdraft.core.rows.Row`); batch 1 is one row. Each step
(:func:`speculative_step`) every active row proposes a tree, one target forward verifies every row's
``[last token] + tree`` (:mod:`~hf_specdraft.core.verify`), each row accepts a path by its own rule
(:mod:`~hf_specdraft.core.acceptance`) and emits it plus the target's next token, stopping where ``generate`` would;
then the cache keeps each row's accepted path (:mod:`~hf_specdraft.core.cache`). Rows accept different numbers of
tokens, stop at different times and then leave the batch.

Invariant at the start of every step: each active row's text but its newest token sits in the target cache, in the
cache's last ``row.cached`` columns. One unpadded row *owns* the cache (its columns are all of them); a padded batch
*shares* it, right-aligned. Batch semantics follow transformers' batched ``generate``: ``max_length`` counts from the
padded prompt, finished rows are padded with ``pad_token_id`` on the right; each row's greedy output equals its own
batch-1 ``generate(do_sample=False)``.

Notation: p target distribution, q draft distribution (Leviathan et al. 2023).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation import CandidateGenerator
from transformers.utils import ModelOutput

from .acceptance import ConditionalAcceptance, accept_tree, speculative_sampling, tree_rejection_sampling
from .cache import keep_columns, target_cache
from .clock import StepClock
from .compiled import StaticCacheBusy, StaticTarget, captured_seconds, static_call, static_target
from .layouts import OwnedRow, SharedBatch
from .controller import DraftLengthController, recall, remember
from .distributed import RankAgreement
from .drafting import AUTO_MAX, TreeCandidateGenerator, output_vocab_size
from .inputs import (
    check_batch_setup,
    check_generation_setup,
    check_input_ids,
    check_padding,
    check_target_model,
    check_unmarked_padding,
    eos_list,
    resolve_generator,
    row_drafters,
    row_processors,
)
from .projection import few_token_linears
from .rows import Outputs, Row, TargetRows
from .stats import SpeculativeStats, overlap
from .stopping import HostStops
from .support import chains_only, check_target, no_logits_kwargs
from .target_state import StateRequest, TargetOutputs, TargetState, asks_for_state, joined, kept_states, prefill_states
from .tree import DraftTree


@dataclass
class SpeculativeGenerateOutput(ModelOutput):
    """``return_dict_in_generate=True`` result.

    Args:
        sequences (`torch.LongTensor` of shape `(B, L)`): prompt + generated tokens (a batch's finished rows padded with
            ``pad_token_id`` on the right).
        scores (`tuple(torch.FloatTensor)`, *optional*): processed target scores `(1, V)` per generated
            token (``output_scores=True``).
        logits (`tuple(torch.FloatTensor)`, *optional*): raw target logits `(1, V)` per generated token
            (``output_logits=True``).
        past_key_values: the target cache, covering ``sequences[:, :-1]``.
        speculative_stats (:class:`~hf_specdraft.core.stats.SpeculativeStats`): per-step statistics (of every row, for a
            padded batch: :func:`speculative_steps`).
        row_stats (`tuple(SpeculativeStats)`, *optional*): a padded batch's statistics per row.
    """

    sequences: torch.LongTensor | None = None
    scores: tuple[torch.FloatTensor, ...] | None = None
    logits: tuple[torch.FloatTensor, ...] | None = None
    past_key_values: DynamicCache | None = None
    speculative_stats: SpeculativeStats | None = None
    row_stats: tuple[SpeculativeStats, ...] | None = None


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
    **kwargs,
):
    """Speculative decoding with any drafter, as a ``custom_generate`` callable or a direct call.

    Args:
        model: the target causal LM.
        input_ids (`torch.LongTensor` of shape `(B, L)`): the prompts, left-padded with ``attention_mask`` when `B > 1`
            (each row drafts and accepts on its own, :func:`speculative_steps`).
        candidate_generator: any ``transformers.generation.CandidateGenerator``. hf_specdraft drafters
            (:class:`~hf_specdraft.core.drafting.TreeCandidateGenerator`) may propose trees.
        draft_model: shortcut for ``candidate_generator=DraftModelCandidateGenerator(draft_model, num_draft_tokens)``
            (the drafter registered for its model type instead, :func:`~hf_specdraft.core.drafting.register_drafter`:
            ``GlideCandidateGenerator`` for a GLIDE draft).
        num_draft_tokens: γ for ``draft_model``; ``"auto"`` (the default): chosen every step from the acceptance and the
            costs the loop measures (:mod:`~hf_specdraft.core.controller`).
        acceptance: ``None`` for exact verification (greedy match, or speculative sampling when
            ``do_sample=True``: lossless), or a :class:`~hf_specdraft.core.acceptance.ConditionalAcceptance` (CASD).
        token_streamer: a transformers streamer. Under ``generate(custom_generate=...)`` transformers drops
            its own ``streamer=`` argument before calling a custom callable, so pass it under this name
            there; a direct call also accepts ``streamer=``.
        kwargs: anything ``generate`` takes (``max_new_tokens``, ``do_sample``, ``eos_token_id``,
            ``stopping_criteria``, ``repetition_penalty``, ``return_dict_in_generate``, …).

    Returns:
        `torch.LongTensor` `(B, L + n)`, or :class:`SpeculativeGenerateOutput` with
        ``return_dict_in_generate=True``.
    """
    check_target_model(model)
    prepared = (
        isinstance(logits_processor, LogitsProcessorList)
        and isinstance(stopping_criteria, StoppingCriteriaList)
        and isinstance(generation_config, GenerationConfig)
        and "use_cache" in kwargs
    )
    if prepared:  # called by transformers' generate(custom_generate=speculative_generate)
        return _speculative_loop(
            model, input_ids, logits_processor, stopping_criteria, generation_config,
            resolve_generator(candidate_generator, draft_model, num_draft_tokens), acceptance, token_streamer, kwargs,
        )
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    check_input_ids(input_ids, model)
    check_padding(kwargs.get("attention_mask"), input_ids)  # a mask of another shape or padded on the right fails here
    resolve_generator(candidate_generator, draft_model, num_draft_tokens)  # fail before generate's preparation
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
        **kwargs,
    )


@torch.no_grad()
def _speculative_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, generator, acceptance, streamer, model_kwargs):
    """Check the call, prefill the target, run :func:`speculative_steps`, return what ``generate`` would."""
    check_target(model)  # recurrent-state models are refused before any forward (core.support)
    check_input_ids(input_ids, model)
    lengths = check_padding(model_kwargs.get("attention_mask"), input_ids)
    check_unmarked_padding(input_ids, lengths, generation_config.pad_token_id)
    batch, padded = input_ids.shape
    shared = batch > 1 or int(lengths[0]) < padded  # a batch, or one left-padded prompt: rows share a right-aligned cache
    if shared:
        check_batch_setup(model, generation_config, streamer, batch)
    check_generation_setup(input_ids, generation_config, model_kwargs, acceptance)
    ranks = RankAgreement.of(model)  # a tensor-parallel target: every rank must decide alike (core.distributed)
    if ranks is not None and generation_config.do_sample:
        ranks.check_random_state(model.device)
    host_ids = input_ids.tolist()  # read once: from here on the loop extends each row's tokens on the host
    rows = [Row(r, input_ids[r : r + 1], padded - int(lengths[r]), g, Outputs(SpeculativeStats()), row_processors(logits_processor, r, batch),
                tokens=host_ids[r]) for r, g in enumerate(row_drafters(generator, batch))]
    for row in rows:
        if isinstance(row.generator, TreeCandidateGenerator):
            row.generator.prepare(model, generation_config)
    request = StateRequest(model, [row.generator for row in rows])  # what the drafters read of the target's forwards
    chains = chains_only(model)  # ALiBi / convolution targets verify the tree's first-child chain (refused in a batch)
    if chains and generation_config.cache_implementation == "static":
        raise ValueError(f"cache_implementation='static' verifies with explicit 4-D masks, which {type(model).__name__} cannot take "
                         f"({chains}): leave cache_implementation unset for this model")
    if chains:
        rows[0].out.stats.extra.update(trees_verified_as_chains=0, chains_only=f"{type(model).__name__}: {chains}")
    if generation_config.cache_implementation == "static":  # the loop's static cache, verification compiled where transformers
        with static_call(model):  # would; a concurrent static call on this model waits: the cache is one request's state
            return _static_loop(model, input_ids, rows, generator, stopping_criteria, generation_config, acceptance, streamer, shared,
                                request)
    return _steps_and_result(model, target_cache(model, shared), None, input_ids, rows, generator, stopping_criteria,
                             generation_config, acceptance, streamer, shared, request)


def _static_loop(model, input_ids, rows, generator, stopping_criteria, generation_config, acceptance, streamer, shared, request):
    """The call on the static cache (held by this call): the target's, and each batch-1 draft's where its drafter can."""
    static = static_target(model, generation_config, len(rows))
    if static.compiled and not shared:
        for row in rows:
            if hasattr(row.generator, "compile_draft"):
                try:
                    made = row.generator.compile_draft(generation_config, static.compile_config, static.cache)
                except StaticCacheBusy:  # another thread's call holds this draft's static cache: this one drafts eagerly
                    continue
                static.drafts.extend(made if isinstance(made, list) else [made])
    return _steps_and_result(model, static, static, input_ids, rows, generator, stopping_criteria, generation_config, acceptance,
                             streamer, shared, request)


def _steps_and_result(model, cache, static, input_ids, rows, generator, stopping_criteria, generation_config, acceptance, streamer,
                      shared, request):
    """Prefill, run :func:`speculative_steps`, return what ``generate`` would."""
    batch = len(rows)
    if streamer is not None:
        streamer.put(input_ids.cpu())
    prefill = static.prefill(input_ids, rows, request) if static is not None else _prefill(model, cache, input_ids, rows, shared, request)
    for row in rows:
        row.out.stats.prefill_seconds = prefill / batch
        row.done = len(row.tokens) >= generation_config.max_length
    active = [row for row in rows if not row.done]
    if shared and len(active) < batch and static is None:  # rows finished before any step (the prompt already at max_length) leave the cache
        keep_columns(cache, [torch.arange(cache.get_seq_length() - row.cached, cache.get_seq_length()) for row in rows],
                     [row.index for row in active], shared)
    compiled = static is not None and static.compiled  # a compiled forward chooses its own kernels: nothing to patch
    split = RankAgreement.of(model) is not None  # few-token linears are timed per rank: off under tensor parallelism
    with contextlib.nullcontext() if compiled or split else few_token_linears(model):
        layout = speculative_steps(model, cache, active, stopping_criteria, generation_config, acceptance, streamer, shared, request)
    if streamer is not None:
        streamer.end()
    return _result(rows, generator, generation_config, cache, layout, shared)


def _prefill(model, cache: DynamicCache, input_ids: torch.LongTensor, rows: list[Row], shared: bool, request: StateRequest) -> float:
    """Fill the cache with every row's prompt but its newest token; the logits are not needed (the states asked for are
    kept, :func:`~hf_specdraft.core.target_state.prefill_states`). Returns seconds."""
    start = time.perf_counter()
    out = None
    if input_ids.shape[1] > 1 and not shared:
        out = model(input_ids=input_ids[:, :-1], past_key_values=cache, use_cache=True, **no_logits_kwargs(model), **request.kwargs)
    elif input_ids.shape[1] > 1:
        device = input_ids.device
        mask = (torch.arange(input_ids.shape[1], device=device)[None] >= torch.tensor([r.pad for r in rows], device=device)[:, None]).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=input_ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], past_key_values=cache,
                    use_cache=True, **no_logits_kwargs(model), **request.kwargs)
        for layer in cache.layers:  # padding columns hold whatever the model computed there; masked, but NaN would leak
            if layer.keys is not None:  # a KV-shared layer holds nothing of its own
                layer.keys, layer.values = layer.keys.nan_to_num(), layer.values.nan_to_num()
    if request.hidden and out is not None:
        prefill_states(out.hidden_states, rows)
    return time.perf_counter() - start


@dataclass
class Step:
    """What every step of one call shares: the target, where its cache lives (a layout of :mod:`~hf_specdraft.core.layouts`
    or the static path's :class:`~hf_specdraft.core.compiled.StaticTarget`), how tokens are judged and when rows stop,
    and what the call records (``layout``: the loop's costs, :func:`speculative_steps`)."""

    model: PreTrainedModel
    cache: object  # OwnedRow | SharedBatch | StaticTarget: drafter_cache, fit, verify, keep
    generation_config: GenerationConfig
    stops: HostStops
    acceptance: ConditionalAcceptance | None = None
    streamer: object = None
    controller: DraftLengthController | None = None
    together: object = None  # one draft forward of the whole batch per drafted token, where every row's drafter allows it
    layout: dict | None = None
    clock: StepClock | None = None
    vocab: int = 0  # the target's output vocabulary (asked once: the model's config is slow to ask)
    request: StateRequest | None = None  # what the drafters read of the target's forwards (empty: nothing more is computed)


def speculative_steps(model, cache, active, stopping_criteria, generation_config, acceptance, streamer, shared,
                      request: StateRequest | None = None) -> dict:
    """Speculative steps until every row is done.

    ``cache``: the target's ``DynamicCache``, or the static path's :class:`~hf_specdraft.core.compiled.StaticTarget`.
    Returns what the loop's layout cost, for a shared cache's statistics: ``repack_seconds`` and ``steps`` (gathers),
    ``widest_repacked`` (the widest the repacked cache got) and ``holes_columns`` (how wide a cache masking rejected
    columns in place would have grown from the prompt: the sum of every step's verified width); and the forwards run
    for the whole batch (``target_forwards``; ``batch_draft_forwards``, `None` when rows draft one by one).
    """
    static = cache if isinstance(cache, StaticTarget) else None
    columns = static.cache.max_cache_len if static is not None else cache.get_seq_length()
    layout = {"repack_seconds": 0.0, "steps": 0, "widest_repacked": columns, "holes_columns": columns,
              "target_forwards": 0, "batch_draft_forwards": None}
    place = static if static is not None else SharedBatch(model, cache, layout) if shared else OwnedRow(model, cache)
    step = Step(model, place, generation_config, HostStops(stopping_criteria, generation_config), acceptance, streamer,
                layout=layout, clock=StepClock(model.device), vocab=output_vocab_size(model),
                request=request if request is not None else StateRequest(model, []))
    drafters = [row.generator for row in active]
    if (shared and static is None and drafters and all(isinstance(d, TreeCandidateGenerator) for d in drafters)
            and not any(asks_for_state(d) for d in drafters)):  # a batch proposer hands no state on
        step.together = place.together = drafters[0].batch_drafter(drafters)
    adaptive = bool(drafters) and all(getattr(d, "adaptive_draft_length", False) for d in drafters)
    if adaptive:  # num_draft_tokens="auto": γ (and an "auto" tree budget) chosen every step
        widths = (1.0, 2.0) if all(getattr(d, "adaptive_budget", False) for d in drafters) else (1.0,)
        longest = getattr(drafters[0], "max_draft_tokens", AUTO_MAX)
        if static is not None:  # the controller weighs each γ at the cost of its bucket, and never drafts past the widest
            longest = min(longest, static.max_nodes // int(max(widths)))
        step.controller = DraftLengthController(longest, widths, bucket=static.bucket if static is not None else None)
        setting = (len(active), static is not None and (static.compiled, static.max_nodes), bool(generation_config.do_sample),
                   str(model.device), str(model.dtype))  # what else changes costs or acceptance
        resumed = recall(step.controller, model, drafters[0], setting)  # the last call's curve and counts
        ranks = RankAgreement.of(model)
        if ranks is not None:  # tensor parallelism: rank 0's state, the slowest rank's seconds, so every rank picks one γ
            ranks.align(step.controller)
        # the chain stops on its draft's confidence (controller.keep_drafting, set on the drafter step by step)
        step.controller.confidence_stops = not shared and getattr(drafters[0], "stops_on_confidence", False)
    if static is not None:  # every bucket compiles (and on CUDA is captured) before the first step of the first call: no
        static.warm_up(static.buckets[-1], step.request.kwargs)  # step ever compiles, whatever tree a drafter proposes, in this call or a later one
        for draft in static.drafts:  # and the drafts' buckets, on their own static caches
            draft.prepare()
    try:
        while active:
            active = speculative_step(step, active)
    finally:
        for drafter in drafters:
            if getattr(drafter, "stop_rule", None) is not None:
                drafter.stop_rule = None  # the rule belongs to this call's controller
    if step.together is not None:
        layout["batch_draft_forwards"] = step.together.forwards
    if step.controller is not None:
        remember(step.controller, model, drafters[0], setting)
        layout["draft_lengths"], layout["controller_resumed"] = step.controller.choices, resumed
    return layout


def speculative_step(step: Step, active: list[Row]) -> list[Row]:
    """One step of every active row: propose, verify in one forward, accept, emit, compact. Returns the rows still active.

    The device is read once (:func:`read_back`: every row's verified tokens and the target's choices, under greedy
    decoding without logits processors); tree metadata, stop checks and statistics are host data. With a
    ``controller`` (drafters with ``num_draft_tokens="auto"``) every row first drafts the γ it chooses, and it learns
    afterwards what the step accepted and cost, timed as the device sees it (:class:`~hf_specdraft.core.clock.StepClock`).
    """
    controller, clock = step.controller, step.clock
    if controller is not None:
        set_draft_length(controller, active, step.together)
    cached = [row.cached for row in active]  # before this step: row a's last cached[a] columns of the cache
    captured = captured_seconds()
    trees, draft_marks = draft_rows(step, active)
    compiled_in_draft = captured_seconds() - captured
    verify_start = clock.mark()
    logits, verified, hidden = step.cache.verify(active, trees, step.request.kwargs)  # (A, Q, V), (A, Q), states or None
    verify_end = clock.mark()
    compiled_in_verify = captured_seconds() - captured - compiled_in_draft
    choices = read_back(step, active, trees, logits, verified)  # the step's one device -> host read (greedy)
    draft_seconds = [max(0.0, clock.seconds(*marks) - compiled_in_draft / len(active)) for marks in draft_marks]
    forward_seconds = max(0.0, clock.seconds(verify_start, verify_end) - compiled_in_verify)  # compiles never reach the costs
    step.layout["target_forwards"] += 1
    step.layout["holes_columns"] += logits.shape[1]  # what a cache that only masks rejected columns would have grown by
    kept, survivors, accepted, on_chain = [], [], [], []
    widens = controller is not None and len(controller.widths) > 1 and all(getattr(row.generator, "widens_chain", False) for row in active)
    for a, (row, tree) in enumerate(zip(active, trees)):
        kept_nodes, count = accept_row(step, row, logits[a, : 1 + len(tree)], tree, None if choices is None else choices[a],
                                       draft_seconds[a], forward_seconds / len(active))
        kept.append(kept_nodes)
        accepted.append(count)
        if hidden is not None and asks_for_state(row.generator):  # the states of the columns the row keeps, left on the device
            row.states, row.matched = joined(row.states, kept_states(hidden, a, kept_nodes)), len(kept_nodes) - 1
        if widens and len(kept_nodes) - 1 == count:  # what the chain alone would have accepted (greedy: exact; a path cut at
            on_chain.append(chain_accepted(tree, kept_nodes))  # eos or max_length is left out: it says nothing of the chain)
        if not row.done:
            survivors.append(a)
    if controller is not None:
        depth = max(tree.levels for tree in trees)  # the chain a tree's nodes hang on
        confidences = None  # the probabilities of the drafted chain's tokens, for the controller's confidence bins
        if controller.confidence_stops and len(trees[0]) and (on_chain or not widens):  # a tree's chain: judged by on_chain
            drafted = active[0].generator.drafted_confidences(trees[0])
            confidences = None if drafted is None else [drafted]
        controller.observe(depth, accepted, sum(draft_seconds), forward_seconds, logits.shape[1], on_chain or None, confidences)
    step.cache.keep(active, cached, kept, survivors)
    return [active[a] for a in survivors]


def read_back(step: Step, active: list[Row], trees: list[DraftTree], logits: torch.Tensor, verified: torch.Tensor):
    """The step's one device -> host read under greedy decoding without logits processors: every row's verified tokens
    (a drafted tree's tokens reach the host here, :attr:`DraftTree.token_list`) and the target's argmax at every
    verified position. Returns the argmax per row (lists), or ``None`` where acceptance reads scores itself (sampling,
    processors, CASD's condition reads probabilities)."""
    if step.generation_config.do_sample or any(len(row.processor) for row in active):
        return None
    if all(tree.token_list is not None for tree in trees):  # every token on the host already: the argmax alone
        return logits.argmax(-1).tolist()
    host = torch.stack([verified[:, : logits.shape[1]], logits.argmax(-1)]).tolist()  # (2, A, Q)
    vocab = logits.shape[-1]
    for row_ids, tree, row in zip(host[0], trees, active):
        if tree.token_list is None:
            tree.learn_tokens(row_ids[1 : 1 + len(tree)])
            if any(not 0 <= t < vocab for t in tree.token_list):
                raise ValueError(f"{type(row.generator).__name__} proposed token ids outside the target's vocabulary [0, {vocab})")
    return host[1]


def set_draft_length(controller: DraftLengthController, active: list[Row], together) -> None:
    """Every row drafts the γ the controller chooses for this step (and, for a tree drafter, its budget)."""
    gamma = controller.choose()
    budget = controller.budget(gamma)
    for row in active:
        if controller.confidence_stops:  # the rule is only asked once it can answer (the cost curve measured)
            row.generator.stop_rule = controller.keep_drafting if controller.stops_this_step else None
        row.generator.num_draft_tokens = gamma
        if budget is not None:
            row.generator.step_budget = budget
    if together is not None:
        together.num_draft_tokens = gamma


def chain_accepted(tree: DraftTree, kept_nodes: list[int]) -> int:
    """How many tokens of the tree's first-child chain the kept path (``kept_nodes``, columns: ``1 + i`` is node ``i``)
    starts with: what the step would have accepted with the chain alone (exactly, under greedy verification)."""
    count = 0
    for chain_node, column in zip(tree.chain_nodes(), kept_nodes[1:]):
        if column != chain_node + 1:
            break
        count += 1
    return count


def accept_row(step: Step, row: Row, logits: torch.Tensor, tree: DraftTree, choices: list[int] | None, draft_seconds: float,
               forward_seconds: float) -> tuple[list[int], int]:
    """One row's share of a step: accept a path of its tree, emit it and the target's next token, record the step.

    Args:
        logits (`torch.FloatTensor` of shape `(1 + N, V)`): the target's scores at the row's last token and each node.
        choices: the target's argmax at each of those rows, read back already (greedy), or ``None``.
        forward_seconds: the row's share of the verification forward.

    Returns:
        `(kept_nodes, accepted)`: the verified columns the row keeps (0: its last token, ``1 + i``: node ``i``) and how
        many of its draft tokens it accepted.
    """
    started = time.perf_counter()
    rows = TargetRows(logits, row, tree, row.processor, step.generation_config, choices)
    path, next_token = select_accepted(rows, tree, step.acceptance, step.generation_config)
    verify_seconds = forward_seconds + time.perf_counter() - started
    emitted = emit_tokens(row, tree, path, next_token, rows, step.stops, step.generation_config)
    if step.streamer is not None:
        step.streamer.put(torch.tensor(row.tokens[-emitted:]))
    kept_nodes = [0] + [i + 1 for i in path[: emitted - 1]]  # the last token's column and the accepted path's
    if overrides_update(row.generator):  # a drafter that learns from the kept rows' scores (transformers' own do)
        index = slice(0, len(kept_nodes)) if kept_nodes == list(range(len(kept_nodes))) else kept_nodes
        row.generator.update_candidate_strategy(row.text, logits[index][None], len(path))
    record_step(row.out.stats, rows, tree, path, emitted, draft_seconds, verify_seconds)
    return kept_nodes, len(path)


def overrides_update(generator) -> bool:
    return type(generator).update_candidate_strategy is not TreeCandidateGenerator.update_candidate_strategy


def draft_rows(step: Step, active: list[Row]) -> tuple[list[DraftTree], list[tuple]]:
    """Every active row's proposal, fitted to its room before ``max_length``, and its drafting clock marks: one batch
    proposer for all rows (``together``), or each row's drafter on its view of the target cache."""
    config, clock = step.generation_config, step.clock
    if step.together is not None:
        start = clock.mark()
        step.together.target = (step.cache.cache, [row.cached for row in active])
        proposals = step.together.propose([row.text[0] for row in active])
        trees = [fit_proposal(tree, row.generator, step.vocab, config.max_length - len(row.tokens)) for row, tree in zip(active, proposals)]
        end = clock.mark()
        return trees, [(start, end, len(active))] * len(active)
    trees, marks = [], []
    for a, row in enumerate(active):
        start = clock.mark()
        view = step.cache.drafter_cache(a, row) if getattr(row.generator, "reads_target_cache", True) else None
        row.generator.host_text = row.tokens[row.pad :]  # the text on the host: drafters re-sync without reading the device
        state = take_state(row) if step.request else None
        tree = step.cache.fit(propose(row.generator, row.text, view, step.vocab, config.max_length - row.pad, state))
        if "chains_only" in row.out.stats.extra and not tree.is_chain:  # ALiBi / convolution targets: the first-child chain
            tree = tree.main_chain()
            row.out.stats.extra["trees_verified_as_chains"] += 1
        trees.append(tree)
        marks.append((start, clock.mark()))
    return trees, marks


def record_step(stats: SpeculativeStats, rows: TargetRows, tree: DraftTree, path: list[int], emitted: int,
                draft_seconds: float, verify_seconds: float) -> None:
    """One step's record: drafted depth, tree size, accepted and emitted tokens, timings, judged positions and α's overlaps."""
    drafted, accepted = tree.levels, min(len(path), emitted)
    judged = accepted + 1 if accepted == len(path) and accepted < drafted else accepted  # + the first rejected position
    stats.record(drafted=drafted, tree_size=len(tree), accepted=accepted, emitted=emitted, draft_seconds=draft_seconds,
                 verify_seconds=verify_seconds, judged=judged, overlaps=chain_overlaps(rows, tree, judged))


def chain_overlaps(rows: TargetRows, tree: DraftTree, judged: int) -> torch.Tensor | None:
    """``1 - TV(p, q)`` at the first ``judged`` positions of a chain with q (the paper's α, :mod:`~hf_specdraft.core.stats`),
    left on the device (the call reads every step's at once when it ends, :meth:`SpeculativeStats.settle`).

    Row ``i`` of the target scores chain node ``i``, so p and q there share one prefix. ``None`` for a tree,
    a proposal without q, or a q over another vocabulary size.
    """
    q = tree.draft_probs
    if not judged or q is None or not tree.is_chain or q.shape[-1] != rows.logits.shape[-1]:
        return None
    p = torch.stack([rows.probs(i) for i in range(judged)])
    q = q[:judged] if q.device == p.device else q[:judged].to(p.device)
    return overlap(p, q.float())


def take_state(row: Row) -> TargetState | None:
    """What a state-reading row's drafter is told before it proposes (transformers' protocol, :mod:`~hf_specdraft.core.target_state`):
    on its first proposal nothing (``is_first_iteration``: the prefill's states wait for the first step's), afterwards the
    states of every position added since its last proposal, handed on once."""
    if not asks_for_state(row.generator):
        return None
    first, outputs = not row.proposed, None
    if not first:
        outputs, row.states = TargetOutputs(hidden_states=row.states), None
    row.proposed = True
    text = len(row.tokens) - row.pad
    return TargetState(outputs, first, row.matched, torch.arange(text, device=row.device)[None])


def propose(generator: CandidateGenerator, input_ids: torch.LongTensor, cache: DynamicCache, vocab: int, max_length: int,
            state: TargetState | None = None) -> DraftTree:
    """Draft a tree for the next step, merge duplicate siblings (:meth:`DraftTree.merge_duplicates`: verification
    needs unique siblings) and fit it to the length budget and the target's vocabulary of ``vocab`` ids."""
    return fit_proposal(_propose(generator, input_ids, cache, state), generator, vocab, max_length - input_ids.shape[1])


def fit_proposal(tree: DraftTree, generator: CandidateGenerator, vocab: int, room: int) -> DraftTree:
    """A proposal with duplicate siblings merged, cut to ``room - 1`` levels (``room``: tokens left before max_length; one
    is the target's own token) and its ids checked against the target's vocabulary: on the host where the drafter gave
    them there, else when the step reads them back (:func:`read_back`), or here for a drafter that may propose ids past
    the target's vocabulary (a forward would fail on them before the read)."""
    tree = tree.merge_duplicates().truncate_depth(room - 1)
    if tree.token_list is not None:
        bad = any(not 0 <= t < vocab for t in tree.token_list)
    elif len(tree) and not getattr(generator, "tokens_in_vocab", False):
        bad = int(tree.tokens.max()) >= vocab or int(tree.tokens.min()) < 0
    else:
        bad = False
    if bad:
        raise ValueError(f"{type(generator).__name__} proposed token ids outside the target's vocabulary [0, {vocab})")
    return tree


def select_accepted(rows: TargetRows, tree: DraftTree, acceptance, generation_config: GenerationConfig) -> tuple[list[int], int]:
    """The accepted path and the target's next token: when sampling exactly, speculative sampling for a chain with q
    (Leviathan et al. 2023, Algorithm 1) and multi-branch rejection sampling for a tree with q and ``sampled`` flags
    (:func:`~hf_specdraft.core.acceptance.tree_rejection_sampling`); otherwise the tree walk of :func:`accept_tree`."""
    if generation_config.do_sample and acceptance is None and len(tree) and tree.is_chain and tree.draft_probs is not None:
        p = torch.stack([rows.probs(r) for r in range(len(tree) + 1)])
        n, next_token = speculative_sampling(p, tree.draft_probs.to(p.device).float(), tree.tokens.to(p.device))
        return list(range(n)), next_token
    if generation_config.do_sample and acceptance is None and len(tree) and tree.sampled is not None:
        return tree_rejection_sampling(rows.probs, tree)
    return accept_tree(rows, tree, acceptance, eos_list(generation_config))


def emit_tokens(row: Row, tree: DraftTree, path: list[int], next_token: int, rows: TargetRows, stops: HostStops,
                generation_config: GenerationConfig) -> int:
    """Append the accepted tokens and the target's token one at a time, stopping where ``generate`` would
    (:class:`~hf_specdraft.core.stopping.HostStops`: on host tokens; a criterion of the user's own reads the device).
    Extends ``row.tokens`` (and so ``row.ids``) and ``row.done``; returns how many tokens were appended."""
    tokens = ([tree.token_list[i] for i in path] if tree.token_list is not None else tree.tokens[path].tolist()) + [next_token]
    row_of = [0] + [i + 1 for i in path]  # the verified row that scored each appended token
    out = row.out
    emitted, row.done = stops.emit(row, tokens, [rows.scores(r)[None] for r in row_of] if stops.reads_scores else None)
    for j in range(emitted):
        if generation_config.output_scores:
            out.scores.append(rows.scores(row_of[j])[None])
        if generation_config.output_logits:
            out.logits.append(rows.logits[row_of[j]][None])
    row.tokens.extend(tokens[:emitted])  # row.ids follows when next read
    return emitted


def _result(rows: list[Row], generator, generation_config: GenerationConfig, cache: DynamicCache, layout: dict, shared: bool):
    """What ``generate`` returns: the sequences (finished rows padded on the right), or :class:`SpeculativeGenerateOutput`.

    One row that owned the cache returns its own statistics, scores and the cache; a shared cache's call merges the
    rows' statistics (``row_stats`` keeps each) and adds the layout's cost and ``extra["batch_forwards"]``: the rows'
    own statistics count a batch forward once in every row it served.
    """
    for row in rows:
        row.out.stats.settle()
        row.out.stats.drafter_calls = dict(getattr(row.generator, "forward_calls", {}))
    stats = rows[0].out.stats if not shared else SpeculativeStats.merge([row.out.stats for row in rows])
    lengths, resumed = layout.pop("draft_lengths", None), layout.pop("controller_resumed", None)
    if lengths:  # num_draft_tokens="auto": the γ chosen at every step, and whether it started from the last call's state
        stats.extra.update(draft_lengths=lengths, controller_resumed=resumed)
    if shared:
        forwards = {"target": layout.pop("target_forwards"), "draft": layout.pop("batch_draft_forwards")}
        stats.extra.update(batch_size=len(rows), cache_layout=layout, batch_forwards=forwards)
    for drafter in {id(g): g for g in (generator if isinstance(generator, (list, tuple)) else [generator])}.values():
        try:
            drafter.last_stats = stats
        except AttributeError:  # a generator with __slots__
            pass
    if isinstance(cache, StaticTarget):  # what the static path compiled, and what its first forwards cost
        drafts = [draft for draft in cache.drafts if draft is not None]
        stats.extra["static_cache"] = {"compiled": cache.compiled, "buckets": list(cache.buckets),
                                       "warm_up_seconds": {str(b): s for b, s in cache.warm_up_seconds.items()},
                                       "draft_compiled": bool(drafts),
                                       "draft_warm_up_seconds": {str(b): s for d in drafts for b, s in d.warm_up_seconds.items()}}
        cache = None  # the static cache is kept for the next call, which overwrites it: not handed out
    sequences = _padded_sequences(rows, generation_config)
    if not generation_config.return_dict_in_generate:
        return sequences
    if shared:
        return SpeculativeGenerateOutput(sequences=sequences, past_key_values=None, speculative_stats=stats,
                                         row_stats=tuple(row.out.stats for row in rows))
    out = rows[0].out
    return SpeculativeGenerateOutput(
        sequences=sequences,
        scores=tuple(out.scores) if generation_config.output_scores else None,
        logits=tuple(out.logits) if generation_config.output_logits else None,
        past_key_values=cache,
        speculative_stats=stats,
    )


def _padded_sequences(rows: list[Row], generation_config: GenerationConfig) -> torch.LongTensor:
    """`(B, longest)`: every row's ids, rows that finished early padded with ``pad_token_id`` on the right."""
    if len(rows) == 1:
        return rows[0].ids
    pad_token = generation_config.pad_token_id
    if isinstance(pad_token, torch.Tensor):
        pad_token = int(pad_token.flatten()[0])
    longest = max(row.ids.shape[1] for row in rows)
    if pad_token is None and any(row.ids.shape[1] < longest for row in rows):
        raise ValueError("rows finished at different lengths and generation_config.pad_token_id is None: set pad_token_id "
                         "(e.g. tokenizer.pad_token_id or the eos token id) to pad the finished rows")
    sequences = torch.full((len(rows), longest), 0 if pad_token is None else pad_token, dtype=torch.long, device=rows[0].device)
    for row in rows:
        sequences[row.index, : row.ids.shape[1]] = row.ids[0]
    return sequences


def _propose(generator: CandidateGenerator, input_ids: torch.LongTensor, cache: DynamicCache, state: TargetState | None) -> DraftTree:
    if isinstance(generator, TreeCandidateGenerator):
        return generator.propose(input_ids, cache) if state is None else generator.propose(input_ids, cache, target_state=state)
    if state is None:
        candidate_ids, candidate_logits = generator.get_candidates(input_ids)
    else:  # transformers' own state-reading generators (DFlash, MTP, Gemma 4's assistant), called as its assisted loop does
        candidate_ids, candidate_logits = generator.get_candidates(
            input_ids, model_kwargs={**state.model_kwargs(), "past_key_values": cache}, model_outputs=state.outputs,
            is_first_iteration=state.first, n_last_matches=state.matched)
    tokens = candidate_ids[0, input_ids.shape[1] :]
    probs = None
    if candidate_logits is not None and candidate_logits.shape[1] == tokens.numel():
        probs = torch.softmax(candidate_logits[0].float(), dim=-1)
    return DraftTree.chain(tokens, probs)
