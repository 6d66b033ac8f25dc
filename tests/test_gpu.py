"""Every method on CUDA (issue #34): lossless in fp32, bf16's agreement with bf16 greedy, batch 4, sliding windows past
the window. Marked ``gpu`` (deselected by default, skipped without CUDA): run ``python -m pytest -q -m gpu`` on a
machine with a GPU. CI is CPU-only.
"""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, greedy_reference, tiny_model
from hf_specdraft import GlideCandidateGenerator, speculative_generate
from test_method_grid import METHODS, glide_for

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
    out = speculative_generate(target, x, candidate_generator=on_cuda(method, target, x, torch.bfloat16), max_new_tokens=32)
    reference = greedy_reference(target, x, 32)
    agreement = float((out[0, 9:] == reference[0, 9:]).float().mean())  # a tree forward rounds otherwise than one token
    record_property("bf16_agreement", agreement)
    print(f"{arch} {method} bf16 agreement with bf16 greedy: {agreement:.3f}")
    assert agreement >= 0.5


def test_batch_of_four_on_cuda_equals_each_row_alone(arch):
    target = tiny_model(arch).to(CUDA)
    glide = glide_for(target).to(CUDA)
    rows = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 9, 7, 11)]
    width = max(r.numel() for r in rows)
    ids = torch.zeros(4, width, dtype=torch.long)
    mask = torch.zeros(4, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - r.numel():], mask[i, width - r.numel():] = r, 1
    out = speculative_generate(target, ids.to(CUDA), attention_mask=mask.to(CUDA), candidate_generator=GlideCandidateGenerator(glide),
                               max_new_tokens=12, pad_token_id=0, eos_token_id=None)
    for i, r in enumerate(rows):
        alone = greedy_reference(target, r[None].to(CUDA), 12, eos_token_id=None)
        assert torch.equal(out[i, width:], alone[0, r.numel():]), i


@pytest.mark.parametrize("method", ["draft-model", "glide+cape", "casd"])
def test_sliding_window_past_the_window_on_cuda(method):
    target = tiny_model("mistral", sliding_window=8).to(CUDA)
    x = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(6)).to(CUDA)
    out = speculative_generate(target, x, candidate_generator=on_cuda(method, target, x), max_new_tokens=24)
    assert torch.equal(out, greedy_reference(target, x, 24))


@pytest.mark.parametrize("method", ["draft-model", "glide", "glide+cape", "casd"])
def test_the_static_cache_compiled_with_cuda_graphs_is_lossless_in_fp32(method):
    """Issue #35 on CUDA: cache_implementation='static' compiles automatically (reduce-overhead: CUDA graphs)."""
    torch._dynamo.reset()
    target = tiny_model("llama").to(CUDA)
    x = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(4)).to(CUDA)
    out = speculative_generate(target, x, candidate_generator=on_cuda(method, target, x), max_new_tokens=48,
                               cache_implementation="static", return_dict_in_generate=True)
    assert out.speculative_stats.extra["static_cache"]["compiled"]
    assert torch.equal(out.sequences, greedy_reference(target, x, 48))
    other = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(6)).to(CUDA)
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = speculative_generate(target, other, candidate_generator=on_cuda(method, target, other), max_new_tokens=48,
                                     cache_implementation="static")
    assert torch.equal(again, greedy_reference(target, other, 48))
