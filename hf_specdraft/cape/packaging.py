"""Ship CAPE with a checkpoint: after ``write_custom_generate(d)``, with only torch and transformers installed,

    target.generate(input_ids=x, custom_generate=str(d), trust_remote_code=True, max_new_tokens=64)

runs greedy CAPE with the draft saved in ``d`` (or ``assistant_model=<draft>``), locally or from the Hub.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

TEMPLATE = Path(__file__).parent / "custom_generate"
CORE = Path(__file__).parents[1] / "core"
CARD = Path(__file__).with_name("card_template.md")  # the README.md written beside the folder ({repo} filled in)


def sibling_imports(path: Path) -> set[str]:
    """The flat siblings ``path`` imports: ``x`` of every ``from .x import y`` / ``from . import x``, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
    return found


def shipped_files() -> dict[str, Path]:
    """The folder's files by name and source: the two templates and what they import, transitively, as it is."""
    sources = {path.stem: path for path in sorted(CORE.glob("*.py")) if path.name != "__init__.py"}
    sources["expansion_sets"] = Path(__file__).parent / "expansion_sets.py"
    files = {"generate.py": TEMPLATE / "generate.py", "cape_draft.py": TEMPLATE / "cape_draft.py"}
    todo = list(files.values())
    while todo:
        for name in sorted(sibling_imports(todo.pop())):
            if f"{name}.py" in files:
                continue
            if name not in sources:
                raise RuntimeError(
                    f"custom_generate/ imports .{name}, which is neither a core module nor expansion_sets.py"
                )
            files[f"{name}.py"] = sources[name]
            todo.append(sources[name])
    return dict(sorted(files.items()))


def write_custom_generate(directory: str | Path, readme: bool = True) -> list[Path]:
    """Copy the CAPE ``custom_generate/`` folder into a checkpoint directory; returns the files written.

    Args:
        directory: the checkpoint directory (created if missing); files go to ``directory/custom_generate/``
            and replace earlier copies.
        readme: also write a ``README.md`` tagged ``custom_generate`` when the directory has none (a model
            card written by the checkpoint's own save path is left untouched).
    """
    target = Path(directory) / "custom_generate"
    target.mkdir(parents=True, exist_ok=True)
    written = [shutil.copyfile(source, target / name) for name, source in shipped_files().items()]
    card = Path(directory) / "README.md"
    if readme and not card.exists():
        card.write_text(CARD.read_text(encoding="utf-8").replace("{repo}", Path(directory).name), encoding="utf-8")
        written.append(card)
    return written
