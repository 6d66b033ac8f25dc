"""GLIDE and its vanilla twin trained for the embedded default within one call of a lent GPU (issue #42).

    bash benchmarks/gpu/run.sh train                                      # there, after the wheels and the GGUF parts
    python -m benchmarks.gpu.train_default --output DIR --seconds 480     # the step itself
    python -m benchmarks.gpu.train_default --output /tmp/t --device cpu --seconds 60 --windows 64 --heldout 2   # mechanics

No store: the frozen target runs on the device every step (:func:`~hf_specdraft.glide.trainer.train_glide`, bf16 mixed
precision on CUDA), over train-split windows of the local Python corpus (code and 15 % chat requests: the text the CPU
drafters' stores were cut from, :func:`~recipes.distillation.build_windows`), with token-level
distillation from the target's logits (glide_cape Appendix B). A probe of a few steps times one step; GLIDE and then
its twin each get the steps that fit in half the seconds left (the cosine schedule spans exactly those steps: as many
tokens as fit). Both are scored teacher-forced on the held-out code windows :mod:`~benchmarks.studies.glide_gap_curve`
scores (α = 1 - TV(p, q), greedy agreement, GLIDE at a delay of 1), so the numbers sit beside the CPU curve's. The
checkpoints (safetensors, card, training log) and ``train-default.json`` go to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def build(target, vanilla: bool):
    """A generic GLIDE for ``target`` (what ``hf-specdraft train-glide`` builds: one layer, the target's width and
    vocabulary), or its twin without cross-attention."""
    from hf_specdraft.glide import GlideConfig, GlideForCausalLM

    torch.manual_seed(0)
    config = GlideConfig.from_target_config(target.config, num_hidden_layers=1, cross_attention=not vanilla)
    return GlideForCausalLM(config)


def train(target, stream, output: Path, steps: int, vanilla: bool, device: str, batch: int) -> dict:
    from hf_specdraft.glide.trainer import GlideTrainingArguments, train_glide

    args = GlideTrainingArguments(str(output), max_steps=steps, per_device_batch_size=batch, learning_rate=1e-3,
                                  warmup_steps=max(2, steps // 20), distillation_weight=0.9, save_steps=0, resume=False,
                                  progress_bar=False, dataset_name="train split of the local Python corpus (code, 15 % chat)")
    glide = build(target, vanilla)
    started = time.perf_counter()
    log = train_glide(target, glide, stream, args)
    return {"model": glide, "steps": steps, "tokens": steps * batch * args.seq_len, "train_seconds": log["train_seconds"],
            "wall_seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--seconds", type=float, default=480, help="the whole step's budget (a call allows 600)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--windows", type=int, default=20000, help="train-split windows of 256 tokens to draw from")
    parser.add_argument("--heldout", type=int, default=64, help="held-out code windows scored")
    parser.add_argument("--batch", type=int, default=32, help="windows per step")
    args = parser.parse_args(argv)
    for name in ("seconds", "windows", "heldout", "batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    started = time.perf_counter()
    from hf_specdraft.bench.harness import cpu_model
    from hf_specdraft.defaults.smollm2 import load_smollm2

    from benchmarks.studies.glide_glimpse import heldout_code, score
    from hf_specdraft.glide.store import compute_store
    from recipes.distillation import build_windows

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_smollm2(dtype=torch.bfloat16 if args.device == "cuda" else torch.float32, device=args.device)
    stream = build_windows(tokenizer, args.windows).reshape(-1)
    layer = target.config.num_hidden_layers - 1
    test = {k: v.cpu() for k, v in compute_store(target, heldout_code(tokenizer, args.heldout).to(target.device), [layer]).items()}
    probe = train(target, stream, output / "probe", 3, False, args.device, args.batch)
    per_step = probe["wall_seconds"] / 3
    left = args.seconds - (time.perf_counter() - started) - 60  # scoring and saving
    steps = max(3, int(left / 2 / per_step))
    result = {"meta": {"device": torch.cuda.get_device_name() if args.device == "cuda" else f"CPU: {cpu_model()}",
                       "versions": {"torch": torch.__version__}, "command": " ".join(["python -m benchmarks.gpu.train_default", *(argv or [])]),
                       "seconds_per_step_probe": round(per_step, 3), "batch": args.batch, "seq_len": 256,
                       "heldout": f"{args.heldout} held-out code windows, positions 16..; GLIDE at delay 1"}}
    for kind, vanilla in (("glide", False), ("vanilla", True)):
        run = train(target, stream, output / kind, steps, vanilla, args.device, args.batch)
        model = run.pop("model").float().cpu().eval()
        result[kind] = {**run, **score(model, test)}
        (output / "train-default.json").write_text(json.dumps(result, indent=1) + "\n")
        print(kind, result[kind], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
