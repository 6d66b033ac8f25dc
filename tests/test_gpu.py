"""Every method on CUDA: lossless in fp32, bf16's agreement with bf16 greedy, batch 4, sliding windows past
the window; and the static cache's CUDA graphs: recorded and replayed, never skipped, for chains, trees,
bf16, a ring past its wrap and a batch of four. Marked ``gpu`` (deselected by default, skipped without CUDA): run
``python -m pytest -q -m gpu`` on a machine with a GPU (benchmarks/gpu/run.sh first). CI is CPU-only.
"""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft import DraftModelCandidateGenerator, GlideCandidateGenerator, speculative_generate
from hf_specdraft.bench.timing import compile_counters, compiled_between
from benchmarks.studies.lossless import compare_greedy
from test_method_grid import METHODS, glide_for
from test_sliding_window import WINDOW, prompt, windowed_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


def on_cuda(method, target, x, dtype=torch.float32):
    """The method's drafter with every model it holds on the target's device and dtype."""
    source = tiny_model(target.config.model_type, seed=3, num_hidden_layers=1).to(CUDA, dtype)
    drafter = METHODS[method][0](target, source, x)
    for name in ("draft_model", "glide", "drafter", "drafts"):
        held = getattr(drafter, name, None)
        for model in held if isinstance(held, list) else [held]:
            if isinstance(model, torch.nn.Module):
                model.to(CUDA, dtype)
            elif model is not None and isinstance(getattr(model, "draft_model", None), torch.nn.Module):
                model.draft_model.to(CUDA, dtype)
            elif model is not None and isinstance(getattr(model, "glide", None), torch.nn.Module):
                model.glide.to(CUDA, dtype)
    return drafter


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_is_lossless_on_cuda_in_fp32(arch, method):
    target = tiny_model(arch).to(CUDA)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4)).to(CUDA)
    out = speculative_generate(target, x, candidate_generator=on_cuda(method, target, x), max_new_tokens=16)
    assert out.device.type == "cuda"
    assert torch.equal(out, greedy_reference(target, x, 16))


@pytest.mark.parametrize("method", ["draft-model", "glide", "glide+cape", "cascade"])
def test_bf16_agreement_with_bf16_greedy_is_reported(arch, method, record_property):
    target = tiny_model(arch).to(CUDA, torch.bfloat16)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5)).to(CUDA)
    out = speculative_generate(
        target, x, candidate_generator=on_cuda(method, target, x, torch.bfloat16), max_new_tokens=32
    )
    reference = greedy_reference(target, x, 32)
    agreement = float((out[0, 9:] == reference[0, 9:]).float().mean())  # a tree forward rounds otherwise than one token
    record_property("bf16_agreement", agreement)
    print(f"{arch} {method} bf16 agreement with bf16 greedy: {agreement:.3f}")
    assert agreement >= 0.5


def left_padded_batch(low: int):
    """Four prompts of 5, 9, 7 and 11 tokens (ids from ``low``), left-padded with 0: (rows, ids, attention mask)."""
    rows = [torch.randint(low, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 9, 7, 11)]
    width = max(r.numel() for r in rows)
    ids = torch.zeros(4, width, dtype=torch.long)
    mask = torch.zeros(4, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - r.numel() :], mask[i, width - r.numel() :] = r, 1
    return rows, ids, mask


def test_batch_of_four_on_cuda_equals_each_row_alone(arch):
    target = tiny_model(arch).to(CUDA)
    glide = glide_for(target).to(CUDA)
    rows, ids, mask = left_padded_batch(low=0)
    width = ids.shape[1]
    out = speculative_generate(
        target,
        ids.to(CUDA),
        attention_mask=mask.to(CUDA),
        candidate_generator=GlideCandidateGenerator(glide),
        max_new_tokens=12,
        pad_token_id=0,
        eos_token_id=None,
    )
    for i, r in enumerate(rows):
        alone = greedy_reference(target, r[None].to(CUDA), 12, eos_token_id=None)
        assert torch.equal(out[i, width:], alone[0, r.numel() :]), i


@pytest.mark.parametrize("method", ["draft-model", "glide+cape", "casd"])
def test_sliding_window_past_the_window_on_cuda(method):
    target = tiny_model("mistral", sliding_window=8).to(CUDA)
    x = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(6)).to(CUDA)
    out = speculative_generate(target, x, candidate_generator=on_cuda(method, target, x), max_new_tokens=24)
    assert torch.equal(out, greedy_reference(target, x, 24))


@pytest.mark.parametrize("method", ["draft-model", "glide", "glide+cape", "casd"])
def test_the_static_cache_compiled_with_cuda_graphs_is_lossless_in_fp32(method):
    """On CUDA, cache_implementation='static' compiles automatically (reduce-overhead: CUDA graphs)."""
    torch._dynamo.reset()
    target = tiny_model("llama").to(CUDA)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4)).to(CUDA)
    out = speculative_generate(
        target,
        x,
        candidate_generator=on_cuda(method, target, x),
        max_new_tokens=48,
        cache_implementation="static",
        return_dict_in_generate=True,
    )
    assert out.speculative_stats.extra["static_cache"]["compiled"]
    assert torch.equal(out.sequences, greedy_reference(target, x, 48))
    other = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(6)).to(CUDA)
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = speculative_generate(
            target,
            other,
            candidate_generator=on_cuda(method, target, other),
            max_new_tokens=48,
            cache_implementation="static",
        )
    assert torch.equal(again, greedy_reference(target, other, 48))


# --- CUDA graphs on the static cache: recorded, replayed, never skipped -------------------------------------------


class HostOracle(OracleDrafter):
    """The conftest oracle, reading ids on the host (its reference stays there; the tree it returns is host data)."""

    def propose(self, input_ids, target_cache=None):
        return super().propose(input_ids.cpu(), target_cache)


@pytest.fixture
def cudagraphs(monkeypatch):
    """Counts what the cudagraph trees record and replay during a test (their manager's ``record_function`` and
    ``execute_node``, wrapped), from a fresh dynamo; ``skips()`` reads inductor's ``cudagraph_skips`` since then, bumped
    by every "skipping cudagraphs" (a graph that runs without CUDA graphs)."""
    from torch._inductor import cudagraph_trees

    counts = {"recorded": 0, "replayed": 0}
    for name, key in (("record_function", "recorded"), ("execute_node", "replayed")):
        original = getattr(cudagraph_trees.CUDAGraphTreeManager, name)

        def counted(self, *args, _original=original, _key=key, **kwargs):
            counts[_key] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cudagraph_trees.CUDAGraphTreeManager, name, counted)
    torch._dynamo.reset()
    before = compile_counters()
    counts["skips"] = lambda: compiled_between(before, compile_counters()).get("cudagraph_skips", 0)
    return counts


def assert_cuda_graphs(counts, out) -> None:
    """The call compiled (the loop says so), its buckets were captured as CUDA graphs and replayed, none skipped."""
    assert out.speculative_stats.extra.get("static_cache", {}).get("compiled"), "the static path did not compile"
    assert counts["skips"]() == 0, "inductor skipped CUDA graphs (see the 'skipping cudagraphs' warning above)"
    assert counts["recorded"] > 0 and counts["replayed"] > 0, counts


def static_on_cuda(target, x, **kwargs):
    return speculative_generate(target, x, cache_implementation="static", return_dict_in_generate=True, **kwargs)


@pytest.mark.parametrize("mode", ["right", "wrong", "tree"])
def test_cuda_graphs_replay_oracle_chains_and_trees(cudagraphs, mode):
    """Chains always accepted and always rejected (one bucket each) and 12-node trees accepted off the first child."""
    target = tiny_model("llama").to(CUDA)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4)).to(CUDA)
    reference = greedy_reference(target, x, 48)
    out = static_on_cuda(target, x, candidate_generator=HostOracle(reference.cpu(), mode), max_new_tokens=48)
    assert torch.equal(out.sequences, reference)
    assert_cuda_graphs(cudagraphs, out)


def test_cuda_graphs_replay_an_auto_chain_across_buckets(cudagraphs):
    """A draft model's default call: γ chosen every step, so several buckets are captured and replayed; a second call
    on another prompt replays them."""
    target = tiny_model("llama").to(CUDA)
    draft = tiny_model("llama", seed=3, num_hidden_layers=1).to(CUDA)
    for seed in (4, 6):
        x = torch.randint(0, VOCAB, (1, 9 + seed), generator=torch.Generator().manual_seed(seed)).to(CUDA)
        out = static_on_cuda(target, x, draft_model=draft, max_new_tokens=48)
        assert torch.equal(out.sequences, greedy_reference(target, x, 48)), seed
        assert_cuda_graphs(cudagraphs, out)


def test_cuda_graphs_in_bf16_agree_with_bf16_greedy_up_to_near_ties(cudagraphs):
    """bf16: a verification over several tokens rounds otherwise than a one-token forward, so the output equals bf16
    greedy except where the target's top two logits are a near tie (benchmarks.studies.lossless); a lost token fails."""
    target = tiny_model("llama").to(CUDA, torch.bfloat16)
    draft = tiny_model("llama", seed=3, num_hidden_layers=1).to(CUDA, torch.bfloat16)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(5)).to(CUDA)
    out = static_on_cuda(target, x, draft_model=draft, max_new_tokens=48)
    verdict = compare_greedy(target, x.shape[1], greedy_reference(target, x, 48), out.sequences)
    assert verdict["identical"] or verdict["near_tie"], verdict
    assert_cuda_graphs(cudagraphs, out)


def test_cuda_graphs_on_a_ring_past_its_wrap(cudagraphs):
    """A sliding-window target (window 16) whose prompt is longer than window + 64: its layers keep a ring of 80 columns
    in a 256-column cache, written past the wrap from the first step, captured and replayed."""
    target = windowed_model("mistral").to(CUDA)
    x = prompt(WINDOW + 64 + 8).to(CUDA)
    reference = target.generate(x, max_new_tokens=48, do_sample=False)
    draft = windowed_model("mistral", seed=3, num_hidden_layers=1).to(CUDA)
    for drafter in (HostOracle(reference.cpu(), "tree"), DraftModelCandidateGenerator(draft)):
        out = static_on_cuda(target, x, candidate_generator=drafter, max_new_tokens=48)
        assert torch.equal(out.sequences, reference), type(drafter).__name__
        assert_cuda_graphs(cudagraphs, out)
    from hf_specdraft.core.static_layout import _CACHES  # the core's cache per model: read to check the ring is there

    cache = _CACHES[target]["target"]
    assert any(getattr(layer, "ring", None) == WINDOW + 64 for layer in cache.layers)


def test_cuda_graphs_for_a_left_padded_batch_of_four(cudagraphs):
    target = tiny_model("llama").to(CUDA)
    draft = tiny_model("llama", seed=3, num_hidden_layers=1).to(CUDA)
    rows, ids, mask = left_padded_batch(low=1)
    width = ids.shape[1]
    out = static_on_cuda(
        target,
        ids.to(CUDA),
        attention_mask=mask.to(CUDA),
        draft_model=draft,
        max_new_tokens=24,
        pad_token_id=0,
        eos_token_id=None,
    )
    for i, r in enumerate(rows):
        alone = greedy_reference(target, r[None].to(CUDA), 24, eos_token_id=None)
        assert torch.equal(out.sequences[i, width:], alone[0, r.numel() :]), i
    assert_cuda_graphs(cudagraphs, out)


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
@pytest.mark.parametrize("state_input", [False, True])
def test_glide_trains_on_cuda_to_a_finite_loss(tmp_path, mixed_precision, state_input):
    """train_glide on CUDA, the target run every step (the GPU recipe's path; bf16 is what ``mixed_precision="auto"``
    picks there): GLIDE's glimpse masks leave a row with nothing to see at position 0, which must not turn into NaN."""
    from accelerate.state import AcceleratorState

    from hf_specdraft.glide import GlideConfig, GlideForCausalLM, GlideTrainingArguments, train_glide
    from hf_specdraft.glide.training.objective import TargetWindows

    AcceleratorState._reset_state(reset_partial_state=True)  # accelerate keeps one precision per process
    target = tiny_model("llama", num_hidden_layers=3).to(CUDA)
    glide = GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32, state_input=state_input))
    stream = torch.randint(0, target.config.vocab_size, (400,), generator=torch.Generator().manual_seed(0))
    args = GlideTrainingArguments(
        str(tmp_path / "run"),
        max_steps=3,
        seq_len=32,
        per_device_batch_size=4,
        warmup_steps=1,
        logging_steps=1,
        save_steps=0,
        distillation_weight=0.5,
        mixed_precision=mixed_precision,
        progress_bar=False,
    )
    log = train_glide(target, glide, TargetWindows(stream, 32), args)
    assert all(torch.isfinite(torch.tensor(step["loss"])) for step in log["steps"]), log["steps"]
    assert all(torch.isfinite(p).all() for p in glide.parameters())
