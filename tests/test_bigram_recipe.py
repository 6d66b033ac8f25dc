"""The shipped bigram table's recipe (recipes.bigram): a corpus, the target's answers weighted above it, bad folders."""

import json

import pytest
from safetensors import safe_open

from hf_specdraft.cascade import load_bigram_table
from hf_specdraft.defaults.corpus import is_heldout
from recipes.bigram import main
from recipes.tokenizer import train_tokenizer


def test_the_recipe_builds_a_table(tmp_path, capsys):
    source = tmp_path / "code"
    source.mkdir()
    texts = [f"def f{i}(x):\n    return x + {i}\n" for i in range(40)]
    for i, text in enumerate(texts):
        (source / f"m{i}.py").write_text(text)
    assert any(is_heldout(f"source/m{i}.py") for i in range(40))  # both splits non-empty
    tok_dir = tmp_path / "tok"
    train_tokenizer(texts, vocab_size=300).save_pretrained(tok_dir)
    corpus = ["--tokenizer", str(tok_dir), "--source", str(source)]
    output = tmp_path / "table.safetensors"
    assert main([*corpus, "--output", str(output)]) == 0
    with safe_open(str(output), framework="pt", device="cpu") as f:
        assert load_bigram_table(output).numel() == 300 and f.metadata()["split"] == "train"
    # the target's answers, weighted past the corpus: after id 7 the answers say 9, whatever the corpus says
    answers = tmp_path / "answers" / "turn-1"
    answers.mkdir(parents=True)
    (answers / "shard-00000.jsonl").write_text(json.dumps({"prompt_ids": [5, 7], "response_ids": [9, 7, 9]}) + "\n")
    (tmp_path / "answers" / "requests.jsonl").write_text(json.dumps({"group": "qa", "turns": ["hi"]}) + "\n")
    weighted = tmp_path / "weighted.safetensors"
    argv = [*corpus, "--output", str(weighted), "--answers", str(tmp_path / "answers"), "--answers-weight", "1000"]
    assert main(argv) == 0
    with safe_open(str(weighted), framework="pt", device="cpu") as f:
        assert int(load_bigram_table(weighted)[7]) == 9 and f.metadata()["answers"] == "1"
    # a folder without answers is refused by name
    with pytest.raises(SystemExit) as exit_info:
        main([*corpus, "--output", str(weighted), "--answers", str(source)])
    assert exit_info.value.code == 2
    assert f"recipes.bigram: error: --answers: {str(source)!r} holds no .jsonl" in capsys.readouterr().err
