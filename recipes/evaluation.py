"""Measures of the embedded default: held-out perplexity, unigram baseline, repeated 4-grams."""

from __future__ import annotations

import math
import random

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from hf_specdraft.glide.training.data import tokenize_texts
from hf_specdraft.glide.training.evaluation import heldout_windows


def heldout_text_windows(
    tokenizer: PreTrainedTokenizerFast, texts: list[str], seq_len: int, count: int, seed: int
) -> torch.Tensor:
    """``[count, seq_len]`` held-out windows drawn with a fixed seed from every text's non-overlapping windows
    (:func:`hf_specdraft.glide.training.evaluation.heldout_windows` of each text: none spans two texts)."""
    windows = []
    for ids in tokenize_texts(tokenizer, texts):
        if len(ids) >= seq_len:
            windows.extend(heldout_windows(torch.tensor(ids, dtype=torch.long), seq_len, len(ids) // seq_len))
    if not windows:
        raise ValueError(f"no held-out text is {seq_len} tokens long")
    random.Random(seed).shuffle(windows)
    return torch.stack(windows[:count])


def heldout_prompts(
    tokenizer: PreTrainedTokenizerFast,
    texts: list[str],
    count: int,
    seed: int,
    length: int = 128,
    continuation: int = 0,
) -> list[torch.Tensor]:
    """Prompts of ``length`` tokens taken from random positions of held-out files: ``[1, length]`` each.

    With ``continuation`` (≤ ``length``) each row also holds the file's next ``continuation`` tokens, for the
    same prompts: ``[1, length + continuation]``.
    """
    rng = random.Random(seed + 1)
    order = list(range(len(texts)))
    rng.shuffle(order)
    prompts = []
    for i in order:
        ids = tokenizer(texts[i], add_special_tokens=False)["input_ids"]
        if len(ids) >= 2 * length:
            start = rng.randrange(0, len(ids) - 2 * length)
            prompts.append(torch.tensor([ids[start : start + length + min(continuation, length)]]))
        if len(prompts) == count:
            break
    return prompts


@torch.no_grad()
def evaluate_perplexity(model: PreTrainedModel, windows: torch.Tensor, batch_size: int = 16) -> float:
    """exp(mean next-token cross-entropy) over ``windows`` ``[N, S]``."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for start in range(0, windows.shape[0], batch_size):
        batch = windows[start : start + batch_size].to(device)
        loss = model(input_ids=batch, labels=batch).loss.float().item()
        n = batch.shape[0] * (batch.shape[1] - 1)
        total, count = total + loss * n, count + n
    model.train(was_training)
    return math.exp(total / count)


def unigram_perplexity(train_ids: torch.Tensor, windows: torch.Tensor, vocab_size: int) -> float:
    """Perplexity of the add-one-smoothed unigram distribution of the train split on ``windows``."""
    counts = torch.bincount(train_ids.long(), minlength=vocab_size).double() + 1.0
    logp = (counts / counts.sum()).log()
    return math.exp(-logp[windows[:, 1:].reshape(-1)].mean().item())


def repeated_ngram_fraction(ids: list[int], n: int = 4) -> float:
    """Fraction of the n-grams of ``ids`` that already occurred earlier in ``ids`` (0 for none)."""
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


@torch.no_grad()
def repeat_fraction(model: PreTrainedModel, prompts: list[torch.Tensor], max_new_tokens: int = 64) -> float:
    """Mean repeated-4-gram fraction of greedy continuations (a looping LM scores high)."""
    device = next(model.parameters()).device
    fractions = []
    for prompt in prompts:
        out = model.generate(
            prompt.to(device), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        fractions.append(repeated_ngram_fraction(out[0, prompt.shape[1] :].tolist()))
    return sum(fractions) / max(len(fractions), 1)


def reference_repeat_fraction(windows: list[torch.Tensor], length: int = 128) -> float:
    """Mean repeated-4-gram fraction of the real text after each prompt (``windows`` from
    ``heldout_prompts(..., continuation=n)``): how repetitive the held-out code itself is."""
    fractions = [repeated_ngram_fraction(w[0, length:].tolist()) for w in windows]
    return sum(fractions) / max(len(fractions), 1)


def perplexity_by_source(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, files, seq_len: int, count: int, seed: int
) -> dict[str, float]:
    """Held-out perplexity per corpus source (``stdlib``, ``transformers``, …: a file name's first part).

    Sources differ a lot: transformers' model files are near-copies of each other ("Copied from"), so a
    file-level split leaves close relatives of its held-out files in the train split.
    """
    groups: dict[str, list[str]] = {}
    for f in files:
        groups.setdefault(f.name.split("/")[0], []).append(f.read())
    result = {}
    for source, texts in sorted(groups.items()):
        windows = heldout_text_windows(tokenizer, texts, seq_len, count, seed)
        if windows.shape[0]:
            result[source] = round(evaluate_perplexity(model, windows), 3)
    return result
