"""Is ``python -m NAME`` going to find NAME? Answered without importing any of the user's code.

``python -m pkg.sub.mod`` imports ``pkg`` and ``pkg.sub`` (their ``__init__`` run) before it looks for ``mod``, and
so does ``importlib.util.find_spec("pkg.sub.mod")`` (importlib/util.py: "If the name is for a submodule (contains a
dot), the parent module is automatically imported"). Neither the launcher's agent (torchrun's semantics: the user's
module runs only in the workers) nor the local runner may run the user's ``__init__``, so each level is looked up by
the finders themselves: ``sys.meta_path``'s ``find_spec(name, path)`` (importlib/_bootstrap.py ``_find_spec``, with
``path`` the parent's ``submodule_search_locations``, as ``_find_and_load_unlocked`` passes it), which never executes
a module. The search path is the workers': ``python -m`` puts the working directory first (runpy, and workers.py
``_run_module_as_main``).

A package imported at run time that rewrites its own ``__path__`` (``pkgutil.extend_path`` is found anyway: it is a
namespace of folders on the path) or installs an import hook in its ``__init__`` could be missed: ``EKS_DDP_CHECK_MODULE=0``
turns the check off.
"""

from __future__ import annotations

import difflib
import os
import pkgutil
import sys
from collections.abc import Sequence

CHECK_ENV = "EKS_DDP_CHECK_MODULE"
"""``0``: do not look for the ``-m`` module before the workers start."""


def _find(name: str, path: Sequence[str] | None, search_path: list[str]):
    """The spec of ``name`` from the meta path finders, with ``search_path`` as ``sys.path`` for a top-level name."""
    saved = sys.path
    sys.path = search_path  # PathFinder reads sys.path when path is None (importlib/_bootstrap_external.py)
    try:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(name, path)
            except (ImportError, ValueError, AttributeError, TypeError):
                spec = None
            if spec is not None:
                return spec
    finally:
        sys.path = saved
    return None


def _near(parent: str, wanted: str, names: list[str], rest: list[str]) -> str:
    """``; did you mean 'pkg.train'?`` when a name there is close to ``wanted``."""
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.6)
    return f"; did you mean {'.'.join([*([parent] if parent else []), close[0], *rest])!r}?" if close else ""


def module_problem(module: str, cwd: str | None = None, search_path: list[str] | None = None) -> str | None:
    """Why ``python -m module`` run in ``cwd`` (default: this process's) would not find ``module``: one line
    (``got X; expected Y``, with a did-you-mean from the names that are there), or None when it would find it.
    Imports nothing of ``module``'s packages."""
    cwd = os.path.abspath(cwd or os.getcwd())
    path = [cwd, *(sys.path[1:] if search_path is None else search_path)]
    parts = module.split(".")
    locations: Sequence[str] | None = None
    for i, part in enumerate(parts):
        name = ".".join(parts[: i + 1])
        parent = ".".join(parts[:i])
        if parent in sys.modules and i and getattr(sys.modules[parent], "__path__", None) is not None:
            locations = list(sys.modules[parent].__path__)  # already imported here (torch, this runtime): its own
        spec = sys.modules[name].__spec__ if name in sys.modules and getattr(sys.modules[name], "__spec__", None) \
            else _find(name, locations if i else None, path)
        if spec is None:
            rest = parts[i + 1:]
            if i == 0:
                names = sorted({m.name for m in pkgutil.iter_modules(path)})
                return (f"got {module!r}; expected a module importable from {cwd} or the Python path (no top-level "
                        f"module or package {part!r}){_near('', part, names, rest)}")
            names = sorted(m.name for m in pkgutil.iter_modules(list(locations or [])))
            return (f"got {module!r}; expected a module of package {parent!r} (no {part!r} in "
                    f"{', '.join(locations or [])}){_near(parent, part, names, rest)}")
        locations = spec.submodule_search_locations
        if i < len(parts) - 1 and locations is None:
            return f"got {module!r}; expected {name!r} to be a package (it is a module, so it has no {parts[i + 1]!r})"
    if locations is not None and _find(f"{module}.__main__", locations, path) is None:
        return (f"got {module!r}; expected a module or a package with a __main__ module ({module!r} is a package "
                "and cannot be run with -m)")
    return None

