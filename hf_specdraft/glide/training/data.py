"""What GLIDE trains on: token / text files (``--data``) or a 🤗 ``datasets`` dataset (``--dataset``, an optional
dependency imported on first use) of plain text (a ``text`` column) or conversations (a ``messages`` column of
``{"role", "content"}``), rendered with the target's chat template so the draft learns the text the target sees.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from .objective import token_stream

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst")
# datasets' packaged builder for each file kind --dataset reads locally
DATASET_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".arrow": "arrow"}


def load_examples(source: str, split: str = "train"):
    """A ``datasets.Dataset`` from a ``.json`` / ``.jsonl`` / ``.parquet`` / ``.arrow`` file, a directory of such files
    (one kind), a ``Dataset.save_to_disk`` directory, or a Hub dataset id (``"org/name"``, read at ``split``)."""
    try:
        import datasets
    except ImportError as error:
        raise ImportError(
            '--dataset needs the datasets library: pip install "hf-specdraft[train]" (or pip install datasets)'
        ) from error
    path = Path(source).expanduser()
    if path.is_dir() and (path / "dataset_info.json").is_file() and (path / "state.json").is_file():
        return datasets.load_from_disk(str(path))  # a Dataset's directory (a DatasetDict's has no state.json)
    if path.exists():
        files = sorted(p for p in path.rglob("*") if p.suffix in DATASET_BUILDERS) if path.is_dir() else [path]
        kinds = {DATASET_BUILDERS.get(p.suffix) for p in files}
        if not files or None in kinds or len(kinds) > 1:
            raise ValueError(
                f"--dataset {source!r} must be one kind of {sorted(DATASET_BUILDERS)} files (or a directory of "
                f"them), found {sorted({p.suffix or p.name for p in files}) or 'no such files'}"
            )
        return datasets.load_dataset(kinds.pop(), data_files=[str(p) for p in files], split="train")
    if source.startswith((".", "/", "~")) or source.count("/") > 1 or not source.strip():
        raise ValueError(
            f"--dataset {source!r} is neither an existing local file or directory nor a Hub dataset id like 'org/name'"
        )
    return datasets.load_dataset(source, split=split)  # the Hub (not reached by the tests: they run offline)


class Column(NamedTuple):
    """Which column holds the training text: ``kind`` ``"text"`` (plain strings) or ``"messages"`` (conversations)."""

    kind: str
    name: str


def detect_column(examples, text_column: str = "text", messages_column: str = "messages") -> Column:
    """The conversations column when it exists (they carry the chat template), else the text column."""
    names = list(examples.column_names)
    if messages_column in names:
        return Column("messages", messages_column)
    if text_column in names:
        return Column("text", text_column)
    raise ValueError(
        f"the dataset has neither a text column {text_column!r} (--text-column) nor a messages column "
        f"{messages_column!r} (--messages-column); its columns are {names}"
    )


def check_messages(messages, index: int) -> list[dict]:
    """``messages`` as a list of ``{"role": str, "content": str}``, or a `ValueError` naming example ``index``."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(
            f"example {index}: messages must be a non-empty list of {{role, content}}, got {type(messages).__name__}"
        )
    for turn in messages:
        if not (isinstance(turn, dict) and all(isinstance(turn.get(key), str) for key in ("role", "content"))):
            raise ValueError(f"example {index}: every message must be {{'role': str, 'content': str}}, got {turn!r}")
    return [{"role": turn["role"], "content": turn["content"]} for turn in messages]


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """``messages`` as the target sees them: the tokenizer's chat template, as text (its special tokens included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the dataset holds conversations but the target's tokenizer has no chat_template; pass --tokenizer "
            "with one, or a dataset with a text column (--text-column)"
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def render_texts(examples, column: Column, tokenizer) -> list[str]:
    """One training text per example: the text column as it is, or each conversation through the chat template."""
    values = examples[column.name]
    if column.kind == "text":
        bad = [i for i, value in enumerate(values) if not isinstance(value, str)]
        if bad:
            raise ValueError(
                f"text column {column.name!r} must hold strings; example {bad[0]} holds {type(values[bad[0]]).__name__}"
            )
        return list(values)
    return [render_chat(tokenizer, check_messages(messages, i)) for i, messages in enumerate(values)]


def heldout_split(
    count: int, eval_fraction: float = 0.0, eval_examples: int = 0, seed: int = 0
) -> tuple[list[int], list[int]]:
    """``(train indices, held-out indices)`` of ``count`` examples, seeded: a vanilla twin with the same seed and data
    holds out the same examples. ``eval_examples`` wins over ``eval_fraction``."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    held = eval_examples or round(count * eval_fraction)
    if held and held >= count:
        raise ValueError(
            f"holding out {held} of {count} examples leaves none to train on; lower --eval-examples / --eval-fraction"
        )
    return sorted(order[held:]), sorted(order[:held])


def tokenize_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text; no special tokens added (a chat template already wrote its own)."""
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def load_data(paths: list[str], tokenizer_path: str | None) -> torch.Tensor:
    """Token ids from files (``--data``): ``.safetensors`` / ``.pt`` tensors (``input_ids`` or the only tensor), or
    text files / directories of text files tokenized with the target's tokenizer."""
    tensors, texts = [], []
    for path in map(Path, paths):
        if not path.exists():
            raise ValueError(f"--data {path} does not exist")
        files = sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES) if path.is_dir() else [path]
        for file in files:
            if file.suffix == ".safetensors":
                loaded = load_file(file)
                tensors.append(loaded["input_ids"] if "input_ids" in loaded else next(iter(loaded.values())))
            elif file.suffix == ".pt":
                tensors.append(torch.load(file, weights_only=True))
            else:
                texts.append(file.read_text(encoding="utf-8", errors="replace"))
    if texts:
        if tokenizer_path is None:
            raise ValueError("--data has text files: pass --tokenizer (defaults to --target)")
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        tensors.append(token_stream(tokenize_texts(tokenizer, texts), tokenizer.eos_token_id))
    if not tensors:
        raise ValueError(f"--data {paths} holds no token files or text files ({', '.join(TEXT_SUFFIXES)})")
    return torch.cat([token_stream(t) for t in tensors])
