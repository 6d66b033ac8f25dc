"""What a drafter's dtype costs and buys: the shipped drafters in float32 and in bfloat16 next to a float32 target.

    python -m benchmarks.studies.draft_dtype --output benchmarks/verification/cpu-draft-dtype.json

Two measurements, both settings interleaved in one run:

- **forward**: one draft forward over ``n`` tokens (1: a drafted token; 3: the accepted tokens a step feeds
  back) right after a target forward, as in the loop, so the draft's weights come from memory, not cache.
  Median of ``--repeats`` per drafter, dtype and n.
- **end to end**: GLIDE and its vanilla twin drafting γ = 3 on the completion items the tuning runs use
  (20 onwards, never the bench's reported 0..19), target-only greedy beside them; per prompt the median of
  ``--runs`` runs, speedup = target-only seconds / method seconds over all prompts, mean accepted length,
  and whether every output equals target-only's (it must: the float32 target decides every token).

A one-token draft forward is a chain of matrix-vector products whose time is reading the weights; bf16
weights are half the bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from hf_specdraft.core.support import with_cache
from benchmarks.studies import save_run
from hf_specdraft.core.loop import speculative_generate

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KINDS = {"glide": "glide", "vanilla": "vanilla", "small_draft": "small"}  # bundle name -> shipped folder


def time_draft_forwards(
    target, drafters: dict, lengths=(1, 3), prefix: int = 96, repeats: int = 15, seed: int = 0
) -> dict:
    """Median milliseconds of one draft forward over ``n`` tokens after a target forward.

    Args:
        target: the target; its forward evicts the draft's weights from the CPU caches, as in the loop.
        drafters: ``{(name, dtype name): GLIDE model}``.

    Returns:
        ``{name: {dtype name: {str(n): ms}}}``.
    """
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    prompt = torch.randint(0, vocab, (1, prefix + 1), generator=g)
    samples = {key: {n: [] for n in lengths} for key in drafters}
    with torch.no_grad():
        target_cache = DynamicCache(config=target.config)
        target(prompt[:, :-1], **with_cache(target, target_cache), use_cache=True)
        caches = {}
        for key, model in drafters.items():
            caches[key] = DynamicCache(config=model.config)
            model(
                input_ids=prompt[:, :-1],
                past_key_values=caches[key],
                use_cache=True,
                target_past_key_values=target_cache,
                logits_to_keep=1,
            )
        for repeat in tqdm(range(repeats + 1), desc="draft forwards", unit="round"):
            for n in lengths:
                ids = torch.randint(0, vocab, (1, n), generator=g)
                for key, model in drafters.items():
                    target(prompt[:, -1:], **with_cache(target, target_cache), use_cache=True)
                    target_cache.crop(-1)
                    start = time.perf_counter()
                    model(
                        input_ids=ids,
                        past_key_values=caches[key],
                        use_cache=True,
                        target_past_key_values=target_cache,
                        logits_to_keep=1,
                    )
                    seconds = time.perf_counter() - start
                    caches[key].crop(-n)
                    if repeat:  # round 0 warms up
                        samples[key][n].append(seconds * 1000)
    result: dict = {}
    for (name, dtype), per_n in samples.items():
        result.setdefault(name, {})[dtype] = {str(n): statistics.median(ms) for n, ms in per_n.items()}
    return result


def end_to_end(
    bundle, drafters: dict, num_prompts: int = 6, max_new_tokens: int = 48, runs: int = 3, gamma: int = 3
) -> dict:
    """Target-only and GLIDE / vanilla chains of ``gamma`` in each dtype on completion items 20.., interleaved."""
    from hf_specdraft.defaults.tasks import build_tasks
    from hf_specdraft.glide import GlideCandidateGenerator

    tokenizer, target = bundle.tokenizer, bundle.target
    items = build_tasks("completion", count=20 + num_prompts)[20:]
    prompts = [tokenizer(item.prompt, return_tensors="pt").input_ids.to(target.device) for item in items]
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False}
    methods = {"target-only": lambda x: (target.generate(x, **kwargs), None)}
    for key, model in drafters.items():
        if key[0] in ("glide", "vanilla"):
            methods["/".join(key)] = lambda x, model=model: _spec(
                target, x, GlideCandidateGenerator(model, num_draft_tokens=gamma), kwargs
            )
    for run in methods.values():  # warm-up
        run(prompts[0][:, :32])
    seconds = {name: [] for name in methods}
    accepted = {name: [] for name in methods}
    identical = {name: True for name in methods}
    for x in tqdm(prompts, desc="end to end", unit="prompt"):
        per_run = {name: [] for name in methods}
        reference = None
        for _ in range(runs):
            for name, run in methods.items():
                start = time.perf_counter()
                sequences, stats = run(x)
                per_run[name].append(time.perf_counter() - start)
                reference = sequences if name == "target-only" else reference
                identical[name] &= torch.equal(sequences, reference)
                if stats is not None:
                    accepted[name].append(stats.mean_accepted_length)
        for name in methods:
            seconds[name].append(statistics.median(per_run[name]))
    total = {name: sum(s) for name, s in seconds.items()}
    return {
        name: {
            "seconds": total[name],
            "speedup_vs_target_only": total["target-only"] / total[name],
            "mean_accepted_length": statistics.mean(accepted[name]) if accepted[name] else None,
            "equals_target_only": identical[name],
        }
        for name in methods
    }


def _spec(target, x, generator, kwargs):
    out = speculative_generate(target, x, candidate_generator=generator, return_dict_in_generate=True, **kwargs)
    return out.sequences, out.speculative_stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="benchmarks/verification/cpu-draft-dtype.json")
    parser.add_argument("--repeats", type=int, default=15, help="draft forwards per drafter, dtype and length")
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3, help="end-to-end runs per prompt and method, median kept")
    args = parser.parse_args(argv)
    for name in ("repeats", "num_prompts", "max_new_tokens", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    from hf_specdraft.defaults import load_default
    from hf_specdraft.defaults.loading import SMOLLM2_DRAFTERS_DIR
    from hf_specdraft.glide import GlideForCausalLM

    bundle = load_default(dtype=torch.float32, device="cpu")
    drafters = {
        (name, dtype_name): GlideForCausalLM.from_pretrained(SMOLLM2_DRAFTERS_DIR / folder, dtype=dtype).eval()
        for name, folder in KINDS.items()
        for dtype_name, dtype in DTYPES.items()
    }
    forwards = time_draft_forwards(bundle.target, drafters, repeats=args.repeats)
    generation = end_to_end(
        bundle, drafters, num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, runs=args.runs
    )
    command = "python -m benchmarks.studies.draft_dtype" + "".join(
        f" --{k.replace('_', '-')} {getattr(args, k)}"
        for k in ("output", "repeats", "num_prompts", "max_new_tokens", "runs")
    )
    save_run(
        bundle,
        args.output,
        command,
        {"draft_forward_ms": forwards, "end_to_end": generation},
        prompts="completion items 20..",
        gamma=3,
    )
    print(json.dumps({"draft_forward_ms": forwards, "end_to_end": generation}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
