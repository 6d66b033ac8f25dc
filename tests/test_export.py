"""``hf-specdraft export``: a state-reading GLIDE in Gemma 4's assistant layout, for vLLM (which serves it as "mtp").

The layout's computation is checked with transformers' ``Gemma4AssistantForCausalLM`` as its reference, fed the inputs
vLLM builds (the target's embedding rows times sqrt(hidden_size), the target's last-layer keys and values): that is a
check of the weights' mapping, not of transformers' assisted generation, which does not run an export (transformers 5.23
does not load its config; its generator feeds unscaled rows). The export says it is for vLLM, ``draft_model=`` refuses
it by the GLIDE's name, a reduced head never drafts outside the draft vocabulary, and GLIDEs the layout cannot express
are refused."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from safetensors.torch import load_file
from transformers import DynamicCache, Gemma4AssistantForCausalLM, Gemma4TextConfig, GenerationConfig

from conftest import VOCAB, tiny_model
from hf_specdraft.core.support import with_cache
from hf_specdraft.glide import GlideConfig, GlideForCausalLM
from hf_specdraft import speculative_generate
from hf_specdraft.glide.export import EXPORT_KEY, assistant_weights, export_glide, unexpressible

pytestmark = pytest.mark.usefixtures("one_thread")


def assistant_glide(target, **overrides) -> GlideForCausalLM:
    torch.manual_seed(3)
    config = GlideConfig.from_target_config(
        target.config, state_input=True, self_attention=False, tie_word_embeddings=False, **overrides
    )
    glide = GlideForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1 and the input rows the target's: the check can tell the layouts apart
        for name, parameter in glide.named_parameters():
            if parameter.dim() == 1:
                parameter.uniform_(0.5, 1.5)
        rows = target.get_input_embeddings().weight
        ids = config.draft_token_ids if config.draft_token_ids is not None else list(range(config.vocab_size))
        glide.get_input_embeddings().weight[: len(ids)] = rows[ids]
    return glide


@pytest.fixture
def all_layers_shared(monkeypatch):
    """transformers 5.23 refuses an all-shared Gemma 4 text config in kv_sharing_modes (docs/architectures.md): an
    assistant reads every layer's KV from its target."""
    modes = Gemma4TextConfig.kv_sharing_modes
    monkeypatch.setattr(
        Gemma4TextConfig,
        "kv_sharing_modes",
        property(
            lambda self: (
                ["reuse"] * self.num_hidden_layers
                if self.num_kv_shared_layers == self.num_hidden_layers
                else modes.fget(self)
            )
        ),
    )


@pytest.mark.parametrize("draft_vocab", [None, list(range(0, VOCAB, 2))], ids=["full-vocabulary", "reduced-vocabulary"])
@pytest.mark.parametrize("layers", [1, 2])
def test_the_export_computes_what_glide_computes_from_vllms_inputs(draft_vocab, layers, tmp_path, all_layers_shared):
    """The layout's forward (transformers' module as its reference) on the inputs vLLM builds gives GLIDE's next state
    and logits; with a reduced head, vLLM's suppression of the excluded ids leaves every draft, greedy or sampled,
    inside GLIDE's draft vocabulary."""
    target = tiny_model("llama")
    glide = assistant_glide(
        target, num_hidden_layers=layers, target_layer_ids=[1] * layers, draft_token_ids=draft_vocab
    )
    out = export_glide(glide, tmp_path / "export", target.config)
    served = Gemma4AssistantForCausalLM.from_pretrained(out).eval()
    text = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    t = 9  # x_t is the newest token: the target holds 0 .. t-1
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        state = target(
            text[:, :t], **with_cache(target, cache), use_cache=True, output_hidden_states=True
        ).hidden_states[-1][:, -1:]
        ours = glide(
            input_ids=text[:, t : t + 1],
            position_ids=torch.tensor([[t - 1]]),
            target_hidden_states=state,
            target_past_key_values=cache,
            use_cache=False,
        )
        keys, values = cache.layers[-1].keys, cache.layers[-1].values
        # as vLLM feeds it
        embed = target.get_input_embeddings()(text[:, t : t + 1]) * math.sqrt(target.config.hidden_size)
        theirs = served(
            inputs_embeds=torch.cat([embed, state], dim=-1),
            position_ids=torch.tensor([[t - 1]]),
            shared_kv_states={"full_attention": (keys, values), "sliding_attention": (keys, values)},
        )
    # the next step's state
    torch.testing.assert_close(theirs.last_hidden_state, ours.draft_state, atol=1e-5, rtol=1e-4)
    if draft_vocab is None:
        torch.testing.assert_close(theirs.logits, ours.logits, atol=1e-5, rtol=1e-4)
    else:
        ids = torch.tensor(draft_vocab)
        torch.testing.assert_close(theirs.logits[..., ids], ours.logits[..., ids], atol=1e-5, rtol=1e-4)
        others = torch.ones(VOCAB, dtype=torch.bool)
        others[ids] = False
        suppressed = GenerationConfig.from_pretrained(out).suppress_tokens or []
        assert sorted(suppressed) == others.nonzero().flatten().tolist()
        # vLLM's Gemma4MTP.compute_logits
        served_logits = theirs.logits.index_fill(-1, torch.tensor(suppressed), -float("inf"))
        assert torch.equal(served_logits.argmax(-1), ours.logits.argmax(-1))  # greedy: GLIDE's draft
        # sampled: no mass outside the draft vocabulary
        assert bool((served_logits.softmax(-1)[..., others] == 0).all())
    notes = json.loads((out / "export.json").read_text())
    assert bool(notes["approximations"]) == (draft_vocab is not None)
    assert (
        json.loads((out / "target_config.json").read_text())["layer_types"]
        == ["full_attention"] * target.config.num_hidden_layers
    )


def test_every_glide_tensor_lands_once_and_the_map_round_trips():
    target = tiny_model("llama")
    glide = assistant_glide(target)
    weights = assistant_weights(glide)
    mine = glide.state_dict()
    assert torch.equal(
        weights["model.layers.0.self_attn.q_proj.weight"], mine["model.layers.0.cross_attn.q_proj.weight"]
    )
    assert torch.equal(
        weights["model.layers.0.pre_feedforward_layernorm.weight"],
        mine["model.layers.0.post_attention_layernorm.weight"],
    )
    scale = math.sqrt(target.config.hidden_size)
    back = weights["pre_projection.weight"].clone()
    back[:, : glide.config.hidden_size] *= scale
    torch.testing.assert_close(back, mine["model.pre_projection.weight"])


@pytest.mark.parametrize(
    "overrides, reason",
    [
        ({}, "does not read the target's state"),
        ({"state_input": True}, "self_attention=False"),
        ({"state_input": True, "self_attention": False, "target_layer_ids": [0]}, "the target's last layer"),
        ({"state_input": True, "self_attention": False, "hidden_size": 16}, "feeds the target's embedding rows"),
        ({"state_input": True, "self_attention": False, "hidden_act": "tanh"}, "activation 'tanh'"),
    ],
)
def test_a_glide_the_layout_cannot_express_is_refused_by_name(overrides, reason, tmp_path):
    target = tiny_model("llama")
    config = GlideConfig.from_target_config(target.config, **{"hidden_size": 32, **overrides})
    assert any(reason in line for line in unexpressible(config))
    with pytest.raises(ValueError, match="cannot be written in Gemma 4's assistant layout"):
        export_glide(GlideForCausalLM(config), tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_the_export_refuses_another_target(tmp_path):
    target = tiny_model("llama")
    glide = assistant_glide(target)
    with pytest.raises(ValueError, match="not the target this GLIDE was built for"):
        export_glide(glide, tmp_path, tiny_model("llama", num_hidden_layers=3).config)


def test_the_weights_file_holds_only_the_layouts_tensors(tmp_path):
    target = tiny_model("llama")
    out = export_glide(assistant_glide(target), tmp_path)
    names = set(load_file(str(out / "model.safetensors")))
    assert names == {
        "model.embed_tokens.weight",
        "model.norm.weight",
        "pre_projection.weight",
        "post_projection.weight",
        *(
            f"model.layers.0.{n}"
            for n in (
                "self_attn.q_proj.weight",
                "self_attn.q_norm.weight",
                "self_attn.o_proj.weight",
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "pre_feedforward_layernorm.weight",
                "post_feedforward_layernorm.weight",
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
                "layer_scalar",
            )
        ),
    }


def saved_assistant_glide(target, path, **overrides):
    """An exportable GLIDE saved to ``path`` and loaded back, as a trained one is exported (named by its directory)."""
    assistant_glide(target, **overrides).save_pretrained(path)
    return GlideForCausalLM.from_pretrained(path).eval()


def test_the_export_says_it_is_for_vllm_and_names_its_glide(tmp_path):
    target = tiny_model("llama")
    glide = saved_assistant_glide(target, tmp_path / "glide", draft_token_ids=list(range(0, VOCAB, 2)))
    out = export_glide(glide, tmp_path / "export", target.config)
    config = json.loads((out / "config.json").read_text())
    assert config[EXPORT_KEY] == {"serves_in": "vllm", "glide": str(tmp_path / "glide")}
    notes = json.loads((out / "export.json").read_text())
    assert notes["glide"] == str(tmp_path / "glide") and notes["serves_in"].startswith("vLLM only")
    card = (out / "README.md").read_text()
    assert "for vLLM only" in card and str(tmp_path / "glide") in card
    assert "suppress_tokens" in notes["excluded_ids"]


def test_draft_model_refuses_an_export_and_names_the_glide_to_use(tmp_path, all_layers_shared):
    target = tiny_model("llama")
    glide = saved_assistant_glide(target, tmp_path / "glide")
    out = export_glide(glide, tmp_path / "export", target.config)
    served = Gemma4AssistantForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(
        ValueError, match="exported for vLLM.*" + re.escape(f"GlideForCausalLM.from_pretrained('{tmp_path / 'glide'}')")
    ):
        speculative_generate(target, ids, draft_model=served, max_new_tokens=4)
    # the GLIDE itself drafts
    assert speculative_generate(target, ids, draft_model=glide, max_new_tokens=4).shape[1] == 10
