"""CAPE's expanded proposal as a token tree (the tree mask, acceptance and compaction come from hf_specdraft's
own ``tree.py`` and ``acceptance.py``, written beside it at save time).

Torch only because it ships inside a checkpoint's ``custom_generate/``; the library's expansion
(``hf_specdraft.cape.expansion``) works on a :class:`CapeConfig` and a ``DraftTree`` with q rows, and a
test keeps the two expansions identical.

Reference: glide_cape.txt §4.2. q_i is the draft distribution at drafted position i, p_i = max q_i,
K_i = S(p_i) the size of the expansion set X_i (the K_i best tokens of q_i other than the chain token).
A tree is ``tokens`` `(N,)` + ``parents`` `(N,)` with ``parents[i] < i`` and ``-1`` for a child of the last
accepted token; expansion tokens are leaves next to their chain token.
"""

import torch

# §4.2: S(p) = 7, 5, 3, 1 for p in (0, .3], (.3, .6], (.6, .8], (.8, 1] as (upper_bound, K) bins
DEFAULT_SCHEDULE = ((0.3, 7), (0.6, 5), (0.8, 3), (1.0, 1))


def check_schedule(schedule):
    """Validate ``schedule`` as (upper_bound, K) bins: bounds increase to 1.0, K never grows."""
    pairs = tuple((float(bound), int(k)) for bound, k in schedule)
    bounds, sizes = [b for b, _ in pairs], [k for _, k in pairs]
    if not pairs or bounds[-1] != 1.0 or any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])) or bounds[0] <= 0:
        raise ValueError(f"expansion_schedule needs (upper_bound, K) bins with bounds increasing within (0, 1] up to 1.0, got {schedule!r}")
    if any(k < 0 for k in sizes) or any(k2 > k1 for k1, k2 in zip(sizes, sizes[1:])):
        raise ValueError(f"expansion_schedule K values must be >= 0 and must not grow with confidence, got {sizes}")
    return pairs


def expansion_sizes(q, schedule, budget):
    """K_i = S(max q_i), capped so that chain + expansion sets fit ``budget``, earliest positions first.

    Args:
        q (`torch.FloatTensor` of shape `(k, V)`): draft distributions of the chain.
        schedule: validated (upper_bound, K) bins.
        budget (`int`): most tree tokens per step (≥ k).

    Returns:
        `torch.LongTensor` of shape `(k,)`.
    """
    k, vocab = q.shape
    bounds = torch.tensor([b for b, _ in schedule], dtype=torch.float32, device=q.device)
    table = torch.tensor([s for _, s in schedule], dtype=torch.long, device=q.device)
    bins = torch.bucketize(q.float().amax(dim=-1), bounds).clamp_(max=len(schedule) - 1)  # right-closed bins
    wanted = table[bins].clamp(max=vocab - 1)
    spent_before = wanted.cumsum(0) - wanted
    return torch.minimum(wanted, (budget - k - spent_before).clamp(min=0))


def expand(chain, q, schedule, budget):
    """The linearized expanded proposal of §4.2: the chain, then X_0, X_1, ... as leaves.

    Args:
        chain (`torch.LongTensor` of shape `(k,)`): the drafted tokens.
        q (`torch.FloatTensor` of shape `(k, V)`): their draft distributions.

    Returns:
        `(tokens, parents)`, each `torch.LongTensor` of shape `(k + sum K_i,)`.
    """
    k = chain.numel()
    parents = torch.arange(k, device=chain.device) - 1
    widest = min(max(s for _, s in schedule), q.shape[-1] - 1)
    if k == 0 or widest == 0:
        return chain, parents
    sizes = expansion_sizes(q, schedule, budget)
    top = q.scatter(-1, chain[:, None], -1.0).topk(widest, dim=-1).indices  # X_i never holds the chain token
    keep = torch.arange(widest, device=q.device)[None] < sizes[:, None]
    position = torch.arange(k, device=q.device)[:, None].expand(-1, widest)[keep]
    return torch.cat([chain, top[keep]]), torch.cat([parents, position - 1])
