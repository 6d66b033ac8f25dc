"""CASD's drafter: draft trees retrieved from the request's own context (the CASD paper, §3, Algorithm 1).

p is the target's distribution; retrieved drafts have no q. The loop verifies exactly (``acceptance=None``, lossless)
or with :func:`casd_acceptance`'s rule.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..core.acceptance import ConditionalAcceptance
from ..core.drafting import AUTO, DraftRequest, TreeCandidateGenerator, output_vocab_size
from ..core.tree import DraftTree
from ..core.validation import method_config
from .configuration_casd import PAPER_MAX_NODES, CasdConfig
from .pool import DraftPool, context_token_ids
from .retrieval import merge_trees, retrieve


def tokenize_context(context, tokenizer=None, argument: str = "context"):
    """Token ids `(n,)` int64 of a context given as text (tokenized without special tokens: the pool holds the
    context's own tokens, not a BOS) or as token ids; ``ValueError`` naming ``argument`` for bad input."""
    if isinstance(context, str) and tokenizer is not None:  # text without one: context_token_ids says so
        if not context.strip():
            raise ValueError(f"{argument} is empty: CASD drafts from the request's context, so it needs some text")
        context = tokenizer(context, add_special_tokens=False)["input_ids"]
    return context_token_ids(context, argument)


def casd_acceptance(
    threshold: float = 0.1, top_k: int | None = None, strict: bool = False
) -> ConditionalAcceptance | None:
    """The verification rule to pass as ``speculative_generate(acceptance=...)``: CASD's
    :class:`~hf_specdraft.core.acceptance.ConditionalAcceptance` (δ = ``threshold``, validated even when ``strict``;
    ``top_k``: eq. 4's k, 5 in "CASD (Mixed)"), or ``None`` for exact verification (``strict``, lossless)."""
    rule = ConditionalAcceptance(threshold=threshold, top_k=top_k)  # raises ValueError for δ outside (0, 1)
    return None if strict else rule


class CasdCandidateGenerator(TreeCandidateGenerator):
    """Drafts trees retrieved from a context (Algorithm 1: line 1 builds R, here, once, from the full context, which the
    prompt may hold compressed, §4.4; line 7 retrieves 𝕋).

    Args:
        context (`str`, `torch.LongTensor`, `np.ndarray` or list of ints): the full context d_q, as text
            (needs ``tokenizer``) or token ids of shape `(n,)` or `(1, n)`.
        tokenizer: the target's tokenizer, when ``context`` is text.
        config (:class:`CasdConfig`, *optional*): retrieval options; or pass its fields as keywords.

    Attributes:
        match_lengths (`list[int]`): matched suffix length per step of the last call (0: nothing retrieved).
    """

    reads_target_cache = False  # never reads the target's cache

    def __init__(self, context, tokenizer=None, config: CasdConfig | None = None, **options):
        super().__init__()
        self.config = method_config(CasdConfig, config, options)
        self.pool = DraftPool(tokenize_context(context, tokenizer), self.config.max_suffix_length)
        # the tree's depth where the controller chooses none, and the deepest it considers
        self.num_draft_tokens = self.max_draft_tokens = self.config.max_draft_length
        # max_nodes="auto": the loop picks the tree's depth (as γ) and node budget every step
        self.adaptive_draft_length = self.adaptive_budget = self.config.max_nodes == AUTO
        self.match_lengths, self.prompt_length = [], None  # prompt_length: set by a generate call's first draft

    def check_vocabulary(self, vocab_size: int) -> None:
        if self.pool.max_token_id >= vocab_size:
            raise ValueError(
                f"context holds token id {self.pool.max_token_id}, outside the target's vocabulary "
                f"[0, {vocab_size}); tokenize the context with the target's tokenizer"
            )

    def prepare(self, target: PreTrainedModel, generation_config: GenerationConfig) -> None:
        super().prepare(target, generation_config)
        self.check_vocabulary(output_vocab_size(target))
        self.match_lengths, self.prompt_length = [], None

    def draft_tree(self, request: DraftRequest) -> DraftTree:
        """𝕋 ← R(p) for the request's text `(1, L)`."""
        input_ids = request.input_ids
        known = self.prompt_length is not None and input_ids.shape[1] >= self.prompt_length
        if not (known and torch.equal(input_ids[0, : self.prompt_length], self._prompt.to(input_ids.device))):
            # a new generate call (stock loops skip prepare)
            self.prompt_length, self._prompt = input_ids.shape[1], input_ids[0].clone()
        # "auto": the depth (as γ) and node budget the loop's controller chose, else the paper's 64 nodes
        config = self.config
        if config.max_nodes == AUTO:
            depth = min(request.num_draft_tokens or self.num_draft_tokens, config.max_draft_length)
            config = replace(config, max_nodes=request.budget or PAPER_MAX_NODES, max_draft_length=depth)
        suffix = input_ids[0, -config.max_suffix_length :]
        tree, length = retrieve(self.pool, suffix, config)
        output = input_ids[0, self.prompt_length :]
        if config.draft_from_output and output.numel() > config.min_suffix_length:
            # the tree retrieved from the generated tokens too, the longer match's first
            own, own_length = retrieve(DraftPool(output.cpu(), config.max_suffix_length), suffix, config)
            if own_length:
                first, second = (own, tree) if own_length > length else (tree, own)
                tree, length = merge_trees(first, [second], config.max_nodes), max(length, own_length)
        self.match_lengths.append(length)
        return DraftTree(tree.tokens.to(input_ids.device), tree.parents.to(input_ids.device))


def build_casd_for_bench(
    target: PreTrainedModel, context_ids: torch.Tensor, **options
) -> tuple[CasdCandidateGenerator, ConditionalAcceptance | None]:
    """`(candidate_generator, acceptance)` for the benchmark harness, the context `(n,)` checked against ``target`` now.
    ``options``: ``threshold``, ``top_k``, ``strict`` (as :func:`casd_acceptance`) and :class:`CasdConfig` fields."""
    rule = {name: options.pop(name) for name in ("threshold", "top_k", "strict") if name in options}
    acceptance = casd_acceptance(**rule)
    generator = CasdCandidateGenerator(context_ids, **options)
    generator.check_vocabulary(output_vocab_size(target))
    return generator, acceptance
