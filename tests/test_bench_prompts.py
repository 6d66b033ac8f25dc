"""`hf-specdraft bench --prompts FILE.jsonl`: Spec-Bench's question format, each turn in order, a table per category."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, tiny_model

from hf_specdraft.bench import BenchConfig
from hf_specdraft.bench import methods as bench_methods
from hf_specdraft.bench import prompts as bench_prompts
from hf_specdraft.defaults import DefaultBundle

pytestmark = pytest.mark.usefixtures("one_thread")

SPECIAL = ["<unk>", "<pad>", "<eos>", "<|user|>", "<|assistant|>"]
WORDS = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer over the tiny models' 96 ids, with a chat template (decoded answers re-encode exactly)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(SPECIAL + WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def bundle_of(tokenizer, max_positions: int = 512) -> DefaultBundle:
    target = tiny_model("llama", seed=0, max_position_embeddings=max_positions)
    return DefaultBundle(target, tiny_model("llama", seed=1, num_hidden_layers=1), tokenizer, path=Path("tiny"))


def line(qid, category, turns, **extra) -> str:
    return json.dumps({"question_id": qid, "category": category, "turns": turns, **extra})


def test_parses_spec_bench_lines_keeping_other_fields(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(line(81, "writing", ["w1 w2", "w3"], reference=["x"]) + "\n\n" + line("a", "qa", ["w4"]) + "\n")
    first, second = bench_prompts.read_prompts(path)
    assert (first.question_id, first.category, first.turns, first.line, first.extra) == (
        81,
        "writing",
        ("w1 w2", "w3"),
        1,
        {"reference": ["x"]},
    )
    assert (second.question_id, second.turns, second.line) == ("a", ("w4",), 3)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"question_id": 1, "category": "qa", "turns": ["a"]\n', r"q.jsonl:1: not valid JSON"),
        (line(1, "qa", ["a"]) + "\n[1, 2]\n", r"q.jsonl:2: a JSON list, not an object"),
        ('{"question_id": 1, "turns": ["a"]}\n', r"q.jsonl:1: missing field 'category'"),
        ('{"category": "qa"}\n', r"q.jsonl:1: missing fields 'question_id', 'turns'"),
        (line(1, "qa", "just one string") + "\n", r"q.jsonl:1: 'turns' is 'just one string', not a non-empty list"),
        (line(1, "qa", []) + "\n", r"q.jsonl:1: 'turns' is \[\], not a non-empty list"),
        (line(1, "qa", ["a", 3]) + "\n", r"q.jsonl:1: turn 2 of 'turns' is 3, not a non-empty string"),
        (line(1, 7, ["a"]) + "\n", r"q.jsonl:1: 'category' is 7, not a non-empty string"),
        (line(True, "qa", ["a"]) + "\n", r"q.jsonl:1: 'question_id' is True, not an int or a string"),
        (line(1, "qa", ["a"]) + "\n" + line(1, "qa", ["b"]) + "\n", r"q.jsonl:2: 'question_id' 1 repeats line 1's"),
        ("\n\n", r"q.jsonl: no question"),
    ],
)
def test_a_malformed_file_names_the_file_the_line_and_what_is_valid(tmp_path, text, message):
    path = tmp_path / "q.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as caught:
        bench_prompts.read_prompts(path)
    if "no question" not in message:
        assert "'question_id'" in str(caught.value) and "'turns'" in str(caught.value)  # what a valid line holds


def test_a_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        bench_prompts.read_prompts(tmp_path / "nope.jsonl")


def test_a_prompt_longer_than_the_target_s_context_is_refused_before_running(tokenizer):
    questions = bench_prompts.parse_prompts(
        line(1, "qa", ["w1 w2 w3"]) + "\n" + line(2, "mt", [" ".join(WORDS), "w1"]) + "\n", "q.jsonl"
    )
    bench_prompts.check_lengths(questions[:1], tokenizer, 16, limit=64)
    with pytest.raises(
        ValueError, match=r"q.jsonl:2: question 2 needs up to \d+ tokens .* more than the target's context of 64"
    ):
        bench_prompts.check_lengths(questions, tokenizer, 16, limit=64)
    with pytest.raises(ValueError, match=r"q.jsonl:1: .*context of 20 tokens"):
        bench_prompts.run_prompts_bench(
            bundle_of(tokenizer, max_positions=20),
            BenchConfig(methods=("target-only",), max_new_tokens=16, repeats=1, warmup=0),
            questions,
        )


def baselines_here(bundle) -> tuple[str, ...]:
    return tuple(
        m
        for m in bench_prompts.BASELINES
        if bench_methods.METHODS[m].available(bundle.extras, bundle.draft is not None)
    )


def test_second_turn_runs_with_the_first_turn_and_the_target_s_answer_in_context(tokenizer, monkeypatch):
    bundle = bundle_of(tokenizer)
    seen = []
    original = bench_prompts.chat_ids

    def spy(tok, messages):
        seen.append(messages)
        return original(tok, messages)

    monkeypatch.setattr(bench_prompts, "chat_ids", spy)
    questions = bench_prompts.parse_prompts(
        line(1, "multi", ["w1 w2 w3", "w4 w5"]) + "\n" + line(2, "single", ["w6 w7"]) + "\n"
    )
    config = BenchConfig(methods=baselines_here(bundle), max_new_tokens=6, repeats=1, warmup=0)
    result = bench_prompts.run_prompts_bench(bundle, config, questions, warn=False)
    assert result["units"] == [[0, 0], [0, 1], [1, 0]]
    first = next(r for r in result["records"] if r["prompt"] == 0 and r["method"] == "target-only")
    answer = tokenizer.decode(first["tokens"], skip_special_tokens=True)
    chat = [
        {"role": "user", "content": "w1 w2 w3"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "w4 w5"},
    ]
    assert answer and chat in seen  # (the length check before the run counts a placeholder answer)
    # what the second turn's methods were given: the chat template of that conversation
    second_prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    expected = tokenizer(second_prompt, return_tensors="pt", add_special_tokens=False).input_ids
    reference = bundle.target.generate(
        expected,
        max_new_tokens=6,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )[0, expected.shape[1] :].tolist()
    second = next(r for r in result["records"] if r["prompt"] == 1 and r["method"] == "target-only")
    assert second["tokens"] == reference
    # lossless baselines
    assert all(r["tokens"] == second["tokens"] for r in result["records"] if r["prompt"] == 1 and "tokens" in r)


def test_the_table_has_every_category_and_an_overall_row_against_every_baseline(tokenizer):
    bundle = bundle_of(tokenizer)
    text = (
        "\n".join([line(1, "translation", ["w1 w2"]), line(2, "qa", ["w3 w4 w5"]), line(3, "qa", ["w6", "w7 w8"])])
        + "\n"
    )
    methods = baselines_here(bundle)
    result = bench_prompts.run_prompts_bench(
        bundle,
        BenchConfig(methods=methods, max_new_tokens=4, repeats=2, warmup=1),
        bench_prompts.parse_prompts(text),
        warn=False,
    )
    categories = result["categories"]
    assert list(categories) == ["translation", "qa", "overall"]
    assert [categories[c]["questions"] for c in categories] == [1, 2, 3] and categories["overall"]["prompts"] == 4
    for row in categories.values():
        for m in methods:
            cell = row["methods"][m]
            # stock generate: per forward
            assert cell["equals_target_only"] == 1.0 and cell["mal"] == cell["tokens_per_target_call"] > 0
            assert set(cell["speedup_vs"]) == set(methods) and cell["speedup_vs"][m] == pytest.approx(1.0)
    assert categories["overall"]["methods"]["target-only"]["speedup_vs_target_only"] == pytest.approx(1.0)
    for key in ("hardware", "dtype", "versions"):
        assert key in result["meta"]
    table = bench_prompts.format_category_table(result)
    header = table.splitlines()[0] if result["timing"]["reliable"] else table.splitlines()[1]
    assert header.split() == ["speedup", "translation", "qa", "overall"]
    for m in methods:
        assert any(row.startswith(m + " ") for row in table.splitlines())
    assert "overall vs" in table and "MAL" in table and "=target" in table


def test_the_shipped_prompts_parse_and_keep_the_held_out_split():
    from hf_specdraft.defaults.corpus import is_heldout

    questions = bench_prompts.read_prompts(bench_prompts.DEFAULT_PROMPTS)
    groups = bench_prompts.categories_in_order(questions)
    assert len(groups) == 7 and all(sum(q.category == g for q in questions) >= 8 for g in groups)
    assert any(len(q.turns) == 2 for q in questions)
    for q in questions:
        assert q.extra["split"] == "heldout"
        source = q.extra["source"]
        if source.startswith("Python stdlib/"):  # passages come only from files the corpus holds out from training
            assert is_heldout(source.split()[1])


def test_cli_refuses_a_malformed_file_before_loading_a_model(tmp_path, capsys, monkeypatch):
    from hf_specdraft import cli

    monkeypatch.setattr(cli, "load_bundle", lambda *a, **k: pytest.fail("loaded a model"))
    path = tmp_path / "q.jsonl"
    path.write_text(line(1, "qa", ["a"]) + "\n{oops\n")
    assert cli.main(["bench", "--prompts", str(path)]) == 2
    assert f"{path}:2: not valid JSON" in capsys.readouterr().err


def test_cli_runs_a_prompts_file(tokenizer, tmp_path, capsys, monkeypatch):
    from hf_specdraft import cli

    bundle = bundle_of(tokenizer)
    monkeypatch.setattr(cli, "load_bundle", lambda *a, **k: bundle)
    path = tmp_path / "q.jsonl"
    path.write_text(line(1, "qa", ["w1 w2"]) + "\n" + line(2, "multi", ["w3", "w4"]) + "\n")
    out = tmp_path / "out.json"
    argv = [
        "bench",
        "--prompts",
        str(path),
        "--methods",
        ",".join(baselines_here(bundle)),
        "--max-new-tokens",
        "4",
        "--repeats",
        "1",
        "--output",
        str(out),
    ]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "overall" in printed and f"wrote {out}" in printed
    saved = json.loads(out.read_text())
    assert saved["meta"]["prompts"] == str(path) and list(saved["categories"]) == ["qa", "multi", "overall"]
    assert torch.is_tensor(torch.tensor(saved["units"]))


def test_a_run_records_the_command_that_started_it(monkeypatch):
    import sys
    import types

    from hf_specdraft.bench.harness import run_command

    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/hf-specdraft", "bench", "--prompts", "default"])
    assert run_command() == "hf-specdraft bench --prompts default"
    monkeypatch.setattr(sys, "argv", ["/repo/benchmarks/bench.py", "--prompts", "f.jsonl"])
    main.__spec__ = types.SimpleNamespace(name="benchmarks.bench")
    assert run_command() == "python -m benchmarks.bench --prompts f.jsonl"
    main.__spec__ = types.SimpleNamespace(name="hf_specdraft.__main__")
    assert run_command() == "hf-specdraft --prompts f.jsonl"
    main.__spec__ = None  # a notebook or a script run by path: no command line to repeat
    assert run_command() is None


def test_a_user_target_loads_as_the_help_says_for_auto(monkeypatch, tmp_path):
    """``--dtype auto``: fp32 on CPU, bf16 on CUDA, as the embedded default loads; a ``--draft`` takes the target's."""
    import transformers

    from hf_specdraft import cli

    loaded = []

    class Loaded:
        def __init__(self, dtype):
            self.dtype, self.device = dtype, "cpu"

        def to(self, device):
            return self

        def eval(self):
            return self

    def from_pretrained(name, dtype):
        loaded.append(dtype)
        return Loaded(dtype)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    for cuda, expected in ((False, torch.float32), (True, torch.bfloat16)):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        target = cli._load_causal_lm(str(tmp_path), "--target")
        cli._load_causal_lm(str(tmp_path), "--draft", like=target)
        assert loaded[-2:] == [expected, expected]
