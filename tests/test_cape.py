"""CAPE (Du et al. 2024, §4.2, §5.3-5.4): expansion on hand-built q, lossless greedy decoding, ablations, errors."""

from __future__ import annotations

import pytest
import torch

from hf_specdraft import DraftModelCandidateGenerator, speculative_generate
from hf_specdraft.cape import (
    CapeCandidateGenerator,
    CapeConfig,
    DraftModelTreeScorer,
    beam_search_proposal,
    build_cape_for_bench,
    expand_proposal,
    expansion_sizes,
)
from hf_specdraft.core.drafting import TreeCandidateGenerator
from hf_specdraft.core.tree import DraftTree, tree_buffers
from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model


def prompt(length=7, seed=1):
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def peaked(vocab, probs: dict[int, float]) -> torch.Tensor:
    """A distribution `(V,)` with the given token probabilities and the rest spread evenly."""
    q = torch.full((vocab,), (1.0 - sum(probs.values())) / (vocab - len(probs)))
    for token, p in probs.items():
        q[token] = p
    return q


class ExpansionOracle(TreeCandidateGenerator):
    """Drafts the target's greedy continuation ``reference`` `(1, T)` but gets position ``wrong_at`` wrong.

    At ``wrong_at`` the chain token is ``right + 1`` with q = .5 and the right token is q's *second* choice
    (q = .3, confidence .5 -> K = 5), so it is only found in the expansion set: every step's accepted path
    ends in an expansion token, followed by the target's bonus token.
    """

    def __init__(self, reference: torch.Tensor, wrong_at: int, k: int = 4):
        super().__init__()
        self.reference, self.wrong_at, self.k = reference[0], wrong_at, k

    def propose(self, input_ids, target_cache=None):
        length = input_ids.shape[1]
        assert torch.equal(input_ids[0], self.reference[:length]), "the loop diverged from the target's greedy output"
        tokens, probs = [], []
        for j, right in enumerate(self.reference[length : length + self.k].tolist()):
            if j < self.wrong_at:
                tokens.append(right)
                probs.append(peaked(VOCAB, {right: 0.9}))
            else:
                wrong = (right + 1) % VOCAB
                tokens.append(wrong)
                probs.append(peaked(VOCAB, {wrong: 0.5, right: 0.3}))
        return DraftTree.chain(
            torch.tensor(tokens, dtype=torch.long), torch.stack(probs) if probs else torch.zeros(0, VOCAB)
        )


# ---------------------------------------------------------------- expand_proposal on hand-built q


def test_expansion_sizes_follow_the_confidence_bins():
    # p = max q in (0,.3], (.3,.6], (.6,.8], (.8,1]; the bins are right-closed (§4.2)
    q = torch.stack([peaked(16, {0: p}) for p in (0.3, 0.6, 0.8, 0.95, 0.2, 0.45, 0.7, 1.0)])
    sizes = expansion_sizes(q, CapeConfig(budget=64))
    assert sizes.tolist() == [7, 5, 3, 1, 7, 5, 3, 1]


@pytest.mark.parametrize("sizes", [[1, 1], [1, 1, 1, 1], [1, -1, 0]])
def test_expand_proposal_rejects_bad_sizes(sizes):
    q = torch.stack([peaked(16, {0: 0.5})] * 3)
    with pytest.raises(ValueError, match="sizes must hold one int"):
        expand_proposal(DraftTree.chain(torch.zeros(3, dtype=torch.long), q), CapeConfig(), sizes)


def test_budget_prefers_earlier_positions():
    q = torch.stack([peaked(16, {0: 0.2})] * 4)  # every position wants K = 7
    assert expansion_sizes(q, CapeConfig(budget=4 + 10)).tolist() == [7, 3, 0, 0]
    assert expansion_sizes(q, CapeConfig(budget=4)).tolist() == [0, 0, 0, 0]
    assert len(expand_proposal(DraftTree.chain(torch.zeros(4, dtype=torch.long), q), CapeConfig(budget=14))) == 14
    assert len(expand_proposal(DraftTree.chain(torch.zeros(4, dtype=torch.long), q), CapeConfig(budget=32))) == 4 + 28


def test_expansion_sets_are_next_best_leaves_beside_their_chain_token():
    q = torch.stack(
        [
            peaked(8, {3: 0.9, 5: 0.05}),  # K = 1: {5}
            peaked(8, {1: 0.7, 6: 0.2, 2: 0.05}),  # K = 3: {6, 2, ...}
            peaked(8, {4: 0.4, 7: 0.3, 0: 0.2}),  # chain token 7 is not the argmax (sampled): X = top-5 without 7
        ]
    )
    chain = DraftTree.chain(torch.tensor([3, 1, 7]), q)
    tree = expand_proposal(chain, CapeConfig(budget=32), with_draft_probs=True)
    assert expand_proposal(chain, CapeConfig(budget=32)).draft_probs is None
    assert tree.tokens[:3].tolist() == [3, 1, 7] and tree.parents[:3].tolist() == [-1, 0, 1]
    leaves = tree.tokens[3:].tolist()
    assert leaves[0] == 5
    assert leaves[1:3] == [6, 2] and len(leaves[1:4]) == 3
    assert leaves[4:6] == [4, 0] and 7 not in leaves[4:] and len(leaves[4:]) == 5
    assert tree.parents[3:].tolist() == [-1] + [0] * 3 + [1] * 5  # a leaf's parent is its chain token's parent
    assert torch.equal(tree.draft_probs[3:], q[[0, 1, 1, 1, 2, 2, 2, 2, 2]])  # row = q at the leaf's position
    assert (
        tree_buffers(tree.parent_list)[0][3:, 3:] == torch.eye(len(tree) - 3, dtype=torch.bool)
    ).all()  # leaves: no descendants
    assert tree.main_chain().tokens.tolist() == [3, 1, 7]


def test_tree_mask_is_the_cape_mask_of_the_paper():
    q = torch.softmax(torch.randn(5, 32, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
    tree = expand_proposal(DraftTree.chain(q.argmax(-1), q), CapeConfig(budget=32))
    gamma, beta = 5, len(tree)
    pos = list(range(1, gamma + 1)) + [int(p) + 2 for p in tree.parents[gamma:]]  # pos(i), 1-indexed as in §4.2
    cape_mask = torch.tensor(
        [[(j <= gamma and pos[i - 1] > j) or i == j for j in range(1, beta + 1)] for i in range(1, beta + 1)]
    )
    assert torch.equal(tree_buffers(tree.parent_list)[0], cape_mask)


def test_fixed_mode_and_small_vocabulary():
    q = torch.stack([peaked(16, {0: p}) for p in (0.1, 0.9, 0.5)])
    assert expansion_sizes(q, CapeConfig(mode="fixed", budget=32)).tolist() == [4, 4, 4]
    tiny = torch.tensor([[0.4, 0.35, 0.25], [0.2, 0.5, 0.3]])  # K = 5 asked, only 2 other tokens exist
    assert expansion_sizes(tiny, CapeConfig(budget=32)).tolist() == [2, 2]  # at most V - 1 other tokens
    assert len(expand_proposal(DraftTree.chain(tiny.argmax(-1), tiny), CapeConfig(budget=32))) == 6


# ---------------------------------------------------------------- beam search expansion (§5.3)


class TableScorer:
    """q after a node depends only on the node's token: ``table[token]`` `(V,)`; q after the prefix is ``root``."""

    def __init__(self, root, table):
        self.root, self.table, self.extended = root, table, []

    def start(self, input_ids, target_cache=None):
        return self.root[None]

    def extend(self, tokens, parents):
        self.extended.append((tokens.tolist(), parents.tolist()))
        return self.table[tokens]

    def finish(self):
        pass


def test_beam_search_keeps_the_best_cumulative_beams():
    root = torch.tensor([0.5, 0.3, 0.2, 0.0])
    table = torch.tensor([[0.1, 0.1, 0.1, 0.7], [0.0, 0.0, 0.0, 1.0], [0.25] * 4, [0.25] * 4])
    scorer = TableScorer(root, table)
    tree = beam_search_proposal(scorer, torch.tensor([[1, 2]]), depth=2, beam_width=2, budget=32)
    # depth 0: 0 (.5), 1 (.3); depth 1: 1->3 (.3), 0->3 (.35) -> [0->3, 1->3]
    assert tree.tokens.tolist() == [0, 1, 3, 3] and tree.parents.tolist() == [-1, -1, 0, 1]
    assert scorer.extended == [([0, 1], [-1, -1])]  # one draft forward per extra depth, over the whole beam
    assert (
        len(beam_search_proposal(TableScorer(root, table), torch.tensor([[1]]), depth=5, beam_width=2, budget=3)) == 3
    )


def test_tree_scorer_matches_the_draft_run_on_each_path():
    draft = tiny_model("llama", seed=4)
    scorer = DraftModelTreeScorer(draft, lambda logits: torch.softmax(logits.float(), -1))
    x = prompt()
    scorer.start(x[:, :4])  # a cached prefix from an earlier step is reused and re-synced
    q_root = scorer.start(x)
    parents = torch.tensor([-1, -1, 0, 1, 2])
    tokens = torch.tensor([5, 9, 17, 3, 40])
    q_a = scorer.extend(tokens[:2], parents[:2])
    q_b = scorer.extend(tokens[2:4], parents[:4])
    q_c = scorer.extend(tokens[4:], parents)
    scorer.finish()
    assert scorer.cache.get_seq_length() == x.shape[1]
    got = torch.cat([q_a, q_b, q_c])
    for node in range(5):
        path = DraftTree(tokens, parents).path_to(node)
        full = torch.cat([x[0], tokens[path]])[None]
        expected = torch.softmax(draft(full).logits[0, -1].float(), -1)
        torch.testing.assert_close(got[node], expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(q_root[0], torch.softmax(draft(x).logits[0, -1].float(), -1), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- lossless greedy decoding


@pytest.mark.parametrize("wrong_at", [0, 1])
def test_accepted_path_ends_in_an_expansion_token(arch, wrong_at):
    target = tiny_model(arch)
    x = prompt()
    ref = greedy_reference(target, x, 24)
    drafter = CapeCandidateGenerator(ExpansionOracle(ref, wrong_at), budget=32)  # the paper's budget
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=24, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    per_step = wrong_at + 2  # the right chain prefix, the expansion token, the target's bonus token
    stats = out.speculative_stats
    assert stats.num_steps == 24 // per_step
    assert all(step.accepted == wrong_at + 1 for step in stats.steps)  # the last accepted token is the expansion token
    assert all(sizes[wrong_at] == 5 for sizes in drafter.expansion_sizes)
    assert drafter.confidences[0][wrong_at] == pytest.approx(0.5)


@pytest.mark.parametrize("mode", ["confidence", "fixed", "beam"])
def test_every_mode_is_lossless_with_a_draft_model(arch, mode):
    target, draft = tiny_model(arch), tiny_model(arch, seed=3, num_hidden_layers=1)
    x = prompt()
    ref = greedy_reference(target, x, 16)
    drafter = build_cape_for_bench(DraftModelCandidateGenerator(draft, 4), mode=mode)
    out = target.generate(x, custom_generate=speculative_generate, candidate_generator=drafter, max_new_tokens=16)
    assert torch.equal(out, ref)
    assert len(drafter.expansion_sizes) > 0


@pytest.mark.parametrize("mode", ["confidence", "fixed", "beam"])
def test_every_mode_fully_accepts_a_perfect_draft(mode):
    target = tiny_model("llama", attn_implementation="eager")
    x = prompt()
    drafter = CapeCandidateGenerator(DraftModelCandidateGenerator(target, 3), mode=mode, budget=32)
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=16, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy_reference(target, x, 16))
    stats = out.speculative_stats
    if mode != "beam":  # the chain is the target's greedy path; a beam may drop it for paths of higher joint q
        assert stats.num_steps == 4  # 3 accepted + 1 bonus per step
    assert stats.drafter_calls["draft"] == stats.num_steps * 3  # beam: prefix + 2 tree forwards; chain: γ forwards


def test_cape_accepts_more_than_its_chain_with_a_noisy_draft():
    target = tiny_model("llama")
    draft = tiny_model("llama")
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.02)
    x = prompt(seed=2)
    ref = greedy_reference(target, x, 20)
    chain = speculative_generate(
        target, x, draft_model=draft, num_draft_tokens=4, max_new_tokens=20, return_dict_in_generate=True
    )
    cape = speculative_generate(
        target,
        x,
        candidate_generator=CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 4)),
        max_new_tokens=20,
        return_dict_in_generate=True,
    )
    assert torch.equal(chain.sequences, ref) and torch.equal(cape.sequences, ref)
    assert cape.speculative_stats.mean_accepted_length > chain.speculative_stats.mean_accepted_length
    assert cape.speculative_stats.verification_tokens_per_step <= 1 + 32


@pytest.mark.parametrize("mode", ["confidence", "beam"])
def test_sampling_runs_with_warped_q(mode):
    target, draft = tiny_model("qwen2"), tiny_model("qwen2", seed=3, num_hidden_layers=1)
    drafter = CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 3), mode=mode)
    torch.manual_seed(0)
    out = speculative_generate(
        target, prompt(), candidate_generator=drafter, max_new_tokens=10, do_sample=True, top_k=8, temperature=0.7
    )
    assert out.shape == (1, 17) and int(out.max()) < VOCAB
    assert all(len(sizes) <= 3 for sizes in drafter.expansion_sizes)


def test_chain_only_loops_get_the_wrapped_chain():
    target, draft = tiny_model(), tiny_model(seed=3, num_hidden_layers=1)
    drafter = CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 3))
    drafter.prepare(target, target.generation_config)
    ids, logits = drafter.get_candidates(prompt())
    assert ids.shape == (1, 10) and logits.shape == (1, 3, VOCAB)


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "schedule, match",
    [
        ((), "schedule is empty"),
        (((0.3, 1), (1.0, 5)), "not monotone"),
        (((0.6, 7), (0.3, 5), (1.0, 1)), "increase strictly"),
        (((0.3, 7), (0.8, 3)), "last schedule bound must be 1.0"),
        (((0.5, -1), (1.0, 0)), "int >= 0"),
        ((0.3, 0.6), "pairs"),
    ],
)
def test_bad_schedule(schedule, match):
    with pytest.raises(ValueError, match=match):
        CapeConfig(schedule=schedule)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"mode": "tree"}, "mode must be one of"),
        ({"budget": 0}, "budget must be a positive int"),
        ({"fixed_k": -1}, "fixed_k"),
        ({"beam_width": 0}, "beam_width"),
    ],
)
def test_bad_config(options, match):
    with pytest.raises(ValueError, match=match):
        CapeConfig(**options)


def test_budget_smaller_than_the_chain():
    draft = tiny_model(num_hidden_layers=1)
    with pytest.raises(ValueError, match="smaller than the drafted chain"):
        CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 5), budget=4)
    target = tiny_model()
    x = prompt()
    # γ unknown up front
    drafter = CapeCandidateGenerator(ExpansionOracle(greedy_reference(target, x, 12), wrong_at=0, k=6), budget=4)
    with pytest.raises(ValueError, match="smaller than the drafted chain"):
        speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=12)


def test_drafter_without_probabilities():
    target = tiny_model()
    x = prompt()
    drafter = CapeCandidateGenerator(OracleDrafter(greedy_reference(target, x, 8), "right"))
    with pytest.raises(ValueError, match="without draft_probs"):
        speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=8)
    with pytest.raises(ValueError, match="draft_probs=None"):
        expand_proposal(DraftTree.chain(torch.tensor([1, 2])), CapeConfig())


def test_wrong_drafter_types():
    with pytest.raises(TypeError, match="TreeCandidateGenerator"):
        CapeCandidateGenerator(tiny_model(num_hidden_layers=1))
    oracle = OracleDrafter(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="no int num_draft_tokens"):
        CapeCandidateGenerator(oracle, mode="beam")
    oracle.num_draft_tokens = 4
    with pytest.raises(ValueError, match="needs a draft model"):
        CapeCandidateGenerator(oracle, mode="beam")
    with pytest.raises(ValueError, match="not both"):
        CapeCandidateGenerator(DraftModelCandidateGenerator(tiny_model(num_hidden_layers=1), 3), CapeConfig(), budget=8)
    with pytest.raises(ValueError, match="tree with several branches"):
        expand_proposal(DraftTree(torch.tensor([1, 2]), torch.tensor([-1, -1]), torch.ones(2, 4) / 4), CapeConfig())
