"""Logs that outlive the node: the launcher keeps every agent's and worker's output in the run's directory
(eks_ddp_runtime/runlogs.py, keptlogs.py), and ``eks-ddp status`` reads the cause of a failure from it after every
process of the run is gone.

* the pieces: the per-file cap rotates with a note; the FIFO reader writes whole lines to the rank's file and to the
  agent's console, a last line without a newline included; the failure record's last lines;
* a real launcher with fresh worker processes (torch opens the FIFOs itself) keeps the files (make test-long);
* the Done-when case: a real local run (eks-ddp-local, its launcher and etcd) whose rank 1 is SIGKILLed; once the
  run ended and none of its processes is alive, ``eks-ddp status <run dir>`` (a process) names rank 1, SIGKILL,
  exit code -9 and its last lines; with ``logs/`` removed it says the logs are missing and names no cause.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eks_ddp_local.procs import alive
from eks_ddp_runtime import runlogs
from tests.support.etcd_server import trainer_env
from tests.support.util import ROOT

FAIL_RANK = ROOT / "tests" / "fixtures" / "logs" / "fail_rank.py"


def test_a_capped_file_rotates_with_a_note_and_keeps_the_newest_output(tmp_path):
    f = runlogs.CappedFile(tmp_path / "rank-0.log", 4096)
    for i in range(200):  # 14.6 kB through a 4 kB cap
        f.write(f"line {i:03d} {'x' * 60}\n".encode())
    f.close()
    current, older = (tmp_path / "rank-0.log").read_text(), (tmp_path / "rank-0.log.1").read_text()
    assert "line 199" in current and current.startswith("[eks-ddp] rank-0.log reached 4096 bytes")
    assert (tmp_path / "rank-0.log").stat().st_size <= 4096 and (tmp_path / "rank-0.log.1").stat().st_size <= 4096
    assert "line 000" not in current + older  # the oldest dropped: at most about twice the cap is kept
    assert not list(tmp_path.glob("*.2"))


def test_the_cap_is_read_from_the_environment_and_a_bad_one_names_the_variable():
    assert runlogs.max_bytes({}) == runlogs.DEFAULT_MAX_BYTES
    assert runlogs.max_bytes({runlogs.LOG_MAX_ENV: "65536"}) == 65536
    with pytest.raises(ValueError, match=r"EKS_DDP_LOG_MAX_BYTES: got '10'; expected bytes per log file, at least 4096"):
        runlogs.max_bytes({runlogs.LOG_MAX_ENV: "10"})


def test_the_log_folder_and_agent_name_come_from_the_run_dir_and_the_pod():
    assert runlogs.log_root({}) is None  # no run directory: nothing kept
    assert runlogs.log_root({"EKS_DDP_RUN_DIR": "/shared/runs/a"}) == Path("/shared/runs/a/logs")
    assert runlogs.log_root({"EKS_DDP_RUN_DIR": "/x", runlogs.LOG_DIR_ENV: "/y"}) == Path("/y")
    assert runlogs.agent_name({"HOSTNAME": "training-run-1-0-abcde"}) == "training-run-1-0-abcde"
    assert runlogs.agent_name({"HOSTNAME": "h", runlogs.LOG_NAME_ENV: "../agent 1"}) == "agent_1"


def test_worker_output_reaches_the_rank_file_and_the_console_line_by_line(tmp_path):
    """Writes into the FIFOs as a worker would (its stdout and stderr), then reads the file and the echo."""
    read_end, write_end = os.pipe()  # stands in for the agent's stdout
    logs = runlogs.WorkerLogs(tmp_path / "pod-a", 1 << 20)
    try:
        [(out, err)] = logs.start_round([(0, 3, "round 0")], 0).values()
        logs._streams[0].echo_fd = write_end  # stdout's echo into our pipe
        fo, fe = os.open(out, os.O_WRONLY), os.open(err, os.O_WRONLY)
        os.write(fo, b"step 1\nstep")
        os.write(fe, b"Traceback (most recent call last):\n")
        os.write(fo, b" 2\nno newline")
        os.close(fo)
        os.close(fe)
        deadline = time.monotonic() + 10
        while "step 2" not in "\n".join(logs.tail(0)) and time.monotonic() < deadline:
            time.sleep(0.05)
        logs.drain(0)
        # The partial last line is kept, after its stream's earlier lines; the stderr line's place among them
        # depends on which FIFO the reader reached first, so only each stream's own order is asserted.
        tail = logs.tail(0)
        out_lines = [line for line in tail if not line.startswith("Traceback")]
        assert out_lines[-3:] == ["step 1", "step 2", "no newline"], tail
        assert "Traceback (most recent call last):" in tail, tail
        assert logs.path_of(0) == tmp_path / "pod-a" / "rank-3.log"
    finally:
        logs.close()
    text = (tmp_path / "pod-a" / "rank-3.log").read_text()
    assert text.startswith("[eks-ddp] ---- round 0 ----\n")
    assert "step 1\nstep 2\n" in text and "Traceback (most recent call last):\n" in text and "no newline\n" in text
    os.close(write_end)
    echoed = os.read(read_end, 1 << 16).decode()
    os.close(read_end)
    assert echoed == "step 1\nstep 2\nno newline\n"  # whole lines; the stderr line went to fd 2
    assert not logs.fifo_dir.exists()


def test_torchruns_own_log_flags_keep_torchs_behaviour(tmp_path):
    from types import SimpleNamespace

    from eks_ddp_runtime.keptlogs import KeptLogs, RunLogsSpecs

    kept = KeptLogs(tmp_path / "pod-a", 1 << 20)
    try:
        config = SimpleNamespace(logs_specs="torch's")
        kept.install(config, SimpleNamespace(log_dir=None, redirects="0", tee="3", local_ranks_filter="",
                                             logs_specs=None))
        assert config.logs_specs == "torch's" and kept.workers is None  # --tee 3: the user's choice stands
        kept.install(config, SimpleNamespace(log_dir=None, redirects="0", tee="0", local_ranks_filter="",
                                             logs_specs=None))
        assert isinstance(config.logs_specs, RunLogsSpecs)  # control: the defaults get the kept logs
    finally:
        kept.close(0, "test")
    assert json.loads((tmp_path / "pod-a" / runlogs.EXIT_RECORD).read_text())["reason"] == "test"


def _agent(run_dir: Path, pod: str, *extra_env: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    env = trainer_env({"EKS_DDP_RUN_DIR": str(run_dir), "HOSTNAME": pod, **dict(extra_env)})
    return subprocess.run([sys.executable, "-m", "eks_ddp_runtime.launch", "--standalone", "--nproc-per-node=2",
                           "--max-restarts=0", "--monitor-interval=0.2", str(FAIL_RANK), "kill"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


@pytest.mark.long  # make test-long: the forked workers' path runs in make test (the Done-when case below)
@pytest.mark.timeout(240)
def test_a_launcher_with_fresh_worker_processes_keeps_their_output(tmp_path):
    proc = _agent(tmp_path, "pod-a", ("EKS_DDP_FORK_WORKERS", "0"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "[user] rank 1 step 2" in proc.stdout and "[user] rank 1 last words on stderr" in proc.stderr  # still shown
    pod = tmp_path / "logs" / "pod-a"
    assert "[user] rank 1 last words on stderr" in (pod / "rank-1.log").read_text()
    records = {r["rank"]: r for r in runlogs.read_records(pod / runlogs.FAILURES)}
    assert records[1]["exit_code"] == -9 and records[1]["signal"] == "SIGKILL"
    assert records[1]["last_lines"][-1] == "[user] rank 1 last words on stderr"
    assert json.loads((pod / runlogs.EXIT_RECORD).read_text())["exit_code"] == 1
    assert "failed (exitcode: -9)" in (pod / runlogs.AGENT_LOG).read_text()  # torch's own record too


def _status(target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eks_ddp.tooling.runs", "status", str(target)], cwd=target.parent,
                          env=trainer_env(), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_status_names_the_killed_rank_from_the_kept_logs_after_every_process_is_gone(tmp_path):
    env = trainer_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "eks_ddp_local", "--out", str(tmp_path / "out"), "--timeout", "120",
                           "--agents", "1", "--nproc-per-node", "2", "--max-restarts", "0",
                           "--script", str(FAIL_RANK), "--", "kill"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200, stdin=subprocess.DEVNULL)
    took = time.monotonic() - started
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    [run_dir] = (tmp_path / "out").iterdir()
    pids = json.loads((run_dir / "pids.json").read_text())
    started_pids = [pids["runner"], *pids["agents"], *pids["workers"], *pids["etcd"]]
    assert pids["agents"] and pids["etcd"]
    assert [p for p in started_pids if alive(p)] == []  # the run's processes are all gone

    status = _status(run_dir)
    out = status.stdout
    assert status.returncode == 1, out + status.stderr
    assert f"run {run_dir.name}: failed" in out
    assert "cause: rank 1 (pod agent0, local rank 1, round 0) was killed by SIGKILL (exit code -9)" in out
    assert "last lines of rank 1 (logs/agent0/rank-1.log):" in out
    assert "  | [user] rank 1 step 2\n  | [user] rank 1 last words on stderr" in out
    assert "agent0 exited 1 (fault budget spent (--max-restarts=0))" in out
    assert "failed (exitcode: -9)" in (run_dir / "logs" / "agent0" / runlogs.AGENT_LOG).read_text()  # torch's record
    print(f"local run with a killed worker: {took:.1f} s")

    # Negative control: the same run without its kept logs names no cause, it says they are missing.
    shutil.rmtree(run_dir / "logs")
    status = _status(run_dir)
    assert status.returncode == 1, status.stdout + status.stderr
    assert f"cause: unknown: the kept logs are missing ({run_dir / 'logs'}: no such folder)" in status.stdout
    assert "SIGKILL" not in status.stdout and "rank 1" not in status.stdout
