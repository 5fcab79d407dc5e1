"""The layers are rules: import-linter's contracts in pyproject.toml ([tool.importlinter]) hold on this tree, and
each kind of contract reports a violation planted in a copy of it.

import-linter (seddonym/import-linter) builds the import graph with grimp, which parses every import statement,
those under ``if TYPE_CHECKING:`` included (grimp's ``exclude_type_checking_imports`` defaults to false), so a cycle
through a type hint is reported like any other.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.util import ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = {"eks_ddp": "components/eks_ddp", "eks_ddp_runtime": "training/runtime/eks_ddp_runtime",
            "eks_ddp_trainer": "training/eks_ddp_trainer", "eks_ddp_local": "training/eks_ddp_local"}


def lint_imports(root: Path, shim: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(shim)} if shim else dict(os.environ)
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(root / "pyproject.toml")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_contract():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout and "KEPT" in proc.stdout


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory):
    """The four packages copied, importable by their names from a shim folder ahead of the editable install."""
    root = tmp_path_factory.mktemp("layers")
    shim = root / "shim"
    shim.mkdir()
    for name, folder in PACKAGES.items():
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "examples"))
        (shim / name).symlink_to(root / folder, target_is_directory=True)
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root, shim


PLANTED = [  # (contract, file, the planted lines, what the report says, the import it names)
    ("pure-core", "components/eks_ddp/core/cidr.py", "import pulumi\n",
     "the core and the config import no Pulumi and no AWS SDK BROKEN", "eks_ddp.core.cidr -> pulumi (l.1)"),
    ("library-layers", "components/eks_ddp/infra/network.py", "from eks_ddp.tooling import cost\n",
     "library layers: tooling > workloads > infra > core BROKEN", "eks_ddp.infra.network -> eks_ddp.tooling.cost (l.1)"),
    ("library-never-reads-config", "components/eks_ddp/workloads/namespace.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from eks_ddp.config import StackConfig\n",
     "components never read the stack config BROKEN", "eks_ddp.workloads.namespace -> eks_ddp.config (l.3)"),
    ("workloads-build-no-aws", "components/eks_ddp/workloads/elastic_job/stages.py", "import pulumi_aws\n",
     "per-run workloads build Kubernetes objects only: images, roles and policies are infra's BROKEN",
     "eks_ddp.workloads.elastic_job.stages -> pulumi_aws (l.1)"),
    ("runtime-alone", "training/runtime/eks_ddp_runtime/exitcodes.py", "from eks_ddp.core import rules\n",
     "the runtime (in users' images) imports none of the other packages and no Pulumi BROKEN",
     "eks_ddp_runtime.exitcodes -> eks_ddp.core.rules (l.1)"),
    ("runtime-alone", "training/runtime/eks_ddp_runtime/launch_command.py",
     "from eks_ddp_trainer.config import TrainerConfig\n",
     "the runtime (in users' images) imports none of the other packages and no Pulumi BROKEN",
     "eks_ddp_runtime.launch_command -> eks_ddp_trainer.config (l.1)"),
    ("trainer-in-the-image", "training/eks_ddp_trainer/recipe.py", "import eks_ddp.core.cidr\n",
     "imports neither the library nor the local runner BROKEN", "eks_ddp_trainer.recipe -> eks_ddp.core.cidr (l.1)"),
    # The import the runner used to make: the library's re-export of the runtime's builder, pure as it is.
    ("local-runner", "training/eks_ddp_local/job.py", "from eks_ddp.core.launch_command import AGENT_ENV\n",
     "the local runner imports nothing of the library (the agents' command line is the runtime's) and no Pulumi BROKEN",
     "eks_ddp_local.job -> eks_ddp.core.launch_command (l.1)"),
]


@pytest.mark.parametrize("contract,path,line,says,chain", PLANTED, ids=[f"{p[0]}:{Path(p[1]).stem}" for p in PLANTED])
def test_a_planted_violation_breaks_its_contract(tree_copy, contract, path, line, says, chain):
    root, shim = tree_copy
    target = root / path
    original = target.read_text()
    try:
        target.write_text(line + original)
        proc = lint_imports(root, shim)
    finally:
        target.write_text(original)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = " ".join(proc.stdout.split())
    assert says in out and chain in out, proc.stdout[-3000:]


def test_a_cycle_through_type_checking_imports_is_reported(tree_copy):
    root, shim = tree_copy
    a, b = root / "components/eks_ddp/core/planted_a.py", root / "components/eks_ddp/core/planted_b.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from eks_ddp.core.planted_b import B\nA = 1\n")
    b.write_text("from eks_ddp.core.planted_a import A\nB = A\n")
    try:
        proc = lint_imports(root, shim)
    finally:
        a.unlink()
        b.unlink()
    assert proc.returncode == 1, proc.stdout[-3000:]
    out = " ".join(proc.stdout.split())
    assert "no import cycle between sibling modules or packages, at any depth BROKEN" in out, proc.stdout[-3000:]
    assert "planted_a" in out and "planted_b" in out
    # ...and the same copy without the plant keeps every contract (the shim really points lint-imports at the copy).
    assert lint_imports(root, shim).returncode == 0
