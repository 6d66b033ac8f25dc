"""Drafters in another dtype than the target (bf16 drafts next to a float32 target, as the embedded default
loads them on CPU): every method stays lossless, q reaches the loop in float32, and the loaders check the dtype."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import VOCAB, greedy_reference, tiny_model
from hf_specdraft import DraftModelCandidateGenerator, speculative_generate
from hf_specdraft.cape import CapeCandidateGenerator
from hf_specdraft.cascade import CascadeCandidateGenerator
from hf_specdraft.defaults import load_default
from hf_specdraft.glide import GlideCandidateGenerator
from test_glide import make_glide

pytestmark = pytest.mark.usefixtures("one_thread")
TABLE = torch.arange(VOCAB).roll(1)


def bf16_copy(model):
    return copy.deepcopy(model).to(torch.bfloat16).eval()


def generators(target, arch):
    """One generator per method, drafting in bf16: the target's own weights rounded (most drafts accepted, some
    rejected where bf16 changes the argmax) and a random GLIDE (rejections)."""
    draft = bf16_copy(target)
    glide = make_glide(target).to(torch.bfloat16)
    return {
        "draft-model": DraftModelCandidateGenerator(draft, 4),
        "glide": GlideCandidateGenerator(glide, num_draft_tokens=3),
        "glide+cape": CapeCandidateGenerator(GlideCandidateGenerator(glide, num_draft_tokens=2), budget=5),
        "draft+cape": CapeCandidateGenerator(DraftModelCandidateGenerator(draft, 3), budget=8),
        "cascade": CascadeCandidateGenerator(
            [draft, bf16_copy(tiny_model(arch, seed=3))], k_matrix=[[2, 1, 2], [0, 1, 2], [0, 0, 2]], bigram_table=TABLE
        ),
    }


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_bf16_drafters_are_lossless_next_to_a_float32_target(arch):
    target = tiny_model(arch)
    x = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    reference = greedy_reference(target, x, 24)
    for name, generator in generators(target, arch).items():
        out = speculative_generate(
            target, x, candidate_generator=generator, max_new_tokens=24, do_sample=False, return_dict_in_generate=True
        )
        assert torch.equal(out.sequences, reference), name
        if "glide" not in name:  # a random GLIDE gets nothing accepted; the target's own bf16 weights get most
            assert out.speculative_stats.accepted_tokens > 0, (
                f"{name}: a bf16 copy of the target should get drafts accepted"
            )


def test_bf16_draft_distribution_reaches_the_loop_in_float32():
    target = tiny_model()
    generator = DraftModelCandidateGenerator(bf16_copy(target), 3)
    generator.prepare(target, target.generation_config)
    tree = generator.propose(torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0)))
    assert tree.draft_probs.dtype == torch.float32
    assert torch.allclose(tree.draft_probs.sum(-1), torch.ones(3))


def test_bf16_draft_samples():
    target = tiny_model()
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    out = speculative_generate(
        target,
        x,
        draft_model=bf16_copy(target),
        num_draft_tokens=3,
        max_new_tokens=16,
        do_sample=True,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (1, 22) and out.speculative_stats.alpha is not None


@pytest.mark.parametrize("draft_dtype", ["bf16", torch.int64, torch.bfloat16.itemsize])
def test_load_default_rejects_a_draft_dtype_that_is_not_a_float_dtype(draft_dtype, tmp_path):
    with pytest.raises(TypeError, match="draft_dtype"):
        load_default(tmp_path, draft_dtype=draft_dtype)
