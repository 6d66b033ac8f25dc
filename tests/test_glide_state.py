"""A GLIDE that reads the target's state (GlideConfig.state_input, Gemma 4's assistant layout): what training's
unrolled passes compute is what the drafter computes in the loop, lossless on every path the hand-off serves, trained
from a store and resumed after a kill, with clear refusals where it cannot run."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GenerationConfig

from conftest import ARCHITECTURES, VOCAB, greedy_reference, tiny_model
from hf_specdraft.core.drafting import DraftRequest
from hf_specdraft.core.support import with_cache
from hf_specdraft import speculative_generate
from hf_specdraft.cape import CapeCandidateGenerator
from hf_specdraft.core.target_state import TargetOutputs, TargetState
from hf_specdraft.glide import (
    GlideCandidateGenerator,
    GlideConfig,
    GlideForCausalLM,
    GlideTrainingArguments,
    train_glide,
)
from hf_specdraft.glide.training.objective import TargetWindows
from benchmarks.studies.state_glide import conditional_agreement
from hf_specdraft.glide.training.unrolled import self_attention_mask, unrolled_passes

pytestmark = pytest.mark.usefixtures("one_thread")

LAYOUTS = {"self-attention": {"state_input": True}, "assistant": {"state_input": True, "self_attention": False}}


def make_state_glide(target, layout: str = "self-attention", seed: int = 1, **overrides) -> GlideForCausalLM:
    torch.manual_seed(seed)
    return GlideForCausalLM(
        GlideConfig.from_target_config(target.config, hidden_size=32, **LAYOUTS[layout], **overrides)
    ).eval()


def greedy_text(target, rows: int = 1, prompt_len: int = 6, new: int = 30, seed: int = 5) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (rows, prompt_len), generator=torch.Generator().manual_seed(seed))
    return greedy_reference(target, ids, new)


def trained_state_glide(target, layout: str, output_dir) -> GlideForCausalLM:
    """Trained for 40 steps on the target's greedy text: drafts get accepted and rejected."""
    glide = make_state_glide(target, layout)
    text = greedy_text(target, rows=16, prompt_len=4, new=40, seed=2)
    train_glide(
        target,
        glide,
        text,
        GlideTrainingArguments(
            output_dir=str(output_dir),
            max_steps=40,
            seq_len=24,
            per_device_batch_size=8,
            learning_rate=1e-2,
            warmup_steps=3,
            progress_bar=False,
            distillation_weight=1.0,
        ),
    )
    return glide.eval()


def state_at(target, text: torch.Tensor, t: int) -> tuple[DynamicCache, TargetState]:
    """The target's cache and last hidden states over ``text[:, :t]``, as the loop hands them when x_t is newest."""
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        out = target(text[:, :t], **with_cache(target, cache), use_cache=True, output_hidden_states=True)
    return cache, TargetState(
        TargetOutputs(hidden_states=(out.hidden_states[-1],)), False, 0, torch.arange(t + 1)[None]
    )


# --- what training computes is what the loop drafts -----------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unrolled_passes_give_the_drafts_of_every_step_in_the_loop(layout):
    """Pass k at position j is draft step k of the draft that starts at j - k + 1: same q, with the glimpse, the
    target's state at step 1 and the draft's own after, and (with self-attention) the cache the drafter keeps."""
    target = tiny_model("llama")
    glide = make_state_glide(target, layout)
    text = greedy_text(target)
    batch = TargetWindows(text[0], text.shape[1], stride=text.shape[1]).batch(
        target, glide, torch.tensor([0]), "cpu", True, True
    )
    with torch.no_grad():
        passes = [logits.clone() for _, logits, _ in unrolled_passes(glide, batch, 3)]
    drafter = GlideCandidateGenerator(glide, num_draft_tokens=3)
    drafter.prepare(target, GenerationConfig(do_sample=False))
    for t in (9, 15):  # the second call reuses the drafter's cache up to the first's position
        forced = iter(text[0, t + 1 : t + 4].tolist())
        drafter.pick = lambda q: torch.tensor([[next(forced)]])  # the window's tokens: what teacher forcing feeds
        drafter.states = None
        cache, state = state_at(target, text, t)
        tree = drafter.propose(text[:, : t + 1], cache, target_state=state)
        for k in range(3):
            q = torch.softmax(glide.to_target_logits(passes[k][0, t + k]), -1)
            torch.testing.assert_close(tree.draft_probs[k], q, atol=1e-6, rtol=0)


def test_self_attention_mask_of_pass_two_sees_pass_one_before_it_and_its_own_diagonal():
    mask = self_attention_mask(4, 2, torch.float32, "cpu")[0, 0] == 0
    # query j (t = j - 1): pass-1 keys i <= j - 1, pass-2 key j only
    assert mask[:, :4].tolist() == [
        [False] * 4,
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
    ]
    assert mask[:, 4:].tolist() == torch.eye(4, dtype=torch.bool).tolist()


def test_conditional_agreement_counts_only_drafts_whose_earlier_steps_agreed():
    target = tiny_model("llama")
    glide = make_state_glide(target)
    text = greedy_text(target)
    batch = TargetWindows(text[0], text.shape[1], stride=text.shape[1]).batch(
        target, glide, torch.tensor([0]), "cpu", True, True
    )
    with torch.no_grad():
        counts = conditional_agreement(glide, batch, 3)
    assert counts[0][1] == text.shape[1] - 1  # every start t >= 1 drafts a first step
    for (agreed, _), (_, tried) in zip(counts, counts[1:]):
        assert tried == agreed  # step k+1 is tried exactly where step k agreed (and fits the window)
    first = text.shape[1] // 2  # an answer's positions only: drafts started before them are not counted
    with torch.no_grad():
        later = conditional_agreement(glide, batch, 3, first=first)
    assert later[0][1] == text.shape[1] - first and all(t <= t0 for (_, t), (_, t0) in zip(later, counts))


# --- lossless in the loop ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch", [ARCHITECTURES[0], *(pytest.param(a, marks=pytest.mark.slow) for a in ARCHITECTURES[1:])]
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_state_glide_is_lossless_one_row_and_batched(arch, layout, tmp_path):
    target = tiny_model(arch)
    glide = trained_state_glide(target, layout, tmp_path)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    reference = greedy_reference(target, ids, 40)
    out = speculative_generate(target, ids, draft_model=glide, max_new_tokens=40, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference)
    stats = out.speculative_stats
    assert stats.accepted_tokens > 0 and any(s.accepted < s.tree_size for s in stats.steps)  # both branches ran
    batch = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(batch)
    mask[1, :3] = 0  # left padding
    batched = speculative_generate(target, batch, attention_mask=mask, draft_model=glide, max_new_tokens=24)
    assert torch.equal(batched, greedy_reference(target, batch, 24, attention_mask=mask))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_state_glide_is_lossless_on_the_static_path_and_under_cape(layout, tmp_path):
    target = tiny_model("llama")
    glide = trained_state_glide(target, layout, tmp_path)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    reference = greedy_reference(target, ids, 32)
    static = speculative_generate(target, ids, draft_model=glide, max_new_tokens=32, cache_implementation="static")
    assert torch.equal(static, reference)
    cape = CapeCandidateGenerator(GlideCandidateGenerator(glide))
    assert torch.equal(speculative_generate(target, ids, candidate_generator=cape, max_new_tokens=32), reference)
    through_generate = target.generate(ids, custom_generate=speculative_generate, draft_model=glide, max_new_tokens=32)
    assert torch.equal(through_generate, reference)


@pytest.mark.slow
def test_state_glide_samples_losslessly_within_noise(tmp_path):
    """Under sampling each drafted token carries the q it was drawn from. The loop's first step has no state to draft
    from, so the second token is the first one drafted: its marginal follows the target's (chi-square, 400 draws)."""
    from test_sampling import P_VALUE, chi_square_p, first_two_joint

    target = tiny_model("llama")
    glide = trained_state_glide(target, "assistant", tmp_path)
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    second = first_two_joint(target, ids, temperature=0.2).sum(0)  # p(x_2) = sum over x_1 of p(x_1) p(x_2 | x_1)
    draws = []
    for seed in range(400):
        torch.manual_seed(seed)
        out = speculative_generate(
            target, ids, draft_model=glide, max_new_tokens=3, do_sample=True, temperature=0.2, top_k=0
        )
        draws.append(int(out[0, ids.shape[1] + 1]))
    assert chi_square_p(torch.bincount(torch.tensor(draws), minlength=VOCAB), second) > P_VALUE


# --- training ---------------------------------------------------------------------------------------------------


@pytest.mark.slow  # trains several times (the default suite stays within five minutes)
def test_state_glide_trains_from_a_store_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from benchmarks.studies.glide_glimpse import compute_store
    from hf_specdraft.glide.training.store import StoreWindows
    from test_glide_training import periodic_stream, quick_args, train_killed_after

    target = tiny_model("qwen2")
    ids = periodic_stream()[: 8 * 32].view(8, 32)
    store = compute_store(target, ids, [target.config.num_hidden_layers - 1], progress_bar=False)
    assert store["hidden"].shape == (8, 32, target.config.hidden_size)
    source = StoreWindows(store)
    unbroken = make_state_glide(target, "assistant")
    log = train_glide(
        target, unbroken, source, quick_args(tmp_path / "unbroken", max_steps=8, save_steps=0, distillation_weight=1.0)
    )
    assert {"kl_1", "kl_2"} <= set(log["steps"][-1])  # both unrolled steps trained
    train_killed_after(
        6,
        monkeypatch,
        target,
        make_state_glide(target, "assistant"),
        source,
        quick_args(tmp_path / "killed", max_steps=8, save_steps=3, distillation_weight=1.0),
    )
    resumed = make_state_glide(target, "assistant")
    log = train_glide(
        target, resumed, source, quick_args(tmp_path / "killed", max_steps=8, save_steps=4, distillation_weight=1.0)
    )
    assert log["resumed_from_step"] == 6
    for (name, a), b in zip(unbroken.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name)


@pytest.mark.slow  # trains several times (the default suite stays within five minutes)
def test_unrolled_training_learns_the_second_step(tmp_path):
    """Two unrolled steps teach the second draft step (its own state as input): its cross-entropy on the next tokens
    ends lower than after training the first step alone, the same data, steps and seed."""
    from hf_specdraft.glide.training.objective import glide_loss
    from test_glide_training import periodic_stream

    target = tiny_model("llama")
    stream = periodic_stream(period=60)
    held = TargetWindows(stream[7:], 48, stride=48)
    second = GlideTrainingArguments(output_dir="unused", unrolled_steps=2)
    ce = {}
    for steps in (1, 2):
        glide = make_state_glide(target, "assistant")
        train_glide(
            target,
            glide,
            stream,
            GlideTrainingArguments(
                output_dir=str(tmp_path / str(steps)),
                max_steps=60,
                seq_len=32,
                per_device_batch_size=8,
                learning_rate=1e-2,
                warmup_steps=3,
                progress_bar=False,
                unrolled_steps=steps,
            ),
        )
        with torch.no_grad():
            _, parts = glide_loss(
                glide.eval(), held.batch(target, glide, torch.arange(4), "cpu", True, False), None, second
            )
        ce[steps] = (float(parts["ce_1"]), float(parts["ce_2"]))
    assert ce[2][1] < 0.5 * ce[1][1], ce


def test_a_store_without_hidden_states_is_refused_by_name():
    from hf_specdraft.glide.training.store import StoreWindows
    from test_glide_training import tiny_store

    target = tiny_model("llama")
    store = {k: v for k, v in tiny_store(target).items() if k != "hidden"}
    with pytest.raises(ValueError, match="holds none: write a new store"):
        StoreWindows(store).check(make_state_glide(target))


# --- refusals -----------------------------------------------------------------------------------------------------


def test_bad_configs_and_calls_are_refused_by_name():
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="self_attention=False needs state_input=True"):
        GlideConfig.from_target_config(target.config, hidden_size=32, self_attention=False)
    with pytest.raises(TypeError, match="state_input must be a bool"):
        GlideConfig.from_target_config(target.config, hidden_size=32, state_input=1)
    with pytest.raises(ValueError, match="unrolled_steps must be None or an int"):
        GlideTrainingArguments(output_dir="x", unrolled_steps=0)
    glide = make_state_glide(target)
    with pytest.raises(ValueError, match="transformers' assisted decoding"):
        glide.attach(target)
    with pytest.raises(ValueError, match=r"target_hidden_states must be \(1, 3, 32\)"):
        glide(input_ids=torch.tensor([[1, 2, 3]]), target_past_key_values=DynamicCache(config=target.config))
    with pytest.raises(ValueError, match="speculative_generate"):
        GlideCandidateGenerator(glide).propose(torch.tensor([[1, 2, 3]]), DynamicCache(config=target.config))
    with pytest.raises(ValueError, match="CAPE's beam mode"):
        CapeCandidateGenerator(GlideCandidateGenerator(glide), mode="beam")


def test_state_glide_round_trips_through_save_pretrained(tmp_path):
    target = tiny_model("llama")
    glide = make_state_glide(target, "assistant")
    glide.save_pretrained(tmp_path)
    loaded = GlideForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.state_input and not loaded.config.self_attention
    text = greedy_text(target)
    cache, state = state_at(target, text, 9)
    states = state.outputs.hidden_states[-1]
    with torch.no_grad():
        a = glide(input_ids=text[:, :9], target_hidden_states=states, target_past_key_values=cache, use_cache=False)
        b = loaded(input_ids=text[:, :9], target_hidden_states=states, target_past_key_values=cache, use_cache=False)
    torch.testing.assert_close(a.logits, b.logits)
    torch.testing.assert_close(a.draft_state, b.draft_state)


@pytest.mark.parametrize("layout", [None, *LAYOUTS])
def test_copying_from_the_context_is_lossless_and_copies(layout, tmp_path):
    """``copy_from_context``: where the text's suffix occurred before, its continuation is drafted, not GLIDE's."""
    target = tiny_model("llama")
    glide = (
        make_state_glide(target, layout)
        if layout
        else GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32))
    )
    phrase = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(8))
    ids = torch.cat([phrase, phrase, phrase[:, :3]], dim=1)  # the target's text is likely to go on copying
    reference = greedy_reference(target, ids, 30)
    drafter = GlideCandidateGenerator(glide.eval(), copy_from_context=2)
    out = speculative_generate(
        target, ids, candidate_generator=drafter, max_new_tokens=30, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, reference)
    copies = [step for step in out.speculative_stats.steps if step.copied]
    assert copies and sum(step.accepted for step in copies) > 0, "no step drafted a copy of the text the target kept"
    assert out.speculative_stats.summary()["copied_steps"] == len(copies)
    text = ids[0].tolist()
    suffix_copy = drafter.copy_from_text(DraftRequest(ids))
    assert suffix_copy is not None and suffix_copy.tokens.tolist() == text[15 : 15 + len(suffix_copy)]
    with pytest.raises(ValueError, match="copy_from_context must be an int >= 0"):
        GlideCandidateGenerator(glide, copy_from_context=-1)
