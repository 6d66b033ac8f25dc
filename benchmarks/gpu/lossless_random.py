"""Every default call against target-only greedy on random weights of SmolLM2-135M's shape (run.sh's first step: no
GGUF needed). Eager and with ``cache_implementation="static"`` (on CUDA compiled, CUDA graphs per bucket).

    python -m benchmarks.gpu.lossless_random --output $OUT/lossless-random-gpu.json     # on a CUDA machine, bf16
    python -m benchmarks.gpu.lossless_random --dtypes fp32 --output lossless-fp32.json  # the control
    python -m benchmarks.gpu.lossless_random --device cpu --layers 2 --new-tokens 8     # the mechanics, on a CPU

The calls: the draft model, GLIDE, CAPE over GLIDE, Max-Gram and CASD, each as ``speculative_generate``'s default call
(γ and sizes "auto"), and transformers' own static cache; each output is compared token by token with
``target.generate(do_sample=False)`` in the same dtype. Random weights give flat next-token distributions, so in bf16 a
kernel that rounds otherwise (a 4-token forward against a 1-token one) can flip a near tie. A difference is therefore
judged at its first token: if the reference's top two logits there are within a few bf16 steps and the call picked the
other one, the row reads "near tie" (rounding, not a lost token; benchmarks.studies.lossless); anything else is a
MISMATCH and the script exits 1.
fp32 (``--dtypes fp32``) runs the same calls as the control. What dynamo compiled and CUDA graphs recorded or skipped is
recorded per call, and the JSON is rewritten after every call (``complete`` says whether all ran): each dtype compiles
its buckets once, for the target and each draft, which may take minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from hf_specdraft import (
    CapeCandidateGenerator,
    CasdCandidateGenerator,
    GlideCandidateGenerator,
    GlideConfig,
    GlideForCausalLM,
)
from hf_specdraft import MaxGramCandidateGenerator, speculative_generate
from hf_specdraft.bench.timing import compile_counters, compiled_between

from benchmarks.studies.lossless import compare_greedy

# SmolLM2-135M-Instruct's config.json (and its GGUF's): 30 layers, 576 wide, 9 query / 3 KV heads, tied embeddings
SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=None,
    pad_token_id=2,
)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def models(layers: int, device: torch.device, dtype: torch.dtype, seed: int):
    """The random target, a 2-layer draft of the same shape, and a GLIDE for the target (all eval, on ``device``)."""
    torch.manual_seed(seed)
    config = LlamaConfig(**{**SMOLLM2, "num_hidden_layers": layers})
    target = LlamaForCausalLM(config).to(device, dtype).eval()
    draft = LlamaForCausalLM(LlamaConfig(**{**SMOLLM2, "num_hidden_layers": 2})).to(device, dtype).eval()
    glide = GlideForCausalLM(GlideConfig.from_target_config(target.config)).to(device, dtype).eval()
    return target, draft, glide


def default_calls(draft, glide, context: torch.Tensor) -> dict:
    """Each method's default call, as keyword arguments of ``speculative_generate`` (drafters built fresh per call)."""
    return {
        "draft-model": lambda: {"draft_model": draft},
        "glide": lambda: {"draft_model": glide},
        "glide+cape": lambda: {"candidate_generator": CapeCandidateGenerator(GlideCandidateGenerator(glide))},
        "max-gram": lambda: {"candidate_generator": MaxGramCandidateGenerator()},
        "casd": lambda: {"candidate_generator": CasdCandidateGenerator(context)},
    }


def check(dtype_name: str, args, device: torch.device):
    """Yield one row per call in ``dtype_name`` (the first call of each compiles its buckets: minutes on a GPU host)."""
    dtype = DTYPES[dtype_name]
    target, draft, glide = models(args.layers, device, dtype, args.seed)
    prompt = torch.randint(
        3, SMOLLM2["vocab_size"], (1, args.prompt_tokens), generator=torch.Generator().manual_seed(args.seed)
    ).to(device)
    common = {"max_new_tokens": args.new_tokens, "do_sample": False}
    reference = target.generate(prompt, **common)
    context = torch.cat([prompt[0], reference[0, prompt.shape[1] :]]).cpu()  # CASD's pool: the prompt and what follows
    runs = [("target-only", "static", lambda: target.generate(prompt, cache_implementation="static", **common))]
    for name, kwargs in default_calls(draft, glide, context).items():
        runs.append((name, "eager", lambda k=kwargs: speculative_generate(target, prompt, **k(), **common)))
        runs.append(
            (
                name,
                "static",
                lambda k=kwargs: speculative_generate(target, prompt, cache_implementation="static", **k(), **common),
            )
        )
    for name, path, run in runs:
        before, started = compile_counters(), time.perf_counter()
        try:
            out = run()
            error = None
        except Exception as err:  # one failing call must not hide the others' results
            out, error = None, f"{type(err).__name__}: {err}"
        if device.type == "cuda":
            torch.cuda.synchronize()
        row = {
            "dtype": dtype_name,
            "call": name,
            "path": path,
            "seconds": time.perf_counter() - started,
            "compiles": compiled_between(before, compile_counters()),
        }
        row.update(
            {"error": error, "identical": False}
            if out is None
            else compare_greedy(target, prompt.shape[1], reference, out)
        )
        verdict = (
            "identical"
            if row["identical"]
            else "ERROR " + row["error"]
            if out is None
            else "near tie"
            if row["near_tie"]
            else "MISMATCH"
        )
        print(f"{dtype_name:5} {name:11} {path:7} {verdict:10} {row['seconds']:7.1f} s  {row['compiles']}", flush=True)
        yield row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--dtypes", default="bf16", help="comma-separated: bf16 (the GPU run's dtype), fp32 (the control)"
    )
    parser.add_argument(
        "--layers", type=int, default=SMOLLM2["num_hidden_layers"], help="the target's layers (30: SmolLM2's)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="JSON path")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "target": f"random LlamaConfig of SmolLM2-135M's shape, {args.layers} layers",
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "seed": args.seed,
        "command": "python -m benchmarks.gpu.lossless_random " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    rows, lost = [], []
    for name in args.dtypes.split(","):
        for row in check(name, args, device):
            rows.append(row)
            lost += [row] if not row["identical"] and not row.get("near_tie") else []
            if args.output:  # after every row: a call stopped at its time limit still brings back what was checked
                write(args.output, {"meta": meta, "rows": rows, "lossless": not lost, "complete": False})
    if args.output:
        write(args.output, {"meta": meta, "rows": rows, "lossless": not lost, "complete": True})
    print(
        f"{len(rows) - len(lost)} of {len(rows)} calls identical or near ties; "
        + ("lossless" if not lost else f"LOST TOKENS in {len(lost)}")
    )
    return 0 if not lost else 1


def write(path: str, result: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
