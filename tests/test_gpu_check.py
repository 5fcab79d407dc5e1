"""`make gpu-check` (bench/gpu_check.py) on a machine without a GPU, and its offline bundle (bench/gpu_bundle.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpu_check = _module("gpu_check")


@pytest.mark.parametrize("version,ok", [("2.14.1+cu130", True), ("2.11.0", True), ("2.12.0a0+git1234", True),
                                        ("2.10.2", False), ("2.15.0", False), ("3.0.0", False), ("nightly", False)])
def test_supported_torch_versions_are_2_11_to_2_14(version, ok):
    problem = gpu_check.torch_version_problem(version)
    assert (problem is None) == ok, problem
    if not ok:
        assert version in problem and "supported: 2.11 to 2.14" in problem


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path / "out"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_without_a_gpu_each_gpu_item_says_so_in_json_and_markdown(tmp_path):
    proc = _run(tmp_path, "--items", "bcde")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert {k: r["status"] for k, r in report["items"].items()} == {k: "needs a GPU" for k in "bcde"}
    md = (tmp_path / "out" / "gpu-check.md").read_text()
    assert md.count("| needs a GPU |") == 4 and "(a) launcher" in md and "| not run |" in md


def test_an_unknown_item_is_named(tmp_path):
    proc = _run(tmp_path, "--items", "az")
    assert proc.returncode == 2 and "--items: got 'z'; expected letters of 'abcde'" in proc.stderr


@pytest.mark.long
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_without_a_gpu_the_launcher_recovery_runs_on_cpu(tmp_path):
    proc = _run(tmp_path, "--items", "a")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    a = json.loads((tmp_path / "out" / "gpu-check.json").read_text())["items"]["a"]
    assert a["status"] == "ok" and a["device"] == "cpu (gloo)" and a["recovery_s"] > 0, a
    assert a["resumed_step"] > 0 and a["steps_redone"] <= 1, a


def test_the_bundle_holds_python_etcd_and_a_runnable_etcd_under_64_mib(tmp_path):
    bundle = _module("gpu_bundle")
    size = bundle.build(tmp_path / "b")
    assert size <= bundle.LIMIT_BYTES
    assert (tmp_path / "b" / "site" / "etcd" / "client.py").exists()
    version = subprocess.run([str(tmp_path / "b" / "bin" / "etcd"), "--version"], capture_output=True, text=True,
                             timeout=30)
    assert version.returncode == 0 and "etcd Version: 3.5" in version.stdout, version.stdout + version.stderr
    # The check uses it: python-etcd from site/ in a process whose own path has no python-etcd at all.
    code = "import etcd, sys; print(etcd.__file__)"
    out = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(tmp_path / 'b' / 'site')!r}); {code}"],
                         capture_output=True, text=True, timeout=60)
    assert str(tmp_path / "b" / "site") in out.stdout, out.stderr[-2000:]
