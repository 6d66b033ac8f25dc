"""The text users read speaks of the project: the package's docstrings and comments, README.md, BENCHMARKS.md and
docs/*.md hold no issue numbers ("#49"), no paper cited by a file name a reader cannot open ("glide_cape.txt": papers
are cited by authors and year, with the full entry in docs/references.md), no folders outside the repository
("../shared"), and nothing about the machines or the work that produced the project (work "sessions", machines
"lent", device-time budgets)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A '#' and two or three digits, not inside a word, a path, an HTML entity (&#39;) or a URL fragment; hex colours
# ('#333', "#1f77b4") are taken out of a line before it is searched.
ISSUE = re.compile(r"(?<![\w/&])#\d{2,3}\b(?![\w-])")
COLOUR = re.compile(r"(['\"])#(?:[0-9a-fA-F]{3}){1,2}\1")
FORBIDDEN = {
    "an issue number": ISSUE,
    "an issue named by number": re.compile(r"\b[Ii]ssues? \d+\b"),
    "a paper cited by its file name": re.compile(r"\b(?:glide_cape|cascade_speculative_drafting|casd)\.txt\b"),
    "a folder outside the repository": re.compile(r"\.\./shared\b"),
    "a machine lent": re.compile(r"\blent\b"),
    "a device-time budget": re.compile(r"budget_left_s|device time"),
    "a work session": re.compile(r"\bsessions?\b", re.IGNORECASE),
    "a numbered habit": re.compile(r"\bHabits? \d+\b"),
}


def _files():
    yield from sorted((ROOT / "hf_specdraft").rglob("*.py"))
    yield from sorted((ROOT / "hf_specdraft").rglob("*.md"))
    yield from (ROOT / name for name in ("README.md", "BENCHMARKS.md"))
    yield from sorted((ROOT / "docs").glob("*.md"))


def find_forbidden(text: str) -> list[tuple[int, str, str]]:
    """``(line number, what, the line)`` for every line of ``text`` that holds one of :data:`FORBIDDEN`."""
    hits = []
    for number, line in enumerate(text.splitlines(), start=1):
        searched = COLOUR.sub("", line)
        for what, pattern in FORBIDDEN.items():
            if pattern.search(searched):
                hits.append((number, what, line.strip()))
    return hits


@pytest.mark.parametrize(
    "text",
    [
        "Since #49 a GLIDE-family drafter copies",
        "(issue #32: auto >= 95 % of the best)",
        "Goal (issue 2): ratio",
        "(glide_cape.txt §4.1)",
        "casd.txt Algorithm 1",
        "see ../shared/papers",
        "on a lent GPU machine",
        "the `budget_left_s` that status reports",
        "earlier sessions' VMs",
        "Habit 13: benchmarks/ import the package",
    ],
)
def test_the_check_sees_what_it_forbids(text):
    assert find_forbidden(text)


@pytest.mark.parametrize(
    "text",
    [
        "color: #1f77b4",
        "edgecolor='#333'",
        "[Draft length](usage.md#draft-length)",
        "&#39;",
        "x[#1]",
        "https://github.com/org/repo/pull/12#issuecomment-1",
        "CAPE's budget 'auto'",
        "verification_budget (default 32)",
        "Du et al. 2024, §4.1",
        "test_glide_cape_hub.py",
        "the silent glimpse is learnt again",
    ],
)
def test_the_check_leaves_ordinary_text(text):
    assert not find_forbidden(text)


def test_text_speaks_of_the_project():
    found = []
    for path in _files():
        for number, what, line in find_forbidden(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line[:120]}")
    assert not found, "text about the work, not the project:\n" + "\n".join(found)


def test_every_paper_cited_is_in_the_bibliography():
    references = (ROOT / "docs" / "references.md").read_text(encoding="utf-8")
    for short in ("Du et al. 2024", "Chen et al. 2024", "Leviathan et al. 2023", "Xia et al. 2024", "CASD paper"):
        assert short in references, short


# The folders of the machine a result was produced on; a recorded command or log names repository-relative paths
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|check)/")
RECORDED = (".py", ".md", ".json", ".jsonl", ".sh", ".txt", ".toml", ".cfg", ".ipynb")


def test_machine_path_check_sees_what_it_forbids():
    assert MACHINE_PATH.search('"output_dir": "/work/drafters/state/glide"')
    assert MACHINE_PATH.search("--tokenizer /root/.cache/x")
    assert not MACHINE_PATH.search("store/requests/answers and benchmarks/work/x and https://host/work/")


def test_recorded_files_name_no_machine_folder():
    found = []
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if path.suffix not in RECORDED or path.name == Path(__file__).name or not path.is_file():
            continue
        if any(
            part.startswith(".") or part in ("build", "__pycache__") or part.endswith(".egg-info") for part in parts
        ):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "absolute folders of the machine that produced a file:\n" + "\n".join(found)
