"""Recovery of the elastic job with the cluster's own agent command: real etcd 3.5.1, two real agents, gloo (CPU).

    .venv/bin/python bench/recovery.py [--repeats 3] [--only worker_kill,...] [--baseline DIR] [--out FILE]

Each agent runs ``python -m eks_ddp_runtime.launch`` with CLUSTER_TIMEOUTS, DEFAULT_MAX_RESTARTS and AGENT_ENV, the
command and environment training/runtime/eks_ddp_runtime/launch_command.py renders into the EKS Job (tests/runtime/test_resilience.py uses the
same). Faults:

* ``worker_kill``: SIGKILL of one trainer process;
* ``node_kill``: SIGKILL of a whole node (agent + workers; peers see TCP resets);
* ``node_sigstop``: SIGSTOP of a node's agent and workers (silent: no reset ever comes);
* ``node_partition``: each agent in its own network namespace (tests/support/netns.py), the link of one cut;
* ``etcd_outage``: etcd SIGKILLed, back on the same port and data dir after 3 s (pass: no agent exits,
  no worker restart);
* ``kills_20``: 20 worker kills in a row (pass: the run finishes with the step count and accuracy
  (±0.5 pt) of an uninterrupted run; the largest weight difference is reported);
* the rendezvous store's bad days (tests/support/store_faults.py, the scenarios tests/runtime/test_resilience.py asserts;
  pass: no agent exits, never two worlds at once, full size within 30 s): ``store_down_at_start`` (both
  agents start 8 s before etcd), ``store_hang_12s`` and ``store_hang_300s`` (etcd SIGSTOPped while the job
  runs degraded, then the replacement node arrives), ``store_wiped_newcomer`` (etcd recreated empty while
  degraded, then the replacement), ``store_wiped_worker_kill`` (recreated empty at full size, then a worker
  SIGKILL). Figure: seconds from the store's return or the newcomer's arrival to the first full-size step.
  Not run against ``--baseline`` (its agents speak plain HTTP; the store now requires a client certificate).
* ``asym_partition``: the survivor of a degraded job cut off from the store (network namespaces) while the
  replacement node reaches it (tests/support/store_faults.py ``asymmetric_partition``); pass: one world at a time in
  the records, no checkpoint committed after the newcomer's fence, full size within 30 s of the link's return.

``--baseline DIR`` runs the same faults, in the same run, against another checkout (``git worktree add DIR
dc9e592``): its own command builder (``core/torchrun.py`` at that commit) builds its cluster command (stock torchrun, its
CLUSTER_TIMEOUTS and default --max-restarts) and its own trainer runs (checkpoints at its default cadence).

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
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import ROOT, machine, synthetic

from eks_ddp_runtime.launch_command import AGENT_ENV, CLUSTER_TIMEOUTS, DEFAULT_MAX_RESTARTS
from eks_ddp_trainer.config import TrainerConfig
from tests.support import netns, store_faults
from tests.support.etcd_server import (
    TORCHRUN,
    Job,
    RestartableEtcd,
    kill_workers_in_a_row,
    max_weight_diff,
    trainer_env,
)

STORE_SCENARIOS = ("store_down_at_start", "store_hang_12s", "store_hang_300s", "store_wiped_newcomer",
                   "store_wiped_worker_kill")
SCENARIOS = ("worker_kill", "node_kill", "node_sigstop", "node_partition", "etcd_outage", "kills_20", *STORE_SCENARIOS,
             "asym_partition")
EPOCHS = {"kills_20": 8}
BASELINE_MAX_RESTARTS = 3
"""--max-restarts of dc9e592's dev stack (job.maxRestarts: 3), which its Job command took from config."""


def _trainer(data: Path, run: Path, epochs: int) -> TrainerConfig:
    return TrainerConfig(data_dir=str(data), run_dir=str(run), epochs=epochs, global_batch_size=16, bn_group=8,
                         min_steps=0, width=8, checkpoint_every=5, log_every=1, keep_checkpoints=3)


class Baseline:
    """Another checkout's cluster command: built by its own command builder (core/torchrun.py there), run from its tree."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree.resolve()
        self.commit = subprocess.run(["git", "-C", str(self.tree), "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip()

    def command(self, endpoint: str, data: Path, run: Path, epochs: int, rdzv_id: str, addr: str) -> list[str]:
        code = (
            "import json, sys\n"
            "from eks_ddp.core.torchrun import AgentOptions, CLUSTER_TIMEOUTS, job_command\n"
            f"a = AgentOptions(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend='etcd-v2',"
            f" rdzv_endpoint={endpoint!r}, rdzv_id={rdzv_id!r}, local_addr={addr!r}, timeouts=CLUSTER_TIMEOUTS,"
            f" max_restarts={BASELINE_MAX_RESTARTS})\n"
            f"t = TrainerOptions(data_dir={str(data)!r}, run_dir={str(run)!r}, epochs={epochs}, batch_size=8,"
            " width=8, log_every=1, keep_checkpoints=3)\n"
            "print(json.dumps(job_command(a, t, torchrun=sys.argv[1])))\n")
        out = subprocess.run([sys.executable, "-c", code, TORCHRUN], cwd=self.tree, capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONPATH": str(self.tree)})
        return json.loads(out.stdout)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return trainer_env({"PYTHONPATH": str(self.tree), **(extra or {})})


def _job(tmp: Path, endpoint: str, data: Path, epochs: int, baseline: Baseline | None) -> Job:
    run = tmp / "run"
    if baseline is None:
        return Job(tmp, endpoint, _trainer(data, run, epochs), env=dict(AGENT_ENV), timeouts=CLUSTER_TIMEOUTS,
                   max_restarts=DEFAULT_MAX_RESTARTS)
    cmd = baseline.command(endpoint, data, run, epochs, f"base-{uuid.uuid4().hex[:8]}", "127.0.0.1")
    return Job.of_command(tmp, run, cmd, baseline.env(), cwd=baseline.tree)


def _partitioned(nodes: netns.Nodes, tmp: Path, data: Path, epochs: int,
                 baseline: Baseline | None) -> tuple[RestartableEtcd, Job]:
    run = tmp / "run"
    if baseline is None:
        return netns.start_job(nodes, tmp, run, netns.cluster_command(_trainer(data, run, epochs)))
    return netns.start_job(nodes, tmp, run, lambda endpoint, rdzv_id, addr: baseline.command(
        endpoint, data, run, epochs, rdzv_id, addr), env=baseline.env, cwd=baseline.tree, plain=True)


def _steps(job: Job) -> list[dict]:
    return [r for r in job.history() if r.get("kind") == "step"]


def _fault(kind: str, job: Job, etcd: RestartableEtcd, nodes: netns.Nodes | None) -> None:
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
    elif kind == "node_partition":
        nodes.cut(1)
    elif kind == "etcd_outage":
        etcd.kill()
        time.sleep(3)
        etcd.start()


def _measure(kind: str, job: Job, etcd: RestartableEtcd, nodes: netns.Nodes | None) -> dict:
    job.wait_for(lambda: [r for r in _steps(job) if r["world"] == 2 and r["step"] >= 8], 300, "world-2 training")
    last = _steps(job)[-1]["step"]
    out: dict = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    t = time.time()
    _fault(kind, job, etcd, nodes)
    if kind == "etcd_outage":
        out["agents_alive"] = all(a.proc.poll() is None for a in job.agents)
        codes = job.wait_all(400)
        starts = [r for r in job.history() if r.get("kind") == "start"]
        out.update(agents_exit=codes, worker_restarts=len(starts) - 1,
                   ok=out["agents_alive"] and codes == [0, 0] and len(starts) == 1)
        return out
    try:
        start = job.wait_for(lambda: [r for r in job.history() if r.get("kind") == "start" and r["time"] > t],
                             300, "restarted workers")[0]
        step = job.wait_for(lambda: [r for r in _steps(job) if r["time"] > start["time"]], 120, "next step")[0]
    except AssertionError:  # every agent exited: the fault ended the run
        return {**out, "ok": False, "agents_exit": [a.proc.poll() for a in job.agents]}
    out.update(to_next_step_s=round(step["time"] - t, 2), steps_redone=max(0, last - start["resumed_step"]),
               world_after=start["world"], ok=True)
    return out


def one(kind: str, tmp: Path, data: Path, baseline: Baseline | None) -> dict:
    if kind == "node_partition":
        with netns.two_nodes() as nodes:
            etcd, job = _partitioned(nodes, tmp, data, 4, baseline)
            try:
                return _measure(kind, job, etcd, nodes)
            finally:
                job.close()
                etcd.kill()
    etcd = RestartableEtcd(tmp / "etcd", plain=baseline is not None)  # an older checkout's agents: no TLS
    etcd.start()
    job = _job(tmp, etcd.endpoint, data, 4, baseline)
    try:
        return _measure(kind, job, etcd, None)
    finally:
        job.close()
        etcd.kill()


def store(kind: str, tmp: Path, data: Path) -> dict:
    etcd = RestartableEtcd(tmp / "etcd")
    jobs: list[Job] = []

    def make(nodes: int) -> Job:
        job = Job(tmp, etcd.endpoint, _trainer(data, tmp / "run", 2000), nodes=nodes, env=dict(AGENT_ENV),
                  timeouts=CLUSTER_TIMEOUTS, max_restarts=DEFAULT_MAX_RESTARTS)
        jobs.append(job)
        return job

    try:
        if kind != "store_down_at_start":
            etcd.start()
        if kind == "store_down_at_start":
            r = store_faults.store_down_at_start(etcd, make, down_s=8)
        elif kind.startswith("store_hang_"):
            r = store_faults.store_hang_then_newcomer(etcd, make, hang_s=float(kind.rsplit("_", 1)[1].rstrip("s")))
        elif kind == "store_wiped_newcomer":
            r = store_faults.store_wiped_then_newcomer(etcd, make)
        else:
            r = store_faults.store_wiped_then_worker_kill(etcd, make)
    except AssertionError as e:  # a wait timed out: the fault was not healed
        return {"ok": False, "error": str(e).splitlines()[0], "load_avg_1m": round(os.getloadavg()[0], 2)}
    finally:
        for job in jobs:
            job.close()
        etcd.kill()
    r["ok"] = bool(r["agents_alive"] and r["second_world"] is None and not r["stale_commits"] and r["full_size_s"] <= 30)
    return r


def asym_partition(tmp: Path, data: Path) -> dict:
    import dataclasses

    run = tmp / "run"
    trainer = dataclasses.replace(_trainer(data, run, 2000), keep_checkpoints=1000)
    command = netns.cluster_command(trainer, dataclasses.replace(CLUSTER_TIMEOUTS, first_round=2))  # starts alone
    with netns.two_nodes() as nodes:
        etcd, job = netns.start_job(nodes, tmp, run, command, on=(1,))
        try:
            newcomer = netns.add_agent(job, nodes, 0, etcd, command, held=True)
            r = store_faults.asymmetric_partition(nodes, job, job.agents[0], newcomer)
        except AssertionError as e:
            return {"ok": False, "error": str(e).splitlines()[0], "load_avg_1m": round(os.getloadavg()[0], 2)}
        finally:
            job.close()
            etcd.kill()
    r["ok"] = bool(r["survivor_alive_while_cut"] and r["second_world"] is None and not r["stale_commits"]
                   and r["full_size_s"] <= 30)
    return r


def kills_20(tmp: Path, data: Path, baseline: Baseline | None) -> dict:
    etcd = RestartableEtcd(tmp / "etcd", plain=baseline is not None)
    etcd.start()
    out: dict = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    epochs = EPOCHS["kills_20"]
    try:
        ref = _job(tmp / "ref", etcd.endpoint, data, epochs, baseline)
        try:
            assert ref.wait_all(900) == [0, 0], ref.logs()
        finally:
            ref.close()
        job = _job(tmp / "faulty", etcd.endpoint, data, epochs, baseline)
        try:
            out["kills"] = kill_workers_in_a_row(job, 20)
            codes = [a.wait(900) for a in job.agents]
        finally:
            job.close()
        out["agents_exit"] = codes
        if codes != [0, 0]:
            return {**out, "ok": False}
        metrics, want = (json.loads((d / "run" / "metrics.json").read_text()) for d in (tmp / "faulty", tmp / "ref"))
        diff = max_weight_diff(tmp / "faulty" / "run", tmp / "ref" / "run")
        out.update(step=metrics["step"], reference_step=want["step"], accuracy=metrics["accuracy"],
                   reference_accuracy=want["accuracy"], max_weight_diff=diff,
                   ok=out["kills"] == 20 and metrics["step"] == want["step"]
                   and abs(metrics["accuracy"] - want["accuracy"]) <= 0.005)
        return out
    finally:
        etcd.kill()


def _summary(runs: list[dict]) -> dict:
    def med(key: str):
        vals = [r[key] for r in runs if key in r]
        return statistics.median(vals) if vals else None

    return {"median_to_next_step_s": med("to_next_step_s"), "median_steps_redone": med("steps_redone"),
            "median_full_size_s": med("full_size_s"),
            "loads": [r["load_avg_1m"] for r in runs], "ok": all(r.get("ok", False) for r in runs)}


def _cell(s: dict | None, runs: list[dict] | None) -> str:
    if s is None:
        return "not run"
    if s.get("median_full_size_s") is not None and s["ok"]:
        return f"no agent exit, one world, no stale commit, full size {s['median_full_size_s']} s after"
    if s["median_to_next_step_s"] is not None and s["ok"]:
        return f"{s['median_to_next_step_s']} s, {s['median_steps_redone']} redone"
    last = (runs or [{}])[-1]
    if "kills" in last:
        return f"{'finished' if s['ok'] else 'FAILED'} after {last['kills']} kills, exits {last.get('agents_exit')}"
    if "agents_alive" in last:
        return "no agent exit, no restart" if s["ok"] else f"agents exit {last.get('agents_exit')}"
    return f"FAILED: agents exit {last.get('agents_exit')}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default=",".join(SCENARIOS))
    p.add_argument("--baseline", type=Path, help="a checkout of the commit to compare with (git worktree add DIR REV)")
    p.add_argument("--baseline-repeats", type=int, default=1,
                   help="repeats for the baseline (its silent faults take minutes each)")
    p.add_argument("--out", default=str(Path(__file__).with_name("recovery.json")))
    a = p.parse_args()
    os.chdir(ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="bench-rec-"))
    data = synthetic(tmp / "data", n_train=480, n_test=100)
    base = Baseline(a.baseline) if a.baseline else None
    res: dict = {"machine": machine(), "flags": CLUSTER_TIMEOUTS.conf(), "max_restarts": DEFAULT_MAX_RESTARTS,
                 "baseline": base.commit if base else None, "runs": {}, "baseline_runs": {}}
    for kind in a.only.split(","):
        for label, b, repeats in (("runs", None, a.repeats), ("baseline_runs", base, a.baseline_repeats)):
            if label == "baseline_runs" and (base is None or kind in (*STORE_SCENARIOS, "asym_partition")):
                continue
            runs = res[label][kind] = []
            for i in range(1 if kind in ("kills_20", "store_hang_300s") else repeats):
                d = tmp / f"{label}-{kind}-{i}"
                if kind in STORE_SCENARIOS:
                    r = store(kind, d, data)
                elif kind == "asym_partition":
                    r = asym_partition(d, data)
                elif kind == "kills_20":
                    r = kills_20(d, data, b)
                else:
                    r = one(kind, d, data, b)
                runs.append(r)
                print(label, kind, json.dumps(r), flush=True)
    res["summary"] = {kind: _summary(runs) for kind, runs in res["runs"].items()}
    res["baseline_summary"] = {kind: _summary(runs) for kind, runs in res["baseline_runs"].items()}
    print(f"\n| fault | now (median of {a.repeats}) | load | {'baseline ' + base.commit if base else 'baseline'} |"
          "\n|---|---|---|---|")
    for kind, s in res["summary"].items():
        b = res["baseline_summary"].get(kind)
        print(f"| {kind} | {_cell(s, res['runs'][kind])} | {'/'.join(map(str, s['loads']))} | "
              f"{_cell(b, res['baseline_runs'].get(kind))} |")
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
