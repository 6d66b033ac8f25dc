"""Standardized walltime improvement (SWI) for cascades (Chen et al. 2024, §5.1), and the bench's cost measures.

``SWI = n / (count(M_t) + Σ_i count(M_di) c_i)``: ``n`` generated tokens, ``count`` each model's runs (the target's:
the verification steps), ``c_i`` one run of drafter ``i`` relative to the target's: the ratio of parameter counts (the
paper's heuristic, :func:`parameter_cost_coefficients`; Max-Gram 0) or timed (:func:`measure_cost_coefficients`).

    >>> cascade_swi(new_tokens=100, target_calls=30, drafter_calls={"draft0": 40, "max_gram": 90},
    ...             cost_coefficients={"draft0": 0.05, "max_gram": 0.0})
    3.125

Importing this module adds :func:`summary_fields` to every bench run (``hf_specdraft.bench.harness.SUMMARY_FIELDS``;
:mod:`benchmarks.methods` imports it, so ``python -m benchmarks.bench`` and the studies record these fields).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from hf_specdraft.bench.harness import SUMMARY_FIELDS
from hf_specdraft.cascade.max_gram import MaxGramCandidateGenerator
from hf_specdraft.core.stats import SpeculativeStats, expected_speedup
from hf_specdraft.core.support import with_cache


def _named(drafts: Sequence[PreTrainedModel] | Mapping[str, PreTrainedModel]) -> dict[str, PreTrainedModel]:
    """``[d0, d1]`` -> ``{"draft0": d0, "draft1": d1}`` (the names the cascade counts under)."""
    if isinstance(drafts, Mapping):
        return dict(drafts)
    return {f"draft{i}": d for i, d in enumerate(drafts)}


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights once: parameters() deduplicates


def parameter_cost_coefficients(
    target: PreTrainedModel, drafts: Sequence[PreTrainedModel] | Mapping[str, PreTrainedModel]
) -> dict[str, float]:
    """The paper's heuristic ``c_i = params(M_di) / params(M_t)`` (§5.1), plus ``"max_gram": 0.0``; ``drafts``: a list
    (named ``draft0``, ``draft1``, … as the cascade counts them) or a name -> model map."""
    coefficients = {name: _parameters(d) / _parameters(target) for name, d in _named(drafts).items()}
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
    """SWI (§5.1) from call counts: a speedup over target-only decoding that does not depend on the machine once the
    ``c_i`` are fixed. Drafter names without a coefficient raise ``ValueError``."""
    missing = set(drafter_calls) - set(cost_coefficients)
    if missing:
        raise ValueError(f"cost_coefficients has no entry for drafters {sorted(missing)}")
    cost = target_calls + sum(count * cost_coefficients[name] for name, count in drafter_calls.items())
    return new_tokens / cost if cost else 0.0


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


# --- the bench's fields -----------------------------------------------------------------------------------------------


def _total(stats: list[dict], key: str) -> float:
    return sum(s[key] for s in stats)


def _drafter_parameters(name: str, requires: tuple[str, ...], models: dict) -> int | None:
    """Parameters of the model a method's ``drafter_calls`` name counts: ``draft`` / ``draftN`` the method's first /
    N-th required model, Max-Gram 0 (the paper's); None for a name with no model."""
    if name == "max_gram":
        return 0
    suffix = name.removeprefix("draft")
    index = int(suffix or 0) if suffix != name and (suffix or "0").isdigit() else None
    if index is None or index >= len(requires) or models.get(requires[index]) is None:
        return None
    return _parameters(models[requires[index]])


def swi_fields(stats: list[dict], requires: tuple[str, ...], models: dict) -> dict:
    """``swi_parameters`` (``c_i`` = drafter parameters / target parameters) and ``swi_measured`` (a target run costs
    the run's verify time per step, the drafters their measured draft time) of one method's ``stats`` summaries."""
    steps, new = _total(stats, "steps"), _total(stats, "new_tokens")
    if not steps:
        return {"swi_parameters": None, "swi_measured": None}
    verify_per_step = _total(stats, "verify_seconds") / steps
    measured = new * verify_per_step / (steps * verify_per_step + _total(stats, "draft_seconds"))
    calls = [(name, count) for s in stats for name, count in s["drafter_calls"].items()]
    parameters = [_drafter_parameters(name, requires, models) for name, _ in calls]
    if None in parameters or models.get("target") is None:
        return {"swi_parameters": None, "swi_measured": measured}
    drafter_cost = sum(count * p for (_, count), p in zip(calls, parameters)) / _parameters(models["target"])
    return {"swi_parameters": new / (steps + drafter_cost), "swi_measured": measured}


def expected_speedup_fields(stats: list[dict], row: dict) -> dict:
    """c (one draft forward over one verification forward, measured in the run) and E(speedup) (Du et al. 2024, §5.1)
    from α and from accepted / judged positions, for single-draft chains (else None)."""
    calls = sum(s["drafter_calls"].get("draft", 0) for s in stats)
    steps = _total(stats, "steps")
    fields = {"cost_coefficient": None, "expected_speedup": None, "expected_speedup_position": None}
    if not calls or not steps or any(set(s["drafter_calls"]) - {"draft"} for s in stats):
        return fields
    c = (_total(stats, "draft_seconds") / calls) / (_total(stats, "verify_seconds") / steps)
    fields["cost_coefficient"] = c
    for key, rate in (("expected_speedup", "alpha"), ("expected_speedup_position", "position_acceptance_rate")):
        fields[key] = expected_speedup(row[rate], round(calls / steps), c) if row[rate] is not None else None
    return fields


def summary_fields(summary: dict, records: list[dict], models: dict) -> None:
    """Add SWI, c and E(speedup) to each method's row of a bench ``summary``, from its first repeat's statistics
    (``records``) and ``models`` (``target``, ``draft`` and the run's extras, by name)."""
    from hf_specdraft.bench.methods import METHODS

    for m, row in summary.items():
        stats = [r["stats"] for r in records if r["method"] == m and r.get("repeat", 0) == 0 and "stats" in r]
        requires = METHODS[m].requires if m in METHODS else ()
        row.update(swi_fields(stats, requires, models), **expected_speedup_fields(stats, row))


if summary_fields not in SUMMARY_FIELDS:
    SUMMARY_FIELDS.append(summary_fields)
