"""Training GLIDE (§4.1 block-wise mask, Appendix B distillation) in-process and under accelerate with 2 processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import VOCAB, tiny_model
from hf_specdraft.core.support import output_cache
from hf_specdraft.glide import GlideConfig, GlideForCausalLM, GlideTrainingArguments, train_glide
from hf_specdraft.glide.training import token_stream

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


def periodic_stream(period: int = 40, repeats: int = 50) -> torch.Tensor:
    """A learnable token stream: one random phrase repeated, so next-token loss can fall fast."""
    return torch.randint(0, VOCAB, (period,), generator=torch.Generator().manual_seed(0)).repeat(repeats)


def make_glide(target, **overrides) -> GlideForCausalLM:
    torch.manual_seed(0)
    return GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32, **overrides))


def quick_args(output_dir, **overrides) -> GlideTrainingArguments:
    values = dict(
        output_dir=str(output_dir),
        max_steps=30,
        seq_len=32,
        per_device_batch_size=4,
        learning_rate=3e-3,
        warmup_steps=3,
        logging_steps=5,
        progress_bar=False,
    )
    return GlideTrainingArguments(**{**values, **overrides})


def changed_parameters(before: dict, model) -> set[str]:
    return {name for name, value in model.state_dict().items() if not torch.equal(before[name], value)}


def test_train_glide_with_distillation_learns_and_writes_a_checkpoint(tmp_path):
    target = tiny_model("llama")
    glide = make_glide(target)
    before = {k: v.clone() for k, v in glide.state_dict().items()}
    target_before = {k: v.clone() for k, v in target.state_dict().items()}
    log = train_glide(
        target,
        glide,
        periodic_stream(),
        quick_args(tmp_path, distillation_weight=0.3),
        metrics={"acceptance_rate": 0.5, "expected_speedup": 1.4},
    )
    losses = [step["ce"] for step in log["steps"]]
    assert losses[-1] < losses[0] - 0.5, losses
    assert "kl" in log["steps"][-1]
    assert changed_parameters(before, glide) >= {
        "model.layers.0.cross_attn.q_proj.weight",
        "model.layers.0.cross_attn.o_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "lm_head.weight",
    }
    assert not changed_parameters(target_before, target), "the target must stay frozen"
    files = {p.name for p in tmp_path.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "modeling_glide.py",
        "configuration_glide.py",
        "README.md",
        "training_log.json",
    } <= files
    card = (tmp_path / "README.md").read_text()
    assert "acceptance rate: 0.5" in card and "expected speedup: 1.4" in card and "library_name: transformers" in card
    reloaded = GlideForCausalLM.from_pretrained(tmp_path).eval()
    x = periodic_stream()[None, :12]
    with torch.no_grad():
        cache = output_cache(target(x[:, :-1], use_cache=True))
        torch.testing.assert_close(
            reloaded(x, target_past_key_values=cache).logits, glide.eval()(x, target_past_key_values=cache).logits
        )


def test_train_vanilla_drafter(tmp_path):
    target = tiny_model("qwen2")
    vanilla = make_glide(target, cross_attention=False)
    before = {k: v.clone() for k, v in vanilla.state_dict().items()}
    log = train_glide(target, vanilla, periodic_stream(), quick_args(tmp_path, max_steps=15))
    assert log["steps"][-1]["loss"] < log["steps"][0]["loss"]
    assert changed_parameters(before, vanilla)
    assert "vanilla drafter" in (tmp_path / "README.md").read_text()


def test_a_second_run_in_one_process_may_train_at_another_precision(tmp_path):
    """A notebook trains in float32, then in bfloat16: accelerate alone refuses the second precision in one process."""
    target = tiny_model("llama")
    for precision in ("no", "bf16", "no"):
        log = train_glide(
            target,
            make_glide(target),
            periodic_stream(),
            quick_args(tmp_path / precision, max_steps=2, mixed_precision=precision),
        )
        assert log["mixed_precision"] == precision


@pytest.mark.parametrize(
    "overrides, argument",
    [
        ({"max_steps": 0}, "max_steps"),
        ({"seq_len": 1}, "seq_len"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"distillation_weight": 1.5}, "distillation_weight"),
        ({"mixed_precision": "fp8"}, "mixed_precision"),
        ({"push_to_hub": True}, "hub_model_id"),
        ({"block_size": 0}, "block_size"),
        ({"license": " "}, "license"),
    ],
)
def test_training_arguments_are_validated(tmp_path, overrides, argument):
    with pytest.raises(ValueError, match=argument):
        quick_args(tmp_path, **overrides)


def test_train_glide_rejects_bad_inputs(tmp_path):
    target = tiny_model("llama")
    glide = make_glide(target)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        train_glide(tiny_model("llama", num_hidden_layers=3), glide, periodic_stream(), quick_args(tmp_path))
    with pytest.raises(ValueError, match="vocabulary"):
        train_glide(target, glide, torch.full((100,), VOCAB), quick_args(tmp_path))
    with pytest.raises(ValueError, match="seq_len"):
        train_glide(target, glide, torch.arange(10), quick_args(tmp_path))
    with pytest.raises(TypeError, match="glide"):
        train_glide(target, target, periodic_stream(), quick_args(tmp_path))
    with pytest.raises(TypeError, match="data"):
        token_stream("not tokens")


def test_token_stream_accepts_documents_and_columns():
    assert token_stream([[1, 2], [3]], eos_token_id=0).tolist() == [1, 2, 0, 3, 0]
    assert token_stream({"input_ids": [[4, 5]]}).tolist() == [4, 5]
    assert token_stream(torch.tensor([[1, 2], [3, 4]])).tolist() == [1, 2, 3, 4]


@pytest.mark.slow  # ~10 s: accelerate launch with two processes
def test_accelerate_launch_two_processes(tmp_path):
    """`accelerate launch` with 2 CPU processes (gloo) runs the CLI entry point: loss falls, parameters change.

    accelerate 1.x's ``--cpu --num_processes 2`` starts a single process unless mpirun is configured, so
    the test uses the torchrun launcher (``--multi_gpu``) with ``ACCELERATE_USE_CPU=1``.
    """
    target = tiny_model("qwen2")
    target.save_pretrained(tmp_path / "target")
    glide = make_glide(target)
    glide.save_pretrained(tmp_path / "init")
    save_file({"input_ids": periodic_stream()}, tmp_path / "ids.safetensors")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ACCELERATE_USE_CPU": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
    }
    launch = "-m accelerate.commands.launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no"
    command = [sys.executable, *launch.split(), "--dynamo_backend", "no", "-m", "hf_specdraft", "train-glide"]
    command += ["--target", str(tmp_path / "target"), "--glide", str(tmp_path / "init")]
    command += ["--data", str(tmp_path / "ids.safetensors"), "--output-dir", str(tmp_path / "out")]
    command += "--max-steps 30 --seq-len 32 --batch-size 2 --lr 3e-3 --warmup-steps 3 --logging-steps 5".split()
    command += ["--no-progress", "--dataset-name", "periodic test stream"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert log["processes"] == 2
    losses = [step["loss"] for step in log["steps"]]
    assert losses[-1] < losses[0] - 0.5, losses
    trained = GlideForCausalLM.from_pretrained(tmp_path / "out")
    before = glide.state_dict()
    assert changed_parameters(before, trained) >= {"model.layers.0.cross_attn.q_proj.weight", "lm_head.weight"}
    assert "periodic test stream" in (tmp_path / "out" / "README.md").read_text()
    assert (tmp_path / "out" / "custom_generate" / "generate.py").is_file()  # the command ships CAPE's loop


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "/nonexistent/model"], "--target: '/nonexistent/model' is not a directory"),
        (["--target", "{here}", "--glide", "./no/such/glide"], "--glide: './no/such/glide' is not a directory"),
        (["--target", "{here}", "--data", "/no/such/file.py"], "--data: '/no/such/file.py' does not exist"),
        (["--target", "{here}"], "--target: cannot load a causal LM from"),
    ],
)
def test_train_glide_cli_names_a_missing_path_in_one_line(args, message, tmp_path, capsys):
    from hf_specdraft.glide.training import main

    data = tmp_path / "data.py"
    data.write_text("def f():\n    return 1\n")
    argv = [a.replace("{here}", str(tmp_path)) for a in args]
    if "--data" not in argv:
        argv += ["--data", str(data)]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--output-dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_reduced_vocabulary_loss_is_finite_and_trains_the_other_row():
    """A GLIDE over a reduced vocabulary (draft_token_ids) scores labels outside it as its last row, and p's mass there,
    instead of the ~1e38 cross-entropy and infinite KL from its target-vocabulary logits (the dtype's minimum there)."""

    from hf_specdraft.glide.training.objective import GlideBatch, glide_loss, target_memory

    target = tiny_model("llama")
    torch.manual_seed(0)
    glide = GlideForCausalLM(
        GlideConfig.from_target_config(target.config, hidden_size=32, draft_token_ids=list(range(0, VOCAB, 3)))
    )
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    assert bool((ids % 3 != 0).any())  # labels outside the draft's vocabulary
    kv, logits, _ = target_memory(target, ids, with_logits=True)
    args = GlideTrainingArguments(output_dir="unused", distillation_weight=0.5, distillation_temperature=1.0)
    loss, parts = glide_loss(glide, GlideBatch(ids, kv, logits), 5, args)
    rows = VOCAB // 3 + 1
    assert (
        torch.isfinite(loss) and parts["ce"] < 2 * torch.log(torch.tensor(float(rows))) and torch.isfinite(parts["kl"])
    )
    loss.backward()
    assert glide.lm_head.weight.grad[-1].abs().sum() > 0  # the "another token" row learns
    full = GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32))
    full_loss, full_parts = glide_loss(full, GlideBatch(ids, kv), 5, args)
    expected = full(
        input_ids=ids, labels=ids, target_past_key_values=kv, cross_attention_block_size=5, use_cache=False
    ).loss
    torch.testing.assert_close(full_loss, expected)  # the full vocabulary's loss is the model's own


# --- one loss, one loop: p whole or as a store's top-k --------------------------------------------------------------


def tiny_store(target, windows: int = 8, seq_len: int = 32) -> dict:
    """A store in memory of the learnable stream's windows: the target's KV of its top layer and top-8 (store.py)."""
    from benchmarks.studies.glide_glimpse import compute_store

    ids = periodic_stream()[: windows * seq_len].view(windows, seq_len)
    return compute_store(target, ids, [target.config.num_hidden_layers - 1], progress_bar=False)


@pytest.mark.parametrize(
    "draft_token_ids", [None, list(range(0, VOCAB, 3))], ids=["full-vocabulary", "reduced-vocabulary"]
)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_top_k_loss_is_the_full_logits_loss_when_k_is_the_vocabulary(draft_token_ids, temperature):
    """p given as the target's top k with k = V is p itself: the same cross-entropy, KL and gradient as its logits."""

    from hf_specdraft.glide.training.objective import GlideBatch, glide_loss, target_memory

    target = tiny_model("llama")
    glide = make_glide(target, draft_token_ids=draft_token_ids)
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    kv, logits, _ = target_memory(target, ids, with_logits=True)
    top = logits.softmax(-1).topk(VOCAB, dim=-1)
    args = GlideTrainingArguments(output_dir="unused", distillation_weight=0.7, distillation_temperature=temperature)
    whole, whole_parts = glide_loss(glide, GlideBatch(ids, kv, logits), 5, args)
    whole.backward()
    grads = [p.grad.clone() for p in glide.parameters()]
    glide.zero_grad()
    topk, topk_parts = glide_loss(glide, GlideBatch(ids, kv, None, top.indices, top.values), 5, args)
    topk.backward()
    torch.testing.assert_close(topk, whole)
    torch.testing.assert_close(topk_parts["kl"], whole_parts["kl"])
    for grad, param in zip(grads, glide.parameters()):
        torch.testing.assert_close(param.grad, grad)


def test_train_glide_from_a_store_never_runs_the_target_and_changes_every_parameter(tmp_path, monkeypatch):
    from hf_specdraft.glide.training.store import StoreWindows

    target = tiny_model("llama")
    store = StoreWindows(tiny_store(target))
    glide = make_glide(target)
    before = {k: v.clone() for k, v in glide.state_dict().items()}
    monkeypatch.setattr(
        type(target), "forward", lambda *a, **k: pytest.fail("the target ran: the store holds its answers")
    )
    log = train_glide(target, glide, store, quick_args(tmp_path, distillation_weight=1.0))
    assert changed_parameters(before, glide) == set(before)  # the TRL check: every parameter moved
    losses = [step["kl"] for step in log["steps"]]
    assert losses[-1] < losses[0] - 0.5, losses
    assert log["train_tokens_available"] == 8 * 32 and "kl" in log["steps"][-1]
    assert GlideForCausalLM.from_pretrained(tmp_path).config.cross_attention  # the checkpoint as train_glide writes it


def test_a_store_that_cannot_serve_the_run_is_refused(tmp_path):
    from hf_specdraft.glide.training.store import StoreWindows

    target = tiny_model("llama")
    store = tiny_store(target)
    with pytest.raises(ValueError, match="set seq_len=32"):
        train_glide(target, make_glide(target), StoreWindows(store), quick_args(tmp_path, seq_len=16))
    with pytest.raises(ValueError, match=r"reads target layers \[0\]"):
        train_glide(target, make_glide(target, target_layer_ids=[0]), StoreWindows(store), quick_args(tmp_path))
    with pytest.raises(ValueError, match="topk_ids"):
        StoreWindows({"input_ids": store["input_ids"]})


class Killed(Exception):
    """Stands for the process being killed."""


def train_killed_after(step: int, monkeypatch, *train_args) -> None:
    """``train_glide(*train_args)``, the process "killed" right after the training state of ``step`` was saved."""
    from hf_specdraft.glide.training import trainer

    save = trainer.save_training_state

    def killed(accelerator, args, progress, generator):
        save(accelerator, args, progress, generator)
        if progress["step"] == step:
            raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(trainer, "save_training_state", killed)
        with pytest.raises(Killed):
            train_glide(*train_args)


def test_a_run_from_a_store_resumes_to_the_weights_of_an_unbroken_one(tmp_path, monkeypatch):
    from hf_specdraft.glide.training.store import StoreWindows

    target = tiny_model("qwen2")
    store = StoreWindows(tiny_store(target))
    args = quick_args(tmp_path / "killed", max_steps=8, save_steps=3, block_size=(1, 5), distillation_weight=1.0)
    unbroken = make_glide(target)
    train_glide(
        target,
        unbroken,
        store,
        quick_args(tmp_path / "unbroken", max_steps=8, save_steps=0, block_size=(1, 5), distillation_weight=1.0),
    )
    train_killed_after(6, monkeypatch, target, make_glide(target), store, args)
    with pytest.raises(ValueError, match=r"other training arguments \(learning_rate"):
        train_glide(
            target,
            make_glide(target),
            store,
            quick_args(
                tmp_path / "killed", max_steps=8, learning_rate=1e-3, block_size=(1, 5), distillation_weight=1.0
            ),
        )
    resumed = make_glide(target)
    # logging and saving may change
    log = train_glide(
        target,
        resumed,
        store,
        quick_args(
            tmp_path / "killed", max_steps=8, logging_steps=2, save_steps=4, block_size=(1, 5), distillation_weight=1.0
        ),
    )
    assert log["resumed_from_step"] == 6
    for (name, a), b in zip(unbroken.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name)
