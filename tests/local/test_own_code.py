"""``eks-ddp-local --module PKG.MOD -- ARGS`` / ``--script PATH -- ARGS``: a user's own code on this machine under
the real launcher and a real etcd (review U2), with the cluster's agent command for a module or script workload.

Each runs ``python -m eks_ddp_local`` as a process from a folder outside the repository that holds the user's
code (the corpus of tests/runtime/test_torchrun_corpus.py), and checks what the user sees: their lines, the run directory
in ``EKS_DDP_RUN_DIR``, and the exit status (a usage error stops at once: no retries).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eks_ddp_local.args import parse_args
from tests.support.etcd_server import trainer_env
from tests.support.util import ROOT

CORPUS = ROOT / "tests" / "fixtures" / "corpus"


def _local(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    project = tmp_path / "project"
    if not project.exists():
        shutil.copytree(CORPUS, project)
    env = trainer_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, "-m", "eks_ddp_local", "--out", str(tmp_path / "out"), "--timeout", "200",
                           *args], cwd=project, env=env, capture_output=True, text=True, timeout=260,
                          stdin=subprocess.DEVNULL)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_your_own_module_runs_under_the_launcher_and_etcd(tmp_path):
    proc = _local(tmp_path, "--agents", "2", "--module", "userpkg.train", "--", "--lr", "0.25")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "[agent0] [user] rank 0 all-reduce sum 3" in out and "[agent1] [user] rank 1 all-reduce sum 3" in out
    seen = [json.loads(line.split(" train ", 1)[1]) for line in proc.stdout.splitlines() if "[user] train {" in line]
    assert sorted(s["env"]["RANK"] for s in seen) == ["0", "1"] and {s["lr"] for s in seen} == {0.25}
    assert "-m userpkg.train --lr 0.25" in out  # the cluster's agent command, printed
    [run] = (tmp_path / "out").iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["returncode"] == 0 and result["agent_returncodes"] == [0, 0]


@pytest.mark.long  # make test-long: the corpus's usage-error case keeps exit 2 at once in make test
@pytest.mark.timeout(300)
def test_your_own_script_with_a_bad_argument_stops_at_once(tmp_path):
    proc = _local(tmp_path, "--agents", "1", "--script", "scripts/exit_with.py", "--", "2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert out.count("[user] exiting 2") == 1, out[-4000:]  # one worker start: exit 2 is fatal, never retried


def test_arguments_for_your_code_follow_the_double_dash(tmp_path):
    o = parse_args(["--module", "pkg.train", "--agents", "1", "--", "--lr", "0.1", "--", "x"])
    assert (o.module, o.script, o.user_args, o.agents) == ("pkg.train", None, ["--lr", "0.1", "--", "x"], 1)
    script = tmp_path / "train.py"
    script.write_text("")
    assert parse_args(["--script", str(script)]).user_args == []


@pytest.mark.parametrize("argv,says", [
    (["--", "--lr", "1"], "arguments after --: got '--lr 1'; expected them only with --module or --script"),
    (["--module", "pkg-train"], "--module: got 'pkg-train'; expected a dotted module name"),
    (["--script", "/no/such/train.py"], "--script: got '/no/such/train.py'; expected a Python file"),
    (["--module", "pkg.train", "--script", "x.py"], "not allowed with argument"),
    (["--module", "pkg.train", "--kill-worker-at-step", "3"], "with your own code use --kill-worker-after"),
])
def test_bad_own_code_flags_name_the_flag(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_the_console_script_points_at_the_runner():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'eks-ddp-local = "eks_ddp_local.cli:main"' in text
    assert os.path.exists(ROOT / "training" / "eks_ddp_local" / "cli.py")
