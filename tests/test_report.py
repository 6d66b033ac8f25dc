"""The README's and BENCHMARKS.md's per-group table, rendered from a ``hf-specdraft bench --prompts`` result."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from benchmarks.report.headline import GROUPS_END, GROUPS_START, groups_table, write_groups
from benchmarks.report.render import render

README = Path(__file__).resolve().parents[1] / "README.md"


def method(speedup: float, linears: float | None = None, mal: float = 1.0, equal: float = 1.0) -> dict:
    return {
        "speedup_vs_target_only": speedup,
        "speedup_vs_target_only_linears": linears,
        "mal": mal,
        "equals_target_only": equal,
        "valid": True,
    }


@pytest.fixture
def groups_json(tmp_path) -> Path:
    """Two groups and overall, three methods; the default call did not run on code, Max-Gram's tokens differed once."""
    categories = {
        "translation": {"target-only": method(1.0, 1.02), "glide+copy-auto": method(1.25, 1.3, 1.8)},
        "code": {"target-only": method(1.0, 1.01), "max-gram-auto": method(0.9, 0.95, 1.2)},
        "overall": {"target-only": method(1.0, 1.01), "glide+copy-auto": method(1.1, 1.12, 1.5)},
    }
    categories["translation"]["max-gram-auto"] = method(1.4, 1.45, 1.6, equal=0.5)
    categories["overall"]["max-gram-auto"] = method(1.05, 1.07, 1.3, equal=0.75)
    result = {
        "meta": {
            "prompts": "questions.jsonl",
            "hardware": "CPU: test, 2 threads",
            "dtype": "float32",
            "questions": 3,
            "turns": 4,
            "max_new_tokens": 32,
            "date": "2026-11-29 08:00:00 UTC",
        },
        "timing": {"repeats": 3},
        "categories": {name: {"prompts": 2, "questions": 1, "methods": ms} for name, ms in categories.items()},
    }
    path = tmp_path / "benchmarks" / "demo" / "groups.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result))
    return path


def rows(table: str) -> dict[str, str]:
    return {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}


def test_one_row_per_group_then_overall_and_a_caption(groups_json):
    table = groups_table(groups_json)
    assert list(rows(table)) == ["group", "translation", "code", "overall"]
    assert (
        rows(table)["overall"] == "| overall | 1.10× | 1.12× | 1.50 | glide+copy-auto 1.10× | **no**: max-gram-auto |"
    )
    caption = table.splitlines()[-1]
    for part in (
        "CPU: test, 2 threads",
        "float32",
        "3 questions (4 turns)",
        "32 new tokens",
        "median of 3",
        "2026-11-29",
    ):
        assert part in caption, part
    assert f"`{groups_json.as_posix()}`" in caption


def test_the_fastest_method_is_never_plain_generate(groups_json):
    # on code plain generate (1.00×) beat Max-Gram (0.90×): the column still names the fastest speculative method
    assert rows(groups_table(groups_json))["code"].split(" | ")[4] == "max-gram-auto 0.90×"
    assert rows(groups_table(groups_json))["translation"].split(" | ")[4] == "max-gram-auto 1.40×"


def test_a_method_absent_from_a_group_shows_a_dash(groups_json):
    assert rows(groups_table(groups_json))["code"] == "| code | – | – | – | max-gram-auto 0.90× | yes |"


def test_a_method_whose_tokens_differed_is_named(groups_json):
    table = rows(groups_table(groups_json))
    assert (
        table["translation"] == "| translation | 1.25× | 1.30× | 1.80 | max-gram-auto 1.40× | **no**: max-gram-auto |"
    )
    assert table["code"].endswith("| yes |")


def test_the_readme_markers_are_rewritten_and_the_rest_kept(groups_json, tmp_path):
    readme = tmp_path / "README.md"
    shutil.copy(README, readme)
    original = readme.read_text()
    assert write_groups(readme, groups_json) and write_groups(readme, groups_json)  # twice: one table, not two
    text = readme.read_text()
    before, rest = text.split(GROUPS_START)
    inside, after = rest.split(GROUPS_END)
    assert inside == f"\n{groups_table(groups_json)}\n"
    assert before == original.split(GROUPS_START)[0] and after == original.split(GROUPS_END)[1]
    assert len(text.splitlines()) <= 200  # tests/test_readme.py's limit
    assert not write_groups(readme, tmp_path / "absent.json") and readme.read_text() == text
    readme.write_text("no markers\n")
    assert not write_groups(readme, groups_json) and readme.read_text() == "no markers\n"


def test_benchmarks_md_shows_the_table_when_the_run_exists(groups_json, tmp_path):
    results = groups_json.parents[1] / "results"
    results.mkdir()
    text = render(results, drafters_dir=tmp_path)
    assert "## Held-out task groups" in text and groups_table(groups_json) in text
    groups_json.unlink()
    assert "## Held-out task groups" not in render(results, drafters_dir=tmp_path)


def test_benchmarks_md_shows_the_same_run_on_other_machines_after_the_readme_s(groups_json, tmp_path):
    results = groups_json.parents[1] / "results"
    results.mkdir()
    other = groups_json.parents[1] / "verification" / "other-cpu" / "groups.json"
    other.parent.mkdir(parents=True)
    result = json.loads(groups_json.read_text())
    result["meta"]["hardware"] = "CPU: another, 2 threads"
    result["categories"]["overall"]["methods"]["glide+copy-auto"] = method(1.9, 1.4, 1.6)
    other.write_text(json.dumps(result))
    text = render(results, drafters_dir=tmp_path)
    ours, theirs = groups_table(groups_json), groups_table(other)
    assert ours in text and theirs in text and text.index(ours) < text.index(theirs)
    assert "CPU: another, 2 threads" in theirs and "| overall | 1.90× | 1.40× | 1.60 |" in theirs


def test_a_result_without_groups_is_refused(tmp_path):
    path = tmp_path / "completion.json"
    path.write_text(json.dumps({"meta": {}, "summary": {}}))
    with pytest.raises(ValueError, match="has no 'categories'"):
        groups_table(path)


def test_every_command_benchmarks_md_gives_names_a_module_that_exists():
    """Results recorded before the studies moved out of the package name them by their old module: the report gives
    the command as it runs today."""
    text = (README.parent / "BENCHMARKS.md").read_text()
    modules = set(re.findall(r"python3? -m ([\w.]+)", text))
    assert modules, "BENCHMARKS.md gives no command"
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert not missing, missing
