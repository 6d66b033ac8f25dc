"""Targets spread by accelerate's ``device_map="auto"``: over CPU and disk (``max_memory`` and an offload
folder), or wholly on disk. Every method stays lossless against the spread target's own greedy output, with its drafter
on the CPU; GLIDE trains against such a target; a target split by tensor parallelism is refused for training by name.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import tiny_model
from hf_specdraft import (
    DraftModelCandidateGenerator,
    GlideCandidateGenerator,
    GlideConfig,
    GlideForCausalLM,
    speculative_generate,
)
from hf_specdraft.glide import GlideTrainingArguments, train_glide
from multi_device_checks import NEW_TOKENS, lossless_checks, prompt

pytestmark = pytest.mark.usefixtures("one_thread")
CPU_SHARE = "95KB"  # the tiny Llama's embedding and first decoder layer stay in memory; the rest goes to disk


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("device_map")
    target = tiny_model("llama")
    target.save_pretrained(folder / "target")
    torch.manual_seed(1)
    glide = GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).eval()
    return folder, target, glide, tiny_model("llama", seed=3, num_hidden_layers=1)


def spread(folder, cpu: str):
    return AutoModelForCausalLM.from_pretrained(
        folder / "target", device_map="auto", max_memory={"cpu": cpu}, offload_folder=str(folder / f"offload-{cpu}")
    ).eval()


@pytest.fixture(scope="module")
def results(saved):
    folder, _, glide, draft = saved
    target = spread(folder, CPU_SHARE)
    placed = target.hf_device_map
    # split inside the stack
    assert {placed.get("model.layers.0"), placed.get("model.layers.1")} == {"cpu", "disk"}, placed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the function-scoped one_thread fixture, which a module fixture runs before
    try:
        return lossless_checks(target, glide, draft)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "check",
    [
        "draft-model",
        "glide",
        "glide-fixed",
        "cape+glide",
        "cape-beam+glide",
        "cape+draft-model",
        "cascade",
        "max-gram",
        "casd",
        "static/draft-model",
        "static/glide",
        "static/cape+glide",
        "batch/draft-model",
        "batch/glide",
        "state+draft-model",
        "static/state+draft-model",
        "batch/state+draft-model",
    ],
)
def test_every_method_is_lossless_on_a_target_over_cpu_and_disk(results, check):
    assert results[check]["ok"], results[check]["detail"]


def test_a_target_wholly_on_disk(saved):
    """transformers' own ``generate`` cannot start on it (its parameters all report the meta device); the loop can."""
    folder, target, glide, draft = saved
    on_disk = spread(folder, "1KB")
    assert set(on_disk.hf_device_map.values()) == {"disk"}
    x = prompt(int(target.config.vocab_size))
    reference = target.generate(x, max_new_tokens=NEW_TOKENS, do_sample=False)  # the same weights, in memory
    for drafter in (GlideCandidateGenerator(glide), DraftModelCandidateGenerator(draft)):
        assert torch.equal(
            speculative_generate(on_disk, x, candidate_generator=drafter, max_new_tokens=NEW_TOKENS), reference
        )


def test_glide_trains_against_a_target_over_cpu_and_disk(saved, tmp_path):
    folder, target, _, _ = saved
    on_disk = spread(folder, CPU_SHARE)
    torch.manual_seed(0)
    glide = GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32))
    before = {k: v.clone() for k, v in glide.state_dict().items()}
    data = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(0)).repeat(20)
    log = train_glide(
        on_disk,
        glide,
        data,
        GlideTrainingArguments(
            output_dir=str(tmp_path),
            max_steps=4,
            seq_len=16,
            per_device_batch_size=2,
            warmup_steps=1,
            logging_steps=1,
            progress_bar=False,
        ),
    )
    assert len(log["steps"]) == 4 and on_disk.hf_device_map  # trained, and the target left where it was spread
    assert any(not torch.equal(before[k], v) for k, v in glide.state_dict().items() if "cross_attn" in k)


def test_training_against_a_target_split_by_tensor_parallelism_is_refused(saved, tmp_path):
    _, target, glide, _ = saved
    split = tiny_model("llama")
    split._tp_size = 2  # what from_pretrained(tp_plan="auto") records on each rank's shard
    with pytest.raises(
        ValueError, match=r"split over 2 ranks by tensor parallelism .*device_map='auto'.*tp_plan='auto'"
    ):
        train_glide(
            split,
            glide,
            torch.arange(96).repeat(4),
            GlideTrainingArguments(output_dir=str(tmp_path), max_steps=1, seq_len=16),
        )
