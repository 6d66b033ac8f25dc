"""One harness for every method: same prompts, one run, methods interleaved per prompt, JSON out.

    hf-specdraft bench --methods target-only,draft-model-auto --num-prompts 5 --output bench.json

Wall time is only reported as a ratio against target-only decoding measured in the same run on the same prompts
(repeats, medians and the machine's load: :mod:`hf_specdraft.bench.timing`).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..defaults import DefaultBundle
from ..defaults.tasks import PROMPT_CHARS, TaskItem, build_tasks, chat_prompt, copyable_fraction, edit_similarity
from ..core.validation import check_int
from ..core.projection import calibrated_choices
from .methods import METHODS, BenchContext
from .timing import compile_counters, compiled, compiled_between, cpu_reading, other_cores
from .timing import relative_range, spread, verdict, warning_text

PROFILES = {
    # context_prompt_chars: cpu ≈ 800 tokens (more makes every prefill seconds longer on 2 cores), gpu ≈ 380 tokens
    # (inside the 512-token windows of the target the gpu profile trains); repeats 3: one outlier cannot move the median
    "cpu": {"num_prompts": 20, "max_new_tokens": 64, "context_prompt_chars": 3000, "repeats": 3},
    "gpu": {"num_prompts": 100, "max_new_tokens": 128, "context_prompt_chars": 2 * PROMPT_CHARS, "repeats": 3},
    # the embedded default on CUDA, bf16: one task (eager rows at ~35 tok/s included) fits in about 10 minutes
    "gpu-default": {"num_prompts": 8, "max_new_tokens": 128, "context_prompt_chars": 3000, "repeats": 2},
}
# ``(summary, records, models by name) -> None`` callables that add fields to a run's summary (the lab's SWI)
SUMMARY_FIELDS: list = []


@dataclass
class BenchConfig:
    profile: str = "cpu"
    methods: tuple[str, ...] = ("target-only", "stock-assisted", "prompt-lookup", "draft-model-auto")
    task: str = "completion"
    num_prompts: int | None = None
    max_new_tokens: int | None = None
    seed: int = 0
    warmup: int = 1  # untimed runs on the longest prompts (:func:`warm_up`)
    context_prompt_chars: int | None = None  # context task: file characters before the cut in the prompt
    repeats: int | None = None  # timed runs per method and prompt, median kept
    # (None: the profile's, for these four; 0 is refused)

    def __post_init__(self):
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; choose one of {sorted(PROFILES)}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; registered: {sorted(METHODS)}")
        if "target-only" not in self.methods:
            self.methods = ("target-only", *self.methods)  # every ratio needs the baseline from the same run
        for name in ("num_prompts", "max_new_tokens", "repeats", "context_prompt_chars"):
            if getattr(self, name) is None:
                setattr(self, name, PROFILES[self.profile][name])
            check_int(name, getattr(self, name))
        check_int("warmup", self.warmup, 0, what="prompts whose runs are not timed")


def environment(bundle: DefaultBundle) -> dict:
    """What a result was measured on: hardware, dtypes, batch size, versions, parameter counts."""
    import accelerate
    import transformers

    device = bundle.target.device
    hardware = f"CPU: {cpu_model()}, {torch.get_num_threads()} threads"
    models = {"draft": bundle.draft, **bundle.extras}.items()
    versions = {module.__name__: module.__version__ for module in (torch, transformers, accelerate)}
    return {
        "hardware": torch.cuda.get_device_name(device) if device.type == "cuda" else hardware,
        "device": str(device),
        "dtype": str(bundle.target.dtype).removeprefix("torch."),
        "draft_dtypes": {n: str(m.dtype).removeprefix("torch.") for n, m in models if isinstance(m, torch.nn.Module)},
        "batch_size": 1,
        "versions": {"python": platform.python_version(), **versions},
        "target": bundle.info.get("target_description") or str(bundle.path / "target"),
        "target_parameters": sum(p.numel() for p in bundle.target.parameters()),
        # which orientation each few-row linear took on this CPU (core.projection calibrates it per machine)
        "few_token_linears": calibrated_choices(),
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :mod:`platform`): two VMs of one cloud can differ by 1.5x."""
    try:
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else (platform.processor() or platform.machine())


class _BenchRun:
    """One run's state: the timed ``records``, the warm-up's ``timing`` fields, a forward hook counting target forwards
    (``count``: every method reports tokens per target call) and, as a context, what other processes took of the CPU
    meanwhile (``load``)."""

    def __init__(self, model):
        self.count, self.model, self.records, self.warmup = 0, model, [], {}

    def __enter__(self) -> _BenchRun:
        self.handle = self.model.register_forward_hook(lambda *args: setattr(self, "count", self.count + 1))
        self.start = cpu_reading()
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()
        self.load = other_cores(self.start, cpu_reading())


def run_one(method: str, ctx: BenchContext, counter: _BenchRun) -> dict:
    """One timed call of ``method``: seconds, tokens, target forwards, statistics, and what torch compiled meanwhile
    (``compiles``: :func:`~hf_specdraft.bench.timing.compiled_between`, read outside the clock)."""
    counter.count = 0
    before = compile_counters()
    sync = torch.cuda.synchronize if ctx.target.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    sequences, stats = METHODS[method].run(ctx)
    sync()
    seconds = time.perf_counter() - start
    compiles = compiled_between(before, compile_counters())
    new = sequences[0, ctx.prompt_ids.shape[1] :]
    text = ctx.tokenizer.decode(new, skip_special_tokens=True)
    record = {
        "method": method,
        "seconds": seconds,
        "new_tokens": int(new.numel()),
        "target_calls": counter.count,
        "drafted_tokens": getattr(stats, "drafted_tokens", None),
        "compiles": compiles,
        "edit_similarity": edit_similarity(text[: len(ctx.item.reference)], ctx.item.reference),
        "tokens": new.tolist(),
    }
    if stats is not None:
        record["stats"] = stats.summary()
        # whether the γ controller started from an earlier call's state (None: no controller)
        record["controller_resumed"] = getattr(stats, "extra", {}).get("controller_resumed")
    return record


def _total(stats: list[dict], key: str) -> float:
    return sum(s[key] for s in stats)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _weighted(stats: list[dict], key: str, weight: str) -> float | None:
    """The mean of ``key`` over the calls, weighted by ``weight``; calls without ``weight`` (α without q) skipped."""
    weighted = [s for s in stats if s.get(weight)]
    return _ratio(sum(s[key] * s[weight] for s in weighted), _total(weighted, weight))


def _grouped(records: list[dict], key: str, value) -> dict:
    """``{record[key]: [value(record), ...]}`` in the records' order (a record without ``key``: repeat 0)."""
    groups: dict = {}
    for r in records:
        groups.setdefault(r.get(key, 0), []).append(value(r))
    return groups


def _median_seconds(records: list[dict]) -> dict[int, float]:
    """Median wall time per prompt over its timed repeats."""
    return {p: statistics.median(v) for p, v in _grouped(records, "prompt", lambda r: r["seconds"]).items()}


def _speedup(baseline: dict[int, float], medians: dict[int, float]) -> float:
    """The baseline's seconds over the method's, summed over the method's prompts (0 when the method took none)."""
    seconds = sum(medians.values())
    return sum(baseline[p] for p in medians) / seconds if seconds else 0.0


def same_work_prompts(records: list[dict]) -> set[int]:
    """The prompts on which every repeat of a method did the same work (new tokens, target forwards, drafted tokens):
    an adaptive method may draft otherwise in another repeat, and its time then moves for a reason that is not noise."""
    work = _grouped(records, "prompt", lambda r: (r["new_tokens"], r["target_calls"], r.get("drafted_tokens")))
    return {prompt for prompt, done in work.items() if len(set(done)) == 1}


def _repeat_speedups(records: list[dict], base: list[dict], prompts: set[int]) -> list[float]:
    """The speedup from each repeat alone (repeat r of ``prompts`` against target-only's repeat r, timed next to it):
    how far the headline ratio moves between repeats."""

    def seconds(rs) -> dict[int, dict[int, float]]:
        kept = [r for r in rs if r["prompt"] in prompts]
        return {k: dict(v) for k, v in _grouped(kept, "repeat", lambda r: (r["prompt"], r["seconds"])).items()}

    mine, theirs = seconds(records), seconds(base)
    return [
        _speedup(theirs[r], times)
        for r, times in sorted(mine.items())
        if r in theirs and set(times) <= set(theirs[r]) and sum(times.values())
    ]


def summarize(records: list[dict], methods: tuple[str, ...]) -> dict:
    """Per method: speed from the median time per prompt (all repeats), everything else from the first repeat
    (greedy decoding gives the same tokens and statistics on every repeat)."""
    timed = {m: [r for r in records if r["method"] == m] for m in methods}
    base = [r for r in timed["target-only"] if r.get("repeat", 0) == 0]
    # the baselines every method's time is set against, where they ran: target-only and its +linears, -static, …
    baselines = {
        b.replace("-", "_").replace("+", "_"): _median_seconds(timed[b]) for b in timed if b.startswith("target-only")
    }
    summary = {}
    for m, all_runs in timed.items():
        rs = [r for r in all_runs if r.get("repeat", 0) == 0]
        medians = _median_seconds(all_runs)
        seconds, new = sum(medians.values()), sum(r["new_tokens"] for r in rs)
        stats = [r["stats"] for r in rs if "stats" in r]
        steps = _total(stats, "steps")
        same_prompts = same_work_prompts(all_runs)
        same_work = _repeat_speedups(all_runs, timed["target-only"], same_prompts)
        accepted = _total(stats, "accepted_tokens")
        known = [r["controller_resumed"] for r in all_runs if r.get("controller_resumed") is not None]
        expansion = [s["extra"]["expansion_seconds"] for s in stats if "expansion_seconds" in s.get("extra", {})]
        # what the timed runs compiled, and how many did: such a run timed the compiler (the row is invalid)
        moved = [r.get("compiles") or {} for r in all_runs]
        compiling = sum(map(compiled, moved))
        summary[m] = {
            "prompts": len(rs),
            "repeats": len(all_runs) // max(len(rs), 1),
            "new_tokens": new,
            "tokens_per_second": new / seconds if seconds else 0.0,
            **{f"speedup_vs_{name}": _speedup(other, medians) for name, other in baselines.items()},
            "speedup_spread": spread([baselines["target_only"][p] / medians[p] for p in medians]) if medians else None,
            "prompts_with_varying_work": len(rs) - len(same_prompts),
            # how far the speedup moved between repeats over the prompts where the method repeated its work exactly:
            # what timing noise alone moved (None: no prompt repeated its work)
            "timing_noise": relative_range(same_work) if same_work else None,
            # the share of timed runs whose γ controller started from an earlier call's state (None: no controller)
            "controller_resumed": sum(map(bool, known)) / len(known) if known else None,
            "compiled_while_timed": dict(sum(map(Counter, moved), Counter())),
            "timed_runs_compiled": compiling,
            "valid": not compiling,
            "tokens_per_target_call": new / max(sum(r["target_calls"] for r in rs), 1),
            "mean_accepted_length": _ratio(_total(stats, "new_tokens"), steps),
            # the paper's α over every judged position of the method's calls (None without q)
            "alpha": _weighted(stats, "alpha", "alpha_positions"),
            "position_acceptance_rate": _ratio(accepted, sum(s.get("judged_tokens", 0) for s in stats)),
            "accepted_per_drafted": _ratio(accepted, _total(stats, "drafted_tokens")),
            "verification_tokens_per_step": _weighted(stats, "verification_tokens_per_step", "steps"),
            "draft_ms_per_step": _ratio(1000 * _total(stats, "draft_seconds"), steps),
            # CAPE's expansion time per step (part of the draft time), for methods that record it
            "expansion_ms_per_step": _ratio(1000 * sum(expansion), steps) if expansion else None,
            "equals_target_only": sum(r["tokens"] == b["tokens"] for r, b in zip(rs, base)) / len(rs),
            "edit_similarity": sum(r["edit_similarity"] for r in rs) / len(rs),
        }
    return summary


def context_statistics(items: list[TaskItem], tokenizer, n: int = 4) -> dict:
    """What a context-lookup drafter has to work with on the ``context`` task, averaged over ``items``: prompt and
    context lengths in tokens, and the share of reference tokens in an ``n``-gram of the context vs of the prompt."""
    rows = []
    for item in items:
        reference, context, prompt = (
            tokenizer(text, add_special_tokens=False).input_ids for text in (item.reference, item.context, item.prompt)
        )
        rows.append([len(prompt), len(context), *(copyable_fraction(reference, s, n) for s in (context, prompt))])
    names = ("prompt_tokens", "context_tokens", "reference_copyable_from_context", "reference_copyable_from_prompt")
    return {"ngram": n, **{name: round(sum(column) / len(rows), 4) for name, column in zip(names, zip(*rows))}}


def chat_ids(tokenizer, chat: str | list[dict]) -> torch.Tensor:
    """`(1, L)` ids of ``chat`` (one user turn, or chat messages) in the chat template, ready for the answer."""
    return tokenizer(chat_prompt(tokenizer, chat), return_tensors="pt", add_special_tokens=False).input_ids


def prompt_ids(tokenizer, item: TaskItem) -> torch.Tensor:
    """`(1, L)` prompt ids of ``item``: a ``chat`` request goes through the target's chat template."""
    if item.task == "chat":
        return chat_ids(tokenizer, item.prompt)
    return tokenizer(item.prompt, return_tensors="pt").input_ids


def bench_context(bundle: DefaultBundle, item: TaskItem, ids: torch.Tensor, config: BenchConfig) -> BenchContext:
    """One prompt's :class:`BenchContext`: ``ids`` `(1, L)` moved to the target's device."""
    ids = ids.to(bundle.target.device)
    return BenchContext(bundle.target, bundle.draft, bundle.tokenizer, item, ids, config.max_new_tokens, bundle.extras)


def run_noise(summary: dict) -> float | None:
    """Median over the methods beside target-only of their ``timing_noise``; None when no method repeated its work."""
    noise = [s["timing_noise"] for m, s in summary.items() if m != "target-only" and s.get("timing_noise") is not None]
    return statistics.median(noise) if noise else None


def runnable(names, bundle: DefaultBundle, task: str) -> tuple[str, ...]:
    """Those of the method ``names`` that run on ``task`` with the drafters ``bundle`` holds (:func:`check_methods`)."""
    has_draft = bundle.draft is not None
    return tuple(m for m in names if task in METHODS[m].tasks and METHODS[m].available(bundle.extras, has_draft))


def check_methods(bundle: DefaultBundle, methods: tuple[str, ...], task: str) -> None:
    """Raise `ValueError` for a method that does not run on ``task`` or needs a drafter ``bundle`` does not hold."""
    for m in methods:
        if task not in METHODS[m].tasks:
            raise ValueError(f"method {m!r} runs on tasks {METHODS[m].tasks}, not {task!r}")
        if not METHODS[m].available(bundle.extras, bundle.draft is not None):
            raise ValueError(f"method {m!r} needs {METHODS[m].requires}, which this run does not have")


def warm_up(contexts: list[BenchContext], config: BenchConfig, counter: _BenchRun) -> dict:
    """Run every method, untimed, on the ``config.warmup`` longest prompts at the timed length: static caches are
    sized (and buckets compiled) for the longest call and the γ controller has learned this machine's costs, so the
    repeats time the steady state. Returns the warm-up's ``timing`` fields: prompts, seconds and compiles per method."""
    order = sorted(range(len(contexts)), key=lambda i: contexts[i].prompt_ids.shape[1], reverse=True)[: config.warmup]
    seconds: Counter = Counter()
    compiles: dict[str, Counter] = {}
    for index in tqdm(order, desc="warm-up (untimed)", disable=not order):
        for m in config.methods:  # the first call pays compiles (static / compiled methods): its time is kept
            record = run_one(m, contexts[index], counter)
            seconds[m] += record["seconds"]
            compiles.setdefault(m, Counter()).update(record["compiles"])
    return {
        "warmup_prompts": len(order),
        "warmup_prompt_tokens": [int(contexts[i].prompt_ids.shape[1]) for i in order],
        "warmup_max_new_tokens": config.max_new_tokens,
        "warmup_seconds": seconds,
        "warmup_compiles": compiles,
    }


# what a later repeat's record keeps (greedy: its tokens and statistics repeat the first's)
REPEAT_FIELDS = ("method", "seconds", "new_tokens", "target_calls", "drafted_tokens", "compiles", "controller_resumed")


def time_prompt(ctx: BenchContext, index: int, config: BenchConfig, run: _BenchRun, bar, label: str = "") -> dict:
    """Every method ``config.repeats`` times on prompt ``index``, in an order rotated per prompt and repeat (no method
    always runs first or right after another), appended to ``run.records``. Returns each method's first record."""
    first: dict[str, dict] = {}
    for repeat in range(config.repeats):
        bar.set_postfix_str(f"{label}repeat {repeat + 1}/{config.repeats}")
        shift = (index + repeat) % len(config.methods)
        for m in config.methods[shift:] + config.methods[:shift]:
            record = run_one(m, ctx, run)
            if repeat == 0:
                first[m] = record
            else:
                record = {k: record[k] for k in REPEAT_FIELDS if k in record}
            run.records.append({"prompt": index, "repeat": repeat, **record})
    return first


def run_command() -> str | None:
    """The command line that started this process: ``hf-specdraft ...``, ``python -m module ...`` (the lab's
    ``python -m benchmarks.bench``), or ``None`` for a call from Python (a notebook, a test)."""
    if sys.argv[0].endswith("hf-specdraft"):
        return " ".join(["hf-specdraft", *sys.argv[1:]])
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None or not spec.name:
        return None
    module = spec.name.removesuffix(".__main__")
    return " ".join(["hf-specdraft" if module == "hf_specdraft" else f"python -m {module}", *sys.argv[1:]])


def bench_result(bundle: DefaultBundle, config: BenchConfig, run: _BenchRun, meta, body, summary, output, warn) -> dict:
    """A run's JSON: ``meta`` (:func:`environment`, ``meta``, the methods, date and command), ``body``, the timing
    verdict (:func:`~hf_specdraft.bench.timing.verdict` over ``summary``) and the records; written to ``output`` when
    given, with a ``UserWarning`` when ``warn`` and unreliable."""
    # how far target-only's total time over the prompts moved between repeats: what this machine shows at rest
    repeats = _grouped([r for r in run.records if r["method"] == "target-only"], "repeat", lambda r: r["seconds"])
    at_rest = [sum(times) for times in repeats.values()]
    result = {
        "meta": {
            **environment(bundle),
            **meta,
            "max_new_tokens": config.max_new_tokens,
            "methods": list(config.methods),
            "descriptions": {m: METHODS[m].description for m in config.methods},  # what each name ran
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": run_command(),
        },
        **body,
        "timing": {
            "repeats": config.repeats,
            **run.warmup,
            "invalid_methods": [m for m, s in summary.items() if not s["valid"]],
            **verdict(run.load, torch.get_num_threads(), run_noise(summary), relative_range(at_rest)),
        },
        "records": run.records,
    }
    if warn and not result["timing"]["reliable"]:
        warnings.warn(warning_text(result["timing"]), stacklevel=3)
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(result, indent=1) + "\n")
    return result


def run_bench(
    bundle: DefaultBundle,
    config: BenchConfig,
    output: str | Path | None = None,
    items: list[TaskItem] | None = None,
    warn: bool = True,
) -> dict:
    """Run ``config.methods`` on ``config.num_prompts`` items of ``config.task``; return (and write) the result.
    ``warn``: an unreliable run also raises a ``UserWarning`` (the commands print it with the table instead)."""
    check_methods(bundle, config.methods, config.task)
    items = items or build_tasks(
        config.task, count=config.num_prompts, seed=config.seed, context_prompt_chars=config.context_prompt_chars
    )
    contexts = [bench_context(bundle, item, prompt_ids(bundle.tokenizer, item), config) for item in items]
    with _BenchRun(bundle.target) as run:
        run.warmup = warm_up(contexts, config, run)
        bar = tqdm(contexts, desc=f"bench {config.task}")
        for index, ctx in enumerate(bar):
            time_prompt(ctx, index, config, run, bar)
    summary = summarize(run.records, config.methods)
    for add_fields in SUMMARY_FIELDS:
        add_fields(summary, run.records, {**bundle.extras, "draft": bundle.draft, "target": bundle.target})
    meta = {"profile": config.profile, "task": config.task, "num_prompts": len(items), "seed": config.seed}
    body = {"summary": summary}
    if config.task == "context":
        meta["context_prompt_chars"] = config.context_prompt_chars
        body["task_statistics"] = context_statistics(items, bundle.tokenizer)
    return bench_result(bundle, config, run, meta, body, summary, output, warn)


def speed_word(speedup: float) -> str:
    """Say what a wall-time ratio means: below 1 is a slowdown."""
    if speedup >= 1.005:
        return f"{speedup:.2f}x faster"
    if speedup <= 0.995:
        return f"slowdown {1 / speedup:.2f}x" if speedup else "-"
    return "same speed"


def format_table(summary: dict, timing: dict | None = None) -> str:
    """A fixed-width table of the summary (what ``demo`` and ``bench`` print); an unreliable run's warning on top."""
    fast = any("speedup_vs_target_only_linears" in s for s in summary.values())  # the fast baseline ran: its ratio too
    header = (
        f"{'method':<22}{'tok/s':>8}{'speedup':>9}{'per-prompt range':>18}  {'verdict':<17}"
        + (f"{'vs +linears':>12}" if fast else "")
        + f"{'MAL':>6}{'α':>7}{'acc/pos':>8}{'tok/call':>9}{'=target':>8}{'edit sim':>9}"
    )
    rows = [header, "-" * len(header)]

    def cell(value, width: int, spec: str = ".2f") -> str:
        return f"{'-' if value is None else format(value, spec):>{width}}"

    for name, s in summary.items():
        spread = s.get("speedup_spread")
        span = f"{spread['min']:.2f}-{spread['max']:.2f}" if spread else "-"
        verdict = "(baseline)" if name == "target-only" else speed_word(s["speedup_vs_target_only"])
        if not s.get("valid", True):
            verdict = "INVALID: compiled"  # its timed runs compiled: the time is the compiler's
        rows.append(
            f"{name:<22}{cell(s['tokens_per_second'], 8, '.1f')}{cell(s['speedup_vs_target_only'], 8)}x"
            f"{span:>18}  {verdict:<17}"
            + (f"{cell(s.get('speedup_vs_target_only_linears'), 11)}x" if fast else "")
            + f"{cell(s['mean_accepted_length'], 6)}{cell(s['alpha'], 7)}{cell(s['position_acceptance_rate'], 8)}"
            f"{cell(s['tokens_per_target_call'], 9)}"
            f"{'yes' if s['equals_target_only'] == 1 else 'no':>8}{cell(s['edit_similarity'], 9, '.3f')}"
        )
    if timing is not None:
        cores = timing["other_cpu_cores"]
        other = "not measured" if cores is None else f"{cores:.1f} of {timing['cpu_cores']} cores"
        if timing.get("timing_noise") is None:
            noise = "no method repeated its work exactly between repeats; target-only's own time moved by "
            noise += f"{timing.get('baseline_noise', 0.0):.0%}"
        else:
            noise = f"a speedup moved by {timing['timing_noise']:.0%} between repeats (median over methods, where "
            noise += "they repeated their work)"
        rows.append(
            f"timing: median of {timing['repeats']} runs per method and prompt, methods interleaved; other processes "
            f"used {other}; {noise}"
        )
        if not timing["reliable"]:
            rows.insert(0, warning_text(timing))
    invalid = [
        f"{name} compiled in {s['timed_runs_compiled']} of its timed runs "
        f"({', '.join(f'{v} {c}' for c, v in s['compiled_while_timed'].items()) or 'nothing'})"
        for name, s in summary.items()
        if not s.get("valid", True)
    ]
    if invalid:
        reason = "their times include compiling (a bucket or cache size no warm-up run reached)"
        rows.append(f"INVALID: {'; '.join(invalid)}: {reason}")
    return "\n".join(rows)
