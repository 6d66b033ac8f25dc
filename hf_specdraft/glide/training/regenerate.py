"""Sequence-level self-distillation: the frozen target writes the responses GLIDE trains on (Du et al. 2024,
Appendix B), so the draft learns the p it will be judged against (as Medusa-2 §3.2 and SpecForge do).

A conversation's prompt is every turn before the last (or each) assistant turn, rendered with the chat template; plain
text's is its first ``prompt_tokens`` tokens. Replies go to ``OUTPUT_DIR/regenerated/shard-*.jsonl``, each shard
written whole: a rerun generates only the missing shards. Under accelerate each process writes every
``num_processes``-th shard.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from accelerate import PartialState
from tqdm.auto import tqdm

from ...core.validation import check_int
from .data import Column, check_messages, render_chat, tokenize_texts


@dataclass
class RegenerationArguments:
    """How the target writes the training responses (the sampling settings go into the model card)."""

    max_new_tokens: int = 256  # longest reply the target writes per prompt
    batch_size: int = 8  # prompts per generate call (left-padded)
    temperature: float = 0.0  # 0 = greedy (the draft then learns the target's argmax)
    top_p: float = 1.0  # nucleus sampling mass when sampling (1.0 = off)
    prompt_tokens: int = 32  # plain text only: the prefix of each text the target continues
    batches_per_shard: int = 4  # batches per regenerated/shard-*.jsonl file (what a restart keeps)
    turns: str = "last"  # conversations only: "last" or "each" assistant turn (one example per turn)
    seed: int = 0  # the batch from prompt i samples with seed + i: a resumed run draws what an unbroken one would

    def __post_init__(self):
        for name in ("max_new_tokens", "batch_size", "prompt_tokens", "batches_per_shard"):
            check_int(f"regeneration {name}", getattr(self, name))
        if not self.temperature >= 0:
            raise ValueError(f"regeneration temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"regeneration top_p must lie in (0, 1], got {self.top_p}")
        if self.turns not in ("last", "each"):
            raise ValueError(f"regeneration turns must be 'last' or 'each', got {self.turns!r}")


def regeneration_prompts(examples, column: Column, tokenizer, args: RegenerationArguments) -> list[list[int]]:
    """Token ids of every prompt the target continues, in dataset order (see the module docstring)."""
    values = examples[column.name]
    if column.kind == "text":
        return [ids[: args.prompt_tokens] for ids in tokenize_texts(tokenizer, list(values)) if ids]
    texts = []
    for i, messages in enumerate(values):
        messages = check_messages(messages, i)
        # the turns before the last (or each) assistant turn; a conversation without one is a prompt as it is
        ends = [j for j, turn in enumerate(messages) if turn["role"] == "assistant" and j > 0] or [len(messages)]
        texts += [
            render_chat(tokenizer, messages[:j], add_generation_prompt=True)
            for j in (ends if args.turns == "each" else ends[-1:])
        ]
    return tokenize_texts(tokenizer, texts)


@torch.no_grad()
def generate_replies(target, tokenizer, prompts: list[list[int]], args: RegenerationArguments, seed: int) -> list:
    """The target's reply to each prompt: one left-padded ``generate`` call over `(B, max prompt length)`."""
    eos_token_id = tokenizer.eos_token_id
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_token_id or 0)
    width = max(len(p) for p in prompts)
    device = next(target.parameters()).device
    input_ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    greedy = {"do_sample": False}  # also against a generation_config that samples
    sampling = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p) if args.temperature else greedy
    # the caller's RNG stream is left alone
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        out = target.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=args.max_new_tokens,
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            top_k=None,
            **sampling,
        )
    # up to and including the first eos: generate pads finished rows after it
    rows = out[:, width:].tolist()
    return [row[: row.index(eos_token_id) + 1] if eos_token_id in row else row for row in rows]


def _write_shard(path: Path, records: list[dict]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(json.dumps(record) + "\n" for record in records))
    os.replace(temporary, path)  # a shard is there whole or not at all


def regenerate(
    target, tokenizer, prompts: list[list[int]], output_dir, args: RegenerationArguments, progress_bar: bool = True
) -> list[dict]:
    """Have ``target`` continue every prompt, shard by shard into ``output_dir/regenerated`` (finished shards are kept).

    Returns:
        one record per prompt, in order: ``{"index", "prompt_ids", "response_ids", "prompt", "response"}``.

    Raises:
        ValueError: ``output_dir/regenerated`` holds shards written with other settings or prompts.
    """
    if not prompts:
        raise ValueError("there is nothing to regenerate: the dataset gave no prompts")
    state = PartialState()
    directory = Path(output_dir) / "regenerated"
    settings = {
        **asdict(args),
        "num_prompts": len(prompts),
        "prompts_sha256": hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16],
        "target": getattr(target.config, "_name_or_path", None),
    }
    settings_file = directory / "settings.json"
    if settings_file.is_file() and json.loads(settings_file.read_text()) != settings:
        raise ValueError(
            f"{str(directory)!r} holds responses regenerated with other settings or data "
            f"({settings_file.read_text()}); use another --output-dir or delete it"
        )
    state.wait_for_everyone()
    if state.is_main_process:
        directory.mkdir(parents=True, exist_ok=True)
        settings_file.write_text(json.dumps(settings, indent=1) + "\n")
    state.wait_for_everyone()
    size = args.batch_size * args.batches_per_shard
    mine = [k for k in range(0, -(-len(prompts) // size)) if k % state.num_processes == state.process_index]
    target.eval()
    for k in tqdm(mine, desc="regenerate (shards)", disable=not (progress_bar and state.is_main_process)):
        path = directory / f"shard-{k:05d}.jsonl"
        if path.is_file():
            continue
        records = []
        for start in range(k * size, min((k + 1) * size, len(prompts)), args.batch_size):
            batch = prompts[start : start + args.batch_size]
            replies = generate_replies(target, tokenizer, batch, args, args.seed + start)
            records += [
                dict(index=i, prompt_ids=p, response_ids=r, prompt=tokenizer.decode(p), response=tokenizer.decode(r))
                for i, (p, r) in enumerate(zip(batch, replies), start)
            ]
        _write_shard(path, records)
    state.wait_for_everyone()
    return [
        json.loads(line) for path in sorted(directory.glob("shard-*.jsonl")) for line in path.read_text().splitlines()
    ]
