"""CAPE's proposal expansion: widen each drafted position by the draft's own uncertainty (glide_cape.txt §4.2).

Notation: q_i is the draft distribution at drafted position i (the ``draft_probs`` row of chain token
x_{t+i}), p_i = max q_i its confidence, S(p) the schedule, K_i = S(p_i) the size of the expansion set
X_i: the K_i most probable tokens of q_i other than x_{t+i}.

The expanded proposal is *linearized* as in §4.2: the chain first, then X_0, X_1, ... . Each expansion
token is a leaf whose parent is the parent of its chain token, i.e. it sees the chain tokens before its
position and itself, which is exactly the mask_CAPE of §4.2 expressed as a :class:`~hf_specdraft.tree.DraftTree`:

    >>> import torch
    >>> q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.15, 0.1, 0.05, 0.7]])  # p_0 = .5 -> K = 5, p_1 = .7 -> K = 3
    >>> tree = expand_proposal(DraftTree.chain(torch.tensor([0, 3]), q), CapeConfig(budget=6))
    >>> tree.tokens.tolist(), tree.parents.tolist()  # the budget of 6 leaves room for 3 + 1 extra tokens
    ([0, 3, 1, 2, 3, 0], [-1, 0, -1, -1, -1, 0])
"""

from __future__ import annotations

import torch

from ..tree import DraftTree
from .config import CapeConfig


def expansion_sizes(draft_probs: torch.Tensor, config: CapeConfig) -> torch.LongTensor:
    """K_i = S(p_i) for every drafted position, capped by the verification budget (§4.2).

    The budget left after the chain (``config.budget - k``) is spent on the earliest positions first: an
    early position is accepted more often than a later one, so its alternatives are worth more.

    Args:
        draft_probs (`torch.FloatTensor` of shape `(k, V)`): q at each of the ``k`` drafted positions.
        config (:class:`CapeConfig`): schedule, budget and mode (``"confidence"`` or ``"fixed"``).

    Returns:
        `torch.LongTensor` of shape `(k,)`: the size of each expansion set (≤ V - 1), on ``draft_probs``' device.
    """
    if config.mode == "beam":
        raise ValueError("expansion_sizes applies to mode='confidence' or 'fixed'; beam mode drafts its own tree (see beam.py)")
    k, vocab = draft_probs.shape
    config.check_chain_length(k)
    device = draft_probs.device
    if config.mode == "fixed":
        wanted = torch.full((k,), config.fixed_k, dtype=torch.long, device=device)
    else:
        confidence = draft_probs.float().amax(dim=-1)  # p_i = max q_i
        bounds = torch.tensor(config.bounds, dtype=torch.float32, device=device)
        # bucketize(right=False) finds i with bounds[i-1] < p <= bounds[i]: the paper's right-closed bins
        bins = torch.bucketize(confidence, bounds).clamp_(max=len(config.bounds) - 1)
        wanted = torch.tensor(config.sizes, dtype=torch.long, device=device)[bins]
    wanted = wanted.clamp(max=vocab - 1)
    room = config.budget - k
    spent_before = wanted.cumsum(0) - wanted
    return torch.minimum(wanted, (room - spent_before).clamp(min=0))


def expand_proposal(chain: DraftTree, config: CapeConfig, sizes: torch.Tensor | None = None, with_draft_probs: bool = False) -> DraftTree:
    """Add each position's expansion set to a drafted chain, as leaves (glide_cape.txt §4.2, "Proposal Expansion").

    Pure: reads only ``chain.draft_probs``; no draft forward is run, which is why CAPE costs almost no
    draft time (§5.4: +0.2 ms on a 5.5 ms speculation step).

    Args:
        chain (:class:`~hf_specdraft.tree.DraftTree`): a chain of ``k`` tokens with ``draft_probs`` `(k, V)`.
        config (:class:`CapeConfig`): the schedule and the budget.
        sizes (`torch.LongTensor` of shape `(k,)`, *optional*): precomputed :func:`expansion_sizes`.
        with_draft_probs (`bool`): also return ``draft_probs`` (leaf rows repeat q_i). Off by default:
            tree verification is an exact match that never reads q, and copying ``(N, V)`` rows is most of
            the expansion's cost on CPU.

    Returns:
        :class:`~hf_specdraft.tree.DraftTree` of ``k + sum(K_i)`` nodes: the chain, then X_0, X_1, ...
        (each set best-first). Leaf ``x'`` of X_i has parent ``chain.parents[i]``.
    """
    if chain.draft_probs is None:
        raise ValueError("CAPE needs the draft distribution q of every drafted token, but the chain has draft_probs=None")
    if not chain.is_chain:
        raise ValueError("expand_proposal expands a chain (parents = [-1, 0, 1, ...]); got a tree with several branches")
    q = chain.draft_probs
    if sizes is None:
        sizes = expansion_sizes(q, config)
    widest = min(config.max_expansion, q.shape[-1] - 1)
    if len(chain) == 0 or widest == 0:
        return chain if with_draft_probs else DraftTree(chain.tokens, chain.parents)
    tokens = chain.tokens.to(q.device)
    others = q.scatter(-1, tokens[:, None], -1.0)  # a copy in which x_{t+i} ranks last: X_i excludes it
    top = others.topk(widest, dim=-1).indices  # (k, widest), best first
    keep = torch.arange(widest, device=q.device)[None] < sizes.to(q.device)[:, None]
    position = torch.arange(len(chain), device=q.device)[:, None].expand(-1, widest)[keep]  # pos(i) of each leaf
    return DraftTree(
        tokens=torch.cat([tokens, top[keep]]),
        parents=torch.cat([chain.parents.to(q.device), chain.parents.to(q.device)[position]]),
        draft_probs=torch.cat([q, q[position]]) if with_draft_probs else None,
    )
