"""CASD (context-aware speculative decoding): retrieval from the context pool, strict = lossless, conditional
verification, errors."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
import torch

from hf_specdraft import ConditionalAcceptance, DraftTree, speculative_generate
from hf_specdraft.casd import (
    CasdCandidateGenerator,
    CasdConfig,
    DraftPool,
    build_casd_for_bench,
    build_casd_inputs,
    build_suffix_array,
    casd_generate,
    llmlingua2_compressor,
    merge_continuations,
    retrieve,
)
from hf_specdraft.core.acceptance import accept_tree
from conftest import VOCAB, greedy_reference, tiny_model


def random_ids(length, seed, vocab=VOCAB):
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- retrieval, by hand


def test_longest_suffix_wins():
    pool = DraftPool([1, 2, 3, 4, 50, 9, 9, 2, 3, 4, 60, 7, 3, 4, 70])
    tree, length = retrieve(pool, [0, 1, 2, 3, 4], CasdConfig(max_draft_length=1))
    assert length == 4 and tree.tokens.tolist() == [50]  # "1 2 3 4" beats the more frequent "3 4"
    tree, length = retrieve(pool, [0, 1, 2, 3, 4], CasdConfig(max_draft_length=1, max_suffix_length=2))
    assert length == 2 and sorted(tree.tokens.tolist()) == [50, 60, 70] and tree.parents.tolist() == [-1, -1, -1]
    tree, length = retrieve(pool, [99, 3, 4], CasdConfig(max_draft_length=1))
    assert length == 2  # "99 3 4" is not in the pool; "3 4" is
    assert retrieve(pool, [99, 4], CasdConfig())[1] == 0  # min_suffix_length 2: no 1-token match
    assert retrieve(pool, [99, 4], CasdConfig(min_suffix_length=1, max_draft_length=1))[0].tokens.tolist() == [
        50,
        60,
        70,
    ]
    assert len(retrieve(pool, [4], CasdConfig())[0]) == 0  # sequence shorter than min_suffix_length


def test_fill_from_shorter_suffixes():
    pool = DraftPool([1, 2, 3, 4, 50, 9, 3, 4, 60, 9, 3, 4, 60, 9, 4, 70])
    first_hit = CasdConfig(max_draft_length=1, min_suffix_length=1)
    assert retrieve(pool, [1, 2, 3, 4], first_hit)[0].tokens.tolist() == [50]  # the paper's rule: longest match only
    filled = CasdConfig(max_draft_length=1, min_suffix_length=1, fill_from_shorter_suffixes=True)
    tree, length = retrieve(pool, [1, 2, 3, 4], filled)
    assert length == 4 and tree.tokens.tolist() == [50, 60, 70] and tree.parents.tolist() == [-1, -1, -1]
    capped = CasdConfig(max_draft_length=1, min_suffix_length=1, fill_from_shorter_suffixes=True, max_nodes=2)
    assert retrieve(pool, [1, 2, 3, 4], capped)[0].tokens.tolist() == [50, 60]
    deep = retrieve(
        pool, [1, 2, 3, 4], CasdConfig(max_draft_length=2, min_suffix_length=1, fill_from_shorter_suffixes=True)
    )[0]
    paths = [deep.tokens[deep.path_to(i)].tolist() for i in range(len(deep))]
    assert paths == [[50], [50, 9], [60], [60, 9], [70]]  # the longest match's tree first, then the fill


def test_occurrence_at_pool_end_has_no_continuation():
    pool = DraftPool([5, 6, 7, 5, 6])
    length, positions = pool.match([5, 6])
    assert length == 2 and positions.tolist() == [0]
    assert DraftPool([1, 2, 3]).match([2, 3])[0] == 0


def frequency_pool():
    # after "8 9": "10 11" three times, "10 12" twice, "13 0" once
    return DraftPool([8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 12, 8, 9, 10, 12, 8, 9, 13, 0])


def test_tree_orders_continuations_by_frequency():
    tree, length = retrieve(frequency_pool(), [99, 8, 9], CasdConfig(max_draft_length=2))
    assert length == 2
    assert tree.tokens.tolist() == [10, 13, 11, 12, 0]  # by depth, then frequency 5, 1 | 3, 2, 1
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1]
    assert tree.main_chain().tokens.tolist() == [10, 11]  # the most frequent continuation


def test_node_cap_keeps_the_most_frequent_nodes():
    pool = frequency_pool()
    tree, _ = retrieve(pool, [99, 8, 9], CasdConfig(max_draft_length=2, max_nodes=3))
    assert tree.tokens.tolist() == [10, 11, 12] and tree.parents.tolist() == [-1, 0, 0]
    assert retrieve(pool, [99, 8, 9], CasdConfig(max_draft_length=2, max_nodes=1))[0].tokens.tolist() == [10]
    big = DraftPool(random_ids(5000, 0, vocab=4))  # many occurrences, many distinct continuations
    for seed in range(5):
        tree, length = retrieve(big, random_ids(16, seed + 1, vocab=4), CasdConfig())
        assert length >= 2 and 1 <= len(tree) <= 64 and int(tree.depth.max()) < 10


def test_ids_beyond_uint16():
    big = [300_000, 65_537, 299_999, 300_000, 65_537, 131_072, 70_000]
    tree, length = retrieve(DraftPool(big), torch.tensor([1, 300_000, 65_537]), CasdConfig(max_draft_length=2))
    assert length == 2 and tree.tokens.tolist() == [131_072, 299_999, 70_000, 300_000]
    wrapped = DraftPool([5, 6, 7])  # an id beyond the pool's largest must not wrap around onto a pool id
    assert wrapped.match([2**32 + 5, 6])[0] == 0 and wrapped.match([5, 6])[0] == 2
    huge = [2**33, 2**33 + 1, 7, 2**33, 2**33 + 1, 8]  # beyond uint32 too
    assert sorted(retrieve(DraftPool(huge), [2**33, 2**33 + 1], CasdConfig(max_draft_length=1))[0].tokens.tolist()) == [
        7,
        8,
    ]


def reference_tree(rows, max_nodes):
    """A dict trie, ranked by (frequency desc, depth, path), ordered by (depth, frequency desc, path); paths compare
    lexicographically."""
    count = {}
    for row in rows.tolist():
        for d in range(len(row)):
            if row[d] < 0:
                break
            count[tuple(row[: d + 1])] = count.get(tuple(row[: d + 1]), 0) + 1
    nodes = sorted(
        sorted(count, key=lambda p: (-count[p], len(p), p))[:max_nodes], key=lambda p: (len(p), -count[p], p)
    )
    where = {p: i for i, p in enumerate(nodes)}
    return [p[-1] for p in nodes], [where[p[:-1]] if len(p) > 1 else -1 for p in nodes]


def test_merge_continuations_matches_a_dict_trie():
    for rows, max_nodes in [
        ([[5, -1], [6, 7]], 1),
        ([[5, -1], [5, -1]], 4),
        ([[5, 6], [5, 6], [5, 6]], 2),
        ([[5, 6, 7]], 64),
    ]:
        tree = merge_continuations(np.array(rows), max_nodes)
        assert (tree.tokens.tolist(), tree.parents.tolist()) == reference_tree(np.array(rows), max_nodes)
    rng = np.random.default_rng(0)
    for _ in range(300):
        k, m, vocab = int(rng.integers(1, 50)), int(rng.integers(1, 6)), int(rng.integers(1, 5))
        rows = rng.integers(0, vocab, size=(k, m))
        for r in range(k):  # some continuations end early (end of the pool)
            if rng.random() < 0.3:
                rows[r, int(rng.integers(1, m + 1)) :] = -1
        max_nodes = int(rng.integers(1, 20))
        tree = merge_continuations(rows, max_nodes)
        assert (tree.tokens.tolist(), tree.parents.tolist()) == reference_tree(rows, max_nodes)


def test_suffix_array_matches_sorting():
    rng = np.random.default_rng(1)
    for _ in range(100):
        tokens = rng.integers(0, int(rng.integers(1, 5)), size=int(rng.integers(1, 60))) * 70_001
        depth = int(rng.integers(1, 20))
        sorted_depth = 2 ** math.ceil(math.log2(depth))
        expected = sorted(range(tokens.size), key=lambda i: (tokens[i : i + sorted_depth].tolist(), i))
        assert build_suffix_array(tokens, depth).tolist() == expected


# ---------------------------------------------------------------- strict mode: lossless


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_strict_equals_target_greedy(arch):
    target = tiny_model(arch)
    x = random_ids(12, 1)[None]
    ref = greedy_reference(target, x, 32)
    wrong = [ref[0].clone(), ref[0].clone()]
    wrong[0][x.shape[1] + 8] = (wrong[0][x.shape[1] + 8] + 1) % VOCAB  # copies that branch off the answer
    wrong[1][x.shape[1] + 20] = (wrong[1][x.shape[1] + 20] + 1) % VOCAB
    contexts = {
        "holds the answer": torch.cat(
            [random_ids(40, 2), wrong[0], random_ids(20, 3), ref[0], random_ids(20, 4), wrong[1]]
        ),
        "random": random_ids(300, 5),
    }
    for name, context in contexts.items():
        generator = CasdCandidateGenerator(context, max_nodes=64)  # the paper's fixed tree size: real trees every step
        out = speculative_generate(
            target, x, candidate_generator=generator, max_new_tokens=32, return_dict_in_generate=True
        )
        # max_nodes="auto", the default: depth and budget per step
        auto = speculative_generate(
            target,
            x,
            candidate_generator=CasdCandidateGenerator(context),
            max_new_tokens=32,
            return_dict_in_generate=True,
        )
        assert torch.equal(auto.sequences, ref) and auto.speculative_stats.extra["draft_lengths"], name
        assert torch.equal(out.sequences, ref), name
        with_output = CasdCandidateGenerator(context, draft_from_output=True)
        assert torch.equal(speculative_generate(target, x, candidate_generator=with_output, max_new_tokens=32), ref), (
            name
        )
        if name == "holds the answer":
            assert out.speculative_stats.mean_accepted_length > 2.0
            assert any(s.tree_size > s.drafted for s in out.speculative_stats.steps)  # real trees were verified
    generator, acceptance = build_casd_for_bench(target, contexts["holds the answer"], strict=True)
    out = target.generate(
        x, custom_generate=speculative_generate, candidate_generator=generator, acceptance=acceptance, max_new_tokens=32
    )
    assert acceptance is None and torch.equal(out, ref)


def test_casd_generate_strict_with_ids():
    target = tiny_model("llama")
    question, context = random_ids(6, 5), random_ids(60, 6)
    prompt_ids = torch.cat([context, question])[None]  # without a tokenizer the prompt is context + question
    ref = greedy_reference(target, prompt_ids, 20)
    out = casd_generate(target, None, question, context=context, strict=True, max_new_tokens=20)
    assert out.prompt_length == 66 and torch.equal(out.sequences, ref) and out.text is None
    assert len(out.match_lengths) == out.speculative_stats.num_steps


def test_sampling_runs_with_both_rules():
    target = tiny_model("qwen2")
    x = random_ids(8, 9)[None]
    context = torch.cat([x[0], random_ids(40, 10), x[0]])
    for acceptance in (None, ConditionalAcceptance(0.05, top_k=5)):
        torch.manual_seed(0)
        out = speculative_generate(
            target,
            x,
            candidate_generator=CasdCandidateGenerator(context, fill_from_shorter_suffixes=True),
            acceptance=acceptance,
            do_sample=True,
            temperature=0.8,
            max_new_tokens=16,
        )
        assert out.shape == (1, 24) and torch.equal(out[:, :8], x)


# ---------------------------------------------------------------- conditional verification (eq. 3 / 4)


class StubRows:
    """Target rows with hand-set probabilities: row 0 follows the last token, row 1+i follows node i."""

    def __init__(self, probs):
        self.p = torch.tensor(probs, dtype=torch.float32)

    def probs(self, row):
        return self.p[row]

    def choice(self, row):
        return int(self.p[row].argmax())


def row(p_token, token=1, p_eos=0.0, vocab=6, eos=5):
    """A distribution in which token 0 is the argmax, ``token`` has ``p_token`` and eos has ``p_eos``."""
    p = torch.zeros(vocab)
    p[token], p[eos] = p_token, p_eos
    p[0] = 1.0 - p.sum()
    rest = [i for i in range(vocab) if i not in (0, token, eos)]
    p[rest] = 1e-4
    p[0] -= 1e-4 * len(rest)
    return p.tolist()


@pytest.mark.parametrize(
    "p_token, p_eos, accepted",
    [
        (0.1001, 0.0, True),
        (0.0999, 0.0, False),  # around δ = 0.1
        (0.2001, 0.2, True),
        (0.1999, 0.2, False),  # around p(eos) = 0.2 > δ
    ],
)
def test_threshold_and_eos_rule(p_token, p_eos, accepted):
    tree = DraftTree(torch.tensor([1]), torch.tensor([-1]))
    rows = StubRows([row(p_token, p_eos=p_eos), row(0.5)])
    path, next_token = accept_tree(rows, tree, ConditionalAcceptance(threshold=0.1), eos_token_ids=[5])
    assert path == ([0] if accepted else [])
    assert accept_tree(rows, tree, None, eos_token_ids=[5])[0] == []  # strict: 1 is never the argmax


def test_descendants_of_a_rejected_node_are_rejected():
    #  root -> 0 (token 1, p 0.05: rejected) -> 2 (token 0 = the argmax there, p ~0.9) -> 4 (p 0.5)
    #       -> 1 (token 2, p 0.3: accepted)  -> 3 (token 3, p 0.05: rejected)
    tree = DraftTree(torch.tensor([1, 2, 0, 3, 1]), torch.tensor([-1, -1, 0, 1, 2]))
    rows = StubRows(
        [
            [0.6, 0.05, 0.3, 0.05, 0.0, 0.0],  # row 0: after the last token
            row(0.05),  # row 1: after node 0
            row(0.05, token=3),  # row 2: after node 1
            row(0.5),  # row 3: after node 2
            row(0.5),  # row 4: after node 3
            row(0.5),  # row 5: after node 4
        ]
    )
    path, next_token = accept_tree(rows, tree, ConditionalAcceptance(threshold=0.1), eos_token_ids=[])
    assert path == [1] and next_token == 0  # node 2 matches the argmax and node 4 passes δ, but node 0 was rejected


def test_mixed_rule_requires_top_k():
    tree = DraftTree(torch.tensor([2]), torch.tensor([-1]))
    rows = StubRows([[0.4, 0.35, 0.2, 0.05, 0.0, 0.0], row(0.5)])
    assert accept_tree(rows, tree, ConditionalAcceptance(0.1), [])[0] == [0]
    assert accept_tree(rows, tree, ConditionalAcceptance(0.1, top_k=3), [])[0] == [0]
    assert accept_tree(rows, tree, ConditionalAcceptance(0.1, top_k=2), [])[0] == []  # third most probable


def conditional_first_token(target, x, draft_token, threshold, eos=None):
    """The first generated token when CASD drafts ``draft_token`` right after the prompt."""
    # the pool continues the prompt's last 2 tokens with it
    context = torch.cat([x[0, -2:], torch.tensor([draft_token])])
    generator = CasdCandidateGenerator(context, min_suffix_length=2)
    out = speculative_generate(
        target,
        x,
        candidate_generator=generator,
        acceptance=ConditionalAcceptance(threshold),
        max_new_tokens=2,
        eos_token_id=eos,
    )
    assert generator.match_lengths[0] == 2
    return int(out[0, x.shape[1]])


def test_conditional_threshold_on_a_real_target():
    target = tiny_model("llama")
    x = random_ids(10, 7)[None]
    with torch.no_grad():
        p = torch.softmax(target(x).logits[0, -1].float(), dim=-1)
    order = p.argsort(descending=True).tolist()
    first, second, third = order[:3]
    assert float(p[second] - p[third]) > 1e-4 and x[0, -2] not in (second, x[0, -1])
    p2 = float(p[second])
    assert conditional_first_token(target, x, second, p2 - 1e-5) == second  # just above δ: accepted
    assert conditional_first_token(target, x, second, p2 + 1e-5) == first  # just below δ: rejected
    assert conditional_first_token(target, x, second, 1e-6, eos=third) == second  # above p(eos)
    assert conditional_first_token(target, x, third, 1e-6, eos=second) == first  # below p(eos)


# ---------------------------------------------------------------- text, prompt compression


@pytest.fixture(scope="module")
def tokenizer():
    from recipes.tokenizer import train_tokenizer

    texts = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.\n"] * 20
    return train_tokenizer(texts, vocab_size=300)


CONTEXT = "Lewis Hamilton holds the record for the most race wins in Formula One history, with 105 wins to date."


def test_compressor_changes_the_prompt_not_the_pool(tokenizer):
    def compressor(text):
        return " ".join(text.split()[::2])

    inputs = build_casd_inputs(tokenizer, "Who has won the most races?", CONTEXT, compressor=compressor)
    assert inputs.prompt_text == compressor(CONTEXT) + "\n\nWho has won the most races?"
    assert inputs.context_ids.tolist() == tokenizer(CONTEXT, add_special_tokens=False)["input_ids"]
    target = tiny_model("qwen2", vocab_size=len(tokenizer))
    out = casd_generate(
        target,
        tokenizer,
        "Who has won the most races?",
        context=CONTEXT,
        compressor=compressor,
        strict=True,
        max_new_tokens=12,
    )
    assert torch.equal(out.sequences, greedy_reference(target, inputs.prompt_ids, 12))
    assert out.text == tokenizer.decode(out.sequences[0, out.prompt_length :].tolist(), skip_special_tokens=True)


@pytest.mark.parametrize("bad", [None, b"bytes", ["a", "list"], 3])
def test_compressor_must_return_text(tokenizer, bad):
    with pytest.raises(ValueError, match="compressor must return text"):
        build_casd_inputs(tokenizer, "q", CONTEXT, compressor=lambda text: bad)


def test_compressor_errors(tokenizer):
    with pytest.raises(TypeError, match="compressor must be a callable"):
        build_casd_inputs(tokenizer, "q", CONTEXT, compressor="not callable")
    with pytest.raises(ValueError, match="compressor works on text"):
        build_casd_inputs(None, [1, 2], [3, 4], compressor=str.upper)
    with pytest.raises(ValueError, match="prompt_template"):
        build_casd_inputs(tokenizer, "q", CONTEXT, prompt_template="{context} {answer}")


def test_llmlingua2_adapter(monkeypatch):
    calls = {}

    class PromptCompressor:
        def __init__(self, **kwargs):
            calls["init"] = kwargs

        def compress_prompt(self, context, **kwargs):
            calls["compress"] = (context, kwargs)
            return {"compressed_prompt": "short"}

    monkeypatch.setitem(sys.modules, "llmlingua", types.SimpleNamespace(PromptCompressor=PromptCompressor))
    compress = llmlingua2_compressor(rate=0.2, force_tokens=["\n"])
    assert compress("a long context") == "short"
    assert calls["init"]["use_llmlingua2"] and calls["compress"] == (
        ["a long context"],
        {"rate": 0.2, "force_tokens": ["\n"]},
    )
    with pytest.raises(ValueError, match="rate"):
        llmlingua2_compressor(rate=1.5)
    monkeypatch.setitem(sys.modules, "llmlingua", None)
    with pytest.raises(ImportError, match="llmlingua"):
        llmlingua2_compressor()


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("context", [[], torch.zeros(0, dtype=torch.long), np.zeros((1, 0), dtype=np.int64)])
def test_empty_context(context):
    with pytest.raises(ValueError, match="context is empty"):
        CasdCandidateGenerator(context)


def test_context_errors(tokenizer):
    with pytest.raises(ValueError, match="context is empty"):
        CasdCandidateGenerator("   ", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="context is text"):
        CasdCandidateGenerator("some text")
    with pytest.raises(ValueError, match="context holds a negative token id"):
        CasdCandidateGenerator([3, -1, 4])
    with pytest.raises(ValueError, match="context must hold integer token ids"):
        CasdCandidateGenerator(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="integer token ids, got a tensor of dtype torch.bfloat16"):
        CasdCandidateGenerator(torch.tensor([1.0, 2.0], dtype=torch.bfloat16))  # numpy has no bfloat16
    with pytest.raises(ValueError, match="context must be one sequence"):
        CasdCandidateGenerator(torch.zeros(2, 3, dtype=torch.long))


def test_context_ids_outside_the_vocabulary():
    target = tiny_model("llama")
    x = random_ids(5, 8)[None]
    with pytest.raises(
        ValueError, match=rf"context holds token id {VOCAB}, outside the target's vocabulary \[0, {VOCAB}\)"
    ):
        speculative_generate(target, x, candidate_generator=CasdCandidateGenerator([1, 2, VOCAB]), max_new_tokens=4)
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        build_casd_for_bench(target, torch.tensor([1, 2, 300_000]))


@pytest.mark.parametrize("threshold", [0, 1, 1.5, -0.1])
def test_threshold_outside_unit_interval(threshold):
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="threshold"):
        casd_generate(target, None, [1, 2], context=[3, 4, 5], threshold=threshold, max_new_tokens=2)
    with pytest.raises(ValueError, match="threshold"):
        build_casd_for_bench(target, torch.tensor([3, 4]), threshold=threshold, strict=True)


def test_draft_from_output_retrieves_from_the_generated_tokens():
    target = tiny_model("llama")
    context, prompt = random_ids(50, 6), torch.tensor([[3, 4, 5]])
    generated = torch.tensor([[7, 8, 9, 11, 7, 8]])  # "7 8" occurs earlier in the output, followed by 9 11 7 8
    trees = {}
    for flag in (False, True):
        generator = CasdCandidateGenerator(context, draft_from_output=flag, max_draft_length=3)
        generator.prepare(target, target.generation_config)
        generator.propose(prompt)  # the first step marks where the output starts
        trees[flag] = generator.propose(torch.cat([prompt, generated], dim=1))
    pool_hit = CasdCandidateGenerator(context).pool.match([7, 8])[0]
    assert pool_hit == 0 and len(trees[False]) == 0  # the context alone has nothing to offer
    assert trees[True].main_chain().tokens.tolist() == [9, 11, 7]
    generator.propose(torch.tensor([[5, 5]]))  # another request without prepare() (stock assisted loops): a new prompt
    assert generator.prompt_length == 2


@pytest.mark.parametrize(
    "options, match",
    [
        ({"max_nodes": 0}, "max_nodes"),
        ({"max_nodes": -3}, "max_nodes"),
        ({"max_nodes": 2.5}, "max_nodes"),
        ({"max_nodes": True}, "max_nodes"),
        ({"max_nodes": "64"}, "max_nodes"),
        ({"min_suffix_length": 5, "max_suffix_length": 4}, "min_suffix_length"),
        ({"max_draft_length": 0}, "max_draft_length"),
        ({"fill_from_shorter_suffixes": 1}, "fill_from_shorter_suffixes"),
        ({"draft_from_output": "yes"}, "draft_from_output"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        CasdCandidateGenerator([1, 2, 3], **options)


def test_config_and_keywords_are_exclusive():
    with pytest.raises(ValueError, match="either config"):
        CasdCandidateGenerator([1, 2, 3], config=CasdConfig(), max_nodes=8)


def test_bench_factory_modes():
    target = tiny_model("llama")
    context = torch.tensor([[1, 2, 3, 4]])
    generator, acceptance = build_casd_for_bench(target, context, threshold=0.1, top_k=5, max_nodes=16)
    assert isinstance(generator, CasdCandidateGenerator) and generator.config.max_nodes == 16
    assert acceptance == ConditionalAcceptance(threshold=0.1, top_k=5)
    assert build_casd_for_bench(target, context, strict=True)[1] is None
    ids, logits = generator.get_candidates(torch.tensor([[9, 1, 2]]))  # chain-only loops get the main chain
    assert ids.tolist() == [[9, 1, 2, 3, 4]] and logits is None
