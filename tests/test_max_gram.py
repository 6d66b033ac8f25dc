"""Max-Gram on hand-written sequences, and the bigram table: build, save, load."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors import safe_open

from hf_specdraft import speculative_generate
from hf_specdraft.cascade import (
    MaxGramCandidateGenerator,
    build_bigram_table,
    build_max_gram_for_bench,
    load_bigram_table,
    longest_suffix_match,
    max_gram_draft,
    save_bigram_table,
)
from conftest import VOCAB, greedy_reference, tiny_model


def bigram_table_metadata(path) -> dict[str, str]:
    """The string metadata save_bigram_table wrote into ``path``."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        return dict(f.metadata() or {})


def t(*ids):
    return torch.tensor(ids, dtype=torch.long)


def brute_force_match(seq: list[int], cap: int | None) -> tuple[int, int]:
    best = (-1, 0)
    for j in range(len(seq) - 1):
        m = 0
        while j - m >= 0 and seq[j - m] == seq[len(seq) - 1 - m] and (cap is None or m < cap):
            m += 1
        if m and (m > best[1] or (m == best[1] and j > best[0])):
            best = (j, m)
    return best


def test_longest_match_wins_over_a_more_recent_shorter_one():
    seq = t(5, 6, 7, 8, 1, 6, 7, 9, 2, 5, 6, 7)  # "5 6 7" at 0..2, only "6 7" at 5..6
    assert longest_suffix_match(seq) == (2, 3)
    assert max_gram_draft(seq, 3).tolist() == [8, 1, 6]


def test_most_recent_occurrence_wins_on_ties():
    seq = t(1, 2, 30, 4, 1, 2, 40, 9, 1, 2)  # "1 2" twice before the suffix: the later one is followed by 40
    assert longest_suffix_match(seq) == (5, 2)
    assert max_gram_draft(seq, 2).tolist() == [40, 9]


def test_copy_runs_into_its_own_proposal():
    seq = t(3, 1, 2, 1, 2)  # period 2: an overlapping copy keeps repeating it
    assert max_gram_draft(seq, 5).tolist() == [1, 2, 1, 2, 1]


def test_bigram_fallback_when_nothing_matches():
    table = torch.arange(10).roll(-1)  # t -> t + 1
    seq = t(0, 1, 2, 7)  # 7 never occurred before
    assert max_gram_draft(seq, 4, table).tolist() == [8, 9, 0, 1]
    assert max_gram_draft(seq, 4).numel() == 0  # no table: nothing to propose


def test_match_length_cap_prefers_the_most_recent_long_match():
    seq = t(1, 2, 3, 50, 9, 2, 3, 60, 1, 2, 3)
    assert longest_suffix_match(seq) == (2, 3)
    assert longest_suffix_match(seq, max_match_length=2) == (6, 2)


def test_agrees_with_brute_force_on_random_sequences():
    rng = random.Random(0)
    for _ in range(400):
        length, vocab = rng.randint(1, 40), rng.choice([2, 3, 7])
        seq = [rng.randrange(vocab) for _ in range(length)]
        if length > 8 and rng.random() < 0.3:
            period = rng.randint(1, 4)
            seq = [seq[i % period] for i in range(length)]
        cap = rng.choice([None, 1, 4, 16])
        assert longest_suffix_match(torch.tensor(seq), cap) == brute_force_match(seq, cap), (seq, cap)


def test_vocabulary_above_65535_ids():
    big = 300_000
    seq = t(299_999, 70_000, 123_456, 5, 299_999, 70_000)
    assert max_gram_draft(seq, 3).tolist() == [123_456, 5, 299_999]
    table = torch.zeros(big, dtype=torch.long)
    table[250_001], table[65_536] = 65_536, 299_998
    assert max_gram_draft(t(1, 2, 250_001), 3, table).tolist() == [65_536, 299_998, 0]
    built = build_bigram_table([[250_001, 65_536, 299_998], [250_001, 65_536]], big)
    assert built.shape == (big,) and built.dtype == torch.long
    assert built[250_001] == 65_536 and built[65_536] == 299_998


def test_candidate_generator_counts_calls_and_is_lossless():
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    drafter = MaxGramCandidateGenerator(torch.randint(0, VOCAB, (VOCAB,), generator=torch.Generator().manual_seed(2)))
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=20, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy_reference(target, x, 20))
    assert out.speculative_stats.drafter_calls == {"max_gram": out.speculative_stats.num_steps}
    # outside the loop: the paper's fixed 10
    assert len(MaxGramCandidateGenerator(drafter.bigram_table).propose(x)) == 10
    assert (
        drafter.adaptive_draft_length
        and len(out.speculative_stats.extra["draft_lengths"]) == out.speculative_stats.num_steps
    )


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_num_draft_tokens(bad):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        MaxGramCandidateGenerator(num_draft_tokens=bad)


@pytest.mark.parametrize(
    "bad",
    [torch.zeros(4, 4, dtype=torch.long), torch.zeros(4), torch.tensor([0, -1]), torch.zeros(0, dtype=torch.long)],
)
def test_bad_bigram_table(bad):
    with pytest.raises(ValueError, match="bigram_table"):
        MaxGramCandidateGenerator(bad)


def test_bigram_table_larger_than_target_vocab():
    target = tiny_model()
    with pytest.raises(ValueError, match="bigram_table has 200 entries"):
        build_max_gram_for_bench(target, torch.zeros(200, dtype=torch.long))
    with pytest.raises(ValueError, match="bigram_table"):
        speculative_generate(
            target,
            t(1, 2, 3)[None],
            candidate_generator=MaxGramCandidateGenerator(torch.zeros(200, dtype=torch.long)),
            max_new_tokens=4,
        )


def test_build_bigram_table_argmax_ties_and_unseen():
    # 1->2 twice, 1->3 once; 3->4 / 3->5 tie; never across sequences
    corpus = [[1, 2, 1, 2, 1, 3], [3, 4], [3, 5], [4, 6]]
    table = build_bigram_table(corpus, 8)
    assert table[1] == 2 and table[2] == 1 and table[3] == 4 and table[4] == 6
    most_frequent = 1  # 1 and 3 occur 3 times each; ties go to the smallest id
    assert table[0] == most_frequent and table[7] == most_frequent and table[6] == most_frequent
    assert build_bigram_table(corpus, 8, unseen="self")[[0, 6, 7]].tolist() == [0, 6, 7]
    with pytest.raises(ValueError, match="token ids must be in"):
        build_bigram_table([[1, 9]], 8)
    with pytest.raises(ValueError, match="unseen"):
        build_bigram_table(corpus, 8, unseen="zero")


def test_save_load_round_trip(tmp_path):
    table = build_bigram_table([torch.tensor([5, 1, 5, 1, 2])], 300_000)
    path = tmp_path / "bigram.safetensors"
    save_bigram_table(table, path, {"tokenizer": "toy"})
    loaded = load_bigram_table(path)
    assert torch.equal(loaded, table) and loaded.dtype == torch.long
    assert bigram_table_metadata(path)["tokenizer"] == "toy"
    assert torch.equal(
        build_max_gram_for_bench(
            tiny_model(
                vocab_size=300_000, hidden_size=16, num_attention_heads=2, intermediate_size=16, num_hidden_layers=1
            ),
            path,
        ).bigram_table,
        table,
    )
    with pytest.raises(ValueError, match="does not exist"):
        load_bigram_table(tmp_path / "missing.safetensors")
