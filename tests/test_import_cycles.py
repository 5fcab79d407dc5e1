"""No import cycle between the library's modules: every ``components`` module's imports, walked with ast.

Imports under ``if TYPE_CHECKING:`` never run, so they do not count; imports inside functions do (they run)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.util import ROOT


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, package: str, modules: set[str]) -> set[str]:
    """Modules of ``package`` (by short name) that a module's code imports when it runs."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1:  # from .x import y / from . import x
                names = [base] if base else [a.name for a in node.names]
                found.update(n.split(".")[0] for n in names if n.split(".")[0] in modules)
            elif node.level == 0 and base.split(".")[0] == package:
                rest = base.split(".")[1:]
                found.update([rest[0]] if rest else [a.name for a in node.names if a.name in modules])
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == package and len(parts) > 1:
                    found.add(parts[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found & modules


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    files = {p.stem: p for p in folder.glob("*.py") if p.stem != "__init__"}
    modules = set(files)
    return {name: _imports(ast.parse(p.read_text(), str(p)), package, modules) - {name}
            for name, p in files.items()}


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
    graph = import_graph(ROOT / "components", "components")
    assert len(graph) >= 20 and "podspec" in graph["elastic_job"] and "podspec" in graph["fabric_gate"]
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
