"""The import contract: the core imports no method, each method package only the core, composition sits above.

Every ``import`` / ``from ... import`` in hf_specdraft (function-level ones included) is resolved to the
package or core module it reaches; an arrow from a lower layer to a higher one, or between two methods,
fails the test with the file that draws it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_specdraft"
CORE = {"generation", "batched", "batch_drafting", "tree", "acceptance", "drafting", "metrics", "support", "projection", "validation"}
METHODS = {"glide", "cape", "cascade", "casd"}
COMPOSITION = {"__init__", "__main__", "cli", "defaults", "bench"}


def unit(parts: tuple[str, ...]) -> str:
    """The layer unit of a module path inside hf_specdraft: a core module, a method package or a composition one."""
    return parts[0].removesuffix(".py") if parts else "__init__"


def imports(path: Path) -> set[str]:
    """The hf_specdraft units that ``path`` imports."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    package = parts[:-1]  # the package holding this module (for __init__.py: the package itself)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            target = base + tuple(node.module.split(".") if node.module else ())
            if not target:  # `from . import x` at the top level: x itself
                target = tuple(alias.name for alias in node.names[:1])
            found.add(unit(target))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hf_specdraft":
            found.add(unit(tuple(node.module.split(".")[1:])))
        elif isinstance(node, ast.Import):
            found |= {unit(tuple(a.name.split(".")[1:])) for a in node.names if a.name.split(".")[0] == "hf_specdraft"}
    return found


def arrows() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if "custom_generate" in parts:  # files shipped into checkpoints: they import their siblings, checked in their own tests
            continue
        source = unit(parts)
        out += [(source, target, str(path.relative_to(PACKAGE.parent))) for target in imports(path) if target != source]
    return out


def test_every_unit_has_a_layer():
    units = {unit(p.relative_to(PACKAGE).parts) for p in PACKAGE.rglob("*.py") if "custom_generate" not in p.parts}
    assert units <= CORE | METHODS | COMPOSITION, f"classify {sorted(units - CORE - METHODS - COMPOSITION)} in tests/test_layers.py"


def test_no_import_runs_against_the_layers():
    against = [(s, t, f) for s, t, f in arrows()
               if (s in CORE and t not in CORE) or (s in METHODS and t not in CORE)]
    assert not against, "imports against the layers:\n" + "\n".join(f"  {f}: {s} -> {t}" for s, t, f in against)


@pytest.mark.parametrize("source, expected", [("hf_specdraft/glide/candidate_generator.py", {"drafting", "tree", "glide"}),
                                              ("hf_specdraft/bench/casd_retrieval.py", {"casd", "defaults", "bench"})])
def test_the_resolver_sees_relative_and_nested_imports(source, expected):
    assert expected <= imports(PACKAGE.parent / source) | {unit(Path(source).relative_to("hf_specdraft").parts)}


def test_composition_hooks_refuse_bad_arguments():
    from hf_specdraft.drafting import register_drafter
    from hf_specdraft.glide.model_card import set_custom_generate_writer

    with pytest.raises(ValueError, match="model_type"):
        register_drafter("", lambda model, gamma: None)
    with pytest.raises(TypeError, match="factory"):
        register_drafter("my-draft", "not callable")
    with pytest.raises(TypeError, match="writer"):
        set_custom_generate_writer("custom_generate/")
