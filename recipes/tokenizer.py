"""Byte-level BPE tokenizer for the embedded default, trained with 🤗 tokenizers on the train split."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_chars: int | None = None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer and wrap it as a transformers tokenizer.

    Args:
        texts: training documents (the corpus train split).
        vocab_size: final vocabulary size, special tokens included.
        max_chars: stop reading ``texts`` after this many characters (BPE merges settle long before the
            whole corpus is read; this keeps ``python -m recipes.training`` quick).
    """
    if vocab_size < 300:
        raise ValueError(f"vocab_size must be at least 300 (256 byte tokens + specials + merges), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_limit(texts, max_chars), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, bos_token=None)


def _limit(texts: Iterable[str], max_chars: int | None) -> Iterator[str]:
    seen = 0
    for text in texts:
        yield text
        seen += len(text)
        if max_chars is not None and seen >= max_chars:
            return
