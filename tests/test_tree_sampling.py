"""Token trees under sampling stay lossless for any tree a drafter proposes (duplicates, deep, wide, eos inside).

A synthetic target gives each prefix its own distribution over a 5-token vocabulary. One verification step
walks the tree (``accept_tree``); the tokens it emits are then continued by plain sampling from the target,
so the first two tokens of the result must follow the target's joint distribution exactly. Threshold as
in test_sampling.py: p-value > 1e-3 with fixed seeds.
"""

from __future__ import annotations

import pytest
import torch
from test_sampling import P_VALUE, chi_square_p, first_two_joint

from hf_specdraft import speculative_generate
from hf_specdraft.core.drafting import TreeCandidateGenerator
from hf_specdraft.core.acceptance import accept_tree
from hf_specdraft.core.tree import DraftTree
from conftest import tiny_model

V = 5


def target_probs(prefix: tuple[int, ...]) -> torch.Tensor:
    """A fixed distribution per prefix (a stand-in for the target's p); the first token is often 0, so the
    duplicated root children of the trees below are often both accepted."""
    if not prefix:
        return torch.tensor([0.5, 0.2, 0.1, 0.1, 0.1])
    g = torch.Generator().manual_seed(sum(t * 7**i for i, t in enumerate(prefix)) + 1)
    return torch.softmax(torch.randn(V, generator=g) * 0.7, -1)


class SyntheticRows:
    """The interface ``accept_tree`` reads (``choice`` / ``probs`` per verified row), over ``target_probs``."""

    def __init__(self, tree: DraftTree, generator: torch.Generator):
        self.tree, self.generator, self._choice = tree, generator, {}

    def prefix(self, row: int) -> tuple[int, ...]:
        return tuple(self.tree.tokens[self.tree.path_to(row - 1)].tolist())

    def probs(self, row: int) -> torch.Tensor:
        return target_probs(self.prefix(row))

    def choice(self, row: int) -> int:
        if row not in self._choice:
            self._choice[row] = int(torch.multinomial(self.probs(row), 1, generator=self.generator))
        return self._choice[row]


def first_two_tokens(tree: DraftTree, samples: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V * V)
    for _ in range(samples):
        rows = SyntheticRows(tree, g)
        path, next_token = accept_tree(rows, tree, None, [])
        emitted = tree.tokens[path].tolist() + [next_token]
        while len(emitted) < 2:  # the next step, sampled plainly from the target
            emitted.append(int(torch.multinomial(target_probs(tuple(emitted)), 1, generator=g)))
        counts[emitted[0] * V + emitted[1]] += 1
    return counts


def joint() -> torch.Tensor:
    first = target_probs(())
    return torch.cat([first[a] * target_probs((a,)) for a in range(V)])


# two root children carry token 0
DUPLICATES_TREE = DraftTree(torch.tensor([0, 1, 0, 2, 3]), torch.tensor([-1, 0, -1, 2, 2]))
ADVERSARIAL = {
    "duplicates": DUPLICATES_TREE,
    "duplicate subtrees": DraftTree(torch.tensor([1, 1, 1, 2, 2, 2, 4]), torch.tensor([-1, -1, -1, 0, 1, 2, 5])),
    "wide": DraftTree(torch.arange(V), torch.full((V,), -1)),
    "deep and wide": DraftTree(
        torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1]), torch.tensor([-1, -1, -1, -1, -1, 0, 0, 0, 1, 1, 5, 8])
    ),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_tree_walk_is_lossless_under_sampling(name):
    tree = ADVERSARIAL[name].merge_duplicates()
    assert chi_square_p(first_two_tokens(tree, 5000), joint()) > P_VALUE


def test_duplicate_siblings_bias_the_walk_unless_merged():
    """The walk over the raw tree that first showed the bias (tokens [0,1,0,2,3], parents [-1,0,-1,2,2]) is biased: what
    ``merge_duplicates`` (called by the loop on every proposal) prevents."""
    assert chi_square_p(first_two_tokens(DUPLICATES_TREE, 5000), joint()) < P_VALUE


def test_merge_duplicates_merges_subtrees_and_keeps_q():
    q = torch.eye(V)[[0, 1, 0, 2, 3]]
    merged = DraftTree(DUPLICATES_TREE.tokens, DUPLICATES_TREE.parents, q).merge_duplicates()
    assert merged.tokens.tolist() == [0, 1, 2, 3] and merged.parents.tolist() == [-1, 0, 0, 0]
    assert torch.equal(merged.draft_probs, torch.eye(V)[[0, 1, 2, 3]])
    nested = DraftTree(torch.tensor([0, 1, 0, 1, 3]), torch.tensor([-1, 0, -1, 2, 3])).merge_duplicates()
    assert nested.tokens.tolist() == [0, 1, 3] and nested.parents.tolist() == [-1, 0, 1]
    chain = DraftTree.chain(torch.tensor([2, 2, 2]))
    assert chain.merge_duplicates() is chain  # a chain's repeated tokens are not siblings


class FixedTreeDrafter(TreeCandidateGenerator):
    def __init__(self, tree: DraftTree):
        super().__init__()
        self.tree = tree

    def propose(self, input_ids, target_cache=None):
        return self.tree


@pytest.mark.slow  # 18 s; CAPE under sampling stays in the default suite
def test_loop_verifies_merged_trees_and_samples_from_the_target_with_eos_inside():
    """The real loop on a tiny target: duplicates and the eos token inside the tree; the first two of three sampled
    tokens (eos ends the text: a second token only follows a non-eos first one) follow the target."""
    target = tiny_model(vocab_size=V, seed=0)
    eos = 2
    x = torch.tensor([[1, 3, 4]])
    expected = first_two_joint(target, x)
    eos_first = expected[eos].sum()
    expected[eos] = 0
    expected = torch.cat([expected.flatten(), eos_first[None]])  # last cell: eos first, text ends
    tree = DraftTree(torch.tensor([0, 2, 0, 2, 3, 1]), torch.tensor([-1, -1, -1, 0, 2, 1]))
    counts = torch.zeros(V * V + 1)
    torch.manual_seed(0)
    sizes = set()
    for _ in range(800):
        out = speculative_generate(
            target,
            x,
            candidate_generator=FixedTreeDrafter(tree),
            max_new_tokens=3,
            do_sample=True,
            top_k=0,
            eos_token_id=eos,
            pad_token_id=eos,
            return_dict_in_generate=True,
        )
        new = out.sequences[0, 3:].tolist()
        counts[V * V if new[0] == eos else new[0] * V + new[1]] += 1
        sizes.add(out.speculative_stats.steps[0].tree_size)
    assert sizes == {5}  # one duplicate root child merged away (its child kept under the first copy)
    assert chi_square_p(counts, expected) > P_VALUE


def draft_q(prefix: tuple[int, ...]) -> torch.Tensor:
    """A draft distribution per prefix, close to but not equal to ``target_probs``."""
    g = torch.Generator().manual_seed(sum(t * 5**i for i, t in enumerate(prefix)) + 99)
    return torch.softmax(torch.log(target_probs(prefix)) + 0.8 * torch.randn(V, generator=g), -1)


def cape_like_tree(g: torch.Generator) -> DraftTree:
    """A chain of two tokens drawn from q, plus picked expansion leaves (top of q other than the chain token)."""
    q0 = draft_q(())
    x0 = int(torch.multinomial(q0, 1, generator=g))
    q1 = draft_q((x0,))
    x1 = int(torch.multinomial(q1, 1, generator=g))
    leaves0 = [t for t in q0.argsort(descending=True).tolist() if t != x0][:2]
    leaves1 = [t for t in q1.argsort(descending=True).tolist() if t != x1][:1]
    tokens = [x0, x1, *leaves0, *leaves1]
    parents = [-1, 0, -1, -1, 0]
    probs = torch.stack([q0, q1, q0, q0, q1])
    return DraftTree(
        torch.tensor(tokens), torch.tensor(parents), probs, torch.tensor([True, True, False, False, False])
    )


def test_tree_rejection_sampling_is_lossless_and_accepts_more_than_token_matching():
    from hf_specdraft.core.acceptance import tree_rejection_sampling

    g = torch.Generator().manual_seed(3)
    counts, accepted, matched = torch.zeros(V * V), 0, 0
    samples = 5000
    for _ in range(samples):
        tree = cape_like_tree(g)
        rows = SyntheticRows(tree, g)
        path, next_token = tree_rejection_sampling(rows.probs, tree, generator=g)
        emitted = tree.tokens[path].tolist() + [next_token]
        while len(emitted) < 2:
            emitted.append(int(torch.multinomial(target_probs(tuple(emitted)), 1, generator=g)))
        counts[emitted[0] * V + emitted[1]] += 1
        accepted += len(path)
        matched += len(accept_tree(SyntheticRows(tree, g), tree, None, [])[0])
    assert chi_square_p(counts, joint()) > P_VALUE
    assert accepted > 1.05 * matched  # q is close to p: min(p, q) beats p·q


def test_rejection_without_the_residual_is_caught():
    """The lossless test above can fail: accepting drawn children with min(1, p/q) but sampling the rest from p
    itself (no residual max(0, p - q)) over-weights the drafted tokens."""
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(V * V)
    for _ in range(5000):
        tree = cape_like_tree(g)
        rows, emitted, row = SyntheticRows(tree, g), [], 0
        while True:
            p = rows.probs(row)
            child = next(
                (c for c in range(len(tree)) if int(tree.parents[c]) == row - 1 and bool(tree.sampled[c])), None
            )
            x = None if child is None else int(tree.tokens[child])
            if child is not None and float(torch.rand((), generator=g)) * float(tree.draft_probs[child, x]) <= float(
                p[x]
            ):
                emitted.append(x)
                row = child + 1
                continue
            emitted.append(int(torch.multinomial(p, 1, generator=g)))
            break
        while len(emitted) < 2:
            emitted.append(int(torch.multinomial(target_probs(tuple(emitted)), 1, generator=g)))
        counts[emitted[0] * V + emitted[1]] += 1
    assert chi_square_p(counts, joint()) < P_VALUE


def test_cape_under_sampling_uses_rejection_sampling_and_samples_from_the_target(monkeypatch):
    import hf_specdraft.core.emission as generation
    from hf_specdraft import CapeCandidateGenerator, DraftModelCandidateGenerator

    calls = []
    real = generation.tree_rejection_sampling
    monkeypatch.setattr(generation, "tree_rejection_sampling", lambda *a, **k: calls.append(1) or real(*a, **k))
    vocab = 8
    target, draft = tiny_model(vocab_size=vocab, seed=0), tiny_model(vocab_size=vocab, seed=7, num_hidden_layers=1)
    x = torch.tensor([[1, 2, 3]])
    joint = first_two_joint(target, x).flatten()
    counts = torch.zeros(vocab * vocab)
    torch.manual_seed(0)
    drafter = CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 2), budget=6)
    for _ in range(600):
        out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=2, do_sample=True, top_k=0)
        counts[out[0, 3] * vocab + out[0, 4]] += 1
    assert len(calls) >= 600
    assert chi_square_p(counts, joint) > P_VALUE


def test_bench_wrapper_without_flags_falls_back_to_token_matching(monkeypatch):
    """``bench.tree_sampling``'s comparison row: the same CAPE trees, verified by token matching."""
    import hf_specdraft.core.emission as generation
    from hf_specdraft import CapeCandidateGenerator, DraftModelCandidateGenerator
    from benchmarks.studies.tree_sampling import WithoutSampledFlags

    calls = []
    monkeypatch.setattr(generation, "tree_rejection_sampling", lambda *a, **k: calls.append(1))
    target, draft = tiny_model(vocab_size=V, seed=0), tiny_model(vocab_size=V, seed=7, num_hidden_layers=1)
    drafter = WithoutSampledFlags(CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 2), budget=4))
    out = speculative_generate(
        target, torch.tensor([[1, 2]]), candidate_generator=drafter, max_new_tokens=6, do_sample=True
    )
    assert out.shape == (1, 8) and not calls
