"""Which targets the loop verifies trees for, chains for, or refuses (hf_specdraft.core.support)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft import speculative_generate
from hf_specdraft.cape.custom_generate.generate import generate as cape_generate
from hf_specdraft.cascade import MaxGramCandidateGenerator
from hf_specdraft.core.support import cache_layer_names, chains_only, check_target

TINY = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=None, eos_token_id=None)
# model type -> tiny config kwargs; ALiBi (a 2-D mask only) and convolution hybrids (crop rolls them back)
CHAIN_ONLY = {
    "bloom": dict(hidden_size=32, n_layer=2, n_head=4),
    "falcon": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        alibi=True,
        new_decoder_architecture=False,
        multi_query=True,
    ),
    "mpt": dict(d_model=32, n_layers=2, n_heads=4),
    "lfm2": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        layer_types=["conv", "full_attention"],
    ),
}
REFUSED = {  # recurrent state that transformers' crop does not roll back
    "mamba": dict(hidden_size=32, num_hidden_layers=2, state_size=8),
    "jamba": dict(
        hidden_size=32,
        num_hidden_layers=4,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        mamba_d_state=8,
        use_mamba_kernels=False,
    ),
}


def build(model_type: str, **kwargs):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **TINY, **kwargs)).eval()


def prompt(length=9, seed=1):
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", sorted(CHAIN_ONLY))
def test_chain_only_targets_stay_lossless_with_trees(model_type):
    target = build(model_type, **CHAIN_ONLY[model_type])
    assert chains_only(target)
    x = prompt()
    reference = greedy_reference(target, x, 16, eos_token_id=None, pad_token_id=0)
    for drafter in (
        OracleDrafter(reference, "right"),
        OracleDrafter(reference, "wrong"),
        OracleDrafter(reference, "tree"),
        MaxGramCandidateGenerator(),
    ):
        out = speculative_generate(
            target,
            x,
            candidate_generator=drafter,
            max_new_tokens=16,
            eos_token_id=None,
            pad_token_id=0,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, reference), (model_type, type(drafter).__name__)
        assert out.speculative_stats.extra["chains_only"].startswith(type(target).__name__)
    tree_run = speculative_generate(
        target,
        x,
        candidate_generator=OracleDrafter(reference, "tree"),
        max_new_tokens=16,
        eos_token_id=None,
        pad_token_id=0,
        return_dict_in_generate=True,
    )
    # said, not hidden: every step's tree (the last ones may be cut to a chain by the length budget)
    assert (
        tree_run.speculative_stats.num_steps - 2
        <= tree_run.speculative_stats.extra["trees_verified_as_chains"]
        <= tree_run.speculative_stats.num_steps
    )


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_recurrent_targets_and_drafters_are_refused_before_any_forward(model_type):
    model = build(model_type, **REFUSED[model_type])
    forwards = []
    model.register_forward_pre_hook(lambda *args: forwards.append(1))
    with pytest.raises(ValueError, match=f"is a '{model_type}' model"):
        speculative_generate(model, prompt(), candidate_generator=MaxGramCandidateGenerator(), max_new_tokens=4)
    with pytest.raises(ValueError, match=f"draft_model is a '{model_type}' model"):
        speculative_generate(tiny_model("llama"), prompt(), draft_model=model, max_new_tokens=4)
    assert forwards == []


def test_attention_targets_pass():
    for arch in ("llama", "mistral", "qwen2"):
        model = tiny_model(arch)
        check_target(model)
        assert chains_only(model) is None


def sliding_window_layers(model) -> int:
    """How many of ``model``'s layers transformers caches as sliding-window layers (0: none)."""
    return cache_layer_names(model).count("DynamicSlidingWindowLayer")


def test_sliding_window_is_asked_the_way_transformers_builds_the_cache():
    assert sliding_window_layers(tiny_model("mistral", sliding_window=16)) == 2  # every layer
    assert sliding_window_layers(tiny_model("qwen2", sliding_window=16)) == 0  # use_sliding_window defaults to False
    assert (
        sliding_window_layers(tiny_model("qwen2", sliding_window=16, use_sliding_window=True, max_window_layers=1)) == 1
    )
    moe = build(
        "qwen2_moe",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        sliding_window=0,
        use_sliding_window=False,
    )
    assert sliding_window_layers(moe) == 0


def test_custom_generate_runs_qwen2_moe_with_an_unused_sliding_window(tmp_path):
    """``custom_generate=<checkpoint dir>`` once refused Qwen2-MoE ("max_length reaches sliding_window=0"); it now asks
    the cache."""
    from hf_specdraft.cape import write_custom_generate

    moe = build(
        "qwen2_moe",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        sliding_window=0,
        use_sliding_window=False,
    )
    write_custom_generate(tmp_path / "ckpt")
    x = prompt()
    out = moe.generate(
        input_ids=x,
        custom_generate=str(tmp_path / "ckpt"),
        trust_remote_code=True,
        assistant_model=moe,
        max_new_tokens=16,
        num_draft_tokens=4,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert torch.equal(out, greedy_reference(moe, x, 16, eos_token_id=None, pad_token_id=0))


@pytest.mark.parametrize("model_type", ["bloom", "mamba"])
def test_custom_generate_refuses_what_it_cannot_verify(model_type):
    model = build(model_type, **{**CHAIN_ONLY, **REFUSED}[model_type])
    with pytest.raises(ValueError, match=f"'{model_type}' model"):
        cape_generate(model, input_ids=prompt(), assistant_model=model, max_new_tokens=4)


@pytest.mark.parametrize("model_type", ["bloom", "lfm2"])
def test_chain_only_targets_are_refused_on_the_static_cache(model_type):
    """The static path verifies with explicit 4-D masks, which ALiBi and convolution targets cannot take."""
    target = build(model_type, **CHAIN_ONLY[model_type])
    with pytest.raises(ValueError, match="cache_implementation='static' verifies with explicit 4-D masks"):
        speculative_generate(
            target,
            prompt(),
            candidate_generator=MaxGramCandidateGenerator(),
            max_new_tokens=4,
            cache_implementation="static",
        )
