r"""Generate with Max-Gram alone and with a cascade of drafts above it (Chen et al. 2024).

    python -m recipes.bigram --tokenizer TOKENIZER_DIR --output bigram.safetensors   # optional: Max-Gram's fallback
    python examples/generate_cascade.py --target Qwen/Qwen2.5-1.5B --drafts Qwen/Qwen2.5-0.5B \
        --bigram bigram.safetensors
    python examples/generate_cascade.py --tiny    # the repository's tiny recipe (recipes/training.py): seconds on a CPU

``--drafts`` go largest first and share the target's vocabulary. One timed run per method;
``hf-specdraft bench`` is the measurement.
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_specdraft import CascadeCandidateGenerator, MaxGramCandidateGenerator, speculative_generate
from hf_specdraft.cascade import load_bigram_table


def load(args):
    if args.tiny:
        from _tiny import tiny_bundle

        bundle = tiny_bundle()
        return bundle.target, bundle.tokenizer, [bundle.draft], bundle.extras["bigram_table"]
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype, device_map="auto")
    drafts = [AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(target.device) for name in args.drafts]
    table = load_bigram_table(args.bigram, device=target.device) if args.bigram else None
    return target, AutoTokenizer.from_pretrained(args.target), drafts, table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target model: Hub id or directory")
    parser.add_argument("--drafts", nargs="+", default=[], help="draft models, largest first")
    parser.add_argument("--bigram", help="Max-Gram's fallback table (save_bigram_table; `python -m recipes.bigram`)")
    parser.add_argument("--prompt", default="import os\n\n\ndef list_python_files(root):\n")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lenience", type=float, default=2.0, help="l: drafts reviewing drafts accept more leniently")
    parser.add_argument(
        "--tiny", action="store_true", help="use the repository's tiny recipe (recipes/training.py; a source checkout)"
    )
    args = parser.parse_args()
    if not args.tiny and not (args.target and args.drafts):
        parser.error("--target and --drafts are required (or --tiny)")
    target, tokenizer, drafts, table = load(args)
    inputs = tokenizer(args.prompt, return_tensors="pt").to(target.device)
    kwargs = {"max_new_tokens": args.max_new_tokens, "do_sample": False}

    start = time.perf_counter()
    reference = target.generate(**inputs, **kwargs)
    base = time.perf_counter() - start
    print(f"{'target-only':<10} {base:6.2f} s")
    # K matrix: the official code's defaults (cascade.default_k_matrix); lenience only where a draft reviews
    for name, drafter in (
        ("max-gram", MaxGramCandidateGenerator(table)),
        ("cascade", CascadeCandidateGenerator(drafts, lenience=args.lenience, bigram_table=table)),
    ):
        start = time.perf_counter()
        out = target.generate(
            **inputs,
            **kwargs,
            custom_generate=speculative_generate,
            candidate_generator=drafter,
            return_dict_in_generate=True,
        )
        seconds, stats = time.perf_counter() - start, out.speculative_stats
        lossless = torch.equal(out.sequences, reference)
        print(
            f"{name:<10} {seconds:6.2f} s  speedup {base / seconds:.2f}x  = target-only: {lossless}  "
            f"mean accepted length {stats.mean_accepted_length:.2f}  drafter calls {stats.drafter_calls}"
        )
    print(tokenizer.decode(out.sequences[0, inputs.input_ids.shape[1] :], skip_special_tokens=True))


if __name__ == "__main__":
    main()
