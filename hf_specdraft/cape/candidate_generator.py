"""CAPE's drafter: a chain drafter's proposal, widened by confidence and verified as one tree (Du et al. 2024, §4.2).

The loop's tree path runs the linearized expanded proposal through the target in one forward under the CAPE mask; the
accepted path may end in an expansion token. q is the draft distribution, p = max q the draft's confidence.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..core.batch_drafting import BatchProposer
from ..core.drafting import AUTO, DraftOutcome, DraftRequest, TreeCandidateGenerator, traits_of
from ..core.tree import DraftTree
from ..core.validation import method_config
from .beam import beam_search_proposal
from .config import CapeConfig
from .expansion import _sizes, check_chain, expand_proposal


class CapeCandidateGenerator(TreeCandidateGenerator):
    """CAPE over any chain drafter that reports q: ``mode="confidence"`` and ``"fixed"`` widen its chain from that q,
    with no extra draft forward (§4.2); ``mode="beam"`` drafts a beam-search tree of depth γ instead (§5.3).

    Args:
        drafter (:class:`~hf_specdraft.core.drafting.TreeCandidateGenerator`): proposes a chain with
            ``draft_probs`` (e.g. :class:`~hf_specdraft.DraftModelCandidateGenerator`, or GLIDE's drafter).
        config (:class:`CapeConfig`, *optional*): or pass its fields as keywords.

    Attributes (per step of the last ``generate`` call):
        expansion_sizes (`list[list[int]]`): K_i of each drafted position (beam mode: beams at each depth minus one).
        confidences (`list[list[float]]`): p_i = max q_i of each drafted position (empty in beam mode).
        expansion_seconds (`list[float]`): the time spent expanding the chain (§5.4: +0.2 ms on a 5.5 ms step).
    """

    def __init__(self, drafter: TreeCandidateGenerator, config: CapeConfig | None = None, **options):
        super().__init__()
        if not isinstance(drafter, TreeCandidateGenerator):
            raise TypeError(
                "drafter must be an hf_specdraft TreeCandidateGenerator proposing a chain with draft_probs, got "
                f"{type(drafter).__name__}"
            )
        self.config = method_config(CapeConfig, config, options)
        self.drafter = drafter
        self._declare_traits()
        if self.num_draft_tokens is not None:
            self.config.check_chain_length(self.num_draft_tokens)  # fail at construction, not at the first step
        self.scorer = None
        if self.config.mode == "beam":
            if self.num_draft_tokens is None:
                raise ValueError(
                    f"mode='beam' drafts as deep as the wrapped drafter's chain, but {type(drafter).__name__} has no "
                    "int num_draft_tokens"
                )
            # a drafter with a tree forward (a draft model, GLIDE); q `(n, V)` warped as sampled (no warper reads ids)
            self.scorer = drafter.beam_scorer(partial(self.draft_distribution, input_ids=None))
            if self.scorer is None:
                raise ValueError(
                    "mode='beam' drafts a beam-search tree, which needs a draft model: wrap a "
                    f"DraftModelCandidateGenerator, or give {type(drafter).__name__} a beam_scorer(distribution) "
                    "method (see hf_specdraft.core.drafting.DraftModelTreeScorer)"
                )
        self.expansion_sizes, self.confidences, self.expansion_seconds = [], [], []  # see Attributes
        self._chain: DraftTree | None = None  # this step's chain before it was widened (drafted_confidences reads it)

    def _declare_traits(self) -> None:
        """CAPE's traits from the wrapped drafter's, read again once it is prepared (it may declare some only then)."""
        inner = traits_of(self.drafter)
        self.num_draft_tokens = inner.num_draft_tokens  # γ where the loop's controller chooses none
        self.adaptive_draft_length = inner.adaptive_draft_length
        # the loop also picks the budget every step (budget="auto", confidence or fixed mode)
        self.adaptive_budget = inner.adaptive_draft_length and self.config.budget == AUTO and self.config.mode != "beam"
        # the loop may stop the chain on its confidence on steps whose "auto" budget is the chain only
        self.stops_on_confidence = self.adaptive_budget and inner.stops_on_confidence
        self.reads_target_cache = inner.reads_target_cache
        self.requires_model_outputs = inner.requires_model_outputs
        self.model_kwargs_overrides = dict(inner.model_kwargs_overrides)  # what it asks of the target's forward
        anchor = self.drafter.controller_anchor
        self.controller_anchor = type(self.drafter) if anchor is None else anchor

    def drafted_confidences(self, tree: DraftTree) -> list[float] | None:
        """q of each token of this step's unwidened chain, as far as ``tree``'s chain (cut at ``max_length``) goes."""
        confidences = None if self._chain is None else self.drafter.drafted_confidences(self._chain)
        return None if confidences is None else confidences[: len(tree.chain_nodes())]

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        super().prepare(target, generation_config)
        self.drafter.prepare(target, generation_config)
        self._declare_traits()
        if self.scorer is not None:
            self.scorer.reset()
            self.scorer.forward_calls = 0
        self.expansion_sizes, self.confidences, self.expansion_seconds = [], [], []
        self._chain = None

    # its trees are the chain plus expansion leaves: the loop counts what the chain alone would accept
    widens_chain = True

    @property
    def compiles_draft(self) -> bool:
        return self.scorer is None and traits_of(self.drafter).compiles_draft  # beam mode's tree scorer stays eager

    def compile_draft(self, generation_config: GenerationConfig, compile_config, target_cache):
        """The wrapped drafter's static cache on the compiled static path (called only where ``compiles_draft``)."""
        return self.drafter.compile_draft(generation_config, compile_config, target_cache)

    @torch.no_grad()
    def draft_tree(self, request: DraftRequest) -> DraftTree:
        if self.scorer is None:
            return self.expand(self.drafter.draft_tree(self.chain_request(request)), request)
        depth = request.num_draft_tokens or self.num_draft_tokens  # beam mode (§5.3): a beam-search tree γ deep
        tree = beam_search_proposal(
            self.scorer,
            request.input_ids,
            depth,
            self.config.beam_width,
            self.config.budget_for(depth),
            request.target_cache,
        )
        self.forward_calls = {"draft": self.scorer.forward_calls}
        self.expansion_sizes.append([tree.depth_list.count(d) - 1 for d in range(tree.levels)])  # host lists
        return tree

    @staticmethod
    def chain_request(request: DraftRequest) -> DraftRequest:
        """The wrapped chain drafter's request: this step's, less the budget (the tree's, CAPE's own)."""
        return request if request.budget is None else replace(request, budget=None)

    def learn(self, outcome: DraftOutcome) -> None:
        self.drafter.learn(outcome)

    @property
    def learns_from_outcome(self) -> bool:
        return self.drafter.learns_from_outcome

    def expand(self, chain: DraftTree, request: DraftRequest) -> DraftTree:
        """``chain`` widened by one expansion set per position (§4.2)."""
        self.forward_calls = dict(self.drafter.forward_calls)
        # nothing drafted (a state-reading drafter's first call), or a copy of the text (GLIDE's copy_from_context:
        # no q to size expansion sets by): nothing to widen
        if not len(chain) or chain.copied:
            return chain
        check_chain(chain, f"the proposal of {type(self.drafter).__name__}")
        if chain.draft_probs.is_cuda:  # time the expansion alone, not the draft kernels still queued
            torch.cuda.synchronize(chain.draft_probs.device)
        start = time.perf_counter()
        self._chain = chain
        config, length = self.config, len(chain)
        if config.budget == AUTO:  # the request's budget (scaled to a chain cut short), else twice the chain
            gamma = request.num_draft_tokens or self.num_draft_tokens
            budget = round(request.budget * length / gamma) if request.budget and isinstance(gamma, int) else 2 * length
            config = replace(config, budget=max(length, budget))
        sizes, confidences = _sizes(chain.draft_probs, config)
        tree = expand_proposal(chain, config, sizes, with_draft_probs=self.generation_config.do_sample)
        self.expansion_seconds.append(time.perf_counter() - start)
        self.expansion_sizes.append(sizes)
        self.confidences.append(confidences)
        return tree

    def batch_drafter(self, drafters: list[TreeCandidateGenerator]) -> BatchProposer | None:
        """The wrapped drafter's batch proposer, each row's chain then expanded; `None` in beam mode, or when the rows'
        CAPE settings or drafters differ."""
        if self.scorer is not None or type(self).draft_tree is not CapeCandidateGenerator.draft_tree:
            return None  # beam mode, or a subclass whose draft_tree drafts row by row
        if any(type(d) is not type(self) or d.config != self.config for d in drafters):
            return None
        inner = self.drafter.batch_drafter([d.drafter for d in drafters])
        return None if inner is None else _ExpandedBatch(drafters, inner)

    def get_candidates(
        self, input_ids: torch.LongTensor, **kwargs
    ) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """A chain-only loop cannot verify expansion sets, so it gets the wrapped drafter's chain (and its q)."""
        return self.drafter.get_candidates(input_ids, **kwargs)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches: int):
        return self.drafter.update_candidate_strategy(input_ids, scores, num_matches)


class _ExpandedBatch(BatchProposer):
    """Every row's chain from the wrapped drafters' batch proposer, expanded by that row's CAPE drafter."""

    def __init__(self, capes: list[CapeCandidateGenerator], inner: BatchProposer):
        self.capes, self.inner = list(capes), inner

    @property
    def forwards(self) -> int:
        return self.inner.forwards

    def propose(self, requests: list[DraftRequest], target: tuple | None = None) -> list[DraftTree]:
        chains = self.inner.propose([CapeCandidateGenerator.chain_request(request) for request in requests], target)
        return [cape.expand(chain, request) for cape, chain, request in zip(self.capes, chains, requests)]

    def keep_rows(self, survivors: list[int]) -> None:
        self.capes = [self.capes[a] for a in survivors]
        self.inner.keep_rows(survivors)


def build_cape_for_bench(
    chain_drafter: TreeCandidateGenerator, mode: str = "confidence", **options
) -> CapeCandidateGenerator:
    """The bench harness's entry point: CAPE (``"confidence"``, §4.2), fixed-K (``"fixed"``, §5.4) or beam (``"beam"``,
    §5.3) over ``chain_drafter``; ``options``: other :class:`CapeConfig` fields."""
    return CapeCandidateGenerator(chain_drafter, CapeConfig(mode=mode, **options))
