"""The ``hf-specdraft`` command line (also ``python -m hf_specdraft``): one table of commands, each with its parser and
what it runs.

    hf-specdraft demo [--target PATH_OR_HUB_ID --draft PATH_OR_HUB_ID]   # one method per idea vs target-only
    hf-specdraft bench --profile cpu --output benchmarks/results/cpu-completion.json
    hf-specdraft train-glide --target DIR (--data FILES | --dataset FILE_OR_HUB_ID [--regenerate]) --output-dir DIR
    hf-specdraft export GLIDE_DIR OUTPUT_DIR [--target DIR]              # a GLIDE as vLLM serves it (docs/serving.md)

The parsers use the standard library only and each command imports torch when it runs, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

DTYPES = {"auto": None, "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # --dtype name -> torch's


def load_bundle(target: str | None, draft: str | None, dtype: str = "auto", draft_dtype: str = "auto"):
    """The embedded default (or a ``recipes.training`` directory), or user checkpoints (local paths or Hub ids);
    dtypes by ``--dtype`` name, auto: the loader's default (for ``draft_dtype``: the embedded drafters' own, the
    target's for a ``--draft``)."""
    import torch

    from .defaults import DefaultBundle, load_default

    dtype, draft_dtype = (DTYPES[name] and getattr(torch, DTYPES[name]) for name in (dtype, draft_dtype))
    if target is None or (Path(target) / "target" / "config.json").is_file():
        bundle = load_default(target, dtype=dtype, draft_dtype=draft_dtype)
    else:
        from transformers import AutoTokenizer

        model = _load_causal_lm(target, "--target", dtype=dtype)
        bundle = DefaultBundle(model, None, AutoTokenizer.from_pretrained(target), Path(target))
    if draft is not None:
        bundle.draft = _load_causal_lm(draft, "--draft", bundle.target, draft_dtype)
    return bundle


def check_checkpoint(name: str, argument: str) -> None:
    """Fail at once, naming ``argument``, unless ``name`` is a directory here or a Hub id that can be had: offline or
    without network a Hub id must be in the local cache (transformers would retry for tens of seconds first)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise ValueError(f"{argument} {name!r} is a file; pass a checkpoint directory (with config.json) or a Hub id")
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        raise ValueError(f"{argument} {name!r}: no such directory")
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # downloaded before: loads offline
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    if constants.HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE is set: pass a local checkpoint directory, or unset HF_HUB_OFFLINE to download it"
    else:
        try:
            socket.getaddrinfo(host, 443)  # a name lookup only: no request is sent to the Hub
            return
        except OSError:
            why = f"the Hub ({host}) cannot be reached from this machine: pass a local checkpoint directory"
    raise ValueError(f"{argument} {name!r} is neither a directory here nor in the local Hub cache, and {why}")


def _load_causal_lm(name: str, argument: str, like=None, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    check_checkpoint(name, argument)
    cuda = torch.cuda.is_available()
    # auto, as for the embedded default: fp32 on CPU (exact greedy comparisons), bf16 on CUDA; a draft: the target's
    dtype = dtype or (like.dtype if like is not None else (torch.bfloat16 if cuda else torch.float32))
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(
            f"{argument} {name!r} is not a causal LM checkpoint that AutoModelForCausalLM can load: {err}"
        ) from err
    return model.to(like.device if like is not None else ("cuda" if cuda else "cpu")).eval()


# One method per idea (the default calls, *-auto), so the demo stays under two minutes on 2 CPU cores.
DEMO_METHODS = {
    "completion": (
        "target-only",
        "target-only+linears",
        "draft-model-auto",
        "glide+copy-auto",
        "glide+copy+cape-auto",
        "max-gram-auto",
    ),
    "context": ("target-only", "casd-strict-auto"),  # CASD drafts from the request's own context: its own task
}
# On CUDA the baseline users have is transformers' own static cache, compiled: the default calls run eager and on the
# loop's static cache (compiled there; the first call's compile is in the JSON's timing.warmup_seconds)
DEMO_METHODS_CUDA = {
    "completion": (
        "target-only",
        "target-only-static",
        "glide+copy-auto",
        "glide+copy-auto-static",
        "glide+copy+cape-auto-static",
        "max-gram-auto-static",
    ),
    "context": ("target-only", "target-only-static", "casd-strict-auto", "casd-strict-auto-static"),
}


def cmd_demo(args) -> int:
    from .bench import BenchConfig, format_table, run_bench
    from .bench.harness import runnable
    from .bench.timing import warning_text

    bundle = load_bundle(args.target, args.draft)
    sizes = {"num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats}
    results = {}
    for task, names in (DEMO_METHODS_CUDA if bundle.target.device.type == "cuda" else DEMO_METHODS).items():
        config = BenchConfig(methods=runnable(names, bundle, task), task=task, warmup=1, **sizes)
        output = Path(args.output) / f"demo-{task}.json" if args.output else None
        results[task] = run_bench(bundle, config, output=output, warn=False)
    unreliable = [warning_text(result["timing"]) for result in results.values() if not result["timing"]["reliable"]]
    if unreliable:  # once, above every table
        print("\n" + unreliable[0])
    for task, result in results.items():
        meta = result["meta"]
        print(
            f"\n[{task}] {meta['hardware']}, {meta['dtype']}, target {meta['target_parameters'] / 1e6:.1f}M "
            f"parameters, {args.num_prompts} held-out prompts x {args.max_new_tokens} new tokens (greedy)\n"
        )
        print(format_table(result["summary"], {**result["timing"], "reliable": True}))  # its warning: once, above
        print(sample_text(result, bundle.tokenizer))
    descriptions = {m: text for result in results.values() for m, text in result["meta"]["descriptions"].items()}
    print("\n" + legend(descriptions))
    return 0


DEMO_COLUMNS = {
    "speedup": "wall time of target-only / wall time of the method, same prompts, same run (median of the repeats per "
    "prompt); below 1 the method is slower: a slowdown",
    "per-prompt range": "the lowest and highest of those ratios over the prompts",
    "vs +linears": "the same against target-only+linears: plain greedy generate with the few-row linears in the "
    "orientation this CPU runs fastest, as the speculative loop uses them",
    "MAL": "mean accepted length: tokens per target forward of the speculative loop",
    "α": "the paper's acceptance rate, 1 - TV(p, q) per judged draft position (drafters with a distribution q)",
    "acc/pos": "accepted / judged draft positions",
    "tok/call": "tokens per target forward",
    "=target": "output identical to target-only greedy (CASD's conditional rules may differ by design)",
    "edit sim": "similarity to the held-out reference (1 = the same text)",
}


def legend(descriptions: dict[str, str], width: int = 100) -> str:
    """The columns and the methods (``descriptions`` by name), one per line, names padded to the longest and
    descriptions wrapped beneath it."""
    import textwrap

    def block(title: str, entries) -> list[str]:
        pad = max(len(name) for name, _ in entries) + 2
        return [title] + [
            textwrap.fill(text, width, initial_indent=f"  {name:<{pad}}", subsequent_indent=" " * (pad + 2))
            or f"  {name:<{pad}}"
            for name, text in entries
        ]

    return "\n".join(block("columns:", DEMO_COLUMNS.items()) + block("methods:", descriptions.items()))


def sample_text(result: dict, tokenizer, width: int = 240) -> str:
    """The first prompt's continuation by target-only and by the fastest other method, side by side in text."""
    first = {r["method"]: r["tokens"] for r in result["records"] if r["prompt"] == 0 and r.get("repeat", 0) == 0}
    others = [m for m in result["summary"] if m != "target-only"]
    if not others:
        return ""
    best = max(others, key=lambda m: result["summary"][m]["speedup_vs_target_only"])

    def show(m: str) -> str:
        return "\n    " + tokenizer.decode(first[m], skip_special_tokens=True)[:width].replace("\n", "\n    ")

    same = "identical" if first[best] == first["target-only"] else "differs"
    return f"\nprompt 1, target-only:{show('target-only')}\nprompt 1, {best} (fastest here; {same}):{show(best)}"


def bench_output_path(output: str | None, profile: str, task: str, overwrite: bool = False) -> Path:
    """``--output``, else ``benchmarks/results/<profile>-<task>.json``, or a new timestamped file beside that one when
    it exists (a committed result) and ``--overwrite`` is not set."""
    if output is not None:
        return Path(output)
    path = Path(f"benchmarks/results/{profile}-{task}.json")
    if path.exists() and not overwrite:
        path = path.with_name(f"{path.stem}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return path


def cmd_bench(args) -> int:
    """``bench``: the task's held-out prompts, or every turn of a ``--prompts`` file (:mod:`.bench.prompts`)."""
    import torch

    from .bench import BenchConfig, format_table, run_bench
    from .bench.harness import runnable
    from .bench.prompts import BASELINES, DEFAULT_PROMPTS, format_category_table, read_prompts, run_prompts_bench

    methods = {"methods": tuple(args.methods.split(","))} if args.methods else {}
    target = args.target
    common = dict(profile=args.profile, max_new_tokens=args.max_new_tokens, repeats=args.repeats, warmup=args.warmup)
    if args.prompts is not None:
        path = DEFAULT_PROMPTS if args.prompts == "default" else Path(args.prompts)
        read_prompts(path)  # a malformed file fails before any model loads
        output = bench_output_path(args.output, args.profile, f"prompts-{path.stem}", args.overwrite)
    else:
        task = {"task": args.task, "num_prompts": args.num_prompts, "context_prompt_chars": args.context_prompt_chars}
        config = BenchConfig(seed=args.seed, **methods, **task, **common)
        output = bench_output_path(args.output, args.profile, args.task, args.overwrite)
    if args.profile.startswith("gpu") and not torch.cuda.is_available():
        raise ValueError(f"--profile {args.profile} needs a CUDA device; use --profile cpu here")
    if args.prompts is None and args.profile == "gpu" and target is None:  # its bigger target, trained by a recipe
        target = args.gpu_default_dir
        if not (Path(target) / "recipe.json").is_file():
            raise ValueError(
                f"--profile gpu runs on the target in --gpu-default-dir {target!r}, which holds no finished "
                "run: train it first from a source checkout (≤ 6 min on one H200), `accelerate launch -m "
                f"recipes.training --recipe gpu --output-dir {target}`, or pass --target"
            )
    bundle = load_bundle(target, args.draft, args.dtype, args.draft_dtype)
    if args.prompts is None:
        result = run_bench(bundle, config, output=output, warn=False)
        print(format_table(result["summary"], result["timing"]))
    else:  # without --methods: the baselines and the demo's, those this bundle can run
        default = runnable(dict.fromkeys([*BASELINES, *DEMO_METHODS["completion"]]), bundle, "chat")
        config = BenchConfig(**{"methods": default, **methods}, task="chat", **common)
        print(format_category_table(run_prompts_bench(bundle, config, path, output=output, warn=False)))
    print(f"\nwrote {output}")
    return 0


def cmd_train_glide(argv: list[str]) -> int:
    from . import write_glide_custom_generate
    from .glide.training import main as train_glide_main

    # GLIDE checkpoints ship CAPE's loop: the glide package imports no other method, so the writer is passed in
    return train_glide_main(argv, custom_generate=write_glide_custom_generate)


# --- the parsers: standard library only ------------------------------------------------------------------------------


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in --help, where it has one (not ``None`` or an unset flag)."""

    def _get_help_string(self, action):
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--target`` and ``--draft``, which ``demo`` and ``bench`` share."""
    parser.add_argument(
        "--target",
        help="a causal LM (local directory or Hub id) or a `python -m recipes.training` directory; the embedded "
        "default (SmolLM2-135M-Instruct) when not given",
    )
    parser.add_argument("--draft", help="a draft causal LM with the target's vocabulary")


def demo_arguments(demo: argparse.ArgumentParser) -> None:
    model_arguments(demo)
    demo.add_argument("--num-prompts", type=int, default=2, help="held-out prompts per task")
    demo.add_argument("--max-new-tokens", type=int, default=40, help="new tokens per prompt")
    demo.add_argument("--repeats", type=int, default=3, help="timed runs per method and prompt; the median counts")
    demo.add_argument("--output", help="a directory for the runs' JSON (demo-<task>.json)")


def bench_arguments(bench: argparse.ArgumentParser) -> None:
    from .bench.methods import METHODS  # --help lists them (importing them imports torch)

    bench.add_argument(
        "--profile",
        default="cpu",
        choices=("cpu", "gpu", "gpu-default"),
        help="prompt counts, lengths and repeats (gpu: the bigger target in --gpu-default-dir; gpu-default: the "
        "embedded default on CUDA)",
    )
    bench.add_argument(
        "--methods",
        help="comma-separated method names (default: target-only,stock-assisted,prompt-lookup,"
        "draft-model-auto; a source checkout's `python -m benchmarks.bench` adds the studies' fixed-γ rows); one "
        "of: " + ", ".join(METHODS),
    )
    bench.add_argument(
        "--task",
        default="completion",
        choices=("completion", "context", "chat"),
        help="completion, context (CASD's rest-of-file task) or chat (requests in the target's chat template)",
    )
    bench.add_argument(
        "--prompts",
        metavar="FILE.jsonl",
        help="run every turn of a Spec-Bench-format file (question_id, category, turns; 'default': the project's own "
        "held-out prompts) and print a per-category table; --task and --num-prompts do not apply",
    )
    bench.add_argument("--num-prompts", type=int, help="held-out prompts (default: the profile's, 20 on cpu)")
    bench.add_argument("--max-new-tokens", type=int, help="new tokens per prompt (default: the profile's, 64 on cpu)")
    bench.add_argument("--repeats", type=int, help="timed runs per method and prompt, median kept (default: 3)")
    bench.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed warm-up prompts (the longest), each run by every method at --max-new-tokens before timing",
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--context-prompt-chars",
        type=int,
        help="context task: characters of the file before the cut in the prompt (default 3000 for --profile cpu, "
        "1400 for gpu; the whole file before the cut: e.g. 1000000)",
    )
    model_arguments(bench)
    bench.add_argument(
        "--output",
        help="JSON path (default benchmarks/results/<profile>-<task>.json, or a new timestamped file beside it when "
        "that exists and --overwrite is not given)",
    )
    bench.add_argument("--overwrite", action="store_true", help="replace the default --output file")
    bench.add_argument("--dtype", default="auto", choices=DTYPES, help="the target's; auto: fp32 on CPU, bf16 on CUDA")
    bench.add_argument(
        "--draft-dtype",
        default="auto",
        choices=DTYPES,
        help="the drafters'; auto: bf16 for the embedded default's (the weights they ship in), the target's for "
        "--draft and recipes.training drafters",
    )
    bench.add_argument(
        "--gpu-default-dir",
        default="runs/gpu-default",
        help="where --profile gpu finds its target (`accelerate launch -m recipes.training --recipe gpu`)",
    )


def export_arguments(export: argparse.ArgumentParser) -> None:
    export.add_argument(
        "glide",
        help="a GLIDE checkpoint directory (built with state_input=True, self_attention=False), or 'default' for "
        "SmolLM2's shipped GLIDE in that layout (checkpoint_smollm2/glide_assistant)",
    )
    export.add_argument("output_dir", help="where the Gemma 4 assistant checkpoint goes")
    export.add_argument(
        "--target",
        help="the target's checkpoint directory: its config is written beside the export with the layer_types vLLM "
        "needs (target_config.json); the embedded SmolLM2 for 'default'",
    )


def cmd_export(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoConfig

    from .glide import GlideForCausalLM
    from .glide.export import export_glide

    glide_dir, target_dir = args.glide, args.target
    if glide_dir == "default":
        from .defaults import SMOLLM2_DRAFTERS_DIR
        from .defaults.smollm2 import converted_dir

        glide_dir = str(SMOLLM2_DRAFTERS_DIR / "glide_assistant")
        target_dir = target_dir or str(converted_dir())
    for flag, directory in (("GLIDE", glide_dir), ("--target", target_dir)):
        if directory is not None and not (Path(directory) / "config.json").is_file():
            raise ValueError(f"{flag}: {directory!r} is not a checkpoint directory (no config.json)")
    glide = GlideForCausalLM.from_pretrained(glide_dir, dtype=torch.float32)
    target_config = AutoConfig.from_pretrained(target_dir) if target_dir is not None else None
    print(f"wrote {export_glide(glide, args.output_dir, target_config)} (serve: docs/serving.md)")
    return 0


@dataclass(frozen=True)
class Command:
    """One subcommand: its line in ``--help``, what it runs (``run(args)`` -> exit status), and what fills its parser;
    a command without ``arguments`` parses its own: ``run(argv)`` gets the words after its name."""

    help: str
    run: Callable
    arguments: Callable[[argparse.ArgumentParser], None] | None = None


COMMANDS = {
    "demo": Command("compare one method per idea with target-only decoding (or --target)", cmd_demo, demo_arguments),
    "bench": Command("benchmark methods side by side; writes JSON", cmd_bench, bench_arguments),
    "train-glide": Command("train a GLIDE drafter for your target; see `train-glide --help`", cmd_train_glide),
    "export": Command("write a trained GLIDE in Gemma 4's assistant layout, for vLLM", cmd_export, export_arguments),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of ``command`` alone (standard library only, but for ``bench``'s)."""
    parser = argparse.ArgumentParser(prog="hf-specdraft", description="Speculative decoding for 🤗 Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, spec in COMMANDS.items():
        # a command without arguments is listed in --help here; main() hands its words to its own parser
        child = sub.add_parser(name, help=spec.help, add_help=spec.arguments is not None, formatter_class=_DefaultsHelp)
        if name == command and spec.arguments is not None:
            spec.arguments(child)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse and run a command; a `ValueError` becomes one line on stderr and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    command = COMMANDS.get(argv[0]) if argv else None
    if command is not None and command.arguments is None:
        return command.run(argv[1:])
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except ValueError as err:
        print(f"hf-specdraft {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
