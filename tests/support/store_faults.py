"""Rendezvous-store faults against real agents: shared by tests/runtime/test_resilience.py and bench/recovery.py.

Each scenario drives a two-node job (the cluster's agent command, CLUSTER_TIMEOUTS) and a
:class:`~tests.support.etcd_server.RestartableEtcd` (TLS, client certificates), injects one fault, and returns
what happened: whether every agent stayed up, whether the step records ever showed two worlds at once,
which checkpoints a world committed after a newer world's fence (:func:`stale_commits`), and the seconds from the store's return (or the newcomer's arrival: its agent up and at its first
rendezvous; ``from_spawn_s`` counts from its process start, imports included) to the first full-size step.
Callers assert on the result (tests) or record it (the benchmark); the caller closes the job and etcd.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from tests.support.etcd_server import Job, RestartableEtcd

MakeJob = Callable[[int], Job]
"""Starts the job's agents (the argument: how many) against the scenario's etcd."""
FULL = 2
"""Nodes of the job (``--nnodes=1:2``)."""


def steps(job: Job) -> list[dict[str, Any]]:
    return [r for r in job.history() if r.get("kind") == "step"]


def one_world_at_a_time(history: list[dict[str, Any]]) -> str | None:
    """None when the records read as one world at a time, else the first violation.

    Only rank 0 writes history.jsonl. Between two ``start`` records every step has the world size of
    the start and a step number above the previous one; a second rank 0 training at the same time
    interleaves its own starts and lower step numbers with the first one's, which breaks this.
    """
    world, last = None, -1
    for r in history:
        if r.get("kind") == "start":
            world, last = r["world"], r["resumed_step"]
        elif r.get("kind") == "step":
            world = r["world"] if world is None else world
            if r["world"] != world or r["step"] <= last:
                return f"step {r['step']} at world {r['world']} after step {last} at world {world}"
            last = r["step"]
    return None


def _full_size_after(job: Job, t: float, timeout_s: float) -> float:
    """Seconds from ``t`` to the first step of a full-size round that started after ``t``."""
    def first() -> list[dict[str, Any]]:
        h = job.history()
        start = next((i for i, r in enumerate(h) if r.get("kind") == "start" and r["time"] > t
                      and r["world"] == FULL), None)
        return [] if start is None else [r for r in h[start:] if r.get("kind") == "step"]
    step = job.wait_for(first, timeout_s, "a full-size round's first step")[0]
    return round(step["time"] - t, 2)


def _alive(job: Job, agents: list[int] | None = None) -> bool:
    return all(job.agents[i].proc.poll() is None for i in (agents if agents is not None else range(len(job.agents))))


def _newcomer(job: Job) -> tuple[float, float]:
    """Start the replacement node's agent; returns (spawned, ready): when its process started, and when its
    agent had imported torch and began its first rendezvous (a loaded machine takes seconds in between)."""
    spawned = time.time()
    agent = job.add_agent()
    job.wait_for(lambda: "attempts to join the next round" in agent.log(), 120, "the newcomer's agent")
    return spawned, time.time()


def _degraded(job: Job) -> None:
    job.wait_for(lambda: [r for r in steps(job) if r["world"] == FULL and r["step"] >= 3], 120, "full-size training")
    job.agents[1].kill_node()
    t = time.time()
    job.wait_for(lambda: [r for r in steps(job) if r["time"] > t and r["world"] == 1], 60, "training at world 1")


def _result(job: Job, survivors: list[int], **kw: Any) -> dict[str, Any]:
    second = one_world_at_a_time(job.history())
    return {"agents_alive": _alive(job, survivors), "second_world": second, "stale_commits": stale_commits(job.run_dir),
            "agents_exit": [a.proc.poll() for a in job.agents], "load_avg_1m": round(os.getloadavg()[0], 2), **kw}


def store_down_at_start(etcd: RestartableEtcd, make_job: MakeJob, down_s: float) -> dict[str, Any]:
    """Both agents start while the store is down (CoreDNS down, etcd rescheduling); it comes up ``down_s`` later."""
    job = make_job(FULL)
    # Every agent has tried the store (its log names etcd: a retry warning, or the error it died of) and
    # then ``down_s`` more pass: on a loaded machine an agent may take longer than that to import torch.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all("etcd" in a.log() or a.proc.poll() is not None
                                                  for a in job.agents):
        time.sleep(0.2)
    time.sleep(down_s)
    alive_while_down = _alive(job)
    etcd.start()
    back = time.time()
    full = _full_size_after(job, back, 120)
    return _result(job, [0, 1], alive_while_down=alive_while_down, full_size_s=full)


def store_hang_then_newcomer(etcd: RestartableEtcd, make_job: MakeJob, hang_s: float) -> dict[str, Any]:
    """The job runs degraded (one node lost); the store hangs (SIGSTOP: connections stay open and get no
    answer, as with its node NotReady) for ``hang_s``; then the replacement node arrives."""
    job = make_job(FULL)
    _degraded(job)
    etcd.pause()
    paused = time.time()
    time.sleep(hang_s)
    alive = _alive(job, [0])
    etcd.resume()
    back = time.time()
    time.sleep(2)
    spawned, arrived = _newcomer(job)
    full = _full_size_after(job, arrived, 120)
    # Steps trained during the outage. Their records reach history.jsonl once the survivor's lease is back (the
    # history is a commit: training/eks_ddp_trainer/runlog.py), so they are counted by their own times, after the fact.
    during = [r for r in steps(job) if paused + 1 < r["time"] < back]
    return _result(job, [0, 2], alive_during_outage=alive, steps_during_outage=len(during),
                   full_size_s=full, from_spawn_s=round(arrived - spawned + full, 2),
                   back_to_full_s=round(arrived - back + full, 2))


def store_wiped_then_newcomer(etcd: RestartableEtcd, make_job: MakeJob) -> dict[str, Any]:
    """The job runs degraded; the store is recreated empty (an emptyDir pod moved); the replacement arrives."""
    job = make_job(FULL)
    _degraded(job)
    etcd.wipe()
    etcd.start()
    time.sleep(3)
    spawned, arrived = _newcomer(job)
    full = _full_size_after(job, arrived, 120)
    return _result(job, [0, 2], full_size_s=full, from_spawn_s=round(arrived - spawned + full, 2))


def store_wiped_then_worker_kill(etcd: RestartableEtcd, make_job: MakeJob) -> dict[str, Any]:
    """Full size; the store is recreated empty; then a worker dies (the next round starts from nothing)."""
    job = make_job(FULL)
    job.wait_for(lambda: [r for r in steps(job) if r["world"] == FULL and r["step"] >= 3], 120, "full-size training")
    etcd.wipe()
    etcd.start()
    back = time.time()
    # The agents find themselves gone from the empty store and re-form (one worker restart); then a worker dies
    # and the next round is agreed on the new store (22dfc96: its compare-and-set on the vanished key was
    # retried for 60 s as an outage, and both agents exited).
    healed = _full_size_after(job, back, 120)
    pids = job.wait_for(lambda: job.agents[1].workers(), 10, "a worker")
    os.kill(pids[0], signal.SIGKILL)
    killed = time.time()
    full = _full_size_after(job, killed, 120)
    return _result(job, [0, 1], healed_s=healed, full_size_s=full)


def stale_commits(run_dir) -> list[str]:
    """Checkpoints a world committed after a newer world had fenced the run directory (training/eks_ddp_trainer/checkpoint.py:
    each world's rank 0 writes a fence before training; each checkpoint names its world's fence). The commit time
    is the file's ctime (a rename sets it), the fence's its file's ctime: one clock, the shared filesystem's. (With
    the run's store a world's fence takes effect at its store transaction, right after its file is linked.)
    An empty list when there is none; a run directory without any fence record is itself one."""
    from pathlib import Path

    from eks_ddp_trainer import checkpoint as ckpt

    if not hasattr(ckpt, "read_fences"):  # an older checkout's trainer (bench/recovery.py --baseline)
        return [f"{run_dir}: this trainer writes no fence records"]
    # A seed (the run's store re-seeded after it came back empty) is no world: nothing trains under it.
    fences = {e: r for e, r in ckpt.read_fences(Path(run_dir)).items() if not r.get("seed")}
    if not fences:
        return [f"{run_dir}: no fence record (each world's rank 0 writes one before training)"]
    created = {e: (ckpt.fence_path(run_dir, e)).stat().st_ctime for e in fences}
    out = []
    for path in ckpt.list_checkpoints(run_dir):
        try:  # the run may still be training: a checkpoint rotated away meanwhile can no longer be loaded by anyone
            committed = path.stat().st_ctime
            generation = ckpt.load_checkpoint(path).get("fence", {}).get("generation")
        except FileNotFoundError:
            continue
        newer = [e for e in fences if generation is None or e > generation]
        late = [e for e in newer if created[e] < committed]
        if generation is None or late:
            out.append(f"{path.name}: world {generation} committed at {committed:.3f}, after the fence of world(s) "
                       f"{late} ({', '.join(f'{created[e]:.3f}' for e in late)})" if late else
                       f"{path.name}: names no world")
    return out


def asymmetric_partition(nodes, job: Job, survivor, newcomer, settle_s: float = 5.0) -> dict[str, Any]:
    """The survivor trains alone (round >= 1) from node 1; its path to the store breaks (node 1's link goes
    down: the store, on node 0, stays up); the replacement node's agent (``newcomer``, held, on node 0) arrives
    and can reach the store. Then the link comes back. Returns the records' verdicts and the seconds from the
    link's return to the first full-size step."""
    job.wait_for(lambda: [r for r in steps(job) if r["step"] >= 6], 120, "the survivor training")
    job.wait_for(lambda: _checkpoints(job), 60, "a first durable checkpoint")
    cut = time.time()
    nodes.cut(1)
    newcomer.release()
    # The newcomer's world: a start record after the cut, and enough of its training for two checkpoints.
    start = job.wait_for(lambda: [r for r in job.history() if r.get("kind") == "start" and r["time"] > cut], 90,
                         "the newcomer's world")[0]
    job.wait_for(lambda: [r for r in steps(job) if r["time"] > start["time"] and r["step"] >= start["resumed_step"] + 11],
                 90, "the newcomer's world training")
    time.sleep(settle_s)  # long enough for the survivor to commit (checkpoints every 5 steps) if nothing stops it
    survivor_alive = survivor.proc.poll() is None
    healed = time.time()
    nodes.heal(1)
    full = _full_size_after(job, healed, 120)
    history = job.history()
    return {"second_world": one_world_at_a_time(history), "stale_commits": stale_commits(job.run_dir),
            "survivor_alive_while_cut": survivor_alive, "newcomer_start_after_cut_s": round(start["time"] - cut, 2),
            "full_size_s": full, "load_avg_1m": round(os.getloadavg()[0], 2)}


def _checkpoints(job: Job) -> list:
    from eks_ddp_trainer import checkpoint as ckpt

    return ckpt.list_checkpoints(job.run_dir)
