"""The offline plan: runs the real program under mocks, prints the tree, writes manifests."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pulumi
import pytest
import yaml

from components.mocks import RecordingMocks, run_program
from tests.util import ROOT, set_path, stack_config


def _plan(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "components.plan", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_bad_config_registers_nothing():
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match="job.nodes"):
        run_program(set_path(stack_config("dev"), "eks-ddp:job.nodes", 0), mocks=mocks)
    assert mocks.inputs == {}, "resources were registered before the config was rejected"


def test_bad_config_exits_2_with_the_message_alone(tmp_path):
    shutil.copy(ROOT / "__main__.py", tmp_path / "__main__.py")
    doc = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    doc["config"]["eks-ddp:nodeGroups"][0]["instanceType"] = "g4dn.enormous"
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump(doc))
    proc = _plan("--stack", "bad", "--project-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "nodeGroups[0].instanceType" in proc.stderr and "'g4dn.enormous'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_unknown_stack_names_the_known_ones():
    proc = _plan("--stack", "nope")
    assert proc.returncode == 2 and "Pulumi.nope.yaml" in proc.stderr and "dev" in proc.stderr


def test_dev_plan_prints_tree_counts_and_writes_manifests(tmp_path):
    start = time.perf_counter()
    proc = _plan("--stack", "dev", "--out", str(tmp_path))
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "## Resource tree" in out and "## Resources per type" in out
    # the tree nests children under their component: an indented line follows the component line
    lines = out.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("eks-ddp:network:Network"))
    assert lines[i + 1].startswith("  ")
    assert "aws:eks/nodeGroup:NodeGroup" in out and "kubernetes:batch/v1:Job" in out
    assert "kubeconfig: [secret]" in out
    written = sorted(tmp_path.glob("*.yaml"))
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in written}
    assert {"Job", "StatefulSet", "Service", "NetworkPolicy", "PersistentVolumeClaim"} <= kinds
    # The design target is < 10 s on a 2-core machine, imports included.
    assert elapsed < 10, f"offline plan took {elapsed:.1f} s"


def test_rendered_manifests_carry_ints_not_floats(dev_result):
    from components.plan import render_manifests

    def floats(value, path="$"):
        if isinstance(value, float):
            yield path
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from floats(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from floats(v, f"{path}[{i}]")

    docs = render_manifests(dev_result)
    job = next(d for d in docs if d["kind"] == "Job" and d["spec"].get("completionMode") == "Indexed")
    assert isinstance(job["spec"]["completions"], int)
    assert [p for d in docs for p in floats(d)] == []
