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
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from hf_specdraft.core.stats import overlap
from hf_specdraft.glide.training.evaluation import heldout_windows
from hf_specdraft.glide.training.objective import GlideBatch, TargetWindows
from hf_specdraft.glide.training.store import TOP_K, StoreWindows, target_answers
from hf_specdraft.glide.training.unrolled import glimpse_mask, unrolled_passes

SKIP = 16  # the first positions of a window have almost no context to glimpse


@torch.no_grad()
def draft_probs(glide, batch: GlideBatch, block_size: int | None = None, delay: int | None = None) -> torch.Tensor:
    """q `(B, T, V)` over the target's vocabulary on ``batch``'s windows, glimpsing its target KV with the block-wise
    mask of L = ``block_size`` (training's, §4.1) or a fixed cache ``delay``
    (:func:`~hf_specdraft.glide.training.unrolled.glimpse_mask`); nothing when the batch holds no KV. A ``state_input``
    GLIDE is scored at its first draft step, as the loop runs it."""
    if getattr(glide.config, "state_input", False):
        _, logits, _ = next(unrolled_passes(glide, batch, 1))
        return glide.to_target_logits(logits.float()).softmax(-1)
    mask, kv = None, batch.target_past_key_values
    # every layer empty: nothing to glimpse (None would read an attached target)
    if kv is None and glide.config.cross_attention:
        kv = [(None, None)] * glide.config.target_num_hidden_layers
    elif delay is not None and kv is not None:
        mask = glimpse_mask(batch.input_ids.shape[1], delay, device=batch.input_ids.device)
    logits = glide(
        input_ids=batch.input_ids,
        target_past_key_values=kv,
        use_cache=False,
        cross_attention_block_size=None if mask is not None else block_size,
        target_attention_mask=mask,
    ).logits
    return logits.float().softmax(-1)


@torch.no_grad()
def teacher_forced_alpha(
    target,
    glide,
    windows,
    block_size: int | None = None,
    batch_size: int = 8,
    *,
    delay: int | None = None,
    skip: int = 0,
    glimpse: bool = True,
) -> dict[str, float]:
    """α = mean Σ_x min(p, q) and greedy agreement of ``glide`` against ``target`` on held-out windows, teacher-forced:
    the package's held-out scorer (:func:`~hf_specdraft.glide.training.evaluation.teacher_forced_alpha`) with a fixed
    cache delay, a store's top-k and the first positions left out.

    Args:
        target: the frozen target (run over the windows; unused for a store).
        windows: `(N, T)` token windows, or a window source (:class:`~hf_specdraft.glide.training.store.StoreWindows`:
            p is the store's top k, unnormalised, so α is then a lower bound by the mass outside it).
        block_size: L of the block-wise mask GLIDE glimpses with (training's); ``delay`` instead: a fixed cache delay.
        skip: leave out each window's first ``skip`` positions (they have little context to glimpse).
        glimpse: `False` runs GLIDE with nothing to glimpse.

    Returns:
        ``{"alpha": mean Σ_x min(p, q), "greedy_agreement": mean [argmax q == argmax p], "eval_positions": count}``.
    """
    source = windows  # a window source as it is; `(N, T)` token windows the target runs over:
    if isinstance(windows, torch.Tensor):
        source = TargetWindows(windows.reshape(-1), windows.shape[-1], stride=windows.shape[-1])
    device = next(glide.parameters()).device
    with_kv = glimpse and glide.config.cross_attention
    alpha, agree, positions = torch.zeros((), device=device), torch.zeros((), device=device), 0
    for rows in torch.arange(len(source)).split(batch_size):
        batch = source.batch(target, glide, rows, device, with_kv, True)
        q = draft_probs(glide, batch, block_size, delay)[:, skip:]  # (B, T - skip, V)
        if batch.target_logits is not None:
            p = batch.target_logits.float().softmax(-1)[:, skip:]
            greedy = p.argmax(-1)
        else:
            p = q.new_zeros(q.shape).scatter_(-1, batch.topk_ids[:, skip:], batch.topk_probs[:, skip:])
            greedy = batch.topk_ids[:, skip:, 0]
        alpha += overlap(p, q).sum()
        agree += (q.argmax(-1) == greedy).sum()
        positions += q.shape[0] * q.shape[1]
    return {
        "alpha": round(alpha.item() / positions, 4),
        "greedy_agreement": round(agree.item() / positions, 4),
        "eval_positions": positions,
    }


def compute_store(
    target: PreTrainedModel,
    windows: torch.Tensor,
    layer_ids: list[int],
    top_k: int = TOP_K,
    batch_size: int = 8,
    progress_bar: bool = True,
) -> dict[str, torch.Tensor]:
    """A store in memory (no shards) of ``windows`` `(N, T)`, ``batch_size`` at a time: the tensors
    :func:`~hf_specdraft.glide.training.store.write_store` writes."""
    parts = [
        target_answers(target, windows[i : i + batch_size], layer_ids, top_k)
        for i in tqdm(range(0, len(windows), batch_size), desc="target answers", unit="batch", disable=not progress_bar)
    ]
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


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
    """α and greedy agreement of ``model`` on ``store``'s windows (:func:`teacher_forced_alpha` against the store's
    top-k), glimpsing the
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
