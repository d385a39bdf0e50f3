"""Imports point one way: task and budgets at the bottom (they import nothing of grpolab), grpolab on
them, the chapters on grpolab; and no two modules import each other, directly or around a loop.

Every import counts, a function's deferred one too: a cycle hidden in a function is still two modules
that cannot be understood (or changed) one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from suite import REPO_ROOT

PACKAGES = ("task", "budgets", "grpolab")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    if parts[0] == "labs":
        return f"labs.{parts[1]}.{'.'.join(parts[2:])}"
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    found = {module_name(p): p for package in PACKAGES for p in (REPO_ROOT / package).rglob("*.py")}
    found |= {module_name(p): p for p in (REPO_ROOT / "labs").glob("*/train.py")}
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from pkg import mod` imports the module; `from pkg import name` imports the package.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_the_projects_modules():
    assert cycles(graph()) == []


@pytest.mark.parametrize("bottom", ["task", "budgets"])
def test_the_bottom_imports_nothing_above_it(bottom):
    upward = {
        (name, target)
        for name, targets in graph().items()
        if name.split(".")[0] == bottom
        for target in targets
        if target.split(".")[0] in ("grpolab", "labs")
    }
    assert upward == set()


def test_grpolab_imports_no_chapter_by_name():
    """The harness serves the chapters; a chapter may load another's lesson (chapter 2 reuses chapter 1's
    config), the harness may not import one."""
    assert {
        (n, t) for n, ts in graph().items() if n.startswith("grpolab") for t in ts if t.startswith("labs")
    } == set()


def test_the_checker_sees_a_cycle_and_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    modules = project_modules()
    assert "grpolab.endings" in imports_of("grpolab.tracking", modules["grpolab.tracking"], modules)
    assert "budgets.units" in imports_of("budgets.cards", modules["budgets.cards"], modules)  # relative
