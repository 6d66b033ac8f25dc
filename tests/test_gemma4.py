"""Gemma 4 targets (KV-shared layers, per-layer inputs, sliding and full layer types) and Gemma 4's assistant drafters
in the loop, on tiny random configs.

transformers 5.23 needs two workarounds to build the tiny pair: the assistant's
all-shared text config raises in ``kv_sharing_modes`` (patched here to report every layer ``"reuse"``), and a KV-shared
target needs ``hidden_size_per_layer_input > 0``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
from transformers.models.gemma4_assistant.configuration_gemma4_assistant import Gemma4AssistantConfig
from transformers.models.gemma4_assistant.modeling_gemma4_assistant import Gemma4AssistantForCausalLM

from conftest import VOCAB, OracleDrafter, greedy_reference
from hf_specdraft import CapeCandidateGenerator, GlideConfig, speculative_generate
from hf_specdraft.core.drafting import DraftModelCandidateGenerator
from hf_specdraft.core.state_drafting import StateReadingDrafter

TYPES = ["sliding_attention", "full_attention"]


def text_config(window: int, **overrides) -> Gemma4TextConfig:
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=16,
        sliding_window=window,
        max_position_embeddings=256,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    return Gemma4TextConfig(**{**common, **overrides})


def gemma4_target(window: int = 8, seed: int = 0):
    """4 layers, sliding and full in turn, the last two reading the first two's KV (a DummyLayer in the cache)."""
    torch.manual_seed(seed)
    config = text_config(
        window,
        num_hidden_layers=4,
        layer_types=TYPES * 2,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB,
    )
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture
def assistant(monkeypatch):
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
    torch.manual_seed(1)
    config = Gemma4AssistantConfig(
        text_config=text_config(
            8, num_hidden_layers=2, layer_types=TYPES, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0
        ),
        backbone_hidden_size=32,
    )
    model = Gemma4AssistantForCausalLM(config).eval()
    model.generation_config.num_assistant_tokens = 3  # None by default; transformers' own loop calls int() on it
    return model


def prompt(batch: int = 1, length: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_the_target_caches_kv_shared_layers_as_dummies():
    from transformers import DynamicCache

    names = [type(layer).__name__ for layer in DynamicCache(config=gemma4_target().config).layers]
    assert names == ["DynamicSlidingWindowLayer", "DynamicLayer", "DummyLayer", "DummyLayer"]


@pytest.mark.parametrize("mode", ["right", "wrong", "tree"])
@pytest.mark.parametrize("static", [False, True])
def test_gemma4_target_is_lossless_past_its_window(mode, static, one_thread):
    target = gemma4_target(window=8)
    x = prompt()
    reference = greedy_reference(target, x, 24)  # 36 tokens: several windows
    kwargs = {"cache_implementation": "static"} if static else {}
    out = speculative_generate(
        target, x, candidate_generator=OracleDrafter(reference, mode), max_new_tokens=24, **kwargs
    )
    assert torch.equal(out, reference)


@pytest.mark.parametrize("static", [False, True])
def test_gemma4_target_in_a_padded_batch(static, one_thread):
    target = gemma4_target(window=64 if not static else 8)  # a DynamicCache batch stays within one window
    prompts = [prompt(1, n, seed=n) for n in (12, 7)]
    references = [greedy_reference(target, p, 14) for p in prompts]
    x, mask = torch.zeros(2, 12, dtype=torch.long), torch.zeros(2, 12, dtype=torch.long)
    for r, p in enumerate(prompts):
        x[r, 12 - p.shape[1] :], mask[r, 12 - p.shape[1] :] = p[0], 1
    kwargs = {"cache_implementation": "static"} if static else {}
    out = speculative_generate(
        target,
        x,
        attention_mask=mask,
        candidate_generator=[OracleDrafter(ref, "tree") for ref in references],
        max_new_tokens=14,
        pad_token_id=0,
        **kwargs,
    )
    for r, (p, ref) in enumerate(zip(prompts, references)):
        assert torch.equal(out[r, 12 - p.shape[1] :][: ref.shape[1]], ref[0])


def test_gemma4_target_with_a_draft_model_and_cape(one_thread):
    target = gemma4_target()
    torch.manual_seed(2)
    draft = AutoModelForCausalLM.from_config(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
        )
    ).eval()
    x = prompt()
    reference = greedy_reference(target, x, 20)
    for kwargs in ({}, {"cache_implementation": "static"}):
        assert torch.equal(speculative_generate(target, x, draft_model=draft, max_new_tokens=20, **kwargs), reference)
    cape = CapeCandidateGenerator(DraftModelCandidateGenerator(draft))
    assert torch.equal(speculative_generate(target, x, candidate_generator=cape, max_new_tokens=20), reference)


def test_glide_refuses_a_gemma4_target_by_name():
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        GlideConfig.from_target_config(gemma4_target().config, hidden_size=32)


@pytest.mark.parametrize(
    "kwargs", [{}, {"cache_implementation": "static"}, {"num_draft_tokens": 3}], ids=["auto", "static", "fixed"]
)
def test_assistant_through_draft_model_is_lossless(assistant, kwargs, one_thread):
    target = gemma4_target()
    x = prompt()
    reference = greedy_reference(target, x, 20)
    # transformers' own loop agrees
    assert torch.equal(greedy_reference(target, x, 20, assistant_model=assistant), reference)
    out = speculative_generate(
        target, x, draft_model=assistant, max_new_tokens=20, return_dict_in_generate=True, **kwargs
    )
    assert torch.equal(out.sequences, reference)
    stats = out.speculative_stats
    assert stats.drafter_calls.get("draft", 0) > 0  # it drafted, not only the target
    assert sum(step.emitted for step in stats.steps) == 20


def test_assistant_in_a_batch_through_generate(assistant, one_thread):
    target = gemma4_target()
    x = prompt(2, 10, seed=4)
    out = target.generate(
        x,
        custom_generate=speculative_generate,
        draft_model=assistant,
        max_new_tokens=14,
        do_sample=False,
        cache_implementation="static",
    )
    for r in range(2):
        assert torch.equal(out[r : r + 1], greedy_reference(target, x[r : r + 1], 14))


def test_cape_expands_the_assistants_chain(assistant, one_thread):
    target = gemma4_target()
    x = prompt()
    reference = greedy_reference(target, x, 20)
    cape = CapeCandidateGenerator(StateReadingDrafter(assistant, num_draft_tokens=3))
    out = speculative_generate(target, x, candidate_generator=cape, max_new_tokens=20, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference)
    assert max(step.tree_size for step in out.speculative_stats.steps) > 3  # expansion sets widened the chain
    with pytest.raises(ValueError, match="mode='beam'.*needs a draft model"):
        CapeCandidateGenerator(StateReadingDrafter(assistant), mode="beam")


def test_assistant_under_sampling_runs(assistant, one_thread):
    """The assistant drafts its argmax: under sampling it hands no q, and the target samples each position itself."""
    target = gemma4_target()
    torch.manual_seed(0)
    out = speculative_generate(target, prompt(), draft_model=assistant, max_new_tokens=12, do_sample=True)
    assert out.shape == (1, 24)


def test_transformers_gemma4_generator_as_a_candidate_generator(assistant, one_thread):
    """transformers' own SinglePositionMultiTokenCandidateGenerator, unchanged: it asks for every hidden state and the
    shared keys and values; the loop serves the latter from the cache it kept (never a rejected node's)."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

    target = gemma4_target()
    x = prompt()
    reference = greedy_reference(target, x, 20)
    for kwargs in ({}, {"cache_implementation": "static"}):
        generator = SinglePositionMultiTokenCandidateGenerator(
            assistant, target.get_input_embeddings(), GenerationConfig(max_length=reference.shape[1])
        )
        out = speculative_generate(
            target, x, candidate_generator=generator, max_new_tokens=20, return_dict_in_generate=True, **kwargs
        )
        assert torch.equal(out.sequences, reference)
        assert max(step.drafted for step in out.speculative_stats.steps) == 3  # it drafted its num_assistant_tokens


def test_shared_keys_and_values_need_a_target_with_layer_types():
    from conftest import OracleDrafter as Oracle

    class AsksShared(Oracle):
        requires_model_outputs = True
        model_kwargs_overrides = {"return_shared_kv_states": True}

    from conftest import tiny_model

    llama = tiny_model("llama")
    x = prompt()
    with pytest.raises(ValueError, match="names no layer_types"):
        speculative_generate(llama, x, candidate_generator=AsksShared(greedy_reference(llama, x, 4)), max_new_tokens=4)
