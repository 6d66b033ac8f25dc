"""A GPU-grade step on the static path, proven on a CPU with tiny models.

* compiled windowed targets stay lossless far past their ring (the warm-up writes only scratch slots);
* every bucket compiles before the first step: a second call, and a call needing a bucket no step used, add no graph;
* four threads calling the static path on one model at once are each token-identical to target-only greedy;
* the loop's own host-device crossings are counted (``tests/syncs.py``'s ``SyncCounter``): one read-back a
  step for greedy chains and trees, batch 1 and 4;
* the compiled step keeps CUDA graphs' rules, checked on a CPU: outputs are overwritten by the next call, and inputs
  never move between calls.

Compiled runs use dynamo's ``eager`` backend (the graphs and guards of the real path, without inductor's codegen).
"""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import CompileConfig

from conftest import VOCAB, OracleDrafter, greedy_reference, tiny_model
from hf_specdraft.core.support import output_cache
from hf_specdraft import speculative_generate
from hf_specdraft.core import static_layout
from hf_specdraft.core.drafting import DraftModelCandidateGenerator, TreeCandidateGenerator
from syncs import SyncCounter
from hf_specdraft.core.tree import DraftTree
from test_sliding_window import prompt, windowed_model

pytestmark = pytest.mark.usefixtures("one_thread")
EAGER_GRAPHS = CompileConfig(backend="eager", mode=None)


def static(target, x, **kwargs):
    return speculative_generate(target, x, cache_implementation="static", **kwargs)


class HostTree(TreeCandidateGenerator):
    """A tree drafter whose tokens are host data (as a retrieval drafter's are): the right token under a wrong first
    sibling at each level, so the accepted path is never the first child."""

    reads_target_cache = False

    def __init__(self, reference: torch.Tensor, depth: int = 4):
        super().__init__()
        self.reference, self.depth = reference[0].tolist(), depth

    def propose(self, input_ids, target_cache=None):
        start = input_ids.shape[1]
        tokens, parents, parent = [], [], -1
        for right in self.reference[start : start + self.depth]:
            tokens += [(right + 1) % VOCAB, right]
            parents += [parent, parent]
            parent = len(tokens) - 1
        return DraftTree(tokens, parents)


@pytest.mark.parametrize(
    "arch",
    ["gemma2", *(pytest.param(a, marks=pytest.mark.slow) for a in ("mistral", "qwen2", "gemma3", "cohere2", "llama4"))],
)
def test_compiled_windowed_targets_stay_lossless_past_the_ring(arch):
    """A 100-token prompt fills the 80-slot rings (window 16 + widest bucket 64) before the first bucket compiles:
    a warm-up writing into the ring's live slots made Mistral, Qwen2, Gemma 2 and Gemma 3 diverge."""
    torch._dynamo.reset()
    target = windowed_model(arch)
    x = prompt(100)
    reference = target.generate(x, max_new_tokens=24, do_sample=False)
    kwargs = dict(
        candidate_generator=OracleDrafter(reference, "tree"),
        max_new_tokens=24,
        return_dict_in_generate=True,
        output_logits=True,
    )
    compiled = static(target, x, compile_config=EAGER_GRAPHS, **kwargs)
    dynamic = speculative_generate(target, x, **kwargs)
    assert torch.equal(compiled.sequences, reference) and torch.equal(dynamic.sequences, reference)
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(compiled.logits, dynamic.logits))
    rings = [layer for layer in static_layout._CACHES[target]["target"].layers if layer.ring is not None]
    assert rings and all(layer.keys.shape[2] == layer.ring + layer.scratch for layer in rings)


def test_every_bucket_compiles_before_the_first_step():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    target = tiny_model("llama")
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    reference = greedy_reference(target, x, 32)
    # steps only ever use the 2-token bucket
    first = static(
        target,
        x,
        candidate_generator=OracleDrafter(reference, "right", k=1),
        max_new_tokens=32,
        compile_config=EAGER_GRAPHS,
        return_dict_in_generate=True,
    )
    assert torch.equal(first.sequences, reference)
    assert set(first.speculative_stats.extra["static_cache"]["warm_up_seconds"]) == {"2", "4", "8", "16", "32", "64"}
    graphs = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = static(
            target,
            x,
            candidate_generator=OracleDrafter(reference, "right", k=1),
            max_new_tokens=32,
            compile_config=EAGER_GRAPHS,
            return_dict_in_generate=True,
        )
        # 16-node trees: a bucket no step has used
        wider = static(
            target,
            x,
            candidate_generator=HostTree(reference, depth=8),
            max_new_tokens=32,
            compile_config=EAGER_GRAPHS,
            return_dict_in_generate=True,
        )
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(again.sequences, reference) and torch.equal(wider.sequences, reference)
    assert again.speculative_stats.extra["static_cache"]["warm_up_seconds"] == {}
    assert max(s.tree_size for s in wider.speculative_stats.steps) == 16


@pytest.mark.parametrize(
    "compile_config", [None, pytest.param(EAGER_GRAPHS, marks=pytest.mark.slow)], ids=["eager", "compiled"]
)  # compiled: 15 s
def test_four_threads_share_one_model_on_the_static_path(compile_config):
    """As a web server's thread pool would: one target and one draft model, four requests at once, each twice. A call
    in flight owns the static caches; the others wait for the target's, and draft eagerly while its draft's is taken."""
    torch._dynamo.reset()
    target, draft = tiny_model("qwen2"), tiny_model("qwen2", seed=3, num_hidden_layers=1)
    prompts = [torch.randint(0, VOCAB, (1, 6 + 3 * i), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    references = [greedy_reference(target, x, 24) for x in prompts]
    # compiles
    static(target, prompts[0], draft_model=draft, num_draft_tokens=3, max_new_tokens=24, compile_config=compile_config)
    outputs, errors = {}, []

    def request(i: int) -> None:
        try:
            for repeat in range(2):
                outputs[i, repeat] = static(
                    target,
                    prompts[i],
                    draft_model=draft,
                    num_draft_tokens=3,
                    max_new_tokens=24,
                    compile_config=compile_config,
                )
        except Exception as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=request, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert all(torch.equal(outputs[i, r], references[i]) for i in range(4) for r in range(2))


def batch_of_four():
    ids = torch.randint(1, VOCAB, (4, 9), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    for row, pad in ((1, 3), (3, 5)):
        ids[row, :pad], mask[row, :pad] = 0, 0
    return ids, mask


@pytest.mark.parametrize(
    "drafter, compile_config",
    [
        ("chain", None),
        pytest.param("chain", EAGER_GRAPHS, marks=pytest.mark.slow),
        ("tree", None),
        ("tree", EAGER_GRAPHS),
    ],
    ids=["chain-eager", "chain-compiled", "tree-eager", "tree-compiled"],
)
def test_one_read_back_a_step(drafter, compile_config):
    """Greedy chains (a draft model, γ = 3, tokens left on the device) and trees (host tokens), batch 1 and 4: after the
    first two steps (the drafts' caches start), every step crosses the host-device line once, in hf_specdraft's code."""
    torch._dynamo.reset()
    target, draft = tiny_model("llama"), tiny_model("llama", seed=3, num_hidden_layers=1)
    ids, mask = batch_of_four()
    for batch in (1, 4):
        x, m = (ids[:1, :], None) if batch == 1 else (ids, mask)
        kwargs = dict(max_new_tokens=24, compile_config=compile_config, pad_token_id=0)
        if m is not None:
            kwargs["attention_mask"] = m
        references = [
            greedy_reference(target, x[r : r + 1, int((ids[r] == 0).sum()) if batch > 1 else 0 :], 24)
            for r in range(batch)
        ]
        make = (
            (lambda: DraftModelCandidateGenerator(draft, 3))
            if drafter == "chain"
            else (lambda: [HostTree(ref) for ref in references])
        )
        generator = make()
        static(target, x, candidate_generator=generator, **kwargs)  # compiles, and starts the draft's own state
        with SyncCounter() as syncs:
            out = static(target, x, candidate_generator=make(), **kwargs)
        for r in range(batch):
            pad = int((ids[r] == 0).sum()) if batch > 1 else 0
            assert torch.equal(out[r : r + 1, pad : pad + references[r].shape[1]], references[r])
        assert len(syncs.per_step) > 4 and max(syncs.per_step[2:]) <= 2, (batch, syncs.per_step, syncs.where)


def test_the_counter_counts_what_it_should():
    """Every kind of read counted, from hf_specdraft's code only; a copy to the device only where a device is named."""
    from hf_specdraft.core import tree as tree_module

    with SyncCounter() as syncs:
        t = torch.ones(3)
        t.tolist(), bool(t[0]), t.to(torch.float64)  # this test's own reads: not hf_specdraft's code
        tree_module.DraftTree(t.long(), t.long() - 2)  # parents given as a tensor: read once
    assert syncs.total == 1 and list(syncs.where.values()) == [1]


class GraphRules:
    """Stands in for a compiled forward replayed from CUDA graphs, on a CPU: each call's logits come back in one buffer
    the next call overwrites (poisoned with NaN first), and a bucket's inputs must keep their addresses."""

    def __init__(self, call):
        self.call, self.addresses, self.last = call, {}, None

    def __call__(self, **inputs):
        flat = {}
        for name, value in inputs.items():
            for key, tensor in value.items() if isinstance(value, dict) else [("", value)]:
                if isinstance(tensor, torch.Tensor):
                    flat[f"{name}.{key}"] = tensor.data_ptr()
        cache = output_cache(inputs)
        flat.update(
            {f"layer{i}": layer.keys.data_ptr() for i, layer in enumerate(cache.layers) if layer.is_initialized}
        )
        flat.update({f"write{i}": layer.write_index.data_ptr() for i, layer in enumerate(cache.layers)})
        width = inputs["input_ids"].shape[1]
        assert self.addresses.setdefault(width, flat) == flat, f"an input of the {width}-token bucket moved"
        if self.last is not None:
            self.last.fill_(float("nan"))  # the next replay overwrites the previous outputs
        out = self.call(**inputs)
        self.last = out.logits
        return out


def test_the_compiled_step_keeps_cuda_graph_rules(monkeypatch):
    torch._dynamo.reset()
    target = tiny_model("mistral")
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    reference = greedy_reference(target, x, 40)
    real = static_layout.compiled_call
    monkeypatch.setattr(static_layout, "compiled_call", lambda model, config: GraphRules(real(model, config)))
    init = static_layout.StaticLayout.__init__

    def like_cuda_graphs(self, *args, **kwargs):  # compiled outputs handled as a CUDA graph pool's, on the CPU
        init(self, *args, **kwargs)
        self.graphs = self.compiled

    monkeypatch.setattr(static_layout.StaticLayout, "__init__", like_cuda_graphs)
    for drafter in (
        OracleDrafter(reference, "tree"),
        HostTree(reference),
        DraftModelCandidateGenerator(tiny_model("mistral", seed=3, num_hidden_layers=1), 3),
    ):
        out = static(
            target,
            x,
            candidate_generator=drafter,
            max_new_tokens=40,
            compile_config=EAGER_GRAPHS,
            return_dict_in_generate=True,
            output_logits=True,
        )
        assert torch.equal(out.sequences, reference)
        assert all(not logits.isnan().any() for logits in out.logits)  # kept logits were copied out of the graph's pool


@pytest.mark.parametrize("drafter", [pytest.param("draft-model", marks=pytest.mark.slow), "glide"])
def test_no_step_compiles_even_in_a_first_call(drafter, monkeypatch):
    """The target's buckets and the draft's compile before the first step: no graph appears while the steps run (the
    controller's costs never hold a compile)."""
    from torch._dynamo.utils import counters

    from hf_specdraft.core import loop
    from hf_specdraft.glide import GlideCandidateGenerator
    from test_method_grid import glide_for

    torch._dynamo.reset()
    counters.clear()
    target = tiny_model("llama")
    make = {
        "draft-model": lambda: DraftModelCandidateGenerator(tiny_model("llama", seed=3, num_hidden_layers=1)),
        "glide": lambda: GlideCandidateGenerator(glide_for(target)),
    }[drafter]
    graphs, real = [], loop.speculative_step

    def step(*args, **kwargs):
        graphs.append(counters["stats"]["unique_graphs"])
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "speculative_step", step)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    out = static(
        target,
        x,
        candidate_generator=make(),
        max_new_tokens=32,
        compile_config=EAGER_GRAPHS,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, greedy_reference(target, x, 32))
    extra = out.speculative_stats.extra["static_cache"]
    assert extra["draft_compiled"] and set(extra["draft_warm_up_seconds"]) == {"1", "2", "4", "8", "16"}
    assert len(graphs) > 3 and len(set(graphs)) == 1 and graphs[0] == counters["stats"]["unique_graphs"]
