"""Plain-text training corpora on this machine: the interpreter's stdlib sources and Debian's python3.11-doc.

Read by the label stage (:func:`text_documents`) and by the prompt builders, which mine stdlib functions and
docstrings (:func:`stdlib_modules`; :mod:`sage_plugin.train.data`, :mod:`sage_plugin.train.instructions`).
"""

from __future__ import annotations

import ast
import gzip
import logging
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = ["PYTHON_DOC_DIR", "python_doc_files", "stdlib_files", "stdlib_modules", "text_documents"]

PYTHON_DOC_DIR = Path("/usr/share/doc/python3.11")

_DOC_SKIP = ("changelog", "news", "history", "acks", "test_results", "pybench", "copyright", "readme.maintainers")


def stdlib_files(stdlib: str | Path | None = None) -> list[Path]:
    """The interpreter's stdlib ``.py`` files (``site-packages``/``dist-packages`` excluded), sorted."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    out = []
    for p in root.rglob("*.py"):
        parts = p.relative_to(root).parts
        if any(x in ("site-packages", "dist-packages", "__pycache__") for x in parts):
            continue
        if p.is_file():
            out.append(p)
    return sorted(out)


def python_doc_files(root: str | Path = PYTHON_DOC_DIR) -> list[Path]:
    """reST/text files of Debian's ``python3.11-doc`` (also ``.gz``); empty when the package is absent."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.rglob("*"):
        name = p.name.lower()
        base = name[:-3] if name.endswith(".gz") else name
        if not p.is_file() or not base.endswith((".rst", ".txt")):
            continue
        if any(base.startswith(s) for s in _DOC_SKIP):
            continue
        out.append(p)
    return sorted(out)


def _read_text(path: Path) -> str:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
                return fh.read()
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:  # unreadable file: skip
        logger.warning("skipping %s: %s", path, exc)
        return ""


def text_documents(seed: int, stdlib: str | Path | None = None, doc_root: str | Path = PYTHON_DOC_DIR):
    """(name, text) of every stdlib source and python3.11-doc file, in a seeded shuffled order."""
    files = stdlib_files(stdlib) + python_doc_files(doc_root)
    random.Random(seed).shuffle(files)
    for f in files:
        text = _read_text(f)
        if text.strip():
            yield str(f), text


def stdlib_modules(
    stdlib: str | Path | None = None, shuffle_seed: int | None = None
) -> Iterator[tuple[str, ast.Module]]:
    """(source, parsed module) of each stdlib file outside test directories, lazily; unparseable files skipped.

    Files come in :func:`stdlib_files` order, or shuffled by ``random.Random(shuffle_seed)`` when it is given.
    """
    files = [f for f in stdlib_files(stdlib) if not {"test", "tests", "idle_test"} & set(f.parts)]
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(files)
    for f in files:
        src = _read_text(f)
        try:
            yield src, ast.parse(src)
        except (SyntaxError, ValueError):
            continue
