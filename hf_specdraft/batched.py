"""Batched speculative decoding: ``B`` left-padded prompts, one target forward per step for the whole batch.

Every row drafts, verifies and accepts on its own (rows accept different numbers of tokens, stop at different
times and then leave the batch), with the batch-1 loop's own pieces (:mod:`hf_specdraft.generation`): the same
proposal fitting, acceptance rules, token emission and statistics, applied row by row to one shared forward.

The ragged cache is *repacked*, not holed. Between steps the target's ``DynamicCache`` is `(A, H, C, D)` for the
``A`` active rows, each row right-aligned: row ``a`` covers its accepted text but its newest token in its last
``n_a`` columns, the columns before them are left padding, masked. A step appends ``1 + N`` columns (the last token
and the widest tree, narrower trees padded with masked slots that see only themselves), then gathers each row's kept
columns (its old ones, its last token, its accepted path) back into a right-aligned block as wide as the longest
row. Why: rejected tree columns leave the cache at once, so attention and memory stay at the longest row's
accepted length, never the sum of everything verified; the gather costs one copy of the cache a step, which
``DynamicCache.update``'s own concatenation already pays. Holes (masking rejected columns in place) would save that
copy but grow the cache by ``1 + N`` columns a step whatever was accepted: with 3 of 6 accepted, twice the keys to
attend and store.

Semantics follow transformers' batched ``generate``: ``max_length`` / ``max_new_tokens`` count from the padded prompt
length, stopping criteria and logits processors see the row with its left padding, finished rows are padded with
``pad_token_id`` on the right. Each row's greedy output equals its own batch-1 ``generate(do_sample=False)``.

Drafters: one per row. ``draft_model=`` builds one per row through the registry; one hf_specdraft drafter is
copied per row (:meth:`~hf_specdraft.drafting.TreeCandidateGenerator.fork`: models and tables shared, per-request
state fresh); a list gives each row its own. A drafter that reads the target's cache (GLIDE) sees its row's columns.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, GenerationConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer
from transformers.generation import CandidateGenerator, LogitsProcessorList
from transformers.generation.logits_process import (
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)

from .drafting import TreeCandidateGenerator
from .metrics import SpeculativeStats
from .projection import few_token_linears
from .support import cache_window, chains_only, check_target, convolution_only
from .tree import DraftTree, croppable_cache, tree_attention_inputs


def check_padding(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """The prompt lengths `(B,)` of a left-padded batch; a clear `ValueError` for any other mask."""
    batch, length = input_ids.shape
    if attention_mask is None:
        return torch.full((batch,), length, dtype=torch.long)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}, got "
                         f"{type(attention_mask).__name__} {tuple(getattr(attention_mask, 'shape', ()))}")
    mask = attention_mask.detach().cpu()
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (token); got other values")
    mask = mask.long()
    lengths = mask.sum(-1)
    if bool((lengths == 0).any()):
        raise ValueError(f"attention_mask rows {(lengths == 0).nonzero().flatten().tolist()} are all padding: every prompt needs a token")
    left_padded = torch.arange(length)[None] >= (length - lengths)[:, None]
    if not torch.equal(mask.bool(), left_padded):
        raise ValueError("attention_mask is not left padding: speculative decoding appends to the right of every row, so pad prompts "
                         "on the left (tokenizer.padding_side = 'left', as for transformers' batched generate)")
    return lengths


def check_batch_setup(model: PreTrainedModel, generation_config: GenerationConfig, streamer, batch: int) -> None:
    """What the batched loop does not do yet, refused by name before any forward."""
    if streamer is not None and batch > 1:
        raise ValueError("a streamer takes one sequence: stream with batch size 1, or drop streamer= for a batch")
    if generation_config.output_scores or generation_config.output_logits:
        raise ValueError("output_scores / output_logits are per-step tensors of the whole batch, which rows that accept different "
                         "numbers of tokens do not share: leave them off with a padded batch (batch size 1 unpadded supports them)")
    chains = chains_only(model)
    if chains or convolution_only(model):
        raise ValueError(f"{type(model).__name__} cannot verify a padded batch: {chains or 'its convolution state is per sequence'}; "
                         "run one unpadded prompt at a time")
    window = cache_window(DynamicCache(config=model.config))
    if window is not None and generation_config.max_length > window:
        raise ValueError(f"{type(model).__name__} has a sliding window of {window} tokens and max_length is {generation_config.max_length}: "
                         "batched speculative decoding supports windowed targets only within one window; lower max_new_tokens or "
                         "run one unpadded prompt at a time")


def row_drafters(generator, batch: int) -> list[CandidateGenerator]:
    """One drafter per row: ``generator`` itself for one row, a list as given, else forks of one hf_specdraft drafter."""
    if isinstance(generator, (list, tuple)):
        if len(generator) != batch:
            raise ValueError(f"candidate_generator lists {len(generator)} drafters for a batch of {batch} rows: give one per row")
        bad = [type(g).__name__ for g in generator if not isinstance(g, CandidateGenerator)]
        if bad:
            raise TypeError(f"candidate_generator list must hold transformers CandidateGenerators, got {bad}")
        if batch > 1 and len({id(g) for g in generator}) != batch:
            raise ValueError("candidate_generator lists the same drafter object twice: each row needs its own (drafter.fork())")
        return list(generator)
    if batch == 1:
        return [generator]
    if not isinstance(generator, TreeCandidateGenerator):
        raise ValueError(f"{type(generator).__name__} drafts for one sequence and cannot be copied per row; pass one prompt, a list of "
                         "one drafter per row, or an hf_specdraft drafter (TreeCandidateGenerator)")
    return [generator.fork() for _ in range(batch)]


def row_processors(processors: LogitsProcessorList, row: int, batch: int) -> LogitsProcessorList:
    """Row ``row``'s own copy of ``generate``'s logits processors, which were built for the whole batch.

    The loop calls them on one row at a time, so state kept per batch row is cut to that row: the repetition
    penalty's per-row padding lengths `(B,)`, the batch id ``prefix_allowed_tokens_fn`` receives, the unconditional
    context of classifier-free guidance (one running cache per row). Every other processor is copied shallowly, so
    state it creates on its first call (SynthID's) is the row's own.
    """
    if batch == 1:
        return processors
    own = LogitsProcessorList()
    for processor in processors:
        mine = copy.copy(processor)
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(processor.prompt_ignore_length, torch.Tensor):
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


@dataclass
class _Row:
    """One request of the batch."""

    index: int  # its row in the caller's batch
    ids: torch.LongTensor  # (1, P + n): the padded prompt row and the accepted tokens (what generate's criteria see)
    pad: int  # left padding of the prompt
    generator: CandidateGenerator
    out: object  # generation._Outputs
    processor: LogitsProcessorList  # generate's processors with this row's state (row_processors)
    done: bool = False

    @property
    def text(self) -> torch.LongTensor:
        """`(1, L + n)`: the row without its padding, what its drafter sees."""
        return self.ids[:, self.pad :]

    @property
    def cached(self) -> int:
        """Columns of the target cache this row uses: its text but the newest token."""
        return self.text.shape[1] - 1


def row_cache(cache: DynamicCache, a: int, row: _Row) -> DynamicCache:
    """Row ``a``'s part of the batch cache as its own `(1, H, n_a, D)` cache of views (no copy), for a drafter to read."""
    view = DynamicCache()
    columns = cache.get_seq_length()
    layers = []
    for layer in cache.layers:
        own = DynamicLayer()
        if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
            own.dtype, own.device, own.is_initialized = layer.keys.dtype, layer.keys.device, True
            own.keys = layer.keys[a : a + 1, :, columns - row.cached :]
            own.values = layer.values[a : a + 1, :, columns - row.cached :]
        layers.append(own)
    view.layers = layers
    return view


def batch_verify_inputs(rows: list[_Row], trees: list[DraftTree], columns: int, dtype: torch.dtype, device: torch.device):
    """Inputs of one target forward over every row's ``[last token] + tree``, trees padded to the widest.

    Args:
        rows: the ``A`` active rows; row ``a`` occupies the last ``rows[a].cached`` of the cache's ``columns``.
        trees: one proposal per row, ``N_a`` nodes.

    Returns:
        `(input_ids, attention_mask, position_ids)`: `(A, Q)` tokens with ``Q = 1 + max N_a`` (padded slots hold
        token 0), an additive float mask `(A, 1, Q, columns + Q)` (each node sees its row's cached columns, its last
        token and its ancestors; a padded slot sees only itself) and `(A, Q)` positions.
    """
    width = 1 + max(len(t) for t in trees)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    positions = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.full((len(rows), 1, width, columns + width), torch.finfo(dtype).min, dtype=dtype, device=device)
    diagonal = torch.arange(width, device=device)
    mask[:, 0, diagonal, columns + diagonal] = 0  # padded slots see themselves (a row of all -inf would be NaN)
    for a, (row, tree) in enumerate(zip(rows, trees)):
        q = 1 + len(tree)
        ids[a, 0] = row.ids[0, -1]
        ids[a, 1:q] = tree.tokens.to(device)
        row_mask, row_positions = tree_attention_inputs(tree, row.cached, dtype, device)
        positions[a, :q] = row_positions[0]
        positions[a, q:] = row.cached
        mask[a, 0, :q, columns - row.cached : columns] = row_mask[0, 0, :, : row.cached]
        mask[a, 0, :q, columns : columns + q] = row_mask[0, 0, :, row.cached :]
    return ids, mask, positions


def repack_cache(cache: DynamicCache, keep: list[torch.Tensor], rows: torch.Tensor) -> None:
    """Keep, for each surviving row, the cache columns ``keep[i]`` (ascending), right-aligned into one block.

    Args:
        keep: per surviving row, the `(n_i,)` column indices it keeps; the block is ``max n_i`` wide.
        rows: `(A',)` the batch rows that survive (finished rows leave).
    """
    width = max(int(k.numel()) for k in keep)
    index = torch.empty(len(keep), width, dtype=torch.long)
    for i, k in enumerate(keep):
        filler = k[:1] if k.numel() else torch.zeros(1, dtype=torch.long)
        index[i] = torch.cat([filler.expand(width - k.numel()), k])  # padding slots copy a kept column: finite, masked
    rows = rows.cpu()
    flats: dict[tuple, torch.Tensor] = {}  # (heads, columns, device) -> flat indices of the kept (row, head, column) vectors
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or not layer.keys.numel():
            continue  # a layer that holds nothing yet (pipeline-split or lazily built caches) has nothing to keep
        heads, columns = layer.keys.shape[1:3]
        key = (heads, columns, layer.keys.device)
        if key not in flats:  # layers may sit on several devices (device_map="auto")
            flats[key] = ((rows[:, None, None] * heads + torch.arange(heads)[None, :, None]) * columns
                          + index[:, None, :]).reshape(-1).to(layer.keys.device)
        flat = flats[key]  # one index_select per tensor: 3x faster on CPU than gather with an expanded index
        layer.keys = layer.keys.reshape(-1, layer.keys.shape[-1]).index_select(0, flat).view(len(keep), heads, width, -1)
        layer.values = layer.values.reshape(-1, layer.values.shape[-1]).index_select(0, flat).view(len(keep), heads, width, -1)


@torch.no_grad()
def batched_loop(model, input_ids, lengths, logits_processor, stopping_criteria, generation_config, generator, acceptance, model_kwargs):
    """The speculative loop over a left-padded batch (see the module docstring). Returns what ``generate`` would."""
    from .generation import SpeculativeGenerateOutput, _no_logits_kwargs, _Outputs  # the batch-1 loop's pieces, applied per row

    check_target(model)
    batch, padded = input_ids.shape
    pad_token = generation_config.pad_token_id
    if isinstance(pad_token, torch.Tensor):
        pad_token = int(pad_token.flatten()[0])
    drafters = row_drafters(generator, batch)
    rows = [_Row(r, input_ids[r : r + 1], padded - int(lengths[r]), g, _Outputs(SpeculativeStats()), row_processors(logits_processor, r, batch))
            for r, g in enumerate(drafters)]
    for row in rows:
        if isinstance(row.generator, TreeCandidateGenerator):
            row.generator.prepare(model, generation_config)
    device = input_ids.device
    cache = croppable_cache(model)  # full layers: check_batch_setup keeps windowed targets within one window

    start = time.perf_counter()
    if padded > 1:  # invariant: row a's text but its newest token sits in the cache's last rows[a].cached columns
        mask = (torch.arange(padded, device=device)[None] >= torch.tensor([r.pad for r in rows], device=device)[:, None]).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        model(input_ids=input_ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], past_key_values=cache, use_cache=True,
              **_no_logits_kwargs(model))
        for layer in cache.layers:  # padding columns hold whatever the model computed there; masked, but NaN would leak
            layer.keys, layer.values = layer.keys.nan_to_num(), layer.values.nan_to_num()
    prefill = time.perf_counter() - start
    for row in rows:
        row.out.stats.prefill_seconds = prefill / batch
        row.done = row.ids.shape[1] >= generation_config.max_length

    active = [row for row in rows if not row.done]
    if len(active) < batch:
        _drop_rows(cache, rows, active)
    with few_token_linears(model):
        layout = _steps(model, cache, active, stopping_criteria, generation_config, acceptance)
    return _batch_result(rows, generator, generation_config, pad_token, layout, SpeculativeGenerateOutput)


def _steps(model, cache, active, stopping_criteria, generation_config, acceptance) -> dict:
    """Speculative steps until every row is done: each row proposes, one forward verifies all, each row accepts.

    Returns what the cache layout cost: ``repack_seconds`` and ``steps`` (gathers), ``widest_repacked`` (the widest
    the repacked cache got) and ``holes_columns`` (how wide a cache masking rejected columns in place would have grown
    from the prompt: the sum of every step's verified width); and the forwards run for the whole batch
    (``target_forwards``; ``batch_draft_forwards``, `None` when rows draft one by one), which the result's
    ``extra["batch_forwards"]`` reports: the rows' own statistics, and their merge, count a batch forward once in
    every row it served."""
    layout = {"repack_seconds": 0.0, "steps": 0, "widest_repacked": cache.get_seq_length(), "holes_columns": cache.get_seq_length(),
              "target_forwards": 0, "batch_draft_forwards": None}
    from .generation import _TargetRows, emit_tokens, fit_proposal, propose, record_step, select_accepted

    device = active[0].ids.device if active else None
    drafters = [row.generator for row in active]
    together = drafters[0].batch_drafter(drafters) if all(isinstance(d, TreeCandidateGenerator) for d in drafters) else None
    while active:
        columns = cache.get_seq_length()
        trees, draft_seconds = [], []
        if together is not None:  # one draft forward of the whole batch per drafted token
            started = time.perf_counter()
            together.target = (cache, [row.cached for row in active])
            proposals = together.propose([row.text[0] for row in active])
            trees = [fit_proposal(tree, row.generator, model, generation_config.max_length - row.ids.shape[1])
                     for row, tree in zip(active, proposals)]
            draft_seconds = [(time.perf_counter() - started) / len(active)] * len(active)
        for a, row in enumerate(active if together is None else ()):
            started = time.perf_counter()
            trees.append(propose(row.generator, row.text, row_cache(cache, a, row), model, generation_config.max_length - row.pad))
            draft_seconds.append(time.perf_counter() - started)
        t1 = time.perf_counter()
        ids, mask, positions = batch_verify_inputs(active, trees, columns, model.dtype, device)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True).logits.float()
        layout["target_forwards"] += 1
        t2 = time.perf_counter()
        keep, survivors = [], []
        for a, (row, tree) in enumerate(zip(active, trees)):
            q = 1 + len(tree)
            target_rows = _TargetRows(logits[a, :q], row.ids, tree, row.processor, generation_config)
            path, next_token = select_accepted(target_rows, tree, acceptance, generation_config)
            row.ids, emitted, row.done = emit_tokens(row.ids, tree, path, next_token, target_rows, stopping_criteria, generation_config, row.out)
            kept_nodes = [0] + [i + 1 for i in path[: emitted - 1]]
            row.generator.update_candidate_strategy(row.text, logits[a, kept_nodes][None], len(path))
            record_step(row.out.stats, target_rows, tree, path, emitted, draft_seconds[a], (t2 - t1) / len(active))
            if not row.done:
                old = torch.arange(columns - (row.cached - emitted), columns)
                keep.append(torch.cat([old, columns + torch.tensor(kept_nodes, dtype=torch.long)]))
                survivors.append(a)
        active = [active[a] for a in survivors]
        layout["holes_columns"] += ids.shape[1]  # what a cache that only masks rejected columns would have grown by
        if active:
            started = time.perf_counter()
            repack_cache(cache, keep, torch.tensor(survivors, dtype=torch.long))
            layout["repack_seconds"] += time.perf_counter() - started
            layout["steps"] += 1
            layout["widest_repacked"] = max(layout["widest_repacked"], cache.get_seq_length())
            if together is not None and len(survivors) < len(trees):
                together.keep_rows(survivors)
    if together is not None:
        layout["batch_draft_forwards"] = together.forwards
    return layout


def _drop_rows(cache: DynamicCache, rows: list[_Row], active: list[_Row]) -> None:
    """Rows finished before any step (the prompt already at max_length) leave the prefilled cache."""
    if not active or not cache.layers or cache.layers[0].keys is None:
        return
    survivors = torch.tensor([r.index for r in active], dtype=torch.long)
    width = cache.get_seq_length()
    repack_cache(cache, [torch.arange(width - r.cached, width) for r in active], survivors)


def _batch_result(rows: list[_Row], generator, generation_config, pad_token, layout: dict, output_class):
    longest = max(row.ids.shape[1] for row in rows)
    if pad_token is None and any(row.ids.shape[1] < longest for row in rows):
        raise ValueError("rows finished at different lengths and generation_config.pad_token_id is None: set pad_token_id "
                         "(e.g. tokenizer.pad_token_id or the eos token id) to pad the finished rows")
    sequences = torch.full((len(rows), longest), 0 if pad_token is None else pad_token, dtype=torch.long, device=rows[0].ids.device)
    for row in rows:
        sequences[row.index, : row.ids.shape[1]] = row.ids[0]
    row_stats = []
    for row in rows:
        row.out.stats.drafter_calls = dict(getattr(row.generator, "forward_calls", {}))
        row_stats.append(row.out.stats)
    stats = SpeculativeStats.merge(row_stats)
    forwards = {"target": layout.pop("target_forwards"), "draft": layout.pop("batch_draft_forwards")}
    stats.extra.update(batch_size=len(rows), cache_layout=layout, batch_forwards=forwards)
    for drafter in {id(g): g for g in ([generator] if not isinstance(generator, (list, tuple)) else generator)}.values():
        try:
            drafter.last_stats = stats
        except AttributeError:
            pass
    if generation_config.return_dict_in_generate:
        return output_class(sequences=sequences, past_key_values=None, speculative_stats=stats, row_stats=tuple(row_stats))
    return sequences
