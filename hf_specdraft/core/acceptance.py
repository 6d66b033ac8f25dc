"""Acceptance rules: which drafted tokens the reviewer keeps, each a small function of p (and q).

Notation (Leviathan et al. 2023): p is the reviewer's (target's) distribution, q the drafter's; ``x`` a drafted token.
The loop's tree walk (:func:`accept_tree`), speculative sampling for a chain and multi-branch rejection sampling for a
tree (lossless), the cascade's lenient review (§3.1, lossy: only a draft reviews so) and CASD's condition.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from .tree import DraftTree


def speculative_sampling(
    p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int, int]:
    """Leviathan et al. 2023, Algorithm 1: accept ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))``; on the first
    rejection draw the next token from ``norm(max(0, p_i - q_i))``, else from ``p_k``. Lossless in distribution.

    Args:
        p (`torch.FloatTensor` of shape `(k+1, V)`): target probabilities (warped).
        q (`torch.FloatTensor` of shape `(k, V)`): draft probabilities the candidates were sampled from.
        candidates (`torch.LongTensor` of shape `(k,)`).
        generator: optional RNG.

    Returns `(n_accepted, next_token)`.
    """
    k = candidates.numel()
    idx = torch.arange(k, device=candidates.device)
    p_x, q_x = p[idx, candidates], q[idx, candidates]
    u = torch.rand(k, generator=generator, device=p.device) if k else p_x
    accepted = (u * q_x <= p_x).long().cumprod(0)  # u < p/q without dividing by a zero q
    n = int(accepted.sum())
    if n == k:
        return n, int(torch.multinomial(p[k], 1, generator=generator))
    residual = (p[n] - q[n]).clamp(min=0)
    if float(residual.sum()) <= 0:  # p == q at this position: the residual is undefined, use p
        residual = p[n]
    return n, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


def tree_rejection_sampling(target_probs, tree, generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """SpecInfer's multi-step speculative sampling down a token tree (Miao et al. 2023, Algorithm 2): lossless, with q.

    Extended to children *picked* rather than drawn (CAPE's expansion sets, Du et al. 2024, §4.2). At each accepted
    node, r = p at that row, the children are tried in turn, drawn ones first: a drawn child ``x`` passes with
    probability ``min(1, r(x) / q(x))``, else ``r <- norm(max(0, r - q))``; a picked one with probability ``r(x)``, else
    ``r <- norm(r with r(x) = 0)``. The walk goes down the first accepted child, or draws the next token from r (each
    rejection leaves r the exact distribution of the output given it).

    Args:
        target_probs: ``row -> p`` `(V,)`: row 0 scores the children of the root, row ``i + 1`` those of node ``i``.
        tree (:class:`~hf_specdraft.core.tree.DraftTree`): with ``draft_probs`` and ``sampled`` flags; siblings unique.
        generator: optional RNG.

    Returns:
        `(path, next_token)`: the accepted node indices root-to-leaf and the token after them.
    """
    if tree.draft_probs is None or tree.sampled is None:
        raise ValueError("tree_rejection_sampling needs a tree with draft_probs and sampled flags")
    children: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for node, parent in enumerate(tree.parent_list):
        children[parent + 1].append(node)
    tokens, sampled = tree.tokens.tolist(), tree.sampled.tolist()
    path, row = [], 0
    while True:
        r = target_probs(row).float().clone()
        for child in sorted(children[row], key=lambda c: not sampled[c]):  # drawn children first
            x = tokens[child]
            u = float(torch.rand((), generator=generator))
            if sampled[child]:
                q = tree.draft_probs[child].to(r.device).float()
                if u * float(q[x]) <= float(r[x]):
                    break
                residual = (r - q).clamp(min=0)
            else:
                if u < float(r[x]):
                    break
                residual = r.clone()
                residual[x] = 0
            total = float(residual.sum())
            if total > 0:  # (0 only by float rounding: r is then kept)
                r = residual / total
        else:  # every child rejected
            return path, int(torch.multinomial(r, 1, generator=generator))
        path.append(child)
        row = child + 1


def check_lenience(lenience: float) -> float:
    if not isinstance(lenience, (int, float)) or isinstance(lenience, bool) or not lenience >= 1:
        raise ValueError(f"lenience must be a number >= 1 (1 = exact review), got {lenience!r}")
    return float(lenience)


@dataclass(frozen=True)
class ConditionalAcceptance:
    """CASD conditional verification (the CASD paper, §3, eq. 3–4): a drafted token ``x`` whose ancestors were all
    accepted is accepted when ``p(x) > max(threshold, p(eos))`` and, if ``top_k`` is set ("mixed", eq. 4), ``x`` is
    among the ``top_k`` most probable tokens. The reviewer's own choice is always accepted too.

    Args:
        threshold: δ in (0, 1). The paper's default is 0.1.
        top_k: optional k for the mixed rule (the paper uses 5).
    """

    threshold: float = 0.1  # δ, the CASD paper, §4: "we set the threshold δ to 0.1 for all experiments"
    top_k: int | None = None  # eq. 4 ("CASD (Mixed)" uses 5); None = eq. 3 only

    def __post_init__(self):
        if not isinstance(self.threshold, (int, float)) or not 0 < self.threshold < 1:
            raise ValueError(f"threshold (δ) must be in (0, 1), got {self.threshold!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or a positive int, got {self.top_k!r}")

    def accepts(self, probs: torch.Tensor, token: int, eos_token_ids: Collection[int]) -> bool:
        """``probs`` `(V,)`: the reviewer's distribution at the token's position."""
        p_x = float(probs[token])
        p_eos = max((float(probs[e]) for e in eos_token_ids if 0 <= e < probs.numel()), default=0.0)
        if not p_x > max(self.threshold, p_eos):
            return False
        return self.top_k is None or p_x >= float(probs.topk(min(self.top_k, probs.numel())).values[-1])


def lenient_review(p: torch.Tensor, candidates: torch.Tensor, q_candidates: torch.Tensor, lenience: float) -> int:
    """Greedy (lenient) review by a draft (§3.1): how many leading ``candidates`` the reviewer keeps.

    Args:
        p (`torch.FloatTensor` of shape `(k+1, V)`): the reviewer's distribution at each position.
        candidates (`torch.LongTensor` of shape `(k,)`).
        q_candidates (`torch.FloatTensor` of shape `(k,)`): ``q(x)`` of each candidate under its drafter; ``inf`` for
            tokens that must match exactly (MaG's).
        lenience: ``l >= 1``; ``1`` accepts only the reviewer's argmax (as the official code, which applies the
            lenient clause only when ``l > 1``).
    """
    k = candidates.numel()
    ok = p[:k].argmax(-1) == candidates
    if lenience > 1:
        p_x = p[torch.arange(k, device=p.device), candidates]
        ok |= q_candidates.to(p.device) <= lenience * p_x
    return int(ok.long().cumprod(0).sum())


def lenient_review_sampling(
    p: torch.Tensor,
    candidates: torch.Tensor,
    q_candidates: torch.Tensor,
    lenience: float,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Probabilistic lenient review by a draft when sampling (§3.1); arguments as :func:`lenient_review`, ``p`` warped.

    Candidate ``x_i`` passes when ``q(x_i) <= l * p_i(x_i)``, else with probability ``l * p_i(x_i) / q(x_i)`` (MaG's
    tokens, ``q = inf``: with probability ``p_i(x_i)``); the first rejection ends the review and the next token is drawn
    from ``p`` there, less the rejected token. Returns `(accepted, next_token)`.
    """
    k = candidates.numel()
    p_x = p[torch.arange(k, device=p.device), candidates.to(p.device)].tolist()
    for i, (p_i, q_i) in enumerate(zip(p_x, q_candidates.tolist())):
        threshold = p_i if q_i == float("inf") else lenience * p_i / q_i if q_i > 0 else 1.0
        if threshold >= 1 or float(torch.rand((), generator=generator)) < threshold:
            continue
        residual = p[i].clone()
        residual[int(candidates[i])] = 0
        if float(residual.sum()) <= 0:
            residual = p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def accept_tree(
    rows, tree: DraftTree, acceptance: ConditionalAcceptance | None, eos_token_ids: Collection[int]
) -> tuple[list[int], int]:
    """The accepted path through ``tree`` (siblings unique), root-to-leaf node indices, and the target's next token.

    A node is accepted when its parent was and its token equals the target's choice at the parent's row (lossless: the
    choice is the argmax, or a sample from p) or passes ``acceptance`` (CASD's rule). The deepest accepted node wins
    (earliest on ties). ``rows`` gives ``choice(row)`` and ``probs(row)`` `(V,)`: row 0 scores the token after the last
    accepted one, row ``1 + i`` the one after node ``i``.
    """
    tokens = tree.token_list if tree.token_list is not None else tree.tokens.tolist()
    paths: list[list[int] | None] = [None] * len(tokens)  # each accepted node's path, root's child first
    best: list[int] = []
    for i, (parent, token) in enumerate(zip(tree.parent_list, tokens)):
        above = [] if parent < 0 else paths[parent]
        if above is None:
            continue
        ok = token == rows.choice(parent + 1)
        if not ok and acceptance is not None:
            ok = acceptance.accepts(rows.probs(parent + 1), token, eos_token_ids)
        if ok:
            paths[i] = above + [i]
            if len(paths[i]) > len(best):
                best = paths[i]
    return best, rows.choice(best[-1] + 1 if best else 0)
