"""The one speculative decoding loop every drafter shares (draft → verify in one forward → accept → compact).

This is the only module that touches transformers' generation internals. It runs as transformers'
supported ``custom_generate`` callable, so ``generate`` prepares the generation config, the logits
processors and the stopping criteria exactly as it does for its own decoding methods::

    out = target.generate(input_ids, custom_generate=speculative_generate, draft_model=draft, max_new_tokens=64)

or called directly (it then goes through ``target.generate`` itself)::

    out = speculative_generate(target, input_ids, candidate_generator=MyDrafter(), max_new_tokens=64)

Invariant of the loop: the target's ``DynamicCache`` covers ``input_ids[:, :-1]`` at the start of every
step. A step sends ``[last token] + tree`` through the target with a tree mask, picks the accepted path
(:mod:`hf_specdraft.acceptance`), appends it plus the target's own next token, and compacts the cache
to the accepted path (:func:`hf_specdraft.tree.compact_cache`).

Notation: p target distribution, q draft distribution (Leviathan et al. 2023).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation import CandidateGenerator
from transformers.utils import ModelOutput

from .acceptance import ConditionalAcceptance, accept_tree, speculative_sampling, tree_rejection_sampling
from .batched import batched_loop, check_batch_setup, check_padding, row_drafters
from .drafting import TreeCandidateGenerator, drafter_for, output_vocab_size
from .metrics import SpeculativeStats, overlap
from .projection import few_token_linears
from .support import cache_window, chains_only, check_target, convolution_only
from .tree import DraftTree, compact_cache, layer_masks, tree_attention_inputs


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
        speculative_stats (:class:`~hf_specdraft.metrics.SpeculativeStats`): per-step statistics (of every row, for a
            padded batch: :mod:`hf_specdraft.batched`).
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
    num_draft_tokens: int = 5,
    acceptance: ConditionalAcceptance | None = None,
    token_streamer=None,
    **kwargs,
):
    """Speculative decoding with any drafter, as a ``custom_generate`` callable or a direct call.

    Args:
        model: the target causal LM.
        input_ids (`torch.LongTensor` of shape `(B, L)`): the prompts, left-padded with ``attention_mask`` when `B > 1`
            (each row drafts and accepts on its own, :mod:`hf_specdraft.batched`).
        candidate_generator: any ``transformers.generation.CandidateGenerator``. hf_specdraft drafters
            (:class:`~hf_specdraft.drafting.TreeCandidateGenerator`) may propose trees.
        draft_model: shortcut for ``candidate_generator=DraftModelCandidateGenerator(draft_model, num_draft_tokens)``
            (the drafter registered for its model type instead, :func:`~hf_specdraft.drafting.register_drafter`:
            ``GlideCandidateGenerator`` for a GLIDE draft).
        num_draft_tokens: γ for ``draft_model``.
        acceptance: ``None`` for exact verification (greedy match, or speculative sampling when
            ``do_sample=True``: lossless), or a :class:`~hf_specdraft.acceptance.ConditionalAcceptance` (CASD).
        token_streamer: a transformers streamer. Under ``generate(custom_generate=...)`` transformers drops
            its own ``streamer=`` argument before calling a custom callable, so pass it under this name
            there; a direct call also accepts ``streamer=``.
        kwargs: anything ``generate`` takes (``max_new_tokens``, ``do_sample``, ``eos_token_id``,
            ``stopping_criteria``, ``repetition_penalty``, ``return_dict_in_generate``, …).

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
    if prepared:  # called by transformers' generate(custom_generate=speculative_generate)
        return _speculative_loop(
            model, input_ids, logits_processor, stopping_criteria, generation_config,
            _resolve_generator(candidate_generator, draft_model, num_draft_tokens), acceptance, token_streamer, kwargs,
        )
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    _check_input_ids(input_ids, model)
    check_padding(kwargs.get("attention_mask"), input_ids)  # a mask of another shape or padded on the right fails here
    _resolve_generator(candidate_generator, draft_model, num_draft_tokens)  # fail before generate's preparation
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


def _resolve_generator(candidate_generator, draft_model, num_draft_tokens) -> CandidateGenerator:
    if candidate_generator is not None and draft_model is not None:
        raise ValueError("pass either candidate_generator= or draft_model=, not both")
    if candidate_generator is None and draft_model is None:
        raise ValueError("speculative_generate needs a drafter: pass candidate_generator=<CandidateGenerator> or draft_model=<causal LM>")
    if draft_model is not None:
        if isinstance(draft_model, str):
            raise TypeError(
                f"draft_model must be a loaded model, got the string {draft_model!r}: load it first, e.g. "
                f"draft_model=AutoModelForCausalLM.from_pretrained({draft_model!r})"
            )
        if not isinstance(draft_model, PreTrainedModel):
            raise TypeError(f"draft_model must be a transformers PreTrainedModel, got {type(draft_model).__name__}")
        return drafter_for(draft_model, num_draft_tokens)  # GLIDE registers its own drafter: it reads the target's cache
    if isinstance(candidate_generator, (list, tuple)):  # one drafter per row of a batch
        if not candidate_generator:
            raise ValueError("candidate_generator is an empty list: give one drafter per row of input_ids")
        return [_resolve_generator(g, None, num_draft_tokens) for g in candidate_generator]
    if not isinstance(candidate_generator, CandidateGenerator):
        raise TypeError(f"candidate_generator must be a transformers CandidateGenerator (or a list of one per row), got {type(candidate_generator).__name__}")
    if getattr(candidate_generator, "requires_model_outputs", False) and not isinstance(candidate_generator, TreeCandidateGenerator):
        raise ValueError(
            f"{type(candidate_generator).__name__} needs transformers' assisted-decoding model outputs, which this loop does not "
            "produce; use it with target.generate(assistant_model=...) instead"
        )
    return candidate_generator


def _check_input_ids(input_ids, model=None) -> None:
    """A 2-D integer tensor of ids the model's embedding holds; a clear `ValueError` naming what is wrong otherwise."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a 2-D LongTensor of shape (B, L), got {type(input_ids).__name__} {getattr(input_ids, 'shape', '')}")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids holds no rows: pass at least one prompt")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}")
    embeddings = model.get_input_embeddings() if model is not None else None
    vocab = getattr(embeddings, "num_embeddings", None)
    if vocab is not None:
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"input_ids holds token id {low if low < 0 else high}, outside the model's vocabulary [0, {vocab}): "
                             "was the prompt tokenized with another model's tokenizer?")



def _check_generation_setup(model, input_ids, generation_config, model_kwargs, cache: DynamicCache) -> None:
    if generation_config.num_beams > 1 or generation_config.num_return_sequences > 1:
        raise ValueError("num_beams and num_return_sequences must be 1 (generate expands the batch for them) with speculative decoding")
    _check_input_ids(input_ids)
    if generation_config.cache_implementation in ("static", "offloaded_static", "sliding_window", "hybrid"):
        raise ValueError(f"cache_implementation={generation_config.cache_implementation!r} is not supported: speculative decoding compacts the cache and needs a DynamicCache (leave cache_implementation unset)")
    passed = model_kwargs.get("past_key_values")
    if passed is not None and (not isinstance(passed, DynamicCache) or passed.get_seq_length() > 0):
        raise ValueError(f"past_key_values must be empty or absent, got a {type(passed).__name__} holding {passed.get_seq_length()} tokens: speculative decoding needs its own DynamicCache")
    # use_cache=False (MPT's config default, for one) is not refused: the loop always verifies against its own
    # KV cache, and caching changes no output token.


class _TargetRows:
    """The target's next-token scores at each verified position, processed lazily.

    Row 0 scores the token after the last accepted one; row ``1+i`` the token after tree node ``i``.
    Logits processors see the row's own prefix (the accepted text plus the node's path), as in
    transformers' assisted decoding. Rows are processed only when acceptance asks for them.
    """

    def __init__(self, logits, input_ids, tree, processor, generation_config):
        self.logits, self.input_ids, self.tree = logits, input_ids, tree  # logits: (1+N, V) float32
        self.processor = processor if len(processor) else None
        self.do_sample = generation_config.do_sample
        self._scores, self._probs, self._choice = {}, {}, {}
        if self.processor is None and not self.do_sample:
            self._choice = dict(enumerate(logits.argmax(-1).tolist()))

    def scores(self, row: int) -> torch.Tensor:
        if row not in self._scores:
            if self.processor is None:
                self._scores[row] = self.logits[row]
            else:
                path = self.tree.tokens[self.tree.path_to(row - 1)].to(self.input_ids.device)
                prefix = torch.cat([self.input_ids, path[None]], dim=-1)
                self._scores[row] = self.processor(prefix, self.logits[row : row + 1].clone())[0]
        return self._scores[row]

    def probs(self, row: int) -> torch.Tensor:
        if row not in self._probs:  # read by acceptance and again by the α statistics
            self._probs[row] = torch.softmax(self.scores(row), dim=-1)
        return self._probs[row]

    def choice(self, row: int) -> int:
        """The target's own token at this row: argmax, or a sample from p when sampling."""
        if row not in self._choice:
            self._choice[row] = int(torch.multinomial(self.probs(row), 1)) if self.do_sample else int(self.scores(row).argmax())
        return self._choice[row]


def _eos_list(generation_config: GenerationConfig) -> list[int]:
    eos = generation_config.eos_token_id
    if eos is None:
        return []
    if isinstance(eos, torch.Tensor):
        return eos.flatten().tolist()
    return [eos] if isinstance(eos, int) else list(eos)


@dataclass
class _Outputs:
    """What the loop accumulates besides the sequence."""

    stats: SpeculativeStats
    scores: list = field(default_factory=list)
    logits: list = field(default_factory=list)


@torch.no_grad()
def _speculative_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, generator, acceptance, streamer, model_kwargs):
    check_target(model)  # recurrent-state models are refused before any forward (hf_specdraft.support)
    _check_input_ids(input_ids, model)
    lengths = check_padding(model_kwargs.get("attention_mask"), input_ids)
    if input_ids.shape[0] > 1 or int(lengths[0]) < input_ids.shape[1]:  # a batch, or one left-padded prompt
        check_batch_setup(model, generation_config, streamer, input_ids.shape[0])
        _check_generation_setup(model, input_ids, generation_config, model_kwargs, None)
        if acceptance is not None and not isinstance(acceptance, ConditionalAcceptance):
            raise TypeError(f"acceptance must be None or a ConditionalAcceptance, got {type(acceptance).__name__}")
        return batched_loop(model, input_ids, lengths, logits_processor, stopping_criteria, generation_config, generator, acceptance, model_kwargs)
    if isinstance(generator, (list, tuple)):
        generator = row_drafters(generator, 1)[0]
    cache = DynamicCache(config=model.config)
    if convolution_only(model) or cache_window(cache) is not None:
        # convolution layers keep the inputs a crop needs to roll back; sliding-window layers keep every key until
        # compaction, so a rejected branch never pushes an accepted key out of the window (tree.trim_windows)
        cache.activate_past_recording()
    _check_generation_setup(model, input_ids, generation_config, model_kwargs, cache)
    if acceptance is not None and not isinstance(acceptance, ConditionalAcceptance):
        raise TypeError(f"acceptance must be None or a ConditionalAcceptance, got {type(acceptance).__name__}")
    if isinstance(generator, TreeCandidateGenerator):
        generator.prepare(model, generation_config)
    out = _Outputs(SpeculativeStats())
    chains = chains_only(model)
    if chains:
        out.stats.extra.update(trees_verified_as_chains=0, chains_only=f"{type(model).__name__}: {chains}")
    if streamer is not None:
        streamer.put(input_ids.cpu())
    start = time.perf_counter()
    if input_ids.shape[1] > 1:  # invariant: cache covers input_ids[:, :-1]; the prefill's logits are not needed
        model(input_ids=input_ids[:, :-1], past_key_values=cache, use_cache=True, **_no_logits_kwargs(model))
    out.stats.prefill_seconds = time.perf_counter() - start

    with few_token_linears(model):
        done = input_ids.shape[1] >= generation_config.max_length
        while not done:
            input_ids, done = _step(model, input_ids, cache, generator, acceptance, logits_processor, stopping_criteria,
                                    generation_config, streamer, out)
    if streamer is not None:
        streamer.end()
    return _finish(generator, generation_config, input_ids, cache, out)


def _step(model, input_ids, cache, generator, acceptance, logits_processor, stopping_criteria, generation_config, streamer, out: _Outputs):
    """One speculative step: propose, verify in one forward, accept, emit, compact. Returns (input_ids, done)."""
    cur_len = input_ids.shape[1]
    t0 = time.perf_counter()
    tree = propose(generator, input_ids, cache, model, generation_config.max_length)
    if "chains_only" in out.stats.extra and not tree.is_chain:  # ALiBi / convolution targets: the tree's first-child chain
        tree = tree.main_chain()
        out.stats.extra["trees_verified_as_chains"] += 1
    t1 = time.perf_counter()
    logits = verify_tree(model, input_ids, cache, tree)
    rows = _TargetRows(logits, input_ids, tree, logits_processor, generation_config)
    path, next_token = select_accepted(rows, tree, acceptance, generation_config)
    t2 = time.perf_counter()
    input_ids, emitted, done = emit_tokens(input_ids, tree, path, next_token, rows, stopping_criteria, generation_config, out)
    compact_cache(cache, torch.cat([torch.arange(cur_len), cur_len + torch.tensor(path[: emitted - 1], dtype=torch.long)]).to(input_ids.device))
    if streamer is not None:
        streamer.put(input_ids[0, cur_len:].cpu())
    generator.update_candidate_strategy(input_ids, logits[[0] + [i + 1 for i in path[: emitted - 1]]][None], len(path))
    record_step(out.stats, rows, tree, path, emitted, t1 - t0, t2 - t1)
    return input_ids, done


def record_step(stats: SpeculativeStats, rows: _TargetRows, tree: DraftTree, path: list[int], emitted: int,
                draft_seconds: float, verify_seconds: float) -> None:
    """One step's record: drafted depth, tree size, accepted and emitted tokens, timings, judged positions and α's overlaps."""
    drafted, accepted = int(tree.depth.max()) + 1 if len(tree) else 0, min(len(path), emitted)
    judged = accepted + 1 if accepted == len(path) and accepted < drafted else accepted  # + the first rejected position
    stats.record(drafted=drafted, tree_size=len(tree), accepted=accepted, emitted=emitted, draft_seconds=draft_seconds,
                 verify_seconds=verify_seconds, judged=judged, overlaps=chain_overlaps(rows, tree, judged))


def _no_logits_kwargs(model) -> dict:
    """``logits_to_keep=1`` where the model's forward takes it: a prefill needs the cache, not V logits per prompt token."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def chain_overlaps(rows: _TargetRows, tree: DraftTree, judged: int) -> list[float] | None:
    """``1 - TV(p, q)`` at the first ``judged`` positions of a chain with q (the paper's α, :mod:`~hf_specdraft.metrics`).

    Row ``i`` of the target scores chain node ``i``, so p and q there share one prefix. ``None`` for a tree,
    a proposal without q, or a q over another vocabulary size.
    """
    q = tree.draft_probs
    if not judged or q is None or not tree.is_chain or q.shape[-1] != rows.logits.shape[-1]:
        return None
    p = torch.stack([rows.probs(i) for i in range(judged)])
    return overlap(p, q[:judged].to(p.device).float()).tolist()


def propose(generator: CandidateGenerator, input_ids: torch.LongTensor, cache: DynamicCache, model: PreTrainedModel, max_length: int) -> DraftTree:
    """Draft a tree for the next step, merge duplicate siblings (:meth:`DraftTree.merge_duplicates`: verification
    needs unique siblings) and fit it to the length budget and the model's limits."""
    return fit_proposal(_propose(generator, input_ids, cache), generator, model, max_length - input_ids.shape[1])


def fit_proposal(tree: DraftTree, generator: CandidateGenerator, model: PreTrainedModel, room: int) -> DraftTree:
    """A proposal with duplicate siblings merged, cut to ``room - 1`` levels (``room``: tokens left before max_length; one
    is the target's own token) and its ids checked against the target's vocabulary."""
    tree = tree.merge_duplicates().truncate_depth(room - 1)
    vocab = output_vocab_size(model)
    if len(tree) and (int(tree.tokens.max()) >= vocab or int(tree.tokens.min()) < 0):
        raise ValueError(f"{type(generator).__name__} proposed token ids outside the target's vocabulary [0, {vocab})")
    return tree


def verify_tree(model: PreTrainedModel, input_ids: torch.LongTensor, cache: DynamicCache, tree: DraftTree) -> torch.Tensor:
    """One target forward over ``[last token] + tree`` on the cache. Returns float32 logits `(1+N, V)`.

    A chain uses the model's own causal mask (keeping the fast SDPA path); a tree uses the float tree mask
    and explicit positions (:func:`~hf_specdraft.tree.tree_attention_inputs`).
    """
    verify_ids = torch.cat([input_ids[:, -1:], tree.tokens.to(input_ids.device)[None]], dim=-1)
    kwargs = {}
    if len(tree) and not tree.is_chain:
        mask, positions = tree_attention_inputs(tree, input_ids.shape[1] - 1, model.dtype, input_ids.device)
        keys = torch.cat([torch.arange(input_ids.shape[1] - 1, device=input_ids.device), positions[0]])
        kwargs = {"attention_mask": layer_masks(model, cache, mask, positions, keys), "position_ids": positions}
    return model(input_ids=verify_ids, past_key_values=cache, use_cache=True, **kwargs).logits[0].float()


def select_accepted(rows: _TargetRows, tree: DraftTree, acceptance, generation_config: GenerationConfig) -> tuple[list[int], int]:
    """The accepted path and the target's next token: when sampling exactly, speculative sampling for a chain with q
    (Leviathan et al. 2023, Algorithm 1) and multi-branch rejection sampling for a tree with q and ``sampled`` flags
    (:func:`~hf_specdraft.acceptance.tree_rejection_sampling`); otherwise the tree walk of :func:`accept_tree`."""
    if generation_config.do_sample and acceptance is None and len(tree) and tree.is_chain and tree.draft_probs is not None:
        p = torch.stack([rows.probs(r) for r in range(len(tree) + 1)])
        n, next_token = speculative_sampling(p, tree.draft_probs.to(p.device).float(), tree.tokens.to(p.device))
        return list(range(n)), next_token
    if generation_config.do_sample and acceptance is None and len(tree) and tree.sampled is not None:
        return tree_rejection_sampling(rows.probs, tree)
    return accept_tree(rows, tree, acceptance, _eos_list(generation_config))


def emit_tokens(input_ids, tree, path, next_token, rows, stopping_criteria, generation_config, out: _Outputs):
    """Append the accepted tokens and the target's token one at a time, stopping where ``generate`` would.

    Returns:
        `(input_ids, emitted, done)`: the extended sequence, how many tokens were appended, whether to stop.
    """
    tokens = tree.tokens[path].tolist() + [next_token]
    row_of = [0] + [i + 1 for i in path]  # the verified row that scored each appended token
    cur_len = input_ids.shape[1]
    extended = torch.cat([input_ids, torch.tensor([tokens], device=input_ids.device)], dim=-1)
    for j in range(len(tokens)):
        row_scores = rows.scores(row_of[j])[None]
        if generation_config.output_scores:
            out.scores.append(row_scores)
        if generation_config.output_logits:
            out.logits.append(rows.logits[row_of[j]][None])
        if bool(stopping_criteria(extended[:, : cur_len + j + 1], row_scores).all()):
            return extended[:, : cur_len + j + 1], j + 1, True
    return extended, len(tokens), False


def _finish(generator, generation_config, input_ids, cache, out: _Outputs):
    out.stats.drafter_calls = dict(getattr(generator, "forward_calls", {}))
    try:
        generator.last_stats = out.stats
    except AttributeError:  # a generator with __slots__
        pass
    if generation_config.return_dict_in_generate:
        return SpeculativeGenerateOutput(
            sequences=input_ids,
            scores=tuple(out.scores) if generation_config.output_scores else None,
            logits=tuple(out.logits) if generation_config.output_logits else None,
            past_key_values=cache,
            speculative_stats=out.stats,
        )
    return input_ids


def _propose(generator: CandidateGenerator, input_ids: torch.LongTensor, cache: DynamicCache) -> DraftTree:
    if isinstance(generator, TreeCandidateGenerator):
        return generator.propose(input_ids, cache)
    candidate_ids, candidate_logits = generator.get_candidates(input_ids)
    tokens = candidate_ids[0, input_ids.shape[1] :]
    probs = None
    if candidate_logits is not None and candidate_logits.shape[1] == tokens.numel():
        probs = torch.softmax(candidate_logits[0].float(), dim=-1)
    return DraftTree.chain(tokens, probs)
