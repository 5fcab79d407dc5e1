"""A run Kueue preempts and later readmits resumes from its checkpoint (docs/day-two.md, "Queues").

When Kueue preempts a Workload it suspends the Job (pkg/controller/jobframework/reconciler.go stops the job:
``spec.suspend: true``); the Job controller deletes the pods and the kubelet sends each container SIGTERM, then
SIGKILL after the pod's grace period (60 s for the training pods). On readmission the same Job is unsuspended and
new pods start with the same Job UID, which is the run's rendezvous id, and the same run directory on the shared
volume. Here with real processes: agents (one, and two under ``make test-long``) of the Job's own launcher command against a real etcd (v3 API), gloo
on CPU; every agent SIGTERMed at once mid-run (SIGKILL after 60 s), then as many new agents with the same rendezvous id
and run directory. Node-local snapshots are off: the new pods land on other nodes, so only the checkpoints on the
shared volume count. Negative control: another run (its own rendezvous id) with another run directory starts from step 0.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import snapshot
from eks_ddp_trainer.config import TrainerConfig
from eks_ddp_trainer.data import write_synthetic_cifar
from tests.support.etcd_server import Job, etcd_endpoint, jobs  # noqa: F401  (pytest fixtures)

pytestmark = pytest.mark.slow
GRACE_S = 60
"""terminationGracePeriodSeconds of the training pods."""
EPOCHS, IMAGES, BATCH = 2, 480, 16
"""30 steps an epoch; a checkpoint every 5."""


def _trainer(data_dir: Path, run_dir: Path) -> TrainerConfig:
    return TrainerConfig(data_dir=str(data_dir), run_dir=str(run_dir), epochs=EPOCHS, global_batch_size=BATCH,
                         bn_group=8, min_steps=0, width=8, checkpoint_every=5, log_every=2, keep_checkpoints=3)


def _starts(job: Job) -> list[dict]:
    return [r for r in job.history() if r.get("kind") == "start"]


def _suspend(job: Job) -> list[int]:
    """What the kubelet does to every pod of a suspended Job: SIGTERM to each container's main process (the agent),
    SIGKILL to what is left after the grace period."""
    for a in job.agents:
        os.kill(a.pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    codes = []
    for a in job.agents:
        try:
            codes.append(a.wait(max(0.1, deadline - time.monotonic())))
        except Exception:  # noqa: BLE001 - past the grace period: the kubelet's SIGKILL
            a.kill_node()
            codes.append(a.wait(10))
    return codes


@pytest.mark.parametrize("nodes", [1, pytest.param(2, marks=pytest.mark.long)])
def test_a_preempted_run_readmitted_resumes_from_its_checkpoint(tmp_path, etcd_endpoint, jobs, nodes):  # noqa: F811
    """``make test`` runs the one-node variant (about half the processes); ``make test-long`` the two-node one."""
    data = tmp_path / "cifar"
    write_synthetic_cifar(data, n_train=IMAGES, n_test=100, seed=0)
    run_dir, rdzv_id = tmp_path / "run", "job-uid-6f1c9a52"
    env = {snapshot.DIR_ENV: "off"}
    size = {"nodes": nodes, "min_nodes": 1, "max_nodes": nodes}
    first = Job(tmp_path / "admitted", etcd_endpoint, _trainer(data, run_dir), env=env, rdzv_id=rdzv_id, **size)
    jobs.append(first)
    t0 = time.monotonic()
    first.wait_step(12, 240)
    t1 = time.monotonic()
    codes = _suspend(first)
    t2 = time.monotonic()
    assert all(c is not None for c in codes), first.logs()
    kept = [int(p.stem.split("-")[1]) for p in ckpt.list_checkpoints(run_dir)]  # ckpt-000000010.pt
    assert kept and max(kept) >= 10, (kept, first.logs())
    before = len(_starts(first))

    readmitted = Job(tmp_path / "readmitted", etcd_endpoint, _trainer(data, run_dir), env=env, rdzv_id=rdzv_id,
                     **size)
    jobs.append(readmitted)
    # negative control, started beside it to share the start-up time: another run (its own Job UID, so its own
    # rendezvous id) with another run directory starts from step 0: the resume comes from the run directory
    other = Job(tmp_path / "elsewhere", etcd_endpoint, _trainer(data, tmp_path / "other-run"), env=env,
                rdzv_id="job-uid-0d9e77aa", nodes=1, min_nodes=1, max_nodes=1)
    jobs.append(other)
    start = readmitted.wait_for(lambda: _starts(readmitted)[before:], 240, "the readmitted run's start")[0]
    t3 = time.monotonic()
    assert start["resumed_step"] == max(kept), (start, kept)
    assert readmitted.wait_all(300) == [0] * nodes, readmitted.logs()
    print(f"[measure] to step 12 {t1 - t0:.1f}s, SIGTERM to exit {t2 - t1:.1f}s, readmitted to its start "
          f"{t3 - t2:.1f}s, to the end {time.monotonic() - t3:.1f}s")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["samples_seen"] == EPOCHS * IMAGES and (run_dir / "model.pt").exists()
    fresh = other.wait_for(lambda: _starts(other), 240, "the other run's start")[0]
    assert fresh["resumed_step"] == 0
