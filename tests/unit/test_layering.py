"""The package's structure, checked on the source (AST): layers, import cycles, module size, hot-path syncs, docs.

Layers (a module imports only from lower layers or its own package; ``docs/design/architecture.md`` draws the map)::

    6  cli
    5  bench, train, config_reference, machine_setup
    4  engines, runtimes
    3  support, compat, models, data
    2  config, demo_assets
    1  serving                   (torch and the standard library, and the core)
    0  core, kernels             (torch, numpy and the standard library only; neither imports the other)

Every import counts, those under ``if TYPE_CHECKING:`` included (an annotation is a dependency: the core is typed
against its own ``core.params.SageParams``, not the config), and function-level imports too: a cycle hidden in a
function is still a cycle.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import sage_plugin

PACKAGE = Path(sage_plugin.__file__).parent
REPO = PACKAGE.parent
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
CORE_THIRD_PARTY = {"torch", "numpy"}
LAYERS = {
    "core": 0,
    "kernels": 0,
    "serving": 1,
    "config": 2,
    "demo_assets": 2,
    "support": 3,
    "compat": 3,
    "models": 3,
    "data": 3,
    "engines": 4,
    "runtimes": 4,
    "bench": 5,
    "train": 5,
    "config_reference": 5,
    "machine_setup": 5,
    "cli": 6,
    "__init__": 6,
}
HOT_PATH = tuple(f"core/{name}.py" for name in (
    "entropy", "level_expansion", "shape", "policy", "baselines", "sage", "planned_topology", "beam_selection", "cost",
    "controller", "verify", "filters",
)) + ("serving/slots.py",)  # fmt: skip
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(tree: ast.AST):
    """``(lineno, level, module, names)`` of every import, ``if TYPE_CHECKING:`` blocks and functions included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, 0, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, node.level, node.module or "", [a.name for a in node.names]


def _resolve(name: str, level: int, module: str, names: list[str]) -> list[str]:
    """Project modules an import statement of module ``name`` loads."""
    is_pkg = MODULES[name].name == "__init__.py"
    if level:
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        base = base[: len(base) - (level - 1)]
        target = ".".join(base + ([module] if module else []))
    else:
        target = module
    if not target.startswith("sage_plugin"):
        return []
    out = []
    for n in names:  # from pkg import submodule
        if f"{target}.{n}" in MODULES:
            out.append(f"{target}.{n}")
    if not out or target in MODULES:
        while target not in MODULES and "." in target:
            target = target.rsplit(".", 1)[0]
        out.append(target)
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        deps = set()
        for _, level, module, names in _imports(tree):
            deps.update(_resolve(name, level, module, names))
        deps.discard(name)
        graph[name] = deps
    return graph


def _layer(name: str) -> tuple[str, int]:
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return top, LAYERS[top]


def test_every_module_has_a_layer():
    missing = sorted({name.split(".")[1] for name in MODULES if "." in name} - set(LAYERS))
    assert not missing, f"add these packages to LAYERS (and docs/design/architecture.md): {missing}"


def test_imports_go_down_the_layers():
    bad = []
    for name, deps in _graph().items():
        top, rank = _layer(name)
        for dep in deps:
            dep_top, dep_rank = _layer(dep)
            if dep_top != top and dep_rank >= rank:
                bad.append(f"{name} ({top}, layer {rank}) imports {dep} ({dep_top}, layer {dep_rank})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = _graph()
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


#: what each low layer may import: third-party top-level modules, and project packages besides its own
LOW_LAYERS = {
    "sage_plugin.core": (CORE_THIRD_PARTY, ()),
    "sage_plugin.kernels": (CORE_THIRD_PARTY, ()),
    "sage_plugin.serving": ({"torch"}, ("sage_plugin.core",)),
}


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(tuple(LOW_LAYERS))))
def test_low_layers_import_only_torch_stdlib_and_what_they_build_on(name):
    own = ".".join(name.split(".")[:2])
    third_party, below = LOW_LAYERS[own]
    bad = []
    for line, level, module, _ in _imports(ast.parse(MODULES[name].read_text())):
        top = module.split(".")[0]
        deps = _resolve(name, level, module, []) if level else ([module] if top == "sage_plugin" else [])
        if any(not d.startswith((own, *below)) for d in deps):
            bad.append(f"{line}: from {'.' * level}{module}")
        elif not level and top != "sage_plugin" and top not in STDLIB | third_party:
            bad.append(f"{line}: import {module}")
    assert not bad, (
        f"{name} must import only {sorted(third_party)}, the standard library, {own} and {below}:\n" + "\n".join(bad)
    )


@pytest.mark.parametrize("name", HOT_PATH)
def test_no_host_sync_calls_in_hot_path(name):
    """No ``.item()`` / ``.tolist()`` (device -> host copies) in the batched per-step code."""
    path = PACKAGE / name
    tree = ast.parse(path.read_text(), filename=str(path))
    hits = [
        f"{name}:{node.lineno}: .{node.func.attr}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("item", "tolist")
    ]
    assert not hits, "\n".join(hits)


def test_modules_are_small():
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert not {n: c for n, c in long.items() if c > MAX_LINES}, f"modules over {MAX_LINES} lines"


#: design notes that live outside the repository (the project's own docs are under docs/)
_OUTSIDE = re.compile(
    r"SAGE_SPEC|STYLE_ANCHORS|TREE_ANCHORS|TRTLLM_NOTES|SGLANG_GPU_TIERS|SGLANG_ON_CPU|"
    r"SGLANG_0\.5\.23_NOTES|MODELS\.md|[Hh]ouse style|\.\./shared|shared/design"
)
_DOC_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|patches|engine_configs|tools|tests|sage_plugin|demo)/[\w./-]+\.(?:md|yaml|py|sh))"
)


def _shipped_text_files():
    yield REPO / "README.md"
    yield REPO / "CHANGELOG.md"
    yield REPO / "CONTRIBUTING.md"
    yield REPO / "demo" / "README.md"
    yield from sorted((REPO / "docs").rglob("*.md"))
    yield from sorted((REPO / "patches").glob("*.md"))
    yield from sorted(PACKAGE.rglob("*.py"))


def test_no_reference_to_design_files_outside_the_repository():
    bad = []
    for path in _shipped_text_files():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if _OUTSIDE.search(line):
                bad.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not bad, "cite docs/ instead:\n" + "\n".join(bad)


def test_cited_repository_files_exist():
    missing = []
    for path in _shipped_text_files():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for ref in _DOC_PATH.findall(line):
                if "*" not in ref and not (REPO / ref.rstrip(".")).exists():
                    missing.append(f"{path.relative_to(REPO)}:{i}: {ref}")
    assert not missing, "\n".join(missing)


def _params_reads(tree: ast.AST) -> set[str]:
    """Attributes read off anything annotated ``SageParams`` in ``tree``: a function's such argument, and
    ``self.<x>`` where a method stored one as ``self.<x> = <argument>``."""
    reads: set[str] = set()
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] + [tree]:
        stored: set[str] = set()
        for fn in [n for n in ast.walk(cls) if isinstance(n, ast.FunctionDef)]:
            args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            names = {a.arg for a in args if a.annotation is not None and ast.unparse(a.annotation) == "SageParams"}
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
                    reads.add(node.attr)
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in names:
                    stored |= {t.attr for t in node.targets if isinstance(t, ast.Attribute)}
        for node in ast.walk(cls):
            inner = node.value if isinstance(node, ast.Attribute) else None
            if isinstance(inner, ast.Attribute) and inner.attr in stored and ast.unparse(inner.value) == "self":
                reads.add(node.attr)
    return reads


def test_the_core_reads_only_its_params_and_the_config_provides_them():
    """``core.params.SageParams`` is the core's whole view of a configuration: every attribute the core and the
    serving layer read off one is declared there, and the config's algorithm section (``AlgorithmConfig``, what the
    runtimes hand the core) declares each with the same type."""
    from typing import get_type_hints

    from sage_plugin.config import AlgorithmConfig
    from sage_plugin.core.params import SageParams

    declared = {name for name, value in vars(SageParams).items() if isinstance(value, property)}
    read = set()
    for name, path in MODULES.items():
        if name.startswith(("sage_plugin.core", "sage_plugin.serving")):
            read |= _params_reads(ast.parse(path.read_text()))
    assert read, "no SageParams reads found: the scan is broken"
    assert read <= declared, f"read but not in SageParams: {sorted(read - declared)}"
    config = get_type_hints(AlgorithmConfig)
    wrong = {n: (get_type_hints(getattr(SageParams, n).fget)["return"], config.get(n)) for n in declared
             if get_type_hints(getattr(SageParams, n).fget)["return"] != config.get(n)}  # fmt: skip
    assert not wrong, f"SageParams and AlgorithmConfig disagree: {wrong}"
