"""GLIDE and its vanilla twin, trained for the embedded default in one run on a CUDA machine.

    bash benchmarks/gpu/run.sh train                                          # on the GPU, with the wheels and the GGUF
    python -m benchmarks.gpu.train_default --output DIR --seconds 480         # the step itself
    python -m benchmarks.gpu.train_default --output /tmp/t --device cpu --seconds 900 --windows 16 --self-generated 4 \\
        --requests 4 --written 4 --heldout-windows 2 --group-prompts 1 --batch 2      # mechanics, on a CPU

The recipe is the CPU retrain's (``benchmarks/verification/nl-drafters/README.md``: the ``glide`` and ``vanilla``
kinds of :mod:`recipes.smollm2_drafters`, warm-started from the shipped pair, trained by
:func:`~recipes.smollm2_drafters.train_drafter` through :func:`~hf_specdraft.glide.train_glide`; ``--kinds
glide-state,vanilla`` trains the state-reading GLIDE instead), with the store replaced by the target itself: it runs
on the device every step, over windows of 384 tokens (the bench prompts' length) drawn from the target's greedy
answers to requests of the seven groups people send a chat model (conversation with a follow-up turn, translation,
summaries, questions, arithmetic, questions about a passage, code), both templated (:mod:`recipes.requests`) and
written by the target itself (sampled, then answered greedily: :func:`recipes.distillation.written_requests`), from
the train split of the local Python corpus (code, 15 % chat requests) and from the target's own greedy continuations
of train-split prompts, all written first, on the device, kept under ``--work`` batch by batch (a rerun resumes).
The loss is KL from the target's whole next-token distribution (token-level distillation, Du et al. 2024, Appendix B).
Both drafters get the same windows and the same number of steps: as many as fit the seconds left after a timed probe
of each (4 steps). Both train in fp32 against the fp32 target (TF32 products on CUDA; bf16 autocast is
untested there with GLIDE's masks).

Scored two ways, the shipped pair beside the new one, the target in fp32: per group on the project's held-out
requests (:mod:`benchmarks.studies.group_agreement`, teacher-forced: step 1, and steps 1-3 each given the earlier ones,
on the target's greedy 64-token answers to the first ``--group-prompts`` requests of each group), and as the CPU code
table is (:func:`benchmarks.studies.state_glide.agreement`: steps 1-3 teacher-forced on the target's own greedy text
for 48 held-out prompts). Those 35 windows are the CPU table's, kept in ``heldout-windows.safetensors``
(``python -m recipes.distillation DIR --self-generated 48 --heldout --max-new-tokens 160 --seq-len 384`` on the CPU
VM: the corpus's split depends on the machine's Python and packages, so the GPU machine would draw other prompts).

What it writes (``--output``: at most 8 files, each under 16 MiB): the JSON and each bf16 checkpoint (config, weights,
card, training log) as ``<kind>.tar`` cut into parts under 16 MiB (``cat <kind>.tar.part* | tar x``). ``--work`` holds
the fp32 runs (under /tmp: it stays on the machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import sys
import tarfile
import time
from pathlib import Path

import torch

KINDS = ("glide", "vanilla")  # the shipped pair's layouts: GLIDE, and its twin on the same data and steps
SHIPPED = Path(__file__).resolve().parents[2] / "hf_specdraft" / "defaults" / "checkpoint_smollm2"
SEQ_LEN = 384  # the bench's prompts are about this long (the CPU corpus store's windows)
PART_BYTES = 15 * 1024 * 1024  # a file back from the device is at most 16 MiB
SELF_WEIGHT = 3  # the target's own text, repeated in the mix (the CPU study's --extra-weight)
# the CPU table's held-out windows, kept here: the corpus's split depends on the machine's Python and packages
HELDOUT = Path(__file__).with_name("heldout-windows.safetensors")
GROUP_PROMPTS = SHIPPED.parent / "spec_prompts.jsonl"  # the project's held-out requests of seven groups
PROBE_STEPS = 4  # a timed run's steps; its first (CUDA's warm-up) is left out
DATASET = (
    "the target's greedy answers to {requests} templated requests of seven groups (recipes/requests.py: project-"
    "written templates and train-split docstrings, no evaluation set) and to {written} requests it wrote itself "
    "(sampled at temperature 0.6), the train split of the local Python corpus on the GPU "
    "machine (stdlib + installed dependencies; 15 % as chat requests in SmolLM2's template), 384-token windows, and "
    f"the target's own greedy continuations of {{prompts}} train-split prompts; the target's texts {SELF_WEIGHT}x; "
    "labels = the target's whole next-token distribution, computed on the fly"
)


def pack(checkpoint: Path, output: Path, name: str) -> list[str]:
    """``checkpoint``'s files as one tar, written to ``output`` in parts of at most :data:`PART_BYTES`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(checkpoint, arcname=name)
    data = buffer.getvalue()
    parts = []
    for n, start in enumerate(range(0, len(data), PART_BYTES)):
        part = output / f"{name}.tar.part{n}"
        part.write_bytes(data[start : start + PART_BYTES])
        parts.append(part.name)
    return parts


def heldout_windows(count: int | None = None) -> torch.Tensor:
    """`(N, 384)`: the CPU table's held-out windows (:data:`HELDOUT`), the first ``count`` of them (all: `None`)."""
    from safetensors.torch import load_file

    return load_file(str(HELDOUT))["input_ids"][:count]


def training_stream(
    target, tokenizer, windows: int, self_generated: int, requests: int, written: int, work: Path
) -> torch.Tensor:
    """The training tokens, flat: ``windows`` corpus windows, the target's text for ``self_generated`` train-split
    prompts (128 new tokens each), its answers to ``requests`` templated requests
    (:func:`recipes.requests.training_requests`, seed 0, 128 new tokens a turn, kept under ``work/answers``) and to
    ``written`` requests it wrote itself (seed 3, kept under ``work/written`` and ``work/written-answers``), the
    target's texts each :data:`SELF_WEIGHT` times."""
    from recipes.distillation import (
        answered_requests,
        build_windows,
        request_windows,
        self_distillation_prompts,
        self_generated_windows,
        written_requests,
    )
    from recipes.requests import training_requests

    corpus = build_windows(tokenizer, windows, seq_len=SEQ_LEN).reshape(-1)
    own = self_generated_windows(
        target,
        tokenizer,
        self_distillation_prompts(tokenizer, self_generated),
        max_new_tokens=128,
        batch_size=128,
        seq_len=SEQ_LEN,
    ).reshape(-1)
    parts = [corpus, *[own] * SELF_WEIGHT]
    asked = {"answers": training_requests(requests) if requests else []}
    if written:
        asked["written-answers"] = written_requests(target, tokenizer, written, 3, work / "written", batch_size=128)
    for folder, chosen in asked.items():
        if chosen:
            records = answered_requests(target, tokenizer, chosen, work / folder, batch_size=128)
            parts += [request_windows(records, tokenizer.eos_token_id, SEQ_LEN).reshape(-1)] * SELF_WEIGHT
    return torch.cat(parts)


def train(kind: str, target, source, work: Path, steps: int, batch: int, dataset: str, learning_rate: float = 5e-4):
    """One drafter of ``kind`` trained ``steps`` steps on ``source`` from the shipped weights (fp32: TF32 matrix
    products on CUDA, no bf16 autocast); returns the model and its training log (with the stages it started from)."""
    from recipes.smollm2_drafters import RECIPES, earlier_checkpoint, earlier_stages, train_drafter

    args = dataclasses.replace(
        RECIPES[kind],
        output_dir=str(work / kind),
        max_steps=steps,
        per_device_batch_size=batch,
        learning_rate=learning_rate,
        warmup_steps=max(2, steps // 20),
        save_steps=0,
        resume=False,
        progress_bar=False,
        logging_steps=1 if steps <= PROBE_STEPS else max(1, steps // 50),
        mixed_precision="no",
        dataset_name=dataset,
    )
    init_from = earlier_checkpoint(SHIPPED, kind)
    model, log = train_drafter(kind, target, source, args, init_from=init_from)
    log["earlier_stages"] = earlier_stages(json.loads((init_from / "training_log.json").read_text()))
    log["init_from"] = f"the shipped {init_from.name} (hf_specdraft/defaults/checkpoint_smollm2/{init_from.name})"
    return model, log


def step_cost(kind: str, target, source, work: Path, batch: int, dataset: str, lr: float) -> tuple[float, float]:
    """(seconds per step, seconds of a run's fixed cost: loading, building, saving) of ``kind``, from a short run whose
    first step (CUDA's warm-up) is left out of the per-step time."""
    started = time.perf_counter()
    _, log = train(kind, target, source, work, PROBE_STEPS, batch, dataset, lr)
    wall, seen = time.perf_counter() - started, log["steps"]
    per_step = (seen[-1]["seconds"] - seen[0]["seconds"]) / max(len(seen) - 1, 1)
    return per_step, max(wall - per_step * PROBE_STEPS, 0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output", required=True, help="the JSON and the packed checkpoints (run.sh passes $OUT or its results folder)"
    )
    parser.add_argument("--work", default="/tmp/glide-gpu", help="the fp32 training runs")
    parser.add_argument(
        "--seconds",
        type=float,
        default=480,
        help="seconds the whole step may run (run.sh passes what is left of CALL_SECONDS)",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--windows", type=int, default=2000, help="train-split corpus windows of 384 tokens")
    parser.add_argument(
        "--self-generated", type=int, default=1024, help="train-split prompts the target continues (128 tokens)"
    )
    parser.add_argument(
        "--requests", type=int, default=2048, help="templated requests of seven groups the target answers (0: none)"
    )
    parser.add_argument(
        "--written", type=int, default=2048, help="requests the target writes itself, then answers (0: none)"
    )
    parser.add_argument(
        "--group-prompts", type=int, default=3, help="held-out requests of each group scored per group (0: all)"
    )
    parser.add_argument("--kinds", default=",".join(KINDS), help="the drafters trained, comma-separated")
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument(
        "--heldout-windows", type=int, default=35, help="how many of the 35 held-out windows are scored"
    )
    parser.add_argument("--batch", type=int, default=32, help="windows per step")
    args = parser.parse_args(argv)
    for name in ("seconds", "windows", "self_generated", "heldout_windows", "batch", "learning_rate"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("requests", "written", "group_prompts"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 or positive, got {getattr(args, name)}")
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    allowed = ("glide", "vanilla", "glide-state")
    if not kinds or any(k not in allowed for k in kinds):
        parser.error(f"--kinds must list some of {', '.join(allowed)}, got {args.kinds!r}")
    started = time.perf_counter()
    from hf_specdraft import write_glide_custom_generate
    from hf_specdraft.bench.harness import cpu_model
    from hf_specdraft.defaults.smollm2 import HUB_ID, load_smollm2
    from hf_specdraft.glide import GlideForCausalLM
    from hf_specdraft.glide.model_card import save_glide_checkpoint
    from hf_specdraft.glide.training.objective import TargetWindows
    from recipes.drafters import LICENSE

    from benchmarks.studies.group_agreement import answers, first_of_each, read_prompts
    from benchmarks.studies.group_agreement import score as group_scores
    from benchmarks.studies.state_glide import agreement

    output, work = Path(args.output), Path(args.work)
    dataset = DATASET.format(
        prompts=f"{args.self_generated:,}", requests=f"{args.requests:,}", written=f"{args.written:,}"
    )
    output.mkdir(parents=True, exist_ok=True)
    cuda = args.device == "cuda"
    # fp32, as the shipped pair's stores and the CPU default: TF32 products while training, exact fp32 while scoring
    target, tokenizer = load_smollm2(dtype=torch.float32, device=args.device)
    heldout = heldout_windows(args.heldout_windows)
    test = TargetWindows(heldout.reshape(-1), SEQ_LEN, stride=SEQ_LEN)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cuda
    source = TargetWindows(
        training_stream(target, tokenizer, args.windows, args.self_generated, args.requests, args.written, work),
        SEQ_LEN,
    )
    answered = answers(target, tokenizer, first_of_each(read_prompts(GROUP_PROMPTS), args.group_prompts), 64)

    def score(checkpoint: Path) -> dict:
        """Agreement of a saved bf16 checkpoint loaded in fp32 (shipped pair and new one alike), fp32 products: per
        group on the held-out requests, and at steps 1-3 on the code table's windows."""
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        model = GlideForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(args.device).eval()
        scores = {
            "groups": group_scores(target, model, answered, 64, loop=False),
            "code_windows_by_step": agreement(target, model, test, batch_size=8, device=args.device),
        }
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = cuda
        return scores

    def write() -> None:
        (output / "train-default.json").write_text(json.dumps(result, indent=1) + "\n")

    result = {
        "meta": {
            "device": torch.cuda.get_device_name() if cuda else f"CPU: {cpu_model()}",
            "target_dtype": "float32",
            "matmul": "TF32 while training on CUDA, fp32 while scoring",
            "drafters_trained_in": "float32 (no autocast)",
            "scored_with": "each bf16 checkpoint loaded in float32, the target in float32",
            "versions": {"torch": torch.__version__},
            "seq_len": SEQ_LEN,
            "batch": args.batch,
            "dataset": dataset,
            "command": " ".join(["python -m benchmarks.gpu.train_default", *(sys.argv[1:] if argv is None else argv)]),
            "train_tokens_available": source.tokens,
            "heldout_tokens": heldout.numel(),
            "heldout": f"{len(heldout)} windows of the CPU table's held-out text "
            "(the target's greedy text for 48 held-out prompts)",
            "data_seconds": round(time.perf_counter() - started, 1),
        },
        "shipped": {kind: score(SHIPPED / kind) for kind in ("glide", "vanilla")},
    }
    write()  # a run killed later still has the baseline
    lr = args.learning_rate
    costs = {kind: step_cost(kind, target, source, work / "probe", args.batch, dataset, lr) for kind in kinds}
    # 60: scoring, packing
    left = args.seconds - (time.perf_counter() - started) - 60 - sum(fixed for _, fixed in costs.values())
    steps = max(int(left / sum(per_step for per_step, _ in costs.values())), 0)
    result["meta"].update(
        probe={
            kind: {"seconds_per_step": round(c[0], 4), "fixed_seconds": round(c[1], 1)} for kind, c in costs.items()
        },
        steps=steps,
        tokens_per_drafter=steps * args.batch * SEQ_LEN,
    )
    write()
    if steps < PROBE_STEPS:
        print(
            f"only {steps} steps fit the {args.seconds:.0f} s left after the data and the probes: nothing trained",
            flush=True,
        )
        return 1
    for kind in kinds:
        run_started = time.perf_counter()
        model, log = train(kind, target, source, work, steps, args.batch, dataset, lr)
        checkpoint = save_glide_checkpoint(
            model.cpu().to(torch.bfloat16),
            work / f"{kind}-bf16",
            target_name=HUB_ID,
            card_info={"dataset": dataset, "training_log": log, "license": LICENSE},
            custom_generate=write_glide_custom_generate,
        )
        (checkpoint / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
        result[kind] = {
            "agreement": score(checkpoint),
            "train_seconds": log["train_seconds"],
            "wall_seconds": round(time.perf_counter() - run_started, 1),
            "last_logged_step": log["steps"][-1],
            "files": pack(checkpoint, output, kind),
        }
        write()
        print(kind, {k: v for k, v in result[kind].items() if k != "files"}, flush=True)
    print("shipped", result["shipped"], f"{time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
