"""The shipped Max-Gram fallback table: :func:`hf_specdraft.cascade.build_bigram_table` over the embedded default's
corpus of installed Python files (or ``--source``) and the target's own answers from distillation stores.

    python -m recipes.bigram --output bigram.safetensors --answers STORE_A/answers --answers-weight 20
    python -m recipes.bigram --tokenizer TOKENIZER_DIR --source path/to/code --output bigram.safetensors
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipes.bigram", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the embedded default target's)")
    parser.add_argument("--output", required=True, help="safetensors file to write")
    parser.add_argument("--source", help="a directory of .py files to use instead of the embedded default's corpus")
    parser.add_argument("--split", choices=("train", "heldout"), default="train", help="corpus split (default: train)")
    parser.add_argument("--max-files", type=int, help="read only the first N files of the split (quick runs)")
    parser.add_argument(
        "--unseen",
        choices=("most_frequent", "self"),
        default="most_frequent",
        help="what ids never seen map to (default: most_frequent)",
    )
    parser.add_argument(
        "--answers",
        action="append",
        metavar="DIR",
        help="also count a folder of the target's answers (JSON lines with prompt_ids, response_ids); repeatable",
    )
    parser.add_argument(
        "--answers-weight",
        type=int,
        default=1,
        metavar="N",
        help="count every answer N times: the target's own text against the corpus's far larger one (default: 1)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, value in (("--max-files", args.max_files), ("--answers-weight", args.answers_weight)):
        if value is not None and value < 1:  # before the slow imports below
            parser.error(f"{flag} must be a positive int, got {value}")
    from transformers import AutoTokenizer

    from hf_specdraft.cascade import build_bigram_table, save_bigram_table
    from hf_specdraft.defaults.corpus import build_corpus
    from hf_specdraft.defaults.smollm2 import converted_dir

    def checked(prefix: str, make):  # a bad argument is one error line, named by its flag
        try:
            return make()
        except ValueError as err:
            parser.error(f"{prefix}{err}")

    tokenizer_dir = (
        Path(args.tokenizer)
        if args.tokenizer is not None
        else checked("--tokenizer not given and the default target is not available: ", converted_dir)
    )
    if not tokenizer_dir.is_dir():
        parser.error(f"--tokenizer {str(tokenizer_dir)!r} is not a directory")
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


if __name__ == "__main__":
    raise SystemExit(main())
