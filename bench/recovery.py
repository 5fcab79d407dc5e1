"""Recovery of the elastic job with the cluster's own agent command: real etcd 3.5.1, two real agents, gloo (CPU).

    .venv/bin/python bench/recovery.py [--repeats 3] [--only worker_kill,node_kill,...] [--out bench/recovery.json]

Each agent runs ``python -m training.launch`` with CLUSTER_TIMEOUTS, DEFAULT_MAX_RESTARTS and AGENT_ENV, the
command and environment components/torchrun.py renders into the EKS Job (tests/test_resilience.py uses the
same). Faults, each repeated:

* ``worker_kill``: SIGKILL of one trainer process;
* ``node_kill``: SIGKILL of a whole node (agent + workers; peers see TCP resets);
* ``node_sigstop``: SIGSTOP of a node's agent and workers (silent: no reset ever comes);
* ``etcd_outage``: etcd SIGKILLed, back on the same port and data dir after 3 s (pass: no agent exits,
  no worker restart);
* ``kills_20``: 20 worker kills in a row (pass: the run finishes, every step done exactly once in the
  final history, same accuracy as an uninterrupted run within 0.5 pt).

Figures: seconds from the fault to the next step record in history.jsonl, steps redone (last step before
the fault minus the step training resumed from), and the 1-minute load average at the fault (the machine
is shared; compare figures taken at similar load). Prints a table and writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, synthetic

from components.torchrun import AGENT_ENV, CLUSTER_TIMEOUTS, DEFAULT_MAX_RESTARTS, TrainerOptions
from tests.etcd_server import Job, RestartableEtcd

SCENARIOS = ("worker_kill", "node_kill", "node_sigstop", "etcd_outage", "kills_20")


def _trainer(data: Path, run: Path, epochs: int) -> TrainerOptions:
    return TrainerOptions(data_dir=str(data), run_dir=str(run), epochs=epochs, global_batch_size=16, bn_group=8,
                          min_steps=0, width=8, checkpoint_every=5, log_every=1, keep_checkpoints=3)


def _steps(job: Job) -> list[dict]:
    return [r for r in job.history() if r.get("kind") == "step"]


def _job(tmp: Path, endpoint: str, data: Path, epochs: int) -> Job:
    return Job(tmp, endpoint, _trainer(data, tmp / "run", epochs), env=dict(AGENT_ENV), timeouts=CLUSTER_TIMEOUTS,
               max_restarts=DEFAULT_MAX_RESTARTS)


def _fault(kind: str, job: Job, etcd: RestartableEtcd) -> None:
    victim = job.agents[1]
    if kind == "worker_kill":
        os.kill(victim.workers()[0], signal.SIGKILL)
    elif kind == "node_kill":
        victim.kill_node()
    elif kind == "node_sigstop":
        pids = victim.workers()
        victim.kill_group(signal.SIGSTOP)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
    elif kind == "etcd_outage":
        etcd.kill()
        time.sleep(3)
        etcd.start()


def one(kind: str, tmp: Path, data: Path) -> dict:
    etcd = RestartableEtcd(tmp / "etcd")
    etcd.start()
    job = _job(tmp, etcd.endpoint, data, epochs=4)
    try:
        job.wait_for(lambda: [r for r in _steps(job) if r["world"] == 2 and r["step"] >= 8], 180, "world-2 training")
        last = _steps(job)[-1]["step"]
        load = round(os.getloadavg()[0], 2)
        t = time.time()
        _fault(kind, job, etcd)
        out: dict = {"load_avg_1m": load}
        if kind == "etcd_outage":
            out["agents_alive"] = all(a.proc.poll() is None for a in job.agents)
            codes = job.wait_all(300)
            starts = [r for r in job.history() if r.get("kind") == "start"]
            out.update(agents_exit=codes, worker_restarts=len(starts) - 1,
                       ok=out["agents_alive"] and codes == [0, 0] and len(starts) == 1)
            return out
        start = job.wait_for(lambda: [r for r in job.history() if r.get("kind") == "start" and r["time"] > t],
                             120, "restarted workers")[0]
        step = job.wait_for(lambda: [r for r in _steps(job) if r["time"] > start["time"]], 60, "next step")[0]
        out.update(to_next_step_s=round(step["time"] - t, 2), steps_redone=max(0, last - start["resumed_step"]),
                   world_after=start["world"])
        if kind == "node_sigstop":
            job.agents[1].kill_node()
        return out
    finally:
        job.close()
        etcd.kill()


def kills_20(tmp: Path, data: Path) -> dict:
    etcd = RestartableEtcd(tmp / "etcd")
    etcd.start()
    ref_dir = tmp / "ref"
    out: dict = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    try:
        ref = _job(ref_dir, etcd.endpoint, data, epochs=8)
        try:
            assert ref.wait_all(900) == [0, 0], ref.logs()
            ref_metrics = json.loads((ref.run_dir / "metrics.json").read_text())
        finally:
            ref.close()
        job = _job(tmp / "faulty", etcd.endpoint, data, epochs=8)
        try:
            def starts() -> list[dict]:
                return [r for r in job.history() if r.get("kind") == "start"]

            for i in range(20):
                n = len(starts())
                # Training runs again (a step after the newest start), then the next worker dies.
                job.wait_for(lambda: starts() and [r for r in _steps(job) if r["time"] > starts()[-1]["time"]],
                             120, f"training before kill {i + 1}")
                pids = job.agents[i % 2].workers()
                if not pids:
                    break
                os.kill(pids[0], signal.SIGKILL)
                out["kills"] = i + 1
                job.wait_for(lambda n=n: len(starts()) > n, 120, f"restart after kill {i + 1}")
            codes = job.wait_all(900)
            metrics = json.loads((job.run_dir / "metrics.json").read_text())
        finally:
            job.close()
        out.update(agents_exit=codes, step=metrics["step"], reference_step=ref_metrics["step"],
                   accuracy=metrics["accuracy"], reference_accuracy=ref_metrics["accuracy"],
                   ok=codes == [0, 0] and metrics["step"] == ref_metrics["step"]
                   and abs(metrics["accuracy"] - ref_metrics["accuracy"]) <= 0.005)
        return out
    finally:
        etcd.kill()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=",".join(SCENARIOS))
    p.add_argument("--out", default=str(Path(__file__).with_name("recovery.json")))
    a = p.parse_args()
    os.chdir(ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="bench-rec-"))
    data = synthetic(tmp / "data", n_train=480, n_test=100)
    res: dict = {"machine": machine(), "flags": CLUSTER_TIMEOUTS.conf(), "runs": {}}
    for kind in a.only.split(","):
        runs = res["runs"][kind] = []
        for i in range(1 if kind == "kills_20" else a.repeats):
            r = kills_20(tmp / f"{kind}-{i}", data) if kind == "kills_20" else one(kind, tmp / f"{kind}-{i}", data)
            runs.append(r)
            print(kind, json.dumps(r), flush=True)
    print("\n| fault | median to next step (s) | steps redone | load avg | result |\n|---|---|---|---|---|")
    for kind, runs in res["runs"].items():
        med = statistics.median(r["to_next_step_s"] for r in runs) if "to_next_step_s" in runs[0] else None
        redone = statistics.median(r["steps_redone"] for r in runs) if "steps_redone" in runs[0] else None
        ok = all(r.get("ok", True) for r in runs)
        res[kind] = {"median_to_next_step_s": med, "median_steps_redone": redone, "ok": ok}
        loads = "/".join(str(r["load_avg_1m"]) for r in runs)
        print(f"| {kind} | {med if med is not None else '—'} | {redone if redone is not None else '—'} | {loads} | "
              f"{'ok' if ok else 'FAILED'} |")
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
