"""Throughput at batch size 1, 4, 8 and 16 on the default target: batched speculative decoding against batched
target-only ``generate``.

The same held-out completion prompts (the bench's ``completion`` items) run at every batch size, split into
left-padded batches in their order; each method runs every batch once after an untimed warm-up, methods interleaved
batch by batch. Reported per batch size and method: generated tokens per second (tokens up to each row's eos), the
ratio to target-only ``generate`` at the same batch size, the mean accepted length, and whether every row equals
its own batch-1 target-only greedy output.

Two target-only baselines: ``generate`` as transformers runs it, and the same with hf_specdraft's few-token linears
(:mod:`hf_specdraft.core.projection`, which the speculative loop uses): on this CPU a 4-row ``nn.Linear`` takes MKL's
slow small-M path, so part of a batched method's lead over stock ``generate`` is that projection, not speculation; the
second baseline separates the two. Stock assisted decoding runs at batch 1 only (transformers refuses more).

    python -m benchmarks.studies.batching --output benchmarks/verification/cpu-batching.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from tqdm.auto import tqdm

from benchmarks.studies import save_run
from hf_specdraft.bench.harness import prompt_ids
from hf_specdraft.core.loop import speculative_generate
from hf_specdraft.core.projection import few_token_linears

BATCH_SIZES = (1, 4, 8, 16)
GAMMA = 3  # the chain drafters' γ, as in the batch-1 bench


def left_padded(prompts: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(B, P)` ids and attention mask of 1-D prompts, left-padded with ``pad``."""
    width = max(p.numel() for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - p.numel() :], mask[i, width - p.numel() :] = p, 1
    return ids, mask


def generated(row: torch.Tensor, eos: int) -> list[int]:
    """A row's new tokens up to and including its first eos."""
    tokens = row.tolist()
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def cache_layout(runs: list[dict]) -> dict:
    """What the repacked cache cost over a method's batches: gather ms per step against the verification forward's, and
    the widest it got against the width a cache that only masks rejected columns would have reached."""
    steps = sum(r["steps"] for r in runs)
    return {
        "repack_ms_per_step": 1000 * sum(r["repack_seconds"] for r in runs) / max(steps, 1),
        "verify_ms_per_step": 1000 * sum(r["verify_seconds"] for r in runs) / max(steps, 1),
        "widest_repacked_columns": max(r["widest_repacked"] for r in runs),
        "widest_with_holes_columns": max(r["holes_columns"] for r in runs),
    }


def chain_names(drafter: str, gammas) -> list[str]:
    """The bench names of a chain drafter's runs: ``glide`` for one γ, ``glide γ=1``, ``glide γ=3`` … for several."""
    return [drafter] if len(gammas) == 1 else [f"{drafter} γ={g}" for g in gammas]


def method_names(gammas=(GAMMA,)) -> list[str]:
    """Every method :func:`methods` builds for ``gammas``, in its order."""
    return [
        "target-only",
        "target-only (few-token linears)",
        "stock-assisted",
        *chain_names("glide", gammas),
        *chain_names("vanilla", gammas),
        "max-gram",
    ]


def methods(bundle, gammas=(GAMMA,)) -> dict:
    """name -> (run(ids, mask, kwargs) -> (sequences, stats or None), batch sizes it runs at). The chain drafters run
    once per γ in ``gammas`` (named ``glide`` for one γ, ``glide γ=2`` … for several)."""
    from hf_specdraft.cascade import build_max_gram_for_bench
    from hf_specdraft.glide import GlideCandidateGenerator

    target, extras = bundle.target, bundle.extras

    def target_only(ids, mask, kwargs):
        return target.generate(ids, attention_mask=mask, **kwargs), None

    def target_only_fast(ids, mask, kwargs):
        with few_token_linears(target):
            return target.generate(ids, attention_mask=mask, **kwargs), None

    def stock_assisted(ids, mask, kwargs):
        return target.generate(ids, attention_mask=mask, assistant_model=bundle.draft, **kwargs), None

    def ours(build):
        def run(ids, mask, kwargs):
            out = speculative_generate(
                target, ids, attention_mask=mask, candidate_generator=build(), return_dict_in_generate=True, **kwargs
            )
            return out.sequences, out.speculative_stats

        return run

    def chain(drafter, gamma):
        return ours(lambda: GlideCandidateGenerator(extras[drafter], num_draft_tokens=gamma))

    table = {
        "target-only": (target_only, BATCH_SIZES),
        "target-only (few-token linears)": (target_only_fast, BATCH_SIZES),
        "stock-assisted": (stock_assisted, (1,)),
    }
    for drafter in ("glide", "vanilla"):
        table.update({name: (chain(drafter, g), BATCH_SIZES) for name, g in zip(chain_names(drafter, gammas), gammas)})
    table["max-gram"] = (ours(lambda: build_max_gram_for_bench(target, extras["bigram_table"])), BATCH_SIZES)
    return table


def run(
    bundle,
    num_prompts: int = 16,
    max_new_tokens: int = 64,
    batch_sizes=BATCH_SIZES,
    gammas=(GAMMA,),
    skip_prompts: int = 0,
    only: tuple[str, ...] | None = None,
) -> dict:
    """Every method of :func:`methods` (or those named in ``only``; both target-only baselines always run) over
    completion items ``skip_prompts .. skip_prompts + num_prompts - 1``: the bench's own are the first 16, later ones
    are for tuning."""
    from transformers.utils import logging

    from hf_specdraft.defaults.tasks import build_tasks

    tok = bundle.tokenizer
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    items = build_tasks("completion", count=skip_prompts + num_prompts, seed=0)[skip_prompts:]
    prompts = [prompt_ids(tok, item)[0] for item in items]
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, "eos_token_id": eos, "pad_token_id": pad}
    # smallest first: every larger batch is checked against its target-only output
    batch_sizes = sorted(set(batch_sizes))
    table = methods(bundle, tuple(gammas))
    if only is not None:
        check_methods(only, gammas)
        table = {name: entry for name, entry in table.items() if name in only or name.startswith("target-only")}
    outputs: dict[int, dict[str, dict[int, list[int]]]] = {}  # batch size -> method -> prompt -> its new tokens
    results: dict[str, dict] = {}
    logging.set_verbosity_error()  # assisted decoding's internal deprecation notices would break the progress bar
    for size in tqdm(batch_sizes, desc="batch sizes"):
        batches = [prompts[i : i + size] for i in range(0, len(prompts), size)]
        names = [name for name, (_, sizes) in table.items() if size in sizes]
        warm_ids, warm_mask = left_padded(batches[0], pad)
        for name in names:
            table[name][0](warm_ids, warm_mask, {**kwargs, "max_new_tokens": 8})
        seconds = {name: 0.0 for name in names}
        tokens = {name: 0 for name in names}
        outputs[size] = {name: {} for name in names}
        layouts = {name: [] for name in names}
        steps = {name: [] for name in names}
        for b, batch in enumerate(tqdm(batches, desc=f"batch size {size}", leave=False)):
            ids, mask = left_padded(batch, pad)
            for name in names[b % len(names) :] + names[: b % len(names)]:  # rotated: no method always first
                start = time.perf_counter()
                sequences, stats = table[name][0](ids, mask, kwargs)
                seconds[name] += time.perf_counter() - start
                for i in range(len(batch)):
                    outputs[size][name][b * size + i] = generated(sequences[i, ids.shape[1] :], eos)
                    tokens[name] += len(outputs[size][name][b * size + i])
                if stats is not None:
                    steps[name].append((stats.new_tokens, stats.num_steps))
                    layouts[name].append(
                        {**stats.extra.get("cache_layout", {}), "verify_seconds": stats.verify_seconds}
                    )
        base = tokens["target-only"] / seconds["target-only"]
        fast = tokens["target-only (few-token linears)"] / seconds["target-only (few-token linears)"]
        results[str(size)] = {
            name: {
                "seconds": seconds[name],
                "new_tokens": tokens[name],
                "tokens_per_second": tokens[name] / seconds[name],
                "vs_target_only": tokens[name] / seconds[name] / base,
                "vs_target_only_fast_linears": tokens[name] / seconds[name] / fast,
                "mean_accepted_length": (sum(n for n, _ in steps[name]) / sum(s for _, s in steps[name]))
                if steps[name]
                else None,
                "identical_to_batch1_target_only": outputs[size][name] == outputs[min(outputs)]["target-only"],
                **(
                    {"cache_layout": cache_layout(layouts[name])}
                    if layouts[name] and "steps" in layouts[name][0]
                    else {}
                ),
            }
            for name in names
        }
    return {
        "num_prompts": len(prompts),
        "prompts": f"completion items {skip_prompts}..{skip_prompts + len(prompts) - 1} (seed 0)",
        "reference_batch_size": min(
            outputs
        ),  # "identical_to_batch1_target_only" compares with target-only at this batch size
        "max_new_tokens": max_new_tokens,
        "gamma": gammas[0] if len(gammas) == 1 else list(gammas),
        "batch_sizes": list(batch_sizes),
        "results": results,
    }


def check_methods(only, gammas) -> None:
    """Raise ``ValueError`` naming the known methods if ``only`` holds a name :func:`methods` does not build."""
    unknown = sorted(set(only) - set(method_names(gammas)))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose among {method_names(gammas)}")


def _positive_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    from hf_specdraft.defaults import load_default

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="benchmarks/verification/cpu-batching.json")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=_positive_ints, default=BATCH_SIZES, help="comma-separated, e.g. 4,8")
    parser.add_argument(
        "--gammas",
        type=_positive_ints,
        default=(GAMMA,),
        help=f"the chain drafters' γ, comma-separated (default {GAMMA})",
    )
    parser.add_argument(
        "--skip-prompts",
        type=int,
        default=0,
        help="start after the first N completion items (tune on items the bench does not report)",
    )
    parser.add_argument(
        "--methods",
        type=lambda text: tuple(text.split(",")),
        default=None,
        help="comma-separated subset (both target-only baselines always run)",
    )
    args = parser.parse_args(argv)
    if args.num_prompts < 1 or args.max_new_tokens < 1 or args.skip_prompts < 0:
        parser.error("--num-prompts and --max-new-tokens must be positive, --skip-prompts 0 or more")
    if args.methods is not None:
        try:
            check_methods(args.methods, args.gammas)
        except ValueError as error:
            parser.error(f"--methods: {error}")
    bundle = load_default()
    command = "python -m benchmarks.studies.batching " + " ".join(argv if argv is not None else sys.argv[1:])
    result = save_run(
        bundle,
        args.output,
        command,
        run(
            bundle,
            args.num_prompts,
            args.max_new_tokens,
            args.batch_sizes,
            args.gammas,
            args.skip_prompts,
            args.methods,
        ),
    )
    print(json.dumps(result["results"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
