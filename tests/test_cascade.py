"""CS Drafting: lossless greedy output on three architectures, Algorithm 1's call structure, lenience, errors, SWI."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import GenerationConfig

from hf_specdraft import SpeculativeStats, speculative_generate
from hf_specdraft.core.stats import StepRecord
from hf_specdraft.cascade import (
    CascadeCandidateGenerator,
    MaxGramCandidateGenerator,
    build_cascade_for_bench,
    default_k_matrix,
    lenient_review,
    validate_k_matrix,
)
from benchmarks.swi import (
    cascade_swi,
    measure_cost_coefficients,
    parameter_cost_coefficients,
    swi_from_stats,
    swi_report,
)
from conftest import VOCAB, greedy_reference, tiny_model
from test_sampling import first_two_joint

NEW_TOKENS = 16
TABLE = torch.randint(0, VOCAB, (VOCAB,), generator=torch.Generator().manual_seed(2))


@functools.cache
def models(arch: str):
    """Target, two random drafts (fewer layers / smaller) and a prompt, built once per architecture."""
    target = tiny_model(arch)
    big = tiny_model(arch, seed=3, num_hidden_layers=1)
    small = tiny_model(arch, seed=4, num_hidden_layers=1, hidden_size=16, num_attention_heads=2, intermediate_size=32)
    x = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    return target, big, small, x, greedy_reference(target, x, NEW_TOKENS)


def make(setup: str, target, big, small, lenience):
    if setup == "max_gram":
        return MaxGramCandidateGenerator(TABLE)
    drafts = {"one_draft": [big], "two_drafts": [big, small], "target_then_small": [target, small]}[setup]
    # small budgets: random drafts rarely agree
    k_matrix = [[3, 10], [0, 10]] if len(drafts) == 1 else [[2, 3, 10], [0, 1, 10], [0, 0, 10]]
    return CascadeCandidateGenerator(drafts, k_matrix=k_matrix, lenience=lenience, bigram_table=TABLE)


@pytest.mark.parametrize(
    "setup,lenience",
    [
        ("max_gram", 1),
        ("one_draft", 1),
        ("one_draft", 3),
        ("two_drafts", 1),
        ("two_drafts", 3),
        ("target_then_small", 5),
    ],
)
def test_greedy_equals_target_greedy(arch, setup, lenience):
    target, big, small, x, ref = models(arch)
    drafter = make(setup, target, big, small, lenience)
    out = target.generate(
        x,
        custom_generate=speculative_generate,
        candidate_generator=drafter,
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, ref)
    calls = out.speculative_stats.drafter_calls
    expected = (
        {"max_gram": 1}
        if setup == "max_gram"
        else {"max_gram": 1, "draft0": 1} | ({} if setup == "one_draft" else {"draft1": 1})
    )
    assert set(calls) == set(expected) and all(count >= 1 for count in calls.values())


def test_draft_equal_to_target_is_fully_accepted():
    target, _, _, x, ref = models("llama")
    # the paper's budgets alone
    drafter = CascadeCandidateGenerator([target], k_matrix=[[4, 0], [0, 3]], num_draft_tokens=None)
    out = speculative_generate(
        target, x, candidate_generator=drafter, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, ref)
    assert out.speculative_stats.accepted_per_drafted == 1.0
    assert out.speculative_stats.mean_accepted_length >= 4  # K[0, 0] = 4 tokens per step, + the target's own


def test_auto_caps_the_cascade_every_step(arch):
    """num_draft_tokens='auto' (the default): the loop's controller caps the cascade's proposal, up to row 0's sum."""
    from hf_specdraft.core.controller_store import forget

    target, big, _, x, ref = models(arch)
    forget(target)  # the models are shared between tests: measure the cost curve afresh
    drafter = CascadeCandidateGenerator([big], k_matrix=[[3, 4], [0, 2]], bigram_table=TABLE)
    assert drafter.adaptive_draft_length and drafter.max_draft_tokens == 7 and drafter.num_draft_tokens is None
    out = speculative_generate(
        target, x, candidate_generator=drafter, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, ref)
    lengths = out.speculative_stats.extra["draft_lengths"]
    assert lengths[:2] == [1, 3] and all(1 <= g <= 7 for g in lengths)
    assert all(s.drafted <= g for s, g in zip(out.speculative_stats.steps, lengths))


def test_sliding_window_draft_past_its_window():
    target, _, _, x, _ = models("llama")
    # its cache cannot roll back past 8 tokens
    draft = tiny_model("mistral", seed=3, num_hidden_layers=1, sliding_window=8)
    drafter = CascadeCandidateGenerator([draft], k_matrix=[[3, 10], [0, 10]], bigram_table=TABLE)
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=24)
    assert torch.equal(out, greedy_reference(target, x, 24))


def test_sampling_runs():
    target, big, small, x, _ = models("llama")
    torch.manual_seed(0)
    drafter = CascadeCandidateGenerator(
        [big, small], k_matrix=[[2, 3, 10], [0, 1, 10], [0, 0, 10]], lenience=2, bigram_table=TABLE
    )
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=12, do_sample=True, top_k=10)
    assert out.shape == (1, x.shape[1] + 12)


def test_lenient_sampling_review_follows_section_3_1():
    """A candidate with q(x) > l p(x) passes with probability l p(x) / q(x); one with q(x) <= l p(x) always passes;
    MaG's tokens (q = inf) pass with probability p(x)."""
    from hf_specdraft.core.acceptance import lenient_review_sampling

    p = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]])
    g = torch.Generator().manual_seed(0)
    trials = 4000
    strict = (
        sum(lenient_review_sampling(p, torch.tensor([0]), torch.tensor([0.5]), 1.0, g)[0] for _ in range(trials))
        / trials
    )
    lenient = (
        sum(lenient_review_sampling(p, torch.tensor([0]), torch.tensor([0.5]), 3.0, g)[0] for _ in range(trials))
        / trials
    )
    assert strict == pytest.approx(0.1 / 0.5, abs=0.03) and lenient == pytest.approx(0.3 / 0.5, abs=0.03)
    # 0.5 <= 2 * 0.3
    assert all(lenient_review_sampling(p, torch.tensor([2]), torch.tensor([0.5]), 2.0, g)[0] == 1 for _ in range(50))
    mag = (
        sum(
            lenient_review_sampling(p, torch.tensor([1]), torch.tensor([float("inf")]), 100.0, g)[0]
            for _ in range(trials)
        )
        / trials
    )
    assert mag == pytest.approx(0.6, abs=0.03)
    rejected_next = [lenient_review_sampling(p, torch.tensor([1]), torch.tensor([0.9]), 1.0, g) for _ in range(300)]
    # the reviewer's own token after a rejection is another one
    assert all(token != 1 for n, token in rejected_next if n == 0)


@pytest.mark.slow  # 600 sampled runs (~50 s on 2 cores): CI runs it with -m slow
def test_lenient_sampling_is_lossless_at_the_target():
    """§3.1: lenience applies only where drafts review, so sampled output still follows the target (chi-square on the
    first two tokens, large lenience)."""
    from scipy.stats import chisquare

    vocab = 6
    target, draft = tiny_model(vocab_size=vocab, seed=0), tiny_model(vocab_size=vocab, seed=5, num_hidden_layers=1)
    x = torch.tensor([[1, 2, 3]])
    joint = first_two_joint(target, x).flatten().double()
    counts = torch.zeros(vocab * vocab)
    drafter = CascadeCandidateGenerator(
        [draft], k_matrix=[[2, 2], [0, 3]], lenience=50.0, bigram_table=torch.arange(vocab).roll(1)
    )
    torch.manual_seed(0)
    for _ in range(600):
        out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=2, do_sample=True, top_k=0)
        counts[out[0, 3] * vocab + out[0, 4]] += 1
    assert chisquare(counts.double().numpy(), (joint / joint.sum() * counts.sum()).numpy()).pvalue > 1e-3


def test_lenient_reviews_change_what_the_drafts_propose():
    """§3.1: under lenience more of the second draft's tokens pass the first draft's review, so fewer reviews fill the
    same budget (the sampled output staying the target's is the slow test above)."""
    vocab = 6
    target, draft = tiny_model(vocab_size=vocab, seed=0), tiny_model(vocab_size=vocab, seed=5, num_hidden_layers=1)
    small = tiny_model(vocab_size=vocab, seed=8, num_hidden_layers=1)
    x = torch.tensor([[1, 2, 3]])

    def reviews_by_the_first_draft(lenience: float) -> int:
        gen = CascadeCandidateGenerator(
            [draft, small],
            k_matrix=[[6, 0, 0], [0, 3, 0], [0, 0, 2]],
            lenience=lenience,
            bigram_table=torch.arange(vocab).roll(1),
        )
        gen.prepare(target, GenerationConfig(do_sample=True, top_k=0, max_length=64))
        torch.manual_seed(1)
        for _ in range(100):
            gen.propose(x)
        return gen.forward_calls["draft0"]

    assert reviews_by_the_first_draft(1e6) < reviews_by_the_first_draft(1.0)


# --- Algorithm 1's call structure, with scripted reviewers -------------------------------------------


def scripted(drafter: CascadeCandidateGenerator, accept: bool, max_length: int = 1000):
    """Replace every draft's forward by logits whose argmax accepts (or rejects) every reviewed token."""

    def draft_logits(index, cur_gen, review_index):
        drafter.count_call(f"draft{index}")
        tokens = torch.cat([cur_gen[review_index:], cur_gen[-1:]])
        tokens = tokens if accept else (tokens + 1) % VOCAB
        return torch.nn.functional.one_hot(tokens, VOCAB).float() * 10

    drafter.draft_logits = draft_logits
    drafter.prepare(tiny_model(), GenerationConfig(max_length=max_length))
    return drafter


@pytest.mark.parametrize(
    "drafts,k_matrix,accept,expected_calls,expected_length",
    [
        # one draft, K = [[5, 10], [0, 10]]: draft0 adds 1 token per review until 5, then MaG adds 10
        (1, [[5, 10], [0, 10]], False, {"draft0": 5, "max_gram": 6}, 15),
        (1, [[5, 10], [0, 10]], True, {"draft0": 1, "max_gram": 2}, 21),
        # two drafts, the official FLAN-T5 config: draft1 reviews MaG inside draft0's recursion (k_22 = 1)
        (2, [[5, 14, 10], [0, 1, 10], [0, 0, 10]], False, {"draft0": 5, "draft1": 19, "max_gram": 25}, 29),
        (2, [[5, 14, 10], [0, 1, 10], [0, 0, 10]], True, {"draft0": 1, "draft1": 2, "max_gram": 3}, 33),
        # a draft whose own level has no budget decodes one token per forward (vanilla SD)
        (1, [[3, 0], [0, 0]], False, {"draft0": 3}, 3),
    ],
)
def test_algorithm_1_call_counts(drafts, k_matrix, accept, expected_calls, expected_length):
    drafter = scripted(
        CascadeCandidateGenerator([tiny_model()] * drafts, k_matrix=k_matrix, bigram_table=TABLE), accept
    )
    tree = drafter.propose(torch.tensor([[1, 2, 3, 4]]))
    assert drafter.forward_calls == expected_calls
    assert len(tree) == expected_length and tree.is_chain
    cur_gen, cur_probs = drafter.cascade_step(0, torch.tensor([1, 2, 3, 4]), torch.zeros(0), 1000)
    assert cur_probs.numel() == cur_gen.numel() - 4  # invariant: one q(x) per drafted token
    assert bool(torch.isinf(cur_probs[-1])) == (k_matrix[0][-1] > 0)  # MaG's raw tail is never lenient
    assert bool(torch.isfinite(cur_probs[0]))  # the first token was reviewed by draft0


def test_proposal_respects_max_length_and_num_draft_tokens():
    drafter = scripted(CascadeCandidateGenerator([tiny_model()], bigram_table=TABLE), True, max_length=7)
    assert len(drafter.propose(torch.tensor([[1, 2, 3, 4]]))) == 2  # room for the loop's own token
    drafter = scripted(CascadeCandidateGenerator([tiny_model()], bigram_table=TABLE, num_draft_tokens=6), True)
    assert len(drafter.propose(torch.tensor([[1, 2, 3, 4]]))) == 6


# --- lenience ----------------------------------------------------------------------------------------


def test_lenient_review_rule():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.2, 0.2, 0.6]])  # (k+1, V)
    candidates = torch.tensor([1, 2])  # neither is the reviewer's argmax
    q = torch.tensor([0.5, 0.5])
    assert lenient_review(p, candidates, q, 1.0) == 0  # l = 1: exact
    assert lenient_review(p, candidates, q, 1.5) == 0  # 0.5 > 1.5 * 0.3
    assert lenient_review(p, candidates, q, 2.0) == 2  # 0.5 <= 2 * 0.3 and 0.5 <= 2 * 0.3
    assert lenient_review(p, candidates, torch.tensor([0.5, float("inf")]), 100.0) == 1  # MaG's tokens: never lenient
    assert lenient_review(p, torch.tensor([0, 2]), torch.tensor([1.0, 1.0]), 1.0) == 1  # argmax always passes


def test_draft_review_is_lenient_for_neural_tokens_only():
    drafter = CascadeCandidateGenerator([tiny_model()], lenience=4, bigram_table=TABLE)
    drafter.prepare(tiny_model(), GenerationConfig(max_length=100))
    probs = torch.full((VOCAB,), 0.5 / (VOCAB - 2))
    probs[7], probs[8] = 0.3, 0.2  # token 7 is the argmax; token 8 passes 0.5 <= 4 * 0.2
    drafter.draft_logits = lambda index, cur_gen, review_index: probs.log().expand(
        cur_gen.numel() - review_index + 1, VOCAB
    )
    cur_gen = torch.tensor([1, 2, 8, 8])
    kept, kept_q = drafter.review(0, cur_gen, torch.tensor([0.5, float("inf")]), 2)
    assert kept.tolist() == [1, 2, 8, 7]  # the draft's token is kept, MaG's is replaced by the argmax
    assert torch.allclose(kept_q, torch.tensor([0.2, 0.3]))  # kept tokens now carry the reviewer's p


# --- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k_matrix,message",
    [
        ([[5, 10, 1], [0, 10, 1], [0, 0, 1]], r"shape \(2, 2\)"),
        ([5, 10], r"shape \(2, 2\)"),
        ([[5, -1], [0, 10]], ">= 0"),
        ([[5, 10], [3, 10]], "upper-triangular"),
        ([[5.5, 10], [0, 10]], "integers"),
        ([[0, 0], [0, 10]], "sums to 0"),
        ([[5, 10], [0]], "square matrix"),
    ],
)
def test_bad_k_matrix(k_matrix, message):
    with pytest.raises(ValueError, match=message):
        CascadeCandidateGenerator([tiny_model()], k_matrix=k_matrix)


def test_default_k_matrices_are_valid():
    for n in (1, 2, 3):
        assert validate_k_matrix(default_k_matrix(n), n) == default_k_matrix(n)


@pytest.mark.parametrize("bad", [0.5, 0, -2, "2"])
def test_bad_lenience(bad):
    with pytest.raises(ValueError, match="lenience"):
        CascadeCandidateGenerator([tiny_model()], lenience=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_num_draft_tokens(bad):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        CascadeCandidateGenerator([tiny_model()], num_draft_tokens=bad)
    with pytest.raises(ValueError, match="max_gram_tokens"):
        CascadeCandidateGenerator([tiny_model()], max_gram_tokens=bad)


def test_empty_or_wrong_drafts():
    with pytest.raises(ValueError, match="non-empty list"):
        CascadeCandidateGenerator([])
    with pytest.raises(ValueError, match="non-empty list"):
        build_cascade_for_bench(tiny_model(), [])
    with pytest.raises(TypeError, match=r"drafts\[0\]"):
        CascadeCandidateGenerator(["not a model"])


def test_draft_vocabulary_differs_from_target():
    target, big = tiny_model(), tiny_model(seed=3, num_hidden_layers=1)
    odd = tiny_model(seed=4, num_hidden_layers=1, vocab_size=VOCAB + 4)
    with pytest.raises(ValueError, match=r"drafts\[1\] predicts 100 token ids but the target predicts 96"):
        speculative_generate(
            target,
            torch.tensor([[1, 2, 3]]),
            candidate_generator=CascadeCandidateGenerator([big, odd]),
            max_new_tokens=4,
        )
    with pytest.raises(ValueError, match=r"drafts\[1\]"):
        build_cascade_for_bench(target, [big, odd])


# --- SWI (the lab's measure, benchmarks/swi.py) --------------------------------------------------------


def test_swi_arithmetic():
    # §5.1: n / (count(M_t) + Σ count(M_di) c_i)
    assert cascade_swi(
        100, 30, {"draft0": 40, "draft1": 100, "max_gram": 90}, {"draft0": 0.05, "draft1": 0.01, "max_gram": 0.0}
    ) == pytest.approx(100 / 33)
    assert cascade_swi(50, 50, {}, {}) == 1.0  # target-only decoding
    assert cascade_swi(100, 40, {"draft": 200}, {"draft": 0.05}) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="cost_coefficients"):
        cascade_swi(100, 40, {"draft": 200}, {})
    with pytest.raises(ValueError, match="draft1"):
        cascade_swi(10, 5, {"draft1": 3}, {"draft0": 0.1})
    stats = SpeculativeStats(drafter_calls={"draft0": 8, "max_gram": 10})
    for emitted in (4, 3, 5, 4):
        stats.steps.append(StepRecord(5, 5, emitted - 1, emitted, 0.0, 0.0))
    assert swi_from_stats(stats, {"draft0": 0.25, "max_gram": 0.0}) == pytest.approx(16 / (4 + 2))


def test_cost_coefficients():
    target, big, small, _, _ = models("llama")
    heuristic = parameter_cost_coefficients(target, [big, small])
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert heuristic == pytest.approx({"draft0": n(big) / n(target), "draft1": n(small) / n(target), "max_gram": 0.0})
    measured = measure_cost_coefficients(target, [big], context_length=24, num_tokens=4, repeats=2)
    assert set(measured) == {"draft0", "max_gram"} and all(c > 0 for c in measured.values())
    stats = SpeculativeStats(drafter_calls={"draft0": 3, "draft1": 3, "max_gram": 2})
    stats.steps.append(StepRecord(3, 3, 3, 4, 0.0, 0.0))
    report = swi_report(stats, target, [big, small], measured | {"draft1": 0.1})
    assert report["swi_params"] == pytest.approx(4 / (1 + 3 * heuristic["draft0"] + 3 * heuristic["draft1"]))
    assert report["swi_measured"] > 0
