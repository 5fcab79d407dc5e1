"""The elastic runtime as a user puts it into their own image: ``pip install ./training/runtime``.

It installs the import name ``eks_ddp_runtime`` and nothing else (no psutil: the local runner has the process helpers): torch is the
image's own, the rendezvous store's client is the standard library's HTTP over etcd's v3 API, nothing of the bundled
trainer. The launcher runs with the trainer's folder nowhere on the path and torchvision/matplotlib/python-etcd
unimportable.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.support.util import ROOT

RUNTIME = ROOT / "training" / "runtime"
NOT_IN_THE_RUNTIME = ("torchvision", "matplotlib", "training", "eks_ddp_trainer", "eks_ddp", "components", "etcd")


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def runtime_site(tmp_path_factory) -> Path:
    """A real (non-editable) install of training/runtime, from a copy so no build files land in the tree."""
    tmp = tmp_path_factory.mktemp("runtime")
    src = tmp / "src"
    shutil.copytree(RUNTIME, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(src)], check=True, timeout=300)
    return site


def _blocked_run(site: Path, cwd: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` with only ``site`` on the path and the trainer, the library, torchvision and matplotlib blocked
    (an import of any of them raises ImportError)."""
    code = f"import sys\nfor name in {NOT_IN_THE_RUNTIME!r}:\n    sys.modules[name] = None\n" + textwrap.dedent(body)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env={**env, "PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=120)


def test_metadata_requires_nothing_beyond_torch(runtime_site):
    (dist_info,) = runtime_site.glob("eks_ddp_runtime-*.dist-info")
    requires = [line.split(":", 1)[1].strip() for line in (dist_info / "METADATA").read_text().splitlines()
                if line.startswith("Requires-Dist:")]
    main = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trainer"]
    assert requires == [], requires  # torch is the image's own; psutil is the local runner's (eks_ddp_local/procs.py)
    assert "python-etcd" not in {_name(r) for r in main}
    # Only the runtime's own package was installed.
    assert sorted(p.name for p in runtime_site.iterdir()) == ["eks_ddp_runtime", dist_info.name]
    shipped = {p.relative_to(runtime_site / "eks_ddp_runtime").as_posix() for p in (runtime_site / "eks_ddp_runtime").rglob("*.py")}
    assert {"launch.py", "rendezvous/handler.py", "rendezvous/etcd_backend.py", "exitcodes.py", "watchdog.py", "dist.py", "fabric_check.py",
            "stage_s3.py", "dataset.py"} <= shipped


def test_launcher_runs_without_the_trainer_torchvision_or_matplotlib(runtime_site, tmp_path):
    out = _blocked_run(runtime_site, tmp_path, f"""
        import importlib, pkgutil, runpy
        import eks_ddp_runtime
        assert eks_ddp_runtime.__file__.startswith({str(runtime_site)!r}), eks_ddp_runtime.__file__  # the install
        for m in pkgutil.iter_modules(eks_ddp_runtime.__path__):
            importlib.import_module("eks_ddp_runtime." + m.name)
        sys.argv = ["eks_ddp_runtime.launch", "--help"]
        runpy.run_module("eks_ddp_runtime.launch", run_name="__main__", alter_sys=True)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "--rdzv-backend" in out.stdout and "--nnodes" in out.stdout, out.stdout[-2000:]


def test_the_block_catches_an_import_of_the_trainer(runtime_site, tmp_path):
    """Negative control: the harness above fails when something imports what the runtime must not need."""
    for name in ("torchvision", "matplotlib", "eks_ddp_trainer", "training", "etcd"):
        out = _blocked_run(runtime_site, tmp_path, f"import {name}\n")
        assert out.returncode != 0 and "None in sys.modules" in out.stderr, (name, out.stderr[-500:])


def test_runtime_sources_import_only_themselves_relatively():
    """Inside training/runtime every import of its own modules is relative (the folder is installed under two
    names), and none names the trainer or the library."""
    for path in sorted(RUNTIME.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                assert top not in NOT_IN_THE_RUNTIME and top != "eks_ddp_runtime", f"{path.name}: import {name}"
