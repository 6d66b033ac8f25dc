"""The loop's own overhead: speculative_generate with a drafter that proposes nothing vs plain generate.

    python -m benchmarks.studies.overhead --output benchmarks/results/overhead-cpu.json

A random-weight Llama of ≈70M parameters (the ratio measures the loop, not the weights), greedy, the
same prompts for both, interleaved in one run. Goal: ratio ≤ 1.05 on CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.methods import NullCandidateGenerator
from hf_specdraft.core.loop import speculative_generate


def overhead_model(seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=12,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1536,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def measure_overhead(num_prompts: int = 6, prompt_length: int = 64, max_new_tokens: int = 64, seed: int = 0) -> dict:
    model = overhead_model(seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, model.config.vocab_size, (1, prompt_length), generator=g) for _ in range(num_prompts)]
    kwargs = {
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": max_new_tokens,
        "do_sample": False,
        "eos_token_id": None,
        "pad_token_id": 0,
    }
    runs = {
        "generate": lambda x: model.generate(x, **kwargs),
        "speculative_generate(null drafter)": lambda x: speculative_generate(
            model, x, candidate_generator=NullCandidateGenerator(), **kwargs
        ),
    }
    for fn in runs.values():  # warm-up
        fn(prompts[0])
    seconds = {name: 0.0 for name in runs}
    identical = True
    for x in prompts:
        outs = {}
        for name, fn in runs.items():
            start = time.perf_counter()
            outs[name] = fn(x)
            seconds[name] += time.perf_counter() - start
        identical &= torch.equal(*outs.values())
    return {
        "meta": {
            "hardware": f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
            "dtype": "float32",
            "batch_size": 1,
            "parameters": sum(p.numel() for p in model.parameters()),
            "num_prompts": num_prompts,
            "prompt_length": prompt_length,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "python": platform.python_version(),
            },
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        },
        "seconds": seconds,
        "ratio": seconds["speculative_generate(null drafter)"] / seconds["generate"],
        "identical_output": bool(identical),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="benchmarks/results/overhead-cpu.json")
    parser.add_argument("--num-prompts", type=int, default=6)
    args = parser.parse_args(argv)
    result = measure_overhead(num_prompts=args.num_prompts)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("seconds", "ratio", "identical_output")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
