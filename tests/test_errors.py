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
        speculative_generate(target, X, draft_model=target, attention_mask=torch.tensor([[1, 1, 1, 0]]), max_new_tokens=4)


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


def test_static_cache(target):
    with pytest.raises(ValueError, match="cache_implementation"):
        target.generate(X, custom_generate=speculative_generate, draft_model=target, max_new_tokens=4, cache_implementation="static")


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
    assert bench_output_path(None, "cpu", "chat") == tmp_path.joinpath("benchmarks/results/cpu-chat.json").relative_to(tmp_path)
    committed = tmp_path / "benchmarks" / "results" / "cpu-chat.json"
    committed.parent.mkdir(parents=True)
    committed.write_text("{}")
    fresh = bench_output_path(None, "cpu", "chat")
    assert fresh.parent == committed.parent.relative_to(tmp_path) and fresh.name.startswith("cpu-chat-") and not fresh.exists()
    assert bench_output_path(None, "cpu", "chat", overwrite=True).name == "cpu-chat.json"
    assert bench_output_path("mine.json", "cpu", "chat") == __import__("pathlib").Path("mine.json")
