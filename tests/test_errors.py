"""Every bad input gets a clear ValueError / TypeError naming the argument."""

from __future__ import annotations

import pytest
import torch

from hf_specdraft import DraftModelCandidateGenerator, speculative_generate
from conftest import OracleDrafter, tiny_model


@pytest.fixture(scope="module")
def target():
    return tiny_model()


X = torch.tensor([[1, 2, 3, 4]])


def test_right_padded_attention_mask(target):
    with pytest.raises(ValueError, match="left padding"):
        speculative_generate(
            target, X, draft_model=target, attention_mask=torch.tensor([[1, 1, 1, 0]]), max_new_tokens=4
        )


def test_batch_without_a_pad_token_for_rows_of_different_lengths(target):
    """Rows of an unpadded batch that stop at different lengths need pad_token_id to fill the finished ones."""
    ids = torch.ones(2, 4, dtype=torch.long)
    out = speculative_generate(target, ids, draft_model=target, max_new_tokens=4)  # same length: no padding needed
    assert out.shape == (2, 8)


def test_empty_input_ids(target):
    with pytest.raises(ValueError, match="input_ids is empty"):
        speculative_generate(target, torch.zeros(1, 0, dtype=torch.long), draft_model=target, max_new_tokens=4)


@pytest.mark.parametrize("bad", [0, -3])
def test_max_new_tokens_not_positive(target, bad):
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(target, X, draft_model=target, max_new_tokens=bad)


def test_draft_with_another_vocabulary(target):
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target, X, draft_model=tiny_model(vocab_size=50), max_new_tokens=4)


def test_cache_implementations_other_than_dynamic_and_static(target):
    with pytest.raises(ValueError, match="cache_implementation='offloaded_static' is not supported.*'static'"):
        target.generate(
            X,
            custom_generate=speculative_generate,
            draft_model=target,
            max_new_tokens=4,
            cache_implementation="offloaded_static",
        )


def test_no_drafter_or_two_drafters(target):
    with pytest.raises(ValueError, match="needs a drafter"):
        speculative_generate(target, X, max_new_tokens=4)
    with pytest.raises(ValueError, match="not both"):
        speculative_generate(target, X, draft_model=target, candidate_generator=OracleDrafter(X), max_new_tokens=4)
    with pytest.raises(TypeError, match="candidate_generator"):
        speculative_generate(target, X, candidate_generator="prompt lookup", max_new_tokens=4)


def test_bad_num_draft_tokens(target):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        DraftModelCandidateGenerator(target, num_draft_tokens=0)
    with pytest.raises(TypeError, match="draft_model"):
        DraftModelCandidateGenerator("gpt2")


def test_drafter_proposing_ids_outside_vocab(target):
    class Bad(OracleDrafter):
        def propose(self, input_ids, target_cache=None):
            from hf_specdraft import DraftTree

            return DraftTree.chain(torch.tensor([10_000]))

    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        speculative_generate(target, X, candidate_generator=Bad(X), max_new_tokens=4)


def test_bad_acceptance(target):
    with pytest.raises(TypeError, match="acceptance"):
        speculative_generate(target, X, draft_model=target, acceptance="lenient", max_new_tokens=4)


def test_beams(target):
    with pytest.raises(ValueError, match="num_beams"):
        target.generate(X, custom_generate=speculative_generate, draft_model=target, max_new_tokens=4, num_beams=2)


@pytest.mark.parametrize("draft", ["Qwen/Qwen2.5-0.5B", 3])
def test_draft_model_that_is_not_a_model(target, draft):
    with pytest.raises(TypeError, match="draft_model must be"):
        speculative_generate(target, X, draft_model=draft, max_new_tokens=4)
    with pytest.raises(TypeError, match="from_pretrained" if isinstance(draft, str) else "PreTrainedModel"):
        target.generate(X, custom_generate=speculative_generate, draft_model=draft, max_new_tokens=4)


def test_casd_context_none_says_what_is_accepted(target):
    from hf_specdraft.casd import casd_generate

    with pytest.raises(ValueError, match="context is None: pass the context as text"):
        casd_generate(target, None, None, context=None, max_new_tokens=4)


def test_bench_never_overwrites_a_result_unless_told(tmp_path, monkeypatch):
    from hf_specdraft.cli import bench_output_path

    monkeypatch.chdir(tmp_path)
    assert bench_output_path(None, "cpu", "chat") == tmp_path.joinpath("benchmarks/results/cpu-chat.json").relative_to(
        tmp_path
    )
    committed = tmp_path / "benchmarks" / "results" / "cpu-chat.json"
    committed.parent.mkdir(parents=True)
    committed.write_text("{}")
    fresh = bench_output_path(None, "cpu", "chat")
    assert (
        fresh.parent == committed.parent.relative_to(tmp_path)
        and fresh.name.startswith("cpu-chat-")
        and not fresh.exists()
    )
    assert bench_output_path(None, "cpu", "chat", overwrite=True).name == "cpu-chat.json"
    assert bench_output_path("mine.json", "cpu", "chat") == __import__("pathlib").Path("mine.json")


# --- what a new user passes first -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, match",
    [
        ("HuggingFaceTB/SmolLM2-135M", r"got the string 'HuggingFaceTB/SmolLM2-135M': load it first"),
        (torch.nn.Linear(2, 2), "PreTrainedModel with generate\\(\\) .*got Linear"),
    ],
)
def test_a_target_that_is_no_model_is_named(model, match):
    with pytest.raises(TypeError, match=match):
        speculative_generate(model, X, draft_model=tiny_model(), max_new_tokens=4)


def test_a_padded_batch_without_attention_mask_is_refused_when_pad_is_eos(target):
    """transformers infers no mask when pad == eos, and every row would attend to its padding."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]])
    with pytest.raises(ValueError, match=r"rows \[0\] begin with pad tokens \(pad_token_id=0\) but no attention_mask"):
        speculative_generate(target, ids, draft_model=target, max_new_tokens=3, pad_token_id=0, eos_token_id=0)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # with the mask it runs
    assert (
        speculative_generate(
            target, ids, attention_mask=mask, draft_model=target, max_new_tokens=3, pad_token_id=0, eos_token_id=0
        ).shape[0]
        == 2
    )
    shared_bos = torch.tensor([[0, 5, 6, 7], [0, 4, 5, 6]])  # every row starts with one pad-as-BOS: no padding
    assert speculative_generate(
        target, shared_bos, draft_model=target, max_new_tokens=3, pad_token_id=0, eos_token_id=0
    ).shape == (2, 7)


def test_statistics_print_as_one_short_line(target):
    out = speculative_generate(target, X, draft_model=target, max_new_tokens=6, return_dict_in_generate=True)
    text = repr(out.speculative_stats)
    assert (
        text.startswith("SpeculativeStats(steps=") and "new_tokens=6" in text and "\n" not in text and len(text) < 200
    )
    assert str(out.speculative_stats) == text and out.speculative_stats.steps  # the full per-step data is still there


def test_cli_names_a_missing_local_directory(capsys):
    from hf_specdraft.cli import main

    assert main(["demo", "--target", "/tmp/does/not/exist"]) == 2
    assert "--target '/tmp/does/not/exist': no such directory" in capsys.readouterr().err


@pytest.mark.parametrize("offline", [True, False])
def test_cli_fails_at_once_for_a_hub_id_it_cannot_reach(offline, monkeypatch, capsys):
    import socket
    import time

    import huggingface_hub.constants as constants

    from hf_specdraft.cli import main

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    if not offline:  # no network: the Hub's host name does not resolve
        monkeypatch.setattr(
            socket, "getaddrinfo", lambda *args, **kwargs: (_ for _ in ()).throw(socket.gaierror(-2, "no network"))
        )
    started = time.perf_counter()
    assert main(["demo", "--target", "someone/no-such-model"]) == 2
    assert time.perf_counter() - started < 5
    err = capsys.readouterr().err
    assert "--target 'someone/no-such-model' is neither a directory here nor in the local Hub cache" in err
    assert ("HF_HUB_OFFLINE is set" if offline else "cannot be reached from this machine") in err


def test_cli_help_imports_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = (
        "import sys; from hf_specdraft import cli; cli.build_parser().format_help(); "
        "heavy = ('torch', 'transformers', 'hf_specdraft.glide', 'hf_specdraft.bench'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
    done = subprocess.run([sys.executable, "-m", "hf_specdraft", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and all(name in done.stdout for name in ("demo", "bench", "train-glide", "export"))
