"""The embedded default's plumbing on the tiny recipe (never a measurement), and the shipped checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_specdraft.defaults import SMOLLM2_DRAFTERS_DIR, load_default
from hf_specdraft.defaults.corpus import build_corpus, is_heldout
from hf_specdraft.defaults.tasks import build_tasks, edit_similarity
from recipes.recipe import check_recipe, get_recipe

REPO = Path(__file__).resolve().parents[1]


def test_corpus_split_is_deterministic_and_disjoint(corpus):
    again = build_corpus()
    assert [f.name for f in corpus.train] == [f.name for f in again.train]
    assert [f.name for f in corpus.heldout] == [f.name for f in again.heldout]
    assert not {f.name for f in corpus.train} & {f.name for f in corpus.heldout}
    assert all(is_heldout(f.name) for f in corpus.heldout) and not any(is_heldout(f.name) for f in corpus.train)
    assert {"python", "transformers", "torch"} <= set(corpus.versions)


def test_unreadable_corpus_root(tmp_path):
    with pytest.raises(ValueError, match="not a readable directory"):
        build_corpus(roots={"missing": tmp_path / "nope"})


def test_tiny_recipe_trains_and_loads(tiny_default):
    path, log = tiny_default
    assert set(log["evaluation"]) >= {
        "unigram_perplexity",
        "target_perplexity",
        "draft_perplexity",
        "target_repeat_fraction",
        "reference_repeat_fraction",
    }
    assert 0.0 <= log["evaluation"]["reference_repeat_fraction"] < 1.0
    assert {"stdlib", "transformers"} <= set(log["evaluation"]["target_perplexity_by_source"])
    assert log["target"]["steps"][-1]["loss"] < log["target"]["steps"][0]["loss"]
    bundle = load_default(path)
    assert check_recipe(path)
    text = "def add(a, b):\n    return a + b\n"
    assert bundle.tokenizer.decode(bundle.tokenizer(text).input_ids) == text  # byte-level BPE round trip
    # grouped-query attention
    assert bundle.target.config.num_key_value_heads < bundle.target.config.num_attention_heads
    assert bundle.draft is not None
    # Max-Gram's fallback, built from the same stream
    assert bundle.extras["bigram_table"].shape == (len(bundle.tokenizer),)


@pytest.mark.slow  # ~28 s: trains the tiny target's continuation twice
def test_resume_target_runs_only_the_continuation(tiny_default, corpus, tmp_path, monkeypatch):
    import dataclasses
    import shutil

    from safetensors.torch import load_file

    from recipes.recipe import TrainSchedule
    from recipes.training import train_default

    path, _ = tiny_default
    monkeypatch.setenv("HF_SPECDRAFT_CACHE", str(path.parent / "cache"))
    run = tmp_path / "run"
    shutil.copytree(path, run)
    before = load_file(run / "target" / "model.safetensors")
    with pytest.raises(ValueError, match="target_continuation"):
        train_default(get_recipe("tiny"), run, parts=("target",), corpus=corpus, resume_target=True)
    recipe = dataclasses.replace(
        get_recipe("tiny"),
        target_continuation=TrainSchedule(
            steps=4, batch_size=4, micro_batch_size=4, learning_rate=1e-3, warmup_steps=1
        ),
    )
    with pytest.raises(ValueError, match="does not include 'target'"):
        train_default(recipe, run, parts=("draft",), corpus=corpus, resume_target=True)
    with pytest.warns(UserWarning, match="trained on the previous target"):  # the tiny run has GLIDE drafters
        log = train_default(recipe, run, parts=("target",), corpus=corpus, resume_target=True)
    assert log["target"]["steps"][-1]["step"] == 30 and log["target"]["continuation"]["steps"][-1]["step"] == 4
    # written before training
    assert "started" in json.loads((run / "training_log.json").read_text())["target"]["continuation"]
    after = load_file(run / "target" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert json.loads((run / "recipe.json").read_text())["hash"] == recipe.hash()
    with pytest.raises(
        ValueError, match="finished first stage"
    ):  # the continuation already ran (or started and was cut short)
        train_default(recipe, run, parts=("target",), corpus=corpus, resume_target=True)
    # other recipes keep their hashes
    assert get_recipe("tiny").to_dict().keys() == recipe.to_dict().keys() - {"target_continuation"}


def test_load_default_rejects_other_directories(tmp_path):
    with pytest.raises(ValueError, match="not an embedded-default directory"):
        load_default(tmp_path)


SHIPPED = ("glide", "vanilla", "small", "glide_assistant")


@pytest.mark.skipif(
    not (SMOLLM2_DRAFTERS_DIR / "glide" / "config.json").is_file(), reason="no shipped drafters in this checkout"
)
def test_shipped_drafters_are_small_bf16_and_name_their_target():
    from hf_specdraft.defaults.smollm2 import HUB_ID
    from hf_specdraft.glide import GlideConfig

    total = sum(f.stat().st_size for f in SMOLLM2_DRAFTERS_DIR.rglob("*") if f.is_file())
    # 45 MiB for GLIDE, its twin (8,192 draft ids each: 2,048 of them for the natural language a chat target writes) and
    # the small draft; 16 more for glide_assistant, the variant vLLM serves (untied: target input rows, trained head);
    # under 1 more for GLIDE's copy table (72,880 contexts of the target's answers)
    assert total <= 62 * 2**20, f"shipped drafters take {total / 2**20:.1f} MiB (at most 62)"
    for kind in SHIPPED:
        config = GlideConfig.from_pretrained(SMOLLM2_DRAFTERS_DIR / kind)
        assert config.target_name_or_path == HUB_ID and config.cross_attention == kind.startswith("glide")
        assert config.draft_token_ids and config.dtype in ("bfloat16", torch.bfloat16)
        card = (SMOLLM2_DRAFTERS_DIR / kind / "README.md").read_text()
        assert f"base_model: {HUB_ID}" in card
    assert (SMOLLM2_DRAFTERS_DIR / "bigram.safetensors").is_file()


@pytest.mark.parametrize("task", ["completion", "context"])
def test_task_builders(task, corpus):
    items = build_tasks(task, count=100, seed=0, corpus=corpus)
    assert len(items) == 100 and items == build_tasks(task, count=100, seed=0, corpus=corpus)
    heldout = {f.name for f in corpus.heldout}
    assert all(i.source in heldout and i.prompt and i.reference for i in items)
    if task == "context":
        # the pool sees more than the prompt
        assert all(i.prompt in i.context and len(i.context) > len(i.prompt) for i in items)
        # the whole file before the cut
        longer = build_tasks(task, count=100, seed=0, corpus=corpus, context_prompt_chars=10**9)
        assert [(i.source, i.reference, i.context) for i in longer] == [
            (i.source, i.reference, i.context) for i in items
        ]
        assert all(i.context.startswith(j.prompt) and j.prompt.endswith(i.prompt) for i, j in zip(items, longer))
        with pytest.raises(ValueError, match="context_prompt_chars"):
            build_tasks(task, count=2, corpus=corpus, context_prompt_chars=0)
    with pytest.raises(ValueError, match="unknown task"):
        build_tasks("translation")


def test_edit_similarity():
    assert edit_similarity("abc", "abc") == 1.0
    assert edit_similarity("", "abc") == 0.0
    assert edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)


def test_bench_json_schema(tiny_default, tmp_path):
    from hf_specdraft.bench import BenchConfig, run_bench
    from benchmarks import methods  # noqa: F401  (registers null-drafter and stock-assisted+linears)

    bundle = load_default(tiny_default[0])
    config = BenchConfig(
        methods=(
            "target-only",
            "target-only+linears",
            "draft-model-auto",
            "null-drafter",
            "prompt-lookup",
            "stock-assisted+linears",
        ),
        num_prompts=2,
        max_new_tokens=8,
        warmup=0,
        repeats=2,
    )
    result = run_bench(bundle, config, output=tmp_path / "bench.json")
    saved = json.loads((tmp_path / "bench.json").read_text())
    dtype = str(bundle.target.dtype).removeprefix("torch.")  # float32 on CPU, bf16 where a GPU is visible
    assert saved["meta"]["versions"]["transformers"] and saved["meta"]["dtype"] == dtype and saved["meta"]["hardware"]
    # a recipes.training directory's drafts load at the target's dtype
    assert saved["meta"]["draft_dtypes"]["draft"] == dtype
    assert set(saved["summary"]) == set(config.methods)
    for name, s in saved["summary"].items():
        assert s["equals_target_only"] == 1.0, name  # every baseline here is lossless
        assert s["speedup_vs_target_only"] > 0
    assert saved["summary"]["draft-model-auto"]["mean_accepted_length"] >= 1
    assert all(s["speedup_vs_target_only_linears"] > 0 for s in saved["summary"].values())
    assert len(saved["records"]) == 2 * 2 * len(config.methods) and {r["repeat"] for r in saved["records"]} == {0, 1}
    assert all(
        s["repeats"] == 2 and s["speedup_spread"]["min"] <= s["speedup_vs_target_only"] * 1.0001 or s["prompts"] > 1
        for s in saved["summary"].values()
    )
    assert saved["timing"]["repeats"] == 2 and isinstance(saved["timing"]["reliable"], bool)
    assert result["summary"] == saved["summary"]

    from benchmarks.report.render import render

    report = render(tmp_path, checkpoint=tiny_default[0])
    assert "## The embedded default" in report and "| draft-model-auto |" in report and "unigram baseline" in report


def test_draft_dtype_section_renders_both_measurements():
    from benchmarks.report.render import draft_dtype_section

    ms = {"float32": {"1": 6.8, "3": 8.4}, "bfloat16": {"1": 4.1, "3": 5.5}}
    result = {
        "meta": {
            "gamma": 3,
            "prompts": "completion items 20..",
            "hardware": "CPU",
            "command": "python -m benchmarks.studies.draft_dtype",
        },
        "draft_forward_ms": {"glide": ms},
        "end_to_end": {
            "target-only": {"speedup_vs_target_only": 1.0, "mean_accepted_length": None, "equals_target_only": True},
            "glide/bfloat16": {
                "speedup_vs_target_only": 1.42,
                "mean_accepted_length": 1.93,
                "equals_target_only": True,
            },
        },
    }
    text = draft_dtype_section(result)
    assert "| glide | 6.80 | 4.10 | 8.40 | 5.50 |" in text and "| glide/bfloat16 | 1.42× | 1.93 | yes |" in text


def test_copyable_fraction():
    from hf_specdraft.defaults.tasks import copyable_fraction

    assert copyable_fraction([1, 2, 3, 4, 9], [0, 1, 2, 3, 4]) == pytest.approx(0.8)
    assert copyable_fraction([5, 6, 7, 8, 5, 6, 7, 8], [5, 6, 7, 8]) == 1.0  # every occurrence counts
    assert copyable_fraction([1, 2, 3], [1, 2, 3]) == 0.0  # shorter than one 4-gram
    assert copyable_fraction([1, 2, 3], [1, 2, 3], n=3) == 1.0 and copyable_fraction([], [1, 2]) == 0.0
    with pytest.raises(ValueError, match="n must be"):
        copyable_fraction([1], [1], n=0)


def test_context_bench_records_what_the_pool_can_copy(tiny_default, tmp_path):
    from hf_specdraft.bench import BenchConfig, run_bench
    from benchmarks import methods  # noqa: F401  (registers casd-strict)
    from benchmarks.report.render import render

    config = BenchConfig(
        task="context", methods=("target-only", "casd-strict"), num_prompts=2, max_new_tokens=8, warmup=0, repeats=1
    )
    stats = run_bench(load_default(tiny_default[0]), config, output=tmp_path / "context.json")["task_statistics"]
    assert stats["ngram"] == 4 and stats["context_tokens"] > stats["prompt_tokens"] > 0
    assert (
        0.0 <= stats["reference_copyable_from_prompt"] <= 1.0 and 0.0 < stats["reference_copyable_from_context"] <= 1.0
    )
    assert "of the reference continuation's tokens lie in a 4-gram of the context" in render(
        tmp_path, checkpoint=tiny_default[0]
    )


def test_k_sweep_runs_every_matrix_losslessly(tiny_default):
    from hf_specdraft.bench import BenchConfig, run_bench
    from benchmarks.studies.k_sweep import k_grid, register_grid
    from hf_specdraft.cascade.cascade import validate_k_matrix

    for drafts in (1, 2):
        assert all(validate_k_matrix(k, drafts) == k for k in k_grid(drafts))
    short = k_grid(1, "short")
    assert all(validate_k_matrix(k, 1) == k and 2 <= sum(k[0]) <= 4 for k in short)
    mag = register_grid(1, "mag", (2, 3))
    assert len(mag) == 2 * len(k_grid(1, "mag")) and all(name.endswith(("-mag2", "-mag3")) for name in mag)
    names = register_grid(2)
    assert register_grid(2) == names  # registering twice is harmless
    chosen = tuple(names)[:2]
    result = run_bench(
        load_default(tiny_default[0]), BenchConfig(methods=chosen, num_prompts=1, max_new_tokens=8, warmup=0, repeats=1)
    )
    for name in chosen:
        assert result["summary"][name]["equals_target_only"] == 1.0 and result["summary"][name]["swi_parameters"] > 0
    with pytest.raises(ValueError, match="num_drafts"):
        k_grid(3)
    with pytest.raises(ValueError, match="num_drafts"):
        k_grid(2, "short")
    with pytest.raises(ValueError, match="grid"):
        k_grid(1, "long")


def test_drafter_cards_record_measured_numbers(tiny_default, tmp_path):
    import shutil

    from huggingface_hub import ModelCard

    from recipes.drafters import write_drafter_cards

    run = tmp_path / "run"
    shutil.copytree(tiny_default[0], run)
    row = {
        "alpha": 0.25,
        "position_acceptance_rate": 0.5,
        "mean_accepted_length": 2.5,
        "cost_coefficient": 0.1,
        "expected_speedup": 1.5,
        "speedup_vs_target_only": 0.9,
    }
    result = {
        "meta": {
            "hardware": "CPU",
            "dtype": "float32",
            "num_prompts": 2,
            "task": "completion",
            "max_new_tokens": 8,
            "date": "today",
            "draft_dtypes": {"glide": "bfloat16", "vanilla": "bfloat16"},
        },
        "summary": {"glide": row, "glide+cape": {**row, "mean_accepted_length": 3.0}, "vanilla": row},
    }
    (tmp_path / "bench.json").write_text(json.dumps(result))
    study = {
        "command": "python -m benchmarks.studies.state_glide",
        "heldout_tokens": 100,
        "drafters": {"glide": {"agreement_by_step": [0.5, 0.6, 0.7], "alpha_step_1": 0.45}},
    }
    (tmp_path / "agreement.json").write_text(json.dumps(study))
    cards = write_drafter_cards(run, tmp_path / "bench.json", tmp_path / "agreement.json")
    assert "CPU, float32 (drafters bfloat16)" in cards[0].read_text()
    assert cards == [run / "glide" / "README.md", run / "vanilla" / "README.md"]
    glide_card = cards[0].read_text()
    # the row names its settings
    assert (
        "- glide+cape (GLIDE γ=" in glide_card
        and "α (1 - TV(p, q)) 0.250, accepted / judged positions 0.500, mean accepted length 3.000" in glide_card
    )
    assert "not measured yet" not in glide_card
    assert "draft steps 1 / 2 / 3, each given the earlier ones: 0.500 / 0.600 / 0.700; α at step 1 0.450" in glide_card
    assert "draft steps 1 / 2 / 3" not in cards[1].read_text()  # the vanilla drafter was not in that study
    assert "custom_generate" in glide_card and "## Training" in glide_card
    assert ModelCard.load(cards[1]).data.license == "apache-2.0"  # the project's license (pyproject.toml)


def test_bench_config_errors():
    from hf_specdraft.bench import BenchConfig

    with pytest.raises(ValueError, match="unknown profile"):
        BenchConfig(profile="tpu")
    with pytest.raises(ValueError, match="unknown methods"):
        BenchConfig(methods=("warp-drive",))
    for bad in (0, -5, True, "all"):
        with pytest.raises(ValueError, match="context_prompt_chars"):
            BenchConfig(task="context", context_prompt_chars=bad)
    # SmolLM2 reads 8K; the gpu target 512-token windows
    assert (BenchConfig().context_prompt_chars, BenchConfig(profile="gpu").context_prompt_chars) == (3000, 1400)


def run_cli(*args):
    """The CLI in a fresh process, one thread (tiny models; beside the other test worker two would oversubscribe)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "hf_specdraft", *args], capture_output=True, text=True, cwd=REPO, timeout=300, env=env
    )


def test_cli_demo_on_tiny_default(tiny_default):
    done = run_cli("demo", "--target", str(tiny_default[0]), "--num-prompts", "1", "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr
    assert "target-only" in done.stdout and "draft-model" in done.stdout and "speedup" in done.stdout


@pytest.mark.slow  # ~10 s: the demo under busy loops
def test_demo_on_a_busy_machine_says_its_ratios_are_unreliable(tiny_default):
    """Busy loops on every core this process leaves free, plus one: the demo must say so, loudly."""
    import torch

    from hf_specdraft.bench.timing import cpu_reading

    cpus = cpu_reading()[2] if cpu_reading() else (os.cpu_count() or 1)
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(min(max(cpus - torch.get_num_threads(), 0) + 1, 8))
    ]
    try:
        time.sleep(0.5)
        done = run_cli(
            "demo", "--target", str(tiny_default[0]), "--num-prompts", "1", "--max-new-tokens", "8", "--repeats", "2"
        )
    finally:
        for loop in loops:
            loop.kill()
    assert done.returncode == 0, done.stderr
    assert "WARNING: these speed ratios are unreliable" in done.stdout and "other processes used" in done.stdout


@pytest.mark.slow  # ~16 s: one fresh CLI process per bad input
def test_cli_errors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    done = run_cli("demo", "--target", str(tmp_path))
    assert done.returncode == 2 and "not a causal LM" in done.stderr
    done = run_cli("bench", "--profile", "tpu")
    assert done.returncode == 2 and "invalid choice: 'tpu'" in done.stderr
    done = run_cli("bench", "--num-prompts", "0")
    assert done.returncode == 2 and "num_prompts must be a positive int, got 0" in done.stderr


def test_report_and_help_say_what_they_do(tmp_path, capsys):
    """The report (the lab's, not the package's command) outside the repository is refused in one line (no empty
    BENCHMARKS.md); --help names methods and defaults."""
    from benchmarks.report.__main__ import main as report
    from hf_specdraft.cli import COMMANDS, build_parser

    assert report(["--results-dir", str(tmp_path / "nothing"), "--output", str(tmp_path / "B.md")]) == 2
    assert "holds no benchmark JSON files" in capsys.readouterr().err and not (tmp_path / "B.md").exists()
    assert "report" not in COMMANDS  # rendering the project's own BENCHMARKS.md is no user's command
    bench_help = build_parser("bench")._subparsers._group_actions[0].choices["bench"].format_help()
    assert "glide+cape" in bench_help and "casd-strict" in bench_help and "(default: cpu)" in bench_help
    demo_help = build_parser("demo")._subparsers._group_actions[0].choices["demo"].format_help()
    assert "--repeats" in demo_help and "(default: 3)" in demo_help


@pytest.mark.parametrize("kind", SHIPPED)
def test_shipped_drafters_carry_no_code_copies(kind, tmp_path):
    """The package ships weights, config, card and log only; the trust_remote_code files and custom_generate/ come
    from the library's one source when a drafter is saved for the Hub (save_glide_checkpoint)."""
    from recipes.smollm2_drafters import SHIPPED_FILES
    from hf_specdraft import write_glide_custom_generate
    from hf_specdraft.glide import GlideForCausalLM, save_glide_checkpoint

    folder = SMOLLM2_DRAFTERS_DIR / kind
    if not folder.is_dir():
        pytest.skip(f"no shipped {kind} drafter in this checkout")
    assert sorted(p.name for p in folder.iterdir()) == sorted(SHIPPED_FILES)
    drafter = GlideForCausalLM.from_pretrained(folder)
    hub = save_glide_checkpoint(drafter, tmp_path / kind, custom_generate=write_glide_custom_generate)
    assert (hub / "modeling_glide.py").read_text() == (
        REPO / "hf_specdraft" / "glide" / "modeling_glide.py"
    ).read_text()
    # CAPE's Hub folder drafts from tokens alone: a GLIDE reading the target's state gets none (its card names the call)
    assert (hub / "custom_generate" / "generate.py").is_file() == (not drafter.config.state_input)


def test_the_fixed_grid_rows_run_and_the_report_weighs_auto_against_them(tiny_default, tmp_path):
    """The default calls' grid: auto rows beside fixed γ and CAPE budgets, lossless; the report's auto / best fixed."""
    import benchmarks.methods  # noqa: F401  (registers the fixed grid: the lab's rows)
    from benchmarks.report.render import auto_against_fixed, auto_line, render
    from hf_specdraft.bench import BenchConfig, run_bench

    methods = ("target-only", "vanilla", "vanilla-γ4", "vanilla-auto", "glide+cape-γ1b2", "draft-model-γ5")
    result = run_bench(
        load_default(tiny_default[0]),
        BenchConfig(methods=methods, num_prompts=1, max_new_tokens=8, warmup=0, repeats=1),
        output=tmp_path / "grid.json",
    )
    assert all(result["summary"][m]["equals_target_only"] == 1.0 for m in methods)
    summary = {
        "glide": {"speedup_vs_target_only": 1.2},
        "glide-γ2": {"speedup_vs_target_only": 1.3},
        "glide-auto": {"speedup_vs_target_only": 1.25},
        "glide+cape-γ1b2": {"speedup_vs_target_only": 1.1},
        "glide+cape-auto": {"speedup_vs_target_only": 1.2},
        "glide-γ2-static": {"speedup_vs_target_only": 9.0},
        "max-gram-auto": {"speedup_vs_target_only": 1.0},
    }
    assert auto_against_fixed(summary) == [
        ("glide-auto", 1.25, "glide-γ2", 1.3),
        ("glide+cape-auto", 1.2, "glide+cape-γ1b2", 1.1),
    ]
    assert "glide-auto 1.25× = 96% of glide-γ2 1.30×" in auto_line(summary)  # no fixed Max-Gram row: no Max-Gram pair
    assert "Auto against the best fixed setting" in render(tmp_path, checkpoint=tiny_default[0])
