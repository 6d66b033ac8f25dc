"""CAPE's expansion rule on lists and tensors (Du et al. 2024, §4.2): the set X_i, the K_i = S(max q_i) most probable
tokens of the draft distribution q_i besides chain token i, as leaves beside it.

One source for the library (:mod:`hf_specdraft.cape.expansion`) and the ``custom_generate/`` folder a checkpoint
ships (:func:`hf_specdraft.cape.write_custom_generate` writes this file there), so it imports torch alone.

    >>> scheduled_sizes([0.5, 0.7], DEFAULT_SCHEDULE), fit_budget([5, 3], room=4, vocab=4)
    ([5, 3], [3, 1])
"""

import torch

# §4.2: S(p) = 7, 5, 3, 1 for p in (0, .3], (.3, .6], (.6, .8], (.8, 1]. The official code keeps the top-8/6/4/2
# tokens *including* the greedy one, i.e. the same 7/5/3/1 extra tokens (DESIGN.md, Lessons).
DEFAULT_SCHEDULE = ((0.3, 7), (0.6, 5), (0.8, 3), (1.0, 1))


def check_schedule(schedule, name="schedule"):
    """``schedule`` as validated ``((upper_bound, K), ...)`` bins (bounds increasing strictly up to 1.0, K ints >= 0
    never growing with confidence), else a `ValueError` naming ``name``."""
    try:
        pairs = tuple((float(bound), k) for bound, k in schedule)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of (upper_bound, K) pairs, got {schedule!r}") from None
    if not pairs:
        raise ValueError(f"{name} is empty: give at least one (upper_bound, K) bin, e.g. ((1.0, 3),)")
    bounds, sizes = [b for b, _ in pairs], [k for _, k in pairs]
    if any(not isinstance(k, int) or isinstance(k, bool) or k < 0 for k in sizes):
        raise ValueError(f"every K in {name} must be an int >= 0, got {sizes}")
    if any(not 0.0 < b <= 1.0 for b in bounds) or any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
        raise ValueError(f"{name} bounds must increase strictly within (0, 1], got {bounds}")
    if bounds[-1] != 1.0:
        raise ValueError(f"the last {name} bound must be 1.0 so that every confidence has a K, got {bounds[-1]}")
    if any(k2 > k1 for k1, k2 in zip(sizes, sizes[1:])):
        raise ValueError(
            f"{name} is not monotone: K must not grow with confidence (CAPE widens uncertain positions), "
            f"got K = {sizes} for bounds {bounds}"
        )
    return pairs


def scheduled_sizes(confidence, schedule):
    """S(p_i) for each confidence p_i (`list[float]`), in the paper's right-closed bins; bounds are rounded to float32
    like p, so p = 0.3 lands in (0, 0.3] and not in the next bin."""
    bounds = torch.tensor([bound for bound, _ in schedule], dtype=torch.float32).tolist()
    sizes = [size for _, size in schedule]
    return [next((size for bound, size in zip(bounds, sizes) if p <= bound), sizes[-1]) for p in confidence]


def fit_budget(wanted, room, vocab):
    """Cap the wanted K_i so that all sets fit ``room`` tokens (and ``vocab - 1`` each), earliest first: an early
    position is accepted more often than a later one, so its alternatives are worth more."""
    sizes = []
    for want in wanted:
        take = max(0, min(want, vocab - 1, room))
        sizes.append(take)
        room -= take
    return sizes


def expansion_sets(chain, q, sizes):
    """The linearized expanded proposal of §4.2 for ``chain`` (`list[int]`, k tokens), ``q`` `(k, V)` and K_i
    ``sizes``: lists `(tokens, parents, position)` of the chain then X_0, X_1, ... (each best-first; a leaf of X_i has
    parent ``i - 1``), ``position`` the chain position each leaf widens."""
    tokens, parents, position = list(chain), list(range(-1, len(chain) - 1)), []
    widest = min(max(sizes, default=0), q.shape[-1] - 1)
    if not chain or widest == 0:
        return tokens, parents, position
    ranked = q.topk(widest + 1, dim=-1).indices.tolist()  # widest + 1: X_i is the best K_i other than x_{t+i}
    for i, (size, row) in enumerate(zip(sizes, ranked)):
        leaves = [token for token in row if token != chain[i]][:size]
        tokens += leaves
        parents += [i - 1] * len(leaves)
        position += [i] * len(leaves)
    return tokens, parents, position


def expand(chain, q, schedule, budget):
    """CAPE's proposal for the shipped loop: host lists ``(tokens, parents)`` for ``chain`` `(k,)`, ``q`` `(k, V)`,
    validated ``schedule`` bins and ``budget`` (most tree tokens per step, >= k)."""
    k, vocab = q.shape
    sizes = fit_budget(scheduled_sizes(q.amax(dim=-1).tolist() if k else [], schedule), budget - k, vocab)
    return expansion_sets(chain.tolist(), q, sizes)[:2]
