"""Speculative sampling is lossless in distribution (Leviathan et al. 2023, Algorithm 1).

Threshold: each chi-square goodness-of-fit test must have p-value > 1e-3. With a fixed seed the test is
deterministic; a correct implementation fails it with probability 1e-3 per fresh seed, a wrong one
(e.g. accepting with p/q without the residual, or ignoring q) fails it reliably at these sample sizes.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from hf_specdraft import speculative_generate, speculative_sampling
from conftest import tiny_model

P_VALUE = 1e-3


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs * counts.sum() >= 5  # cells with tiny expectations make chi-square unreliable: pool them
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]]).double()
    expected = torch.cat([probs[keep], probs[~keep].sum()[None]]).double() * counts.sum()
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    expected = expected / expected.sum() * observed.sum()  # float rounding: scipy wants equal totals
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


def first_two_joint(target, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The exact joint distribution `(V, V)` of the first two tokens ``target`` samples after ``x`` `(1, L)`."""
    with torch.no_grad():
        p1 = torch.softmax(target(x).logits[0, -1] / temperature, -1)
        p2 = torch.stack(
            [
                torch.softmax(target(torch.cat([x, torch.tensor([[t]])], 1)).logits[0, -1] / temperature, -1)
                for t in range(p1.numel())
            ]
        )
    return p1[:, None] * p2


def test_speculative_sampling_function_matches_p():
    g = torch.Generator().manual_seed(0)
    V, k = 6, 2
    p = torch.softmax(torch.randn(k + 1, V, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(k, V, generator=g) * 2, -1)
    counts = torch.zeros(V)
    wrong = torch.zeros(V)
    for _ in range(20000):
        x = torch.multinomial(q[0], 1, generator=g)
        n, nxt = speculative_sampling(p, q, torch.cat([x, torch.multinomial(q[1], 1, generator=g)]), generator=g)
        first = int(x) if n >= 1 else nxt
        counts[first] += 1
        wrong[int(x)] += 1  # "always accept": distributed as q, which the test must reject
    assert chi_square_p(counts, p[0]) > P_VALUE
    assert chi_square_p(wrong, p[0]) < P_VALUE


@pytest.mark.slow  # ~16 s: 5,000-draw distribution test; the others cover sampling in the default run
def test_speculative_generate_samples_from_target():
    V = 8
    target = tiny_model(vocab_size=V, seed=0)
    draft = tiny_model(vocab_size=V, seed=7, num_hidden_layers=1)
    x = torch.tensor([[1, 2, 3]])
    assert first_two_p_value(target, draft, x) > P_VALUE


def first_two_p_value(target, draft, x: torch.Tensor, draws: int = 1500, temperature: float = 1.3) -> float:
    """Chi-square p-value of the first two tokens speculative sampling draws after ``x`` (draft γ = 2) against the
    target's own joint distribution of them."""
    V = target.config.vocab_size
    joint = first_two_joint(target, x, temperature=temperature).flatten()
    counts = torch.zeros(V * V)
    torch.manual_seed(0)
    for _ in range(draws):
        out = speculative_generate(
            target,
            x,
            draft_model=draft,
            num_draft_tokens=2,
            max_new_tokens=2,
            do_sample=True,
            temperature=temperature,
            top_k=0,
        )
        counts[out[0, -2] * V + out[0, -1]] += 1
    return chi_square_p(counts, joint)
