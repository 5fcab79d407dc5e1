"""No import cycle between the library's modules: every ``components`` module's imports, walked with ast.

Imports under ``if TYPE_CHECKING:`` never run, so they do not count; imports inside functions do (they run)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.util import ROOT


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, package: str, here: str, modules: set[str]) -> set[str]:
    """Modules of ``package`` (dotted names below it, packages by their ``__init__``) that a module's code imports
    when it runs. ``here`` is the importing module's package (dotted, below ``package``)."""
    found: set[str] = set()

    def resolve(dotted: str) -> str | None:  # the longest known module a dotted name starts with
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in modules:
                return ".".join(parts[:n])
        return None

    def add(base: str, names: list[str]) -> None:
        for name in names:
            full = f"{base}.{name}" if base else name
            hit = resolve(full) if full in modules else resolve(base) if base else resolve(name)
            if hit:
                found.add(hit)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                anchor = here.split(".") if here else []
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([mod] if mod else [])])
                add(base, [a.name for a in node.names])
            elif mod == package or mod.startswith(package + "."):
                add(mod[len(package) + 1:], [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(package + "."):
                    hit = resolve(a.name[len(package) + 1:])
                    if hit:
                        found.add(hit)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found & modules


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """Every module below ``folder`` (the package ``package``) by dotted name (a package by its own name, its
    ``__init__``), with the modules of the package it imports."""
    files: dict[str, tuple[Path, str]] = {}
    for p in folder.rglob("*.py"):
        rel = p.relative_to(folder).with_suffix("").parts
        if rel[-1] == "__init__":
            name, here = ".".join(rel[:-1]), ".".join(rel[:-1])
        else:
            name, here = ".".join(rel), ".".join(rel[:-1])
        if name:
            files[name] = (p, here)
    modules = set(files)
    return {name: _imports(ast.parse(p.read_text(), str(p)), package, here, modules) - {name}
            for name, (p, here) in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := dfs(start)):
            return found
    return None


def test_components_have_no_import_cycle():
    graph = import_graph(ROOT / "components", "eks_ddp")
    assert len(graph) >= 20 and "workloads.elastic_job.pods" in graph["workloads.elastic_job"]
    assert "workloads.elastic_job.pods" in graph["workloads.elastic_job.fabric_gate"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_a_two_module_cycle_is_found(tmp_path):
    # Negative control: the walker sees a cycle through a function-level import, and ignores TYPE_CHECKING ones.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import thing\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\nthing = 1\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set(), "d": {"c"}}
    assert find_cycle(graph) == ["a", "b", "a"]
    (pkg / "b.py").write_text("thing = 1\n")
    assert find_cycle(import_graph(pkg, "pkg")) is None
