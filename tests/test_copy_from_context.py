"""Copying from the context through the ordinary call: ``speculative_generate(target, ids, draft_model=glide,
copy_from_context=..., max_copy_tokens=...)``, the same keys on a ``GenerationConfig``, a fixed γ honoured exactly, and
bad values refused by name."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from conftest import VOCAB, greedy_reference, tiny_model
from hf_specdraft import speculative_generate
from hf_specdraft.core.drafting import DraftRequest
from hf_specdraft.glide import GlideCandidateGenerator, GlideConfig, GlideDraftingConfig, GlideForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")
NEW_TOKENS = 30


@pytest.fixture(scope="module")
def setup():
    target = tiny_model("llama")
    torch.manual_seed(1)
    glide = GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).eval()
    phrase = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(8))
    ids = torch.cat([phrase, phrase, phrase[:, :3]], dim=1)  # the target's text is likely to go on copying
    return target, glide, ids, greedy_reference(target, ids, NEW_TOKENS)


def steps_of(out, reference):
    assert torch.equal(out.sequences, reference)
    return out.speculative_stats.steps


def test_draft_model_copies_by_default_and_copy_from_context_false_turns_it_off(setup):
    target, glide, ids, reference = setup
    on = steps_of(
        speculative_generate(target, ids, draft_model=glide, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True),
        reference,
    )
    assert any(s.copied for s in on)
    for off in (False, 0):
        out = speculative_generate(
            target,
            ids,
            draft_model=glide,
            copy_from_context=off,
            max_new_tokens=NEW_TOKENS,
            return_dict_in_generate=True,
        )
        assert not any(s.copied for s in steps_of(out, reference))
        assert "copied_steps" not in out.speculative_stats.summary()
    out = target.generate(
        ids,
        custom_generate=speculative_generate,
        draft_model=glide,
        copy_from_context=False,
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    assert not any(s.copied for s in steps_of(out, reference))


def test_a_generation_config_carries_the_copy_rule(setup):
    target, glide, ids, reference = setup
    config = GenerationConfig(copy_from_context=0, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True)
    out = speculative_generate(target, ids, draft_model=glide, generation_config=config)
    assert not any(s.copied for s in steps_of(out, reference))
    out = target.generate(ids, custom_generate=speculative_generate, draft_model=glide, generation_config=config)
    assert not any(s.copied for s in steps_of(out, reference))
    # a call's own argument wins over the config's
    config = GenerationConfig(
        copy_from_context=0, max_copy_tokens=2, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True
    )
    out = speculative_generate(
        target, ids, draft_model=glide, num_draft_tokens=1, copy_from_context=2, generation_config=config
    )
    copies = [s.tree_size for s in steps_of(out, reference) if s.copied]
    assert copies and max(copies) == 2  # the config's max_copy_tokens still holds


def test_a_fixed_gamma_is_honoured_exactly_and_a_copy_runs_as_far_as_max_copy_tokens(setup):
    target, glide, ids, reference = setup
    for gamma in (1, 3):
        steps = steps_of(
            speculative_generate(
                target,
                ids,
                draft_model=glide,
                num_draft_tokens=gamma,
                max_new_tokens=NEW_TOKENS,
                return_dict_in_generate=True,
            ),
            reference,
        )
        assert any(s.copied for s in steps) and max(s.tree_size for s in steps) <= gamma
    steps = steps_of(
        speculative_generate(
            target,
            ids,
            draft_model=glide,
            num_draft_tokens=3,
            max_copy_tokens=8,
            max_new_tokens=NEW_TOKENS,
            return_dict_in_generate=True,
        ),
        reference,
    )
    assert max(s.tree_size for s in steps if s.copied) == 8 and max(s.tree_size for s in steps if not s.copied) <= 3
    drafter = GlideCandidateGenerator(glide, num_draft_tokens=2)
    assert len(drafter.copy_from_text(DraftRequest(ids))) == 2  # no loop: the drafter alone honours γ too
    capped = GlideCandidateGenerator(glide, num_draft_tokens=2, max_copy_tokens=5)
    assert len(capped.copy_from_text(DraftRequest(ids))) == 5


def test_bad_copy_values_are_refused_by_name(setup):
    target, glide, ids, _ = setup
    for bad in (-1, "2", 1.5):
        with pytest.raises(ValueError, match="copy_from_context must be"):
            speculative_generate(target, ids, draft_model=glide, copy_from_context=bad, max_new_tokens=4)
        with pytest.raises(ValueError, match="copy_from_context must be"):
            GlideDraftingConfig(copy_from_context=bad)
    for bad in (0, -3, True, 2.0):
        with pytest.raises(ValueError, match="max_copy_tokens must be"):
            speculative_generate(target, ids, draft_model=glide, max_copy_tokens=bad, max_new_tokens=4)
    with pytest.raises(ValueError, match="copy_from_context must be"):
        speculative_generate(
            target, ids, draft_model=glide, generation_config=GenerationConfig(copy_from_context=-2, max_new_tokens=4)
        )
    with pytest.raises(ValueError, match="with candidate_generator=, set them on the drafter"):
        speculative_generate(
            target, ids, candidate_generator=GlideCandidateGenerator(glide), copy_from_context=False, max_new_tokens=4
        )
    plain = tiny_model("llama", seed=3, num_hidden_layers=1)
    with pytest.raises(ValueError, match=r"copy_from_context=2: a 'llama' draft model does not copy from the context"):
        speculative_generate(target, ids, draft_model=plain, copy_from_context=2, max_new_tokens=4)
    # nothing to turn off
    out = speculative_generate(target, ids, draft_model=plain, copy_from_context=False, max_new_tokens=4)
    assert out.shape[1] == ids.shape[1] + 4
    assert GlideDraftingConfig(copy_from_context=False).copy_from_context == 0
    assert GlideDraftingConfig(copy_from_context=True).copy_from_context == GlideDraftingConfig().copy_from_context


BENCH_ROWS = (
    "glide",
    "glide+copy",
    "glide-γ3",
    "glide+copy-γ3",
    "glide-auto",
    "glide+copy-auto",
    "vanilla",
    "vanilla+copy",
    "draft-model",
    "draft-model+copy",
    "draft-model-auto",
    "draft-model+copy-auto",
    "glide+cape",
    "glide+copy+cape",
    "glide+cape-auto",
    "glide+copy+cape-auto",
)


def test_a_bench_row_copies_from_the_context_exactly_when_its_name_says_so(setup):
    from types import SimpleNamespace

    from benchmarks.methods import METHODS  # the package's rows and the lab's fixed-γ ones
    from hf_specdraft.bench.methods import BenchContext

    target, glide, ids, reference = setup
    torch.manual_seed(2)
    vanilla = GlideForCausalLM(
        GlideConfig.from_target_config(target.config, hidden_size=32, cross_attention=False)
    ).eval()
    tokenizer = SimpleNamespace(eos_token_id=None, pad_token_id=0)
    ctx = BenchContext(target, vanilla, tokenizer, None, ids, NEW_TOKENS, extras={"glide": glide, "vanilla": vanilla})
    for name in BENCH_ROWS:
        sequences, stats = METHODS[name].run(ctx)
        assert torch.equal(sequences, reference), name
        copied = [s for s in stats.steps if s.copied]
        assert bool(copied) == ("+copy" in name), name
        if "-γ3" in name or name in ("glide", "vanilla", "draft-model"):
            assert all(s.tree_size <= (3 if "-γ3" in name else 1) for s in stats.steps if not s.copied), name
    for name, method in METHODS.items():  # every description says the same as the name
        if name.startswith(("glide", "vanilla", "draft-model")) and "copying" in method.description:
            assert ("+copy" in name) == ("no copying" not in method.description), name


def test_the_headline_names_an_older_runs_copying_rows_by_what_they_ran():
    from benchmarks.report.headline import describe, row_name

    old, new = {"task": "completion"}, {"task": "completion", "descriptions": {"glide-auto": "γ 'auto', no copying"}}
    assert [
        row_name(n, old) for n in ("glide-auto", "draft-model", "glide+cape-auto-static", "glide-γ3", "max-gram-auto")
    ] == ["glide+copy-auto", "draft-model+copy", "glide+copy+cape-auto-static", "glide+copy-γ3", "max-gram-auto"]
    assert row_name("glide-auto", new) == "glide-auto" and describe("glide-auto", new) == "γ 'auto', no copying"
    assert "copying" in describe("glide+copy-auto", old) and describe("retired-name", old) == ""


def test_a_one_token_match_is_copied_only_where_the_controller_weighs_the_copy(setup):
    _, glide, _, _ = setup
    one = torch.tensor([[5, 7, 9, 3, 7]])  # "7" occurred before, "3 7" did not: a one-token match
    two = torch.tensor([[5, 7, 9, 3, 5, 7]])  # "5 7" occurred before: a two-token match
    asked = []

    def rule(match, available):
        asked.append(match)
        return 2

    auto = GlideCandidateGenerator(glide)  # the default call's drafter: "auto", copying from one-token matches
    tree = auto.copy_from_text(DraftRequest(one, copy_rule=rule))
    assert asked == [1] and tree is not None and tree.tokens.tolist() == [9, 3]
    # declined: GLIDE drafts
    assert auto.copy_from_text(DraftRequest(one, copy_rule=lambda match, available: 0)) is None
    fixed = GlideCandidateGenerator(glide, num_draft_tokens=2)  # no controller weighs a copy: a match of 2 at least
    assert fixed.copy_from_text(DraftRequest(one)) is None
    assert fixed.copy_from_text(DraftRequest(two)).tokens.tolist() == [9, 3]
    asked.clear()
    assert GlideCandidateGenerator(glide, copy_from_context=2).copy_from_text(DraftRequest(one, copy_rule=rule)) is None
    assert asked == []
