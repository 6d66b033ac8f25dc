"""Trees drawn by hand, cache compaction, acceptance rules and the speedup formulas."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from hf_specdraft.core.support import with_cache
from hf_specdraft import ConditionalAcceptance, DraftTree, expected_speedup
from hf_specdraft.core.acceptance import accept_tree, check_lenience, lenient_review
from hf_specdraft.core.tree import tree_buffers, tree_mask
from hf_specdraft.core.cache import compact_cache, resync_cache
from conftest import ARCHITECTURES, tiny_model


def test_tree_buffers_by_hand():
    #        root
    #       /    \
    #      0      1
    #     / \      \
    #    2   3      4
    #        |
    #        5
    parents = [-1, -1, 0, 0, 1, 3]
    ancestors, depth = tree_buffers(parents)
    assert depth == [0, 0, 1, 1, 1, 2]
    assert ancestors[5].nonzero().flatten().tolist() == [0, 3, 5]
    assert ancestors[4].nonzero().flatten().tolist() == [1, 4]
    tree = DraftTree(torch.arange(6), parents)
    rooted = [-1] + [p + 1 for p in parents]  # the last accepted token is the root of what is verified
    mask, positions = tree_mask(rooted, 3, torch.float32, torch.device("cpu"))
    assert mask.shape == (1, 1, 7, 10)
    assert positions.tolist() == [[3, 4, 4, 5, 5, 5, 6]]
    visible = mask[0, 0] == 0
    assert visible[0].tolist() == [True] * 4 + [False] * 6  # the last token sees the cache and itself
    assert visible[6].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 7, 9]  # node 5: cache, last, 0, 3, 5
    assert tree.path_to(5) == [0, 3, 5] and tree.main_chain().tokens.tolist() == [0, 2]


def test_tree_validation_errors():
    with pytest.raises(ValueError, match="topological"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([1, -1]))
    with pytest.raises(ValueError, match="same length"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([-1]))
    with pytest.raises(ValueError, match="draft_probs"):
        DraftTree.chain(torch.tensor([1, 2]), torch.ones(3, 5))


def test_truncate_depth_keeps_a_valid_tree():
    tree = DraftTree(torch.tensor([7, 8, 9, 10]), torch.tensor([-1, 0, -1, 1]))
    short = tree.truncate_depth(2)
    assert short.tokens.tolist() == [7, 8, 9] and short.parents.tolist() == [-1, 0, -1]


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_verification_and_compaction_match_a_fresh_run(arch, attn):
    model = tiny_model(arch, attn_implementation=attn)
    prefix = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(0))
    tree = DraftTree(torch.tensor([11, 12, 13, 14, 15, 16]), torch.tensor([-1, -1, 0, 0, 1, 3]))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prefix[:, :-1], **with_cache(model, cache))
        mask, pos = tree_mask([-1] + [p + 1 for p in tree.parent_list], 8, model.dtype, torch.device("cpu"))
        logits = model(
            torch.cat([prefix[:, -1:], tree.tokens[None]], 1),
            attention_mask=mask,
            position_ids=pos,
            **with_cache(model, cache),
        ).logits
        for node in range(6):
            path = tree.path_to(node)
            fresh = model(torch.cat([prefix, tree.tokens[path][None]], 1)).logits[0, -1]
            torch.testing.assert_close(logits[0, 1 + node], fresh, atol=1e-4, rtol=1e-4)
        compact_cache(cache, torch.cat([torch.arange(9), 9 + torch.tensor([0, 3])]))  # accept path 0 -> 3
        assert cache.get_seq_length() == 11
        step = model(torch.tensor([[16]]), **with_cache(model, cache)).logits[0, -1]
        fresh = model(torch.cat([prefix, torch.tensor([[11, 14, 16]])], 1)).logits[0, -1]
    torch.testing.assert_close(step, fresh, atol=1e-4, rtol=1e-4)


class ArgmaxRows:
    """The loop's target rows for greedy decoding: ``choice`` is the argmax of ``p[row]``."""

    def __init__(self, p):
        self.p = p

    def choice(self, row):
        return int(self.p[row].argmax())

    def probs(self, row):
        return self.p[row]


def test_greedy_tree_walk_and_lenient_chain_rules():
    p = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.3, 0.3, 0.4]])
    q_candidates = torch.tensor([0.9, 0.8])
    cand = torch.tensor([1, 2])
    # 2 is not row 1's argmax: p's own 0 follows
    assert accept_tree(ArgmaxRows(p), DraftTree.chain(cand), None, []) == ([0], 0)
    # the second root and its child are the argmax path
    tree = DraftTree(torch.tensor([2, 1, 2]), torch.tensor([-1, -1, 1]))
    rows = ArgmaxRows(torch.cat([p, torch.tensor([[0.6, 0.2, 0.2]])]))  # one row per node + the root's
    assert accept_tree(rows, tree, None, []) == ([1, 2], 0)
    assert lenient_review(p, cand, q_candidates, 1.0) == 1  # l = 1: exact
    assert lenient_review(p, cand, q_candidates, 2.0) == 1  # q(2)=0.8 > 2 * p(2)=0.6
    assert lenient_review(p, cand, q_candidates, 3.0) == 2  # 0.8 <= 3 * 0.3


@pytest.mark.parametrize("bad", [0.5, 0, -1, float("nan"), "2"])
def test_lenience_below_one_is_rejected(bad):
    with pytest.raises(ValueError, match="lenience"):
        check_lenience(bad)


def test_conditional_acceptance_threshold_and_eos():
    rule = ConditionalAcceptance(threshold=0.1)
    probs = torch.tensor([0.05, 0.11, 0.09, 0.75])
    assert rule.accepts(probs, 1, eos_token_ids=[]) is True  # 0.11 > 0.1
    assert rule.accepts(probs, 2, eos_token_ids=[]) is False  # 0.09 < 0.1
    assert rule.accepts(probs, 1, eos_token_ids=[3]) is False  # p(eos)=0.75 > 0.11
    mixed = ConditionalAcceptance(threshold=0.01, top_k=2)
    assert mixed.accepts(probs, 1, []) is True and mixed.accepts(probs, 0, []) is False


@pytest.mark.parametrize(
    "kwargs", [{"threshold": 0}, {"threshold": 1}, {"threshold": 1.5}, {"threshold": -0.1}, {"top_k": 0}]
)
def test_conditional_acceptance_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="threshold|top_k"):
        ConditionalAcceptance(**kwargs)


def test_expected_speedup():
    assert expected_speedup(0.0, 5, 0.0) == pytest.approx(1.0)
    assert expected_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    assert expected_speedup(0.5, 1, 0.5) == pytest.approx(1.5 / 1.5)
    # α=0.8, γ=5, c=0.05 -> (1-0.8^6)/(0.2*1.25)
    assert expected_speedup(0.8, 5, 0.05) == pytest.approx((1 - 0.8**6) / (0.2 * 1.25))
    with pytest.raises(ValueError, match="alpha"):
        expected_speedup(1.5, 5, 0.1)


@pytest.mark.parametrize(
    "seen, ids, limit, keep",
    [
        ([5, 6, 7, 8], [5, 6, 9, 1, 2], None, 2),  # diverges at 2: rows 2.. go
        ([5, 6, 7], [5, 6, 7, 8], None, 3),  # a prefix: nothing to crop
        ([5, 6, 7, 8], [5, 6, 7, 8], None, 3),  # identical: the newest token is fed again for its logits
        ([5, 6, 7, 8], [5, 6, 7, 8, 9], 2, 2),  # the cascade's review index caps it
        ([], [5], None, 0),
    ],
)
def test_resync_cache_crops_to_the_common_prefix(seen, ids, limit, keep):
    cache = DynamicCache()
    if seen:
        cache.update(torch.randn(1, 1, len(seen), 2), torch.randn(1, 1, len(seen), 2), 0)
    assert resync_cache(cache, torch.tensor(seen, dtype=torch.long), torch.tensor(ids), limit) == keep
    assert cache.get_seq_length() == min(keep, len(seen))
