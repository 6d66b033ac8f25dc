"""The embedded default's local corpus: the ``.py`` files of the standard library and of a fixed list of installed
dependencies, which exist wherever hf-specdraft is installed. Files are split into train / held-out *by file*, from a
hash of their path relative to their source root, so an installation always yields the same split and no file is in
both. Library versions are recorded: a different version is a different corpus.

    >>> from hf_specdraft.defaults.corpus import build_corpus
    >>> corpus = build_corpus()
    >>> len(corpus.train) > len(corpus.heldout) > 0
    True
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

# The dependencies whose source joins the standard library. All are installed with hf-specdraft itself.
DEFAULT_PACKAGES = ("transformers", "torch", "accelerate", "huggingface_hub", "tokenizers", "safetensors", "tqdm")
HELDOUT_PERCENT = 5  # 1 file in 20 is held out; by path hash, so the split never depends on file order
MAX_FILE_BYTES = 400_000  # generated tables and vendored blobs teach nothing about code


@dataclass(frozen=True)
class SourceFile:
    """One corpus file. ``name`` is ``<root>/<relative path>``, stable across machines."""

    name: str
    path: Path

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


@dataclass
class Corpus:
    """Train / held-out file lists and the versions that define them."""

    train: list[SourceFile]
    heldout: list[SourceFile]
    versions: dict[str, str] = field(default_factory=dict)


def is_heldout(name: str) -> bool:
    """Whether a file (by its stable name) belongs to the held-out split."""
    digest = hashlib.sha1(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def build_corpus(packages: tuple[str, ...] = DEFAULT_PACKAGES, roots: dict[str, Path] | None = None) -> Corpus:
    """Collect and split the corpus.

    Args:
        packages: installed packages whose ``.py`` files join the standard library's.
        roots: explicit ``{source name: directory}`` instead (tests use a small tree).

    Raises:
        ValueError: a root that is not a readable directory, or a corpus with no file in a split.
    """
    if roots is None:
        roots = {"stdlib": sysconfig.get_paths()["stdlib"]}
        roots |= {name: Path(importlib.import_module(name).__file__).parent for name in packages}
    files: list[SourceFile] = []
    for prefix, root in roots.items():
        root = Path(root)
        if not root.is_dir() or not os.access(root, os.R_OK):
            raise ValueError(f"corpus root {prefix!r}={str(root)!r} is not a readable directory")
        skip = {"__pycache__", *(("site-packages", "dist-packages") if prefix == "stdlib" else ())}
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(set(dirnames) - skip)
            for path in (Path(dirpath) / name for name in sorted(filenames) if name.endswith(".py")):
                try:
                    size = path.stat().st_size
                except OSError:
                    continue
                if 0 < size <= MAX_FILE_BYTES:
                    files.append(SourceFile(f"{prefix}/{path.relative_to(root).as_posix()}", path))
    files.sort(key=lambda f: f.name)
    train = [f for f in files if not is_heldout(f.name)]
    heldout = [f for f in files if is_heldout(f.name)]
    if not train or not heldout:
        raise ValueError(
            f"the corpus under {sorted(roots)} has {len(train)} train and {len(heldout)} held-out files; both must be "
            "non-empty"
        )
    versions = {
        "python": sys.version.split()[0],
        **{prefix: _version(prefix) for prefix in roots if prefix != "stdlib"},
    }
    return Corpus(train=train, heldout=heldout, versions=versions)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
