"""A user's own training script (training/examples/ddp_minimal.py, not the bundled trainer) under the real launcher.

Two agents run ``python -m eks_ddp_runtime.launch`` with the cluster's flags (training/runtime/eks_ddp_runtime/launch_command.py:
CLUSTER_TIMEOUTS, DEFAULT_MAX_RESTARTS, AGENT_ENV) against a real etcd with client certificates, from a folder
outside the repository; a worker is SIGKILLed mid-run, and the script resumes from its own checkpoint in
``EKS_DDP_RUN_DIR``, the agents exiting 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eks_ddp_local.procs import worker_pids
from eks_ddp_runtime.launch_command import (
    AGENT_ENV,
    CLUSTER_TIMEOUTS,
    DEFAULT_MAX_RESTARTS,
    LAUNCHER_MODULE,
    AgentOptions,
    torchrun_args,
)
from tests.support.etcd_server import ROOT, Agent, _processes, client_tls, etcd_endpoint, trainer_env  # noqa: F401

SCRIPT = ROOT / "training" / "examples" / "ddp_minimal.py"
STEPS, EVERY = 60, 10


def _history(run_dir: Path) -> list[dict]:
    path = run_dir / "history.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):  # a line being appended right now
            out.append(json.loads(line))
    return out


def _wait(predicate, timeout_s: float, what: str, agents: list[Agent]):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if all(a.proc.poll() is not None for a in agents):
            break
        time.sleep(0.05)
    logs = "\n".join(f"----- {a.name} rc={a.proc.poll()}\n{a.log()[-3000:]}" for a in agents)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def _script_workers(run_dir: Path, parent: int | None = None) -> list[int]:
    """PIDs of the workers of agent ``parent`` (procs.worker_pids: fresh, or forked from its zygote); without it,
    every Python process of this run (the run dir in its environment), for the clean-up."""
    if parent is not None:
        return worker_pids(parent)
    mark = f"EKS_DDP_RUN_DIR={run_dir}".encode()
    found = []
    for pid, _, cmdline in _processes():
        if b"python" not in cmdline.split(b"\0", 1)[0]:
            continue
        with contextlib.suppress(OSError):
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
    return found


def _run_alone(run_dir: Path, *args: str, env_run_dir: bool = True) -> subprocess.CompletedProcess[str]:
    """The script as one process (a world of one, no launcher)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**trainer_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "LOCAL_RANK": "0",
           "WORLD_SIZE": "1"}
    env.pop("EKS_DDP_RUN_DIR", None)
    if env_run_dir:
        env["EKS_DDP_RUN_DIR"] = str(run_dir)
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=run_dir.parent, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_user_script_survives_a_worker_kill_and_resumes_from_its_own_checkpoint(tmp_path, etcd_endpoint):  # noqa: F811
    run_dir = tmp_path / "runs" / "user-run"
    elsewhere = tmp_path / "user-project"  # not this repository: the script needs nothing of it but the runtime
    elsewhere.mkdir()
    agent = AgentOptions(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend="etcd",
                         rdzv_endpoint=etcd_endpoint, rdzv_id=f"user-{os.getpid()}-{time.time_ns()}",
                         max_restarts=DEFAULT_MAX_RESTARTS, local_addr="127.0.0.1", timeouts=CLUSTER_TIMEOUTS,
                         tls=client_tls(etcd_endpoint))
    # The Job's agent command for a script workload: the launcher, torchrun's flags, SCRIPT args...
    cmd = [sys.executable, "-m", LAUNCHER_MODULE, *torchrun_args(agent), str(SCRIPT),
           f"--steps={STEPS}", f"--checkpoint-every={EVERY}", "--step-time=0.1"]
    env = trainer_env({**AGENT_ENV, "EKS_DDP_RUN_DIR": str(run_dir)})
    agents = [Agent(f"agent{i}", cmd, tmp_path / f"agent{i}.log", env, cwd=elsewhere) for i in range(2)]
    try:
        # Training runs at full size and has checkpointed twice; then one node's worker dies.
        _wait(lambda: [r for r in _history(run_dir) if r["kind"] == "checkpoint" and r["step"] >= 2 * EVERY],
              90, f"checkpoint at step {2 * EVERY}", agents)
        first = [r for r in _history(run_dir) if r["kind"] == "start"]
        assert len(first) == 1 and first[0]["step"] == 0 and first[0]["world"] == 2, first
        victims = _wait(lambda: _script_workers(run_dir, agents[1].pid), 10, "agent1's worker", agents)
        os.kill(victims[0], signal.SIGKILL)
        killed_after = max(r["step"] for r in _history(run_dir) if r["kind"] == "step")

        codes = [a.wait(90) for a in agents]
        logs = "\n".join(f"----- {a.name}\n{a.log()[-3000:]}" for a in agents)
        assert codes == [0, 0], logs
        history = _history(run_dir)
        starts = [r for r in history if r["kind"] == "start"]
        assert len(starts) >= 2, (starts, logs)
        resumed = starts[1]
        saved = sorted(r["step"] for r in history if r["kind"] == "checkpoint" and r["time"] < resumed["time"])
        # It resumed from its own newest checkpoint written before the restart, not from step 0.
        assert resumed["step"] == saved[-1] and 2 * EVERY <= resumed["step"] <= killed_after, (resumed, saved)
        assert resumed["pid"] != first[0]["pid"]  # a new worker process, not the same one carrying on
        after = [r for r in history if r["kind"] == "step" and r["time"] > resumed["time"]]
        assert after and after[0]["step"] == resumed["step"] + 1, after[:3]
        assert not [r for r in after if r["step"] <= resumed["step"]]
        assert [r["step"] for r in history if r["kind"] == "done"] == [STEPS]
        assert sorted(p.name for p in run_dir.glob("ckpt-*.pt")) == [f"ckpt-{STEPS - EVERY}.pt", f"ckpt-{STEPS}.pt"]
    finally:
        for a in agents:
            a.stop()
        for pid in _script_workers(run_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_user_script_exit_codes_follow_the_contract(tmp_path):
    """0 when done (and a second start resumes, with nothing left to do), 3 for a bad argument or no run
    directory, 5 when checkpoints exist but none reads back."""
    run_dir = tmp_path / "run"
    done = _run_alone(run_dir, "--steps=3", "--checkpoint-every=2")
    assert done.returncode == 0, done.stderr[-2000:]
    again = _run_alone(run_dir, "--steps=3")
    assert again.returncode == 0 and '"kind": "start", "step": 3' in again.stdout, again.stdout
    assert _run_alone(run_dir, "--steps=0").returncode == 3
    no_dir = _run_alone(run_dir, "--steps=3", env_run_dir=False)
    assert no_dir.returncode == 3 and "EKS_DDP_RUN_DIR" in no_dir.stderr
    for ckpt in run_dir.glob("ckpt-*.pt"):
        ckpt.write_bytes(b"torn")
    bad = _run_alone(run_dir, "--steps=5")
    assert bad.returncode == 5 and "no readable checkpoint" in bad.stderr, bad.stderr[-2000:]
