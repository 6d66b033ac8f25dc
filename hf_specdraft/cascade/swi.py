"""Standardized walltime improvement (SWI) for cascades (Chen et al. 2024, §5.1).

``SWI = n / (count(M_t) + Σ_i count(M_di) c_i)``: ``n`` generated tokens, ``count`` each model's runs (the target's:
the verification steps), ``c_i`` one run of drafter ``i`` relative to the target's: the ratio of parameter counts (the
paper's heuristic, :func:`parameter_cost_coefficients`; Max-Gram 0) or timed (:func:`measure_cost_coefficients`).

    >>> cascade_swi(new_tokens=100, target_calls=30, drafter_calls={"draft0": 40, "max_gram": 90},
    ...             cost_coefficients={"draft0": 0.05, "max_gram": 0.0})
    3.125
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from ..core.support import with_cache
from ..core.stats import SpeculativeStats, standardized_walltime_improvement
from .max_gram import MaxGramCandidateGenerator


def _named(drafts: Sequence[PreTrainedModel] | Mapping[str, PreTrainedModel]) -> dict[str, PreTrainedModel]:
    """``[d0, d1]`` -> ``{"draft0": d0, "draft1": d1}`` (the names the cascade counts under)."""
    if isinstance(drafts, Mapping):
        return dict(drafts)
    return {f"draft{i}": d for i, d in enumerate(drafts)}


def parameter_cost_coefficients(
    target: PreTrainedModel, drafts: Sequence[PreTrainedModel] | Mapping[str, PreTrainedModel]
) -> dict[str, float]:
    """The paper's heuristic ``c_i = params(M_di) / params(M_t)`` (§5.1), plus ``"max_gram": 0.0``; ``drafts``: a list
    (named ``draft0``, ``draft1``, … as the cascade counts them) or a name -> model map."""

    def count(model: torch.nn.Module) -> int:
        return sum(p.numel() for p in model.parameters())  # tied weights once: parameters() deduplicates

    coefficients = {name: count(d) / count(target) for name, d in _named(drafts).items()}
    return coefficients | {"max_gram": coefficients.get("max_gram", 0.0)}


@torch.no_grad()
def _forward_seconds(model: PreTrainedModel, context: torch.Tensor, num_tokens: int, repeats: int) -> float:
    """Median seconds of one forward of ``num_tokens`` new tokens on a cache holding ``context``."""
    context = context.to(model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats + 2):
        kwargs = {**with_cache(model, DynamicCache(config=model.config)), "use_cache": True}
        model(input_ids=context[None, :-num_tokens], **kwargs)
        sync()
        start = time.perf_counter()
        model(input_ids=context[None, -num_tokens:], **kwargs, logits_to_keep=num_tokens)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])  # after 2 warm-up runs


def measure_cost_coefficients(
    target: PreTrainedModel,
    drafts: Sequence[PreTrainedModel] | Mapping[str, PreTrainedModel],
    context_length: int = 256,
    num_tokens: int = 8,
    repeats: int = 10,
    max_gram: MaxGramCandidateGenerator | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Measured ``c_i``, ``{"draft0": c_0, …, "max_gram": c_mag}``: one forward of each draft over one of the target on
    this machine, each of ``num_tokens`` new tokens on a ``context_length``-token cache (a review or verification
    step's shape); ``"max_gram"``: one Max-Gram proposal (``max_gram``, or a default one) on the same context."""
    if num_tokens < 1 or context_length <= num_tokens:
        raise ValueError(
            f"need 1 <= num_tokens < context_length, got num_tokens={num_tokens}, context_length={context_length}"
        )
    vocab = int(target.config.get_text_config().vocab_size)
    context = torch.randint(0, vocab, (context_length,), generator=torch.Generator().manual_seed(seed))
    target_seconds = _forward_seconds(target, context, num_tokens, repeats)
    coefficients = {
        name: _forward_seconds(d, context, num_tokens, repeats) / target_seconds for name, d in _named(drafts).items()
    }
    max_gram = max_gram or MaxGramCandidateGenerator()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        max_gram.draft(context.to(target.device))
        times.append(time.perf_counter() - start)
    coefficients["max_gram"] = statistics.median(times) / target_seconds
    return coefficients


def cascade_swi(
    new_tokens: int, target_calls: int, drafter_calls: Mapping[str, int], cost_coefficients: Mapping[str, float]
) -> float:
    """SWI (§5.1) from call counts. Drafter names without a coefficient raise ``ValueError``."""
    return standardized_walltime_improvement(new_tokens, target_calls, dict(drafter_calls), dict(cost_coefficients))


def swi_from_stats(stats: SpeculativeStats, cost_coefficients: Mapping[str, float]) -> float:
    """SWI of one ``speculative_generate`` run: its tokens, its verification steps, its drafter calls."""
    return cascade_swi(stats.new_tokens, stats.num_steps, stats.drafter_calls, cost_coefficients)


def swi_report(
    stats: SpeculativeStats,
    target: PreTrainedModel,
    drafts: Sequence[PreTrainedModel],
    measured: Mapping[str, float] | None = None,
) -> dict:
    """SWI under the parameter-count heuristic and, when given, measured coefficients, with the counts."""
    report = {
        "new_tokens": stats.new_tokens,
        "target_calls": stats.num_steps,
        "drafter_calls": dict(stats.drafter_calls),
        "cost_coefficients_params": parameter_cost_coefficients(target, drafts),
    }
    report["swi_params"] = swi_from_stats(stats, report["cost_coefficients_params"])
    if measured is not None:
        report["cost_coefficients_measured"] = dict(measured)
        report["swi_measured"] = swi_from_stats(stats, measured)
    return report
