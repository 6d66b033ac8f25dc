"""Generate with GLIDE (Du et al. 2024, §4.1) and GLIDE + CAPE (§4.2); compare with target-only greedy decoding.

    python examples/generate_glide.py --target lmsys/vicuna-7b-v1.5 --glide YOUR_USER/glide-vicuna-7b-v1.5
    python examples/generate_glide.py --tiny    # the repository's tiny recipe (recipes/training.py): seconds on a CPU

``--glide`` is a GLIDE checkpoint trained for ``--target`` (``examples/train_glide.py`` writes one). One
timed run per method; ``hf-specdraft bench`` is the measurement.
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_specdraft import CapeCandidateGenerator, GlideCandidateGenerator, speculative_generate


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
    parser.add_argument("--prompt", default="def quicksort(items):\n")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--tiny", action="store_true", help="use the repository's tiny recipe (recipes/training.py; a source checkout)"
    )
    args = parser.parse_args()
    if not args.tiny and not (args.target and args.glide):
        parser.error("--target and --glide are required (or --tiny)")
    target, tokenizer, glide = load(args)
    inputs = tokenizer(args.prompt, return_tensors="pt").to(target.device)
    kwargs = {"max_new_tokens": args.max_new_tokens, "do_sample": False}

    def timed(**extra):
        start = time.perf_counter()
        out = target.generate(**inputs, **kwargs, **extra)
        return out, time.perf_counter() - start

    reference, base = timed()
    glide.attach(target)  # transformers' own assisted decoding; the draft reads the target's live KV cache
    try:
        stock, seconds = timed(assistant_model=glide)
    finally:
        glide.detach()
    print(f"{'target-only':<16} {base:6.2f} s")
    lossless = torch.equal(stock, reference)
    print(f"{'stock-assisted':<16} {seconds:6.2f} s  speedup {base / seconds:.2f}x  = target-only: {lossless}")
    for name, drafter in (
        ("glide", GlideCandidateGenerator(glide, num_draft_tokens=5)),  # γ = 5, §5.1
        ("glide+cape", CapeCandidateGenerator(GlideCandidateGenerator(glide, num_draft_tokens=5))),
    ):
        out, seconds = timed(
            custom_generate=speculative_generate, candidate_generator=drafter, return_dict_in_generate=True
        )
        stats, lossless = out.speculative_stats, torch.equal(out.sequences, reference)
        # α needs a chain with q: not CAPE's trees
        print(
            f"{name:<16} {seconds:6.2f} s  speedup {base / seconds:.2f}x  = target-only: {lossless}  "
            f"mean accepted length {stats.mean_accepted_length:.2f}  "
            f"accepted per judged position {stats.position_acceptance_rate:.2f}"
            + ("" if stats.alpha is None else f"  α (1 - TV(p, q)) {stats.alpha:.2f}")
        )
    print(tokenizer.decode(out.sequences[0, inputs.input_ids.shape[1] :], skip_special_tokens=True))


if __name__ == "__main__":
    main()
