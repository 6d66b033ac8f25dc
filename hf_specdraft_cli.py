"""The ``hf-specdraft`` command line: its parser, with the standard library only.

``hf-specdraft --help`` answers without importing torch or transformers (seconds on a small CPU); each command imports
the library when it runs (:mod:`hf_specdraft.cli` holds the commands). A module of its own, beside the package: importing
anything inside ``hf_specdraft`` runs the package's ``__init__``, which loads every method.

    hf-specdraft demo                       # the shipped default: one method per idea vs target-only, one table
    hf-specdraft demo --target PATH_OR_HUB_ID --draft PATH_OR_HUB_ID
    hf-specdraft bench --profile cpu --output benchmarks/results/cpu-completion.json
    hf-specdraft train-default --output-dir DIR [--recipe default|gpu|tiny]   # your own small target + drafts
    hf-specdraft report                     # BENCHMARKS.md from benchmarks/results/*.json
    hf-specdraft train-glide --target DIR (--data FILES | --dataset FILE_OR_HUB_ID [--regenerate]) --output-dir DIR   # see --help
    hf-specdraft build-bigram --output FILE [--tokenizer DIR]            # Max-Gram's fallback table
"""

from __future__ import annotations

import argparse
import sys

DTYPE_NAMES = ("auto", "bf16", "fp16", "fp32")  # hf_specdraft.cli.DTYPES maps them to torch dtypes
PASSTHROUGH = ("train-glide", "build-bigram")  # commands with their own parsers, handed their arguments whole


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default in --help, where it has one (not ``None`` or an unset flag)."""

    def _get_help_string(self, action):
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def build_parser(method_names: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """The command's parser. ``method_names``: the benchmark methods ``bench --help`` lists (the caller imports them)."""
    parser = argparse.ArgumentParser(prog="hf-specdraft", description="Speculative decoding for 🤗 Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    shown = _DefaultsHelp
    demo = sub.add_parser("demo", formatter_class=shown,
                          help="compare one method per idea with target-only decoding on the shipped default (or --target)")
    demo.add_argument("--target", help="a causal LM (local directory or Hub id) or a train-default directory; the embedded "
                      "default (SmolLM2-135M-Instruct) when not given")
    demo.add_argument("--draft", help="a draft causal LM with the target's vocabulary")
    demo.add_argument("--num-prompts", type=int, default=2, help="held-out prompts per task")
    demo.add_argument("--max-new-tokens", type=int, default=40, help="new tokens per prompt")
    demo.add_argument("--repeats", type=int, default=3, help="timed runs per method and prompt; the median counts")
    demo.add_argument("--output", help="a directory for the runs' JSON (demo-<task>.json; the README's headline table is "
                      "generated from benchmarks/demo/)")
    bench = sub.add_parser("bench", help="benchmark methods side by side; writes JSON", formatter_class=shown)
    bench.add_argument("--profile", default="cpu", choices=("cpu", "gpu", "gpu-default"),
                       help="prompt counts, lengths and repeats (gpu also trains its target; gpu-default: the embedded default on CUDA)")
    bench.add_argument("--methods", help="comma-separated method names (default: target-only,stock-assisted,prompt-lookup,draft-model)"
                       + ("; one of: " + ", ".join(method_names) if method_names else "; `hf-specdraft bench --help` lists them"))
    bench.add_argument("--task", default="completion", choices=("completion", "context", "chat"),
                       help="completion, context (CASD's rest-of-file task) or chat (requests in the target's chat template)")
    bench.add_argument("--num-prompts", type=int, help="held-out prompts (default: the profile's, 20 on cpu)")
    bench.add_argument("--max-new-tokens", type=int, help="new tokens per prompt (default: the profile's, 64 on cpu)")
    bench.add_argument("--repeats", type=int, help="timed runs per method and prompt, median kept (default: the profile's, 3)")
    bench.add_argument("--warmup", type=int, default=1, help="untimed warm-up prompts (the longest), each run by every method "
                       "at --max-new-tokens before timing: caches sized and graphs compiled for the longest call")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--context-prompt-chars", type=int, help="context task: characters of the file before the cut in the prompt "
                       "(default 3000 for --profile cpu, 1400 for gpu; the whole file before the cut: e.g. 1000000)")
    bench.add_argument("--target")
    bench.add_argument("--draft")
    bench.add_argument("--output", help="JSON path (default benchmarks/results/<profile>-<task>.json; when that exists, a new "
                       "timestamped file beside it unless --overwrite)")
    bench.add_argument("--overwrite", action="store_true", help="replace benchmarks/results/<profile>-<task>.json when --output is not given")
    bench.add_argument("--dtype", default="auto", choices=DTYPE_NAMES, help="the target's; auto: fp32 on CPU, bf16 on CUDA")
    bench.add_argument("--draft-dtype", default="auto", choices=DTYPE_NAMES,
                       help="the drafters'; auto: bf16 for the embedded default's (the weights they ship in; bf16 halves a "
                       "draft forward's weight reads), the target's for --draft and train-default drafters")
    bench.add_argument("--gpu-default-dir", default="runs/gpu-default", help="where --profile gpu trains (or finds) its target")
    train = sub.add_parser("train-default", formatter_class=shown, help="train your own small target + drafts from a recipe (the 15.7M code LM of earlier versions)")
    train.add_argument("--recipe", default="default", help="default, gpu or tiny")
    train.add_argument("--output-dir", required=True, help="where the target, drafts, tokenizer and logs go (e.g. runs/my-default)")
    train.add_argument("--parts", default="draft,target,small_draft,glide,vanilla", help="any of draft,target,small_draft,glide,vanilla")
    train.add_argument("--resume-target", action="store_true", help="keep the trained first target stage in --output-dir and train only the recipe's continuation of it (use with --parts target)")
    report = sub.add_parser("report", help="render BENCHMARKS.md from benchmarks/results/*.json", formatter_class=shown)
    report.add_argument("--results-dir", default="benchmarks/results")
    report.add_argument("--output", default="BENCHMARKS.md")
    for name in PASSTHROUGH:  # listed in --help here; main() hands their arguments to their own parsers
        sub.add_parser(name, help=f"see `hf-specdraft {name} --help`", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse, then run the command in :mod:`hf_specdraft.cli` (the first import of torch and transformers)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in PASSTHROUGH:
        from hf_specdraft import cli

        return cli.PASSTHROUGH[argv[0]](argv[1:])
    names: tuple[str, ...] = ()
    if argv[:1] == ["bench"]:  # only bench's own help lists the methods: they live in the library
        from hf_specdraft.bench.methods import METHODS

        names = tuple(METHODS)
    args = build_parser(names).parse_args(argv)
    from hf_specdraft import cli

    return cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
