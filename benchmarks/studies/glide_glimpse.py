"""What GLIDE's glimpse of the target's KV cache is worth to the shipped drafters (glide_cape §4.1, Figure 4).

    python -m benchmarks.studies.glide_glimpse --output benchmarks/verification/cpu-glide-glimpse.json

Teacher-forced on held-out code windows (files of the corpus's held-out split: in no drafter's training data), so
the numbers isolate the draft from the decoding loop. Each cell is α = 1 - TV(p, q) against the target's top-k
next-token distribution p (the paper's acceptance rate, as the bench reports it) and the greedy agreement (the
draft's argmax is the target's), averaged over every position past the first ``skip``:

- **cache delay**: GLIDE glimpsing the target's keys up to ``j - d`` for the token at ``j``. In the loop the first
  drafted token sees the cache with delay d = 1, the γ-th with d = γ (§4.1's "KV cache delay"); ``no glimpse``
  runs GLIDE with nothing to attend to. The vanilla twin (same size and data, no cross-attention) is the baseline.
- **target layer** (``--layers``): which target layer GLIDE should read. For each layer the shipped GLIDE's
  cross-attention (``q_proj``, ``o_proj``) is re-initialised and the whole draft fine-tuned ``--steps`` steps on
  train-split windows reading that layer (the rest of its weights kept), then scored at delay 1; the vanilla twin
  is fine-tuned the same steps on the same windows. The paper reads the top layers (``l = N_T - N_D + m``).
"""

from __future__ import annotations

import argparse
import json

import torch
from tqdm.auto import tqdm
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from hf_specdraft.core.stats import overlap
from recipes.distillation import build_windows, target_answers

SKIP = 16  # the first positions of a window have almost no context to glimpse


def heldout_windows(tokenizer, num_windows: int, seq_len: int = 256) -> torch.Tensor:
    """``(num_windows, seq_len)`` windows of held-out code, cut as the distillation store cuts the train split."""
    from hf_specdraft.defaults.corpus import Corpus, build_corpus

    heldout = Corpus(train=build_corpus().heldout, heldout=[])
    windows = build_windows(tokenizer, num_windows, corpus=heldout, seq_len=seq_len, chat_fraction=0.0)
    if windows.shape[0] < num_windows:
        raise ValueError(f"the held-out split holds {windows.shape[0]} windows of {seq_len} tokens, fewer than --windows {num_windows}")
    return windows


def target_store(target, windows: torch.Tensor, layer_ids: list[int], batch_size: int = 8) -> dict[str, torch.Tensor]:
    """The distillation store's tensors (:func:`~recipes.distillation.target_answers`) for ``windows``, in memory."""
    parts = [target_answers(target, windows[i : i + batch_size], layer_ids)
             for i in tqdm(range(0, len(windows), batch_size), desc="target answers", unit="batch")]
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


def delay_mask(seq_len: int, delay: int) -> torch.Tensor:
    """`(1, 1, T, T)` additive mask: the query at j glimpses target keys ``k <= j - delay``."""
    index = torch.arange(seq_len)
    allowed = index[None, :] <= index[:, None] - delay
    return torch.zeros(seq_len, seq_len).masked_fill_(~allowed, torch.finfo(torch.float32).min)[None, None]


@torch.no_grad()
def draft_distribution(model, store: dict[str, torch.Tensor], delay: int | None = 1) -> torch.Tensor:
    """`(B, T, vocab_size)` the draft's next-token distribution q on ``store``'s windows, glimpsing the target keys
    ``k <= j - delay``; ``delay=None``: GLIDE with nothing to glimpse (the vanilla twin never glimpses)."""
    input_ids = store["input_ids"].long()
    kwargs = {}
    if model.config.cross_attention and delay is not None:
        layers = [(None, None)] * model.config.target_num_hidden_layers
        for i in model.config.target_layer_ids:
            layers[i] = (store[f"keys.{i}"].float(), store[f"values.{i}"].float())
        kwargs = {"target_past_key_values": layers, "target_attention_mask": delay_mask(input_ids.shape[1], delay)}
    hidden = model.model(input_ids=input_ids, use_cache=False, **kwargs).last_hidden_state
    return model.to_target_logits(model.lm_head(hidden).float()).softmax(-1)


def score(model, store: dict[str, torch.Tensor], delay: int | None = 1, skip: int = SKIP) -> dict[str, float]:
    """α and greedy agreement of ``model`` on ``store``'s windows (see :func:`draft_distribution` for ``delay``).

    Returns:
        ``{"alpha": mean 1 - TV(p, q), "agreement": mean [argmax q == argmax p]}`` over positions ``skip..``.
    """
    q = draft_distribution(model, store, delay)
    p = torch.zeros_like(q).scatter_(-1, store["topk_ids"].long(), store["topk_probs"].float())
    alpha = overlap(p, q)[:, skip:].mean().item()  # the loop's and train-glide's held-out α use the same overlap
    agreement = (q.argmax(-1) == store["topk_ids"][..., 0].long())[:, skip:].float().mean().item()
    return {"alpha": round(alpha, 4), "agreement": round(agreement, 4)}


def fine_tune(model, store: dict[str, torch.Tensor], steps: int, learning_rate: float = 1e-3, batch_size: int = 8,
              block_size: int = 5, seed: int = 0) -> float:
    """``steps`` steps of the shipped drafters' distillation loss on ``store``; returns the last loss.

    The loop of :func:`~recipes.smollm2_drafters.train_drafter` without its checkpoints (a few minutes)."""
    from recipes.smollm2_drafters import distillation_loss

    layer_ids = sorted(int(key.split(".")[1]) for key in store if key.startswith("keys."))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, 10, steps, min_lr_rate=0.1)
    model.train()
    for step in tqdm(range(steps), desc="fine-tune", unit="step"):
        index = torch.randint(0, store["input_ids"].shape[0], (batch_size,), generator=torch.Generator().manual_seed(seed + step))
        loss = distillation_loss(model, {k: v[index] for k, v in store.items()}, layer_ids, model.config.target_num_hidden_layers, block_size)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return round(loss.item(), 4)


def glimpse_rows(glide, vanilla, store, delays=(1, 2, 3, 4, 5)) -> dict[str, dict[str, float]]:
    """The cache-delay table: GLIDE at each delay and with no glimpse, the vanilla twin beside it."""
    rows = {f"glide, delay {d}": score(glide, store, d) for d in delays}
    rows["glide, no glimpse"] = score(glide, store, None)
    rows["vanilla"] = score(vanilla, store)
    return rows


def layer_rows(load_glide, load_vanilla, train_store, test_store, layers, steps: int, seed: int = 0) -> dict[str, dict]:
    """The target-layer table: a fine-tuned GLIDE reading each of ``layers``, and the vanilla twin fine-tuned alike.

    ``load_glide(layer)`` / ``load_vanilla()`` return fresh float32 copies of the shipped drafters."""
    vanilla = load_vanilla()
    rows = {"vanilla, shipped": score(vanilla, test_store)}
    last = fine_tune(vanilla, train_store, steps, seed=seed)
    rows["vanilla, fine-tuned"] = {**score(vanilla, test_store), "last_loss": last}
    for layer in layers:
        glide = load_glide(layer)
        cross = glide.model.layers[0].cross_attn
        torch.manual_seed(seed)
        torch.nn.init.normal_(cross.q_proj.weight, std=glide.config.initializer_range)
        torch.nn.init.zeros_(cross.o_proj.weight)  # the glimpse starts silent and is learnt again for this layer
        last = fine_tune(glide, train_store, steps, seed=seed)
        rows[f"glide, layer {layer}"] = {**score(glide, test_store), "last_loss": last}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="benchmarks/verification/cpu-glide-glimpse.json")
    parser.add_argument("--windows", type=int, default=24, help="held-out windows of 256 tokens scored")
    parser.add_argument("--layers", default="29,25,20,14", help="target layers for the fine-tuned comparison ('' skips it)")
    parser.add_argument("--steps", type=int, default=200, help="fine-tuning steps per drafter in the layer comparison")
    parser.add_argument("--train-windows", type=int, default=256, help="train-split windows the layer comparison fine-tunes on")
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
    from hf_specdraft.bench.harness import save_run

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
    test_store = target_store(target, heldout_windows(tokenizer, args.windows), read)
    body = {"glimpse": glimpse_rows(glide, load_vanilla(), test_store), "shipped_layer": glide.config.target_layer_ids}
    if layers:
        train_store = target_store(target, build_windows(tokenizer, args.train_windows), layers)
        body["layers"] = layer_rows(load_glide, load_vanilla, train_store, test_store, layers, args.steps)
    command = "python -m benchmarks.studies.glide_glimpse" + "".join(
        f" --{k.replace('_', '-')} {getattr(args, k)}" for k in ("output", "windows", "steps", "train_windows")) + f" --layers {args.layers}"
    save_run(bundle, args.output, command, body, prompts=f"{args.windows} held-out code windows of 256 tokens", skip=SKIP)
    print(json.dumps(body, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
