"""The common grid: every architecture of the suite × every method's drafter, one test shape.

For each: greedy output equals ``target.generate(do_sample=False)``, and the run's statistics are there and add
up (steps, emitted tokens). Where the method can draft from the target itself (a draft model, CAPE on it, the
cascade), that "always right" source must be accepted beyond the first token of a step; a random one is mostly
wrong. Oracle chains and trees (always right / always wrong / hand-drawn) are in tests/test_architectures.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, greedy_reference, tiny_model
from hf_specdraft import DraftModelCandidateGenerator, speculative_generate
from hf_specdraft.cape import CapeCandidateGenerator
from hf_specdraft.cascade import CascadeCandidateGenerator, MaxGramCandidateGenerator
from hf_specdraft.casd import CasdCandidateGenerator
from hf_specdraft.glide import GlideCandidateGenerator, GlideConfig, GlideForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")
NEW_TOKENS = 16
TABLE = torch.arange(VOCAB).roll(1)


def glide_for(target):
    torch.manual_seed(1)
    return GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).eval()


METHODS = {  # name -> (drafter from a draft source, whether the target itself can be the source)
    "draft-model": (lambda target, source, x: DraftModelCandidateGenerator(source, 3), True),
    "cape": (lambda target, source, x: CapeCandidateGenerator(DraftModelCandidateGenerator(source, 2), budget=6), True),
    "cape-fixed": (
        lambda target, source, x: CapeCandidateGenerator(
            DraftModelCandidateGenerator(source, 2), mode="fixed", fixed_k=2
        ),
        True,
    ),
    "cape-beam": (
        lambda target, source, x: CapeCandidateGenerator(
            DraftModelCandidateGenerator(source, 2), mode="beam", beam_width=2
        ),
        True,
    ),
    "cascade": (
        lambda target, source, x: CascadeCandidateGenerator(
            [source], k_matrix=[[2, 2], [0, 2]], bigram_table=TABLE, num_draft_tokens=None
        ),
        True,
    ),  # K's budgets, fixed
    "glide": (lambda target, source, x: GlideCandidateGenerator(glide_for(target), num_draft_tokens=3), False),
    "glide+cape": (
        lambda target, source, x: CapeCandidateGenerator(
            GlideCandidateGenerator(glide_for(target), num_draft_tokens=2), budget=5
        ),
        False,
    ),
    "max-gram": (lambda target, source, x: MaxGramCandidateGenerator(TABLE, num_draft_tokens=4), False),
    "casd": (lambda target, source, x: CasdCandidateGenerator(torch.cat([x[0], x[0]]), min_suffix_length=1), False),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_grid(arch, method):
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    reference = greedy_reference(target, x, NEW_TOKENS)
    build, self_draftable = METHODS[method]
    sources = {
        "random": tiny_model(arch, seed=3, num_hidden_layers=1),
        **({"target": target} if self_draftable else {}),
    }
    for name, source in sources.items():
        out = speculative_generate(
            target,
            x,
            candidate_generator=build(target, source, x),
            max_new_tokens=NEW_TOKENS,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences, reference), (method, name)
        stats = out.speculative_stats
        assert stats.num_steps >= 1 and stats.new_tokens == NEW_TOKENS
        if name == "target":  # always right: every step keeps its drafts
            assert stats.mean_accepted_length > 2, (method, stats.mean_accepted_length)


def test_the_gpu_script_asks_for_methods_the_bench_registers():
    """benchmarks/gpu/run.sh runs on a machine of its own: a method name it asks for must exist before it gets there."""
    import re
    from pathlib import Path

    from hf_specdraft.bench.methods import METHODS

    script = (Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "run.sh").read_text()
    asked = {
        name
        for group in re.findall(r'methods[= ]"([^"$]+)', script) + re.findall(r'bench \w+ ",([^"]+)"', script)
        for name in group.split(",")
    }
    assert "stock-assisted" in asked  # the requests step's --methods "..." is read too
    assert asked and not sorted(asked - set(METHODS)), sorted(asked - set(METHODS))
