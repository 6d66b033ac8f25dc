"""A trained GLIDE written for vLLM in Gemma 4's assistant layout, which vLLM serves as its ``"mtp"`` method
(docs/serving.md); ``draft_model=`` refuses an export (its config records its GLIDE, :data:`EXPORT_KEY`).

A GLIDE built with ``state_input=True, self_attention=False`` maps by name (:data:`LAYER_NAMES`), except that vLLM
feeds the target's embedding rows times ``sqrt(hidden_size)`` (the embedding half of ``pre_projection`` is divided by
it), and the head is one tied table over the whole vocabulary: a reduced vocabulary's other ids get zero rows, listed as
``suppress_tokens``. What cannot be expressed is refused by name (:func:`unexpressible`).

    hf-specdraft export default exported/   # SmolLM2's shipped GLIDE in that layout, with the target's config
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from string import Template

import torch
from safetensors.torch import save_file
from transformers import PretrainedConfig

# GLIDE's name in a draft layer -> the assistant layout's (under model.layers.N.)
LAYER_NAMES = {
    "cross_attn_layernorm.weight": "input_layernorm.weight",
    "cross_attn.q_proj.weight": "self_attn.q_proj.weight",
    "cross_attn.q_norm.weight": "self_attn.q_norm.weight",
    "cross_attn.o_proj.weight": "self_attn.o_proj.weight",
    "post_cross_attn_layernorm.weight": "post_attention_layernorm.weight",
    "post_attention_layernorm.weight": "pre_feedforward_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
    "post_feedforward_layernorm.weight": "post_feedforward_layernorm.weight",
}
EXPORT_KEY = "hf_specdraft_export"  # in the export's config.json: what it is for and the GLIDE it was exported from
TOP_NAMES = {"model.norm.weight": "model.norm.weight", "model.post_projection.weight": "post_projection.weight"}
TEMPLATE = Path(__file__).with_name("export_card_template.md")  # the export's README.md ($glide_line filled in)
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu")  # act-and-mul kinds vLLM's Gemma 4 MLP takes
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
COPY_TABLE = ("copy_table_keys", "copy_table_tokens")  # a GLIDE's copy table (core/ngram_table.py): left out


def unexpressible(config) -> list[str]:
    """Why a GLIDE of ``config`` has no Gemma 4 assistant checkpoint, one reason a line (empty: it exports)."""
    reasons = []
    if not getattr(config, "state_input", False):
        reasons.append("it does not read the target's state: build it with state_input=True")
    if getattr(config, "self_attention", True):
        reasons.append(
            "it has self-attention and a cache of its own, which the layout has no layer for: build it with "
            "self_attention=False"
        )
    if not config.cross_attention:
        reasons.append(
            "it has no cross-attention to the target's KV (the vanilla drafter): the layout's layers are that attention"
        )
    last = config.target_num_hidden_layers - 1
    if config.cross_attention and any(i != last for i in config.target_layer_ids):
        reasons.append(
            f"it glimpses target layers {config.target_layer_ids}; the layout reads the target's last layer ({last}) "
            "only"
        )
    if config.hidden_size != config.target_hidden_size:
        reasons.append(
            f"its width {config.hidden_size} differs from the target's {config.target_hidden_size}: the layout feeds "
            "the target's embedding rows into pre_projection"
        )
    if config.attention_bias or config.mlp_bias:
        reasons.append("it has biases, which the layout's projections do not")
    if config.hidden_act not in ACTIVATIONS:
        reasons.append(f"its activation {config.hidden_act!r} is not one of {list(ACTIVATIONS)}")
    return reasons


def assistant_weights(glide) -> dict[str, torch.Tensor]:
    """GLIDE's state dict as the assistant layout's tensors (fp32, contiguous; module docstring)."""
    config = glide.config
    problems = unexpressible(config)
    if problems:
        raise ValueError("this GLIDE cannot be written in Gemma 4's assistant layout:\n  " + "\n  ".join(problems))
    ours = {name: tensor.detach().float().cpu() for name, tensor in glide.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for i in range(config.num_hidden_layers):
        for mine, theirs in LAYER_NAMES.items():
            key = f"model.layers.{i}.{mine}"
            if key not in ours:
                raise ValueError(f"GLIDE has no tensor {key!r}: it was not built in the assistant layout")
            out[f"model.layers.{i}.{theirs}"] = ours.pop(key)
        out[f"model.layers.{i}.layer_scalar"] = torch.ones(1)
    for mine, theirs in TOP_NAMES.items():
        out[theirs] = ours.pop(mine)
    projection = ours.pop("model.pre_projection.weight").clone()  # (hidden, hidden + target_hidden)
    # vLLM scales the embedding rows up by it
    projection[:, : config.hidden_size] /= math.sqrt(config.target_hidden_size)
    out["pre_projection.weight"] = projection
    head = ours.pop("lm_head.weight")
    # input rows are the target's; a copy table is the loop's, not the model's (vLLM copies nothing from one)
    for unused in ("model.embed_tokens.weight", "model.target_to_draft", "draft_token_ids", *COPY_TABLE):
        ours.pop(unused, None)
    if config.draft_token_ids is not None:  # the head's rows to their ids, zero rows elsewhere
        full = torch.zeros(config.vocab_size, config.hidden_size)
        full[torch.tensor(config.draft_token_ids)] = head[: len(config.draft_token_ids)]
        head = full
    out["model.embed_tokens.weight"] = head
    leftover = sorted(name for name in ours if "rotary" not in name)
    if leftover:
        raise ValueError(f"GLIDE tensors with no home in the assistant layout: {leftover}")
    return {name: tensor.contiguous() for name, tensor in out.items()}


def assistant_config(glide) -> PretrainedConfig:
    """The Gemma 4 assistant config of ``glide``'s export (transformers' ``Gemma4AssistantConfig``)."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    config = glide.config
    layers = config.num_hidden_layers
    rope = {key: value for key, value in dict(config.target_rope_parameters).items() if key != "partial_rotary_factor"}
    text = Gemma4TextConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=config.target_num_attention_heads,
        num_key_value_heads=config.target_num_key_value_heads,
        head_dim=config.target_head_dim,
        global_head_dim=config.target_head_dim,
        hidden_activation=config.hidden_act,
        max_position_embeddings=config.target_max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        layer_types=["full_attention"] * layers,
        rope_parameters={"full_attention": rope},
        vocab_size_per_layer_input=0,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=layers,
        **{key: getattr(config, key) for key in TOKEN_IDS},
    )
    assistant = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=config.target_hidden_size)
    assistant.architectures = ["Gemma4AssistantForCausalLM"]
    setattr(assistant, EXPORT_KEY, {"serves_in": "vllm", "glide": str(glide.name_or_path) or None})
    return assistant


def target_config_for_serving(target_config: PretrainedConfig) -> dict:
    """The target's config as a dict with ``layer_types`` (all ``"full_attention"`` unless it says otherwise), which
    vLLM reads to find the target layer the draft shares."""
    data = target_config.to_dict()
    text = target_config.get_text_config()
    if not getattr(text, "layer_types", None):
        window = getattr(text, "sliding_window", None)
        if window is not None and getattr(text, "use_sliding_window", True):
            raise ValueError(
                f"the target has a sliding window of {window} tokens but no layer_types saying which layers use it: "
                "add layer_types to its config first"
            )
        data["layer_types"] = ["full_attention"] * text.num_hidden_layers
    return data


def export_glide(glide, output_dir: str | Path, target_config: PretrainedConfig | None = None) -> Path:
    """Write ``glide`` into ``output_dir`` in Gemma 4's assistant layout for vLLM (``config.json``, weights,
    ``generation_config.json``, ``README.md``, ``export.json``) and, given ``target_config``, ``target_config.json``.

    Raises:
        ValueError: the GLIDE cannot be expressed in the layout (:func:`unexpressible`), or ``target_config`` is not the
            target it was built for.
    """
    if target_config is not None:
        glide.check_target(target_config)
    weights = assistant_weights(glide)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    assistant_config(glide).save_pretrained(output_dir)
    save_file(weights, str(output_dir / "model.safetensors"), metadata={"format": "pt"})
    source = str(glide.name_or_path) or None  # None: built in memory
    glide_line = f"`{source}`" if source else "the GLIDE checkpoint it was exported from"
    card = Template(TEMPLATE.read_text(encoding="utf-8")).substitute(glide_line=glide_line)
    (output_dir / "README.md").write_text(card)
    config, reduced = glide.config, glide.config.draft_token_ids
    generation = {key: getattr(config, key) for key in TOKEN_IDS if getattr(config, key) is not None}
    notes = {
        "source": "hf_specdraft GLIDE (state_input, assistant layout)",
        "glide": source,
        "serves_in": "vLLM only (speculative method 'mtp'); in transformers, use the GLIDE checkpoint itself as "
        "draft_model=",
        "target": config.target_name_or_path,
        "draft_vocabulary": len(reduced) if reduced else None,
        "excluded_ids": (
            f"the {config.vocab_size - len(reduced)} ids outside GLIDE's draft vocabulary have zero head rows and are "
            "listed as suppress_tokens in generation_config.json, which vLLM's Gemma 4 MTP model sets to -inf"
            if reduced
            else None
        ),
        "approximations": (
            ["ids outside the draft vocabulary are read with the target's own embedding rows, not GLIDE's shared row"]
            if reduced
            else []
        ),
        "serve": {
            "speculative_config": {"method": "mtp", "model": str(output_dir), "num_speculative_tokens": 3},
            "target": "a copy of the target's directory whose config.json is target_config.json",
        },
    }
    if reduced is not None:  # vLLM sets these draft logits to -inf: drafts stay in GLIDE's vocabulary
        generation["suppress_tokens"] = sorted(set(range(config.vocab_size)) - set(reduced))
    files = {"generation_config.json": generation, "export.json": notes}
    if target_config is not None:
        files["target_config.json"] = target_config_for_serving(target_config)
    for name, data in files.items():
        (output_dir / name).write_text(json.dumps(data, indent=1) + "\n")
    return output_dir
