"""The tuning runs (benchmarks.studies.tune_glide, tune_casd): their grids and their argument checks (the runs
themselves load the real default and take minutes; their results are committed JSON)."""

from __future__ import annotations

import pytest

from hf_specdraft.bench import METHODS
from benchmarks.studies import tune_casd, tune_glide


def test_grids_register_once_with_their_settings():
    gammas, capes = tune_glide.register_grid()
    assert gammas == [f"glide-gamma{g}" for g in tune_glide.GAMMAS]
    assert capes == [f"glide+cape-gamma{g}-budget{b}" for g, b in tune_glide.CAPE_SETTINGS]
    nodes = tune_casd.register_grid()
    assert nodes == [f"casd-strict-nodes{n}" for n in tune_casd.MAX_NODES]
    assert all(METHODS[n].tasks == ("context",) for n in nodes)
    assert tune_casd.register_grid() == nodes  # a second call registers nothing twice


@pytest.mark.parametrize("module", [tune_glide, tune_casd])
@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--num-prompts", "0"], "--num-prompts"),
        (["--max-new-tokens", "-1"], "--max-new-tokens"),
        (["--skip-prompts", "-2"], "--skip-prompts"),
    ],
)
def test_bad_arguments_are_refused_before_anything_loads(module, argv, flag, capsys, monkeypatch):
    import hf_specdraft.defaults

    monkeypatch.setattr(hf_specdraft.defaults, "load_default", lambda *a, **k: pytest.fail("loaded the default"))
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--gammas", "0"], "--gammas"),
        (["--max-gram-tokens", "two"], "two"),
        (["--grid", "short", "--drafts", "2"], "short grid"),
        (["--grid", "long"], "--grid"),
    ],
)
def test_k_sweep_refuses_bad_arguments_before_anything_loads(argv, flag, capsys, monkeypatch):
    import hf_specdraft.defaults
    from benchmarks.studies import k_sweep

    monkeypatch.setattr(hf_specdraft.defaults, "load_default", lambda *a, **k: pytest.fail("loaded the default"))
    with pytest.raises(SystemExit) as exit_info:
        k_sweep.main(argv)
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


def test_k_sweep_mag_grid_runs_every_length(monkeypatch):
    import hf_specdraft.defaults
    from benchmarks.studies import k_sweep

    seen = {}

    class Ran(Exception):
        pass

    def fake_run_bench(bundle, config, items):
        seen["methods"] = config.methods
        raise Ran

    monkeypatch.setattr(hf_specdraft.defaults, "load_default", lambda *a, **k: None)
    monkeypatch.setattr(k_sweep, "run_bench", fake_run_bench)
    with pytest.raises(Ran):
        k_sweep.main(["--drafts", "1", "--grid", "mag", "--max-gram-tokens", "2,3", "--gammas", "3"])
    grid = [m for m in seen["methods"] if m.startswith("cascade-1d-")]
    assert len(grid) == 2 * len(k_sweep.k_grid(1, "mag")) and "draft-model-gamma3" in seen["methods"]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--gammas", "0,1"], "--gammas"),
        (["--batch-sizes", "four"], "--batch-sizes"),
        (["--skip-prompts", "-1"], "--skip-prompts"),
        (["--methods", "glide γ=2"], "--methods"),
        (["--gammas", "1,3", "--methods", "glide"], "glide γ=1"),
    ],
)
def test_batching_bench_refuses_bad_arguments_before_anything_loads(argv, flag, capsys, monkeypatch):
    import hf_specdraft.defaults
    from benchmarks.studies import batching

    monkeypatch.setattr(hf_specdraft.defaults, "load_default", lambda *a, **k: pytest.fail("loaded the default"))
    with pytest.raises(SystemExit) as exit_info:
        batching.main(argv)
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err


def test_batching_bench_names_one_run_per_gamma():
    from benchmarks.studies import batching

    assert batching.method_names((3,)) == [
        "target-only",
        "target-only (few-token linears)",
        "stock-assisted",
        "glide",
        "vanilla",
        "max-gram",
    ]
    assert batching.method_names((1, 3))[3:7] == ["glide γ=1", "glide γ=3", "vanilla γ=1", "vanilla γ=3"]
    from types import SimpleNamespace

    bundle = SimpleNamespace(target=None, draft=None, extras={})  # methods() only builds the runs' closures
    assert list(batching.methods(bundle, (1, 3))) == batching.method_names((1, 3))


def test_save_run_writes_meta_and_body(tmp_path, monkeypatch):
    import json

    from benchmarks.studies import save_run
    from hf_specdraft.bench import harness

    monkeypatch.setattr(harness, "environment", lambda bundle: {"hardware": "CPU: test"})
    out = tmp_path / "runs" / "r.json"
    written = save_run(None, out, "python -m x", {"results": {"1": 2.0}}, repeats=3)
    assert json.loads(out.read_text()) == written
    assert (
        written["meta"]["hardware"] == "CPU: test"
        and written["meta"]["command"] == "python -m x"
        and written["meta"]["repeats"] == 3
    )
    assert written["results"] == {"1": 2.0} and "date" in written["meta"]


def test_batching_bench_checks_every_batch_size_against_the_smallest(monkeypatch):
    """Given in any order, batch sizes run smallest first, so each is compared with the smallest's target-only run."""
    from types import SimpleNamespace

    import torch

    import hf_specdraft.defaults.tasks
    from benchmarks.studies import batching

    def fake(shifted):  # a "method" emitting 3 tokens per row; shifted ones change their tokens at batch size 2
        def run(ids, mask, kwargs):
            new = torch.full((ids.shape[0], 3), 5 + (shifted and ids.shape[0] == 2), dtype=torch.long)
            return torch.cat([ids, new], dim=1), None

        return run

    monkeypatch.setattr(
        batching,
        "methods",
        lambda bundle, gammas: {
            "target-only": (fake(True), (1, 2)),
            "target-only (few-token linears)": (fake(False), (1, 2)),
        },
    )
    monkeypatch.setattr(hf_specdraft.defaults.tasks, "build_tasks", lambda task, count, seed: list(range(count)))
    monkeypatch.setattr(batching, "prompt_ids", lambda tok, item: torch.tensor([[1, 2, 3]]))
    result = batching.run(
        SimpleNamespace(tokenizer=SimpleNamespace(eos_token_id=0, pad_token_id=0)), num_prompts=4, batch_sizes=(2, 1)
    )
    assert result["reference_batch_size"] == 1 and result["batch_sizes"] == [1, 2]
    assert result["results"]["1"]["target-only"]["identical_to_batch1_target_only"]
    assert not result["results"]["2"]["target-only"]["identical_to_batch1_target_only"]
    assert result["results"]["2"]["target-only (few-token linears)"]["identical_to_batch1_target_only"]
