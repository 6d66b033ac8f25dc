"""What the frozen target says about the training text, computed once and stored for every drafter.

Training a drafter for a real target on 2 CPU cores cannot afford a target forward per training step
(SmolLM2-135M runs ~400 tokens/s teacher-forced here). So the target runs once over the training windows
and its answers are stored in resumable safetensors shards (:func:`hf_specdraft.glide.training.store.write_store`: the
windows, the keys and values of the target layers GLIDE reads, the target's top-8 next tokens and their
probabilities), which :func:`~hf_specdraft.glide.train_glide` reads as
:class:`~hf_specdraft.glide.training.store.StoreWindows`. The windows are code from the corpus's train split, plus
requests in the target's chat template answered with train-split functions; token-level distillation (the cheaper form
of Du et al. 2024, Appendix B; DistillSpec) has the drafters learn the target's choices, not the corpus's, which is what
greedy acceptance rewards.

A second store holds the target's *own* text (``--self-generated``, the sequence-level
distillation of Du et al. 2024, Appendix B): its greedy continuations of train-split prompts shaped like the bench tasks
(code to complete, chat requests, file prefixes). Measured: an instruct target answers a code prompt by closing the code
block and explaining it in prose, text a drafter trained on code alone drafts badly (teacher-forced top-1 agreement 0.21
on such a continuation vs 0.50 on code).

Bench items come from the held-out split and never appear here.

    python -m recipes.distillation store/smollm2 --windows 2400           # 40 min on 2 cores
    python -m recipes.distillation store/selfgen --self-generated 320    # 8 min; all resumable
    python -m recipes.distillation store/selfgen2 --self-generated 640 --skip-prompts 320 --max-new-tokens 96
    python -m recipes.distillation store/requests --requests 2000 --max-new-tokens 128   # natural language + code

``--requests`` asks the target the requests of :mod:`recipes.requests` (conversation with a follow-up turn, translation,
summaries, questions, arithmetic, questions about a passage, code) and stores its answers: what a chat target is asked.

Generation is the slow part. ``--generation-dtype bfloat16`` writes the text with a bfloat16 copy of the target, several
times faster on a CPU with bfloat16 instructions, while the store's labels still come from the float32 target: the text
is then the bfloat16 copy's greedy answers, where the float32 target would have chosen another token about once in 70
(``--check-answers`` says how often on your machine), and every label is the float32 target's own next-token
distribution on it. Such text is kept apart (``answers-bfloat16/``,
``generated-bfloat16/``), so a resumed run never mixes the two.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from hf_specdraft.defaults.corpus import Corpus, build_corpus
from hf_specdraft.defaults.tasks import chat_prompt, chat_request, function_items
from hf_specdraft.glide.training.store import write_store

SEQ_LEN = 256
CHAT_FRACTION = 0.15  # share of windows in the chat template (the instruct target's own use)


def code_stream(tokenizer, files, max_tokens: int) -> list[int]:
    """Token ids of ``files`` in turn, each followed by eos, until ``max_tokens`` are reached (the last file whole)."""
    ids: list[int] = []
    for f in files:
        ids += tokenizer(f.read(), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(ids) >= max_tokens:
            break
    return ids


def _chat_stream(tokenizer, files, max_tokens: int, rng: random.Random) -> list[int]:
    ids: list[int] = []
    for f in files:
        for item in function_items(f.name, f.read()):
            if rng.random() < 0.5:
                continue  # at most about half a file's functions: more files, less of each
            text = (
                chat_prompt(tokenizer, chat_request(item)) + f"```python\n{item.prompt}{item.reference}```<|im_end|>\n"
            )
            ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= max_tokens:
            break
    return ids


def split_files(files, rng: random.Random) -> tuple[list, list]:
    """``files`` shuffled by ``rng`` and halved: the code windows' files, then the chat windows' (other files)."""
    files = sorted(files, key=lambda f: f.name)
    rng.shuffle(files)
    return files[: len(files) // 2], files[len(files) // 2 :]


def build_windows(
    tokenizer,
    num_windows: int,
    corpus: Corpus | None = None,
    seq_len: int = SEQ_LEN,
    chat_fraction: float = CHAT_FRACTION,
    seed: int = 0,
) -> torch.Tensor:
    """``(num_windows, seq_len)`` int64 training windows from the train split (code + chat), shuffled."""
    corpus = corpus or build_corpus()
    rng = random.Random(seed)
    code_files, chat_files = split_files(corpus.train, rng)
    num_chat = int(num_windows * chat_fraction) if getattr(tokenizer, "chat_template", None) else 0
    code = code_stream(tokenizer, code_files, (num_windows - num_chat) * seq_len)
    chat = _chat_stream(tokenizer, chat_files, num_chat * seq_len, rng) if num_chat else []
    windows = [code[i * seq_len : (i + 1) * seq_len] for i in range(num_windows - num_chat)]
    windows += [chat[i * seq_len : (i + 1) * seq_len] for i in range(num_chat)]
    windows = [w for w in windows if len(w) == seq_len]
    rng.shuffle(windows)
    return torch.tensor(windows, dtype=torch.long)


def self_distillation_prompts(
    tokenizer, count: int, corpus: Corpus | None = None, seed: int = 1, skip: int = 0, split: str = "train"
) -> list[str]:
    """``count`` train-split prompts shaped like the bench tasks: 50 % a function's signature + docstring (completion),
    35 % the same as a chat request in the target's template, 15 % a file's first 700-1,500 characters (context).

    ``skip``: leave out the first ``skip`` prompts of the same sequence, so a second store holds new ones. ``split``:
    ``"heldout"`` draws them from the held-out files instead (a store to score drafters on, never to train them).
    """
    if count < 1 or skip < 0:
        raise ValueError(f"count must be >= 1 and skip >= 0, got count={count}, skip={skip}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    corpus = corpus or build_corpus()
    rng = random.Random(seed)
    files = sorted(getattr(corpus, split), key=lambda f: f.name)
    rng.shuffle(files)
    chat = getattr(tokenizer, "chat_template", None) is not None
    prompts: list[str] = []
    for f in files:
        text = f.read()
        roll = rng.random()
        if roll < 0.15 and len(text) > 2000:
            cut = text.rfind("\n", 0, rng.randrange(700, 1500))
            prompts.append(text[: cut + 1])
        else:
            items = function_items(f.name, text)
            if not items:
                continue
            item = rng.choice(items)
            prompts.append(chat_prompt(tokenizer, chat_request(item)) if chat and roll < 0.5 else item.prompt)
        if len(prompts) == skip + count:
            break
    return prompts[skip:]


@torch.inference_mode()
def self_generated_windows(
    target: PreTrainedModel,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int = 64,
    batch_size: int = 32,
    seq_len: int = SEQ_LEN,
    progress_dir: str | Path | None = None,
) -> torch.Tensor:
    """The target's greedy continuations of ``prompts`` (prompt + continuation + eos, packed) as `(N, seq_len)` windows.

    ``progress_dir``: each batch's continuations are kept there once done, so a killed run resumes after the last one.
    """
    tokenizer.padding_side = "left"
    stream: list[int] = []
    for n, start in enumerate(tqdm(range(0, len(prompts), batch_size), desc="target generates (batches)")):
        done = None if progress_dir is None else Path(progress_dir) / f"generated-{n:05d}.safetensors"
        if done is not None and done.is_file():
            stream += load_file(str(done))["stream"].tolist()
            continue
        enc = tokenizer(
            prompts[start : start + batch_size],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
            truncation=True,
            max_length=seq_len - max_new_tokens,
        )
        out = target.generate(
            **enc.to(target.device), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        batch: list[int] = []
        for row, mask in zip(out.tolist(), enc.attention_mask.tolist()):
            batch += row[len(mask) - sum(mask) :] + [tokenizer.eos_token_id]  # drop the left padding
        stream += batch
        if done is not None:
            done.parent.mkdir(parents=True, exist_ok=True)
            save_file({"stream": torch.tensor(batch, dtype=torch.long)}, str(done.with_suffix(".tmp")))
            done.with_suffix(".tmp").rename(done)
    n = len(stream) // seq_len
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def answered_requests(
    target: PreTrainedModel,
    tokenizer,
    requests: list[tuple[str, list[str]]],
    output_dir: str | Path,
    max_new_tokens: int = 128,
    batch_size: int = 16,
) -> list[dict]:
    """The target's greedy answers to ``requests`` (:func:`recipes.requests.training_requests`), kept shard by shard
    under ``output_dir/turn-1`` and ``turn-2`` so a killed run resumes where it stopped; a two-turn request's second
    turn is answered with the first answer in context.

    Returns:
        one record per request: ``{"group", "ids"}``, the whole conversation's token ids in the chat template.
    """
    from hf_specdraft.glide.training.regenerate import RegenerationArguments, regenerate

    args = RegenerationArguments(max_new_tokens=max_new_tokens, batch_size=batch_size, batches_per_shard=2)
    chats = [[{"role": "user", "content": turns[0]}] for _, turns in requests]

    def encode(chat):
        return tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False)

    first = regenerate(target, tokenizer, [list(encode(chat)) for chat in chats], Path(output_dir) / "turn-1", args)
    follow = [i for i, (_, turns) in enumerate(requests) if len(turns) > 1]
    for i in follow:
        reply = tokenizer.decode(first[i]["response_ids"], skip_special_tokens=True)
        chats[i] += [{"role": "assistant", "content": reply}, {"role": "user", "content": requests[i][1][1]}]
    second = (
        regenerate(target, tokenizer, [list(encode(chats[i])) for i in follow], Path(output_dir) / "turn-2", args)
        if follow
        else []
    )
    records = [{"group": group, "ids": r["prompt_ids"] + r["response_ids"]} for (group, _), r in zip(requests, first)]
    for i, r in zip(follow, second):
        records[i]["ids"] = r["prompt_ids"] + r["response_ids"]
    return records


def written_requests(
    target: PreTrainedModel, tokenizer, count: int, seed: int, output_dir: str | Path, batch_size: int = 16
) -> list[tuple[str, list[str]]]:
    """Requests the target writes itself (:func:`recipes.requests.writing_prompts`), sampled at temperature 0.6 and
    kept shard by shard under ``output_dir`` so a killed run resumes; fewer than ``count`` where a writing is unusable.
    """
    from hf_specdraft.glide.training.regenerate import RegenerationArguments, regenerate

    from .requests import requests_from_written, writing_prompts

    drawn = writing_prompts(count, seed)
    asks = [i for i, (group, _) in enumerate(drawn) if group != "math"]  # math problems stay templated
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": drawn[i][1]}], add_generation_prompt=True, return_dict=False
            )
        )
        for i in asks
    ]
    args = RegenerationArguments(
        max_new_tokens=112, batch_size=batch_size, batches_per_shard=2, temperature=0.6, top_p=0.9, seed=seed
    )
    replies = regenerate(target, tokenizer, prompts, output_dir, args)
    written = [""] * len(drawn)
    for i, reply in zip(asks, replies):
        written[i] = tokenizer.decode(reply["response_ids"], skip_special_tokens=True)
    return requests_from_written(drawn, written, seed)


def generation_model(target: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """The model that writes the training text: ``target`` itself in its own dtype, else a copy in ``dtype`` (the
    store's labels still come from ``target``)."""
    if dtype == target.dtype:
        return target
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"generation dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    return copy.deepcopy(target).to(dtype)


def text_dir(output_dir: str | Path, name: str, dtype: torch.dtype) -> Path:
    """Where text written in ``dtype`` is kept: ``output_dir/name``, with a ``-bfloat16`` suffix for such text."""
    return Path(output_dir) / (name if dtype == torch.float32 else f"{name}-{str(dtype).removeprefix('torch.')}")


@torch.inference_mode()
def answer_agreement(target: PreTrainedModel, answers_dir: str | Path) -> tuple[float, int]:
    """How often ``target``'s own greedy token is the token written, over every answer kept under ``answers_dir``
    (``turn-*/regenerated/shard-*.jsonl``; not the sampled requests of ``written/``), teacher-forced: 1.0 for text
    ``target`` wrote itself greedily.

    Returns:
        ``(share, positions)``: the share of answer positions whose token is ``target``'s argmax, and how many.
    """
    agree = positions = 0
    for shard in sorted(Path(answers_dir).glob("turn-*/regenerated/shard-*.jsonl")):
        for record in map(json.loads, shard.read_text().splitlines()):
            prompt, answer = record["prompt_ids"], record["response_ids"]
            if not answer:
                continue
            ids = torch.tensor([prompt + answer], device=target.device)
            greedy = target(ids).logits[0, len(prompt) - 1 : -1].argmax(-1)
            agree += int((greedy == ids[0, len(prompt) :]).sum())
            positions += len(answer)
    if not positions:
        raise ValueError(f"{str(answers_dir)!r} holds no answers (turn-*/regenerated/shard-*.jsonl): write them first")
    return agree / positions, positions


def kept_requests(path: Path, draw) -> list[tuple[str, list[str]]]:
    """The requests kept at ``path`` (JSON lines of ``{"group", "turns"}``), else ``draw()``'s, written there first: a
    resumed run answers the same requests even where the corpus they were drawn from has changed since."""
    if path.is_file():
        return [(r["group"], r["turns"]) for r in map(json.loads, path.read_text().splitlines())]
    requests = draw()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text("".join(json.dumps({"group": g, "turns": t}) + "\n" for g, t in requests))
    path.with_suffix(".tmp").rename(path)
    return requests


def request_windows(records: list[dict], eos_token_id: int, seq_len: int = SEQ_LEN, seed: int = 0) -> torch.Tensor:
    """Answered requests packed, each followed by eos, into `(N, seq_len)` windows, shuffled."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    stream = [token for i in order for token in records[i]["ids"] + [eos_token_id]]
    n = len(stream) // seq_len
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir")
    parser.add_argument("--windows", type=int, default=2048)
    parser.add_argument(
        "--layers", type=int, default=1, help="GLIDE layers the store serves: the top N target layers' KV are kept"
    )
    parser.add_argument(
        "--self-generated",
        type=int,
        default=0,
        metavar="PROMPTS",
        help="build the store from the target's own greedy continuations of this many train-split prompts",
    )
    parser.add_argument(
        "--skip-prompts",
        type=int,
        default=0,
        metavar="N",
        help="with --self-generated: start after the first N prompts (a second store with new prompts)",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=64, help="with --self-generated: tokens the target writes per prompt"
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=0,
        metavar="N",
        help="build the store from the target's answers to N natural-language and code requests (recipes.requests)",
    )
    parser.add_argument(
        "--request-seed",
        type=int,
        default=0,
        help="with --requests: the seed that draws them (another seed, other requests)",
    )
    parser.add_argument(
        "--written",
        action="store_true",
        help="with --requests: the target writes the requests itself (sampled), then answers them greedily",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="with --requests: prompts per generate call")
    parser.add_argument(
        "--generation-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="with --requests or --self-generated: the dtype of the target copy that writes the text (bfloat16: "
        "several times faster on a CPU with bfloat16 instructions; the labels still come from the float32 target)",
    )
    parser.add_argument(
        "--check-answers",
        action="store_true",
        help="with --requests: print how often the float32 target's own greedy token is the token its answers hold "
        "(1.0 for float32 answers; with --generation-dtype bfloat16, how close the copy's text is); one float32 "
        "forward per answer, about as long as the store's own pass",
    )
    parser.add_argument(
        "--heldout",
        action="store_true",
        help="with --self-generated: prompts from the held-out split (an evaluation store)",
    )
    parser.add_argument(
        "--seq-len", type=int, default=SEQ_LEN, help="tokens per window (with --self-generated: prompt + continuation)"
    )
    args = parser.parse_args(argv)
    from hf_specdraft.defaults.smollm2 import load_smollm2

    target, tokenizer = load_smollm2(dtype=torch.float32, device="cpu")
    dtype = getattr(torch, args.generation_dtype)
    writer = generation_model(target, dtype)  # writes the text; the store's labels come from `target`
    if args.requests:  # every answer is kept as it is written, so a rerun resumes; then the store, shard by shard
        from .requests import training_requests

        def draw():
            if args.written:  # the target writes the requests first (kept under the answers' written/, resumable)
                return written_requests(
                    writer, tokenizer, args.requests, args.request_seed, answers / "written", args.batch_size
                )
            return training_requests(args.requests, args.request_seed)

        answers = text_dir(args.output_dir, "answers", dtype)
        requests = kept_requests(answers / "requests.jsonl", draw)
        records = answered_requests(writer, tokenizer, requests, answers, args.max_new_tokens, args.batch_size)
        if args.check_answers:
            share, positions = answer_agreement(target, answers)
            print(f"the float32 target's greedy token is the one written at {share:.4f} of {positions} answer tokens")
        windows = request_windows(records, tokenizer.eos_token_id, args.seq_len)
    elif args.self_generated:  # generation is the slow part: its windows are kept, so a rerun only resumes the shards
        saved = text_dir(args.output_dir, "windows", dtype).with_suffix(".safetensors")
        if saved.is_file():
            windows = load_file(str(saved))["input_ids"]
        else:
            prompts = self_distillation_prompts(
                tokenizer, args.self_generated, skip=args.skip_prompts, split="heldout" if args.heldout else "train"
            )
            windows = self_generated_windows(
                writer,
                tokenizer,
                prompts,
                max_new_tokens=args.max_new_tokens,
                seq_len=args.seq_len,
                progress_dir=text_dir(args.output_dir, "generated", dtype),
            )
            saved.parent.mkdir(parents=True, exist_ok=True)
            save_file({"input_ids": windows.contiguous()}, str(saved))
    else:
        windows = build_windows(tokenizer, args.windows, seq_len=args.seq_len)
    n = target.config.num_hidden_layers
    write_store(target, windows, args.output_dir, list(range(n - args.layers, n)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
