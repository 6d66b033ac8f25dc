"""What a verification forward costs: the default target over 1 + N tokens on its cache, with the model's
own linear layers, with :func:`hf_specdraft.core.projection.few_token_linears` over the output projection alone (as
``W @ h.T``: the setting ``few_token_projection``) and over every linear layer, and with ``few_token_linears``
calibrated (``orientation="auto"``, what the loop uses: each few-row linear takes whichever orientation was faster on
this CPU), against a one-token forward.

    python -m benchmarks.studies.projection --output benchmarks/verification/cpu-verification-cost-amd-epyc.json

Median of ``--repeats`` forwards per length after a warm-up, both settings interleaved per repeat, on a
prefix of ``--prefix`` random tokens (the cache is cropped back after each forward). A ratio near 1 means
verifying a draft costs what decoding one token costs: the regime where speculative decoding pays.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from hf_specdraft.core.support import with_cache
from benchmarks.studies import save_run
from hf_specdraft.core.projection import few_token_linears

LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


def time_forwards(model, prefix: int = 96, lengths=LENGTHS, repeats: int = 15, seed: int = 0) -> dict:
    """Median milliseconds of a forward over ``n`` new tokens on a ``prefix``-token cache, per n and setting."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size
    cache = DynamicCache(config=model.config)
    # what the loop uses: calibrated per machine
    settings = {
        "model's own": contextlib.nullcontext,
        "few_token_projection": lambda: few_token_linears(model.get_output_embeddings(), "transposed"),
        "few_token_linears": lambda: few_token_linears(model, "transposed"),
        "few_token_linears (auto)": lambda: few_token_linears(model),
    }
    samples = {name: {n: [] for n in lengths} for name in settings}
    with torch.no_grad():
        model(torch.randint(0, vocab, (1, prefix), generator=g), **with_cache(model, cache), use_cache=True)
        for repeat in tqdm(range(repeats + 1), desc="verification cost", unit="round"):
            for n in lengths:
                ids = torch.randint(0, vocab, (1, n), generator=g)
                for name, setting in settings.items():
                    with setting():
                        start = time.perf_counter()
                        model(ids, **with_cache(model, cache), use_cache=True)
                        seconds = time.perf_counter() - start
                    cache.crop(-n)  # back to the prefix
                    if repeat:  # round 0 warms up
                        samples[name][n].append(seconds * 1000)
    return {name: {str(n): statistics.median(ms) for n, ms in per_n.items()} for name, per_n in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="benchmarks/verification/cpu-verification-cost-amd-epyc.json")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--prefix", type=int, default=96)
    args = parser.parse_args(argv)
    for name in ("repeats", "prefix"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    from hf_specdraft.defaults import load_default

    bundle = load_default()
    milliseconds = time_forwards(bundle.target, prefix=args.prefix, repeats=args.repeats)
    result = save_run(
        bundle,
        args.output,
        f"python -m benchmarks.studies.projection --output {args.output}",
        {
            "milliseconds": milliseconds,
            "ratio_to_one_token": {
                name: {n: ms / per_n["1"] for n, ms in per_n.items()} for name, per_n in milliseconds.items()
            },
        },
        prefix=args.prefix,
        repeats=args.repeats,
    )
    print(json.dumps(result["ratio_to_one_token"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
