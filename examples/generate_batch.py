"""Batched speculative decoding: prompts in one left-padded batch, each row checked against its own greedy output.

    python examples/generate_batch.py --target HuggingFaceTB/SmolLM2-135M-Instruct --glide YOUR_USER/glide-smollm2-135m
    python examples/generate_batch.py --tiny    # the repository's tiny recipe (recipes/training.py): seconds on a CPU

Each row drafts, verifies and accepts on its own, with one target forward per step for the whole batch. Throughput
is printed for target-only batched ``generate``, the same with :func:`hf_specdraft.few_token_linears` (on CPU a
few-row ``nn.Linear`` takes a slow BLAS path that it avoids), and GLIDE. One timed run each: ``python -m
benchmarks.studies.batching`` (from the repository root) is the measurement (there, on a 2-core CPU, GLIDE with
γ = 1 beat batched ``generate`` by 1.44x at batch 4 and lost from batch 8 on).
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_specdraft import GlideCandidateGenerator, few_token_linears, speculative_generate

PROMPTS = [
    "def add(a, b):\n",
    "class Stack:\n    def push(self, item):\n",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "import os\n\ndef list_python_files(folder):\n",
]


def load(args):
    if args.tiny:
        from _tiny import tiny_bundle

        bundle = tiny_bundle()
        return bundle.target, bundle.tokenizer, bundle.extras["glide"]
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype, device_map="auto")
    # hf_specdraft.glide (imported above) registers GLIDE
    glide = AutoModelForCausalLM.from_pretrained(args.glide, dtype=dtype).to(target.device)
    return target, AutoTokenizer.from_pretrained(args.target), glide


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target model: Hub id or directory")
    parser.add_argument("--glide", help="GLIDE checkpoint trained for --target: Hub id or directory")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--num-draft-tokens", type=int, default=1, help="γ; short drafts pay best in a batch on CPU")
    parser.add_argument(
        "--tiny", action="store_true", help="use the repository's tiny recipe (recipes/training.py; a source checkout)"
    )
    args = parser.parse_args()
    if not args.tiny and not (args.target and args.glide):
        parser.error("--target and --glide are required (or --tiny)")
    target, tokenizer, glide = load(args)
    tokenizer.padding_side = "left"  # a batch for generate is left-padded; right padding is refused
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True).to(target.device)
    kwargs = {"max_new_tokens": args.max_new_tokens, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}

    def new_tokens(sequences):
        rows = sequences[:, batch.input_ids.shape[1] :]
        return sum(int((row != tokenizer.pad_token_id).sum()) for row in rows)

    def timed(run):
        start = time.perf_counter()
        out = run()
        return out, time.perf_counter() - start

    target.generate(**batch, **{**kwargs, "max_new_tokens": 2})  # warm-up, untimed: the first call pays one-time setup
    reference, base = timed(lambda: target.generate(**batch, **kwargs))
    with few_token_linears(target):
        fast, fast_seconds = timed(lambda: target.generate(**batch, **kwargs))
    # forked per row: one draft forward for all rows
    drafter = GlideCandidateGenerator(glide, num_draft_tokens=args.num_draft_tokens)
    out, seconds = timed(
        lambda: target.generate(
            **batch,
            **kwargs,
            custom_generate=speculative_generate,
            candidate_generator=drafter,
            return_dict_in_generate=True,
        )
    )
    singles = [target.generate(**tokenizer(p, return_tensors="pt").to(target.device), **kwargs)[0] for p in PROMPTS]
    same = all(
        torch.equal(out.sequences[r, batch.attention_mask[r].argmax() :][: len(s)], s) for r, s in enumerate(singles)
    )
    tokens = new_tokens(reference)
    fast_lossless, lossless = torch.equal(fast, reference), torch.equal(out.sequences, reference)
    print(f"batch of {len(PROMPTS)} prompts, {tokens} new tokens")
    print(f"{'target-only':<32} {tokens / base:7.1f} tok/s")
    print(f"{'target-only + few_token_linears':<32} {tokens / fast_seconds:7.1f} tok/s  = target-only: {fast_lossless}")
    print(
        f"{'glide':<32} {new_tokens(out.sequences) / seconds:7.1f} tok/s  = target-only: {lossless}  "
        f"each row = its batch-1 greedy: {same}"
    )
    for r, stats in enumerate(out.row_stats):
        print(f"  row {r}: {stats.new_tokens} tokens, mean accepted length {stats.mean_accepted_length:.2f}")
    print(tokenizer.decode(out.sequences[0, batch.input_ids.shape[1] :], skip_special_tokens=True))


if __name__ == "__main__":
    main()
