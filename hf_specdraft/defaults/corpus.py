"""The embedded default's local corpus: Python source that exists wherever hf-specdraft is installed.

The corpus is the ``.py`` files of the standard library (found with ``sysconfig``) and of a fixed list of
installed dependencies. Files are split into train / held-out *by file*, deterministically, from a hash of
their path relative to their source root, so the same installation always yields the same split and no
file is ever in both. Library versions are recorded, because a different version is a different corpus.

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

    def describe(self) -> dict:
        return {
            "train_files": len(self.train),
            "heldout_files": len(self.heldout),
            "versions": self.versions,
            "heldout_percent": HELDOUT_PERCENT,
        }


def is_heldout(name: str) -> bool:
    """Whether a file (by its stable name) belongs to the held-out split."""
    digest = hashlib.sha1(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def _walk_py(root: Path, prefix: str, skip_site_packages: bool = False) -> list[SourceFile]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d != "__pycache__" and not (skip_site_packages and d in ("site-packages", "dist-packages"))
        )
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            path = Path(dirpath) / filename
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if 0 < size <= MAX_FILE_BYTES:
                files.append(SourceFile(f"{prefix}/{path.relative_to(root).as_posix()}", path))
    return files


def source_roots(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> dict[str, Path]:
    """Map each corpus source ("stdlib", package names) to the directory holding its source."""
    roots = {"stdlib": Path(sysconfig.get_paths()["stdlib"])}
    for name in packages:
        module = importlib.import_module(name)
        roots[name] = Path(module.__file__).parent
    return roots


def build_corpus(packages: tuple[str, ...] = DEFAULT_PACKAGES, roots: dict[str, Path] | None = None) -> Corpus:
    """Collect and split the corpus.

    Args:
        packages: installed packages whose ``.py`` files join the standard library's.
        roots: explicit ``{source name: directory}`` instead (tests use a small tree).

    Raises:
        ValueError: a root that is not a readable directory, or a corpus with no file in a split.
    """
    roots = dict(roots) if roots is not None else source_roots(packages)
    files: list[SourceFile] = []
    for prefix, root in roots.items():
        root = Path(root)
        if not root.is_dir() or not os.access(root, os.R_OK):
            raise ValueError(f"corpus root {prefix!r}={str(root)!r} is not a readable directory")
        files.extend(_walk_py(root, prefix, skip_site_packages=prefix == "stdlib"))
    files.sort(key=lambda f: f.name)
    train = [f for f in files if not is_heldout(f.name)]
    heldout = [f for f in files if is_heldout(f.name)]
    if not train or not heldout:
        raise ValueError(
            f"the corpus under {sorted(roots)} has {len(train)} train and {len(heldout)} held-out files; both must be "
            "non-empty"
        )
    versions = {"python": sys.version.split()[0]}
    for prefix in roots:
        if prefix != "stdlib":
            try:
                versions[prefix] = importlib.metadata.version(prefix)
            except importlib.metadata.PackageNotFoundError:
                versions[prefix] = "unknown"
    return Corpus(train=train, heldout=heldout, versions=versions)
