"""Train a small target and its drafts from a recipe (tokenizer, target LM, plain draft), with 🤗 accelerate.

From the repository root (the 15.7M code LM of earlier versions; ``tiny`` is the tests' and examples' plumbing)::

    python -m recipes.training --output-dir runs/default                  # the CPU recipe (hours on 2 cores)
    python -m recipes.training --output-dir runs/default --parts target --resume-target  # target's second stage only
    python -m recipes.training --recipe tiny --output-dir /tmp/tiny       # seconds; tests only
    accelerate launch -m recipes.training --recipe gpu --output-dir runs/gpu-default  # the GPU bench profile's target

Output directory layout (what ``hf_specdraft.defaults.load_default`` reads)::

    tokenizer/  target/  draft/  small_draft/  glide/  vanilla/  bigram.safetensors  recipe.json  training_log.json
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    get_cosine_with_min_lr_schedule_with_warmup,
)

from hf_specdraft.defaults.corpus import HELDOUT_PERCENT, Corpus, build_corpus
from hf_specdraft.glide.training.data import tokenize_texts
from hf_specdraft.glide.training.objective import token_stream
from .evaluation import (
    evaluate_perplexity,
    heldout_prompts,
    heldout_text_windows,
    perplexity_by_source,
    reference_repeat_fraction,
    repeat_fraction,
    unigram_perplexity,
)
from .recipe import SMALL_DRAFT_RECIPES, ModelRecipe, Recipe, TrainSchedule, get_recipe
from .tokenizer import train_tokenizer


PARTS = ("draft", "target", "small_draft", "glide", "vanilla")  # in training order: GLIDE reads the trained target


def default_cache_dir() -> Path:
    return Path(os.environ.get("HF_SPECDRAFT_CACHE", Path.home() / ".cache" / "hf_specdraft"))


@dataclass
class TrainingData:
    tokenizer: PreTrainedTokenizerFast
    train_ids: torch.Tensor  # [T] int32, documents joined by eos
    heldout_texts: list[str]


def train_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """The token ids of ``texts``, each followed by eos, ``[T]`` int32; tokenized 256 texts at a time (the train split's
    Python lists of ids would hold ~9x the tensor's memory)."""
    return torch.cat(
        [
            token_stream(tokenize_texts(tokenizer, texts[start : start + 256]), tokenizer.eos_token_id).to(torch.int32)
            for start in range(0, len(texts), 256)
        ]
    )


def prepare_data(
    recipe: Recipe, output_dir: Path, corpus: Corpus | None = None, cache_dir: Path | None = None
) -> TrainingData:
    """Train (or reload) the tokenizer into ``output_dir/tokenizer`` and tokenize the train split (cached)."""
    corpus = corpus or build_corpus(recipe.packages)
    tok_dir = output_dir / "tokenizer"
    if (tok_dir / "tokenizer.json").exists():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    else:
        tokenizer = train_tokenizer(
            (f.read() for f in corpus.train), recipe.vocab_size, max_chars=recipe.tokenizer_chars
        )
        tokenizer.save_pretrained(tok_dir)
    # the token stream depends only on the tokenizer settings and the corpus, not on model shapes or schedules
    source = {
        "vocab_size": recipe.vocab_size,
        "tokenizer_chars": recipe.tokenizer_chars,
        "max_train_chars": recipe.max_train_chars,
        "versions": corpus.versions,
        "train_files": len(corpus.train),
    }
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    cache = (cache_dir or default_cache_dir()) / f"train_ids-{key}.safetensors"
    if cache.exists():
        train_ids = load_file(cache)["ids"]
    else:
        texts, total = [], 0
        for f in tqdm(corpus.train, desc="reading train split", leave=False):
            texts.append(f.read())
            total += len(texts[-1])
            if recipe.max_train_chars is not None and total >= recipe.max_train_chars:
                break
        train_ids = train_stream(tokenizer, texts)
        cache.parent.mkdir(parents=True, exist_ok=True)
        save_file({"ids": train_ids}, cache)
    return TrainingData(tokenizer, train_ids, [f.read() for f in corpus.heldout])


def build_model(shape: ModelRecipe, recipe: Recipe, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=max(2048, 4 * recipe.seq_len),  # generation runs past the training length
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(recipe.seed)
    return LlamaForCausalLM(config)


def sample_batch(train_ids: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """``[batch_size, seq_len]`` random windows of the token stream."""
    starts = torch.randint(0, train_ids.numel() - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([train_ids[s : s + seq_len] for s in starts.tolist()]).long()


def train_lm(
    model: LlamaForCausalLM,
    data: TrainingData,
    recipe: Recipe,
    schedule: TrainSchedule,
    save_dir: Path,
    desc: str,
    eval_ids: torch.Tensor,
    seed_offset: int = 0,
) -> list[dict]:
    """Optimise ``model`` on random windows of the train split; checkpoint every ``schedule.checkpoint_every``.

    Returns the training log: one entry per logged step (loss, lr, tokens seen, elapsed seconds,
    held-out perplexity at checkpoints).
    """
    accum = schedule.batch_size // schedule.micro_batch_size
    accelerator = Accelerator(
        mixed_precision="bf16" if torch.cuda.is_available() else "no", gradient_accumulation_steps=accum
    )
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": schedule.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=schedule.learning_rate,
        betas=(0.9, 0.95),
    )
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, schedule.warmup_steps, schedule.steps, min_lr_rate=schedule.min_lr_ratio
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    unwrapped = accelerator.unwrap_model(model)

    def loss_of(batch):
        return model(input_ids=batch, labels=batch).loss

    compute_loss = torch.compile(loss_of) if recipe.compile else loss_of
    generator = torch.Generator().manual_seed(recipe.seed + seed_offset + 1000 * accelerator.process_index)
    log, tokens, start = [], 0, time.time()
    model.train()
    bar = tqdm(range(1, schedule.steps + 1), desc=desc, disable=not accelerator.is_main_process)
    for step in bar:
        running = 0.0
        for _ in range(accum):
            batch = sample_batch(data.train_ids, schedule.micro_batch_size, recipe.seq_len, generator).to(
                accelerator.device
            )
            with accelerator.accumulate(model):
                loss = compute_loss(batch)
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            running += loss.item() / accum
            tokens += batch.numel() * accelerator.num_processes
        bar.set_postfix(loss=f"{running:.3f}")
        entry = {
            "step": step,
            "loss": round(running, 4),
            "lr": scheduler.get_last_lr()[0],
            "tokens": tokens,
            "seconds": round(time.time() - start, 1),
        }
        if step % schedule.checkpoint_every == 0 or step == schedule.steps:
            model.eval()
            entry["heldout_perplexity"] = round(evaluate_perplexity(unwrapped, eval_ids[:64]), 3)
            model.train()
            if accelerator.is_main_process:
                save_checkpoint(unwrapped, save_dir)
        if step % 10 == 0 or "heldout_perplexity" in entry:
            log.append(entry)
    accelerator.wait_for_everyone()
    return log


def save_checkpoint(model: LlamaForCausalLM, save_dir: Path) -> None:
    """Write bf16 sharded safetensors (the shipped form: ≤ 50 MB in the repository)."""
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(save_dir, max_shard_size="20MB")  # tied head saved once
    cfg = json.loads((save_dir / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (save_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def train_default(
    recipe: Recipe,
    output_dir: str | Path,
    parts: tuple[str, ...] = PARTS,
    corpus: Corpus | None = None,
    resume_target: bool = False,
) -> dict:
    """Reproduce the embedded default from ``recipe``: tokenizer, then each of ``parts``, then the evaluation.

    With ``resume_target`` the target's first stage is taken from ``output_dir/target`` (its training log
    must show that stage finished under the same schedule) and only ``recipe.target_continuation`` runs.
    Returns the training log (also written to ``output_dir/training_log.json``).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"parts must be drawn from {PARTS}, got {sorted(unknown)}")
    corpus = corpus or build_corpus(recipe.packages)
    data = prepare_data(recipe, output_dir, corpus)
    eval_ids = heldout_text_windows(
        data.tokenizer, data.heldout_texts, recipe.seq_len, recipe.eval_windows, recipe.seed
    )
    if not (output_dir / "bigram.safetensors").is_file():  # Max-Gram's fallback table, from the same token stream
        from hf_specdraft.cascade.bigram import build_bigram_table, save_bigram_table

        table = build_bigram_table([data.train_ids.long()], len(data.tokenizer))
        save_bigram_table(
            table,
            output_dir / "bigram.safetensors",
            {"source": f"recipe {recipe.name} train split", "tokens": data.train_ids.numel()},
        )
    log_path = output_dir / "training_log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    if resume_target:
        check_first_stage(log, recipe, output_dir, parts)
    log.update(
        {
            "recipe": recipe.name,
            "recipe_hash": recipe.hash(),
            "corpus": {
                "train_files": len(corpus.train),
                "heldout_files": len(corpus.heldout),
                "versions": corpus.versions,
                "heldout_percent": HELDOUT_PERCENT,
            },
            "train_tokens": int(data.train_ids.numel()),
        }
    )
    log["hardware"] = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
    shapes = {
        "draft": (recipe.draft, recipe.draft_schedule),
        "target": (recipe.target, recipe.target_schedule),
        "small_draft": SMALL_DRAFT_RECIPES[recipe.name],
    }
    for part in [p for p in PARTS[:3] if p in parts]:
        shape, schedule = shapes[part]
        if not (part == "target" and resume_target):
            model = build_model(shape, recipe, data.tokenizer)
            start = time.time()
            steps = train_lm(model, data, recipe, schedule, output_dir / part, f"train {part}", eval_ids)
            log[part] = {
                "parameters": sum(p.numel() for p in model.parameters()),
                "train_seconds": round(time.time() - start, 1),
                "steps": steps,
            }
            log_path.write_text(json.dumps(log, indent=1) + "\n")
        if part == "target" and recipe.target_continuation is not None:
            # Both paths (fresh and resumed) continue from the saved bf16 checkpoint, so they match.
            model = LlamaForCausalLM.from_pretrained(output_dir / "target", dtype=torch.float32)
            start = time.time()
            # a cut-short run cannot be resumed again
            log["target"]["continuation"] = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            log_path.write_text(json.dumps(log, indent=1) + "\n")
            steps = train_lm(
                model,
                data,
                recipe,
                recipe.target_continuation,
                output_dir / "target",
                "continue target",
                eval_ids,
                seed_offset=1,
            )
            log["target"]["continuation"].update({"train_seconds": round(time.time() - start, 1), "steps": steps})
            log_path.write_text(json.dumps(log, indent=1) + "\n")
    for part in [p for p in PARTS[3:] if p in parts]:  # GLIDE and its vanilla twin need the trained target
        from .drafters import train_default_drafter

        glide_log = train_default_drafter(part, output_dir, recipe, data.train_ids)
        log[part] = {"train_seconds": glide_log["train_seconds"], "steps": glide_log["steps"][-1]}
        log_path.write_text(json.dumps(log, indent=1) + "\n")
    if not {"draft", "target"} & set(parts):
        return log
    log["evaluation"] = evaluate_default(output_dir, data, recipe, eval_ids, corpus)
    log_path.write_text(json.dumps(log, indent=1) + "\n")
    (output_dir / "recipe.json").write_text(
        json.dumps({"recipe": recipe.to_dict(), "hash": recipe.hash()}, indent=1, sort_keys=True) + "\n"
    )
    return log


def check_first_stage(log: dict, recipe: Recipe, output_dir: Path, parts: tuple[str, ...]) -> None:
    """Raise unless ``output_dir`` holds a target whose first stage, and nothing after it, finished under ``recipe``.

    ``log`` is the directory's training log as it was before this run.
    """
    if recipe.target_continuation is None:
        raise ValueError(f"resume_target needs a recipe with target_continuation; recipe {recipe.name!r} has none")
    if "target" not in parts:
        raise ValueError(f"resume_target continues the target, but parts={parts} does not include 'target'")
    if not (output_dir / "target" / "config.json").is_file():
        raise ValueError(
            f"resume_target: no trained target in {output_dir / 'target'}; train it first (without resume_target)"
        )
    steps = log.get("target", {}).get("steps") or [{}]
    if (
        log.get("recipe") != recipe.name
        or steps[-1].get("step") != recipe.target_schedule.steps
        or "continuation" in log["target"]
    ):
        raise ValueError(
            f"resume_target: {output_dir / 'training_log.json'} does not show a finished first stage of recipe "
            f"{recipe.name!r} ({recipe.target_schedule.steps} steps, no continuation started yet); retrain the target "
            "without resume_target"
        )
    stale = [
        kind for kind in ("glide", "vanilla") if (output_dir / kind / "config.json").is_file() and kind not in parts
    ]
    if stale:
        warnings.warn(
            f"{stale} in {output_dir} were trained on the previous target; retrain them with --parts {','.join(stale)}",
            stacklevel=3,
        )


def evaluate_default(
    output_dir: Path, data: TrainingData, recipe: Recipe, eval_ids: torch.Tensor, corpus: Corpus | None = None
) -> dict:
    """Held-out perplexity (target, draft, unigram) and the target's greedy repeated-4-gram fraction."""
    result = {"unigram_perplexity": round(unigram_perplexity(data.train_ids, eval_ids, len(data.tokenizer)), 3)}
    prompts = heldout_prompts(data.tokenizer, data.heldout_texts, recipe.eval_prompts, recipe.seed)
    for part in ("target", "draft"):
        if (output_dir / part / "config.json").exists():
            model = LlamaForCausalLM.from_pretrained(output_dir / part, dtype=torch.float32)
            result[f"{part}_perplexity"] = round(evaluate_perplexity(model, eval_ids), 3)
            result[f"{part}_repeat_fraction"] = round(repeat_fraction(model, prompts, max_new_tokens=64), 4)
            if part == "target" and corpus is not None:
                result["target_perplexity_by_source"] = perplexity_by_source(
                    model, data.tokenizer, corpus.heldout, recipe.seq_len, recipe.eval_windows // 4, recipe.seed
                )
    windows = heldout_prompts(data.tokenizer, data.heldout_texts, recipe.eval_prompts, recipe.seed, continuation=64)
    # the held-out code's own repetition
    result["reference_repeat_fraction"] = round(reference_repeat_fraction(windows), 4)
    result["eval_windows"] = int(eval_ids.shape[0])
    result["seq_len"] = recipe.seq_len
    if not math.isfinite(result["unigram_perplexity"]):
        raise RuntimeError("unigram perplexity is not finite; the held-out windows are empty")
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m recipes.training",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--recipe", default="default", help="default, gpu or tiny")
    parser.add_argument(
        "--output-dir", required=True, help="where the target, drafts, tokenizer and logs go (e.g. runs/my-default)"
    )
    parser.add_argument("--parts", default=",".join(PARTS), help=f"any of {','.join(PARTS)}")
    parser.add_argument(
        "--resume-target",
        action="store_true",
        help="keep the trained first target stage in --output-dir and "
        "train only the recipe's continuation of it (use with --parts target)",
    )
    args = parser.parse_args(argv)
    log = train_default(
        get_recipe(args.recipe), args.output_dir, parts=tuple(args.parts.split(",")), resume_target=args.resume_target
    )
    print(json.dumps(log.get("evaluation", {}), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
