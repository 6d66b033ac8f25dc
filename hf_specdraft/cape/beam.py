"""Beam-search proposal expansion: the GLIDE+BeamSearch baseline of Du et al. 2024, §5.3 (beam 4) and §5.4.

Unlike CAPE, every top-ranked token is fed back to the draft, so each depth costs a draft forward over the whole beam
(§5.4: speculation 5.5 ms -> 10.9 ms per step, against CAPE's +0.2 ms). The beams share one batch-1 draft cache, each
depth appended under a tree mask, so no cache is copied or reordered. q is the draft distribution.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..core.tree import DraftTree


def beam_search_proposal(
    scorer,
    input_ids: torch.LongTensor,
    depth: int,
    beam_width: int,
    budget: int,
    target_cache: DynamicCache | None = None,
) -> DraftTree:
    """Draft a tree by beam search over the draft model (§5.3): at each depth the ``beam_width`` best (beam, token)
    pairs by cumulative log q become the new beams and nodes, best first (the first-child path is the best beam).

    Args:
        scorer: a :class:`~hf_specdraft.core.drafting.DraftModelTreeScorer` (or any object with ``start`` /
            ``extend`` / ``finish``).
        input_ids (`torch.LongTensor` of shape `(1, L)`): the accepted text.
        depth (`int`): γ, the deepest drafted position.
        beam_width (`int`): beams kept at each depth (4 in §5.3).
        budget (`int`): most tree nodes; the last depths are cut when it runs out.
        target_cache: the target's live cache (covers ``input_ids[:, :-1]``), handed to ``scorer.start``.

    Returns:
        :class:`~hf_specdraft.core.tree.DraftTree` without ``draft_probs`` (exact tree verification never reads q).
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
        tokens.append(flat % vocab)
        parents.append(frontier[flat // vocab])  # each new node's beam
        frontier = count + torch.arange(flat.numel(), device=flat.device)
        count += flat.numel()
    scorer.finish()
    if not tokens:
        return DraftTree.empty(q_root.device)
    return DraftTree(torch.cat(tokens), torch.cat(parents))
