"""GLIDE (GLIDE with a CAPE §4.1): lossless drafting through stock assisted decoding and speculative_generate,
the glimpse really reads the target's KV cache, trust_remote_code checkpoints, and clear errors."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, GenerationConfig, LlamaConfig

from conftest import ARCHITECTURES, VOCAB, greedy_reference, run_without_hf_specdraft, tiny_model
from hf_specdraft.core.support import with_cache
from hf_specdraft import speculative_generate, speculative_sampling
from hf_specdraft.glide import (
    GlideCandidateGenerator,
    GlideConfig,
    GlideForCausalLM,
    GlideTrainingArguments,
    register_auto_classes,
    train_glide,
)
from test_sampling import P_VALUE, chi_square_p


pytestmark = pytest.mark.usefixtures("one_thread")


def make_glide(target, seed: int = 1, **overrides) -> GlideForCausalLM:
    torch.manual_seed(seed)
    config = GlideConfig.from_target_config(target.config, hidden_size=32, **overrides)
    return GlideForCausalLM(config).eval()


def briefly_trained_glide(target, output_dir, custom_generate=None) -> GlideForCausalLM:
    """GLIDE trained for 60 steps (< 1 s) on the target's own greedy text: drafts get accepted as well as rejected."""
    glide = make_glide(target)
    with torch.no_grad():
        text = target.generate(prompt(4 * 16, seed=2).view(16, 4), max_new_tokens=40, do_sample=False)
    train_glide(
        target,
        glide,
        text,
        GlideTrainingArguments(
            output_dir=str(output_dir),
            max_steps=60,
            seq_len=24,
            per_device_batch_size=8,
            learning_rate=1e-2,
            warmup_steps=3,
            progress_bar=False,
        ),
        custom_generate=custom_generate,
    )
    return glide.eval()


def prompt(length: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def target_cache(target, input_ids) -> DynamicCache:
    """The target's cache as the loop holds it at drafting time: covering ``input_ids[:, :-1]``."""
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids[:, :-1], **with_cache(target, cache), use_cache=True)
    return cache


# --- lossless greedy decoding ---------------------------------------------------------------------------


@pytest.mark.parametrize("trained", [False, True], ids=["random", "trained"])
def test_stock_assisted_generate_greedy_matches_target(arch, trained, tmp_path):
    target = tiny_model(arch)
    glide = (briefly_trained_glide(target, tmp_path) if trained else make_glide(target)).attach(target)
    try:
        for length in (1, 7):
            x = prompt(length)
            expected = greedy_reference(target, x, 20)
            assert torch.equal(target.generate(x, assistant_model=glide, max_new_tokens=20, do_sample=False), expected)
    finally:
        glide.detach()


@pytest.mark.parametrize("trained", [False, True], ids=["random", "trained"])
def test_speculative_generate_greedy_matches_target(arch, trained, tmp_path):
    target = tiny_model(arch)
    glide = briefly_trained_glide(target, tmp_path) if trained else make_glide(target)
    x = prompt(7, seed=1)
    generator = GlideCandidateGenerator(glide, num_draft_tokens=4)
    out = speculative_generate(
        target, x, candidate_generator=generator, max_new_tokens=20, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, greedy_reference(target, x, 20))
    accepted = sum(step.accepted for step in out.speculative_stats.steps)
    if trained:  # accepted drafts exercise GLIDE's cache re-sync on a common prefix longer than the old text
        assert accepted > 0


def test_stock_assisted_generate_sampling_runs():
    target = tiny_model("llama")
    glide = make_glide(target).attach(target)
    torch.manual_seed(0)
    out = target.generate(prompt(5), assistant_model=glide, max_new_tokens=12, do_sample=True, temperature=0.8)
    glide.detach()
    assert out.shape == (1, 17) and int(out.max()) < VOCAB


def test_vanilla_drafter_is_lossless_and_has_no_cross_attention():
    target = tiny_model("qwen2")
    vanilla = make_glide(target, cross_attention=False)
    glide = make_glide(target)
    assert not any("cross_attn" in name for name, _ in vanilla.named_parameters())
    assert sum(p.numel() for p in vanilla.parameters()) < sum(p.numel() for p in glide.parameters())
    x = prompt(6, seed=2)
    expected = greedy_reference(target, x, 16)
    # no attach needed
    assert torch.equal(target.generate(x, assistant_model=vanilla, max_new_tokens=16, do_sample=False), expected)
    out = speculative_generate(
        target, x, candidate_generator=GlideCandidateGenerator(vanilla, num_draft_tokens=3), max_new_tokens=16
    )
    assert torch.equal(out, expected)


# --- speculative sampling --------------------------------------------------------------------------------


def test_speculative_sampling_with_glide_drafts_samples_from_target():
    """First emitted token of a γ=2 GLIDE step, accepted by Leviathan et al.'s rule, is distributed as p.

    GLIDE's own sampling must follow the q it reports (checked directly), and accepting its first token
    without the rule (distributed as q) must fail the same test.
    """
    V, temperature = 8, 1.3
    target = tiny_model(vocab_size=V, seed=0, initializer_range=0.3)  # peaked p, so p and q differ clearly
    glide = make_glide(target, seed=3, initializer_range=0.3)
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        p0 = torch.softmax(target(x).logits[0, -1] / temperature, -1)
        p1 = torch.softmax(
            target(torch.cat([x.repeat(V, 1), torch.arange(V)[:, None]], 1)).logits[:, -1] / temperature, -1
        )
        pairs = torch.cartesian_prod(torch.arange(V), torch.arange(V))
        p2 = torch.softmax(target(torch.cat([x.repeat(V * V, 1), pairs], 1)).logits[:, -1] / temperature, -1).view(
            V, V, V
        )
    cache = target_cache(target, x)
    generator = GlideCandidateGenerator(glide, num_draft_tokens=2)
    generator.prepare(target, GenerationConfig(do_sample=True, temperature=temperature, top_k=0))
    emitted, drafted = torch.zeros(V), torch.zeros(V)
    torch.manual_seed(0)
    for _ in range(1500):
        tree = generator.propose(x, cache)
        d1, d2 = tree.tokens.tolist()
        n, bonus = speculative_sampling(torch.stack([p0, p1[d1], p2[d1, d2]]), tree.draft_probs, tree.tokens)
        emitted[d1 if n >= 1 else bonus] += 1
        drafted[d1] += 1
    assert cache.get_seq_length() == 2, "the drafter must not write to the target cache"
    assert chi_square_p(drafted, tree.draft_probs[0]) > P_VALUE  # GLIDE samples from the q it reports
    assert chi_square_p(emitted, p0) > P_VALUE
    assert chi_square_p(drafted, p0) < P_VALUE


# --- the glimpse -----------------------------------------------------------------------------------------


def test_cross_attention_reads_the_target_cache():
    target = tiny_model("llama", num_hidden_layers=3)
    glide = make_glide(target)
    assert glide.config.target_layer_ids == [2]  # N_T - N_D + m
    x = prompt(9, seed=4)
    cache = target_cache(target, x)
    with torch.no_grad():
        base = glide(x, target_past_key_values=cache).logits
        other_layer = target_cache(target, x)
        other_layer.layers[0].keys.normal_()
        assert torch.allclose(glide(x, target_past_key_values=other_layer).logits, base)
        last_key = target_cache(target, x)
        last_key.layers[2].keys[:, :, -1].normal_()  # position 7: visible to queries at positions >= 8 only
        changed = (glide(x, target_past_key_values=last_key).logits - base).abs().amax(-1)[0]
        assert torch.all(changed[:8] == 0) and changed[8] > 1e-4
        assert not torch.allclose(glide(x, target_past_key_values=DynamicCache()).logits, base)


def test_block_mask_hides_the_current_block():
    """Training mask (§4.1): a query in block b sees target KV of blocks < b only."""
    target = tiny_model("mistral")
    glide = make_glide(target)
    x = prompt(15, seed=5)
    # KV for all 15
    kv = [(layer.keys, layer.values) for layer in target_cache(target, torch.cat([x, x[:, :1]], 1)).layers]
    with torch.no_grad():
        base = glide(x, target_past_key_values=kv, cross_attention_block_size=5).logits
        keys = kv[1][0].clone()
        keys[:, :, 7].normal_()  # block 1
        changed = (
            (glide(x, target_past_key_values=[kv[0], (keys, kv[1][1])], cross_attention_block_size=5).logits - base)
            .abs()
            .amax(-1)[0]
        )
    assert torch.all(changed[:10] == 0) and torch.all(changed[10:] > 1e-5)


def test_vanilla_ignores_the_target_cache():
    target = tiny_model("llama")
    vanilla = make_glide(target, cross_attention=False)
    x = prompt(8, seed=6)
    with torch.no_grad():
        assert torch.equal(vanilla(x).logits, vanilla(x, target_past_key_values=target_cache(target, x)).logits)


def test_queries_use_the_targets_rotary_settings():
    target = tiny_model("qwen2", rope_parameters={"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0})
    glide = make_glide(target)
    assert glide.config.target_rope_parameters["rope_theta"] == 50000.0
    torch.testing.assert_close(glide.model.target_rotary_emb.inv_freq, target.model.rotary_emb.inv_freq)
    x = torch.arange(6)[None]
    torch.testing.assert_close(
        glide.model.target_rotary_emb(torch.zeros(1), x), target.model.rotary_emb(torch.zeros(1), x)
    )


# --- configuration ---------------------------------------------------------------------------------------


def test_config_records_the_target_and_maps_top_layers():
    target = tiny_model("mistral", num_hidden_layers=4)
    config = GlideConfig.from_target_config(target.config, num_hidden_layers=2, hidden_size=32)
    assert config.target_layer_ids == [2, 3]
    assert (
        config.target_model_type,
        config.target_num_hidden_layers,
        config.target_num_key_value_heads,
        config.target_head_dim,
        config.target_vocab_size,
    ) == ("mistral", 4, 2, 8, VOCAB)
    assert config.target_mismatches(target.config) == []
    custom = GlideConfig.from_target_config(target.config, hidden_size=32, target_layer_ids=[1])
    assert custom.target_layer_ids == [1]


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"target_layer_ids": [0, 1]}, "target_layer_ids"),
        ({"target_layer_ids": [7]}, "target_layer_ids"),
        ({"vocab_size": 10, "target_vocab_size": 11}, "vocab_size"),
        ({"target_num_attention_heads": 4, "target_num_key_value_heads": 3}, "target_num_attention_heads"),
        ({"block_size": 0}, "block_size"),
    ],
)
def test_config_rejects_bad_arguments(kwargs, argument):
    base = dict(
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_attention_heads=2,
        target_num_hidden_layers=2,
        target_hidden_size=8,
        target_num_attention_heads=2,
    )
    with pytest.raises(ValueError, match=argument):
        GlideConfig(**{**base, **kwargs})


def test_from_target_config_rejects_unsupported_targets():
    with pytest.raises(TypeError, match="target_config"):
        GlideConfig.from_target_config({"hidden_size": 4})
    partial = LlamaConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    )
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        GlideConfig.from_target_config(partial, hidden_size=32)
    with pytest.raises(ValueError, match="num_attention_heads"):
        GlideConfig.from_target_config(tiny_model("llama").config, hidden_size=36)


# --- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch, overrides, field",
    [
        ("llama", {"num_hidden_layers": 3}, "num_hidden_layers"),
        ("llama", {"num_key_value_heads": 4}, "num_key_value_heads"),
        ("llama", {"vocab_size": 97}, "vocab_size"),
        ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}, "rope_parameters"),
        ("qwen2", {}, "model_type"),
    ],
)
def test_mismatched_target_is_rejected(arch, overrides, field):
    glide = make_glide(tiny_model("llama"))
    other = tiny_model(arch, **overrides)
    with pytest.raises(ValueError, match=field):
        glide.attach(other)
    with pytest.raises(ValueError, match=field):
        speculative_generate(other, prompt(4), candidate_generator=GlideCandidateGenerator(glide), max_new_tokens=4)


def test_generate_without_attached_target_fails():
    target = tiny_model("llama")
    glide = make_glide(target)
    with pytest.raises(ValueError, match="no target attached"):
        target.generate(prompt(4), assistant_model=glide, max_new_tokens=8)
    hooks = len(target._forward_pre_hooks)
    glide.attach(target)
    assert len(target._forward_pre_hooks) == hooks + 1 and glide.attached_target is target
    glide.detach()
    assert len(target._forward_pre_hooks) == hooks and glide.attached_target is None
    with pytest.raises(ValueError, match="no target attached"):
        glide(prompt(4))


def test_generate_on_a_model_other_than_the_attached_one_fails():
    target, twin = tiny_model("llama", seed=0), tiny_model("llama", seed=5)
    glide = make_glide(target).attach(target)
    with pytest.raises(ValueError, match="attach"):
        twin.generate(prompt(6), assistant_model=glide, max_new_tokens=12, do_sample=False)
    glide.detach()


class _LinearAttentionLayer:
    """A cache layer with no keys/values (as a linear-attention or recurrent layer would be)."""

    is_initialized = True


def test_unreadable_target_cache_is_rejected():
    target = tiny_model("llama")
    glide = make_glide(target)
    generator = GlideCandidateGenerator(glide)
    generator.prepare(target, GenerationConfig())
    x = prompt(5)
    with pytest.raises(ValueError, match="target_cache is None"):
        generator.propose(x, None)
    cache = DynamicCache()
    cache.layers = [_LinearAttentionLayer(), _LinearAttentionLayer()]
    with pytest.raises(ValueError, match="no readable keys"):
        generator.propose(x, cache)
    wrong = [(torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8))] * 2  # 3 KV heads, the target has 2
    with pytest.raises(ValueError, match="target_cache"):
        generator.propose(x, wrong)
    with pytest.raises(TypeError, match="glide"):
        GlideCandidateGenerator(target)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        GlideCandidateGenerator(glide, num_draft_tokens=0)


# --- checkpoints -----------------------------------------------------------------------------------------

FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys, torch
    import inspect
    from transformers import AutoModelForCausalLM, DynamicCache
    result = {}
    try:
        import hf_specdraft  # noqa: F401
        result["hf_specdraft_importable"] = True
    except ImportError:
        result["hf_specdraft_importable"] = False
    try:
        AutoModelForCausalLM.from_pretrained("glide")  # no trust_remote_code: must refuse
        result["without_flag"] = "loaded"
    except ValueError as error:
        result["without_flag"] = "ValueError: " + str(error)
    glide = AutoModelForCausalLM.from_pretrained("glide", trust_remote_code=True).eval()
    target = AutoModelForCausalLM.from_pretrained("target").eval()
    x = torch.load("inputs.pt")
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        # the cache argument's name: cache= from transformers 5.24 on, past_key_values= before
        name = "cache" if "cache" in inspect.signature(type(target).forward).parameters else "past_key_values"
        target(x[:, :-1], **{name: cache})
        logits = glide(x, target_past_key_values=cache).logits
    result["class"] = type(glide).__module__ + "." + type(glide).__name__
    result["max_logit_diff"] = float((logits - torch.load("logits.pt")).abs().max())
    glide.attach(target)
    out = target.generate(x, assistant_model=glide, max_new_tokens=12, do_sample=False)
    result["assisted_equals_greedy"] = bool(torch.equal(out, target.generate(x, max_new_tokens=12, do_sample=False)))
    print("RESULT " + json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def fresh_process_result(tmp_path_factory):
    """Save GLIDE + a stock target, then load both in a new Python where hf_specdraft cannot be imported."""
    root = tmp_path_factory.mktemp("remote_code")
    torch.set_num_threads(1)
    target = tiny_model("llama")
    glide = make_glide(target)
    glide.save_pretrained(root / "glide")
    target.save_pretrained(root / "target")
    x = prompt(8, seed=7)
    with torch.no_grad():
        torch.save(glide(x, target_past_key_values=target_cache(target, x)).logits, root / "logits.pt")
    torch.save(x, root / "inputs.pt")
    (root / "check.py").write_text(FRESH_PROCESS)
    # a fresh process under a 15-worker parallel run took > 120 s
    done = run_without_hf_specdraft(root, "check.py", timeout=600)
    files = sorted(p.name for p in (root / "glide").iterdir())
    return (
        json.loads(done.stdout.rsplit("RESULT ", 1)[1]),
        files,
        json.loads((root / "glide" / "config.json").read_text()),
    )


def test_checkpoint_is_hub_ready(fresh_process_result):
    _, files, config = fresh_process_result
    assert {
        "config.json",
        "model.safetensors",
        "modeling_glide.py",
        "configuration_glide.py",
        "target_binding.py",
    } <= set(files)
    assert config["auto_map"] == {
        "AutoConfig": "configuration_glide.GlideConfig",
        "AutoModelForCausalLM": "modeling_glide.GlideForCausalLM",
    }


def test_trust_remote_code_round_trip_in_fresh_process(fresh_process_result):
    result, _, _ = fresh_process_result
    assert result["hf_specdraft_importable"] is False
    assert result["class"].startswith("transformers_modules.") and result["class"].endswith("GlideForCausalLM")
    assert result["max_logit_diff"] < 1e-5
    assert result["assisted_equals_greedy"] is True


def test_loading_without_trust_remote_code_fails(fresh_process_result):
    result, _, _ = fresh_process_result
    assert result["without_flag"].startswith("ValueError") and "trust_remote_code" in result["without_flag"]


def test_registered_auto_classes_load_without_the_flag(tmp_path):
    target = tiny_model("llama")
    glide = make_glide(target)
    glide.save_pretrained(tmp_path)
    register_auto_classes()
    assert isinstance(AutoConfig.from_pretrained(tmp_path), GlideConfig)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is GlideForCausalLM
    x = prompt(6)
    cache = target_cache(target, x)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(x, target_past_key_values=cache).logits, glide(x, target_past_key_values=cache).logits
        )


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_glide_candidate_generator_keeps_its_cache_in_sync(arch):
    """After a step, GLIDE's own cache covers the accepted text (+ drafted tokens) and never the target's."""
    target = tiny_model(arch)
    glide = make_glide(target)
    generator = GlideCandidateGenerator(glide, num_draft_tokens=3)
    out = speculative_generate(target, prompt(5, seed=8), candidate_generator=generator, max_new_tokens=9)
    assert generator.cache.get_seq_length() == generator.seen.numel() <= out.shape[1] + 2


def test_eager_and_sdpa_attention_agree():
    """Both kernels get the same float masks (a bool mask is silently wrong with eager attention)."""
    target = tiny_model("llama")
    glide = make_glide(target)
    eager = make_glide(target)
    eager.set_attn_implementation("eager")
    assert eager.config._attn_implementation == "eager" and glide.config._attn_implementation == "sdpa"
    x = prompt(9, seed=9)
    cache = target_cache(target, x)
    with torch.no_grad():
        own_sdpa, own_eager = DynamicCache(config=glide.config), DynamicCache(config=eager.config)
        for chunk in (x[:, :6], x[:, 6:8], x[:, 8:]):  # prefill, a 2-token refeed on a cache, a single step
            a = glide(chunk, past_key_values=own_sdpa, target_past_key_values=cache).logits
            b = eager(chunk, past_key_values=own_eager, target_past_key_values=cache).logits
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        full = glide(x, target_past_key_values=cache).logits[:, -1]
    torch.testing.assert_close(a[:, -1], full, atol=1e-5, rtol=1e-5)


# --- GLIDE under CAPE's modes (Du et al. 2024, §4.2, §5.3-5.4) ------------------------------------------


@pytest.mark.parametrize("mode", ["confidence", "fixed", "beam"])
def test_glide_with_every_cape_mode_is_lossless(arch, mode, tmp_path):
    from hf_specdraft.cape import build_cape_for_bench

    target = tiny_model(arch)
    glide = briefly_trained_glide(target, tmp_path)
    x = prompt(7, seed=1)
    drafter = build_cape_for_bench(GlideCandidateGenerator(glide, num_draft_tokens=4), mode=mode)
    out = speculative_generate(target, x, candidate_generator=drafter, max_new_tokens=20, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy_reference(target, x, 20))
    assert sum(step.accepted for step in out.speculative_stats.steps) > 0
    if mode == "beam":  # one prefix forward + one per further depth, each over the whole beam
        assert out.speculative_stats.drafter_calls["draft"] <= out.speculative_stats.num_steps * 4
        assert max(len(sizes) for sizes in drafter.expansion_sizes) > 1


def test_glide_tree_scorer_equals_chain_drafting():
    """q of each beam node equals GLIDE's q for that path drafted as a chain: tree mask, positions and glimpse agree."""
    from hf_specdraft.cape import CapeCandidateGenerator

    target = tiny_model("llama")
    glide = make_glide(target)
    x = prompt(6, seed=3)
    cache = target_cache(target, x)
    scorer = CapeCandidateGenerator(GlideCandidateGenerator(glide, num_draft_tokens=3), mode="beam").scorer
    scorer.reset()
    q_root = scorer.start(x, cache)
    q_level1 = scorer.extend(torch.tensor([5, 9]), torch.tensor([-1, -1]))
    q_level2 = scorer.extend(torch.tensor([11]), torch.tensor([-1, -1, 1]))
    scorer.finish()
    assert scorer.cache.get_seq_length() == x.shape[1]
    for path, q in (([], q_root[0]), ([5], q_level1[0]), ([9], q_level1[1]), ([9, 11], q_level2[0])):
        ids = torch.cat([x, torch.tensor([path], dtype=torch.long)], dim=1) if path else x
        with torch.no_grad():
            expected = torch.softmax(glide(ids, target_past_key_values=cache).logits[0, -1].float(), -1)
        torch.testing.assert_close(q, expected, atol=1e-5, rtol=1e-4)


def test_glide_tree_scorer_needs_the_target_cache():
    from hf_specdraft.cape import CapeCandidateGenerator

    target = tiny_model("llama")
    scorer = CapeCandidateGenerator(GlideCandidateGenerator(make_glide(target), num_draft_tokens=3), mode="beam").scorer
    with pytest.raises(ValueError, match="target_cache is None"):
        scorer.start(prompt(4), None)


def test_stock_rounds_of_a_two_layer_glide_match_the_explicit_drafter():
    """Stock assisted decoding drafts its first round without a glimpse (the target has not run); GLIDE then
    rebuilds its own cache, so from the second round on its candidates equal the explicit drafter's on the same text
    (the first round accepts no draft here, so both hold the same glimpsed keys and values)."""
    target = tiny_model()
    glide = make_glide(target, num_hidden_layers=2).attach(target)
    glide.generation_config.num_assistant_tokens, glide.generation_config.num_assistant_tokens_schedule = 4, "constant"
    glide.generation_config.assistant_confidence_threshold = 0.0
    rounds, stock_generate = [], glide.generate

    def recording_generate(*args, **kwargs):
        out = stock_generate(*args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        sequences = out.sequences if hasattr(out, "sequences") else out
        rounds.append((ids.clone(), sequences[0, ids.shape[1] :].clone()))
        return out

    glide.generate = recording_generate
    x = prompt(9, seed=4)
    assert torch.equal(
        target.generate(x, assistant_model=glide, max_new_tokens=24, do_sample=False), greedy_reference(target, x, 24)
    )
    assert rounds[1][0].shape[1] == x.shape[1] + 1, "the first round accepted a draft: pick another prompt"
    explicit = GlideCandidateGenerator(glide, num_draft_tokens=4, copy_from_context=0)
    explicit.prepare(target, GenerationConfig(do_sample=False))
    for ids, stock in rounds[1:]:
        drafted = explicit.propose(ids, target_cache(target, ids)).tokens
        assert torch.equal(stock, drafted[: stock.numel()])
    assert len(rounds) > 5


def test_stock_assisted_two_layer_glide_is_lossless(arch):
    """The rebuilt cache (second round) changes only what GLIDE drafts: greedy output stays the target's."""
    target = tiny_model(arch)
    glide = make_glide(target, num_hidden_layers=2).attach(target)
    x = prompt(7, seed=5)
    assert torch.equal(
        target.generate(x, assistant_model=glide, max_new_tokens=20, do_sample=False), greedy_reference(target, x, 20)
    )
