"""benchmarks.studies.glide_glimpse on a tiny target: the delay mask, its scores against the inference rule, and the
fine-tuned layer comparison (the real run loads SmolLM2 and takes minutes; its result is committed JSON)."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from hf_specdraft import GlideConfig, GlideForCausalLM
from benchmarks.studies import glide_glimpse
from benchmarks.studies.glide_glimpse import compute_store, draft_probs
from hf_specdraft.glide.training.store import StoreWindows
from hf_specdraft.glide.training.unrolled import glimpse_mask


def _drafter(target, cross_attention=True, layer=None, seed=1):
    torch.manual_seed(seed)
    extra = {} if layer is None else {"target_layer_ids": [layer]}
    # a reduced vocabulary, as the shipped drafters have
    config = GlideConfig.from_target_config(
        target.config,
        hidden_size=32,
        intermediate_size=64,
        cross_attention=cross_attention,
        draft_token_ids=list(range(48)),
        **extra,
    )
    model = GlideForCausalLM(config).eval()
    if cross_attention:  # a glimpse that changes the output (an untrained one may start silent)
        torch.nn.init.normal_(model.model.layers[0].cross_attn.o_proj.weight, std=1.0)
    return model


@pytest.fixture(scope="module")
def setup():
    target = tiny_model("llama", num_hidden_layers=3)
    windows = torch.randint(0, target.config.vocab_size, (4, 24), generator=torch.Generator().manual_seed(0))
    return target, compute_store(target, windows, [0, 2], batch_size=3)


def draft_distribution(glide, store, delay):
    """q over the store's windows with the study's scorer's forward: glimpsing at ``delay``, or nothing (`None`)."""
    batch = StoreWindows(store).batch(
        None, glide, torch.arange(len(store["input_ids"])), "cpu", delay is not None, False
    )
    return draft_probs(glide, batch, delay=delay)


def test_glimpse_mask_lets_position_j_see_keys_up_to_j_minus_delay():
    mask = glimpse_mask(5, 2)
    allowed = (mask[0, 0] == 0).int()
    assert allowed.tolist() == [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]


def test_delay_one_is_the_inference_rule_and_a_delay_past_the_window_is_no_glimpse(setup):
    target, store = setup
    glide = _drafter(target)
    assert glide.config.target_layer_ids == [2] and set(store) >= {"keys.0", "keys.2", "topk_ids", "topk_probs"}
    layers = [(None, None)] * 3
    layers[2] = (store["keys.2"].float(), store["values.2"].float())
    with torch.no_grad():  # the model's own rule at inference: the query at j glimpses keys k < j
        hidden = glide.model(
            input_ids=store["input_ids"].long(), target_past_key_values=layers, use_cache=False
        ).last_hidden_state
    q = glide.to_target_logits(glide.lm_head(hidden).float()).softmax(-1)
    p = torch.zeros_like(q).scatter_(-1, store["topk_ids"].long(), store["topk_probs"].float())
    expected = torch.minimum(p, q).sum(-1)[:, 4:].mean().item()
    assert glide_glimpse.score(glide, store, 1, skip=4)["alpha"] == pytest.approx(expected, abs=1e-4)
    alone = draft_distribution(glide, store, None)
    torch.testing.assert_close(draft_distribution(glide, store, 24), alone)  # nothing left to glimpse
    assert not torch.allclose(draft_distribution(glide, store, 1), alone)
    assert not torch.allclose(draft_distribution(glide, store, 3), draft_distribution(glide, store, 1))
    rows = glide_glimpse.glimpse_rows(glide, _drafter(target, cross_attention=False), store, delays=(1, 3))
    assert list(rows) == ["glide, delay 1", "glide, delay 3", "glide, no glimpse", "vanilla"]
    assert all(0 <= r["alpha"] <= 1 and 0 <= r["agreement"] <= 1 for r in rows.values())


def test_layer_rows_fine_tune_a_glide_per_layer_and_the_vanilla_twin(setup):
    target, store = setup
    loaded = []

    def load_glide(layer):
        loaded.append(layer)
        return _drafter(target, layer=layer)

    vanilla = _drafter(target, cross_attention=False)
    before = {k: v.clone() for k, v in vanilla.state_dict().items()}
    rows = glide_glimpse.layer_rows(target, load_glide, lambda: vanilla, store, store, [0, 2], steps=3)
    assert loaded == [0, 2] and list(rows) == [
        "vanilla, shipped",
        "vanilla, fine-tuned",
        "glide, layer 0",
        "glide, layer 2",
    ]
    assert any(not torch.equal(before[k], v) for k, v in vanilla.state_dict().items())  # the twin was trained too
    assert all("last_loss" in rows[name] for name in ("vanilla, fine-tuned", "glide, layer 0", "glide, layer 2"))


@pytest.mark.parametrize(
    "argv, flag", [(["--steps", "0"], "--steps"), (["--windows", "-1"], "--windows"), (["--layers", "top"], "--layers")]
)
def test_bad_arguments_are_refused_before_anything_loads(argv, flag, capsys, monkeypatch):
    import hf_specdraft.defaults

    monkeypatch.setattr(hf_specdraft.defaults, "load_default", lambda *a, **k: pytest.fail("loaded the default"))
    with pytest.raises(SystemExit) as exit_info:
        glide_glimpse.main(argv)
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


def test_report_section_renders_both_tables():
    from benchmarks.report.render import glide_glimpse_section

    result = {
        "meta": {
            "prompts": "24 held-out code windows of 256 tokens",
            "hardware": "CPU",
            "skip": 16,
            "command": "python -m x",
        },
        "glimpse": {
            "glide, delay 1": {"alpha": 0.4066, "agreement": 0.4674},
            "vanilla": {"alpha": 0.3609, "agreement": 0.4172},
        },
        "shipped_layer": [29],
        "layers": {
            "vanilla, shipped": {"alpha": 0.36, "agreement": 0.41},
            "glide, layer 29": {"alpha": 0.366, "agreement": 0.404, "last_loss": 1.558},
        },
    }
    text = glide_glimpse_section(result)
    assert "| glide, delay 1 | 0.407 | 0.467 |" in text and "| glide, layer 29 | 0.366 | 0.404 | 1.558 |" in text
    assert "| vanilla, shipped | 0.360 | 0.410 | – |" in text


def test_group_agreement_counts_the_answer_tokens_a_draft_vocabulary_can_propose():
    from benchmarks.studies.group_agreement import vocabulary_coverage

    target = tiny_model("llama")
    glide = _drafter(target)  # draft ids 0-47
    answered = [("qa", [90, 91, 5, 60, 7], 2), ("qa", [1, 47, 48], 1), ("code", [3, 4], 2)]
    assert vocabulary_coverage(glide, answered) == {
        "qa": {"coverage": 0.6, "tokens": 5},  # 5 and 7, then 47, of 5, 60, 7, 47, 48
        "code": {"coverage": 0.0, "tokens": 0},
    }
    glide.config.draft_token_ids = None  # the whole vocabulary
    assert vocabulary_coverage(glide, answered)["qa"]["coverage"] == 1.0
