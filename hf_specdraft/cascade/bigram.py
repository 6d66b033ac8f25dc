"""The argmax bigram table Max-Gram falls back to (Chen et al. 2024, §3.3; the paper counts Wikipedia); the shipped
one's recipe is ``python -m recipes.bigram``.

``table[t]`` is the token that most often follows ``t`` in a corpus (ties: the smallest id); a token never followed
maps to the corpus's most frequent token (``unseen="most_frequent"``) or to itself (``unseen="self"``). Pairs are
counted sparsely (``prev * V + next`` int64 keys), so memory follows the distinct pairs, not ``V²``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..core.drafting import output_vocab_size
from ..core.validation import check_int

TABLE_KEY = "bigram_table"
FORMAT = "hf_specdraft.bigram_table.v1"
MERGE_EVERY = 4_000_000  # pending pair keys before they are reduced to (unique key, count); bounds memory


def check_bigram_table(
    table: torch.Tensor, vocab_size: int | None = None, argument: str = "bigram_table"
) -> torch.LongTensor:
    """Validate a bigram table: a 1-D integer tensor of ids in ``[0, vocab_size)``, at most ``vocab_size`` long."""
    integral = isinstance(table, torch.Tensor) and not (table.is_floating_point() or table.dtype == torch.bool)
    if not integral or table.dim() != 1 or table.numel() == 0:
        raise ValueError(
            f"{argument} must be a non-empty 1-D integer tensor (next token id per token id), got "
            f"{type(table).__name__} {tuple(getattr(table, 'shape', ()))}"
        )
    table = table.long()
    if vocab_size is not None and table.numel() > vocab_size:
        raise ValueError(
            f"{argument} has {table.numel()} entries but the target predicts only {vocab_size} token ids; build it "
            "with the target's tokenizer"
        )
    limit = table.numel() if vocab_size is None else vocab_size
    if int(table.min()) < 0 or int(table.max()) >= limit:
        raise ValueError(f"{argument} holds token ids outside [0, {limit})")
    return table


def _merge(keys: torch.Tensor, counts: torch.Tensor, pending: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique key, count)`` of the counted ``keys`` and the ``pending`` key tensors (one count each)."""
    added = torch.ones(sum(p.numel() for p in pending), dtype=torch.long)
    keys, inverse = torch.unique(torch.cat([keys, *pending]), return_inverse=True)
    return keys, torch.zeros(keys.numel(), dtype=torch.long).index_add_(0, inverse, torch.cat([counts, added]))


def build_bigram_table(
    token_ids_iterable: Iterable, vocab_size: int, unseen: str = "most_frequent"
) -> torch.LongTensor:
    """Argmax next-token table `(V,)` from sequences of token ids (e.g. one per document; pairs are counted inside each,
    never across two); ``vocab_size``: V (``len(tokenizer)``); ``unseen``: see the module."""
    check_int("vocab_size", vocab_size)
    if unseen not in ("most_frequent", "self"):
        raise ValueError(f"unseen must be 'most_frequent' or 'self', got {unseen!r}")
    keys = counts = torch.zeros(0, dtype=torch.long)
    unigram = torch.zeros(vocab_size, dtype=torch.long)
    pending, pending_size = [], 0
    for ids in token_ids_iterable:
        ids = torch.as_tensor(ids).long().flatten().cpu()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            low, high = int(ids.min()), int(ids.max())
            raise ValueError(f"token ids must be in [0, vocab_size={vocab_size}), got ids in [{low}, {high}]")
        unigram += torch.bincount(ids, minlength=vocab_size)
        pending.append(ids[:-1] * vocab_size + ids[1:])  # pair keys, empty for fewer than 2 ids
        pending_size += pending[-1].numel()
        if pending_size >= MERGE_EVERY:
            (keys, counts), pending, pending_size = _merge(keys, counts, pending), [], 0
    keys, counts = _merge(keys, counts, pending)
    if unseen == "most_frequent" and int(unigram.sum()) > 0:
        table = torch.full((vocab_size,), int(unigram.argmax()), dtype=torch.long)
    else:
        table = torch.arange(vocab_size, dtype=torch.long)
    # per prev, the next of the largest count * V + (V - 1 - next): the most frequent, ties the smallest id
    score = counts * vocab_size + vocab_size - 1 - keys % vocab_size
    best = torch.full((vocab_size,), -1, dtype=torch.long).scatter_reduce_(0, keys // vocab_size, score, "amax")
    followed = best >= 0
    table[followed] = vocab_size - 1 - best[followed] % vocab_size
    return table


def save_bigram_table(table: torch.Tensor, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``table`` `(V,)` to a safetensors file (key ``"bigram_table"``), with string ``metadata``."""
    table = check_bigram_table(table)
    meta = {"format": FORMAT, "vocab_size": str(table.numel()), **{str(k): str(v) for k, v in (metadata or {}).items()}}
    save_file({TABLE_KEY: table.contiguous().cpu()}, str(path), metadata=meta)


def load_bigram_table(path: str | Path, device: str | torch.device = "cpu") -> torch.LongTensor:
    """Read a table written by :func:`save_bigram_table`. Returns `torch.LongTensor` `(V,)`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"bigram table file {str(path)!r} does not exist (write one with save_bigram_table)")
    tensors = load_file(str(path))
    if TABLE_KEY not in tensors:
        raise ValueError(f"{str(path)!r} holds no {TABLE_KEY!r} tensor; it was not written by save_bigram_table")
    return check_bigram_table(tensors[TABLE_KEY], argument=f"the table in {str(path)!r}").to(device)


def target_bigram_table(target, bigram_table: torch.Tensor | str | Path | None) -> torch.LongTensor | None:
    """A table (a tensor, or a file written by :func:`save_bigram_table`) checked against ``target``'s vocabulary."""
    if isinstance(bigram_table, (str, Path)):
        bigram_table = load_bigram_table(bigram_table)
    if bigram_table is None:
        return None
    return check_bigram_table(bigram_table, output_vocab_size(target)).to(target.device)
