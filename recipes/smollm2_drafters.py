"""Drafters for the real default target (SmolLM2-135M-Instruct), trained on this CPU from a distillation store.

Three drafters share one shape family, one store (:mod:`.distillation`) and one loss, so comparisons isolate
what differs:

- ``glide``: GLIDE (glide_cape §4.1), one layer as wide as the target (576), cross-attending to the target's
  top layer (``l = N_T - N_D + m`` = 29) with the block-wise training mask (L = 5);
- ``vanilla``: its twin without cross-attention (§5.2, Figure 4) — also the project's plain draft model
  (speculative decoding, CAPE on a draft, the cascade's first draft);
- ``small``: a narrower MLP and a smaller vocabulary, the cascade's second draft (CS Drafting §3.1).

Vocabulary (measured, see the README): SmolLM2's 49,152 × 576 LM head alone costs ~13 ms on this CPU,
an eighth of a target forward, so each draft scores a reduced vocabulary — the target ids the target itself
predicts most often in the store (FR-Spec / EAGLE-3), scattered back to the full vocabulary — and its
embedding rows start from the target's (tied) embedding rows of those ids.

Loss: cross-entropy against the target's renormalised top-k next-token distribution (token-level distillation,
glide_cape Appendix B's cheaper form): the drafts learn what the target says, which greedy acceptance rewards.
Training is resumable: a checkpoint (weights + optimizer + step) every ``checkpoint_every`` steps.

    # stage 1 on the corpus store; stage 2 from its weights, 600 steps, on the corpus store plus two stores of the
    # target's own text, each 3x (distillation.py's docstring builds them); stage 3 (what ships for glide and
    # vanilla) 900 more steps on the same mix at a lower peak learning rate
    python -m recipes.smollm2_drafters /work/store/smollm2 /work/drafters --kinds glide,vanilla
    python -m recipes.smollm2_drafters /work/store/smollm2 /work/drafters3 --kinds glide,vanilla \
        --init-from /work/drafters --extra-store /work/store/selfgen --extra-store /work/store/selfgen2 --extra-weight 3 --steps 600
    python -m recipes.smollm2_drafters /work/store/smollm2 /work/drafters4 --kinds glide,vanilla \
        --init-from /work/drafters3 --extra-store /work/store/selfgen --extra-store /work/store/selfgen2 --extra-weight 3 \
        --steps 900 --learning-rate 3e-4
    python -m recipes.smollm2_drafters /work/store/smollm2 /work/drafters2 --kinds small \
        --extra-store /work/store/selfgen --extra-weight 4
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, get_cosine_with_min_lr_schedule_with_warmup

from hf_specdraft.glide import GlideConfig, GlideForCausalLM
from hf_specdraft.glide.model_card import training_stages


ADDED_FIELDS = ("num_hidden_layers", "target_layer_ids")  # after the shipped drafters: hashed only when set


@dataclass(frozen=True)
class DrafterRecipe:
    """How one drafter is built and trained (every default says why)."""

    kind: str  # "glide" | "vanilla" | "small"
    intermediate_size: int = 1536  # the target's MLP width: Appendix E favours one wide layer
    draft_vocab_size: int = 6144  # target-argmax coverage ~0.99 on held-out code (README); head 6K × 576 ≈ 1.7 ms
    steps: int = 400
    batch_size: int = 8  # windows of 256 tokens: 2,048 tokens a step
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    block_size: int | tuple[int, ...] = 5  # §4.1: KV-cache delay of up to L = 5 tokens simulated in training; a tuple cycles L by step
    checkpoint_every: int = 50
    seed: int = 0
    num_hidden_layers: int = 1  # Appendix E: one layer up to 13B targets (the gap curve's ablation tries two)
    target_layer_ids: tuple[int, ...] | None = None  # target layer read by each draft layer; None: §4.1's N_T - N_D + m

    def to_dict(self) -> dict:
        """The recipe as a dict; fields added after the shipped drafters appear only when set, so their hash (and the
        training states it guards) is unchanged."""
        data = asdict(self)
        for field in dataclasses.fields(self):
            if field.name in ADDED_FIELDS and data[field.name] == field.default:
                del data[field.name]
        return data

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


FINETUNE = {"steps": 300, "learning_rate": 5e-4, "warmup_steps": 10}  # stage 2: from stage 1's weights, on the target's own text

RECIPES: dict[str, DrafterRecipe] = {
    "glide": DrafterRecipe("glide"),
    "vanilla": DrafterRecipe("vanilla"),
    "small": DrafterRecipe("small", intermediate_size=384, draft_vocab_size=2048, steps=300),
}


def choose_draft_vocab(store: dict[str, torch.Tensor], size: int, vocab_size: int, always: tuple[int, ...] = ()) -> list[int]:
    """The ``size`` target ids the target predicts most often in ``store`` (argmax), then most frequent as input.

    ``always`` (e.g. eos) are kept whatever their counts. Ids are ordered most frequent first.
    """
    argmax = torch.bincount(store["topk_ids"][..., 0].flatten().long(), minlength=vocab_size).double()
    inputs = torch.bincount(store["input_ids"].flatten().long(), minlength=vocab_size).double()
    score = argmax * 1e3 + inputs
    score[list(always)] = float("inf")
    return score.argsort(descending=True)[:size].tolist()


def build_drafter(kind: str, target: PreTrainedModel, draft_token_ids: list[int], recipe: DrafterRecipe) -> GlideForCausalLM:
    """A GLIDE-family drafter for ``target`` whose embedding rows start from the target's rows of its vocabulary."""
    if kind not in RECIPES:
        raise ValueError(f"kind must be one of {sorted(RECIPES)}, got {kind!r}")
    config = GlideConfig.from_target_config(
        target.config, num_hidden_layers=recipe.num_hidden_layers, intermediate_size=recipe.intermediate_size, cross_attention=kind == "glide",
        target_layer_ids=None if recipe.target_layer_ids is None else list(recipe.target_layer_ids),
        tie_word_embeddings=True, block_size=max(block_sizes(recipe)), draft_token_ids=draft_token_ids,
    )
    torch.manual_seed(recipe.seed)
    model = GlideForCausalLM(config)
    rows = target.get_input_embeddings().weight.detach().float()
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[: len(draft_token_ids)] = rows[draft_token_ids]
        emb[-1] = rows.mean(0)  # the row every other input id shares
    return model


def block_sizes(recipe: DrafterRecipe) -> tuple[int, ...]:
    """The block-wise mask's L for each step in turn: step ``s`` trains with ``block_sizes(recipe)[s % len]``, so a
    tuple mixes the cache delays the loop sees (L = 1 alone trains delay 1, the first drafted token's)."""
    sizes = (recipe.block_size,) if isinstance(recipe.block_size, int) else tuple(recipe.block_size)
    if not sizes or any(not isinstance(size, int) or size < 1 for size in sizes):
        raise ValueError(f"block_size must be a positive int or a non-empty tuple of them, got {recipe.block_size!r}")
    return sizes


def distillation_loss(model: GlideForCausalLM, batch: dict[str, torch.Tensor], layer_ids: list[int], num_layers: int, block_size: int) -> torch.Tensor:
    """Cross-entropy of the draft's reduced-vocabulary distribution against the target's renormalised top-k."""
    kv = None
    if model.config.cross_attention:
        kv = [(None, None)] * num_layers
        for i in layer_ids:
            kv[i] = (batch[f"keys.{i}"].float(), batch[f"values.{i}"].float())
    hidden = model.model(input_ids=batch["input_ids"].long(), target_past_key_values=kv, cross_attention_block_size=block_size,
                         use_cache=False).last_hidden_state
    log_q = torch.log_softmax(model.lm_head(hidden).float(), dim=-1)  # (B, T, draft rows)
    rows = model.model.target_to_draft[batch["topk_ids"].long()]  # (B, T, k); ids outside the draft vocabulary -> last row
    p = batch["topk_probs"].float()
    p = p / p.sum(-1, keepdim=True)
    return -(p * log_q.gather(-1, rows)).sum(-1).mean()


def _state_path(output_dir: Path) -> Path:
    return output_dir / "training_state"


def train_drafter(kind: str, target: PreTrainedModel, store: dict[str, torch.Tensor], output_dir: str | Path,
                  recipe: DrafterRecipe | None = None, progress: bool = True, init_from: str | Path | None = None) -> GlideForCausalLM:
    """Train one drafter from ``store`` into ``output_dir`` (resuming from ``output_dir/training_state`` if present).

    ``init_from``: a trained drafter checkpoint of the same kind to start from (its draft vocabulary is kept).
    """
    if kind not in RECIPES:
        raise ValueError(f"kind must be one of {sorted(RECIPES)}, got {kind!r}")
    recipe = recipe or RECIPES[kind]
    output_dir = Path(output_dir)
    state_dir = _state_path(output_dir)
    meta = json.loads((state_dir / "state.json").read_text()) if (state_dir / "state.json").is_file() else None
    if meta is not None and meta["recipe_hash"] != recipe.hash():
        raise ValueError(f"{str(state_dir)!r} was written by another recipe; remove it to start over")
    eos = target.config.eos_token_id
    eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
    start_from = GlideForCausalLM.from_pretrained(init_from, dtype=torch.float32) if init_from is not None and meta is None else None
    if meta:
        vocab = meta["draft_token_ids"]
    elif start_from is not None:
        vocab = start_from.config.draft_token_ids
    else:
        vocab = choose_draft_vocab(store, recipe.draft_vocab_size, target.config.vocab_size, always=eos)
    model = build_drafter(kind, target, vocab, recipe)
    if start_from is not None:
        model.load_state_dict(start_from.state_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.learning_rate, weight_decay=recipe.weight_decay)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, recipe.warmup_steps, recipe.steps, min_lr_rate=recipe.min_lr_ratio)
    start, log = 0, []
    if meta is not None:
        model.load_state_dict(load_file(str(state_dir / "model.safetensors")), strict=False)
        optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt", weights_only=True))
        scheduler.load_state_dict(torch.load(state_dir / "scheduler.pt", weights_only=True))
        start, log = meta["step"], meta["log"]
    n = store["input_ids"].shape[0]
    sizes = block_sizes(recipe)
    layer_ids = sorted(int(k.split(".")[1]) for k in store if k.startswith("keys."))
    num_layers = target.config.num_hidden_layers
    model.train()
    t0 = time.time() - (log[-1]["seconds"] if log else 0.0)
    bar = tqdm(range(start + 1, recipe.steps + 1), desc=f"train {kind}", disable=not progress, initial=start, total=recipe.steps)
    for step in bar:
        g = torch.Generator().manual_seed(recipe.seed * 100_003 + step)  # the batch depends on the step alone: resume-exact
        idx = torch.randint(0, n, (recipe.batch_size,), generator=g)
        batch = {k: v[idx] for k, v in store.items()}
        loss = distillation_loss(model, batch, layer_ids, num_layers, sizes[step % len(sizes)])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % 10 == 0 or step == recipe.steps:
            log.append({"step": step, "loss": round(loss.item(), 4), "lr": scheduler.get_last_lr()[0], "seconds": round(time.time() - t0, 1)})
        if step % recipe.checkpoint_every == 0 or step == recipe.steps:
            state_dir.mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, str(state_dir / "model.safetensors"))
            torch.save(optimizer.state_dict(), state_dir / "optimizer.pt")
            torch.save(scheduler.state_dict(), state_dir / "scheduler.pt")
            (state_dir / "state.json").write_text(json.dumps({"step": step, "recipe_hash": recipe.hash(), "draft_token_ids": vocab, "log": log}))
    model.eval()
    return model


DATASET = ("hf-specdraft distillation stores: the train split of the local Python corpus (stdlib + installed dependencies; "
           "15 % as chat requests in SmolLM2's template) and, for the fine-tune, the target's own greedy continuations of "
           "train-split prompts; labels = the target's top-8 next-token distribution")


def training_log(kind: str, store: dict[str, torch.Tensor], state: dict, parameters: int, recipe: DrafterRecipe) -> dict:
    """The drafter's training log in the shape GLIDE model cards read (steps with tokens, arguments)."""
    tokens_per_step = recipe.batch_size * store["input_ids"].shape[1]
    steps = [{**row, "tokens": row["step"] * tokens_per_step} for row in state["log"]]
    return {"steps": steps, "train_seconds": steps[-1]["seconds"] if steps else 0.0, "processes": 1,
            "arguments": {"block_size": recipe.block_size, "learning_rate": recipe.learning_rate, "distillation_weight": 1.0,
                          "dataset_name": DATASET},
            "recipe": recipe.to_dict(), "store_windows": int(store["input_ids"].shape[0]), "store_tokens": int(store["input_ids"].numel()),
            "draft_vocab_size": len(state["draft_token_ids"]), "parameters": parameters}


def earlier_stages(log: dict) -> list[dict]:
    """The stages a fine-tune started from, oldest first: those ``log``'s run started from, then that run itself."""
    keys = ("steps", "train_seconds", "recipe", "store_windows", "store_tokens")
    return [*training_stages(log)[:-1], {key: log[key] for key in keys if key in log}]


SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "README.md", "training_log.json")


def ship_drafter(checkpoint: str | Path, destination: str | Path) -> Path:
    """Copy a trained drafter into the package without code: weights, config, card and log only.

    The package loads it with ``GlideForCausalLM``; the trust_remote_code files and CAPE's ``custom_generate/``
    are written from the library's one source when it is saved for the Hub (``save_glide_checkpoint``).
    """
    import shutil

    checkpoint, destination = Path(checkpoint), Path(destination)
    shutil.rmtree(destination, ignore_errors=True)
    destination.mkdir(parents=True)
    for name in SHIPPED_FILES:
        shutil.copy2(checkpoint / name, destination / name)
    return destination


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train SmolLM2's shipped drafters from a distillation store (resumable).")
    parser.add_argument("store", help="a store written by python -m recipes.distillation")
    parser.add_argument("output_dir", help="checkpoints land in OUTPUT_DIR/<kind>; resumable state in OUTPUT_DIR/state/<kind>")
    parser.add_argument("--kinds", default="glide,vanilla,small", help=f"comma-separated, any of {sorted(RECIPES)}")
    parser.add_argument("--init-from", help="stage 2: start each drafter from INIT_FROM/<kind> and fine-tune with FINETUNE's schedule")
    parser.add_argument("--extra-store", action="append", default=[],
                        help="another store (e.g. the target's own text) mixed into the training windows; may be repeated")
    parser.add_argument("--extra-weight", type=int, default=1, help="how many times each extra store's windows are repeated in the mix")
    parser.add_argument("--steps", type=int, help="override the recipe's (or, with --init-from, FINETUNE's) number of steps")
    parser.add_argument("--learning-rate", type=float, help="override the recipe's (or FINETUNE's) peak learning rate")
    parser.add_argument("--seed", type=int,
                        help="override the recipe's seed: a later stage with another seed draws other windows (the batch "
                             "of step s depends on seed and s alone)")
    parser.add_argument("--block-size", help="override the recipe's block-wise mask L (GLIDE): one L, or several "
                        "comma-separated, taken by step in turn (e.g. 1,3 mixes the delays of short drafts)")
    args = parser.parse_args(argv)
    block_size = None
    if args.block_size is not None:
        try:
            block_size = tuple(int(x) for x in args.block_size.split(","))
        except ValueError:
            block_size = ()
        if not block_size or min(block_size) < 1:
            parser.error(f"--block-size must be one or more comma-separated integers >= 1, got {args.block_size!r}")
        block_size = block_size[0] if len(block_size) == 1 else block_size
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.learning_rate is not None and not args.learning_rate > 0:
        parser.error(f"--learning-rate must be > 0, got {args.learning_rate}")
    if args.seed is not None and args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.extra_weight < 1:
        parser.error(f"--extra-weight must be >= 1, got {args.extra_weight}")
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(RECIPES))
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; choose among {sorted(RECIPES)}")
    from hf_specdraft.glide.model_card import save_glide_checkpoint
    from .distillation import load_store
    from .drafters import LICENSE
    from hf_specdraft.defaults.smollm2 import HUB_ID, load_smollm2

    target, _ = load_smollm2(dtype=torch.float32, device="cpu")
    store = load_store(args.store)
    for path in args.extra_store:
        extra = load_store(path)
        store = {k: torch.cat([v, *[extra[k]] * args.extra_weight]) for k, v in store.items()}
    for kind in kinds:
        state_dir = Path(args.output_dir) / "state" / kind
        recipe = RECIPES[kind] if args.init_from is None else dataclasses.replace(RECIPES[kind], **FINETUNE)
        overrides = {"steps": args.steps, "learning_rate": args.learning_rate, "seed": args.seed, "block_size": block_size}
        recipe = dataclasses.replace(recipe, **{k: v for k, v in overrides.items() if v is not None})
        init_from = None if args.init_from is None else Path(args.init_from) / kind
        model = train_drafter(kind, target, store, state_dir, recipe, init_from=init_from)
        log = training_log(kind, store, json.loads((_state_path(state_dir) / "state.json").read_text()),
                           sum(p.numel() for p in model.parameters()), recipe)
        if args.init_from is not None:
            first = json.loads((Path(args.init_from) / kind / "training_log.json").read_text())
            log["earlier_stages"] = earlier_stages(first)
        out = save_glide_checkpoint(model.to(torch.bfloat16), Path(args.output_dir) / kind, target_name=HUB_ID,
                                    card_info={"dataset": DATASET, "training_log": log, "license": LICENSE})
        (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
