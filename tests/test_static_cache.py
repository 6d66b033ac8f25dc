"""The static cache the loop owns, fixed-shape buckets, compiled verification.

``cache_implementation="static"`` must give exactly what the DynamicCache path and target-only greedy give (fp32):
every method's drafter, chains and hand-drawn trees (the accepted path off the first child, so the cache moves
columns), batch 1 and a left-padded batch 4, sliding-window targets far past their window. Compiled (dynamo's
``eager`` backend here: the graphs and guards are the same, without inductor's minutes of codegen on a 2-core CPU),
a 64-token call whose acceptance varies from step to step and a second call on another prompt compile nothing after
the warm-up: one graph per bucket, checked with dynamo's counters and ``error_on_recompile``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import CompileConfig

from conftest import COMPILED_ARCHITECTURES, VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft import speculative_generate
from hf_specdraft.core.static_layout import _CACHES, bucket_for, compile_config_for
from hf_specdraft.core.controller import DraftLengthController
from hf_specdraft.core.drafting import DraftModelCandidateGenerator, DrafterTraits
from hf_specdraft.core.static_cache import StaticRowsCache
from hf_specdraft.core.tree import DraftTree, fit_proposal
from hf_specdraft.core.verify import LayerWindows
from hf_specdraft.glide import GlideCandidateGenerator
from test_controller import AdaptiveOracle
from test_method_grid import METHODS, TABLE, glide_for
from test_sliding_window import METHODS as WINDOW_METHODS
from test_sliding_window import WINDOW, prompt, windowed_model

pytestmark = pytest.mark.usefixtures("one_thread")


def static(target, x, **kwargs):
    return speculative_generate(target, x, cache_implementation="static", **kwargs)


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_on_the_static_cache_equals_greedy_and_the_dynamic_path(arch, method):
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    reference = greedy_reference(target, x, 24)
    make = METHODS[method][0]
    source = tiny_model(arch, seed=3, num_hidden_layers=1)
    dynamic = speculative_generate(target, x, candidate_generator=make(target, source, x), max_new_tokens=24)
    out = static(
        target, x, candidate_generator=make(target, source, x), max_new_tokens=24, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, reference) and torch.equal(dynamic, reference)
    assert out.speculative_stats.extra["static_cache"]["compiled"] is False  # a CPU without compile_config: eager


def test_sampling_draws_what_the_dynamic_path_draws(arch):
    """do_sample=True: speculative sampling reads the same target scores, so one seed gives the same tokens."""
    target, draft = tiny_model(arch), tiny_model(arch, seed=3, num_hidden_layers=1)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    outs = []
    for implementation in (None, "static"):
        torch.manual_seed(7)
        outs.append(
            speculative_generate(
                target,
                x,
                candidate_generator=DraftModelCandidateGenerator(draft, 3),
                max_new_tokens=40,
                do_sample=True,
                top_k=20,
                cache_implementation=implementation,
            )
        )
    assert torch.equal(*outs)


@pytest.mark.parametrize("mode", ["right", "wrong", "tree"])
def test_oracle_chains_and_trees_move_the_accepted_path_into_place(arch, mode):
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(6))
    reference = greedy_reference(target, x, 40)
    out = static(
        target, x, candidate_generator=OracleDrafter(reference, mode), max_new_tokens=40, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, reference)
    if mode == "tree":  # 12-node trees verified in the 16-token bucket
        assert all(s.tree_size == 12 for s in out.speculative_stats.steps[:3])


def test_a_left_padded_batch_of_four_keeps_rows_at_lengths_of_their_own(arch):
    target = tiny_model(arch)
    ids = torch.randint(1, VOCAB, (4, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    for row, pad in ((1, 3), (3, 5)):
        ids[row, :pad], mask[row, :pad] = 0, 0
    draft = tiny_model(arch, seed=3, num_hidden_layers=1)
    out = static(target, ids, attention_mask=mask, draft_model=draft, max_new_tokens=20, pad_token_id=0)
    dynamic = speculative_generate(
        target, ids, attention_mask=mask, draft_model=draft, max_new_tokens=20, pad_token_id=0
    )
    assert torch.equal(out, dynamic)
    for row in range(4):
        pad = int((mask[row] == 0).sum())
        expected = greedy_reference(target, ids[row : row + 1, pad:], 20)[0]
        assert torch.equal(out[row, pad : pad + expected.numel()], expected)


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma3", "llama4"])
def test_windows_far_past_the_window_by_mask(arch):
    """Windowed layers keep a full static buffer; the mask keeps each query inside its window (or chunk)."""
    target = windowed_model(arch)
    x = prompt(3 * WINDOW + 3)
    reference = target.generate(x, max_new_tokens=40, do_sample=False)
    for mode in ("right", "wrong", "tree"):
        assert torch.equal(
            static(target, x, candidate_generator=OracleDrafter(reference, mode), max_new_tokens=40), reference
        ), mode
    draft = windowed_model(arch, seed=3, num_hidden_layers=1)
    for method in ("glide", "cape", "casd"):
        drafter = WINDOW_METHODS[method](target, draft, x)
        assert torch.equal(static(target, x, candidate_generator=drafter, max_new_tokens=40), reference), method
    tree = dict(
        candidate_generator=OracleDrafter(reference, "tree"),
        max_new_tokens=40,
        return_dict_in_generate=True,
        output_logits=True,
    )
    on_rings, dynamic = static(target, x, **tree), speculative_generate(target, x, **tree)
    assert all(
        torch.allclose(a, b, atol=1e-4) for a, b in zip(on_rings.logits, dynamic.logits)
    )  # the same scores, past the wrap
    cache = _CACHES[target][
        "target"
    ]  # windowed layers keep a ring of window + widest bucket columns, not the whole row
    rings = [layer for layer in cache.layers if layer.ring is not None]  # (and the warm-up's scratch slots past it)
    assert rings and all(
        layer.ring == WINDOW + 64 and layer.keys.shape[2] == layer.ring + 64 < cache.max_cache_len for layer in rings
    )
    assert len(rings) < len(cache.layers) or arch == "mistral"  # full-attention layers keep whole rows


@pytest.mark.slow  # 13 s; compiled windows stay in the default suite with gemma2 (test_static_step.py)
def test_windows_on_rings_compiled():
    torch._dynamo.reset()
    target = windowed_model("gemma3")
    x = prompt(3 * WINDOW + 3)
    reference = target.generate(x, max_new_tokens=64, do_sample=False)
    for mode in ("tree", "wrong"):
        kwargs = dict(
            candidate_generator=OracleDrafter(reference, mode),
            max_new_tokens=64,
            return_dict_in_generate=True,
            output_logits=True,
        )
        compiled = static(target, x, compile_config=CompileConfig(backend="eager", mode=None), **kwargs)
        dynamic = speculative_generate(target, x, **kwargs)
        assert torch.equal(compiled.sequences, reference), mode
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(compiled.logits, dynamic.logits)), (
            mode
        )  # past the ring's wrap


def test_a_windowed_batch_past_the_window_runs_on_the_static_cache():
    """The DynamicCache batch refuses windowed targets past one window; the static cache windows by mask."""
    target = windowed_model("mistral")
    ids = torch.cat([prompt(2 * WINDOW), prompt(2 * WINDOW + 1)[:, 1:]])
    draft = windowed_model("mistral", seed=3, num_hidden_layers=1)
    with pytest.raises(ValueError, match="cache_implementation='static'"):
        speculative_generate(target, ids, draft_model=draft, max_new_tokens=24)
    out = static(target, ids, draft_model=draft, max_new_tokens=60)  # 33 + 60 columns: past the 80-column rings' wrap
    for row in range(2):
        assert torch.equal(out[row : row + 1], target.generate(ids[row : row + 1], max_new_tokens=60, do_sample=False))


class PartlyRight(AdaptiveOracle):
    """An "auto" chain drafter (the loop's controller sets its length) whose first ``j`` tokens are right, ``j`` drawn
    afresh every step: acceptance varies from step to step."""

    def __init__(self, reference: torch.Tensor):
        super().__init__(reference, "right")
        self.draws = torch.Generator().manual_seed(0)

    def draft_tree(self, request):
        tokens = super().draft_tree(request).tokens
        right = int(torch.randint(0, tokens.numel() + 1, (1,), generator=self.draws))
        return DraftTree.chain(torch.cat([tokens[:right], (tokens[right:] + 1) % VOCAB]))


def test_a_glide_that_cannot_compile_over_rings_drafts_eagerly():
    """GLIDE glimpses no ring layers from a compiled draft: on a windowed target it drafts eagerly, losslessly."""
    target = windowed_model("gemma3")
    x = prompt(WINDOW + 3)
    out = static(
        target,
        x,
        candidate_generator=GlideCandidateGenerator(glide_for(target)),
        max_new_tokens=8,
        return_dict_in_generate=True,
        compile_config=CompileConfig(backend="eager", mode=None),
    )
    assert torch.equal(out.sequences, target.generate(x, max_new_tokens=8, do_sample=False))
    assert not out.speculative_stats.extra["static_cache"]["draft_compiled"]


def compiled_call(target, x, drafter):
    return static(
        target,
        x,
        candidate_generator=drafter,
        max_new_tokens=64,
        return_dict_in_generate=True,
        compile_config=CompileConfig(backend="eager", mode=None),
    )


def test_compiled_verification_never_recompiles_after_warm_up():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # graphs compiled by earlier tests
    target = tiny_model("llama")
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    reference = greedy_reference(target, x, 64)
    first = compiled_call(target, x, PartlyRight(reference))
    assert torch.equal(first.sequences, reference)
    warmed = first.speculative_stats.extra["static_cache"]
    assert warmed["compiled"] and set(warmed["warm_up_seconds"]) == {
        "2",
        "4",
        "8",
        "16",
        "32",
        "64",
    }  # every bucket, first
    accepted = {s.accepted for s in first.speculative_stats.steps}
    assert len(accepted) > 1  # acceptance varies from step to step
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 6  # one graph per bucket, no graph break
    other = torch.randint(0, VOCAB, (1, 14), generator=torch.Generator().manual_seed(8))
    expected = greedy_reference(target, other, 64)
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = compiled_call(target, other, PartlyRight(expected))
        third = compiled_call(target, x, OracleDrafter(first.sequences, "tree"))  # 12-node trees: the 16 bucket again
    assert counters["stats"]["unique_graphs"] == graphs
    assert second.speculative_stats.extra["static_cache"]["warm_up_seconds"] == {}
    assert torch.equal(second.sequences, expected)
    assert torch.equal(third.sequences, first.sequences)


@pytest.mark.parametrize("arch", COMPILED_ARCHITECTURES)
def test_a_draft_model_compiles_too_and_never_recompiles_after_warm_up(arch):
    """A batch-1 call's draft model runs its feeds on a static cache of its own through its compiled forward."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    target, draft = tiny_model(arch), tiny_model(arch, seed=3, num_hidden_layers=1)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    first = compiled_call(target, x, DraftModelCandidateGenerator(draft))
    assert torch.equal(first.sequences, greedy_reference(target, x, 64))
    extra = first.speculative_stats.extra["static_cache"]
    assert extra["draft_compiled"] and set(extra["draft_warm_up_seconds"]) == {"1", "2", "4", "8", "16"}
    compiled_call(target, x, DraftModelCandidateGenerator(target))  # the target as its own draft: warms its draft role
    graphs = counters["stats"]["unique_graphs"]
    other = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(9))
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = compiled_call(target, other, DraftModelCandidateGenerator(draft))
        itself = compiled_call(target, other, DraftModelCandidateGenerator(target))  # one model, two roles: two caches
    assert counters["stats"]["unique_graphs"] == graphs
    reference = greedy_reference(target, other, 64)
    assert torch.equal(second.sequences, reference) and torch.equal(itself.sequences, reference)
    assert itself.speculative_stats.accepted_per_drafted == 1.0


@pytest.mark.parametrize("arch", COMPILED_ARCHITECTURES)
def test_glide_compiles_with_its_glimpse_of_the_static_target_cache(arch):
    """GLIDE's feeds on a static cache of its own, its cross-attention reading all the target's buffers under a mask."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    first = compiled_call(target, x, GlideCandidateGenerator(glide_for(target)))
    assert torch.equal(first.sequences, greedy_reference(target, x, 64))
    assert first.speculative_stats.extra["static_cache"]["draft_compiled"]
    eager = speculative_generate(
        target,
        x,
        candidate_generator=GlideCandidateGenerator(glide_for(target), num_draft_tokens=3),
        max_new_tokens=64,
        return_dict_in_generate=True,
    )
    fixed = compiled_call(target, x, GlideCandidateGenerator(glide_for(target), num_draft_tokens=3))
    assert [s.accepted for s in fixed.speculative_stats.steps] == [
        s.accepted for s in eager.speculative_stats.steps
    ]  # same glimpse
    graphs = counters["stats"]["unique_graphs"]
    other = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(9))
    with torch._dynamo.config.patch(error_on_recompile=True):
        second = compiled_call(target, other, GlideCandidateGenerator(glide_for(target)))
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(second.sequences, greedy_reference(target, other, 64))


def test_cape_over_glide_compiles_its_chain():
    from hf_specdraft import CapeCandidateGenerator

    torch._dynamo.reset()
    target = tiny_model("qwen2")
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    out = compiled_call(
        target,
        x,
        CapeCandidateGenerator(
            GlideCandidateGenerator(glide_for(target), num_draft_tokens=3, copy_from_context=0), budget=6
        ),
    )
    assert torch.equal(out.sequences, greedy_reference(target, x, 64))
    assert out.speculative_stats.extra["static_cache"]["draft_compiled"]
    assert max(s.tree_size for s in out.speculative_stats.steps) > max(
        s.drafted for s in out.speculative_stats.steps
    )  # trees


@pytest.mark.slow  # 11 s; the draft model and GLIDE compile in the default suite
def test_the_cascade_s_drafts_compile_at_every_level():
    from hf_specdraft.cascade import CascadeCandidateGenerator

    torch._dynamo.reset()
    target, draft = tiny_model("mistral"), tiny_model("mistral", seed=3, num_hidden_layers=1)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    for drafts in ([draft], [draft, draft]):  # one model at two levels: a cache per level
        cascade = CascadeCandidateGenerator(
            drafts,
            k_matrix=[[2] * len(drafts) + [2]] + [[0] * (i + 1) + [2] * (len(drafts) - i) for i in range(len(drafts))],
            bigram_table=TABLE,
        )
        out = compiled_call(target, x, cascade)
        assert torch.equal(out.sequences, greedy_reference(target, x, 64))
        assert out.speculative_stats.extra["static_cache"]["draft_compiled"]
        assert len(cascade.caches) == len(drafts) and len({id(c.static.cache) for c in cascade.caches}) == len(drafts)


@pytest.mark.slow
def test_inductor_compiled_verification_is_lossless():
    """The real backend (inductor's CPU codegen: about 40 s for the four buckets of a tiny model on 2 cores)."""
    torch._dynamo.reset()
    target = tiny_model("qwen2")
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    out = static(
        target,
        x,
        draft_model=tiny_model("qwen2", seed=3, num_hidden_layers=1),
        max_new_tokens=48,
        compile_config=CompileConfig(mode="default"),
    )
    assert torch.equal(out, greedy_reference(target, x, 48))


def test_compiling_follows_transformers_rules():
    from transformers import GenerationConfig

    target = tiny_model()
    assert compile_config_for(target, GenerationConfig()) is None  # automatic on CUDA only
    forced = compile_config_for(target, GenerationConfig(compile_config=CompileConfig(backend="eager")))
    assert forced.backend == "eager" and forced.dynamic is False  # one graph per bucket
    assert compile_config_for(target, GenerationConfig(compile_config=CompileConfig(), disable_compile=True)) is None


def test_buckets_and_caps():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 9, 17, 64)] == [2, 2, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="largest verification bucket 64"):
        bucket_for(65)
    tree = DraftTree(torch.arange(5), torch.tensor([-1, 0, -1, 1, 2]))
    capped = fit_proposal(tree, None, VOCAB, 10, DrafterTraits(), max_nodes=3)  # the widest bucket's limit: first nodes
    assert capped.tokens.tolist() == [0, 1, 2] and capped.parents.tolist() == [-1, 0, -1]
    controller = DraftLengthController(8, bucket=bucket_for)
    controller.verify = {2: 0.01, 4: 0.02, 8: 0.03}
    assert controller.cost_curve()(controller.bucket(6)) == 0.03  # γ = 5 costs its bucket's forward


def test_the_cache_keeps_rows_apart():
    cache = StaticRowsCache(num_layers=1, batch_size=2, max_cache_len=8, layer_windows=LayerWindows(tiny_model()))
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)
    cache.set_write_columns([0, 4], 3, "cpu")
    cache.update(keys, keys + 100, 0)
    layer = cache.layers[0]
    assert torch.equal(layer.keys[0, 0, :3], keys[0, 0]) and torch.equal(layer.keys[1, 0, 4:7], keys[1, 0])
    cache.keep(1, 4, [0, 2])  # row 1 keeps its column 4 and moves column 6 to 5
    assert torch.equal(layer.keys[1, 0, 5], keys[1, 0, 2]) and torch.equal(layer.values[1, 0, 5], keys[1, 0, 2] + 100)
    assert torch.equal(layer.keys[0, 0, :3], keys[0, 0])  # row 0 untouched
    with pytest.raises(ValueError, match="do not fit a static cache of 2 rows x 8 columns"):
        cache.set_write_columns([6, 0], 3, "cpu")


def test_what_the_static_path_refuses():
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="cache_implementation='offloaded' is not supported"):
        speculative_generate(target, x, draft_model=target, max_new_tokens=4, cache_implementation="offloaded")
    with pytest.raises(
        ValueError, match="compile_config.*must be an instance of `CompileConfig`"
    ):  # generate's own check
        static(target, x, draft_model=target, max_new_tokens=4, compile_config={"backend": "eager"})


class _Row:
    def __init__(self, index, tokens, pad):
        self.index, self.tokens, self.pad = index, tokens, pad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bucket_inputs_edited_step_to_step_equal_inputs_built_afresh(dtype):
    """core/static_cache: a bucket's mask, ids, positions and write columns, edited from the last step (text grown,
    a new tree block, a slot finishing, a new call's shorter rows), equal what a fresh buffer builds for that step."""
    from hf_specdraft.core.static_cache import BucketInputs

    chain, tree = DraftTree([5, 6, 7], [-1, 0, 1]), DraftTree([8, 9, 10, 11], [-1, -1, 0, 1])
    steps = [  # (rows: (slot, tokens, pad), trees)
        ([(0, list(range(10)), 0), (1, list(range(7)), 3)], [chain, tree]),
        ([(0, list(range(13)), 0), (1, list(range(9)), 3)], [tree, chain]),
        ([(1, list(range(12)), 3)], [tree]),  # slot 0 finished: dummies in its first columns
        ([(0, list(range(4)), 1), (1, list(range(5)), 0)], [chain, tree]),  # the next call: shorter rows, other padding
    ]
    kept = BucketInputs(2, 8, 32, dtype, "cpu")
    kept.fill_warm_up()
    for rows, trees in steps:
        rows = [_Row(*row) for row in rows]
        fresh = BucketInputs(2, 8, 32, dtype, "cpu")
        kept.fill(rows, trees)
        fresh.fill(rows, trees)
        assert torch.equal(kept.attention_mask, fresh.attention_mask) and torch.equal(kept.all_packed, fresh.all_packed)
    mask = fresh.attention_mask[1, 0]  # row 1 of the last step: text [0, 4), the tree's block from column 4
    assert (mask[:, :4] == 0).all() and (mask[:, 12:] == torch.finfo(dtype).min).all()
    assert (
        mask[4, 4 + 4] == 0 and mask[4, 4 + 2] == 0 and mask[4, 4 + 1] == torch.finfo(dtype).min
    )  # node 3 sees node 1 and itself, not node 0
    assert fresh.position_ids[1].tolist() == [4, 5, 5, 6, 6, 4, 4, 4] and fresh.write_index[
        1, 0, :, 0
    ].tolist() == list(range(4, 12))


def test_host_tree_buffers_and_tensors():
    from hf_specdraft.core.host import host_tensor
    from hf_specdraft.core.tree import tree_buffers

    assert tree_buffers([])[0].shape == (0, 0) and tree_buffers([])[1] == []
    ancestors, depth = tree_buffers([-1, -1, 0, 1, 1, 3, -1])
    assert depth == [0, 0, 1, 1, 1, 2, 0] and ancestors[5].nonzero().flatten().tolist() == [1, 3, 5]
    assert torch.equal(host_tensor(range(3), (1, 3)), torch.tensor([[0, 1, 2]])) and host_tensor([]).numel() == 0
