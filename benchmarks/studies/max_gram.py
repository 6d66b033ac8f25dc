"""Max-Gram's cost per proposal (Chen et al. 2024, §3.3), as the decoding loop calls it. Run from the repository root::

python -m benchmarks.studies.max_gram
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from hf_specdraft.cascade.max_gram import MAX_GRAM_TOKENS, MaxGramCandidateGenerator


def benchmark_max_gram(
    context_length: int = 8192,
    vocab_size: int = 32000,
    num_draft_tokens: int = MAX_GRAM_TOKENS,
    repeats: int = 200,
    device: str = "cpu",
    sequence: torch.Tensor | None = None,
    seed: int = 0,
) -> dict:
    """Median milliseconds per Max-Gram proposal, as the decoding loop calls it (not a test).

    The default context is Zipf-distributed tokens with copied spans, so the last token has many earlier
    occurrences (like newlines and indentation in code) and long matches exist. ``repeats`` proposals
    are timed, each on a context one token longer (a decoding step appends at least one token).

    Returns:
        dict with ``context_length``, ``median_ms``, ``p90_ms``, ``device``, ``num_draft_tokens``.
    """
    if sequence is None:
        sequence = synthetic_context(context_length + repeats, vocab_size, seed)
    sequence = sequence.to(device).long()
    generator = MaxGramCandidateGenerator(torch.arange(vocab_size, device=device).roll(-1), num_draft_tokens)
    start_length = max(2, sequence.numel() - repeats)
    times = []
    for i in range(repeats + 5):
        ids = sequence[None, : min(start_length + max(i - 5, 0), sequence.numel())]
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        generator.propose(ids)
        if device != "cpu":
            torch.cuda.synchronize()
        if i >= 5:  # warm-up
            times.append(1000 * (time.perf_counter() - t0))
    times.sort()
    return {
        "context_length": start_length,
        "median_ms": statistics.median(times),
        "p90_ms": times[int(0.9 * (len(times) - 1))],
        "device": device,
        "num_draft_tokens": num_draft_tokens,
    }


def synthetic_context(length: int, vocab_size: int = 32000, seed: int = 0) -> torch.LongTensor:
    """Zipf-distributed tokens where every 64-token block has a 50 % chance to copy an earlier span."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
    tokens = torch.multinomial(1.0 / ranks, length, replacement=True, generator=gen)
    for start in range(256, length - 64, 64):
        if torch.rand(1, generator=gen).item() < 0.5:
            src = int(torch.randint(0, start - 64, (1,), generator=gen))
            tokens[start : start + 64] = tokens[src : src + 64].clone()
    return tokens


if __name__ == "__main__":
    print(json.dumps(benchmark_max_gram(), indent=1))
