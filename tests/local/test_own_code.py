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
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eks_ddp_local.args import parse_args
from eks_ddp_local.procs import alive
from tests.support.etcd_server import trainer_env
from tests.support.shm import run_shm
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
    assert run_shm(run.name) == []  # the agents' lease folders were in the run's /dev/shm folder: removed with it


@pytest.mark.long  # make test-long: the corpus's usage-error case keeps exit 2 at once in make test
@pytest.mark.timeout(300)
def test_your_own_script_with_a_bad_argument_stops_at_once(tmp_path):
    proc = _local(tmp_path, "--agents", "1", "--script", "scripts/exit_with.py", "--", "2")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert out.count("[user] exiting 2") == 1, out[-4000:]  # one worker start: exit 2 is fatal, never retried


def test_arguments_for_your_code_follow_the_double_dash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
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
    (["--module", "userpkg.train", "--kill-worker-at-step", "3"], "with your own code use --kill-worker-after"),
    (["--module", "userpkg.train", "--kill-agent-at-step", "3"], "--kill-agent-at-step: the step comes from the "
                                                                 "bundled trainer's records; with your own code use "
                                                                 "--kill-agent-after SECONDS"),
    (["--module", "userpkg.trian"], "--module: got 'userpkg.trian'; expected a module of package 'userpkg' (no "
                                    "'trian' in {corpus}/userpkg); did you mean 'userpkg.train'?"),
    (["--module", "usrpkg.train"], "--module: got 'usrpkg.train'; expected a module importable from {corpus} or the "
                                   "Python path (no top-level module or package 'usrpkg'); did you mean 'userpkg.train'?"),
])
def test_bad_own_code_flags_name_the_flag(argv, says, capsys, monkeypatch):
    monkeypatch.chdir(CORPUS)
    says = says.format(corpus=CORPUS)
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_the_console_script_points_at_the_runner():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'eks-ddp-local = "eks_ddp_local.cli:main"' in text
    assert os.path.exists(ROOT / "training" / "eks_ddp_local" / "cli.py")


def test_a_module_that_is_not_there_is_refused_before_anything_starts(tmp_path):
    """``eks-ddp-local --module userpkg.trian`` as a process: exit 2, one line naming the flag, the value and the
    module that is there; no run started (it used to start etcd and the agents and fail 21 times per agent)."""
    proc = _local(tmp_path, "--module", "userpkg.trian")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"eks-ddp-local: --module: got 'userpkg.trian'; expected a module of package 'userpkg' (no 'trian' in "
        f"{tmp_path / 'project' / 'userpkg'}); did you mean 'userpkg.train'? (--help lists the flags)"], proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_your_script_writing_below_its_folder_fails_as_in_the_pod(tmp_path):
    """The training pod's working directory (/app) is read-only; only $EKS_DDP_RUN_DIR and /tmp are writable
    (components/eks_ddp/workloads/elastic_job/pods.py). A script that writes ./ckpt fails here as there, with the
    pod's errno, naming the path and the writable places; it fails before its first step in every worker, so the
    run stops at once with exit 2 (a start failure: eks_ddp_runtime/startfail.py), not after the fault budget."""
    proc = _local(tmp_path, "--agents", "1", "--script", "scripts/writes.py")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert "[user] rank 0 wrote the run dir and /tmp" in out and "wrote ./ckpt" not in out, out[-4000:]
    assert not (tmp_path / "project" / "ckpt").exists()
    [failed] = [x for x in proc.stderr.splitlines() if x.startswith("[local] FAILED:")]
    assert "[Errno 30] Read-only file system" in failed and "'ckpt'" in failed, failed
    assert "(as in the training pod: writable are only $EKS_DDP_RUN_DIR, /tmp and /dev/shm)" in failed, failed
    assert "before its first step" in failed and "resume it with" not in out, out[-3000:]
    [run] = (tmp_path / "out").iterdir()
    assert sorted(p.name for p in run.glob("ok-*.txt")) == ["ok-0.txt"]  # the run directory is writable
    result = json.loads((run / "result.json").read_text())
    assert result["agent_returncodes"] == [2], result  # the agent's own exit, not the runner stopping it


def _eks_ddp(*args: str) -> list[str]:
    """``eks-ddp ARGS`` as a process: the console script's module (run with trainer_env's PYTHONPATH)."""
    return [sys.executable, "-m", "eks_ddp.tooling.runs", *args]


def _run_wait_for(tmp_path: Path, *runner_flags: str) -> tuple[dict[str, str], Path, Path, subprocess.Popen]:
    """The local runner on the corpus's scripts/wait_for.py (it writes ``<flags>/started``, then waits for
    ``<flags>/finish``), run from a copy of the corpus with ``runner_flags``, its output in ``tmp_path/runner.log``;
    returns (its environment, the flags folder, its --out folder, the runner)."""
    project = tmp_path / "project"
    shutil.copytree(CORPUS, project)
    flags = tmp_path / "flags"
    flags.mkdir()
    env = trainer_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = tmp_path / "out"
    with open(tmp_path / "runner.log", "w") as log:
        runner = subprocess.Popen([sys.executable, "-m", "eks_ddp_local", "--out", str(out), "--timeout", "200",
                                   *runner_flags, "--script", "scripts/wait_for.py", "--", str(flags)],
                                  cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return env, flags, out, runner


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_runner_ends_only_what_it_started_and_cancel_and_follow_exit_0(tmp_path):
    """A user's process that names the run's folder (a TensorBoard, a plotting script), ``eks-ddp logs --follow``
    and ``eks-ddp cancel`` are the user's, not the run's: the runner, stopping, ends only the processes it started
    (procs.Owned), so each outlives the run or exits with its own status, and the run reads ``cancelled``. (The
    runner used to SIGKILL every python process whose command line held the run id: exit 137 for all three.)"""
    env, flags, out, runner = _run_wait_for(tmp_path, "--agents", "1")
    mine: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 150
        while not (flags / "started").exists():  # the worker runs the script: the run is under way
            assert runner.poll() is None and time.monotonic() < deadline, (tmp_path / "runner.log").read_text()[-3000:]
            time.sleep(0.2)
        [run] = out.iterdir()
        follow = subprocess.Popen(_eks_ddp("logs", str(run), "--follow"), env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(run / "my-notes")],
                                     stdin=subprocess.DEVNULL)
        mine += [follow, bystander]
        cancel = subprocess.run(_eks_ddp("cancel", str(run)), env=env, capture_output=True, text=True,
                                timeout=90, stdin=subprocess.DEVNULL)
        assert cancel.returncode == 0, (cancel.returncode, cancel.stdout, cancel.stderr)
        assert f"run {run.name}: cancelled" in cancel.stdout, cancel.stdout
        assert runner.wait(timeout=60) == 128 + signal.SIGTERM
        assert follow.wait(timeout=30) == 0, follow.stderr.read() if follow.stderr else ""
        assert bystander.poll() is None, bystander.returncode  # alive after the run: not the run's to end
        pids = json.loads((run / "pids.json").read_text())
        started = pids["etcd"] + pids["agents"] + pids["workers"]
        deadline = time.monotonic() + 10
        while any(alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in started if alive(p)] == [], pids  # and what it started is gone
        status = subprocess.run(_eks_ddp("status", str(run)), env=env, capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(f"run {run.name}: cancelled (result.json: exit status 143, stopped by "
                                        "SIGTERM"), status.stdout
    finally:
        for p in [runner, *mine]:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_your_script_failing_the_same_way_after_init_stops_in_three_rounds_without_a_resume_hint(tmp_path):
    """The review's R1: ./checkpoints created after init_process_group, on the pod's read-only root. Each round fails
    the same way at the same line before any step; the launcher stops after startfail.REPEATS rounds with exit 2
    (it used to restart 20 times), the FAILED line names the error, the place and the fix, and no --resume is offered
    (it would fail the same way)."""
    state = tmp_path / "state"
    state.mkdir()
    proc = _local(tmp_path, "--agents", "1", "--script", "scripts/fails_after_init.py", "--", str(state))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert (state / "rounds").read_text().count("round\n") == 3, out[-4000:]
    [failed] = [x for x in proc.stderr.splitlines() if x.startswith("[local] FAILED:")]
    assert "[Errno 30] Read-only file system" in failed and "'checkpoints'" in failed, failed
    assert "fails_after_init.py:37, the same in 3 rounds in a row before any step completed" in failed, failed
    assert "fix it there and start the run again" in failed, failed
    assert "resume it with" not in out and "[local] not retried: a retry cannot fix this" in out, out[-3000:]
    [run] = (tmp_path / "out").iterdir()
    assert json.loads((run / "result.json").read_text())["agent_returncodes"] == [2]


def test_the_stacks_run_dir_reference_in_your_arguments_becomes_the_runs_folder(tmp_path, monkeypatch):
    """`--ckpt-dir=$(EKS_DDP_RUN_DIR)` is the stack's syntax (Workload.rendered_args); the local run renders it the
    same way, so one set of arguments rehearses here (it used to reach the script as a literal '$(EKS_DDP_RUN_DIR)')."""
    import io

    from eks_ddp.core.workload import Workload
    from eks_ddp_local.job import LocalJob
    from eks_ddp_local.progress import Progress

    monkeypatch.chdir(CORPUS)
    args = ["--ckpt-dir=$(EKS_DDP_RUN_DIR)/ckpt", "--data", "$(EKS_DDP_DATA_DIR)", "$$(EKS_DDP_RUN_DIR)"]
    o = parse_args(["--script", "scripts/train_script.py", "--out", str(tmp_path), "--rdzv", "c10d", "--", *args])
    job = LocalJob(o, Progress(stream=io.StringIO()))
    command = job.agent_command("127.0.0.1:1", tmp_path / "data")
    expected = Workload(name="x", script="scripts/train_script.py", args=args).rendered_args(
        run_dir=str(job.run_dir), data_dir=str(tmp_path / "data"))
    assert command[-len(args):] == expected
    assert command[-4] == f"--ckpt-dir={job.run_dir}/ckpt" and command[-2] == str(tmp_path / "data")
    without_data = job.agent_command("127.0.0.1:1", None)  # no --data: no EKS_DDP_DATA_DIR, the reference stays
    assert without_data[-2] == "$(EKS_DDP_DATA_DIR)"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.long  # ~41 s, 30 of them the local first round's wait for the killed agent: make test-long
def test_your_code_survives_a_lost_agent_and_the_run_succeeds(tmp_path):
    """`--kill-agent-after S` with your own code (the review's by-hand kill -9 of an agent): with --min-agents 1 the
    other agent finishes; the runner says so and exits 0, as `eks-ddp status` says succeeded (it used to say FAILED,
    exit 1, blaming the error the survivor had recovered from)."""
    env, flags, out, runner = _run_wait_for(tmp_path, "--agents", "2", "--min-agents", "1", "--kill-agent-after", "1")
    try:
        deadline = time.monotonic() + 150
        while "SIGKILL agent1" not in (tmp_path / "runner.log").read_text():
            assert runner.poll() is None and time.monotonic() < deadline, (tmp_path / "runner.log").read_text()[-3000:]
            time.sleep(0.2)
        while not (flags / "started").exists():  # the survivor's worker runs
            assert runner.poll() is None and time.monotonic() < deadline, (tmp_path / "runner.log").read_text()[-3000:]
            time.sleep(0.2)
        (flags / "finish").touch()
        rc = runner.wait(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.wait(timeout=30)
    text = (tmp_path / "runner.log").read_text()
    assert rc == 0, text[-4000:]
    assert "[local] FAILED" not in text and "the job finished with the agents left" in text, text[-3000:]
    assert "agent1 was killed 1 s after the start; the others finished the job" in text, text[-3000:]
    [run] = out.iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["returncode"] == 0 and result["agent_returncodes"][0] == 0 and result["agent_returncodes"][1] != 0
    status = subprocess.run(_eks_ddp("status", str(run)), env=env, capture_output=True, text=True, timeout=60)
    assert status.stdout.startswith(f"run {run.name}: succeeded"), status.stdout
