"""The import contract: the core imports no method, each method package only the core, composition sits above; no
cycles; and the library never imports the lab beside it (``benchmarks/``, ``recipes/``).

Every ``import`` / ``from ... import`` in hf_specdraft (function-level ones included) is resolved to the
package or core module it reaches; an arrow from a lower layer to a higher one, or between two methods,
fails the test with the file that draws it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_specdraft"
CORE = {"core"}  # hf_specdraft/core/: the loop and the steps it is made of
METHODS = {"glide", "cape", "cascade", "casd"}
COMPOSITION = {"__init__", "__main__", "cli", "defaults", "bench"}
LAB = {"benchmarks", "recipes"}  # studies and training recipes beside the package: they import it, never the reverse


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
        if (
            "custom_generate" in parts
        ):  # files shipped into checkpoints: they import their siblings, checked in their own tests
            continue
        source = unit(parts)
        out += [(source, target, str(path.relative_to(PACKAGE.parent))) for target in imports(path) if target != source]
    return out


def test_every_unit_has_a_layer():
    units = {unit(p.relative_to(PACKAGE).parts) for p in PACKAGE.rglob("*.py") if "custom_generate" not in p.parts}
    assert units <= CORE | METHODS | COMPOSITION, (
        f"classify {sorted(units - CORE - METHODS - COMPOSITION)} in tests/test_layers.py"
    )


def test_no_import_runs_against_the_layers():
    against = [(s, t, f) for s, t, f in arrows() if (s in CORE and t not in CORE) or (s in METHODS and t not in CORE)]
    assert not against, "imports against the layers:\n" + "\n".join(f"  {f}: {s} -> {t}" for s, t, f in against)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("hf_specdraft/glide/candidate_generator.py", {"core", "glide"}),
        ("hf_specdraft/defaults/loading.py", {"cascade", "defaults", "glide"}),
    ],
)
def test_the_resolver_sees_relative_and_nested_imports(source, expected):
    assert expected <= imports(PACKAGE.parent / source) | {unit(Path(source).relative_to("hf_specdraft").parts)}


def lab_imports(path: Path) -> set[str]:
    """The lab modules (``benchmarks...``, ``recipes...``) that ``path`` imports, function-level ones and
    ``importlib.import_module("...")`` / ``__import__("...")`` of a literal name included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        found |= {name for name in names if name.split(".")[0] in LAB}
    return found


def test_the_package_never_imports_the_lab():
    """The library is what users run, the lab lives beside it: benchmarks/ and recipes/ import hf_specdraft; nothing in
    hf_specdraft imports them (they are not installed with it)."""
    found = {str(p.relative_to(PACKAGE.parent)): lab_imports(p) for p in sorted(PACKAGE.rglob("*.py"))}
    found = {path: names for path, names in found.items() if names}
    assert not found, "the package imports the lab:\n" + "\n".join(
        f"  {path}: {sorted(names)}" for path, names in found.items()
    )


@pytest.mark.parametrize(
    "line",
    [
        "import benchmarks.studies.k_sweep",
        "from recipes.training import train_default",
        "def f():\n    from recipes import training",
        "importlib.import_module('benchmarks.studies.overhead')",
        "from benchmarks import studies",
    ],
)
def test_the_lab_check_sees_an_import_of_the_lab(line, tmp_path):
    path = tmp_path / "module.py"
    path.write_text("import torch\n" + line + "\n")
    assert lab_imports(path)
    # not the lab
    path.write_text("from .recipes import x\nimport benchmarking\nfrom hf_specdraft.bench import run_bench\n")
    assert not lab_imports(path)


def test_the_package_s_bench_rows_are_baselines_and_default_calls():
    """``hf-specdraft bench`` and ``demo`` run the library's own defaults: the package registers the baselines and the
    ``*-auto`` calls; rows at a fixed γ, tree size or K matrix (numbers tuned on one machine) come from the lab."""
    import subprocess

    code = "import sys, hf_specdraft.bench as b; print(' '.join(b.METHODS)); print('benchmarks' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    names, lab_imported = done.stdout.split("\n")[:2]
    baselines = {
        "target-only",
        "target-only+linears",
        "stock-assisted",
        "stock-assisted+linears",
        "prompt-lookup",
        "prompt-lookup+linears",
        "null-drafter",
        "stock-assisted-glide",
        "stock-assisted-vanilla",
    }
    fixed = [
        n for n in names.split() if n not in baselines and not re.search(r"-auto(-static|-compiled)?$|^target-only-", n)
    ]
    assert not fixed and lab_imported == "False", f"rows with fixed settings in the package: {fixed}"


def test_the_layout_doc_names_every_module_of_the_package():
    """docs/layout.md is the one map of the house: every module of the package has its line there."""
    text = (PACKAGE.parent / "docs" / "layout.md").read_text()
    missing = [
        str(p.relative_to(PACKAGE.parent))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.stem not in ("__init__", "__main__") and not re.search(rf"\b{re.escape(p.name)}", text)
    ]
    assert not missing, f"add a line for each to docs/layout.md: {missing}"


def test_composition_hooks_refuse_bad_arguments():
    from hf_specdraft.core.drafting import register_drafter
    from hf_specdraft.glide.model_card import save_glide_checkpoint

    with pytest.raises(ValueError, match="model_type"):
        register_drafter("", lambda model, gamma: None)
    with pytest.raises(TypeError, match="factory"):
        register_drafter("my-draft", "not callable")
    with pytest.raises(TypeError, match="custom_generate must be callable"):
        save_glide_checkpoint(None, "unused", custom_generate="custom_generate/")


def module_of(path: Path) -> str:
    """Dotted module name of a file inside hf_specdraft (a package's ``__init__`` is the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, known: set[str]) -> set[str]:
    """The hf_specdraft modules ``path`` imports, function-level ones included (``from . import x`` counts as ``x``);
    an import under ``if TYPE_CHECKING:`` (annotations only) never runs, so it draws no arrow."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    found, tree = set(), ast.parse(path.read_text())
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + (node.module.split(".") if node.module else []))
            else:
                module = node.module or ""
            candidates = [f"{module}.{alias.name}" for alias in node.names] + [module]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for name in candidates:
            if name in known:
                found.add(name)
                break
    return found


def import_graph() -> dict[str, set[str]]:
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if "custom_generate" not in p.parts]
    known = {module_of(p) for p in files}
    return {module_of(p): module_imports(p, known) - {module_of(p)} for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_anywhere_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "hf_specdraft.core.tree" in graph["hf_specdraft.core.loop"]  # the resolver reads relative imports
    assert "hf_specdraft.glide.training" in graph["hf_specdraft.glide"]  # and function-level `from . import x`


def test_the_core_imports_only_torch_transformers_and_its_siblings():
    """What lets write_custom_generate ship the core's own files as flat siblings in a checkpoint."""
    allowed = {"torch", "transformers", "__future__"}
    for path in sorted((PACKAGE / "core").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module, f"{path.name}: only `from .sibling import x` inside the core"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                for name in names:
                    top = name.split(".")[0]
                    assert top in allowed or top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_the_core_s_reading_order_names_every_module():
    """hf_specdraft/core/__init__.py is a newcomer's map of the core: its reading order names every module there."""
    named = set(re.findall(r":mod:`\.(\w+)`", (PACKAGE / "core" / "__init__.py").read_text()))
    modules = {p.stem for p in (PACKAGE / "core").glob("*.py")} - {"__init__"}
    assert named == modules, (
        f"not in core/__init__.py's reading order: {sorted(modules - named)}; gone: {sorted(named - modules)}"
    )


# core/layouts.py, core/static_layout.py
LAYOUTS = {"CacheLayout", "DynamicLayout", "OwnedRow", "SharedBatch", "StaticLayout"}
DRAFT_CACHES = {"DraftCache", "DynamicDraftCache", "StaticDraftCache"}  # core/draft_cache.py
LAYOUT_HOMES = {"core/layouts.py", "core/static_layout.py", "core/draft_cache.py"}  # where they are defined and built


def layout_branches(path: Path) -> list[str]:
    """Where ``path`` branches on a cache layout or a draft cache: an ``isinstance`` naming one of their classes, a
    ``shared`` flag read, or (outside :data:`LAYOUT_HOMES`) a ``compiled`` flag read."""
    found, home = [], path.is_relative_to(PACKAGE) and path.relative_to(PACKAGE).as_posix() in LAYOUT_HOMES
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            named = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", None) for n in ast.walk(node.args[1])}
            if named & (LAYOUTS | DRAFT_CACHES):
                found.append(f"{path.name}:{node.lineno} isinstance on {sorted(named & (LAYOUTS | DRAFT_CACHES))}")
        if isinstance(node, ast.Attribute) and (node.attr == "shared" or node.attr == "compiled" and not home):
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
    return found


def test_no_module_branches_on_a_cache_layout():
    """The step calls one interface (core/layouts.py's CacheLayout), a drafter drafts on one (core/draft_cache.py's
    DraftCache): no module asks which layout or draft cache it holds, or whether it is compiled, outside the three
    modules that define and build them (not even those ask which layout or draft cache it is)."""
    branches = [b for path in sorted(PACKAGE.rglob("*.py")) for b in layout_branches(path)]
    assert not branches, branches


def test_the_layout_check_sees_a_branch(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(cache, draft):\n    if isinstance(cache, (StaticLayout, int)) or isinstance(draft, StaticDraftCache):\n"
        "        return cache.shared or cache.compiled\n"
    )
    assert len(layout_branches(probe)) == 4


STEP_MODULES = ("loop.py", "meter.py", "emission.py", "layouts.py", "outputs.py")
PROBES = ("getattr", "hasattr")  # a capability asked of a drafter at run time instead of declared once
DECLARATION_READERS = ("traits_of", "transformers_protocol")  # where a drafter's declarations are read (once)
DRAFTERS = ("generator", "drafter", "together", "proposer")  # how the core names a drafter or a batch proposer
WRITERS = ("set_step", "setattr")  # calls that would tell a drafter something by changing it


def names_a_drafter(node: ast.AST) -> bool:
    return ast.unparse(node).endswith(DRAFTERS)


def drafter_probes(path: Path, writes: bool = True) -> list[str]:
    """Where ``path`` probes a drafter with ``getattr`` or ``hasattr`` (outside :data:`DECLARATION_READERS`) or, with
    ``writes``, writes an attribute into one (``x.generator.y = ...``, ``drafter.y += ...``, ``setattr(drafter, ...)``)
    or calls a setter on one (``drafter.set_step(...)``)."""
    found = []
    tree = ast.parse(path.read_text())
    readers = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef) and f.name in DECLARATION_READERS
        for n in ast.walk(f)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in PROBES
            and node.args
            and id(node) not in readers
        ):
            named = ast.unparse(node.args[0])
            if "generator" in named or "drafter" in named:
                found.append(f"{path.name}:{node.lineno} {node.func.id}({named}, ...)")
        if not writes:
            continue
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        for target in targets:
            for part in ast.walk(target):  # a tuple target's parts too
                if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store) and names_a_drafter(part.value):
                    found.append(f"{path.name}:{node.lineno} {ast.unparse(part)} = ...")
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name == "set_step" or name in WRITERS and node.args and names_a_drafter(node.args[0]):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}(...)")
    return found


def tree_generator_checks(path: Path) -> list[str]:
    """Where ``path`` asks whether a drafter is an hf_specdraft one (``isinstance(..., TreeCandidateGenerator)``)."""
    return [
        f"{path.name}:{node.lineno} {ast.unparse(node)}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "isinstance"
        and len(node.args) == 2
        and "TreeCandidateGenerator" in {getattr(n, "id", getattr(n, "attr", None)) for n in ast.walk(node.args[1])}
    ]


def test_the_step_reads_declared_traits_and_tells_drafters_by_argument():
    """The core reads what a drafter declares once per call (core/drafting.py DrafterTraits, read by traits_of) and the
    step tells it what it chose through one declared object per step (DraftRequest, answered by draft_tree) and what it
    kept through another (DraftOutcome, to learn): no getattr or hasattr probe of a drafter anywhere in the core (the
    controller's key, the drafters' shared helpers and the state request included), no attribute written into a drafter
    or batch proposer by the step, no set_step."""
    probes = [
        p
        for path in sorted((PACKAGE / "core").glob("*.py"))
        for p in drafter_probes(path, writes=path.name in STEP_MODULES)
    ]
    assert not probes, probes


def test_cape_composes_its_drafter_through_the_contract():
    """CAPE widens any chain drafter through what that drafter declares (traits_of, beam_scorer) and the request it is
    handed: no getattr or hasattr probe of it, no attribute written into it, anywhere in cape/."""
    probes = [p for path in sorted((PACKAGE / "cape").rglob("*.py")) for p in drafter_probes(path)]
    assert not probes, probes


def test_the_step_sees_one_kind_of_drafter():
    """transformers' own CandidateGenerators are wrapped once, when the call resolves its drafter (core/inputs.py), so
    no module of the step asks whether a drafter is an hf_specdraft one."""
    checks = [c for name in STEP_MODULES for c in tree_generator_checks(PACKAGE / "core" / name)]
    assert not checks, checks


def test_a_drafter_with_compile_draft_declares_it():
    """The loop compiles a drafter's draft where its traits allow (``compiles_draft``), so every drafter class in the
    package that has ``compile_draft`` declares it (CAPE: where its wrapped drafter does), and none that lacks it."""
    import hf_specdraft.cape  # noqa: F401  (every method's drafters, loaded)
    import hf_specdraft.cascade  # noqa: F401
    import hf_specdraft.casd  # noqa: F401
    import hf_specdraft.glide  # noqa: F401
    from hf_specdraft.core import state_drafting  # noqa: F401
    from hf_specdraft.core.drafting import TreeCandidateGenerator

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    drafters = {c for c in subclasses(TreeCandidateGenerator) if c.__module__.startswith("hf_specdraft")}
    declared = {c: c.compiles_draft for c in drafters}
    assert sum(v is True for v in declared.values()) >= 3, declared  # the draft model, GLIDE, the cascade
    for cls, value in declared.items():
        has = callable(getattr(cls, "compile_draft", None))
        assert value is True or isinstance(value, property) if has else value is False, (cls.__name__, value)


def test_the_probe_check_sees_a_probe(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(row, drafter):\n    if getattr(row.generator, 'x', 0) or hasattr(drafter, 'compile_draft'):\n"
        "        drafter.num_draft_tokens = 3\n\n\ndef traits_of(generator):\n    return getattr(generator, 'x', 0)\n"
    )
    # traits_of's read is not one
    assert sorted(p.split(" ", 1)[1] for p in drafter_probes(probe)) == [
        "drafter.num_draft_tokens = ...",
        "getattr(row.generator, ...)",
        "hasattr(drafter, ...)",
    ]
    assert len(drafter_probes(probe, writes=False)) == 2
    probe.write_text(
        "def g(row, step, gamma):\n    row.generator.set_step(stop_rule=None)\n"
        "    step.cache.together.num_draft_tokens = gamma\n    row.generator.budget, x = 3, 4\n"
        "    row.generator.calls += 1\n    setattr(row.generator, 'host_text', [])\n"
        "    row.tokens = []\n    request = step.meter.request(row)\n"
    )
    # a row's own fields, a request built: no writes into a drafter
    assert sorted(p.split(" ", 1)[1] for p in drafter_probes(probe)) == [
        "row.generator.budget = ...",
        "row.generator.calls = ...",
        "row.generator.set_step(...)",
        "setattr(...)",
        "step.cache.together.num_draft_tokens = ...",
    ]
    probe.write_text(
        "def h(generator, drafter):\n    return isinstance(generator, TreeCandidateGenerator) or (\n"
        "        isinstance(drafter, (drafting.TreeCandidateGenerator, int)))\n"
        "    return isinstance(drafter, CandidateGenerator)\n"
    )
    assert len(tree_generator_checks(probe)) == 2
