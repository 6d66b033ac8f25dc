"""Beam-search proposal expansion: the GLIDE+BeamSearch baseline of glide_cape.txt §5.3 (beam 4) and §5.4.

Unlike CAPE, every top-ranked token is *fed back* to the draft to draft its own continuation, so the
proposal is a tree with many branches and each depth costs a draft forward over the whole beam. This is
the cost §5.4 measures (speculation 5.5 ms -> 10.9 ms per step against CAPE's +0.2 ms).

Here the beams share one batch-1 draft cache: the prefix is cached once and every depth appends the
beam's new nodes with a tree mask (each node sees the prefix and its own ancestors, at position
``prefix_len + depth``), so no cache is copied or reordered. Beam scores are cumulative log q; the tree
keeps every node that was ever in the beam (a trie of the beams' prefixes), capped by the budget.

Notation: q is the draft distribution (Leviathan et al. 2023).
"""

from __future__ import annotations

from typing import Callable

import torch
from transformers import DynamicCache, PreTrainedModel

from ..drafting import common_prefix_length
from ..tree import DraftTree, build_tree_buffers


class DraftModelTreeScorer:
    """Runs a causal-LM draft over a growing token tree on top of its cached prefix.

    The protocol :func:`beam_search_proposal` needs (another drafter, e.g. GLIDE, can provide the same
    three methods): :meth:`start` caches the prefix and returns q after it, :meth:`extend` returns q after
    each new node, :meth:`finish` drops the tree nodes from the cache again.

    Args:
        draft_model: a causal LM sharing the target's vocabulary.
        distribution: maps draft logits `(n, V)` to q `(n, V)` (softmax, warped like the target when sampling).
    """

    def __init__(self, draft_model: PreTrainedModel, distribution: Callable[[torch.Tensor], torch.Tensor]):
        self.draft_model, self.distribution = draft_model, distribution
        self.forward_calls = 0
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.draft_model.config)
        self.target_cache = None
        self.seen = torch.zeros(0, dtype=torch.long)  # invariant between steps: the cache covers exactly `seen`

    def start(self, input_ids: torch.LongTensor, target_cache: DynamicCache | None = None) -> torch.Tensor:
        """Cache ``input_ids`` `(1, L)` (re-using the common prefix with the last step) and return q `(1, V)` after it.

        ``target_cache`` (the target's live cache, read-only) is unused by a plain draft model; GLIDE's scorer
        glimpses it in this and every :meth:`extend` of the step.
        """
        ids = input_ids[0].to(self.draft_model.device)
        keep = min(common_prefix_length(self.seen.to(ids.device), ids), ids.numel() - 1)
        if self.cache.get_seq_length() > keep:
            self.cache.crop(keep - self.cache.get_seq_length())
        logits = self._forward(target_cache, input_ids=ids[keep:][None], past_key_values=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1:]
        self.target_cache = target_cache
        self.seen = ids
        return self.distribution(logits)

    def extend(self, tokens: torch.LongTensor, parents: torch.LongTensor) -> torch.Tensor:
        """Append the newest ``n`` nodes of a tree to the cache and return q after each of them.

        Args:
            tokens (`torch.LongTensor` of shape `(n,)`): the new nodes, the last ``n`` of the tree.
            parents (`torch.LongTensor` of shape `(M,)`): parents of *all* ``M`` tree nodes so far,
                the new ones included (``-1`` = child of the last prefix token).

        Returns:
            `torch.FloatTensor` of shape `(n, V)`.
        """
        device, dtype = self.draft_model.device, self.draft_model.dtype
        prefix, total, n = self.seen.numel(), parents.numel(), tokens.numel()
        ancestors, depth = build_tree_buffers(parents.to(device))
        allowed = torch.zeros(n, prefix + total, dtype=torch.bool, device=device)
        allowed[:, :prefix] = True
        allowed[:, prefix:] = ancestors[total - n :]
        # additive float mask: a bool mask is silently wrong with eager attention (notes §3)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
        positions = (prefix + depth[total - n :])[None]
        logits = self._forward(
            self.target_cache, input_ids=tokens.to(device)[None], attention_mask=mask[None, None], position_ids=positions,
            past_key_values=self.cache, use_cache=True,
        ).logits[0]
        return self.distribution(logits)

    def _forward(self, target_cache: DynamicCache | None, **inputs):
        """One draft forward; a subclass whose draft reads the target's cache (GLIDE) passes ``target_cache`` on."""
        self.forward_calls += 1
        return self.draft_model(**inputs)

    def finish(self) -> None:
        """Drop the tree nodes: the cache covers the prefix again."""
        extra = self.cache.get_seq_length() - self.seen.numel()
        if extra > 0:
            self.cache.crop(-extra)


def beam_search_proposal(scorer, input_ids: torch.LongTensor, depth: int, beam_width: int, budget: int,
                         target_cache: DynamicCache | None = None) -> DraftTree:
    """Draft a tree by beam search over the draft model (the §5.3 baseline).

    Depth 0 holds the ``beam_width`` most probable tokens of q; at every further depth all beams are
    extended by one draft forward, and the ``beam_width`` best (beam, token) pairs by cumulative log q
    become the new beams and the new nodes. Nodes are listed depth by depth, best first, so the first
    child path is the best-scored beam prefix.

    Args:
        scorer: a :class:`DraftModelTreeScorer` (or any object with ``start`` / ``extend`` / ``finish``).
        input_ids (`torch.LongTensor` of shape `(1, L)`): the accepted text.
        depth (`int`): γ, the deepest drafted position.
        beam_width (`int`): beams kept at each depth (4 in §5.3).
        budget (`int`): most tree nodes; the last depths are cut when it runs out.
        target_cache: the target's live cache (covers ``input_ids[:, :-1]``), handed to ``scorer.start``.

    Returns:
        :class:`~hf_specdraft.tree.DraftTree` (without ``draft_probs``: exact tree verification never reads q).
    """
    q_root = scorer.start(input_ids, target_cache)  # (1, V)
    vocab = q_root.shape[-1]
    tokens, parents = [], []
    scores = torch.zeros(1, device=q_root.device)  # cumulative log q of each beam
    frontier = torch.full((1,), -1, dtype=torch.long, device=q_root.device)  # node index of each beam (-1 = root)
    q_frontier, count = q_root, 0
    for level in range(depth):
        width = min(beam_width, budget - count, vocab)
        if width <= 0:
            break
        if level > 0:
            q_frontier = scorer.extend(tokens[-1], torch.cat(parents))
        candidates = (scores[:, None] + q_frontier.log()).flatten()  # (beams * V,)
        best, flat = candidates.topk(width)
        finite = best.isfinite()  # never extend a beam by a token q rules out
        scores, flat = best[finite], flat[finite]
        if flat.numel() == 0:
            break
        rows = flat // vocab
        tokens.append(flat % vocab)
        parents.append(frontier[rows])
        frontier = count + torch.arange(flat.numel(), device=flat.device)
        count += flat.numel()
    scorer.finish()
    if not tokens:
        return DraftTree.empty(q_root.device)
    return DraftTree(torch.cat(tokens), torch.cat(parents))
