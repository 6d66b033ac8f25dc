"""Every causal-LM architecture transformers ships, named once: trees, chains only, refused, or skipped with a reason.

The grid is ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``: a transformers release that adds a model type fails
``test_grid_names_every_causal_lm`` until the type is classified here. Each model is a tiny random one
built from its config class (hidden 32, 2 layers, vocabulary 96; per-type fixes in ``OVERRIDES``):

- ``TREES``: greedy output of speculative_generate equals ``target.generate(do_sample=False)`` with an
  always-right chain, an always-wrong chain and a hand-drawn tree whose accepted path is never the first child;
- ``CHAINS``: the same, with every tree verified as its first-child chain (said in the statistics);
- ``REFUSED``: a clear ValueError naming the model type before any forward (hf_specdraft.core.support);
- ``SKIPPED``: not built here, with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from conftest import OracleDrafter
from hf_specdraft import speculative_generate
from hf_specdraft.core.support import check_target

VOCAB = 96
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    head_dim=8,
)
DROP = object()  # an override that removes a TINY key
_ENCODER_AS_DECODER = {"is_decoder": True}  # encoders with a causal-LM head: transformers asks for is_decoder=True
_SEQ2SEQ_DECODER = dict(
    d_model=32,
    decoder_layers=2,
    encoder_layers=2,
    decoder_attention_heads=4,
    encoder_attention_heads=4,
    decoder_ffn_dim=64,
    encoder_ffn_dim=64,
)
OVERRIDES = {
    **dict.fromkeys(
        [
            "bert",
            "camembert",
            "data2vec-text",
            "ernie",
            "megatron-bert",
            "roberta",
            "roberta-prelayernorm",
            "roc_bert",
            "roformer",
            "rembert",
            "xlm-roberta",
            "xlm-roberta-xl",
            "xmod",
            "electra",
            "big_bird",
            "bert-generation",
        ],
        _ENCODER_AS_DECODER,
    ),
    **dict.fromkeys(
        ["bart", "mbart", "marian", "pegasus", "blenderbot", "blenderbot-small", "mvp", "plbart"], _SEQ2SEQ_DECODER
    ),
    "whisper": _SEQ2SEQ_DECODER,
    "prophetnet": dict(
        num_encoder_layers=2,
        num_decoder_layers=2,
        num_hidden_layers=DROP,
        num_encoder_attention_heads=4,
        num_decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    ),
    "reformer": dict(
        is_decoder=True, attn_layers=["local", "local"], axial_pos_shape=[16, 16], axial_pos_embds_dim=[16, 16]
    ),
    **dict.fromkeys(
        ["qwen2_moe", "qwen3_moe", "qwen3_5_moe_text"],
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    ),
    "falcon": {"head_dim": DROP},
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "codegen": {"rotary_dim": 8},
    "gptj": {"rotary_dim": 8},
}

TREES = """
afmoe apertus apertus1p5_text arcee aria_text bart beam bert bert-generation big_bird biogpt bitnet blenderbot
blenderbot-small codegen cohere cohere2 cohere2_moe ctrl cwm diffllama doge electra emu3 ernie ernie4_5 exaone exaone4
falcon flex_olmo flint fuyu gemma gemma2 gemma3_text gemma4_unified gemma4_unified_text glm glm4 gpt-sw3 gpt2
gpt_bigcode gpt_neox gpt_neox_japanese gpt_oss gptj granite granite_swa granitemoe granitemoe_swa granitemoeshared
helium hunyuan_v1_dense hunyuan_v1_moe hyperclovax internlm3 iquestcoder jais2 jetmoe llama llama4 llama4_text marian
mbart megatron-bert minimax_m2 minimax_m3_vl_text ministral ministral3 mistral mixtral mllama modernbert-decoder moshi
mvp nanochat nemotron olmo olmo2 olmo3 olmoe opt pegasus persimmon phi phi3 phimoe plbart qwen2 qwen2_moe qwen3
qwen3_moe rembert roformer sarvam_moe seed_oss smollm3 stablelm starcoder2 trocr vaultgemma whisper xglm
""".split()
CHAINS = "bloom lfm2 mpt".split()  # ALiBi, convolution layers (Falcon with alibi=True: tests/test_support.py)
REFUSED = """
bailing_hybrid camembert cpmant data2vec-text deepseek_v4 dory falcon_h1 falcon_mamba inkling2_loop_text jamba lara_mini
mamba minimax olmo_hybrid openai-gpt prophetnet qwen3_5 qwen3_5_text recurrent_gemma reformer roberta
roberta-prelayernorm rwkv xlm xlm-roberta xlm-roberta-xl xlstm
""".split()
_NOT_TINY = (
    "no generic tiny config: MoE experts, a vision or audio tower or a large vocabulary keep it above 5M parameters"
)
_VALIDATOR = "its config validator rejects the generic tiny sizes (needs model-specific ones)"
_MLA = "multi-head latent attention: the generic tiny sizes do not fit its low-rank q/kv projections"
SKIPPED = {
    **dict.fromkeys(
        "blt deepseek_v2 deepseek_v32 ernie4_5_moe exaone_moe gemma3 gemma4 git glm4_moe glm4_moe_lite glm_moe_dsa "
        "got_ocr2 hy_v3 hy_v4 inkling2_text inkling_text kimi_linear kolibri1 laguna longcat_flash mellum "
        "mimo_v2_flash moss_transcribe_diarize nemotron_h phi4_multimodal qwen3_5_moe qwen3_5_moe_text qwen3_next "
        "qwen4_exp qwen4_exp_text roc_bert solar_open zaya".split(),
        _NOT_TINY,
    ),
    **dict.fromkeys(
        "bamba dots3_note dots3_note_text gemma4_assistant gpt_neo granitemoehybrid mamba2 zamba zamba2".split(),
        _VALIDATOR,
    ),
    **dict.fromkeys("axk1 axk2 deepseek_v3 minicpm3 sarvam_mla youtu".split(), _MLA),
    **dict.fromkeys(
        "gemma3n_text gemma4_unified_assistant".split(),
        "KV-sharing layers: the generic tiny config leaves a layer type without its cache",
    ),
    "gemma4_text": (
        "KV-sharing layers need model-specific tiny sizes: tests/test_gemma4.py builds them (trees, batches, the "
        "static path)"
    ),
    **dict.fromkeys(
        "musicgen musicgen_melody".split(), "an audio model whose config holds two text configs (encoder and decoder)"
    ),
    "bigbird_pegasus": "the decoder of an encoder-decoder model whose tiny config needs block-sparse sizes",
    "cohere_compass_text": "its config builds no layer types from the generic sizes (KeyError 'full_attention')",
    "dbrx": "its nested attention config has no rope_theta when built from the generic sizes",
    "dots1": "its config fails to build from the generic sizes",
    "gemma3n": "needs the timm library for its vision tower",
    "hrm_text": "its recurrent reasoning loop fails in transformers' own generate with the generic sizes",
    "lfm2_moe": "its config fails to build from the generic sizes (layer types); LFM2 itself: tests/test_support.py",
    "lfm3": "the generic tiny config has only conv layers, where transformers' generate fails (LFM2: test_support.py)",
    "xlnet": "its config refuses max_position_embeddings (no length limit) and its forward keeps mems, not a KV cache",
    "xmod": "needs a language adapter chosen (set_default_language) before any forward",
}


# model types transformers 5.24 added: absent from 5.23's grid, classified above all the same
ADDED_IN_5_24 = {"apertus1p5_text", "dory", "exaone", "inkling2_loop_text", "lara_mini", "sarvam_mla", "sarvam_moe"}
ON_5_24 = Version(transformers.__version__) >= Version("5.24.0.dev0")
if ON_5_24:
    TREES.remove("gemma4_unified")
    SKIPPED["gemma4_unified"] = (
        "from transformers 5.24 on, its config validator rejects the generic tiny sizes (a layer type without "
        "its cache); on 5.23 it runs here"
    )


def _classified() -> dict[str, str]:
    grid = {
        **dict.fromkeys(TREES, "trees"),
        **dict.fromkeys(CHAINS, "chains"),
        **dict.fromkeys(REFUSED, "refused"),
        **{name: "skipped" for name in SKIPPED},
    }
    return grid


def tiny_causal_lm(model_type: str):
    """A tiny random ``AutoModelForCausalLM`` of ``model_type`` (fp32, eval)."""
    kwargs = {**TINY, **OVERRIDES.get(model_type, {})}
    kwargs = {k: v for k, v in kwargs.items() if v is not DROP}
    config = AutoConfig.for_model(model_type, **kwargs)
    text = config.get_text_config()
    for key, value in kwargs.items():  # nested text configs (multimodal models) take the sizes too
        try:
            if getattr(text, key, None) != value:
                setattr(text, key, value)
        except Exception:  # noqa: BLE001 - read-only, per-layer or validated attributes keep the config's own value
            pass
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def check_architecture(model_type: str) -> dict:
    """Run the grid's checks on one model type; returns what happened per drafter (for the tests and for humans)."""
    model = tiny_causal_lm(model_type)
    x = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(1))
    kwargs = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    try:
        check_target(model)
    except ValueError as error:
        return {"refused": str(error)}
    reference = model.generate(x, **kwargs)
    outcome = {}
    for mode in ("right", "wrong", "tree"):
        out = speculative_generate(
            model,
            x,
            candidate_generator=OracleDrafter(reference, mode, vocab_size=VOCAB),
            return_dict_in_generate=True,
            **kwargs,
        )
        outcome[mode] = bool(torch.equal(out.sequences, reference))
        outcome["chains_only"] = "chains_only" in out.speculative_stats.extra
    return outcome


def test_grid_names_every_causal_lm():
    grid = _classified()
    assert sum(map(len, (TREES, CHAINS, REFUSED, SKIPPED))) == len(grid), "a model type is classified twice"
    if not ON_5_24:
        grid = {name: status for name, status in grid.items() if name not in ADDED_IN_5_24}
    mapped = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert set(grid) == mapped, f"new: {sorted(mapped - set(grid))}, gone: {sorted(set(grid) - mapped)}"


@pytest.mark.parametrize("model_type", sorted(_classified()))
def test_architecture(model_type, one_thread):
    status = _classified()[model_type]
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        pytest.skip(f"{model_type} was added in transformers 5.24; this is {transformers.__version__}")
    if status == "skipped":
        pytest.skip(SKIPPED[model_type])
    outcome = check_architecture(model_type)
    if status == "refused":
        # multimodal wrappers name their text model
        assert "refused" in outcome and f"'{model_type}" in outcome["refused"], outcome
        return
    assert "refused" not in outcome, outcome
    assert outcome["right"] and outcome["wrong"] and outcome["tree"], outcome
    assert outcome["chains_only"] == (status == "chains"), outcome


def test_readme_lists_the_grid():
    readme = (
        (Path(__file__).resolve().parents[1] / "docs" / "architectures.md")
        .read_text()
        .split("## Architectures", 1)[1]
        .split("\n## ", 1)[0]
    )
    for names in (TREES, CHAINS, REFUSED):
        assert all(f"`{name}`" in readme for name in names), [name for name in names if f"`{name}`" not in readme]
