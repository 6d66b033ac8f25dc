"""What GLIDE's glimpse of the target's KV cache is worth to the shipped drafters (Du et al. 2024, §4.1, Figure 4).

    python -m benchmarks.studies.glide_glimpse --output benchmarks/verification/cpu-glide-glimpse.json

Teacher-forced on held-out code windows (files of the corpus's held-out split: in no drafter's training data), so
the numbers isolate the draft from the decoding loop. Each cell is α = 1 - TV(p, q) against the target's top-k
next-token distribution p (the paper's acceptance rate, as the bench reports it) and the greedy agreement (the
draft's argmax is the target's), averaged over every position past the first ``skip``:

- **cache delay**: GLIDE glimpsing the target's keys up to ``j - d`` for the token at ``j``. In the loop the first
  drafted token sees the cache with delay d = 1, the γ-th with d = γ (§4.1's "KV cache delay"); ``no glimpse``
  runs GLIDE with nothing to attend to. The vanilla twin (same size and data, no cross-attention) is the baseline.
- **target layer** (``--layers``): which target layer GLIDE should read. For each layer the shipped GLIDE's
  cross-attention (``q_proj``, ``o_proj``) is re-initialised and the whole draft fine-tuned ``--steps`` steps
  (:func:`~hf_specdraft.glide.train_glide` on a store) on train-split windows reading that layer (the rest of its
  weights kept), then scored at delay 1; the vanilla twin is fine-tuned the same steps on the same windows.
  The paper reads the top layers (``l = N_T - N_D + m``).
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch

from hf_specdraft.glide.training.evaluation import heldout_windows, teacher_forced_alpha
from hf_specdraft.glide.training.store import StoreWindows, compute_store

SKIP = 16  # the first positions of a window have almost no context to glimpse


def heldout_code(tokenizer, num_windows: int, seq_len: int = 256) -> torch.Tensor:
    """``(num_windows, seq_len)`` windows of held-out code: the held-out split's code files, chosen and tokenized as the
    distillation store's train windows are (:func:`~recipes.distillation.build_windows`), cut by the package's
    :func:`~hf_specdraft.glide.training.evaluation.heldout_windows`."""
    import random

    from hf_specdraft.defaults.corpus import build_corpus
    from recipes.distillation import code_stream, split_files

    files, _ = split_files(build_corpus().heldout, random.Random(0))
    stream = torch.tensor(code_stream(tokenizer, files, num_windows * seq_len), dtype=torch.long)
    windows = heldout_windows(stream, seq_len, num_windows)
    if windows.shape != (num_windows, seq_len):
        raise ValueError(
            f"the held-out split holds {stream.numel() // seq_len} windows of {seq_len} tokens, fewer than --windows "
            f"{num_windows}"
        )
    return windows


def score(model, store: dict[str, torch.Tensor], delay: int | None = 1, skip: int = SKIP) -> dict[str, float]:
    """α and greedy agreement of ``model`` on ``store``'s windows
    (:func:`~hf_specdraft.glide.training.evaluation.teacher_forced_alpha` against the store's top-k), glimpsing the
    target keys ``k <= j - delay``; ``delay=None``: GLIDE with nothing to glimpse (the vanilla twin never glimpses).

    Returns:
        ``{"alpha": mean 1 - TV(p, q), "agreement": mean [argmax q == argmax p]}`` over positions ``skip..``.
    """
    result = teacher_forced_alpha(None, model, StoreWindows(store), delay=delay, skip=skip, glimpse=delay is not None)
    return {"alpha": result["alpha"], "agreement": result["greedy_agreement"]}


def fine_tune(
    target,
    model,
    store: dict[str, torch.Tensor],
    steps: int,
    learning_rate: float = 1e-3,
    batch_size: int = 8,
    block_size: int = 5,
    seed: int = 0,
) -> float:
    """``steps`` steps of :func:`~hf_specdraft.glide.train_glide` on ``store`` (the shipped drafters' loss: the target's
    top-k alone), without saving its state; returns the last logged loss (the KL from the store's top-k)."""
    from hf_specdraft.glide import GlideTrainingArguments, train_glide

    source = StoreWindows(store)
    with tempfile.TemporaryDirectory() as output_dir:
        args = GlideTrainingArguments(
            output_dir,
            max_steps=steps,
            seq_len=source.seq_len,
            per_device_batch_size=batch_size,
            learning_rate=learning_rate,
            warmup_steps=10,
            block_size=block_size,
            distillation_weight=1.0,
            seed=seed,
            save_steps=0,
            resume=False,
            progress_bar=False,
        )
        log = train_glide(target, model, source, args)
    return log["steps"][-1]["loss"]


def glimpse_rows(glide, vanilla, store, delays=(1, 2, 3, 4, 5)) -> dict[str, dict[str, float]]:
    """The cache-delay table: GLIDE at each delay and with no glimpse, the vanilla twin beside it."""
    rows = {f"glide, delay {d}": score(glide, store, d) for d in delays}
    rows["glide, no glimpse"] = score(glide, store, None)
    rows["vanilla"] = score(vanilla, store)
    return rows


def layer_rows(
    target, load_glide, load_vanilla, train_store, test_store, layers, steps: int, seed: int = 0
) -> dict[str, dict]:
    """The target-layer table: a fine-tuned GLIDE reading each of ``layers``, and the vanilla twin fine-tuned alike.

    ``load_glide(layer)`` / ``load_vanilla()`` return fresh float32 copies of the shipped drafters."""
    vanilla = load_vanilla()
    rows = {"vanilla, shipped": score(vanilla, test_store)}
    last = fine_tune(target, vanilla, train_store, steps, seed=seed)
    rows["vanilla, fine-tuned"] = {**score(vanilla, test_store), "last_loss": last}
    for layer in layers:
        glide = load_glide(layer)
        cross = glide.model.layers[0].cross_attn
        torch.manual_seed(seed)
        torch.nn.init.normal_(cross.q_proj.weight, std=glide.config.initializer_range)
        torch.nn.init.zeros_(cross.o_proj.weight)  # the glimpse starts silent and is learnt again for this layer
        last = fine_tune(target, glide, train_store, steps, seed=seed)
        rows[f"glide, layer {layer}"] = {**score(glide, test_store), "last_loss": last}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="benchmarks/verification/cpu-glide-glimpse.json")
    parser.add_argument("--windows", type=int, default=24, help="held-out windows of 256 tokens scored")
    parser.add_argument(
        "--layers", default="29,25,20,14", help="target layers for the fine-tuned comparison ('' skips it)"
    )
    parser.add_argument("--steps", type=int, default=200, help="fine-tuning steps per drafter in the layer comparison")
    parser.add_argument(
        "--train-windows", type=int, default=256, help="train-split windows the layer comparison fine-tunes on"
    )
    args = parser.parse_args(argv)
    for name in ("windows", "steps", "train_windows"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    try:
        layers = [int(x) for x in args.layers.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--layers must be comma-separated integers, got {args.layers!r}")
    from hf_specdraft.defaults import load_default
    from hf_specdraft.defaults.loading import SMOLLM2_DRAFTERS_DIR
    from hf_specdraft.glide import GlideForCausalLM
    from benchmarks.studies import save_run

    bundle = load_default(dtype=torch.float32, device="cpu")
    target, tokenizer = bundle.target, bundle.tokenizer
    bad = [layer for layer in layers if not 0 <= layer < target.config.num_hidden_layers]
    if bad:
        parser.error(f"--layers must lie in [0, {target.config.num_hidden_layers}), got {bad}")

    def load_glide(layer=None):
        extra = {} if layer is None else {"target_layer_ids": [layer]}
        return GlideForCausalLM.from_pretrained(SMOLLM2_DRAFTERS_DIR / "glide", dtype=torch.float32, **extra).eval()

    def load_vanilla():
        return GlideForCausalLM.from_pretrained(SMOLLM2_DRAFTERS_DIR / "vanilla", dtype=torch.float32).eval()

    glide = load_glide()
    read = sorted({*glide.config.target_layer_ids, *layers})
    test_store = compute_store(target, heldout_code(tokenizer, args.windows), read)
    body = {"glimpse": glimpse_rows(glide, load_vanilla(), test_store), "shipped_layer": glide.config.target_layer_ids}
    if layers:
        from recipes.distillation import build_windows

        train_store = compute_store(target, build_windows(tokenizer, args.train_windows), layers)
        body["layers"] = layer_rows(target, load_glide, load_vanilla, train_store, test_store, layers, args.steps)
    command = (
        "python -m benchmarks.studies.glide_glimpse"
        + "".join(
            f" --{k.replace('_', '-')} {getattr(args, k)}" for k in ("output", "windows", "steps", "train_windows")
        )
        + f" --layers {args.layers}"
    )
    save_run(
        bundle, args.output, command, body, prompts=f"{args.windows} held-out code windows of 256 tokens", skip=SKIP
    )
    print(json.dumps(body, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
