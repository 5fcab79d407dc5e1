"""A hung rendezvous store costs no steps: the Job's own agent command, a real TLS etcd frozen with SIGSTOP.

While the store does not answer, the fence's read cannot be made, so nothing may be committed (a check that could not
be made is a check that failed: training/eks_ddp_trainer/checkpoint.py). The commits (the checkpoint and the history
records) wait on a side thread (training/eks_ddp_trainer/commits.py); the ranks keep stepping, and once the store
answers again the newest pending checkpoint lands, behind the fence. History records carry their own times, so the
steps trained during the freeze are counted after the fact.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from eks_ddp_runtime.launch_command import AGENT_ENV, CLUSTER_TIMEOUTS, DEFAULT_MAX_RESTARTS
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.config import TrainerConfig
from tests.support.etcd_server import Job, RestartableEtcd, jobs, restartable_etcd  # noqa: F401

pytestmark = pytest.mark.slow


def _steps(job: Job) -> list[dict]:
    return [r for r in job.history() if r.get("kind") == "step"]


def _committed_steps(run_dir: Path) -> list[int]:
    return [int(p.name[5:14]) for p in ckpt.list_checkpoints(run_dir)]


def _printed_step(job: Job) -> int:
    """The newest step rank 0 printed (its stdout line comes before its history record, which waits for the fence)."""
    return max((int(m) for a in job.agents for m in re.findall(r"\] epoch=\d+ step=(\d+) ", a.log())), default=0)


def freeze_store(tmp_path: Path, etcd: RestartableEtcd, jobs: list, data_dir: Path,  # noqa: F811
                 freeze_s: float, checkpoint_every: int) -> dict:
    """Two nodes train (the Job's command, CLUSTER_TIMEOUTS); the store is frozen (SIGSTOP: connections open, no
    answer) for ``freeze_s``, then thawed. Returns the figures and the agents' logs."""
    trainer = TrainerConfig(data_dir=str(data_dir), run_dir=str(tmp_path / "run"), epochs=5000, global_batch_size=16,
                            bn_group=8, min_steps=0, width=8, checkpoint_every=checkpoint_every, log_every=1,
                            keep_checkpoints=3)
    job = Job(tmp_path, etcd.endpoint, trainer, nodes=2, env=dict(AGENT_ENV), timeouts=CLUSTER_TIMEOUTS,
              max_restarts=DEFAULT_MAX_RESTARTS)
    jobs.append(job)
    job.wait_for(lambda: [r for r in _steps(job) if r["world"] == 2 and r["step"] >= 3], 120, "world-2 training")
    before = set(_committed_steps(job.run_dir))
    etcd.pause()
    frozen = time.time()
    try:
        # At least ``freeze_s``, then up to just past a checkpoint due (rank 0 prints each step as it trains; its
        # history records wait for the fence): one is pending when the store answers, and the next is due a quarter of
        # the interval or more later, so it cannot replace the pending one before it lands.
        time.sleep(freeze_s)
        job.wait_for(lambda: (step := _printed_step(job)) > checkpoint_every
                     and 0 < step % checkpoint_every <= checkpoint_every // 4, 60, "a checkpoint due during the freeze")
        alive = all(a.proc.poll() is None for a in job.agents)
    finally:
        etcd.resume()
    thawed = time.time()
    # The first checkpoint committed since the freeze began (none can be, while the fence cannot be read).
    first = job.wait_for(lambda: sorted(set(_committed_steps(job.run_dir)) - before), 60,
                         "a checkpoint committed after the thaw")[0]
    landed_s = time.time() - thawed
    # The records made during the freeze reach history.jsonl once the fence can be read again, with their own times.
    job.wait_for(lambda: [r for r in _steps(job) if r["time"] > thawed], 60, "a step after the thaw")
    steps = _steps(job)
    during = [r for r in steps if frozen < r["time"] < thawed]
    trained_before_thaw = max(r["step"] for r in steps if r["time"] < thawed)
    rank0 = next((a.log() for a in job.agents if "[train] start world" in a.log()), "")
    return {"alive": alive, "frozen_s": round(thawed - frozen, 1), "steps_during_freeze": len(during),
            "steps_per_s_during_freeze": round(len(during) / (thawed - frozen), 2),
            "steps_per_s_before": round(max(r["step"] for r in steps if r["time"] <= frozen) /
                                        max(1e-3, frozen - min(r["time"] for r in steps)), 2),
            "step_at_freeze": max((r["step"] for r in steps if r["time"] <= frozen), default=0),
            "step_at_thaw": trained_before_thaw, "first_commit_since_freeze": first,
            "first_commit_landed_after_thaw_s": round(landed_s, 2),
            "history_deferred_lines": rank0.count("history record: commit deferred"),
            "checkpoint_deferred_lines": rank0.count(": commit deferred") - rank0.count("history record: commit deferred"),
            "logs": job.logs()}


def _check(result: dict) -> None:
    logs = result.pop("logs")
    print(f"[measure] {result}")
    assert result["alive"], logs
    assert result["steps_during_freeze"] > 0, (result, logs)  # training went on while nothing could be committed
    # The checkpoint due during the freeze waited and landed once the store answered, before the next one was due
    # (the code before dropped it: the first commit after the thaw was the next one due, of a step trained after it).
    assert result["step_at_freeze"] < result["first_commit_since_freeze"] <= result["step_at_thaw"], (result, logs)
    assert result["history_deferred_lines"] == 1, (result, logs)  # said once for the episode, not per cause or check


def test_a_frozen_store_costs_no_steps_and_the_pending_checkpoint_lands_when_it_answers(  # noqa: F811
        tmp_path, restartable_etcd: RestartableEtcd, jobs, data_dir):  # noqa: F811
    # 15 s: three times the store's read timeout (5 s) and past the agent's lease (4 s drop window).
    # One checkpoint due every 60 steps: one falls in the freeze, and the next is seconds of training after the thaw.
    _check(freeze_store(tmp_path, restartable_etcd, jobs, data_dir, freeze_s=15, checkpoint_every=60))


@pytest.mark.long  # make test-long: the five minutes
@pytest.mark.timeout(900)
def test_a_five_minute_store_hang_costs_no_steps(tmp_path, restartable_etcd: RestartableEtcd, jobs,  # noqa: F811
                                                 data_dir):
    _check(freeze_store(tmp_path, restartable_etcd, jobs, data_dir, freeze_s=300, checkpoint_every=60))
