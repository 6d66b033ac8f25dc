"""Batched speculative decoding: each row of a left-padded batch equals its own batch-1 greedy output."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import StoppingCriteria, TextStreamer
from transformers.generation import PromptLookupCandidateGenerator

from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft import DraftModelCandidateGenerator, GlideCandidateGenerator, speculative_generate
from hf_specdraft.cape import CapeCandidateGenerator
from hf_specdraft.casd import CasdCandidateGenerator
from test_method_grid import METHODS, glide_for

pytestmark = pytest.mark.usefixtures("one_thread")
NEW_TOKENS = 12
LENGTHS = (9, 3, 6, 1)  # prompts of different lengths, one of a single token


def padded_batch(lengths=LENGTHS, seed: int = 4, pad: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]
    width = max(lengths)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - row.numel() :], mask[i, width - row.numel() :] = row, 1
    return rows, ids, mask


def assert_rows_match(out: torch.Tensor, rows, references, pad: int = 0, width: int | None = None):
    width = width or max(r.numel() for r in rows)
    for i, (row, reference) in enumerate(zip(rows, references)):
        got = out[i, width - row.numel() :]
        expected = torch.cat([reference[0], torch.full((got.numel() - reference.shape[1],), pad, dtype=torch.long)])
        assert torch.equal(got, expected), (i, got.tolist(), expected.tolist())


@pytest.mark.parametrize("mode", ["right", "wrong", "tree"])
def test_oracle_rows(arch, mode):
    target = tiny_model(arch)
    rows, ids, mask = padded_batch()
    references = [greedy_reference(target, r[None], NEW_TOKENS) for r in rows]
    drafters = [OracleDrafter(ref, mode, k=3) for ref in references]
    out = speculative_generate(
        target,
        ids,
        attention_mask=mask,
        candidate_generator=drafters,
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    assert_rows_match(out.sequences, rows, references)
    assert len(out.row_stats) == len(rows) and all(s.new_tokens == NEW_TOKENS for s in out.row_stats)
    assert out.speculative_stats.new_tokens == NEW_TOKENS * len(rows)
    if mode == "wrong":
        assert all(s.accepted_tokens == 0 for s in out.row_stats)
    else:
        assert all(s.mean_accepted_length > 2 for s in out.row_stats)


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_forked_per_row(arch, method):
    target = tiny_model(arch)
    rows, ids, mask = padded_batch()
    references = [greedy_reference(target, r[None], NEW_TOKENS) for r in rows]
    build, self_draftable = METHODS[method]
    source = target if self_draftable else tiny_model(arch, seed=3, num_hidden_layers=1)
    drafter = build(target, source, rows[0][None])
    out = speculative_generate(
        target,
        ids,
        attention_mask=mask,
        candidate_generator=drafter,
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    assert_rows_match(out.sequences, rows, references)
    assert drafter.last_stats is out.speculative_stats and out.speculative_stats.extra["batch_size"] == len(rows)
    if self_draftable:  # the target drafting for itself: always right in every row
        assert all(s.mean_accepted_length > 2 for s in out.row_stats), [s.mean_accepted_length for s in out.row_stats]


@pytest.mark.parametrize("kind", ["draft-model", "glide", "glide+cape"])
def test_batched_drafting_drafts_what_each_row_drafts_alone(kind):
    """One draft forward for the batch proposes exactly what each row's own drafter proposes at batch 1."""
    target = tiny_model("llama")
    draft = tiny_model("llama", seed=3, num_hidden_layers=1) if kind == "draft-model" else glide_for(target)
    builders = {
        "draft-model": lambda: DraftModelCandidateGenerator(draft, 3),
        "glide": lambda: GlideCandidateGenerator(draft, num_draft_tokens=3),
        "glide+cape": lambda: CapeCandidateGenerator(GlideCandidateGenerator(draft, num_draft_tokens=3), budget=6),
    }
    build = builders[kind]
    assert build().batch_drafter([build(), build()]) is not None  # drafters of one model propose together
    # not other γs
    assert DraftModelCandidateGenerator(target, 3).batch_drafter([DraftModelCandidateGenerator(target, 2)]) is None
    rows, ids, mask = padded_batch(lengths=(7, 2, 5))
    batched = speculative_generate(
        target, ids, attention_mask=mask, candidate_generator=build(), max_new_tokens=16, return_dict_in_generate=True
    )
    for i, row in enumerate(rows):
        alone = speculative_generate(
            target, row[None], candidate_generator=build(), max_new_tokens=16, return_dict_in_generate=True
        )
        assert [(s.tree_size, s.accepted) for s in batched.row_stats[i].steps] == [
            (s.tree_size, s.accepted) for s in alone.speculative_stats.steps
        ], i
    assert_rows_match(batched.sequences, rows, [greedy_reference(target, r[None], 16) for r in rows])


@pytest.mark.parametrize("kind", ["glide", "glide+cape"])
def test_batched_glide_rows_copy_from_their_own_text(arch, kind):
    """GLIDE's ``copy_from_context`` in a batch: a row whose text's suffix occurred before drafts the copy, as it does
    at batch 1 (a copy of γ tokens at the first step, every row here: a fixed γ is honoured exactly), and each row stays
    its own greedy output."""
    target = tiny_model(arch)
    glide = glide_for(target)
    builders = {
        "glide": lambda: GlideCandidateGenerator(glide, num_draft_tokens=3),
        "glide+cape": lambda: CapeCandidateGenerator(GlideCandidateGenerator(glide, num_draft_tokens=3), budget=6),
    }
    g = torch.Generator().manual_seed(8)
    rows = [torch.cat([p, p, p[:3]]) for p in (torch.randint(1, VOCAB, (n,), generator=g) for n in (10, 7, 12))]
    width = max(r.numel() for r in rows)
    ids, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - row.numel() :], mask[i, width - row.numel() :] = row, 1
    batched = speculative_generate(
        target,
        ids,
        attention_mask=mask,
        candidate_generator=builders[kind](),
        max_new_tokens=16,
        return_dict_in_generate=True,
    )
    assert batched.speculative_stats.steps[0].copied and all(s.steps[0].tree_size == 3 for s in batched.row_stats)
    for i, row in enumerate(rows):
        alone = speculative_generate(
            target, row[None], candidate_generator=builders[kind](), max_new_tokens=16, return_dict_in_generate=True
        )
        assert [(s.tree_size, s.accepted) for s in batched.row_stats[i].steps] == [
            (s.tree_size, s.accepted) for s in alone.speculative_stats.steps
        ], i
    assert_rows_match(batched.sequences, rows, [greedy_reference(target, r[None], 16) for r in rows])


def test_a_batch_step_where_some_rows_copied_teaches_the_controller_only_the_drafting_rows(monkeypatch):
    """Under γ 'auto', a batch step where some rows copy from their text and others draft with GLIDE: the controller
    learns GLIDE's rates from the drafting rows alone (a copy's accepted tokens are not GLIDE's); the outputs stay each
    row's own greedy output, and no drafter keeps the call's host text after it."""
    from hf_specdraft.core.batch_drafting import BatchChainDrafter
    from hf_specdraft.core.controller import DraftLengthController

    target = tiny_model("llama")
    g = torch.Generator().manual_seed(9)
    phrase = torch.randint(1, VOCAB, (8,), generator=g)
    rows = [
        torch.cat([phrase, phrase, phrase[:3]]),
        torch.randint(1, VOCAB, (9,), generator=g),
        torch.randint(1, VOCAB, (5,), generator=g),
    ]
    width = max(r.numel() for r in rows)
    ids, mask = torch.zeros(len(rows), width, dtype=torch.long), torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - row.numel() :], mask[i, width - row.numel() :] = row, 1
    proposed, observed = [], []
    propose, observe = BatchChainDrafter.propose, DraftLengthController.observe
    monkeypatch.setattr(
        BatchChainDrafter, "propose", lambda self, *args: proposed.append(propose(self, *args)) or proposed[-1]
    )
    monkeypatch.setattr(
        DraftLengthController,
        "observe",
        lambda self, drafted, accepted, *args, **kwargs: (
            observed.append((drafted, list(accepted), kwargs)) or observe(self, drafted, accepted, *args, **kwargs)
        ),
    )
    glide = glide_for(target)
    drafters = [GlideCandidateGenerator(glide) for _ in rows]
    out = speculative_generate(
        target, ids, attention_mask=mask, candidate_generator=drafters, max_new_tokens=16, return_dict_in_generate=True
    )
    assert_rows_match(out.sequences, rows, [greedy_reference(target, r[None], 16) for r in rows])
    assert len(proposed) == len(observed)
    mixed = [(trees, seen) for trees, seen in zip(proposed, observed) if 0 < sum(t.copied for t in trees) < len(trees)]
    assert mixed  # the first step: row 0 copies, the others draft
    for trees, (drafted, accepted, _) in mixed:
        modelled = [t for t in trees if not t.copied]
        assert len(accepted) == len(modelled) and drafted == max(t.levels for t in modelled)
    assert not any(hasattr(d, "host_text") for d in drafters)  # the text on the host came in each step's request


def test_glide_rows_drafting_alone_read_their_own_target_columns():
    """Rows whose GLIDE drafters differ (γ 2 and 3) draft one by one, each on a view of its own columns of the batch's
    target cache: what each proposes equals what it proposes at batch 1."""
    target = tiny_model("qwen2")
    glide = glide_for(target)
    rows, ids, mask = padded_batch(lengths=(6, 2, 9))
    drafters = [GlideCandidateGenerator(glide, num_draft_tokens=2 + i % 2) for i in range(len(rows))]
    assert drafters[0].batch_drafter(drafters) is None
    out = speculative_generate(
        target, ids, attention_mask=mask, candidate_generator=drafters, max_new_tokens=16, return_dict_in_generate=True
    )
    for i, row in enumerate(rows):
        alone = speculative_generate(
            target,
            row[None],
            candidate_generator=GlideCandidateGenerator(glide, num_draft_tokens=2 + i % 2),
            max_new_tokens=16,
            return_dict_in_generate=True,
        )
        assert [s.accepted for s in out.row_stats[i].steps] == [s.accepted for s in alone.speculative_stats.steps], i
    assert_rows_match(out.sequences, rows, [greedy_reference(target, r[None], 16) for r in rows])


def test_rows_stop_early_on_eos_and_are_padded(arch):
    target = tiny_model(arch)
    rows, ids, mask = padded_batch()
    plain = greedy_reference(target, rows[0][None], NEW_TOKENS)
    eos = int(plain[0, rows[0].numel() + 3])  # row 0 emits it as its 4th new token
    references = [greedy_reference(target, r[None], NEW_TOKENS, eos_token_id=eos, pad_token_id=0) for r in rows]
    out = speculative_generate(
        target,
        ids,
        attention_mask=mask,
        draft_model=tiny_model(arch, seed=3, num_hidden_layers=1),
        num_draft_tokens=3,
        max_new_tokens=NEW_TOKENS,
        eos_token_id=eos,
        pad_token_id=0,
        return_dict_in_generate=True,
    )
    assert_rows_match(out.sequences, rows, references)
    assert out.row_stats[0].new_tokens == 4 < out.sequences.shape[1] - ids.shape[1]


def test_casd_one_context_per_row():
    target = tiny_model("qwen2")
    rows, ids, mask = padded_batch()
    references = [greedy_reference(target, r[None], NEW_TOKENS) for r in rows]
    drafters = [CasdCandidateGenerator(ref[0], min_suffix_length=1) for ref in references]  # each row's own context
    out = speculative_generate(
        target,
        ids,
        attention_mask=mask,
        candidate_generator=drafters,
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    assert_rows_match(out.sequences, rows, references)
    assert all(s.mean_accepted_length > 2 for s in out.row_stats)


def test_one_left_padded_prompt_and_generate_entry_point():
    target = tiny_model("mistral")
    rows, ids, mask = padded_batch(lengths=(3, 8))
    reference = greedy_reference(target, rows[0][None], NEW_TOKENS)
    draft = tiny_model("mistral", seed=3, num_hidden_layers=1)
    out = target.generate(
        ids[:1],
        attention_mask=mask[:1],
        custom_generate=speculative_generate,
        draft_model=draft,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
    )
    assert_rows_match(out, rows[:1], [reference], width=ids.shape[1])


def test_sampling_per_row_matches_the_target_distribution():
    """256 rows of one prompt sampled in one batch: the second token's frequencies follow the target's own p."""
    target = tiny_model("llama", vocab_size=8, seed=1)
    draft = tiny_model("llama", vocab_size=8, seed=2, num_hidden_layers=1)
    prompt = torch.tensor([[3, 1, 4, 1]])
    n = 2048
    torch.manual_seed(0)
    out = speculative_generate(
        target,
        prompt.expand(n, -1),
        draft_model=draft,
        num_draft_tokens=2,
        max_new_tokens=2,
        do_sample=True,
        pad_token_id=0,
    )
    with torch.no_grad():
        first = torch.softmax(target(prompt).logits[0, -1], -1)
        second = torch.softmax(target(torch.cat([prompt.expand(8, -1), torch.arange(8)[:, None]], 1)).logits[:, -1], -1)
    exact = first @ second  # p(x2) = sum_u p(u) p(x2 | u)
    empirical = torch.bincount(out[:, -1], minlength=8).float() / n
    assert float((empirical - exact).abs().sum() / 2) < 0.05, (empirical.tolist(), exact.tolist())


class _Never(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_clear_errors_for_batches():
    target = tiny_model("llama")
    draft = tiny_model("llama", seed=3, num_hidden_layers=1)
    rows, ids, mask = padded_batch()
    run = dict(draft_model=draft, max_new_tokens=4)
    right = mask.flip(-1)
    with pytest.raises(ValueError, match="left padding"):
        speculative_generate(target, ids, attention_mask=right, **run)
    with pytest.raises(ValueError, match="only 0"):
        speculative_generate(target, ids, attention_mask=mask * 2, **run)
    with pytest.raises(ValueError, match="num_return_sequences"):
        speculative_generate(target, ids, attention_mask=mask, num_return_sequences=2, do_sample=True, **run)
    with pytest.raises(ValueError, match="streamer"):
        speculative_generate(target, ids, attention_mask=mask, streamer=TextStreamer(None), **run)
    with pytest.raises(ValueError, match="output_scores"):
        speculative_generate(target, ids, attention_mask=mask, output_scores=True, return_dict_in_generate=True, **run)
    stock = PromptLookupCandidateGenerator(num_output_tokens=3)
    with pytest.raises(ValueError, match="one sequence"):
        speculative_generate(target, ids, attention_mask=mask, candidate_generator=stock, max_new_tokens=4)
    one = DraftModelCandidateGenerator(draft, 2)
    with pytest.raises(ValueError, match="one per row"):
        speculative_generate(target, ids, attention_mask=mask, candidate_generator=[one, one.fork()], max_new_tokens=4)
    with pytest.raises(ValueError, match="twice"):
        speculative_generate(target, ids, attention_mask=mask, candidate_generator=[one] * len(rows), max_new_tokens=4)
    with pytest.raises(ValueError, match="all padding"):
        empty = mask.clone()
        empty[1] = 0
        speculative_generate(target, ids, attention_mask=empty, **run)


@pytest.mark.parametrize("processor", ["repetition_penalty", "prefix_allowed_tokens_fn", "guidance_scale"])
def test_processors_that_keep_batch_state_see_their_own_row(processor):
    """generate builds its processors for the whole batch: each row gets its padding length (repetition penalty),
    its batch id (prefix constraint) and its own unconditional context (classifier-free guidance)."""
    target = tiny_model("llama")
    rows, ids, mask = padded_batch()
    option = {
        "repetition_penalty": 1.5,
        "prefix_allowed_tokens_fn": lambda batch_id, sent: list(range(10 * batch_id + 1, 10 * batch_id + 11)),
        "guidance_scale": 2.0,
    }[processor]
    run = dict(max_new_tokens=NEW_TOKENS, pad_token_id=0, **{processor: option})
    reference = target.generate(ids, attention_mask=mask, do_sample=False, **run)
    out = speculative_generate(
        target, ids, attention_mask=mask, draft_model=tiny_model("llama", seed=3, num_hidden_layers=1), **run
    )
    assert torch.equal(out, reference), (out[:, -NEW_TOKENS:].tolist(), reference[:, -NEW_TOKENS:].tolist())


class _CountingDrafter(DraftModelCandidateGenerator):
    """A subclass that proposes through its own propose: the batch must not draft around it."""

    calls = 0

    def propose(self, input_ids, target_cache=None):
        type(self).calls += 1
        return super().propose(input_ids, target_cache)


def test_a_subclass_overriding_propose_drafts_row_by_row_through_it():
    target = tiny_model("llama")
    draft = tiny_model("llama", seed=3, num_hidden_layers=1)
    assert _CountingDrafter(draft, 2).batch_drafter([_CountingDrafter(draft, 2)]) is None
    assert CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 2), budget=4).batch_drafter is not None
    rows, ids, mask = padded_batch()
    _CountingDrafter.calls = 0
    out = speculative_generate(
        target,
        ids,
        attention_mask=mask,
        candidate_generator=_CountingDrafter(draft, 2),
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    assert _CountingDrafter.calls == sum(s.num_steps for s in out.row_stats) > 0
    assert out.speculative_stats.extra["batch_forwards"]["draft"] is None  # rows drafted one by one
    assert_rows_match(out.sequences, rows, [greedy_reference(target, r[None], NEW_TOKENS) for r in rows])


def test_batch_forwards_counted_once_and_per_row():
    target = tiny_model("llama")
    draft = tiny_model("llama", seed=3, num_hidden_layers=1)
    rows, ids, mask = padded_batch()
    drafter = DraftModelCandidateGenerator(draft, 3)
    # draft inputs go to the draft's device
    assert drafter.batch_drafter([drafter.fork(), drafter.fork()]).device == draft.device
    out = speculative_generate(
        target,
        ids,
        attention_mask=mask,
        candidate_generator=drafter,
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    forwards = out.speculative_stats.extra["batch_forwards"]
    assert forwards["target"] == max(s.num_steps for s in out.row_stats)  # one forward a step for every active row
    assert forwards["draft"] == 3 * forwards["target"]
    assert (
        out.speculative_stats.drafter_calls["draft"]
        == sum(s.drafter_calls["draft"] for s in out.row_stats)
        > forwards["draft"]
    )


def test_batched_prefill_asks_for_no_logits(monkeypatch):
    target = tiny_model("llama")
    seen = []
    forward = target.forward

    @functools.wraps(forward)  # keeps forward's signature, which the loop reads
    def recording(*args, **kwargs):
        seen.append(kwargs.get("logits_to_keep"))
        return forward(*args, **kwargs)

    monkeypatch.setattr(target, "forward", recording)
    rows, ids, mask = padded_batch()
    speculative_generate(
        target, ids, attention_mask=mask, draft_model=tiny_model("llama", seed=3, num_hidden_layers=1), max_new_tokens=2
    )
    assert seen[0] == 1  # the prompt's forward: the cache, not (B, L, V) logits


def test_repack_skips_layers_that_hold_nothing():
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    from hf_specdraft.core.cache import repack_cache

    cache = DynamicCache()
    full, empty = DynamicLayer(), DynamicLayer()
    full.lazy_initialization(torch.zeros(2, 1, 4, 3), torch.zeros(2, 1, 4, 3))
    full.keys = torch.arange(2 * 4 * 3, dtype=torch.float).view(2, 1, 4, 3)
    full.values = full.keys.clone()
    cache.layers = [full, empty]
    repack_cache(cache, [torch.tensor([1, 3]), torch.tensor([2])], torch.tensor([0, 1]))
    assert torch.equal(full.keys[0, 0], torch.arange(24, dtype=torch.float).view(2, 4, 3)[0, [1, 3]])
    # left slot: a masked copy
    assert torch.equal(full.keys[1, 0], torch.arange(24, dtype=torch.float).view(2, 4, 3)[1, [2, 2]])
    assert empty.keys is None


@pytest.mark.parametrize(
    "case, message",
    [
        ("1-D mask", "attention_mask must be a tensor"),
        ("list mask", "attention_mask must be a tensor"),
        ("float ids", "integer token ids"),
        ("ids past the vocabulary", "outside the model's vocabulary"),
        ("negative ids", "outside the model's vocabulary"),
    ],
)
def test_clear_errors_for_bad_inputs(case, message):
    target = tiny_model("llama")
    rows, ids, mask = padded_batch()
    inputs = {
        "1-D mask": dict(input_ids=ids[:1], attention_mask=mask[0]),
        "list mask": dict(input_ids=ids, attention_mask=mask.tolist()),
        "float ids": dict(input_ids=ids.float()),
        "ids past the vocabulary": dict(input_ids=ids + VOCAB),
        "negative ids": dict(input_ids=ids - 5),
    }[case]
    with pytest.raises(ValueError, match=message):
        speculative_generate(
            target, draft_model=tiny_model("llama", seed=3, num_hidden_layers=1), max_new_tokens=2, **inputs
        )
