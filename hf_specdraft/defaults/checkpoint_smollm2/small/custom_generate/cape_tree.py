"""CAPE's expanded proposal as a token tree, its verification buffers, greedy acceptance and cache compaction.

Self-contained (torch and transformers only) because it ships inside a checkpoint's ``custom_generate/``.
hf_specdraft's own implementation is ``hf_specdraft.cape.expansion`` + ``hf_specdraft.tree``; a test keeps
the two expansions identical.

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


def tree_inputs(parents, past_length, dtype, device):
    """Mask and positions that verify ``[last token] + tree`` on top of a cache of ``past_length`` tokens.

    Node i sees the cache, the last token and its ancestors-or-self (the CAPE mask of §4.2), at position
    ``past_length + 1 + depth[i]``. The mask is additive float (a bool mask is silently wrong with eager).

    Returns:
        `(attention_mask, position_ids)` of shapes `(1, 1, 1+N, past_length+1+N)` and `(1, 1+N)`.
    """
    n = parents.numel()
    ancestors = torch.eye(n, dtype=torch.bool, device=device)
    depth = torch.zeros(n, dtype=torch.long, device=device)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            ancestors[i] |= ancestors[p]
            depth[i] = depth[p] + 1
    allowed = torch.zeros(1 + n, past_length + 1 + n, dtype=torch.bool, device=device)
    allowed[:, : past_length + 1] = True
    allowed[1:, past_length + 1 :] = ancestors
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    positions = torch.cat([torch.zeros(1, dtype=torch.long, device=device), depth + 1]) + past_length
    return mask[None, None], positions[None]


def accept_greedy(tokens, parents, choice):
    """Deepest node whose whole path matches the target's argmax, and the target's token after it.

    Args:
        choice (`list[int]`): the target's argmax at each verified row; row ``1 + i`` follows node ``i``.

    Returns:
        `(path, next_token)`: accepted node indices root-to-leaf and the target's bonus token.
    """
    accepted, depth, best = {}, {}, -1
    for i, (parent, token) in enumerate(zip(parents.tolist(), tokens.tolist())):
        if (parent < 0 or parent in accepted) and token == choice[parent + 1]:
            accepted[i] = True
            depth[i] = 0 if parent < 0 else depth[parent] + 1
            if best < 0 or depth[i] > depth[best]:
                best = i
    path, node, parent_of = [], best, parents.tolist()
    while node >= 0:
        path.append(node)
        node = parent_of[node]
    return path[::-1], choice[best + 1]


def compact_cache(cache, keep):
    """Keep the sequence positions ``keep`` `(M,)` of every cache layer (keys are post-RoPE at their final positions)."""
    length, m = cache.get_seq_length(), keep.numel()
    if m == length:
        return
    if bool((keep == torch.arange(m, device=keep.device)).all()):
        cache.crop(m - length)
        return
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel():
            index = keep.to(layer.keys.device)
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
            if hasattr(layer, "cumulative_length"):  # sliding-window layers; decoding stays inside the window
                layer.cumulative_length = m
