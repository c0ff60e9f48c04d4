"""No import circles between the modules of the installed packages (``candle_nn``,
``candle_nn_models``: models/, weights/, scripts/) nor of the benchmark, from the AST (every
import statement, at module level or inside a function, except under ``TYPE_CHECKING``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# package name -> folder (pyproject.toml's package-dir)
PACKAGES = {"candle_nn": ROOT / "candle_nn", "candle_nn_models": ROOT / "models",
            "candle_nn_models.weights": ROOT / "weights",
            "candle_nn_models.scripts": ROOT / "scripts", "benchmarks": ROOT / "benchmarks"}
# Circles inside scripts/, left for the scripts/ renaming (issue 22, item 4): each listed one must
# still exist (remove it here when it is gone); any other circle fails.
KNOWN_SCRIPTS_CIRCLES: set[frozenset[str]] = set()


def modules() -> dict[str, Path]:
    """Every module name of the packages -> its file."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if any(other != package and folder != PACKAGES[other]
                   and path.is_relative_to(PACKAGES[other]) for other in PACKAGES):
                continue
            found[name] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports (``from p import m``: ``p.m`` when
    that is a module, else ``p``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    is_package = path.name == "__init__.py"
    base = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                module = ".".join(parts[:len(parts) - node.level + 1])
                module = f"{module}.{node.module}" if node.module else module
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a non-module attribute
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_graph_sees_relative_and_absolute_imports() -> None:
    mods = modules()
    conv = imports("candle_nn.conv", mods["candle_nn.conv"], set(mods))
    assert {"candle_nn.ops", "candle_nn.module", "candle_nn.var_builder"} <= conv
    assert "candle_nn" in imports("candle_nn_models.resnet_network",
                                  mods["candle_nn_models.resnet_network"], set(mods))


def test_no_import_circles() -> None:
    found = {frozenset(c) for c in circles()}
    new = [sorted(c) for c in found - KNOWN_SCRIPTS_CIRCLES]
    assert new == [], f"import circles: {new}"
    assert KNOWN_SCRIPTS_CIRCLES <= found, "a known circle is gone: remove it from the list"
