"""``hf-specdraft build-bigram``: Max-Gram's bigram fallback table (:func:`hf_specdraft.cascade.build_bigram_table`)
from the embedded default's corpus and tokenizer, which is why this command lives here, above the methods.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from ..cascade.bigram import build_bigram_table, save_bigram_table
from ..core.validation import check_int


def answer_ids(folder: str | Path) -> list[list[int]]:
    """Every conversation in a folder of answer shards (``*.jsonl``, recursively; JSON lines with ``prompt_ids`` and
    ``response_ids``): the prompt's ids then the answer's, one list each."""
    shards = sorted(Path(folder).rglob("*.jsonl"))
    if not shards:
        raise ValueError(f"{str(folder)!r} holds no .jsonl answer shards")
    records = [json.loads(line) for shard in shards for line in shard.read_text().splitlines()]
    # lines without response_ids are no answers (e.g. a kept list of requests)
    out = [[*record.get("prompt_ids", []), *record["response_ids"]] for record in records if "response_ids" in record]
    if not out:
        raise ValueError(f"{str(folder)!r}: no line has 'response_ids'")
    return out


def build_bigram(args) -> int:
    """``hf-specdraft build-bigram`` (its options: ``hf_specdraft.cli``): tokenize a corpus, build the argmax bigram
    table, save it."""
    for flag, value in (("--max-files", args.max_files), ("--answers-weight", args.answers_weight)):
        if value is not None:
            check_int(flag, value)
    from transformers import AutoTokenizer

    from .corpus import build_corpus
    from .smollm2 import converted_dir

    def checked(prefix: str, make):  # a bad argument is one error line, named by its flag
        try:
            return make()
        except ValueError as err:
            raise ValueError(f"{prefix}{err}") from None

    tokenizer_dir = (
        Path(args.tokenizer)
        if args.tokenizer is not None
        else checked("--tokenizer not given and the default target is not available: ", converted_dir)
    )
    if not tokenizer_dir.is_dir():
        raise ValueError(f"--tokenizer {str(tokenizer_dir)!r} is not a directory")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    corpus = checked("--source: ", lambda: build_corpus(roots={"source": Path(args.source)} if args.source else None))
    answers = checked("--answers: ", lambda: [ids for folder in args.answers or () for ids in answer_ids(folder)])
    files = getattr(corpus, args.split)[: args.max_files]
    ids = itertools.chain(
        (tokenizer(f.read(), add_special_tokens=False)["input_ids"] for f in files), answers * args.answers_weight
    )
    table = build_bigram_table(ids, len(tokenizer), unseen=args.unseen)
    meta = {"tokenizer": tokenizer_dir, "split": args.split, "files": len(files), "unseen": args.unseen}
    save_bigram_table(table, args.output, {**meta, "answers": len(answers), "answers_weight": args.answers_weight})
    print(
        f"wrote {args.output}: {table.numel()} entries from {len(files)} {args.split} files and {len(answers)} answers"
    )
    return 0
