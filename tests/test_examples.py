"""examples/ (scripts with --tiny, Colab notebooks), the benchmark plots and the GLIDE model card, on the tiny recipe.

The test run's one tiny default (conftest's ``tiny_default``: target, drafts, GLIDE, bigram table) is shared; every
example and notebook is pointed at it through ``HF_SPECDRAFT_TINY_DIR`` instead of training its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def tiny_env(tmp_path_factory, tiny_default):
    """Environment for examples and notebooks: the run's tiny default (conftest), the repository importable, one
    thread (beside the other test worker, two threads a process oversubscribe two cores, and the few-token linears'
    calibration of many tiny products then runs tens of times slower)."""
    root = tmp_path_factory.mktemp("examples")
    return {
        "HF_SPECDRAFT_TINY": "1",
        "HF_SPECDRAFT_TINY_DIR": str(tiny_default[0]),
        "HF_SPECDRAFT_CACHE": str(root / "cache"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
    }


@pytest.mark.slow  # example scripts: ~6 s each in a fresh process
@pytest.mark.parametrize(
    "script, args, expected",
    [
        ("train_glide.py", ["--max-steps", "3"], ["final loss", "checkpoint and model card"]),
        ("generate_glide.py", ["--max-new-tokens", "8"], ["stock-assisted", "glide+cape", "= target-only: True"]),
        ("generate_cascade.py", ["--max-new-tokens", "12"], ["max-gram", "cascade", "= target-only: True"]),
        ("generate_casd.py", ["--max-new-tokens", "12"], ["casd-strict", "casd-conditional", "= target-only: True"]),
        (
            "generate_batch.py",
            ["--max-new-tokens", "12"],
            ["few_token_linears", "each row = its batch-1 greedy: True", "row 3:"],
        ),
    ],
)
def test_example_script_runs_tiny(script, args, expected, tiny_env, tmp_path):
    source = (EXAMPLES / script).read_text()
    assert f"python examples/{script}" in source.split('"""')[1], "the module docstring must give the exact command"
    if script == "train_glide.py":
        args = [*args, "--output-dir", str(tmp_path / "glide")]
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--tiny", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **tiny_env},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for text in expected:
        assert text in done.stdout, done.stdout
    if script == "train_glide.py":
        assert {"README.md", "model.safetensors", "config.json", "custom_generate", "training_log.json"} <= {
            p.name for p in (tmp_path / "glide").iterdir()
        }
    if script == "generate_glide.py":  # GLIDE alone: greedy speculative output equals target-only greedy
        assert done.stdout.count("= target-only: True") == 3
    if script == "generate_batch.py":  # the batch equals batched target-only, with and without the linears
        assert done.stdout.count("= target-only: True") == 2


@pytest.mark.slow  # notebooks: ~8 s each through a kernel
@pytest.mark.parametrize("name", ["quickstart.ipynb", "train_your_own_glide.ipynb"])
def test_notebook_executes_on_tiny_recipe(name, tiny_env, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(notebook)
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    assert "%pip install" in code[0] and 'if "google.colab" in sys.modules' in code[0]  # installs on Colab only
    for key, value in tiny_env.items():
        monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs)
    assert "same as target-only: True" in outputs


# --- benchmark plots (benchmarks.report.plots) and their place in BENCHMARKS.md ---------------------------------


def synthetic_result() -> dict:
    """A small result in the harness's schema: target-only, a chain method and a CAPE method."""
    meta = {
        "hardware": "CPU: test",
        "device": "cpu",
        "dtype": "float32",
        "batch_size": 1,
        "task": "completion",
        "num_prompts": 2,
        "max_new_tokens": 8,
        "seed": 0,
        "versions": {"torch": "x", "transformers": "y"},
        "target_parameters": 1e6,
    }

    def stats(by_position, expansion=None):
        return {
            "steps": 3,
            "acceptance_by_position": by_position,
            **({"extra": {"expansion_sizes": expansion}} if expansion else {}),
        }

    records = []
    for prompt in range(2):
        records += [
            {"prompt": prompt, "method": "target-only"},
            {"prompt": prompt, "method": "draft-model", "stats": stats([0.8, 0.5, 0.25][: 3 - prompt])},
            {"prompt": prompt, "method": "glide+cape", "stats": stats([0.9, 0.6], expansion=[[1, 3], [7, 5], [1, 1]])},
        ]
    summary = {
        m: {"speedup_vs_target_only": s} for m, s in (("target-only", 1.0), ("draft-model", 1.4), ("glide+cape", 1.9))
    }
    return {"meta": meta, "summary": summary, "records": records}


def test_plots_from_synthetic_json(tmp_path):
    from benchmarks.report.plots import acceptance_by_position, expansion_size_counts, make_plots

    result = synthetic_result()
    # mean over prompts that drafted that deep
    assert acceptance_by_position(result) == {"draft-model": [0.8, 0.5, 0.25], "glide+cape": [0.9, 0.6]}
    assert expansion_size_counts(result) == {"glide+cape": {1: 6, 3: 2, 5: 2, 7: 2}}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "cpu-completion.json").write_text(json.dumps(result))
    # not a method table: no plots
    (tmp_path / "results" / "overhead-cpu.json").write_text(json.dumps({"meta": {}, "ratio": 1.0}))
    written = make_plots(tmp_path / "results", tmp_path / "plots")
    assert sorted(p.name for p in written) == [
        "cpu-completion-acceptance.png",
        "cpu-completion-expansion.png",
        "cpu-completion-speedup.png",
    ]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)

    result["records"] = [r for r in result["records"] if r["method"] != "glide+cape"]  # no CAPE method any more
    (tmp_path / "results" / "cpu-completion.json").write_text(json.dumps(result))
    assert len(make_plots(tmp_path / "results", tmp_path / "plots")) == 2
    assert not (tmp_path / "plots" / "cpu-completion-expansion.png").exists()  # a stale plot is removed, never linked


def test_report_embeds_plots(tmp_path, monkeypatch):
    from benchmarks.report.render import render, write_report

    # no results, no plots: still renders
    assert render(tmp_path / "results", checkpoint=tmp_path).startswith("# Benchmarks")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "cpu-completion.json").write_text(json.dumps(synthetic_result()))
    monkeypatch.chdir(tmp_path)
    report = write_report("BENCHMARKS.md", "benchmarks/results").read_text()
    for kind in ("speedup", "acceptance", "expansion"):
        assert f"![cpu-completion-{kind}](benchmarks/plots/cpu-completion-{kind}.png)" in report
        assert (tmp_path / "benchmarks" / "plots" / f"cpu-completion-{kind}.png").is_file()


def test_plots_from_a_harness_run(tiny_env, tmp_path):
    """The real harness's JSON (chain, CAPE and Max-Gram methods on the tiny default) gives all three plots."""
    from benchmarks import methods  # noqa: F401  (registers the fixed-γ glide, glide+cape and max-gram rows)
    from benchmarks.report.plots import make_plots
    from hf_specdraft.bench import BenchConfig, run_bench
    from hf_specdraft.defaults import load_default

    bundle = load_default(tiny_env["HF_SPECDRAFT_TINY_DIR"], device="cpu")
    config = BenchConfig(
        methods=("target-only", "glide", "glide+cape", "max-gram"), num_prompts=1, max_new_tokens=8, warmup=0, repeats=1
    )
    run_bench(bundle, config, output=tmp_path / "results" / "tiny.json")
    assert len(make_plots(tmp_path / "results", tmp_path / "plots")) == 3


# --- the GLIDE model card (model_cards/README.md documents it) ------------------------------------------------


def test_filled_model_card(tiny_env, tmp_path):
    from huggingface_hub import ModelCard

    from hf_specdraft import write_glide_custom_generate
    from hf_specdraft.glide import GlideForCausalLM, save_glide_checkpoint

    trained = Path(tiny_env["HF_SPECDRAFT_TINY_DIR"]) / "glide"
    glide = GlideForCausalLM.from_pretrained(trained)
    log = json.loads((trained / "training_log.json").read_text())
    metrics = {"acceptance_rate": 0.61, "mean_accepted_length": 2.9, "walltime_speedup": 2.1}
    save_glide_checkpoint(
        glide,
        tmp_path,
        target_name="lmsys/vicuna-7b-v1.5",
        card_info={
            "dataset": "DKYoon/SlimPajama-6B",
            "metrics": metrics,
            "training_log": log,
            "repo_id": "you/glide-vicuna",
            "license": "llama2",
        },
        custom_generate=write_glide_custom_generate,
    )
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.base_model == "lmsys/vicuna-7b-v1.5" and card.data.license == "llama2"
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    assert {"speculative-decoding", "glide", "custom_generate"} <= set(card.data.tags)
    assert card.data.datasets == ["DKYoon/SlimPajama-6B"]
    assert 'custom_generate="you/glide-vicuna", trust_remote_code=True' in card.text
    assert (
        "assistant_model=glide" in card.text
        and 'from_pretrained("you/glide-vicuna", trust_remote_code=True)' in card.text
    )
    assert "- data: DKYoon/SlimPajama-6B" in card.text and f"{log['steps'][-1]['step']} steps" in card.text
    assert "- acceptance rate: 0.61" in card.text and "- walltime speedup: 2.1" in card.text
    documented = (REPO / "model_cards" / "README.md").read_text()
    assert all(
        key in documented
        for key in ("base_model", "license", "library_name", "pipeline_tag", "tags", "hf_specdraft/glide/model_card.py")
    )
    with pytest.raises(ValueError, match="license"):
        save_glide_checkpoint(glide, tmp_path, card_info={"license": ""})


def test_deepspeed_config_is_the_papers_zero2():
    import yaml

    config = yaml.safe_load((EXAMPLES / "accelerate_deepspeed_zero2.yaml").read_text())
    assert config["distributed_type"] == "DEEPSPEED" and config["deepspeed_config"]["zero_stage"] == 2
    assert config["mixed_precision"] == "bf16" and config["num_processes"] == 8  # Du et al. 2024, Appendix A: 8 GPUs
    assert (
        "--config_file examples/accelerate_deepspeed_zero2.yaml examples/train_glide.py"
        in (EXAMPLES / "train_glide.py").read_text()
    )


def test_tiny_runs_go_to_the_user_cache_not_temporary_folders(tmp_path, monkeypatch):
    """--tiny trains once into $HF_SPECDRAFT_CACHE/tiny-default and reuses it: nothing is left in the temp directory."""
    import tempfile

    import recipes.training as training

    monkeypatch.syspath_prepend(str(EXAMPLES))
    import _tiny

    trained = []

    def fake_train_default(recipe, path, parts):
        trained.append(path)
        path.mkdir(parents=True)
        (path / "recipe.json").write_text("{}")  # what a finished run leaves last

    monkeypatch.setattr(training, "train_default", fake_train_default)
    monkeypatch.delenv("HF_SPECDRAFT_TINY_DIR", raising=False)
    monkeypatch.setenv("HF_SPECDRAFT_CACHE", str(tmp_path / "cache"))
    before = set(Path(tempfile.gettempdir()).glob("hf-specdraft-tiny-*"))
    assert _tiny.tiny_default_dir() == tmp_path / "cache" / "tiny-default" == _tiny.tiny_default_dir()
    assert trained == [tmp_path / "cache" / "tiny-default"]  # trained once, then reused
    assert set(Path(tempfile.gettempdir()).glob("hf-specdraft-tiny-*")) == before
