"""Issue #49's pair, the state-reading GLIDE and its vanilla twin, trained for the embedded default in one call of a lent GPU.

    bash benchmarks/gpu/run.sh train                                          # there, after the wheels and the GGUF parts
    python -m benchmarks.gpu.train_default --output DIR --seconds 480         # the step itself
    python -m benchmarks.gpu.train_default --output /tmp/t --device cpu --seconds 240 --windows 16 --self-generated 4 \\
        --heldout-windows 2 --batch 2                                         # mechanics, here

The recipe is the CPU study's (``benchmarks/verification/state-glide-corpus/train.sh``: the ``glide-state`` and
``vanilla`` kinds of :mod:`recipes.smollm2_drafters`, warm-started from the shipped pair, trained by
:func:`~recipes.smollm2_drafters.train_drafter` through :func:`~hf_specdraft.glide.train_glide`), with the store replaced
by the target itself: it runs on the device every step (bf16), over windows of 384 tokens (the bench prompts' length)
drawn from the train split of the local Python corpus (code, 15 % chat requests) and from the target's own greedy
continuations of train-split prompts, weighted 3× (written here first, on the device: seconds). The loss is KL from the
target's whole next-token distribution (token-level distillation, glide_cape Appendix B). Both drafters get the same
windows and the same number of steps: as many as fit the seconds left after one timed probe step of each.

Scored as the CPU table is (:func:`benchmarks.studies.state_glide.agreement`): greedy agreement at draft steps 1, 2 and 3,
each conditional on the earlier ones, teacher-forced on the target's own greedy text for 48 held-out prompts, the target in
fp32; the shipped pair is scored beside them. Those 35 windows are the CPU table's, carried in ``heldout-windows.safetensors``
(``python -m recipes.distillation DIR --self-generated 48 --heldout --max-new-tokens 160 --seq-len 384`` on the CPU VM: the
corpus's split depends on the machine's Python and packages, so the GPU machine would draw other prompts). What comes back (``--output``, the call's ``$OUT``: at most 8 files of 16 MiB): the JSON
and each bf16 checkpoint (config, weights, card, training log) as ``<kind>.tar`` cut into parts under 16 MiB
(``cat <kind>.tar.part* | tar x``). ``--work`` holds the fp32 runs (under /tmp: it stays on the machine).
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

KINDS = ("glide-state", "vanilla")  # the new GLIDE, and its twin on the same data and steps
SHIPPED = Path(__file__).resolve().parents[2] / "hf_specdraft" / "defaults" / "checkpoint_smollm2"
SEQ_LEN = 384  # the bench's prompts are about this long (the CPU corpus store's windows)
PART_BYTES = 15 * 1024 * 1024  # a file back from the device is at most 16 MiB
SELF_WEIGHT = 3  # the target's own text, repeated in the mix (the CPU study's --extra-weight)
# the CPU table's held-out windows, carried: the corpus's split depends on the machine's Python and packages
HELDOUT = Path(__file__).with_name("heldout-windows.safetensors")


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


def training_stream(target, tokenizer, windows: int, self_generated: int) -> torch.Tensor:
    """The training tokens, flat: ``windows`` corpus windows, then the target's text for ``self_generated`` train-split
    prompts (128 new tokens each) :data:`SELF_WEIGHT` times."""
    from recipes.distillation import build_windows, self_distillation_prompts, self_generated_windows

    corpus = build_windows(tokenizer, windows, seq_len=SEQ_LEN).reshape(-1)
    own = self_generated_windows(target, tokenizer, self_distillation_prompts(tokenizer, self_generated), max_new_tokens=128,
                                 batch_size=128, seq_len=SEQ_LEN).reshape(-1)
    return torch.cat([corpus, *[own] * SELF_WEIGHT])


def train(kind: str, target, source, work: Path, steps: int, batch: int, save: bool = True):
    """One drafter of ``kind`` trained ``steps`` steps on ``source`` from the shipped weights; (model, log, seconds)."""
    from recipes.smollm2_drafters import DATASET, RECIPES, WARM_START, train_drafter

    args = dataclasses.replace(RECIPES[kind], output_dir=str(work / "state" / kind), max_steps=steps, per_device_batch_size=batch,
                               learning_rate=5e-4, warmup_steps=max(2, steps // 20), save_steps=0, resume=False, progress_bar=False,
                               logging_steps=max(1, steps // 50), dataset_name=DATASET.replace("labels = the target's top-8",
                                                                                                "labels = the target's whole"))
    init_from = SHIPPED / kind if (SHIPPED / kind / "config.json").is_file() else SHIPPED / WARM_START[kind]
    started = time.perf_counter()
    model, log = train_drafter(kind, target, source, args, init_from=init_from)
    log["init_from"] = f"the shipped {init_from.name} (hf_specdraft/defaults/checkpoint_smollm2/{init_from.name})"
    return model, log, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="the JSON and the packed checkpoints (the call's $OUT)")
    parser.add_argument("--work", default="/tmp/glide-gpu", help="the fp32 training runs")
    parser.add_argument("--seconds", type=float, default=480, help="the whole step's budget (a call allows 600)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--windows", type=int, default=20000, help="train-split corpus windows of 384 tokens")
    parser.add_argument("--self-generated", type=int, default=2048, help="train-split prompts the target continues (128 tokens)")
    parser.add_argument("--heldout-windows", type=int, default=35, help="how many of the 35 held-out windows are scored")
    parser.add_argument("--batch", type=int, default=32, help="windows per step")
    args = parser.parse_args(argv)
    for name in ("seconds", "windows", "self_generated", "heldout_windows", "batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    started = time.perf_counter()
    from hf_specdraft.bench.harness import cpu_model
    from hf_specdraft.defaults.smollm2 import HUB_ID, load_smollm2
    from hf_specdraft.glide import GlideForCausalLM
    from hf_specdraft.glide.model_card import save_glide_checkpoint
    from hf_specdraft.glide.objective import TargetWindows
    from recipes.drafters import LICENSE
    from recipes.smollm2_drafters import DATASET

    from benchmarks.studies.state_glide import agreement

    output, work = Path(args.output), Path(args.work)
    output.mkdir(parents=True, exist_ok=True)
    cuda = args.device == "cuda"
    target, tokenizer = load_smollm2(dtype=torch.bfloat16 if cuda else torch.float32, device=args.device)
    scorer = load_smollm2(dtype=torch.float32, device=args.device)[0] if cuda else target  # the CPU table's fp32 target
    heldout = heldout_windows(args.heldout_windows)
    test = TargetWindows(heldout.reshape(-1), SEQ_LEN, stride=SEQ_LEN)
    source = TargetWindows(training_stream(target, tokenizer, args.windows, args.self_generated), SEQ_LEN)
    data_seconds = time.perf_counter() - started

    def score(model) -> list[float]:
        return agreement(scorer, model.to(args.device, torch.float32).eval(), test, batch_size=8, device=args.device)

    result = {"meta": {"device": torch.cuda.get_device_name() if cuda else f"CPU: {cpu_model()}", "target_dtype": str(target.dtype),
                       "scored_with": "target and drafters in float32", "versions": {"torch": torch.__version__}, "seq_len": SEQ_LEN, "batch": args.batch,
                       "command": " ".join(["python -m benchmarks.gpu.train_default", *(sys.argv[1:] if argv is None else argv)]),
                       "train_tokens_available": source.tokens, "heldout_tokens": heldout.numel(),
                       "heldout": f"{len(heldout)} windows of the CPU table's held-out text (the target's greedy text for 48 held-out prompts)",
                       "data_seconds": round(data_seconds, 1)},
              "shipped": {kind: score(GlideForCausalLM.from_pretrained(SHIPPED / name, dtype=torch.float32))
                          for kind, name in (("glide", "glide"), ("vanilla", "vanilla"))}}
    probe = {kind: train(kind, target, source, work / "probe", 2, args.batch)[2] / 2 for kind in KINDS}  # warm-up included
    left = args.seconds - (time.perf_counter() - started) - 90  # scoring, saving and packing
    steps = max(2, int(left / sum(probe.values())))
    result["meta"].update(probe_seconds_per_step={kind: round(s, 3) for kind, s in probe.items()}, steps=steps,
                          tokens_per_drafter=steps * args.batch * SEQ_LEN)
    for kind in KINDS:
        model, log, seconds = train(kind, target, source, work, steps, args.batch)
        result[kind] = {"agreement_by_step": score(model), "train_seconds": round(seconds, 1), "final_loss": log["steps"][-1]}
        checkpoint = save_glide_checkpoint(model.cpu().to(torch.bfloat16), work / kind, target_name=HUB_ID,
                                           card_info={"dataset": DATASET, "training_log": log, "license": LICENSE})
        (checkpoint / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
        result[kind]["files"] = pack(checkpoint, output, kind)
        (output / "train-default.json").write_text(json.dumps(result, indent=1) + "\n")
        print(kind, {k: v for k, v in result[kind].items() if k != "files"}, flush=True)
    print("shipped", result["shipped"], f"{time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
