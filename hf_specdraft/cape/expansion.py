"""CAPE's proposal expansion (Du et al. 2024, §4.2): q_i is the draft distribution at drafted position i, p_i = max q_i
its confidence, X_i the K_i = S(p_i) most probable tokens of q_i besides the chain token. The proposal is linearized as
in §4.2, the chain then X_0, X_1, ...; a leaf of X_i shares its chain token's parent (mask_CAPE as a tree):

    >>> import torch
    >>> q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.15, 0.1, 0.05, 0.7]])  # p_0 = .5 -> K = 5, p_1 = .7 -> K = 3
    >>> tree = expand_proposal(DraftTree.chain(torch.tensor([0, 3]), q), CapeConfig(budget=6))
    >>> tree.tokens.tolist(), tree.parents.tolist()  # the budget of 6 leaves room for 3 + 1 extra tokens
    ([0, 3, 1, 2, 3, 0], [-1, 0, -1, -1, -1, 0])
"""

from __future__ import annotations

import torch

from ..core.tree import DraftTree
from .config import CapeConfig
from .expansion_sets import expansion_sets, fit_budget, scheduled_sizes


def expansion_sizes(draft_probs: torch.Tensor, config: CapeConfig) -> torch.LongTensor:
    """K_i = S(p_i) for every drafted position, the budget left after the chain spent on the earliest first (§4.2).

    Args:
        draft_probs (`torch.FloatTensor` of shape `(k, V)`): q at each of the ``k`` drafted positions.
        config (:class:`CapeConfig`): schedule, budget and mode (``"confidence"`` or ``"fixed"``).

    Returns:
        `torch.LongTensor` of shape `(k,)`: the size of each expansion set (≤ V - 1), on ``draft_probs``' device.
    """
    return torch.tensor(_sizes(draft_probs, config)[0], dtype=torch.long, device=draft_probs.device)


def _sizes(draft_probs: torch.Tensor, config: CapeConfig) -> tuple[list[int], list[float]]:
    """``(K_i, p_i)`` as Python lists: k ≤ a few dozen positions, so plain Python beats a dozen tiny tensor ops."""
    if config.mode == "beam":
        raise ValueError(
            "expansion_sizes applies to mode='confidence' or 'fixed'; beam mode drafts its own tree (see beam.py)"
        )
    k, vocab = draft_probs.shape
    config.check_chain_length(k)
    confidence = draft_probs.amax(dim=-1).tolist() if k else []  # p_i = max q_i
    wanted = [config.fixed_k] * k if config.mode == "fixed" else scheduled_sizes(confidence, config.schedule)
    return fit_budget(wanted, config.budget_for(k) - k, vocab), confidence


def check_chain(chain: DraftTree, source: str = "the chain") -> None:
    """Raise a `ValueError` naming ``source`` unless ``chain`` is a chain (parents = [-1, 0, 1, ...]) with q."""
    if chain.draft_probs is None:
        raise ValueError(
            f"{source} came without draft_probs (draft_probs=None); CAPE sizes each expansion set by the draft's "
            "confidence max q, so use a drafter that returns its distributions (e.g. DraftModelCandidateGenerator, "
            "GLIDE)"
        )
    if not chain.is_chain:
        raise ValueError(f"{source} is a tree with several branches; CAPE expands a chain (parents = [-1, 0, 1, ...])")


def expand_proposal(
    chain: DraftTree, config: CapeConfig, sizes: torch.Tensor | list[int] | None = None, with_draft_probs: bool = False
) -> DraftTree:
    """Add each position's expansion set to a drafted chain, as leaves (§4.2, "Proposal Expansion"). Reads only
    ``chain.draft_probs`` (one ``topk``, no draft forward: why CAPE costs +0.2 ms of draft time, §5.4).

    Args:
        chain (:class:`~hf_specdraft.core.tree.DraftTree`): a chain of ``k`` tokens with ``draft_probs`` `(k, V)`.
        config (:class:`CapeConfig`): the schedule and the budget.
        sizes (`torch.LongTensor` or `list[int]` of length `k`, *optional*): precomputed :func:`expansion_sizes`.
        with_draft_probs (`bool`): also return ``draft_probs`` (leaf rows repeat q_i) and ``sampled`` flags (leaves
            are picked, not drawn) for rejection sampling under ``do_sample=True``. Off for greedy decoding, which
            never reads q: copying `(N, V)` rows is most of the expansion's cost on CPU.

    Returns:
        :class:`~hf_specdraft.core.tree.DraftTree` of ``k + sum(K_i)`` nodes: the chain, then X_0, X_1, ...
        (each set best-first). Leaf ``x'`` of X_i has parent ``chain.parents[i]``.
    """
    check_chain(chain)
    q = chain.draft_probs
    if sizes is None:
        sizes = _sizes(q, config)[0]
    sizes = sizes.tolist() if isinstance(sizes, torch.Tensor) else list(sizes)
    if len(sizes) != len(chain) or any(not isinstance(k, int) or k < 0 for k in sizes):
        raise ValueError(f"sizes must hold one int >= 0 per drafted position ({len(chain)}), got {sizes}")
    if len(chain) == 0 or min(max(sizes, default=0), q.shape[-1] - 1) == 0:
        return chain if with_draft_probs else DraftTree(chain.tokens, chain.parents)
    tokens, parents, position = expansion_sets(chain.tokens.tolist(), q, sizes)
    device = q.device
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        parents=torch.tensor(parents, dtype=torch.long, device=device),
        draft_probs=torch.cat([q, q[torch.tensor(position, device=device)]]) if with_draft_probs else None,
        sampled=torch.cat([chain.sampled, chain.sampled.new_zeros(len(position))])
        if with_draft_probs and chain.sampled is not None
        else None,
    )
