"""benchmarks.studies.glide_recipe and the recipe variants it trains (the real run loads SmolLM2 and trains for an hour;
its result is committed JSON): variant parsing, the recipe hash the shipped training states depend on, a two-layer
drafter trained from a store, and the greedy speed model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import tiny_model
from hf_specdraft.glide import GlideConfig, GlideForCausalLM
from benchmarks.studies import glide_glimpse, glide_recipe
from benchmarks.studies.glide_gap_curve import variant_recipe
from benchmarks.studies.glide_glimpse import compute_store
from recipes.smollm2_drafters import DRAFTERS, RECIPES, extended_vocabulary, train_drafter


@pytest.mark.parametrize(
    "variant, field, value",
    [
        ("x2", "max_steps", 320),
        ("x2-block3", "block_size", 3),
        ("x2-layers2", "num_hidden_layers", 2),
        ("x2-layers2", "target_layer_ids", (29, 29)),
        ("x2-mlp3072", "intermediate_size", 3072),
        ("block1", "block_size", 1),
    ],
)
def test_a_variant_changes_the_recipe_field_it_names(variant, field, value):
    drafter, args, epochs = variant_recipe("glide", 1280, variant)
    assert (drafter[field] if field in drafter else getattr(args, field)) == value
    assert epochs == (2 if variant.startswith("x2") else 1)
    untouched = {f.name for f in dataclasses.fields(args)} - {field, "max_steps", "warmup_steps"}
    assert all(getattr(args, name) == getattr(RECIPES["glide"], name) for name in untouched)
    # a second layer reads a layer too
    layers = {"num_hidden_layers", "target_layer_ids"} if variant.endswith("layers2") else {field}
    assert {k: v for k, v in drafter.items() if k not in layers} == {
        k: v for k, v in DRAFTERS["glide"].items() if k not in layers
    }


@pytest.mark.parametrize("variant", ["x2-wide3", "x", "block", "x2-layers"])
def test_a_bad_variant_is_refused_naming_its_part(variant):
    with pytest.raises(ValueError, match="variant parts must be"):
        variant_recipe("glide", 1280, variant)


def test_a_two_layer_glide_trains_from_a_store_and_reads_the_layers_its_recipe_names(tmp_path):
    target = tiny_model("llama", num_hidden_layers=3)
    windows = torch.randint(0, target.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(0))
    store = compute_store(target, windows, [2], batch_size=2)
    args = dataclasses.replace(
        RECIPES["glide"],
        output_dir=str(tmp_path / "glide"),
        max_steps=2,
        warmup_steps=1,
        per_device_batch_size=2,
        progress_bar=False,
    )
    drafter = {
        **DRAFTERS["glide"],
        "draft_vocab_size": 48,
        "num_hidden_layers": 2,
        "target_layer_ids": (2, 2),
        "intermediate_size": 64,
    }
    model, _ = train_drafter("glide", target, store, args, drafter)
    assert model.config.num_hidden_layers == 2 and model.config.target_layer_ids == [2, 2]
    scores = glide_recipe.score_row("glide", model, store)
    assert set(scores["delays"]) == {str(d) for d in glide_recipe.DELAYS} and 0 <= scores["no_glimpse"]["alpha"] <= 1


def test_a_warm_started_drafter_extends_its_vocabulary_and_keeps_its_trained_rows(tmp_path):
    target = tiny_model("llama", num_hidden_layers=2)
    windows = torch.randint(0, target.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(0))
    store = compute_store(target, windows, [1], batch_size=2)
    drafter = {**DRAFTERS["glide"], "draft_vocab_size": 16, "intermediate_size": 64}
    first = dataclasses.replace(
        RECIPES["glide"],
        output_dir=str(tmp_path / "first"),
        max_steps=1,
        warmup_steps=1,
        per_device_batch_size=2,
        progress_bar=False,
    )
    model, _ = train_drafter("glide", target, store, first, drafter)
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(1.0)  # trained rows, far from the target's
    model.save_pretrained(tmp_path / "shipped")
    extra = extended_vocabulary(model.config.draft_token_ids, store, 8, target.config.vocab_size)
    assert extra[:16] == model.config.draft_token_ids and len(set(extra)) == len(extra) and 16 < len(extra) <= 24
    second = dataclasses.replace(first, output_dir=str(tmp_path / "second"), learning_rate=1e-9)
    grown, _ = train_drafter("glide", target, store, second, drafter, init_from=tmp_path / "shipped", extra_vocab=8)
    assert grown.config.draft_token_ids == extra
    shipped = GlideForCausalLM.from_pretrained(tmp_path / "shipped")
    rows, trained = grown.get_input_embeddings().weight, shipped.get_input_embeddings().weight
    assert rows.shape[0] == len(extra) + 1
    assert torch.allclose(rows[:16], trained[:16], atol=1e-4) and torch.allclose(rows[-1], trained[-1], atol=1e-4)
    # new ids: the target's rows
    assert torch.allclose(rows[16:-1], target.get_input_embeddings().weight[extra[16:]], atol=1e-4)
    # every id maps to its own row in the grown vocabulary, ids outside it to the last: not the shipped map, which sent
    # the new ids to row 16 (the first new id's), so the draft read and predicted them all as that one token
    expected = torch.full((target.config.vocab_size,), len(extra), dtype=torch.long)
    expected[torch.tensor(extra)] = torch.arange(len(extra))
    assert torch.equal(grown.model.target_to_draft, expected)


def test_the_gpu_recipe_trains_a_state_glide_on_windows_the_target_runs_over(tmp_path, monkeypatch):
    """benchmarks/gpu/train_default.py's path: no store (the target runs every step), the state GLIDE warm-started from
    a plain one, whose reduced vocabulary it keeps; each checkpoint comes back as a tar cut into parts that rejoin."""
    import tarfile

    from benchmarks.gpu import train_default
    from hf_specdraft.glide.training.objective import TargetWindows

    target = tiny_model("llama", num_hidden_layers=3)
    windows = torch.randint(0, target.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(0))
    shape = {"intermediate_size": 64, "draft_vocab_size": 48}
    args = dataclasses.replace(
        RECIPES["glide"],
        output_dir=str(tmp_path / "plain"),
        max_steps=2,
        warmup_steps=1,
        per_device_batch_size=2,
        progress_bar=False,
    )
    plain, _ = train_drafter(
        "glide", target, compute_store(target, windows, [2], batch_size=2), args, {**DRAFTERS["glide"], **shape}
    )
    plain.save_pretrained(tmp_path / "glide")
    source = TargetWindows(windows.reshape(-1), 24)
    args = dataclasses.replace(args, output_dir=str(tmp_path / "state"))
    with pytest.raises(ValueError, match="needs init_from"):
        train_drafter("glide-state", target, source, args, {**DRAFTERS["glide-state"], **shape})
    model, log = train_drafter(
        "glide-state", target, source, args, {**DRAFTERS["glide-state"], **shape}, init_from=tmp_path / "glide"
    )
    assert model.config.state_input and model.config.draft_token_ids == plain.config.draft_token_ids
    assert len(log["steps"]) >= 1 and log["train_tokens_available"] == windows.numel()
    model.save_pretrained(tmp_path / "checkpoint")
    monkeypatch.setattr(train_default, "PART_BYTES", 4096)
    out = tmp_path / "out"
    out.mkdir()
    parts = train_default.pack(tmp_path / "checkpoint", out, "glide-state")
    assert len(parts) > 1 and all((out / p).stat().st_size <= 4096 for p in parts)
    (tmp_path / "joined.tar").write_bytes(b"".join((out / p).read_bytes() for p in parts))
    with tarfile.open(tmp_path / "joined.tar") as tar:
        tar.extractall(tmp_path / "back", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    assert GlideForCausalLM.from_pretrained(tmp_path / "back" / "glide-state").config.state_input


def _train_through_every_entry_point(target, tmp_path):
    """Each way the repository trains a GLIDE, a step or two: the shipped drafters' recipe and the glimpse study (from a
    store), the small target's drafters and ``hf-specdraft train-glide`` (the target run on the fly)."""
    from safetensors.torch import save_file

    from hf_specdraft.glide.training import main as train_glide_command
    from recipes.drafters import train_default_drafter
    from recipes.recipe import get_recipe

    windows = torch.randint(0, target.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(0))
    store = compute_store(target, windows, [target.config.num_hidden_layers - 1], batch_size=2)
    args = dataclasses.replace(
        RECIPES["glide"], output_dir=str(tmp_path / "smollm2"), max_steps=2, per_device_batch_size=2, progress_bar=False
    )
    train_drafter("glide", target, store, args, {**DRAFTERS["glide"], "intermediate_size": 64, "draft_vocab_size": 48})
    glide_glimpse.fine_tune(
        target, GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)), store, steps=2
    )
    target.save_pretrained(tmp_path / "small" / "target")
    train_default_drafter("vanilla", tmp_path / "small", get_recipe("tiny"), windows.reshape(-1).repeat(4))
    save_file({"input_ids": windows.reshape(-1)}, str(tmp_path / "ids.safetensors"))
    assert (
        train_glide_command(
            [
                "--target",
                str(tmp_path / "small" / "target"),
                "--data",
                str(tmp_path / "ids.safetensors"),
                "--output-dir",
                str(tmp_path / "command"),
                "--max-steps",
                "2",
                "--seq-len",
                "16",
                "--batch-size",
                "2",
                "--hidden-size",
                "32",
                "--no-progress",
            ]
        )
        == 0
    )


def test_every_glide_training_runs_the_one_loop(tmp_path, monkeypatch):
    """The recipes, the studies and the command are configurations of train_glide: its loop runs for each, over the
    window source that says where p comes from (a store, or the target on the fly)."""
    from hf_specdraft.glide.training import trainer
    from hf_specdraft.glide.training.objective import TargetWindows
    from hf_specdraft.glide.training.store import StoreWindows

    run, sources = trainer._run, []

    def counted(accelerator, model, optimizer, scheduler, target, source, *rest):
        sources.append(type(source))
        return run(accelerator, model, optimizer, scheduler, target, source, *rest)

    monkeypatch.setattr(trainer, "_run", counted)
    _train_through_every_entry_point(tiny_model("llama", num_hidden_layers=3), tmp_path)
    assert sources == [StoreWindows, StoreWindows, TargetWindows, TargetWindows]


def test_expected_accepted_multiplies_agreement_along_the_chain():
    assert glide_recipe.expected_accepted([1.0], 4) == 4
    assert glide_recipe.expected_accepted([0.0, 1.0], 4) == 0
    assert glide_recipe.expected_accepted([0.5, 0.4], 3) == pytest.approx(0.5 + 0.5 * 0.4 + 0.5 * 0.4 * 0.4)


def test_modeled_speed_picks_the_best_draft_length():
    flat = {str(n): 10.0 for n in range(1, glide_recipe.MAX_GAMMA + 2)}
    free_and_perfect = glide_recipe.modeled_speed([1.0], 0.0, flat)  # verification is free: draft as far as allowed
    assert (
        free_and_perfect["best_gamma"] == glide_recipe.MAX_GAMMA
        and free_and_perfect["speed"] == glide_recipe.MAX_GAMMA + 1
    )
    useless = glide_recipe.modeled_speed([0.0], 1.0, flat)  # nothing is accepted: the shortest draft loses least
    assert useless["best_gamma"] == 1 and useless["speed"] < 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--work", "/nonexistent", "--variants", "x2-wide3"], "--variants"),
        (["--work", "/nonexistent"], "holds no store"),
        (["--work", "/nonexistent", "--reference", "/nonexistent/pair"], "holds no glide/ and vanilla/"),
    ],
)
def test_bad_arguments_are_refused_before_the_target_loads(argv, message, capsys, monkeypatch):
    import hf_specdraft.defaults.smollm2 as smollm2

    monkeypatch.setattr(smollm2, "load_smollm2", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit) as error:
        glide_recipe.main(argv)
    assert error.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--work", "/w", "--sizes", "a,b"], "--sizes"),
        (["--work", "/w", "--sizes", "4"], "--sizes"),
        (["--work", "/w", "--epochs", "1"], "--epochs"),
        (["--work", "/w", "--ablations", "block1,wide2"], "--ablations"),
    ],
)
def test_the_gap_curve_refuses_bad_arguments_before_the_target_loads(argv, message, capsys, monkeypatch):
    import hf_specdraft.defaults.smollm2 as smollm2
    from benchmarks.studies import glide_gap_curve

    monkeypatch.setattr(smollm2, "load_smollm2", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit) as error:
        glide_gap_curve.main(argv)
    assert error.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("sizes", ["0", "a,b", ""])
def test_the_state_layer_probe_refuses_bad_sizes_before_the_target_loads(sizes, capsys, monkeypatch):
    import hf_specdraft.defaults.smollm2 as smollm2
    from benchmarks.studies import state_layers

    monkeypatch.setattr(smollm2, "load_smollm2", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit) as error:
        state_layers.main(["--corpus-store", "/c", "--heldout-store", "/h", "--sizes", sizes, "--output", "/o.json"])
    assert error.value.code == 2 and "--sizes" in capsys.readouterr().err


def test_the_state_layer_probe_scores_an_input_that_carries_the_answer_above_one_that_does_not():
    from benchmarks.studies.state_layers import probe

    torch.manual_seed(0)
    labels = torch.randint(0, 5, (2048,))
    noise = torch.randn(2048, 8).to(torch.bfloat16)
    answer = torch.nn.functional.one_hot(labels, 8).to(torch.bfloat16)  # layer 1 holds the label, layer 2 nothing
    data = (noise, {1: answer, 2: torch.randn(2048, 8).to(torch.bfloat16)}, labels)
    rows = 6  # the last row is "another token": never agreed
    learned = probe(data, data, [1], rows, 2048, epochs=200, hidden=16)
    assert learned > 0.9 > 0.5 > probe(data, data, [2], rows, 2048, epochs=200, hidden=16)


@pytest.mark.parametrize("flag", ["--seconds", "--windows", "--self-generated", "--heldout-windows", "--batch"])
def test_the_gpu_train_step_refuses_a_non_positive_size_before_the_target_loads(flag, capsys, monkeypatch):
    import hf_specdraft.defaults.smollm2 as smollm2
    from benchmarks.gpu import train_default

    monkeypatch.setattr(smollm2, "load_smollm2", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit) as error:
        train_default.main(["--output", "/o", flag, "0"])
    assert error.value.code == 2 and flag in capsys.readouterr().err


def test_group_card_metrics_states_every_group_and_refuses_unknown_names():
    from recipes.cards import group_card_metrics

    study = {
        "meta": {"requests": 14, "prompts": "spec_prompts.jsonl", "max_new_tokens": 64, "cpu": "x86_64", "threads": 2},
        "drafters": {
            "new": {
                "teacher_forced_steps_1_3": {"qa": [0.5, 0.25, 0.125], "code": [0.6, 0.7, 0.8]},
                "in_loop_step_1": {"qa": {"agreement": 0.45}},
            }
        },
    }
    bench = {"categories": {"qa": {"methods": {"glide+copy-auto": {"speedup_vs_target_only": 1.234, "mal": 1.5}}}}}
    metrics = group_card_metrics(study, "new", bench, "glide+copy-auto")
    assert (
        metrics["question answering: greedy agreement at draft steps 1 / 2 / 3"]
        == "0.500 / 0.250 / 0.125; step 1 in the loop 0.450"
    )
    assert metrics["code: greedy agreement at draft steps 1 / 2 / 3"] == "0.600 / 0.700 / 0.800"
    assert metrics["question answering: `glide+copy-auto` vs plain generate (speedup, MAL)"] == "1.23x, 1.50"
    with pytest.raises(ValueError, match="one of the study's drafters"):
        group_card_metrics(study, "old")
    with pytest.raises(ValueError, match="method is required"):
        group_card_metrics(study, "new", bench)


def test_shipping_a_drafter_keeps_its_files_not_the_trainers_folders(tmp_path):
    """A shipped drafter carries weights, config, card and log, and its log names the run, not the folder it ran in."""
    import json

    from recipes.smollm2_drafters import SHIPPED_FILES, ship_drafter

    run = tmp_path / "run" / "small"
    run.mkdir(parents=True)
    for name in SHIPPED_FILES:
        (run / name).write_text("{}")
    (run / "training_log.json").write_text(
        json.dumps({"arguments": {"output_dir": str(tmp_path / "run" / "state" / "small")}})
    )
    (run / "modeling_glide.py").write_text("# code is written from the library when saved for the Hub")
    shipped = ship_drafter(run, tmp_path / "package" / "small")
    assert sorted(p.name for p in shipped.iterdir()) == sorted(SHIPPED_FILES)
    assert json.loads((shipped / "training_log.json").read_text())["arguments"]["output_dir"] == "small"
