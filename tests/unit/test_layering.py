"""Layering rules of sage_plugin.core, checked on the source (AST)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import sage_plugin.core

CORE = Path(sage_plugin.core.__file__).parent
MODULES = sorted(p for p in CORE.glob("*.py"))
HOT_PATH = ("entropy.py", "expand.py", "policies.py", "controller.py", "verify.py")
THIRD_PARTY_OK = {"torch", "numpy"}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, 0, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                yield node.lineno, node.level, node.module or "", alias.name


def test_core_modules_found():
    names = {p.name for p in MODULES}
    assert set(HOT_PATH) <= names and "tree.py" in names and "reference.py" in names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_core_imports_only_torch_stdlib_and_core(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for line, level, module, name in _imports(tree):
        top = module.split(".")[0]
        if level == 1:  # from .x import y: inside sage_plugin.core
            continue
        if level == 2:  # from ..x import y: only the config module
            if module != "config" and not (module == "" and name == "config"):
                bad.append(f"{path.name}:{line}: from {'.' * level}{module} import {name}")
            continue
        if level > 2:
            bad.append(f"{path.name}:{line}: relative import beyond sage_plugin")
            continue
        if top == "sage_plugin":
            if not (module == "sage_plugin.config" or module.startswith("sage_plugin.core")):
                bad.append(f"{path.name}:{line}: import {module}")
            continue
        if top in THIRD_PARTY_OK or top in STDLIB:
            continue
        bad.append(f"{path.name}:{line}: import {module}")
    assert not bad, "core must import only torch/numpy/stdlib/core/config:\n" + "\n".join(bad)


def test_reference_imports_only_torch_and_stdlib():
    tree = ast.parse((CORE / "reference.py").read_text())
    for _, level, module, _ in _imports(tree):
        assert level == 0 and (module.split(".")[0] in STDLIB or module == "torch"), module


@pytest.mark.parametrize("name", HOT_PATH)
def test_no_host_sync_calls_in_hot_path(name):
    """No ``.item()`` / ``.tolist()`` (device -> host copies) in the batched hot path."""
    path = CORE / name
    tree = ast.parse(path.read_text(), filename=str(path))
    hits = [
        f"{name}:{node.lineno}: .{node.func.attr}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("item", "tolist")
    ]
    assert not hits, "\n".join(hits)
