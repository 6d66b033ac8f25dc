"""An ablation: GLIDE drafters that read the target's state against today's and their vanilla twin, on SmolLM2.

For each drafter (a checkpoint directory), in one run on one machine:

- **agreement by draft step**: held-out greedy agreement at draft steps 1, 2, 3, each conditional on the earlier ones
  (:func:`conditional_agreement`, teacher-forced on the target's own text: a held-out store
  written by ``python -m recipes.distillation DIR --self-generated 48 --heldout --max-new-tokens 160 --seq-len 384``);
- **draft cost**: milliseconds of one draft step (one token, after a 300-token context), against a target forward;
- **the default call**: ``speculative_generate(target, ids, draft_model=drafter)`` (γ 'auto', no tuning argument) on
  held-out completion and chat prompts, timed against ``target.generate`` interleaved, the median of ``--repeats``
  runs per prompt; tokens/s, speedup, mean accepted length (MAL), and whether the output is token-identical.

    python -m benchmarks.studies.state_glide --heldout-store store/heldout-state \\
        --drafter glide=hf_specdraft/defaults/checkpoint_smollm2/glide --drafter glide-state=drafters/glide-state \\
        --output benchmarks/verification/cpu-state-glide.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from accelerate.utils import extract_model_from_parallel

from hf_specdraft.core.support import with_cache
from hf_specdraft import speculative_generate
from hf_specdraft.bench.harness import cpu_model, prompt_ids
from hf_specdraft.defaults.tasks import build_tasks
from hf_specdraft.glide import GlideCandidateGenerator, GlideForCausalLM
from benchmarks.studies.glide_glimpse import teacher_forced_alpha
from hf_specdraft.glide.training.objective import GlideBatch, WindowSource
from hf_specdraft.glide.training.store import StoreWindows, load_store
from hf_specdraft.glide.training.unrolled import unrolled_passes

STEPS = 3
DRAFT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # the embedded default loads its drafters in bf16 on CPU


def conditional_agreement(model, batch: GlideBatch, steps: int, first: int = 0) -> list[tuple[int, int]]:
    """Greedy agreement by draft step, each conditional on the earlier ones: for step k, ``(agreed, tried)`` over the
    drafts whose steps 1..k-1 all drafted the target's argmax (only those reach step k under greedy verification).
    ``first``: count only drafts started at position ``first`` or later (e.g. a chat answer's, not its request's).

    Needs p (``topk_ids`` or ``target_logits``). Teacher forcing feeds the window's tokens, which are the drafts a
    greedy loop would have fed when the window is the target's own greedy text and the earlier steps agreed.
    """
    glide = extract_model_from_parallel(model)
    if batch.target_logits is not None:
        best = batch.target_logits.argmax(-1)
    elif batch.topk_ids is not None:
        best = batch.topk_ids[..., 0].long()
    else:
        raise ValueError("agreement needs the target's next tokens: the batch has neither target_logits nor topk_ids")
    length = batch.input_ids.shape[1]
    alive = None  # (B, T) indexed by t: the draft started at t agreed at every step so far
    counts = []
    for k, logits, valid in unrolled_passes(model, batch, steps):
        guess = logits.argmax(-1)  # GLIDE's rows: a reduced vocabulary's last row ("another token") matches nothing
        if glide.config.draft_token_ids is None:
            hit = guess == best  # (B, T) indexed by j = t + k - 1
        else:
            hit = (guess == glide.model.target_to_draft[best]) & (guess < logits.shape[-1] - 1)
        starts = torch.arange(length - k + 1, device=hit.device)  # drafts whose step k falls in the window
        hit_t = hit[:, starts + k - 1]
        ok = valid[starts + k - 1][None].expand_as(hit_t)
        ok = ok & (starts >= first)[None]
        alive = ok if alive is None else alive[:, : starts.numel()] & ok
        counts.append((int((hit_t & alive).sum()), int(alive.sum())))
        alive = alive & hit_t
    return counts


@torch.no_grad()
def agreement(
    target, glide, source: WindowSource, batch_size: int = 4, device: str | torch.device = "cpu"
) -> list[float]:
    """Held-out conditional greedy agreement at draft steps 1..STEPS over ``source``'s windows (a held-out store's, or
    :class:`~hf_specdraft.glide.training.objective.TargetWindows` the target runs over on ``device``)."""
    totals = [[0, 0] for _ in range(STEPS)]
    for start in range(0, len(source), batch_size):
        rows = torch.arange(start, min(start + batch_size, len(source)))
        batch = source.batch(target, glide, rows, device, glide.config.cross_attention, True)
        for k, (agreed, tried) in enumerate(conditional_agreement(glide, batch, STEPS)):
            totals[k][0] += agreed
            totals[k][1] += tried
    return [round(a / t, 4) if t else 0.0 for a, t in totals]


@torch.no_grad()
def step_ms(target, glide, context: int = 300, repeats: int = 30) -> dict:
    """Milliseconds of one draft step and of one target decoding forward, both after ``context`` tokens."""
    from transformers import DynamicCache

    from hf_specdraft.core.cache import crop_to

    ids = torch.randint(0, target.config.vocab_size, (1, context + 1))
    cache = DynamicCache(config=target.config)
    out = target(ids[:, :-1], **with_cache(target, cache), use_cache=True, output_hidden_states=True)
    state = out.hidden_states[-1][:, -1:].to(glide.dtype)
    kwargs = {"target_past_key_values": cache} if glide.config.cross_attention else {}
    if glide.config.state_input:
        kwargs["target_hidden_states"] = state
    position = torch.tensor([[context]])

    def draft():
        return glide(input_ids=ids[:, -1:], position_ids=position, use_cache=False, logits_to_keep=1, **kwargs)

    def verify():
        crop_to(cache, context)
        return target(ids[:, -1:], **with_cache(target, cache), use_cache=True)

    def timed(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    draft_ms, target_ms = timed(draft), timed(verify)
    return {
        "draft_step_ms": round(draft_ms, 3),
        "target_forward_ms": round(target_ms, 3),
        "draft_cost_ratio": round(draft_ms / target_ms, 4),
    }


def run(target, ids, drafter, new_tokens: int, **kwargs):
    """The default call with ``drafter``: a GLIDE (``draft_model=``) or ``(GLIDE, GlideCandidateGenerator options)``."""
    if isinstance(drafter, tuple):
        glide, options = drafter
        return speculative_generate(
            target,
            ids,
            candidate_generator=GlideCandidateGenerator(glide, **options),
            max_new_tokens=new_tokens,
            **kwargs,
        )
    return speculative_generate(target, ids, draft_model=drafter, max_new_tokens=new_tokens, **kwargs)


def default_call(
    target, tokenizer, drafters: dict, tasks: list[str], prompts: int, new_tokens: int, repeats: int
) -> dict:
    """Tokens/s, speedup over ``target.generate`` and MAL of each drafter's default call, interleaved per prompt."""
    results = {}
    for task in tasks:
        items = build_tasks(task, count=prompts)
        times: dict[str, dict[int, list[float]]] = {name: {} for name in ["target-only", *drafters]}
        mal: dict[str, list[tuple[int, int]]] = {name: [] for name in drafters}
        identical = {name: True for name in drafters}
        new: dict[int, int] = {}
        for p, item in enumerate(items):
            ids = prompt_ids(tokenizer, item)
            reference = target.generate(ids, max_new_tokens=new_tokens, do_sample=False)  # warm-up and the reference
            new[p] = reference.shape[1] - ids.shape[1]
            for name, drafter in drafters.items():
                run(target, ids, drafter, new_tokens)  # warm-up
            for r in range(repeats):
                order = ["target-only", *drafters]
                order = order[r % len(order) :] + order[: r % len(order)]  # rotated: no method always runs first
                for name in order:
                    start = time.perf_counter()
                    if name == "target-only":
                        target.generate(ids, max_new_tokens=new_tokens, do_sample=False)
                    else:
                        out = run(target, ids, drafters[name], new_tokens, return_dict_in_generate=True)
                    times[name].setdefault(p, []).append(time.perf_counter() - start)
                    if name != "target-only" and r == 0:
                        identical[name] &= bool(torch.equal(out.sequences, reference))
                        steps = out.speculative_stats.steps
                        mal[name].append((sum(s.emitted for s in steps), len(steps)))
        base = {p: statistics.median(v) for p, v in times["target-only"].items()}
        task_result = {"target-only": {"tokens_per_second": round(sum(new.values()) / sum(base.values()), 2)}}
        for name in drafters:
            med = {p: statistics.median(v) for p, v in times[name].items()}
            emitted, forwards = map(sum, zip(*mal[name]))
            task_result[name] = {
                "tokens_per_second": round(sum(new.values()) / sum(med.values()), 2),
                "speedup": round(sum(base.values()) / sum(med.values()), 3),
                "mean_accepted_length": round(emitted / forwards, 3),
                "token_identical": identical[name],
            }
        results[task] = task_result
    return results


def plot(result: dict, path: str | Path) -> Path:
    """Three panels: the default call's speedup per task, agreement by draft step, and draft cost per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, agree, cost) = plt.subplots(1, 3, figsize=(16, 4.5))
    tasks = list(result["default_call"])
    names = [n for n in result["default_call"][tasks[0]] if n != "target-only"]
    width = 0.8 / len(tasks)
    for i, task in enumerate(tasks):
        speed.bar(
            [x + i * width for x in range(len(names))],
            [result["default_call"][task][n]["speedup"] for n in names],
            width,
            label=task,
        )
    speed.axhline(1.0, color="gray", lw=0.8)
    speed.set_xticks(
        [x + width * (len(tasks) - 1) / 2 for x in range(len(names))], names, rotation=35, ha="right", fontsize=8
    )
    speed.set_ylabel("speedup vs target.generate (default call)")
    speed.legend()
    for name, drafter in result["drafters"].items():
        agree.plot(
            range(1, len(drafter["agreement_by_step"]) + 1), drafter["agreement_by_step"], marker="o", label=name
        )
    agree.set_xlabel("draft step (given the earlier ones)")
    agree.set_ylabel("held-out greedy agreement")
    agree.set_xticks([1, 2, 3])
    agree.legend(fontsize=8)
    drafters = list(result["drafters"])
    cost.bar(drafters, [result["drafters"][n]["draft_step_ms"] for n in drafters])
    cost.set_ylabel(
        "ms per draft step (target forward: %.0f ms)" % result["drafters"][drafters[0]]["target_forward_ms"]
    )
    cost.tick_params(axis="x", rotation=35, labelsize=8)
    fig.suptitle(
        f"State-reading GLIDE ablation on SmolLM2-135M-Instruct ({result['machine']['cpu']}, "
        f"{result['machine']['threads']} threads)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heldout-store", required=True)
    parser.add_argument("--drafter", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--tasks", default="completion,chat")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--copy",
        type=int,
        default=0,
        metavar="N",
        help="also time each drafter with copy_from_context=N (GlideDraftingConfig), as NAME+copy",
    )
    parser.add_argument("--copy-names", help="with --copy: only these drafters (comma-separated NAMEs)")
    parser.add_argument(
        "--draft-dtype", default="bf16", choices=sorted(DRAFT_DTYPES), help="the drafters' (bf16: the default call's)"
    )
    parser.add_argument("--output", required=True)
    parser.add_argument("--plot", help="a PNG of the three panels")
    ns = parser.parse_args(argv)
    from hf_specdraft.defaults.smollm2 import load_smollm2

    torch.manual_seed(0)
    target, tokenizer = load_smollm2(dtype=torch.float32, device="cpu")
    drafters = {}
    for spec in ns.drafter:
        name, _, path = spec.partition("=")
        if not path:
            parser.error(f"--drafter must be NAME=DIR, got {spec!r}")
        drafters[name] = GlideForCausalLM.from_pretrained(path, dtype=DRAFT_DTYPES[ns.draft_dtype]).eval()
    source = StoreWindows(load_store(ns.heldout_store))
    result = {
        "drafters": {},
        "heldout_tokens": source.tokens,
        "machine": {
            "cpu": cpu_model(),
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "target_dtype": "float32",
            "draft_dtype": ns.draft_dtype,
        },
        "command": "python -m benchmarks.studies.state_glide " + " ".join(argv or __import__("sys").argv[1:]),
    }
    for name, glide in drafters.items():
        config = glide.config
        result["drafters"][name] = {
            "path": ns.drafter[list(drafters).index(name)].partition("=")[2],
            "layout": {
                "cross_attention": config.cross_attention,
                "state_input": getattr(config, "state_input", False),
                "self_attention": getattr(config, "self_attention", True),
                "layers": config.num_hidden_layers,
            },
            "agreement_by_step": agreement(target, glide, source),
            "alpha_step_1": teacher_forced_alpha(target, glide, source, delay=1, batch_size=4)[
                "alpha"
            ],  # vs the store's top-8: a lower bound
            **step_ms(target, glide),
        }
        print(name, result["drafters"][name], flush=True)
    timed = dict(drafters)
    if ns.copy:
        names = ns.copy_names.split(",") if ns.copy_names else list(drafters)
        timed.update({f"{name}+copy": (drafters[name], {"copy_from_context": ns.copy}) for name in names})
    tasks = [task for task in ns.tasks.split(",") if task]  # --tasks "": agreement and draft cost only
    result["default_call"] = default_call(
        target, tokenizer, timed, tasks, ns.num_prompts, ns.max_new_tokens, ns.repeats
    )
    print(json.dumps(result["default_call"], indent=1))
    Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.output).write_text(json.dumps(result, indent=1) + "\n")
    if ns.plot and result["default_call"]:
        plot(result, ns.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
