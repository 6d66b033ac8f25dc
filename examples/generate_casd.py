r"""CASD: drafts retrieved from the request's own context, verified exactly or conditionally (CASD paper, Algorithm 1).

    python examples/generate_casd.py --model Qwen/Qwen2.5-1.5B-Instruct --context-file report.txt \
        --question "Which section describes the evaluation?"
    python examples/generate_casd.py --tiny    # the repository's tiny recipe (recipes/training.py): seconds on a CPU

The draft pool holds the whole context; ``--threshold`` is δ of the conditional rule p(x) > max(δ, p(eos))
(eq. 3), ``strict`` verification is lossless. ``--tiny`` completes the next lines of a held-out file with
the rest of that file as context (the ``context`` task of hf_specdraft.defaults.tasks, like LCC).
"""

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_specdraft import casd_generate


def load(args):
    """Model, tokenizer and the request: (question, context, prompt template)."""
    if args.tiny:
        from _tiny import tiny_bundle

        from hf_specdraft.defaults.tasks import build_tasks

        bundle, item = tiny_bundle(), build_tasks("context", count=1, seed=0)[0]
        # the prompt: only the code before the cut
        return (bundle.target, bundle.tokenizer, (item.prompt, item.context, "{question}"))
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, device_map="auto")
    return model, AutoTokenizer.from_pretrained(args.model), (args.question, Path(args.context_file).read_text(), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="target model: Hub id or directory")
    parser.add_argument("--context-file", help="text file: the request's context (the draft pool)")
    parser.add_argument("--question", help="the query, placed after the context in the prompt")
    parser.add_argument("--threshold", type=float, default=0.1, help="δ of the conditional rule (eq. 3)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--tiny", action="store_true", help="use the repository's tiny recipe (recipes/training.py; a source checkout)"
    )
    args = parser.parse_args()
    if not args.tiny and not (args.model and args.context_file and args.question):
        parser.error("--model, --context-file and --question are required (or --tiny)")
    model, tokenizer, (question, context, template) = load(args)
    kwargs = {"max_new_tokens": args.max_new_tokens, "do_sample": False}
    reference = None
    for name, rule in (("casd-strict", {"strict": True}), ("casd-conditional", {"threshold": args.threshold})):
        start = time.perf_counter()
        out = casd_generate(model, tokenizer, question, context=context, prompt_template=template, **rule, **kwargs)
        seconds = time.perf_counter() - start
        if reference is None:  # strict verification reproduces target-only greedy decoding
            reference = model.generate(out.sequences[:, : out.prompt_length], **kwargs)
        print(
            f"{name:<17} {seconds:6.2f} s  mean accepted length {out.speculative_stats.mean_accepted_length:.2f}  "
            f"= target-only: {torch.equal(out.sequences, reference)}"
        )
    print(out.text)


if __name__ == "__main__":
    main()
