"""Acceptance rules: which drafted tokens the reviewer keeps.

Notation (Leviathan et al. 2023): p is the reviewer's (target's) distribution, q the drafter's; ``x`` a
drafted token. Every rule here is a small pure function of p (and q) at one position.

- :func:`greedy_accepts` — exact match with the reviewer's argmax (lossless for greedy decoding).
- :func:`speculative_sampling` — Leviathan et al. 2023, Algorithm 1, for a chain with q (lossless in
  distribution).
- :func:`tree_rejection_sampling` — multi-branch rejection sampling down a tree (SpecInfer), for trees with q.
- :func:`lenient_accepts` — cascade speculative drafting §3.1: accept when argmax agrees or
  ``q(x) <= l * p(x)``; lossy, so the cascade applies it only when a *draft* reviews.
- :class:`ConditionalAcceptance` — CASD eq. 3 (``p(x) > max(δ, p(eos))``) and eq. 4 (also ``x ∈ top-k(p)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def greedy_accepts(target_logits: torch.Tensor, token: int) -> bool:
    """Exact greedy acceptance: ``token == argmax p``. ``target_logits`` `(V,)`."""
    return int(target_logits.argmax()) == token


def accept_chain_greedy(target_logits: torch.Tensor, candidates: torch.Tensor) -> int:
    """Number of leading candidates equal to the target's argmax.

    Args:
        target_logits (`torch.FloatTensor` of shape `(k+1, V)`): row ``i`` scores position ``i``.
        candidates (`torch.LongTensor` of shape `(k,)`).
    """
    matches = candidates == target_logits[: candidates.numel()].argmax(-1)
    return int(matches.long().cumprod(0).sum())


def speculative_sampling(
    p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Leviathan et al. 2023, Algorithm 1: accept ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))``.

    On the first rejection the next token is drawn from ``norm(max(0, p_i - q_i))``; if all ``k`` are
    accepted it is drawn from ``p_k``. The output is distributed exactly as sampling from p.

    Args:
        p (`torch.FloatTensor` of shape `(k+1, V)`): target probabilities (after temperature / top-k / top-p).
        q (`torch.FloatTensor` of shape `(k, V)`): draft probabilities the candidates were sampled from.
        candidates (`torch.LongTensor` of shape `(k,)`).
        generator: optional RNG for reproducibility.

    Returns:
        `(n_accepted, next_token)`.
    """
    k = candidates.numel()
    idx = torch.arange(k, device=candidates.device)
    p_x = p[idx, candidates]
    q_x = q[idx, candidates]
    u = torch.rand(k, generator=generator, device=p.device) if k else p_x
    accepted = (u * q_x <= p_x).long().cumprod(0)  # u < p/q without dividing by a zero q
    n = int(accepted.sum())
    if n < k:
        residual = (p[n] - q[n]).clamp(min=0)
        if float(residual.sum()) <= 0:  # p == q at this position: the residual is undefined, use p
            residual = p[n]
        next_token = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    else:
        next_token = int(torch.multinomial(p[k], 1, generator=generator))
    return n, next_token


def tree_rejection_sampling(target_probs, tree, generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Multi-branch rejection sampling down a token tree: lossless in distribution, and it uses q.

    SpecInfer's multi-step speculative sampling (Miao et al. 2023, Algorithm 2), extended to children that
    were *picked* rather than drawn (CAPE's expansion sets, glide_cape §4.2). At each accepted node, with r
    the target's distribution p at that row, the children are tried in turn, drawn ones first:

    - a child ``x`` drawn from its q row is accepted with probability ``min(1, r(x) / q(x))``; otherwise
      ``r <- norm(max(0, r - q))`` (Leviathan et al.'s residual);
    - a picked child ``x`` is accepted with probability ``r(x)``; otherwise ``r <- norm(r with r(x) = 0)``.

    The walk goes down the first accepted child; when none is, the next token is drawn from r. Each rejection
    leaves r as the exact distribution of the output given that rejection, so the emitted tokens follow p
    whatever the tree. Accepts at least as often as token matching on drawn children (``Σ min(p, q)`` vs
    ``Σ p q`` for one child) and as often on picked ones.

    Args:
        target_probs: ``row -> p`` `(V,)`: row 0 scores the children of the root, row ``i + 1`` those of node ``i``.
        tree (:class:`~hf_specdraft.tree.DraftTree`): with ``draft_probs`` and ``sampled`` flags; siblings unique.
        generator: optional RNG.

    Returns:
        `(path, next_token)`: the accepted node indices root-to-leaf and the token after them.
    """
    if tree.draft_probs is None or tree.sampled is None:
        raise ValueError("tree_rejection_sampling needs a tree with draft_probs and sampled flags")
    children: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for node, parent in enumerate(tree.parents.tolist()):
        children[parent + 1].append(node)
    tokens, sampled = tree.tokens.tolist(), tree.sampled.tolist()
    path, row = [], 0
    while True:
        r = target_probs(row).float().clone()
        chosen = None
        for child in sorted(children[row], key=lambda c: not sampled[c]):  # drawn children first
            x = tokens[child]
            u = float(torch.rand((), generator=generator))
            if sampled[child]:
                q = tree.draft_probs[child].to(r.device).float()
                if u * float(q[x]) <= float(r[x]):
                    chosen = child
                    break
                residual = (r - q).clamp(min=0)
            else:
                if u < float(r[x]):
                    chosen = child
                    break
                residual = r.clone()
                residual[x] = 0
            total = float(residual.sum())
            if total > 0:  # (0 only by float rounding: r is then kept)
                r = residual / total
        if chosen is None:
            return path, int(torch.multinomial(r, 1, generator=generator))
        path.append(chosen)
        row = chosen + 1


def check_lenience(lenience: float) -> float:
    if not isinstance(lenience, (int, float)) or isinstance(lenience, bool) or not lenience >= 1:
        raise ValueError(f"lenience must be a number >= 1 (1 = exact review), got {lenience!r}")
    return float(lenience)


def lenient_accepts(p: torch.Tensor, q: torch.Tensor, token: int, lenience: float) -> bool:
    """Greedy lenient review (cascade speculative drafting §3.1).

    Accept ``token`` when the reviewer's argmax agrees, or when ``q(token) <= l * p(token)``.
    ``p`` `(V,)` reviewer probabilities, ``q`` `(V,)` drafter probabilities, ``l >= 1``.
    """
    check_lenience(lenience)
    return int(p.argmax()) == token or float(q[token]) <= lenience * float(p[token])


def accept_chain_lenient(p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, lenience: float) -> int:
    """Number of leading ``candidates`` `(k,)` a reviewer keeps under lenience ``l`` (``p`` `(k+1, V)`, ``q`` `(k, V)`)."""
    check_lenience(lenience)
    k = candidates.numel()
    idx = torch.arange(k, device=candidates.device)
    ok = (p[:k].argmax(-1) == candidates) | (q[idx, candidates] <= lenience * p[idx, candidates])
    return int(ok.long().cumprod(0).sum())


@dataclass(frozen=True)
class ConditionalAcceptance:
    """CASD conditional verification (casd.txt §3, eq. 3–4).

    A drafted token ``x`` whose ancestors were all accepted is accepted when
    ``p(x) > max(threshold, p(eos))`` and, if ``top_k`` is set ("mixed", eq. 4), ``x`` is among the
    ``top_k`` most probable tokens. The reviewer's own choice is always accepted, so the rule only ever
    accepts more than exact verification does. The longest accepted path wins.

    Args:
        threshold: δ in (0, 1). The paper's default is 0.1.
        top_k: optional k for the mixed rule (the paper uses 5).
    """

    threshold: float = 0.1  # δ, casd.txt §4: "we set the threshold δ to 0.1 for all experiments"
    top_k: int | None = None  # eq. 4 ("CASD (Mixed)" uses 5); None = eq. 3 only

    def __post_init__(self):
        if not isinstance(self.threshold, (int, float)) or not 0 < self.threshold < 1:
            raise ValueError(f"threshold (δ) must be in (0, 1), got {self.threshold!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or a positive int, got {self.top_k!r}")

    def accepts(self, probs: torch.Tensor, token: int, eos_token_ids: list[int]) -> bool:
        """``probs`` `(V,)`: the reviewer's distribution at the token's position."""
        p_x = float(probs[token])
        p_eos = max((float(probs[e]) for e in eos_token_ids if 0 <= e < probs.numel()), default=0.0)
        if not p_x > max(self.threshold, p_eos):
            return False
        if self.top_k is not None:
            return p_x >= float(probs.topk(min(self.top_k, probs.numel())).values[-1])
        return True
