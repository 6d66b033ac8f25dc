"""The decoding loop: greedy output equals target-only greedy, for every drafter shape and architecture."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import PromptLookupCandidateGenerator
from transformers.generation.streamers import BaseStreamer

from hf_specdraft import speculative_generate
from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model


def prompt(length=7, seed=1, vocab=VOCAB):
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", ["right", "wrong", "tree"])
def test_greedy_equals_target_greedy(arch, attn, mode):
    target = tiny_model(arch, attn_implementation=attn)
    x = prompt()
    ref = greedy_reference(target, x, 24)
    drafter = OracleDrafter(ref, mode, k=4)
    out = target.generate(
        x,
        custom_generate=speculative_generate,
        candidate_generator=drafter,
        max_new_tokens=24,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, ref)
    stats = out.speculative_stats
    if mode == "wrong":
        assert stats.accepted_tokens == 0 and stats.num_steps == 24
    else:
        assert stats.num_steps == 5  # 4 accepted + 1 bonus per step: 5+5+5+5+4
        assert stats.accepted_tokens == 24 - stats.num_steps


def test_direct_call_equals_custom_generate(arch):
    target, draft = tiny_model(arch), tiny_model(arch, seed=3, num_hidden_layers=1)
    x = prompt()
    ref = greedy_reference(target, x, 20)
    assert torch.equal(speculative_generate(target, x, draft_model=draft, max_new_tokens=20), ref)
    assert torch.equal(
        target.generate(
            x, custom_generate=speculative_generate, draft_model=draft, num_draft_tokens=3, max_new_tokens=20
        ),
        ref,
    )


def test_draft_model_drafter_is_fully_accepted_when_draft_is_target():
    target = tiny_model()
    x = prompt()
    out = speculative_generate(
        target, x, draft_model=target, num_draft_tokens=3, max_new_tokens=16, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, greedy_reference(target, x, 16))
    stats = out.speculative_stats
    assert stats.accepted_per_drafted == 1.0 and stats.position_acceptance_rate == 1.0
    assert stats.alpha == pytest.approx(1.0, abs=1e-5)  # p == q: 1 - TV = 1


def test_eos_inside_accepted_draft():
    target = tiny_model()
    x = prompt()
    free = greedy_reference(target, x, 16)[0, x.shape[1] :].tolist()
    eos = free[5]  # the 6th generated token: inside the second drafted chain of 4
    ref = greedy_reference(target, x, 16, eos_token_id=eos)
    assert ref[0, -1] == eos and ref.shape[1] < x.shape[1] + 16
    drafter = OracleDrafter(greedy_reference(target, x, 16), "right", k=4)
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=16, eos_token_id=eos)
    assert torch.equal(out, ref)


def test_several_eos_token_ids():
    target = tiny_model()
    x = prompt()
    free = greedy_reference(target, x, 16)[0, x.shape[1] :].tolist()
    eos = [VOCAB - 1 if free[7] != VOCAB - 1 else VOCAB - 2, free[7]]
    ref = greedy_reference(target, x, 16, eos_token_id=eos)
    out = speculative_generate(target, x, draft_model=tiny_model(seed=5), max_new_tokens=16, eos_token_id=eos)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 6, 7])
def test_max_new_tokens_reached_mid_draft(max_new_tokens):
    target = tiny_model()
    x = prompt()
    ref = greedy_reference(target, x, max_new_tokens)
    for mode in ("right", "tree"):
        drafter = OracleDrafter(greedy_reference(target, x, 30), mode, k=4)
        out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=max_new_tokens)
        assert torch.equal(out, ref)


def test_prompt_of_one_token():
    target = tiny_model()
    x = prompt(length=1)
    ref = greedy_reference(target, x, 10)
    assert torch.equal(
        speculative_generate(target, x, candidate_generator=OracleDrafter(ref, "tree"), max_new_tokens=10), ref
    )


def test_repetition_penalty_with_tree():
    target = tiny_model()
    x = prompt()
    ref = greedy_reference(target, x, 20, repetition_penalty=1.5)
    out = speculative_generate(
        target, x, candidate_generator=OracleDrafter(ref, "tree"), max_new_tokens=20, repetition_penalty=1.5
    )
    assert torch.equal(out, ref)


def test_stopping_criteria_and_stock_prompt_lookup():
    target = tiny_model()
    x = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]])
    ref = greedy_reference(target, x, 12)
    lookup = PromptLookupCandidateGenerator(num_output_tokens=4, max_matching_ngram_size=2, max_length=x.shape[1] + 12)
    assert torch.equal(speculative_generate(target, x, candidate_generator=lookup, max_new_tokens=12), ref)


def test_streamer_receives_prompt_then_every_token():
    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.flatten().tolist())

        def end(self):
            self.ended = True

    target = tiny_model()
    x = prompt()
    ref = greedy_reference(target, x, 12)
    streamer = Collect()
    speculative_generate(
        target, x, candidate_generator=OracleDrafter(ref, "right"), max_new_tokens=12, streamer=streamer
    )
    assert streamer.chunks[0] == x[0].tolist() and streamer.ended
    assert sum(streamer.chunks[1:], []) == ref[0, x.shape[1] :].tolist()
    assert len(streamer.chunks) == 1 + 3  # tokens arrive a step (up to 5) at a time


def test_output_scores_match_target_generate():
    target = tiny_model()
    x = prompt()
    ref = target.generate(
        x, max_new_tokens=8, do_sample=False, output_scores=True, output_logits=True, return_dict_in_generate=True
    )
    out = speculative_generate(
        target,
        x,
        candidate_generator=OracleDrafter(ref.sequences, "tree"),
        max_new_tokens=8,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    assert len(out.scores) == len(ref.scores) == 8
    for ours, theirs in zip(out.logits, ref.logits):
        torch.testing.assert_close(ours, theirs.float(), atol=1e-4, rtol=1e-4)


def test_stats_are_consistent():
    target = tiny_model()
    x = prompt()
    out = speculative_generate(
        target, x, draft_model=tiny_model(seed=9), num_draft_tokens=3, max_new_tokens=20, return_dict_in_generate=True
    )
    s = out.speculative_stats
    assert s.new_tokens == out.sequences.shape[1] - x.shape[1] == 20
    assert s.num_steps == len(s.steps) and 0 <= s.accepted_per_drafted <= s.position_acceptance_rate <= 1
    assert s.mean_accepted_length == pytest.approx(20 / s.num_steps)
    assert all(0 <= r <= 1 for r in s.acceptance_by_position())
    assert s.drafter_calls["draft"] == 3 * s.num_steps
    summary = s.summary()
    assert summary["draft_seconds"] >= 0 and summary["verify_seconds"] > 0


def test_bf16_runs_and_agreement_is_reported(capsys):
    target = tiny_model().to(torch.bfloat16)
    x = prompt()
    ref = greedy_reference(target, x, 24)
    out = speculative_generate(target, x, draft_model=tiny_model(seed=4).to(torch.bfloat16), max_new_tokens=24)
    assert out.shape == ref.shape
    agreement = (out == ref).float().mean().item()
    print(f"bf16 agreement with target-only greedy: {agreement:.3f}")
    assert 0 <= agreement <= 1


class DuplicatingDrafter(OracleDrafter):
    """Every branch of the oracle's proposal twice (same parent, same token): the loop merges the copies."""

    def propose(self, input_ids, target_cache=None):
        from hf_specdraft.core.tree import DraftTree

        tree = super().propose(input_ids, target_cache)
        n = len(tree)
        parents = torch.cat([tree.parents, torch.where(tree.parents >= 0, tree.parents + n, tree.parents)])
        return DraftTree(torch.cat([tree.tokens, tree.tokens]), parents)


@pytest.mark.parametrize("mode", ["right", "wrong", "tree"])
def test_duplicated_branches_stay_lossless_and_are_merged(arch, mode):
    target = tiny_model(arch)
    x = prompt()
    ref = greedy_reference(target, x, 16)
    out = speculative_generate(
        target,
        x,
        candidate_generator=DuplicatingDrafter(ref, mode, k=3),
        max_new_tokens=16,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, ref)
    assert all(step.tree_size <= {"right": 3, "wrong": 3, "tree": 9}[mode] for step in out.speculative_stats.steps)
