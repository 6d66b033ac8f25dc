"""The ``hf-specdraft`` commands (also ``python -m hf_specdraft``): what each runs once parsed.

The parser, and the usage of every command, is :mod:`hf_specdraft_cli` (standard library only, so ``--help`` answers
without importing torch); :func:`run` takes its parsed arguments here.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import hf_specdraft_cli
import torch

DTYPES = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # hf_specdraft_cli.DTYPE_NAMES


def load_bundle(target: str | None, draft: str | None, device: str | None = None, dtype: torch.dtype | None = None,
                draft_dtype: torch.dtype | None = None):
    """The embedded default, or user checkpoints (local paths or Hub ids); ``draft_dtype`` `None`: the loader's
    default for the embedded drafters, the target's dtype for a ``--draft`` checkpoint."""
    from .defaults import DefaultBundle, load_default

    if target is None or (Path(target) / "target" / "config.json").is_file():  # the default, or a train-default directory
        bundle = load_default(target, device=device, dtype=dtype, draft_dtype=draft_dtype)
        if draft is not None:
            bundle.draft = _load_causal_lm(draft, "--draft", bundle.target, draft_dtype)
        return bundle
    from transformers import AutoTokenizer

    model = _load_causal_lm(target, "--target", dtype=dtype)
    draft_model = _load_causal_lm(draft, "--draft", model, draft_dtype) if draft else None
    return DefaultBundle(model, draft_model, AutoTokenizer.from_pretrained(target), Path(target))


def check_checkpoint(name: str, argument: str) -> None:
    """Fail at once, naming ``argument``, unless ``name`` is a directory here or a Hub id that can be had.

    A path (absolute, ``./``, ``~``, or more than one ``/``) must exist. A Hub id must be in the local Hub cache when
    ``HF_HUB_OFFLINE`` is set or the Hub's host does not resolve (no network): transformers would otherwise spend
    tens of seconds on retries before an error that speaks of repo ids.
    """
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{argument} {name!r} is a file; pass a checkpoint directory (with config.json) or a Hub id")
        return
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:
        raise ValueError(f"{argument} {name!r}: no such directory")
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return  # downloaded before: loads offline
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"{argument} {name!r} is neither a directory here nor in the local Hub cache, and HF_HUB_OFFLINE is set: "
                         "pass a local checkpoint directory, or unset HF_HUB_OFFLINE to download it")
    try:
        socket.getaddrinfo(host, 443)  # a name lookup only: no request is sent to the Hub
    except OSError:
        raise ValueError(f"{argument} {name!r} is neither a directory here nor in the local Hub cache, and the Hub ({host}) cannot "
                         "be reached from this machine: pass a local checkpoint directory") from None


def _load_causal_lm(name: str, argument: str, like=None, dtype: torch.dtype | None = None):
    from transformers import AutoModelForCausalLM

    check_checkpoint(name, argument)

    dtype = dtype or (like.dtype if like is not None else torch.float32)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{argument} {name!r} is not a causal LM checkpoint that AutoModelForCausalLM can load: {err}") from err
    return model.to(like.device if like is not None else ("cuda" if torch.cuda.is_available() else "cpu")).eval()


# One method per idea, so the demo stays under two minutes on 2 CPU cores (`hf-specdraft bench` runs any of them).
DEMO_METHODS = {
    "completion": ("target-only", "target-only+linears", "draft-model", "glide-auto", "glide+cape-auto", "max-gram-auto"),  # *-auto: the default calls
    "context": ("target-only", "casd-strict-auto"),  # CASD drafts from the request's own context: its own task
}
# On CUDA the baseline users have is transformers' own static cache, compiled: the default calls run eager and on the
# loop's static cache (compiled automatically there; the first call's compile is in the JSON's timing.warmup_seconds)
DEMO_METHODS_CUDA = {
    "completion": ("target-only", "target-only-static", "glide-auto", "glide-auto-static", "glide+cape-auto-static", "max-gram-auto-static"),
    "context": ("target-only", "target-only-static", "casd-strict-auto", "casd-strict-auto-static"),
}


def cmd_demo(args) -> int:
    from .bench import METHODS, BenchConfig, format_table, run_bench
    from .bench.timing import warning_text

    bundle = load_bundle(args.target, args.draft)
    has_draft = bundle.draft is not None
    results, shown = [], []
    for task, names in (DEMO_METHODS_CUDA if bundle.target.device.type == "cuda" else DEMO_METHODS).items():
        methods = tuple(m for m in names if METHODS[m].available(bundle.extras, has_draft))
        config = BenchConfig(methods=methods, task=task, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, warmup=1,
                             repeats=args.repeats)
        output = Path(args.output) / f"demo-{task}.json" if args.output else None
        results.append((task, config, run_bench(bundle, config, output=output, warn=False)))
        shown += [m for m in methods if m not in shown]
    unreliable = [warning_text(result["timing"]) for _, _, result in results if not result["timing"]["reliable"]]
    if unreliable:  # once, above every table
        print("\n" + unreliable[0])
    for task, config, result in results:
        meta = result["meta"]
        print(f"\n[{task}] {meta['hardware']}, {meta['dtype']}, target {meta['target_parameters'] / 1e6:.1f}M parameters, "
              f"{config.num_prompts} held-out prompts x {config.max_new_tokens} new tokens (greedy)\n")
        timing = {**result["timing"], "reliable": True}  # its warning, if any, is printed once above
        print(format_table(result["summary"], timing))
        print(sample_text(result, bundle.tokenizer))
    print("\n" + legend(shown, {m: METHODS[m].description for m in shown}))
    return 0


DEMO_COLUMNS = (
    ("speedup", "wall time of target-only / wall time of the method, same prompts, same run (median of the repeats per "
                "prompt); below 1 the method is slower: a slowdown"),
    ("per-prompt range", "the lowest and highest of those ratios over the prompts"),
    ("vs +linears", "the same against target-only+linears: plain greedy generate with the few-row linears in the orientation "
                    "this CPU runs fastest, as the speculative loop uses them"),
    ("MAL", "mean accepted length: tokens per target forward of the speculative loop"),
    ("α", "the paper's acceptance rate, 1 - TV(p, q) per judged draft position (drafters with a distribution q)"),
    ("acc/pos", "accepted / judged draft positions"),
    ("tok/call", "tokens per target forward"),
    ("=target", "output identical to target-only greedy (CASD's conditional rules may differ by design)"),
    ("edit sim", "similarity to the held-out reference (1 = the same text)"),
)


def legend(methods: list[str], descriptions: dict[str, str], width: int = 100) -> str:
    """The columns and the methods, one per line, names padded to the longest and descriptions wrapped beneath it."""
    import textwrap

    def block(title: str, entries) -> list[str]:
        pad = max(len(name) for name, _ in entries) + 2
        lines = [title]
        for name, text in entries:
            wrapped = textwrap.wrap(text, width - pad - 2) or [""]
            lines.append(f"  {name:<{pad}}{wrapped[0]}")
            lines += [f"  {'':<{pad}}{more}" for more in wrapped[1:]]
        return lines

    return "\n".join(block("columns:", DEMO_COLUMNS) + block("methods:", [(m, descriptions[m]) for m in methods]))


def sample_text(result: dict, tokenizer, width: int = 240) -> str:
    """The first prompt's continuation by target-only and by the fastest other method, side by side in text."""
    first = {r["method"]: r for r in result["records"] if r["prompt"] == 0 and r.get("repeat", 0) == 0}
    others = [m for m in result["summary"] if m != "target-only"]
    if not others:
        return ""
    best = max(others, key=lambda m: result["summary"][m]["speedup_vs_target_only"])
    show = lambda m: tokenizer.decode(first[m]["tokens"], skip_special_tokens=True)[:width].replace("\n", "\n    ")  # noqa: E731
    same = "identical" if first[best]["tokens"] == first["target-only"]["tokens"] else "differs"
    return f"\nprompt 1, target-only:\n    {show('target-only')}\nprompt 1, {best} (fastest here; {same}):\n    {show(best)}"


def bench_output_path(output: str | None, profile: str, task: str, overwrite: bool = False) -> Path:
    """Where ``bench`` writes: ``--output`` as given, else ``benchmarks/results/<profile>-<task>.json`` unless that file
    exists (a committed result) and ``--overwrite`` is not set; then a new timestamped file next to it."""
    if output is not None:
        return Path(output)
    path = Path(f"benchmarks/results/{profile}-{task}.json")
    if path.exists() and not overwrite:
        path = path.with_name(f"{path.stem}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    return path


def cmd_bench(args) -> int:
    from .bench import BenchConfig, format_table, run_bench

    methods = tuple(args.methods.split(",")) if args.methods else BenchConfig.methods
    config = BenchConfig(profile=args.profile, methods=methods, task=args.task, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, seed=args.seed,
                         context_prompt_chars=args.context_prompt_chars, repeats=args.repeats, warmup=args.warmup)
    if config.profile.startswith("gpu") and not torch.cuda.is_available():
        raise ValueError(f"--profile {config.profile} needs a CUDA device; use --profile cpu here")
    target = args.target
    if config.profile == "gpu" and target is None:  # the gpu profile trains its bigger target inside the run (≤ 6 min on one H200)
        from .defaults.recipe import get_recipe
        from .defaults.training import train_default

        target = args.gpu_default_dir
        if not (Path(target) / "recipe.json").is_file():
            train_default(get_recipe("gpu"), target)
    bundle = load_bundle(target, args.draft, dtype=DTYPES[args.dtype], draft_dtype=DTYPES[args.draft_dtype])
    output = bench_output_path(args.output, config.profile, config.task, args.overwrite)
    result = run_bench(bundle, config, output=output, warn=False)
    print(format_table(result["summary"], result["timing"]))
    print(f"\nwrote {output}")
    return 0


def cmd_train_default(args) -> int:
    from .defaults.recipe import get_recipe
    from .defaults.training import train_default

    log = train_default(get_recipe(args.recipe), args.output_dir, parts=tuple(args.parts.split(",")), resume_target=args.resume_target)
    print(json.dumps(log["evaluation"], indent=1))
    return 0


def cmd_report(args) -> int:
    from .bench.report import write_report

    from .bench.headline import write_headline

    path = write_report(args.output, args.results_dir)
    print(f"wrote {path} (plots in {Path(args.results_dir).parent / 'plots'})")
    demo_dir = Path(args.results_dir).parent / "demo"
    if write_headline(Path(args.output).parent / "README.md", demo_dir):
        print(f"wrote the README's headline table from {demo_dir}")
    return 0


def cmd_train_glide(argv: list[str]) -> int:
    from .glide.training import main as train_glide_main

    return train_glide_main(argv)


def cmd_build_bigram(argv: list[str]) -> int:
    from .defaults.bigram import main_build_bigram

    return main_build_bigram(argv)


PASSTHROUGH = {"train-glide": cmd_train_glide, "build-bigram": cmd_build_bigram}  # commands with their own parsers


COMMANDS = {"demo": cmd_demo, "bench": cmd_bench, "train-default": cmd_train_default, "report": cmd_report}


def build_parser() -> argparse.ArgumentParser:
    """The command's parser (:mod:`hf_specdraft_cli`, standard library only) with the benchmark methods listed."""
    from .bench.methods import METHODS

    return hf_specdraft_cli.build_parser(tuple(METHODS))


def run(args: argparse.Namespace) -> int:
    """Run a parsed command; a `ValueError` becomes one line on stderr and exit status 2."""
    try:
        return COMMANDS[args.command](args)
    except ValueError as err:
        print(f"hf-specdraft {args.command}: error: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    return hf_specdraft_cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
