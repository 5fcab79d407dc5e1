"""Nothing outlives its agent outside a pod (deathsig.py): SIGKILL of the agent process alone -- as the OOM killer or
a user's ``kill -9`` does on a laptop or bare metal, where no container takes the rest with it -- leaves none of its
descendants (the zygote, multiprocessing's resource tracker, the workers) alive. Real processes: one agent running
the Job's own command (the launcher, torchrun's flags, the cluster's timeouts) against a real TLS etcd, for a module
and for a script workload.

On the code before deathsig.py the zygote, its resource tracker and the worker were all still running 30 s later."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from eks_ddp_local.procs import worker_pids
from eks_ddp_runtime.launch_command import AGENT_ENV, CLUSTER_TIMEOUTS, LAUNCHER_MODULE, AgentOptions, torchrun_args
from tests.support.etcd_server import Agent, _processes, client_tls, etcd_endpoint, trainer_env  # noqa: F401

LOOP = """import os, time
open(os.path.join(os.environ["EKS_DDP_RUN_DIR"], f"worker-{os.getpid()}"), "w").close()
deadline = time.monotonic() + 300  # bounded: a worker left behind ends by itself after the test's clean-up
while time.monotonic() < deadline:
    time.sleep(0.2)
"""


def _descendants_by_run(run_dir: Path) -> list[int]:
    """Every live process of this run: the run dir in its environment (the agent's, inherited by the zygote, the
    resource tracker and the workers)."""
    mark = f"EKS_DDP_RUN_DIR={run_dir}".encode()
    found = []
    for pid, _, _ in _processes():
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie has ended; only its parent has not reaped it
                continue
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(pid)
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["module", "script"])
def test_sigkill_of_the_agent_alone_leaves_no_descendant(tmp_path, etcd_endpoint, kind):  # noqa: F811
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    project = tmp_path / "project"
    (project / "userpkg").mkdir(parents=True)
    (project / "userpkg" / "__init__.py").write_text("")
    (project / "userpkg" / "loop.py").write_text(LOOP)
    agent_opts = AgentOptions(min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_backend="etcd",
                              rdzv_endpoint=etcd_endpoint, rdzv_id=f"death-{kind}-{os.getpid()}-{time.time_ns()}",
                              max_restarts=3, local_addr="127.0.0.1", timeouts=CLUSTER_TIMEOUTS,
                              tls=client_tls(etcd_endpoint))
    target = ["-m", "userpkg.loop"] if kind == "module" else [str(project / "userpkg" / "loop.py")]
    cmd = [sys.executable, "-m", LAUNCHER_MODULE, *torchrun_args(agent_opts), *target]
    env = trainer_env({**AGENT_ENV, "EKS_DDP_RUN_DIR": str(run_dir)})
    agent = Agent("agent", cmd, tmp_path / "agent.log", env, cwd=project)
    try:
        deadline = time.monotonic() + 150
        while not list(run_dir.glob("worker-*")) and time.monotonic() < deadline:
            assert agent.proc.poll() is None, agent.log()[-3000:]
            time.sleep(0.1)
        assert list(run_dir.glob("worker-*")), "no worker started\n" + agent.log()[-3000:]
        workers = worker_pids(agent.pid)
        before = set(_descendants_by_run(run_dir)) - {agent.pid}
        # What stays when the agent goes: its zygote, the resource tracker and the worker (forked from the zygote).
        assert workers and set(workers) <= before and len(before) >= 3, (workers, before)

        os.kill(agent.pid, signal.SIGKILL)  # the agent process alone, not its group
        agent.wait(10)
        deadline = time.monotonic() + 30
        alive = _descendants_by_run(run_dir)
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = _descendants_by_run(run_dir)
        assert not alive, f"alive 30 s after the agent's SIGKILL: {alive}\n" + agent.log()[-3000:]
    finally:
        agent.kill_group()
        for pid in _descendants_by_run(run_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
