"""Tensor parallelism: a target loaded with ``tp_plan="auto"`` under torchrun, two CPU processes over gloo.

One ``torchrun --standalone --nproc_per_node 2 tests/tp_worker.py`` launch per architecture runs every check on both
ranks and hands the results back as JSON; each test below reads one of them. Every method's greedy output must equal
the split target's own greedy output on *both* ranks, token for token; sampled runs must agree across ranks and with
one process's run of the same models from the same seed; GLIDE split over the ranks must give the logits it gives
whole. Llama (4 query / 2 KV heads) runs by default (~35 s), Qwen2 (6 / 2, biased projections) under ``-m slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from hf_specdraft import GlideCandidateGenerator, GlideConfig, GlideForCausalLM, speculative_generate
from hf_specdraft.core.distributed import RankAgreement

ROOT = Path(__file__).parents[1]
WORKER = Path(__file__).parent / "tp_worker.py"
SHAPES = {"llama": {}, "qwen2": dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2)}  # GQA 2:1 and 3:1
ARCHS = [pytest.param("llama"), pytest.param("qwen2", marks=pytest.mark.slow)]
LOSSLESS = [
    "draft-model",
    "draft-model-split",
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
    "controller/glide",
    "controller/self-draft",
    "state+draft-model",
    "static/state+draft-model",
    "batch/state+draft-model",
]
SAMPLED = ["glide", "draft-model", "cape+glide"]
_LAUNCHED: dict[str, list[dict]] = {}


def save_models(folder: Path, arch: str) -> None:
    target = tiny_model(arch, **SHAPES[arch])
    target.save_pretrained(folder / "target")
    tiny_model(arch, seed=3, num_hidden_layers=1, **SHAPES[arch]).save_pretrained(folder / "draft")
    torch.manual_seed(1)
    GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).save_pretrained(folder / "glide")
    if arch == "llama":  # 5 heads of its own: cannot be split over 2 ranks
        GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=40)).save_pretrained(
            folder / "glide-uneven"
        )


@pytest.fixture
def ranks(arch_under_tp, tmp_path_factory) -> tuple[dict, dict]:
    """``(rank0, rank1)`` results for the test's architecture; one torchrun launch per architecture per session."""
    arch = arch_under_tp
    if arch not in _LAUNCHED:
        folder = tmp_path_factory.mktemp(f"tp-{arch}")
        save_models(folder / "models" / arch, arch)
        (folder / "out").mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "HF_HUB_OFFLINE": "1",
        }
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                str(WORKER),
                str(folder / "models"),
                str(folder / "out"),
                arch,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            stdin=subprocess.DEVNULL,
        )
        # kept: one launch, also when it fails
        failed = {"load": {"ok": False, "detail": done.stdout[-2000:] + done.stderr[-4000:]}}
        _LAUNCHED[arch] = [
            json.loads((folder / "out" / f"rank{r}.json").read_text())[arch] if done.returncode == 0 else failed
            for r in (0, 1)
        ]
    first, second = _LAUNCHED[arch]
    assert "load" not in first, first["load"]["detail"]
    return first, second


@pytest.fixture(params=ARCHS)
def arch_under_tp(request):
    return request.param


def agreed(ranks, check: str) -> dict:
    """The check passed on both ranks, with the same tokens on both; rank 0's record."""
    first, second = (r[check] for r in ranks)
    assert first["ok"], first["detail"]
    assert second["ok"], second["detail"]
    assert first["tokens"] == second["tokens"], (first["tokens"], second["tokens"])
    return first


@pytest.mark.parametrize("check", LOSSLESS)
def test_every_method_is_lossless_under_tensor_parallelism(ranks, check):
    agreed(ranks, check)  # the lossless checks compare against the split target's own greedy output


def test_gamma_auto_chooses_alike_on_every_rank(ranks):
    lengths = agreed(ranks, "controller/self-draft")["tokens"]  # the γ every step drafted: identical on both ranks
    assert lengths and len(lengths) >= 2
    agreed(ranks, "controller/agreement")  # the collectives: the slowest rank's seconds, rank 0's remembered state


@pytest.mark.parametrize("drafter", SAMPLED)
def test_sampling_draws_alike_on_every_rank(ranks, drafter):
    agreed(ranks, f"sample/{drafter}")  # both ranks: equal to each other and to one process's run from the same seed


def test_glide_split_gives_its_whole_logits(ranks):
    detail = agreed(ranks, "glide-logits")["detail"]
    assert "logits (1, 12, 96)" in detail


@pytest.mark.parametrize("check", ["refuse/uneven-glide", "refuse/whole-glide", "refuse/seeds-apart"])
def test_what_cannot_split_is_refused_by_name(ranks, check):
    if check not in ranks[0]:
        pytest.skip("refusals run on Llama")
    agreed(ranks, check)


# One process: the plan and the checks that need no second rank.


def test_glide_plan_names_its_modules_and_stays_out_of_the_checkpoint(tmp_path):
    target = tiny_model("llama")
    glide = GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32))
    names = {name for name, _ in glide.named_modules()}
    for rule in glide.tp_plan:
        assert rule.replace("*", "0") in names, rule
    assert (
        glide.tp_plan["model.layers.*.cross_attn.q_proj"] == "colwise"
        and glide.tp_plan["lm_head"] == "colwise_gather_output"
    )
    vanilla = GlideConfig.from_target_config(target.config, hidden_size=32, cross_attention=False)
    assert not any("cross_attn" in rule for rule in vanilla.base_model_tp_plan)
    glide.save_pretrained(tmp_path)
    assert "base_model_tp_plan" not in json.loads((tmp_path / "config.json").read_text())
    assert glide.model.kv_heads_per_rank == target.config.num_key_value_heads  # not split: every KV head


def test_head_counts_that_cannot_split_are_refused_naming_both():
    # 5 heads of its own, the target's 4 / 2
    config = GlideConfig.from_target_config(tiny_model("llama").config, hidden_size=40)
    config.check_tensor_parallel(1)
    with pytest.raises(
        ValueError, match=r"tp_size=2 .*num_attention_heads=5.*target it reads has 4 query / 2 KV heads"
    ):
        config.check_tensor_parallel(2)
    with pytest.raises(ValueError, match="target_num_key_value_heads=2"):
        GlideConfig.from_target_config(tiny_model("llama").config, hidden_size=32).check_tensor_parallel(4)
    with pytest.raises(ValueError, match="tp_size must be a positive int"):
        config.check_tensor_parallel(0)


def test_a_glide_split_otherwise_than_its_target_is_refused():
    target = tiny_model("llama")
    glide = GlideForCausalLM(GlideConfig.from_target_config(target.config, hidden_size=32)).eval()
    target._tp_size = 2  # what from_pretrained(tp_plan="auto") records on a split target
    x = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(
        ValueError, match=r"target is split over 2 tensor-parallel rank\(s\) and glide over 1: .*tp_plan='auto'"
    ):
        speculative_generate(target, x, candidate_generator=GlideCandidateGenerator(glide), max_new_tokens=4)


def test_a_model_not_split_needs_no_agreement():
    assert RankAgreement.of(tiny_model("llama")) is None
