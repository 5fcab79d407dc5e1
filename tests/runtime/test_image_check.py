"""``python -m eks_ddp_runtime.image_check``, the image-check Job's command (review N6), as a process: what the
training pod needs from a workload's image, checked before any GPU node is asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_torch_compat import _fake_torch
from tests.support.util import ROOT

CORPUS = ROOT / "tests" / "fixtures" / "corpus"


def _check(*args: str, env: dict[str, str] | None = None, cwd: Path = CORPUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eks_ddp_runtime.image_check", *args], cwd=cwd,
                          env=env or dict(os.environ), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args,says", [
    (["--module", "userpkg.train"], "module userpkg.train found"),
    (["--script", "scripts/train_script.py"], "script scripts/train_script.py found"),
])
def test_a_good_image_passes_without_running_the_users_code(args, says):
    proc = _check(*args)  # userpkg.train reads LOCAL_RANK at import: importing it here would fail
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("image check: ok: torch ") and says in proc.stdout
    assert "[user]" not in proc.stdout


@pytest.mark.parametrize("version", ["2.6.0+cu124", "2.15.0"])
def test_an_unsupported_torch_fails_with_one_line_and_exit_2(tmp_path, version):
    proc = _check("--module", "userpkg.train", env=_fake_torch(tmp_path, version))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"image check: eks_ddp_runtime: torch {version} is not supported (outside the supported range); supported: "
        "torch 2.11 to 2.14 (oldest 2.11.0, newest 2.14.1 tested)"], proc.stderr


@pytest.mark.parametrize("args,says", [
    (["--module", "userpkg.trian"], "image check: workload.module: got 'userpkg.trian'; expected a module of package "
                                    "'userpkg'"),
    (["--script", "/app/train.py"], "image check: workload.script: got '/app/train.py'; expected a file in the image"),
])
def test_a_missing_entrypoint_fails_with_one_line_and_exit_2(args, says):
    proc = _check(*args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
