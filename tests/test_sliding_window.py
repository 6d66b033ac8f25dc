"""Targets with sliding-window (and chunked) attention, lossless before, at and far past the window.

Tiny targets with a 16-token window: Mistral (every layer sliding, one mask tensor), Qwen2 with
``use_sliding_window`` / ``max_window_layers`` (full layers first), Gemma 2 and Gemma 3 text (local / global
layers), Cohere2, and Llama 4 text (chunked attention: a query sees only its own 16-token chunk). Prompts shorter
than, equal to and three times the window; 40 new tokens. Greedy output of speculative_generate must equal
``target.generate(do_sample=False)`` for an always-right chain, an always-wrong one and a hand-drawn tree (its
accepted path is never the first child, so compaction gathers), and for every method's drafter on three of them.
A mask without the window fails these tests (checked by hand when written: the tree runs diverge).
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Cohere2Config,
    Gemma2Config,
    Gemma3TextConfig,
    Llama4TextConfig,
    MistralConfig,
    Qwen2Config,
)

from conftest import VOCAB, OracleDrafter
from hf_specdraft.core.support import output_cache
from hf_specdraft import speculative_generate
from hf_specdraft.cape import CapeCandidateGenerator
from hf_specdraft.cascade import CascadeCandidateGenerator, MaxGramCandidateGenerator
from hf_specdraft.casd import CasdCandidateGenerator
from hf_specdraft.core.drafting import DraftModelCandidateGenerator
from hf_specdraft.glide import GlideCandidateGenerator, GlideConfig, GlideForCausalLM
from hf_specdraft.core.cache import croppable_cache

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOW = 16
NEW_TOKENS = 40
LENGTHS = (5, WINDOW, 3 * WINDOW + 3)
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=512,
    eos_token_id=None,
    bos_token_id=None,
    pad_token_id=None,
)


def windowed_config(arch: str, **overrides):
    common = {**COMMON, **overrides}
    if arch == "mistral":
        return MistralConfig(sliding_window=WINDOW, **common)
    if arch == "qwen2":
        return Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2, **common)
    if arch == "gemma2":
        return Gemma2Config(sliding_window=WINDOW, head_dim=8, **common)
    if arch == "gemma3":
        # local and global layers alternate (Gemma 3 itself: five local, one global)
        layers = common["num_hidden_layers"]
        return Gemma3TextConfig(
            sliding_window=WINDOW,
            head_dim=8,
            layer_types=(["sliding_attention", "full_attention"] * layers)[:layers],
            **common,
        )
    if arch == "cohere2":
        return Cohere2Config(sliding_window=WINDOW, **common)
    if arch == "llama4":
        return Llama4TextConfig(
            attention_chunk_size=WINDOW, head_dim=8, intermediate_size_mlp=64, num_local_experts=1, **common
        )
    raise ValueError(arch)


def windowed_model(arch: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    attention = "eager" if arch == "gemma2" else "sdpa"  # Gemma 2 has no SDPA path in transformers 5.23
    return AutoModelForCausalLM.from_config(windowed_config(arch, **overrides), attn_implementation=attention).eval()


def prompt(length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma2", "gemma3", "cohere2", "llama4"])
def test_oracle_drafts_before_at_and_past_the_window(arch):
    target = windowed_model(arch)
    for length in LENGTHS:
        x = prompt(length)
        reference = target.generate(x, max_new_tokens=NEW_TOKENS, do_sample=False)
        for mode in ("right", "wrong", "tree"):
            out = speculative_generate(
                target, x, candidate_generator=OracleDrafter(reference, mode), max_new_tokens=NEW_TOKENS
            )
            assert torch.equal(out, reference), (arch, length, mode)


def make_glide(target) -> GlideForCausalLM:
    torch.manual_seed(1)
    return GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).eval()


METHODS = {
    "draft model": lambda target, draft, x: DraftModelCandidateGenerator(draft, 3),
    "cape": lambda target, draft, x: CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 3)),
    "cape beam": lambda target, draft, x: CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 3), mode="beam"),
    "glide": lambda target, draft, x: GlideCandidateGenerator(make_glide(target), num_draft_tokens=3),
    "max-gram": lambda target, draft, x: MaxGramCandidateGenerator(),
    "cascade": lambda target, draft, x: CascadeCandidateGenerator([draft]),
    "casd": lambda target, draft, x: CasdCandidateGenerator(x[0, : x.shape[1] // 2]),
}


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma3"])
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_past_the_window(arch, method):
    """Drafts that are themselves sliding-window models crop their own cache back past their window."""
    target = windowed_model(arch)
    draft = windowed_model(arch, seed=3, num_hidden_layers=1)
    x = prompt(3 * WINDOW + 3)
    reference = target.generate(x, max_new_tokens=NEW_TOKENS, do_sample=False)
    out = speculative_generate(
        target, x, candidate_generator=METHODS[method](target, draft, x), max_new_tokens=NEW_TOKENS
    )
    assert torch.equal(out, reference)


def test_target_cache_stays_the_window_size():
    """Past recording keeps a rejected branch from pushing keys out; compaction trims back to window - 1."""
    target = windowed_model("gemma3")
    x = prompt(4 * WINDOW)
    reference = target.generate(x, max_new_tokens=NEW_TOKENS, do_sample=False)
    out = speculative_generate(
        target,
        x,
        candidate_generator=OracleDrafter(reference, "tree"),
        max_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, reference)
    lengths = {type(layer).__name__: layer.keys.shape[-2] for layer in output_cache(out).layers}
    assert lengths == {"DynamicSlidingWindowLayer": WINDOW - 1, "DynamicLayer": reference.shape[1] - 1}


def test_draft_cache_keeps_its_past():
    draft = windowed_model("gemma3", num_hidden_layers=2)
    assert [type(layer).__name__ for layer in croppable_cache(draft).layers] == ["DynamicLayer", "DynamicLayer"]


@pytest.mark.slow  # ~10 s: 1,500 draws
def test_sampling_past_the_window_stays_exact():
    """Speculative sampling on a windowed target three windows in: the first two tokens follow the target's joint
    distribution (chi-square, as tests/test_sampling.py does inside the window)."""
    from test_sampling import P_VALUE, first_two_p_value

    V = 8
    target = windowed_model("mistral", vocab_size=V)
    draft = windowed_model("mistral", seed=7, vocab_size=V, num_hidden_layers=1)
    x = torch.randint(0, V, (1, 3 * WINDOW), generator=torch.Generator().manual_seed(0))
    assert first_two_p_value(target, draft, x) > P_VALUE


def test_glide_reads_one_rope_per_layer_type():
    """Gemma 3 rotates local and global layers with different thetas: GLIDE takes the RoPE of the layer it reads,
    and refuses layers of two types (one RoPE for its queries)."""
    config = windowed_config("gemma3")
    config.rope_parameters["sliding_attention"]["rope_theta"] = 10_000.0
    config.rope_parameters["full_attention"]["rope_theta"] = 1_000_000.0
    # reads layer 3
    assert GlideConfig.from_target_config(config, hidden_size=32).target_rope_parameters["rope_theta"] == 1_000_000.0
    assert (
        GlideConfig.from_target_config(config, hidden_size=32, target_layer_ids=[2]).target_rope_parameters[
            "rope_theta"
        ]
        == 10_000.0
    )
    with pytest.raises(ValueError, match=r"target_layer_ids.*one type"):
        GlideConfig.from_target_config(config, hidden_size=32, num_hidden_layers=2)


def test_max_gram_and_casd_at_gemma3_scale():
    """Gemma 3's 262,144-token vocabulary with a 32K-token context: Max-Gram (with a full-size bigram table) finds
    the repeated text, CASD retrieves from a 32K-token context (ids above uint16)."""
    vocab = 262_144
    g = torch.Generator().manual_seed(0)
    block = torch.randint(0, vocab, (4096,), generator=g)
    text = torch.cat([block] * 8)[None]  # 32,768 tokens
    table = torch.randint(0, vocab, (vocab,), generator=g)
    max_gram = MaxGramCandidateGenerator(bigram_table=table)
    tree = max_gram.propose(text[:, :-100])
    assert tree.tokens.tolist() == text[0, -100:-90].tolist()
    context = torch.randint(0, vocab, (32_768,), generator=g)
    casd = CasdCandidateGenerator(context)
    tree = casd.propose(context[20_000:20_010][None])
    # one occurrence: one chain
    assert len(tree) >= 5 and tree.tokens.tolist() == context[20_010 : 20_010 + len(tree)].tolist()


def test_sliding_window_bench_pieces():
    """The benchmark's windowed copy keeps the weights (same output inside the window), its two cache designs give
    the same verification logits past the window, and the trimmed one is the smaller; its report section renders."""
    from conftest import tiny_model
    from benchmarks.report.render import sliding_window_section
    from benchmarks.studies.sliding_window import cache_bytes, main, prefilled, verify_tree, windowed_copy
    from hf_specdraft.core.tree import DraftTree

    llama = tiny_model("llama")
    windowed = windowed_copy(llama, window=8)
    x = prompt(30)
    with torch.no_grad():
        assert torch.allclose(windowed(x[:, :8]).logits, llama(x[:, :8]).logits, atol=1e-5)
        tree = DraftTree(torch.tensor([5, 6, 7, 8]), torch.tensor([-1, 0, -1, 2]))
        trimmed, full = prefilled(windowed, x, "trimmed"), prefilled(windowed, x, "full")
        assert cache_bytes(trimmed) < cache_bytes(full)
        assert torch.allclose(verify_tree(windowed, x, trimmed, tree), verify_tree(windowed, x, full, tree), atol=1e-5)
    result = {
        "meta": {
            "hardware": "CPU",
            "dtype": "float32",
            "repeats": 3,
            "command": "python -m benchmarks.studies.sliding_window",
        },
        "window": 8,
        "step_milliseconds": {"inside": {"chain": {"trimmed": 1.0, "full": 1.0, "no window": 1.0}}},
        "cache_bytes_at_4x_window": {"trimmed": 2**20, "full": 2**22},
        "end_to_end": {
            "prompt_tokens": 32,
            "new_tokens": 8,
            **dict.fromkeys(
                ("windowed", "no window"),
                {
                    "seconds": {"target-only": 2.0, "glide": 1.0},
                    "glide_speedup": 2.0,
                    "mean_accepted_length": 2.5,
                    "alpha": 0.5,
                    "identical_to_target": True,
                },
            ),
        },
    }
    assert "| windowed | 2.00 | 1.00 | 2.00× | 2.50 | 0.500 | yes |" in sliding_window_section(result)
    with pytest.raises(SystemExit):
        main(["--window", "1"])


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_shipped_cape_loop_past_the_window(arch):
    """The checkpoint-shipped CAPE ``custom_generate`` loop (the library's tree.py beside it) on a windowed target
    with a windowed draft, three windows in."""
    from hf_specdraft.cape.custom_generate.generate import generate as cape_generate

    target = windowed_model(arch)
    draft = windowed_model(arch, seed=3, num_hidden_layers=1)
    x = prompt(3 * WINDOW + 3)
    out = cape_generate(target, input_ids=x, assistant_model=draft, max_new_tokens=NEW_TOKENS, num_draft_tokens=3)
    assert torch.equal(out, target.generate(x, max_new_tokens=NEW_TOKENS, do_sample=False))
