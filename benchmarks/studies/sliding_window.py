"""What verification costs past a sliding window, and what the two cache designs for it cost.

The default target's weights as a sliding-window model (``MistralForCausalLM``, every layer windowed: same
modules, same weights as SmolLM2's Llama) with a ``--window`` of 256 tokens, against the same weights without a
window. Two ways to verify trees past the window:

- **trimmed** (what the loop does): transformers' ``DynamicSlidingWindowLayer`` with past recording on, so a
  rejected branch never pushes an accepted key out; compaction gathers the accepted path and trims each layer
  back to the ``window - 1`` keys the next forward sees; each layer gets a mask cut to those keys.
- **full**: every layer a full ``DynamicLayer`` holding the whole past, the window applied by the mask only.

    python -m benchmarks.studies.sliding_window --output benchmarks/verification/cpu-sliding-window.json

Reported: median milliseconds of one verification step (the forward over ``[last] + tree`` plus compaction to a
2-node accepted path) for a 4-node chain (the model's own mask) and an 8-node tree (hf-specdraft's masks), with
the context inside the window (half of it) and at 4× the window; the cache's bytes at 4× the window; and end
to end on held-out code (prompt cut to 4× the window), target-only ``generate`` against speculative_generate
with the shipped GLIDE drafter, on the windowed target (GLIDE's recorded target type renamed to ``mistral``; it
reads the last layer, whose cache holds the window) and on the same weights without a window; output identical to
the target's own greedy output, checked.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, MistralConfig, MistralForCausalLM

from benchmarks.studies import save_run
from hf_specdraft.core.cache import compact_cache, croppable_cache
from hf_specdraft.core.loop import speculative_generate
from hf_specdraft.core.projection import few_token_linears
from hf_specdraft.core.support import with_cache
from hf_specdraft.core.tree import DraftTree
from hf_specdraft.core.verify import LayerWindows, single_row_inputs

TREE_PARENTS = [-1, 0, 1, -1, 0, 3, -1, 2]  # 8 nodes, depth up to 3, three roots: a CAPE-sized tree
CHAIN_LENGTH = 4


def verify_tree(model, input_ids: torch.LongTensor, cache: DynamicCache, tree: DraftTree) -> torch.Tensor:
    """One target forward over ``[last token] + tree`` on a cache covering ``input_ids[:, :-1]`` `(1, L)`. Returns
    float32 logits `(1+N, V)`: row 0 scores the token after the last one, row ``1+i`` the token after node ``i``."""
    inputs = single_row_inputs(LayerWindows(model), input_ids, cache, tree)
    return model(**inputs, **with_cache(model, cache), use_cache=True).logits[0].float()


def windowed_copy(target, window: int) -> MistralForCausalLM:
    """``target`` (a Llama) as a Mistral with a ``window``-token sliding window on every layer, same weights."""
    config = target.config
    fields = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_parameters",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    )
    mistral = MistralForCausalLM(
        MistralConfig(sliding_window=window, **{name: getattr(config, name) for name in fields})
    )
    mistral.load_state_dict(target.state_dict())
    return mistral.to(target.dtype).eval()


def cache_bytes(cache: DynamicCache) -> int:
    return sum(
        layer.keys.nbytes + layer.values.nbytes for layer in cache.layers if getattr(layer, "is_initialized", False)
    )


def prefilled(model, ids: torch.Tensor, design: str) -> DynamicCache:
    """A cache covering ``ids[:, :-1]`` as the loop holds it: ``trimmed`` or ``full`` (module docstring)."""
    if design == "full":
        cache = croppable_cache(model)
    else:
        cache = DynamicCache(config=model.config)
        cache.activate_past_recording()
    with torch.no_grad():
        model(ids[:, :-1], **with_cache(model, cache), use_cache=True, logits_to_keep=1)
    compact_cache(cache, torch.arange(ids.shape[1] - 1))  # the loop's trim after the prefill's step
    return cache


def step_milliseconds(model, ids: torch.Tensor, design: str, tree: DraftTree, repeats: int) -> float:
    """Median ms of one verification forward + compaction to a 2-node accepted path, on copies of one cache."""
    cache = prefilled(model, ids, design)
    length = ids.shape[1]
    path = [0, 1]
    keep = torch.cat([torch.arange(length), length + torch.tensor(path)])
    times = []
    with torch.no_grad(), few_token_linears(model):
        for i in range(repeats + 1):
            work = copy.deepcopy(cache)
            start = time.perf_counter()
            verify_tree(model, ids, work, tree)
            compact_cache(work, keep)
            if i:  # the first is a warm-up
                times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def held_out_prompt(tokenizer, tokens: int) -> torch.Tensor:
    """The first ``tokens`` tokens of held-out code files (the context task's files), concatenated."""
    from hf_specdraft.defaults.tasks import build_tasks

    ids = []
    for item in build_tasks("context", count=10, context_prompt_chars=10**6):
        ids += tokenizer(item.context, add_special_tokens=False)["input_ids"]
        if len(ids) >= tokens:
            break
    return torch.tensor([ids[:tokens]])


def run(bundle, window: int = 256, repeats: int = 9, new_tokens: int = 48) -> dict:
    target = bundle.target
    windowed = windowed_copy(target, window)
    g = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    tree = DraftTree(torch.randint(0, vocab, (len(TREE_PARENTS),), generator=g), torch.tensor(TREE_PARENTS))
    chain = DraftTree.chain(torch.randint(0, vocab, (CHAIN_LENGTH,), generator=g))
    contexts = {"inside (window / 2)": window // 2, "past (4 x window)": 4 * window}
    steps, memory = {}, {}
    runs = [
        (name, length, shape, drafted, design)
        for name, length in contexts.items()
        for shape, drafted in (("chain", chain), ("tree", tree))
        for design in ("trimmed", "full", "no window")
    ]
    for name, length, shape, drafted, design in tqdm(runs, desc="verification steps", unit="setting"):
        ids = torch.randint(0, vocab, (1, length), generator=g)
        model = target if design == "no window" else windowed
        cache_design = "full" if design == "no window" else design
        steps.setdefault(name, {}).setdefault(shape, {})[design] = step_milliseconds(
            model, ids, cache_design, drafted, repeats
        )
    ids = torch.randint(0, vocab, (1, 4 * window), generator=g)
    for design in ("trimmed", "full"):
        memory[design] = cache_bytes(prefilled(windowed, ids, design))

    x = held_out_prompt(bundle.tokenizer, 4 * window)
    glide = copy.deepcopy(bundle.extras["glide"])
    # same layers, shapes, RoPE and vocabulary: only the name differs
    glide.config.target_model_type = windowed.config.model_type
    pairs = {"windowed": (windowed, glide), "no window": (target, bundle.extras["glide"])}
    end_to_end = {"prompt_tokens": x.shape[1], "new_tokens": new_tokens}
    for name, (model, drafter) in tqdm(pairs.items(), desc="end to end", unit="target"):
        end_to_end[name] = end_to_end_run(model, drafter, x, new_tokens)
    return {"window": window, "step_milliseconds": steps, "cache_bytes_at_4x_window": memory, "end_to_end": end_to_end}


def end_to_end_run(model, glide, x: torch.Tensor, new_tokens: int, rounds: int = 3) -> dict:
    """Target-only ``generate`` and speculative_generate with GLIDE (γ 3), interleaved, median of ``rounds``."""
    timings, outputs, stats = {"target-only": [], "glide": []}, {}, None
    for _ in range(rounds):
        for name in timings:
            start = time.perf_counter()
            if name == "target-only":
                outputs[name] = model.generate(x, max_new_tokens=new_tokens, do_sample=False)
            else:
                out = speculative_generate(
                    model,
                    x,
                    draft_model=glide,
                    num_draft_tokens=3,
                    max_new_tokens=new_tokens,
                    do_sample=False,
                    return_dict_in_generate=True,
                )
                outputs[name], stats = out.sequences, out.speculative_stats
            timings[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(t) for name, t in timings.items()}
    return {
        "seconds": seconds,
        "glide_speedup": seconds["target-only"] / seconds["glide"],
        "mean_accepted_length": stats.mean_accepted_length,
        "alpha": stats.alpha,
        "identical_to_target": torch.equal(outputs["target-only"], outputs["glide"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="benchmarks/verification/cpu-sliding-window.json")
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    for name in ("window", "repeats"):
        if getattr(args, name) < 2:
            parser.error(f"--{name} must be an integer >= 2, got {getattr(args, name)}")
    from hf_specdraft.defaults import load_default

    bundle = load_default()
    result = save_run(
        bundle,
        args.output,
        f"python -m benchmarks.studies.sliding_window --window {args.window} --output {args.output}",
        run(bundle, window=args.window, repeats=args.repeats),
        repeats=args.repeats,
    )
    print(json.dumps({k: v for k, v in result.items() if k != "meta"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
