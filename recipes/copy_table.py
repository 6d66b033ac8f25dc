"""Write a copy table into a GLIDE checkpoint: what most often followed each short context in the target's answers
(:mod:`hf_specdraft.core.ngram_table`), which the default call copies from where a request's own text offers no copy.

    python -m recipes.copy_table hf_specdraft/defaults/checkpoint_smollm2/glide \\
        --answers STORE_A/answers --answers STORE_B/answers
    python -m recipes.copy_table hf_specdraft/defaults/checkpoint_smollm2/vanilla \\
        --table-from hf_specdraft/defaults/checkpoint_smollm2/glide   # the same table, for another drafter of it

The answers are the target's greedy answers to training requests (``python -m recipes.distillation STORE --requests
N``), never an evaluation set. The checkpoint's weights stay as they are: the table goes into ``model.safetensors``
(``copy_table_keys``, ``copy_table_tokens``) and its size and context lengths into ``config.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hf_specdraft.core.ngram_table import build_ngram_table

from .bigram import answer_ids


def _glide_files(checkpoint: str | Path, argument: str = "checkpoint") -> tuple[Path, Path, dict]:
    """``(model.safetensors, config.json, the config)`` of a GLIDE checkpoint directory, else a ValueError."""
    checkpoint = Path(checkpoint)
    weights, config_file = checkpoint / "model.safetensors", checkpoint / "config.json"
    if not weights.is_file() or not config_file.is_file():
        raise ValueError(
            f"{argument} must be a GLIDE checkpoint directory (model.safetensors, config.json): {checkpoint}"
        )
    config = json.loads(config_file.read_text())
    if config.get("model_type") != "glide":
        raise ValueError(f"{argument} must be a GLIDE checkpoint, got model_type {config.get('model_type')!r}")
    return weights, config_file, config


def write_copy_table(
    checkpoint: str | Path, answers: list[list[int]], orders=(4, 3), min_count: int = 4, min_share: float = 0.5
) -> int:
    """Build the table from ``answers`` (token id lists) and write it into ``checkpoint`` (replacing any earlier one);
    returns its entries."""
    _glide_files(checkpoint)
    keys, tokens = build_ngram_table(answers, orders, min_count, min_share)
    return _write_table(checkpoint, keys, tokens, orders)


def copy_table_from(checkpoint: str | Path, source: str | Path) -> int:
    """Write the copy table ``source`` carries into ``checkpoint`` (replacing any earlier one); both drafters of the
    same target (the table holds target token ids). Returns its entries."""
    ours = _glide_files(checkpoint)[2]
    weights, _, config = _glide_files(source, "--table-from")
    if not config.get("copy_table_size"):
        raise ValueError(f"--table-from {str(source)!r} carries no copy table")
    if (ours.get("target_name_or_path"), ours.get("target_vocab_size")) != (
        config.get("target_name_or_path"),
        config.get("target_vocab_size"),
    ):
        raise ValueError(
            f"--table-from {str(source)!r} was built for target {config.get('target_name_or_path')!r}, the checkpoint "
            f"for {ours.get('target_name_or_path')!r}: a copy table holds one target's token ids"
        )
    with safe_open(str(weights), framework="pt") as f:
        keys, tokens = f.get_tensor("copy_table_keys"), f.get_tensor("copy_table_tokens")
    return _write_table(checkpoint, keys, tokens, config["copy_table_orders"])


def _write_table(checkpoint: str | Path, keys, tokens, orders) -> int:
    weights, config_file, config = _glide_files(checkpoint)
    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(weights))
    tensors.update(copy_table_keys=keys, copy_table_tokens=tokens)
    save_file(tensors, str(weights), metadata=metadata)
    config.update(copy_table_size=int(keys.numel()), copy_table_orders=sorted(orders, reverse=True))
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return int(keys.numel())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a GLIDE checkpoint directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--answers", action="append", help="an answer store's answers folder; repeat")
    source.add_argument("--table-from", help="a GLIDE checkpoint of the same target whose copy table to copy")
    parser.add_argument("--orders", default="4,3", help="the context lengths the table keys on")
    parser.add_argument(
        "--min-count",
        type=int,
        default=4,
        help="how often a context must have occurred (2 keeps about 3.5 times the entries, for a few more proposals)",
    )

    parser.add_argument("--min-share", type=float, default=0.5, help="how often its token must have followed it")
    ns = parser.parse_args(argv)
    if ns.table_from:
        try:
            size = copy_table_from(ns.checkpoint, ns.table_from)
        except ValueError as error:
            parser.error(str(error))
        print(f"wrote the copy table of {ns.table_from} ({size:,} contexts) into {ns.checkpoint}")
        return 0
    try:
        orders = tuple(int(k) for k in ns.orders.split(","))
        texts = [ids for folder in ns.answers for ids in answer_ids(folder)]
        size = write_copy_table(ns.checkpoint, texts, orders, ns.min_count, ns.min_share)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote a copy table of {size:,} contexts from {len(texts):,} answers into {ns.checkpoint}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
