"""The elastic job for real: a real etcd (v3 API) and real torchrun agents, gloo on CPU.

Each agent is a separate process group standing in for a node (``--nnodes=1:2``,
``--nproc-per-node=1``, same ``--rdzv-id``), launched with the command line that
training/runtime/eks_ddp_runtime/launch_command.py builds for the cluster, with LOCAL_TIMEOUTS.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import snapshot
from eks_ddp_trainer.config import TrainerConfig
from tests.support.etcd_server import Job, etcd_endpoint, jobs, trainer_env  # noqa: F401  (pytest fixtures)
from tests.support.fence_store import store_records
from tests.support.opens import audit_env, opens_after

pytestmark = pytest.mark.slow


def _trainer(data_dir: Path, run_dir: Path, epochs: int = 6) -> TrainerConfig:
    return TrainerConfig(data_dir=str(data_dir), run_dir=str(run_dir), epochs=epochs, global_batch_size=16,
                         bn_group=8, min_steps=0, width=8, checkpoint_every=5, log_every=2, keep_checkpoints=3)


def _starts_after(job: Job, t: float) -> list[dict]:
    return [r for r in job.history() if r.get("kind") == "start" and r["time"] > t]


def _report(name: str, seconds: float) -> None:
    # Also visible with -s; the benchmark records the figures in bench/RESULTS.md.
    print(f"[measure] {name}={seconds:.2f}s")


def _counted(opens_file: Path) -> dict[str, str]:
    """The Job's env with every process's opens of committed checkpoints counted into ``opens_file``."""
    return audit_env(opens_file, trainer_env()["PYTHONPATH"])


def _assert_restore_reads(opens_file: Path, start: dict, since: float) -> int:
    """The whole world opened the committed durable checkpoints at most once to restart, and not at all when it
    resumed from a node-local snapshot; how many times (reported for bench/RESULTS.md, "Restore reads")."""
    opened = [o for o in opens_after(opens_file, since) if o[0] <= start["time"]]
    print(f"[measure] committed_checkpoint_opens={len(opened)} resumed_step={start['resumed_step']} "
          f"from={start.get('resumed_from')}")
    assert len(opened) <= 1, opened
    if start.get("resumed_from") != "durable":
        assert opened == [], (start, opened)
    return len(opened)


def _assert_finished(job: Job, world: int | None = None) -> dict:
    metrics = json.loads((job.run_dir / "metrics.json").read_text())
    assert metrics["samples_seen"] == 6 * 480 and metrics["total"] == 100
    assert (job.run_dir / "model.pt").exists()
    if world is not None:
        assert metrics["world_size"] == world
    return metrics


def test_two_agents_complete_and_loss_falls(tmp_path, etcd_endpoint, jobs, data_dir):  # noqa: F811
    job = Job(tmp_path, etcd_endpoint, _trainer(data_dir, tmp_path / "run"))
    jobs.append(job)
    assert job.wait_all(150) == [0, 0], job.logs()
    steps = [r for r in job.history() if r.get("kind") == "step"]
    assert any(r["world"] == 2 for r in steps), "both agents must have trained together"
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.3, [r["loss"] for r in steps]
    _assert_finished(job)
    assert "[eval] acc=" in job.logs()
    # The launcher passed its store to the workers: each world's fence is a record in the run's own keys there.
    rdzv_id = next(a.split("=", 1)[1] for a in job.cmd if a.startswith("--rdzv-id="))
    records = store_records(etcd_endpoint, rdzv_id)
    worlds = {r["fence"] for r in job.history() if r.get("kind") == "start"}
    assert worlds and worlds <= {g for g, r in records.items() if not r["seed"]}, (worlds, records)
    assert sorted(int(p.stem) for p in ckpt.fence_dir(job.run_dir).glob("*.json")) == sorted(records)


def test_worker_sigkill_resumes_from_a_snapshot_with_one_restart(tmp_path, etcd_endpoint, jobs, data_dir):  # noqa: F811
    opens = tmp_path / "opens.txt"
    job = Job(tmp_path, etcd_endpoint, replace(_trainer(data_dir, tmp_path / "run"), log_every=1),
              env=_counted(opens))
    jobs.append(job)
    job.wait_step(6, 90)
    job.wait_for(lambda: ckpt.list_checkpoints(job.run_dir), 30, "a first checkpoint")
    victim = job.wait_for(lambda: job.agents[1].workers(), 10, "agent1's worker")
    # Mid-way between two durable checkpoints (every 5 steps), where resuming from one redoes 2-4 steps.
    def newest() -> int:
        steps = [r["step"] for r in job.history() if r.get("kind") == "step" and r["world"] == 2]
        return steps[-1] if steps and steps[-1] % 5 == 3 else 0
    last = job.wait_for(newest, 60, "a step between checkpoints")
    killed_at = time.time()
    os.kill(victim[0], signal.SIGKILL)  # the trainer process, not its agent

    start = job.wait_for(lambda: _starts_after(job, killed_at), 90, "a restarted worker group")[0]
    assert job.wait_all(150) == [0, 0], job.logs()
    assert start["resumed_step"] > 0, "must resume from a checkpoint, not from scratch"
    # From the peers' node-local snapshots, not the last durable checkpoint (every 5 steps): <= 1 step redone.
    assert last - start["resumed_step"] <= 1, (last, start["resumed_step"])
    _assert_restore_reads(opens, start, killed_at)  # the durable checkpoint is older: not opened at all
    assert start["resumed_from"] == "snapshot"
    assert max(r["restart"] for r in job.history() if r.get("kind") == "start") == 1
    assert "exitcode: -9" in job.agents[1].log()
    next_step = next(r for r in job.history() if r.get("kind") == "step" and r["time"] > start["time"])
    _report("worker_sigkill_to_start", start["time"] - killed_at)
    _report("worker_sigkill_to_next_step", next_step["time"] - killed_at)
    _assert_finished(job)


def test_losing_a_whole_agent_continues_at_world_one(tmp_path, etcd_endpoint, jobs, data_dir):  # noqa: F811
    opens = tmp_path / "opens.txt"
    job = Job(tmp_path, etcd_endpoint, _trainer(data_dir, tmp_path / "run"), env=_counted(opens))
    jobs.append(job)
    job.wait_for(lambda: [r for r in job.history() if r.get("kind") == "step" and r["world"] == 2 and r["step"] >= 6],
                 90, "world-2 training past step 6")
    job.wait_for(lambda: ckpt.list_checkpoints(job.run_dir), 30, "a first checkpoint")
    killed_at = time.time()
    job.agents[1].kill_node()  # the node is gone: agent and worker

    start = job.wait_for(lambda: _starts_after(job, killed_at), 90, "training restarted without the lost node")[0]
    assert job.agents[0].wait(150) == 0, job.logs()
    assert job.agents[1].proc.wait(10) == -signal.SIGKILL
    assert (start["world"], start["resumed_step"] > 0) == (1, True)
    _assert_restore_reads(opens, start, killed_at)  # the survivor's node holds a snapshot: 0 unless it is older
    next_step = next(r for r in job.history() if r.get("kind") == "step" and r["time"] > start["time"])
    assert next_step["world"] == 1
    _report("agent_loss_to_start", start["time"] - killed_at)
    _report("agent_loss_to_next_step", next_step["time"] - killed_at)
    _assert_finished(job, world=1)


def test_rank0_killed_while_writing_checkpoint_resumes_from_previous(tmp_path, etcd_endpoint, jobs,  # noqa: F811
                                                                      data_dir):
    marker = tmp_path / "paused-in-save"
    job = Job(tmp_path, etcd_endpoint, _trainer(data_dir, tmp_path / "run"), nodes=1, min_nodes=1, max_nodes=1,
              max_restarts=1, env={ckpt.PAUSE_STEP_ENV: "10", ckpt.PAUSE_MARKER_ENV: str(marker),
                                   snapshot.DIR_ENV: "off"})  # the durable checkpoints alone
    jobs.append(job)
    job.wait_for(marker.exists, 90, "rank 0 to pause inside the save of step 10")
    pid = job.wait_for(lambda: marker.read_text().strip(), 5, "the writer's pid")
    cdir = ckpt.ckpt_dir(job.run_dir)
    assert [p.name for p in cdir.glob(".ckpt-000000010.pt.tmp-*")], "the new checkpoint is written to a temp file"
    assert [p.name for p in ckpt.list_checkpoints(job.run_dir)] == ["ckpt-000000005.pt"]
    killed_at = time.time()
    os.kill(int(pid), signal.SIGKILL)

    start = job.wait_for(lambda: _starts_after(job, killed_at), 90, "the restarted worker")[0]
    assert start["resumed_step"] == 5, "the previous checkpoint must load"
    assert job.wait_all(150) == [0], job.logs()
    assert start["restart"] == 1
    names = [p.name for p in ckpt.list_checkpoints(job.run_dir)]
    assert names[-1] == "ckpt-000000180.pt" and len(names) == 3  # 30 steps per epoch at world 1
    assert not list(cdir.glob(".ckpt-*.tmp-*")), "stale temp files are cleaned on the next save"
    _assert_finished(job)
