"""Imports point one way: task and budgets at the bottom (they import nothing of grpolab), grpolab on
them, the chapters on grpolab; and no two modules import each other, directly or around a loop.

Inside grpolab, its groups (`grpolab.GROUPS`, bottom first) import only the groups below them, and
only those their own docstring names on its `May import:` line: the docstring is the rule, read here.

Every import counts, a function's deferred one too: a cycle hidden in a function is still two modules
that cannot be understood (or changed) one without the other.
"""

from __future__ import annotations

import ast
import re
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
    assert "grpolab.lifecycle.endings" in imports_of(
        "grpolab.lifecycle.tracking", modules["grpolab.lifecycle.tracking"], modules
    )
    assert "budgets.units" in imports_of("budgets.cards", modules["budgets.cards"], modules)  # relative


# --- grpolab's groups ---------------------------------------------------------------------------
FRONT = ("grpolab", "grpolab.__main__")  # the package's front door and `python -m grpolab`: above every group


def group_of(module: str) -> str | None:
    """The grpolab group (or front-door module) `module` belongs to; None outside grpolab."""
    parts = module.split(".")
    if parts[0] != "grpolab":
        return None
    if module in FRONT:
        return module
    return f"grpolab.{parts[1]}"


def may_import(path: Path) -> set[str]:
    """The `May import:` line of a group's (or a front-door module's) docstring, as a set of names."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = re.search(r"^May import:(.*?)(?:\n\n|\Z)", doc, re.S | re.M)
    assert found, f"{path.relative_to(REPO_ROOT)}'s docstring has no 'May import:' line"
    return {name.strip().rstrip(".") for name in found.group(1).replace("\n", " ").split(",") if name.strip()}


def declared() -> dict[str, set[str]]:
    """Each top-level entry of grpolab and what its docstring lets it import."""
    from grpolab import GROUPS

    root = REPO_ROOT / "grpolab"
    out = {name: may_import(root / ("__init__.py" if name == "grpolab" else "__main__.py")) for name in FRONT}
    for group in GROUPS:
        path = root / group / "__init__.py" if (root / group).is_dir() else root / f"{group}.py"
        out[f"grpolab.{group}"] = may_import(path)
    return out


def crossings(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a module from another group or package."""
    return {
        (name, target)
        for name, targets in edges.items()
        if group_of(name) is not None
        for target in targets
        if group_of(target) != group_of(name)
    }


def layering_breaches(
    edges: dict[str, set[str]], rules: dict[str, set[str]], order: tuple[str, ...]
) -> list[str]:
    """Every import that breaks the groups' rules, said in a line: an import of a group (or package) the
    importer's docstring does not name, and a docstring that names a group at or above its own."""
    rank = {f"grpolab.{g}": i for i, g in enumerate(order)} | {name: len(order) for name in FRONT}
    out = []
    for group, allowed in sorted(rules.items()):
        for target in sorted(allowed):
            if target in rank and rank[target] >= rank[group]:
                out.append(f"{group}'s docstring lets it import {target}, which is not below it")
    for name, target in sorted(crossings(edges)):
        importer = group_of(name)
        imported = group_of(target) or target.split(".")[0]
        if imported not in rules.get(importer, set()):
            out.append(f"{name} imports {target}: {importer}'s docstring does not name {imported}")
    return out


def test_grpolab_has_a_dozen_entries_each_a_group_or_the_front_door():
    from grpolab import GROUPS

    entries = {p.name for p in (REPO_ROOT / "grpolab").iterdir() if p.name != "__pycache__"}
    assert len(entries) <= 12, sorted(entries)
    named = {"__init__.py", "__main__.py", "recipe.toml"} | {g for g in GROUPS} | {f"{g}.py" for g in GROUPS}
    assert entries <= named, f"not a group of grpolab.GROUPS: {sorted(entries - named)}"


def test_each_group_imports_only_the_groups_below_it_that_its_docstring_names():
    from grpolab import GROUPS

    assert layering_breaches(graph(), declared(), GROUPS) == []


def test_the_layering_check_sees_an_import_up_and_an_undeclared_one():
    order = ("config", "memory", "lab")
    rules = {
        "grpolab.config": {"task"},
        "grpolab.memory": {"task", "grpolab.config"},
        "grpolab.lab": {"grpolab.config", "grpolab.memory"},
        "grpolab": {"grpolab.lab"},
        "grpolab.__main__": set(),
    }
    fine = {
        "grpolab.memory.probe": {"grpolab.config.paths", "grpolab.memory.device"},
        "grpolab.lab.run": {"grpolab.memory.probe"},
    }
    assert layering_breaches(fine, rules, order) == []
    up = fine | {"grpolab.memory.oom": {"grpolab.lab.run"}}
    assert layering_breaches(up, rules, order) == [
        "grpolab.memory.oom imports grpolab.lab.run: grpolab.memory's docstring does not name grpolab.lab"
    ]
    undeclared = fine | {"grpolab.config.flags": {"budgets.cli"}}
    assert layering_breaches(undeclared, rules, order) == [
        "grpolab.config.flags imports budgets.cli: grpolab.config's docstring does not name budgets"
    ]
    declared_up = rules | {"grpolab.config": {"grpolab.lab"}}
    assert layering_breaches(fine, declared_up, order) == [
        "grpolab.config's docstring lets it import grpolab.lab, which is not below it"
    ]
