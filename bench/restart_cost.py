"""What a worker restart costs a user's own code, as a module and as a script: SIGKILL of one worker -> next step.

    PYTHONPATH=<runtime> .venv/bin/python bench/restart_cost.py [--repeats 2] [--forms script,module] [--out FILE]

Two agents run the Job's agent command (training/runtime/eks_ddp_runtime/launch_command.py: CLUSTER_TIMEOUTS, DEFAULT_MAX_RESTARTS, AGENT_ENV,
a real etcd with client certificates) for training/examples/ddp_minimal.py, either by path (a ``script:``
workload) or as ``-m training.examples.ddp_minimal`` (a ``module:`` workload), with a checkpoint every 10 steps
and 0.1 s per step. Once training runs at full size, one worker of agent1 is SIGKILLed; the figure is the seconds
from the kill to the next step record in history.jsonl (the restarted world's first step), plus the steps redone.
The runtime is whatever ``eks_ddp_runtime`` the interpreter imports (set PYTHONPATH to compare two checkouts);
the 1-minute load average at the kill is recorded (the machine is shared).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine

from eks_ddp_local.etcd_server import start_etcd
from eks_ddp_runtime.launch_command import (
    AGENT_ENV,
    CLUSTER_TIMEOUTS,
    DEFAULT_MAX_RESTARTS,
    AgentOptions,
    RdzvTls,
    torchrun_args,
)

SCRIPT = ROOT / "training" / "examples" / "ddp_minimal.py"


def _history(run_dir: Path) -> list[dict]:
    path = run_dir / "history.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def _wait(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(what)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def _workers(agent: int) -> list[int]:
    """The agent's worker processes, whichever runtime started them: its children running the example (fresh,
    or forked from the agent itself by an older runtime), or the children of its zygote (forkserver)."""
    out = []
    for pid in _children(agent):
        with contextlib.suppress(OSError):
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"multiprocessing.forkserver" in line:
                out += _children(pid)
            elif b"ddp_minimal" in line:
                out.append(pid)
    return out


def one(endpoint, form: str, work: Path) -> dict:
    run_dir = work / "run"
    agent = AgentOptions(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend="etcd", rdzv_endpoint=endpoint,
                         rdzv_id=f"restart-{form}-{time.time_ns()}", max_restarts=DEFAULT_MAX_RESTARTS,
                         local_addr="127.0.0.1", timeouts=CLUSTER_TIMEOUTS, tls=RdzvTls.of(endpoint.tls))
    entry = [str(SCRIPT)] if form == "script" else ["-m", "training.examples.ddp_minimal"]
    cmd = [sys.executable, "-m", "eks_ddp_runtime.launch", *torchrun_args(agent), *entry, "--steps=100000",
           "--checkpoint-every=10", "--step-time=0.1"]
    env = {**os.environ, **AGENT_ENV, "EKS_DDP_RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                                        if p)}
    agents = []
    try:
        for i in range(2):
            with open(work / f"agent{i}.log", "wb") as log:
                agents.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))
        _wait(lambda: [r for r in _history(run_dir) if r["kind"] == "checkpoint" and r["step"] >= 20], 180,
              "two checkpoints at full size")
        victim = _wait(lambda: _workers(agents[1].pid), 10, "agent1's worker")[0]
        before = max(r["step"] for r in _history(run_dir) if r["kind"] == "step")
        load = os.getloadavg()[0]
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        resumed = _wait(lambda: next((r for r in _history(run_dir) if r["kind"] == "start" and r["time"] > killed),
                                     None), 120, "a restart")
        step = _wait(lambda: next((r for r in _history(run_dir) if r["kind"] == "step" and r["time"] > resumed["time"]),
                                  None), 60, "a step after the restart")
        return {"form": form, "kill_to_next_step_s": round(step["time"] - killed, 2),
                "steps_redone": before - resumed["step"], "load_1min": round(load, 2)}
    finally:
        for a in agents:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(a.pid, signal.SIGKILL)
            a.wait(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--forms", default="script,module")
    p.add_argument("--out", type=Path)
    o = p.parse_args(argv)
    import eks_ddp_runtime

    rows = []
    with tempfile.TemporaryDirectory(prefix="restart-cost-") as tmp, start_etcd(Path(tmp) / "etcd") as endpoint:
        for r in range(o.repeats):
            for form in o.forms.split(","):
                work = Path(tmp) / f"{form}-{r}"
                work.mkdir()
                row = one(endpoint, form, work)
                rows.append(row)
                print(json.dumps(row), flush=True)
    doc = {"runtime": eks_ddp_runtime.__file__, "machine": machine(), "rows": rows}
    if o.out:
        o.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
