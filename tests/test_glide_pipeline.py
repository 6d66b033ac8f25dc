"""`hf-specdraft train-glide --dataset ... --regenerate --eval-every N` end to end on a tiny target: chat and
text datasets, replies by the target (Du et al. 2024, Appendix B), held-out α on the card, resume after a kill."""

from __future__ import annotations

import importlib.util
import json
import random

import pytest
import torch
from safetensors.torch import load_file

from conftest import VOCAB, tiny_model
from hf_specdraft.glide.training import regenerate as regenerate_module
from hf_specdraft.glide.training import trainer
from hf_specdraft.glide.training.regenerate import RegenerationArguments
from hf_specdraft.glide.training import GlideTrainingArguments, main

pytest.importorskip("datasets")
pytestmark = pytest.mark.usefixtures("one_thread")

SPECIAL = ["<unk>", "<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]
WORDS = [f"w{i}" for i in range(VOCAB - len(SPECIAL))]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """A tiny Llama target with a word-level tokenizer over its 96 ids and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    directory = tmp_path_factory.mktemp("target")
    tiny_model("llama").save_pretrained(directory)
    vocab = {word: i for i, word in enumerate(SPECIAL + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS[:20]) for _ in range(n))


def write_jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def chats(count: int = 12) -> list[dict]:
    rng = random.Random(0)
    return [
        {
            "messages": [
                {"role": "user", "content": sentence(rng, 6)},
                {"role": "assistant", "content": sentence(rng, 8)},
                {"role": "user", "content": sentence(rng, 4)},
                {"role": "assistant", "content": sentence(rng, 8)},
            ]
        }
        for _ in range(count)
    ]


def texts(count: int = 12) -> list[dict]:
    rng = random.Random(1)
    return [{"text": sentence(rng, 30), "id": i} for i in range(count)]


def run(target_dir, dataset, output_dir, *extra: str) -> dict:
    argv = ["--target", str(target_dir), "--dataset", str(dataset), "--output-dir", str(output_dir)]
    argv += "--max-steps 8 --seq-len 32 --batch-size 4 --lr 3e-3 --warmup-steps 2 --logging-steps 2".split()
    argv += ["--hidden-size", "32", "--no-progress", "--regen-max-new-tokens", "8", "--regen-batch-size", "4", *extra]
    assert main(argv) == 0
    return json.loads((output_dir / "training_log.json").read_text())


def test_chat_dataset_regenerated_by_the_target_and_evaluated(target_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    data = write_jsonl(tmp_path / "chats.jsonl", chats())
    report = ["--report-to", "tensorboard"] if importlib.util.find_spec("tensorboard") else []
    log = run(
        target_dir,
        data,
        tmp_path / "out",
        "--regenerate",
        "--eval-every",
        "4",
        "--eval-examples",
        "3",
        "--eval-windows",
        "2",
        "--eval-prompts",
        "2",
        "--eval-new-tokens",
        "6",
        "--save-steps",
        "4",
        *report,
    )
    assert [e["step"] for e in log["evaluations"]] == [4, 8] and log["eval"] == log["evaluations"][-1]
    assert (
        0 <= log["eval"]["alpha"] <= 1
        and 0 <= log["eval"]["greedy_agreement"] <= 1
        and log["eval"]["tokens_per_forward"] >= 1
    )
    assert log["data"] == {
        "dataset": str(data),
        "column": "messages",
        "kind": "messages",
        "train_examples": 9,
        "heldout_examples": 3,
    }
    assert log["regeneration"]["temperature"] == 0.0 and log["regeneration"]["examples"] == 9
    records = [
        json.loads(line)
        for path in sorted((tmp_path / "out" / "regenerated").glob("shard-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert len(records) == 9 and all(r["prompt"].endswith("<|assistant|>") for r in records)
    assert records[0]["prompt"].count("<|assistant|>") == 2  # the last assistant turn is the one regenerated
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    greedy = target.generate(
        torch.tensor([records[0]["prompt_ids"]]), max_new_tokens=8, do_sample=False, eos_token_id=2, pad_token_id=1
    )
    # the target's own greedy reply
    assert records[0]["response_ids"] == greedy[0, len(records[0]["prompt_ids"]) :].tolist()
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"- α: {log['eval']['alpha']}" in card and f"- greedy agreement: {log['eval']['greedy_agreement']}" in card
    assert (
        f"tokens per target forward (hf_specdraft's loop, greedy, default γ): {log['eval']['tokens_per_forward']}"
        in card
    )
    assert (
        "regenerated by the target" in card and "greedy (temperature 0)" in card and "the last assistant turn" in card
    )
    assert "block-wise mask L = 5" in card
    assert (tmp_path / "out" / "checkpoint-last" / "model.safetensors").is_file()
    assert (tmp_path / "out" / "runs").is_dir() == bool(report)  # tensorboard's event files, when it is installed


def test_text_dataset_sampled_with_a_vanilla_twin_on_the_card(target_dir, tmp_path, monkeypatch):
    from datasets import Dataset

    data = tmp_path / "texts.parquet"
    Dataset.from_list(texts()).to_parquet(str(data))
    twin = tmp_path / "vanilla"
    twin.mkdir()
    (twin / "training_log.json").write_text(
        json.dumps(
            {"eval": {"step": 8, "alpha": 0.1234, "greedy_agreement": 0.0567}, "arguments": {"dataset_name": str(data)}}
        )
    )
    uploads = []

    class FakeApi:
        def create_repo(self, repo_id, exist_ok):
            uploads.append(("create", repo_id))

        def upload_folder(self, **kwargs):
            uploads.append(("upload", kwargs))

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    log = run(
        target_dir,
        data,
        tmp_path / "out",
        "--regenerate",
        "--regen-temperature",
        "0.8",
        "--regen-top-p",
        "0.9",
        "--regen-prompt-tokens",
        "6",
        "--eval-every",
        "8",
        "--eval-fraction",
        "0.25",
        "--eval-windows",
        "2",
        "--eval-prompts",
        "1",
        "--eval-new-tokens",
        "4",
        "--compare-vanilla",
        str(twin),
        "--push-to-hub",
        "--hub-model-id",
        "me/glide",
    )
    records = [
        json.loads(line) for line in (tmp_path / "out" / "regenerated" / "shard-00000.jsonl").read_text().splitlines()
    ]
    assert len(records) == 9 and all(len(r["prompt_ids"]) == 6 and 1 <= len(r["response_ids"]) <= 8 for r in records)
    card = (tmp_path / "out" / "README.md").read_text()
    assert "temperature 0.8, top-p 0.9" in card and f"- α: {log['eval']['alpha']}" in card
    assert "vanilla twin (no cross-attention" in card and "α 0.1234, greedy agreement 0.0567" in card
    assert uploads[0] == ("create", "me/glide") and "regenerated/**" in uploads[1][1]["ignore_patterns"]


class Killed(Exception):
    """Stands for the process being killed."""


def test_a_killed_run_resumes_from_its_step_and_keeps_its_shards(target_dir, tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "chats.jsonl", chats())
    extra = ("--regenerate", "--regen-batch-size", "2", "--regen-batches-per-shard", "1", "--save-steps", "4")
    write_shard = regenerate_module._write_shard

    def killed_after_first_shard(path, records):
        write_shard(path, records)
        raise Killed

    monkeypatch.setattr(regenerate_module, "_write_shard", killed_after_first_shard)
    with pytest.raises(Killed):
        run(target_dir, data, tmp_path / "out", *extra)
    shards = tmp_path / "out" / "regenerated"
    assert [p.name for p in shards.glob("shard-*.jsonl")] == ["shard-00000.jsonl"]
    first = shards / "shard-00000.jsonl"
    first_written = first.stat().st_mtime_ns
    monkeypatch.setattr(regenerate_module, "_write_shard", write_shard)
    save = trainer.save_training_state

    def killed_after_step_4(accelerator, args, progress, generator):
        save(accelerator, args, progress, generator)
        raise Killed

    monkeypatch.setattr(trainer, "save_training_state", killed_after_step_4)
    with pytest.raises(Killed):
        run(target_dir, data, tmp_path / "out", *extra)
    assert json.loads((tmp_path / "out" / "checkpoint-last" / "trainer_state.json").read_text())["step"] == 4
    assert len(list(shards.glob("shard-*.jsonl"))) == 6 and first.stat().st_mtime_ns == first_written
    monkeypatch.setattr(trainer, "save_training_state", save)
    monkeypatch.setattr(
        regenerate_module, "generate_replies", lambda *a, **k: pytest.fail("finished shards were regenerated")
    )
    log = run(target_dir, data, tmp_path / "out", *extra)
    assert log["resumed_from_step"] == 4 and [s["step"] for s in log["steps"]] == [1, 2, 4, 6, 8]
    monkeypatch.undo()
    run(target_dir, data, tmp_path / "unbroken", *extra)
    resumed, unbroken = (
        load_file(tmp_path / "out" / "model.safetensors"),
        load_file(tmp_path / "unbroken" / "model.safetensors"),
    )
    for name in unbroken:
        torch.testing.assert_close(resumed[name], unbroken[name], msg=name)  # the resumed run is the unbroken one


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dataset", "{bad}"], "columns are ['prose', 'id']"),
        (["--dataset", "./no/such.jsonl"], "neither an existing local file or directory nor a Hub dataset id"),
        (["--dataset", "{chats}", "--data", "{chats}"], "not allowed with argument"),
        ([], "one of the arguments --data --dataset is required"),
        (["--dataset", "{chats}", "--eval-every", "-1"], "eval_every must be an int >= 0"),
        (["--dataset", "{chats}", "--eval-examples", "2"], "hold data out for --eval-every N"),
        (["--dataset", "{chats}", "--eval-every", "2", "--eval-fraction", "1.5"], "--eval-fraction must lie in [0, 1)"),
        (["--data", "{chats}", "--regenerate"], "--regenerate needs --dataset"),
        (["--dataset", "{chats}", "--regenerate", "--regen-temperature", "-1"], "temperature must be >= 0"),
        (["--dataset", "{chats}", "--eval-every", "2", "--eval-examples", "12"], "leaves none to train on"),
    ],
)
def test_bad_inputs_name_what_is_wrong(target_dir, tmp_path, capsys, argv, message):
    chat_file = write_jsonl(tmp_path / "chats.jsonl", chats())
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prose": "w1 w2", "id": 0}])
    argv = [a.replace("{bad}", str(bad)).replace("{chats}", str(chat_file)) for a in argv]
    argv = ["--target", str(target_dir), "--output-dir", str(tmp_path / "out"), "--no-progress", *argv]
    with pytest.raises((SystemExit, ValueError)) as error:
        main(argv)
    text = str(error.value) if error.type is ValueError else capsys.readouterr().err
    assert message in text, text


def test_argument_classes_and_the_missing_library_are_explained(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="eval_every"):
        GlideTrainingArguments(output_dir=str(tmp_path), eval_every=-2)
    with pytest.raises(ValueError, match="report_to"):
        GlideTrainingArguments(output_dir=str(tmp_path), report_to="nonsense")
    with pytest.raises(ValueError, match="turns"):
        RegenerationArguments(turns="first")
    from hf_specdraft.glide.training.data import load_examples

    monkeypatch.setitem(__import__("sys").modules, "datasets", None)
    with pytest.raises(ImportError, match=r'pip install "hf-specdraft\[train\]"'):
        load_examples("org/name")


def test_token_files_hold_out_their_tail_for_the_evaluation(target_dir, tmp_path):
    from safetensors.torch import save_file

    ids = torch.randint(6, VOCAB, (40,), generator=torch.Generator().manual_seed(0)).repeat(30)  # 1200 tokens
    save_file({"input_ids": ids}, str(tmp_path / "ids.safetensors"))
    argv = [
        "--target",
        str(target_dir),
        "--data",
        str(tmp_path / "ids.safetensors"),
        "--output-dir",
        str(tmp_path / "out"),
        "--max-steps",
        "4",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--hidden-size",
        "32",
        "--no-progress",
        "--eval-every",
        "4",
        "--eval-windows",
        "2",
        "--eval-prompts",
        "1",
        "--eval-new-tokens",
        "4",
    ]
    assert main(argv) == 0
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    # --eval-fraction 0.05 by default: 60 tokens, one window
    assert log["train_tokens_available"] == 1200 - 60 and log["eval"]["eval_positions"] == 32
    assert "tokens_per_forward" in log["eval"]


def test_train_glide_cli_trains_a_state_glide_in_the_assistant_layout_and_it_exports(target_dir, tmp_path):
    """``--state-input --assistant-layout``: trained over two unrolled steps, evaluated at its first step, exported."""
    from hf_specdraft.glide import GlideForCausalLM
    from hf_specdraft.glide.export import export_glide

    data = write_jsonl(tmp_path / "texts.jsonl", texts())
    log = run(
        target_dir,
        data,
        tmp_path / "out",
        "--state-input",
        "--assistant-layout",
        "--eval-every",
        "8",
        "--eval-examples",
        "3",
        "--eval-windows",
        "2",
        "--eval-prompts",
        "2",
        "--eval-new-tokens",
        "6",
    )
    assert {"kl_1", "kl_2"} <= set(log["steps"][-1]) or {"ce_1", "ce_2"} <= set(log["steps"][-1])
    assert 0 <= log["eval"]["alpha"] <= 1 and log["eval"]["tokens_per_forward"] >= 1
    glide = GlideForCausalLM.from_pretrained(tmp_path / "out")
    assert glide.config.state_input and not glide.config.self_attention
    assert (export_glide(glide, tmp_path / "export") / "model.safetensors").is_file()
