"""Review E7: no thread is alive in the process that forks a worker.

The agent runs the rendezvous heartbeat (a thread doing a TLS request every second) and forks nothing: workers
are forked from the zygote, a fresh interpreter that imports torch and runs no thread of its own
(eks_ddp_runtime/workers.py). Each fork records, in the forking process just before it forks, its pid and
thread counts (``workers.FORKED_FROM``, an ``os.register_at_fork`` hook), and the worker reads that record.
Every agent is ``python -m eks_ddp_runtime.launch`` with the Job's flags (training/runtime/eks_ddp_runtime/launch_command.py) and a real etcd.
The positive case (workers forked by a one-thread zygote while the agent runs its heartbeat thread) rides along in
tests/runtime/test_launcher_cuda.py's first launcher run; here are its negative controls.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, AgentOptions, module_command
from tests.support.etcd_server import ROOT, client_tls, etcd_endpoint, trainer_env  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def _launch(tmp_path: Path, endpoint: str, extra_env: dict[str, str] | None = None) -> tuple[list[dict], str]:
    agent = AgentOptions(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="etcd", rdzv_endpoint=endpoint,
                         rdzv_id=f"threads-{tmp_path.name}", local_addr="127.0.0.1", timeouts=CLUSTER_TIMEOUTS,
                         tls=client_tls(endpoint))
    out = tmp_path / "probe"
    proc = subprocess.run(module_command(agent, "tests.support.fork_threads_probe", [str(out)], python=sys.executable),
                          cwd=ROOT, env=trainer_env(extra_env), capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert len(ranks) == 2, log[-4000:]
    return ranks, log


def test_a_zygote_with_a_live_thread_is_not_forked(tmp_path, etcd_endpoint):  # noqa: F811
    # Negative control: a preloaded module leaves a thread running in the zygote; the probe's record shows two
    # Python threads at its fork and the launcher starts fresh processes instead.
    ranks, log = _launch(tmp_path, etcd_endpoint, {"EKS_DDP_PRELOAD": "tests.support.thread_preload"})
    assert "EKS_DDP_FORK_WORKERS=1 overridden: the zygote is not safe to fork" in log, log[-3000:]
    assert "'python_threads': 2" in log, log[-3000:]
    for r in ranks:
        assert r["forked_from"] is None and r["ppid"] == r["agent"], r  # fresh processes of the agent


def test_the_fork_record_counts_a_live_thread():
    # Negative control of the record itself: a process with one more live thread forks; the child reads 2.
    code = ("import os, threading\nfrom eks_ddp_runtime import workers\n"
            "print(workers.FORKED_FROM)\n"
            "def fork():\n    pid = os.fork()\n    if pid == 0:\n        print(workers.FORKED_FROM['python_threads'], "
            "workers.FORKED_FROM['pid'] == os.getppid(), flush=True)\n        os._exit(0)\n    os.waitpid(pid, 0)\n"
            "fork()\nstop = threading.Event()\nthreading.Thread(target=stop.wait, daemon=True).start()\nfork()\n"
            "print(workers.FORKED_FROM)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=trainer_env(), capture_output=True, text=True,
                         timeout=60).stdout.split("\n")
    assert out[:4] == ["None", "1 True", "2 True", "None"], out  # the parent's own record is cleared after a fork
