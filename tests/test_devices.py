"""A draft on another device than the target is refused by name before any forward, never a raw torch error.

The ``meta`` device stands in for a second device on a CPU-only machine.
"""

from __future__ import annotations

import pytest
import torch

from hf_specdraft import (
    CapeCandidateGenerator,
    GlideCandidateGenerator,
    GlideConfig,
    GlideForCausalLM,
    speculative_generate,
)
from hf_specdraft.core.drafting import DraftModelCandidateGenerator
from conftest import VOCAB, greedy_reference, tiny_model


def prompt():
    return torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))


def glide_for(target):
    torch.manual_seed(1)
    return GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).eval()


@pytest.mark.parametrize("drafter", ["draft_model", "glide", "cape over glide"])
def test_a_draft_on_another_device_is_refused_naming_both_devices(drafter):
    target = tiny_model("llama")
    draft = tiny_model("llama", seed=3, num_hidden_layers=1) if drafter == "draft_model" else glide_for(target)
    draft.to("meta")
    generator = {
        "draft_model": lambda: DraftModelCandidateGenerator(draft, 3),
        "glide": lambda: GlideCandidateGenerator(draft),
        "cape over glide": lambda: CapeCandidateGenerator(GlideCandidateGenerator(draft)),
    }[drafter]()
    with pytest.raises(ValueError, match=r"is on meta but the target is on cpu: .*\.to\(target\.device\)"):
        speculative_generate(target, prompt(), candidate_generator=generator, max_new_tokens=4)


def test_the_same_draft_on_the_target_s_device_runs():
    target = tiny_model("llama")
    x = prompt()
    out = speculative_generate(target, x, draft_model=glide_for(target), max_new_tokens=8)
    assert torch.equal(out, greedy_reference(target, x, 8))
