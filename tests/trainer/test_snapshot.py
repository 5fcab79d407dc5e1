"""Node-local snapshots: written off the training thread, read back, agreed on across ranks, never non-finite."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from eks_ddp_runtime.dist import DistEnv
from eks_ddp_trainer import snapshot
from eks_ddp_trainer.snapshot import Snapshots, agree

IDENT = {"model": "m", "seed": 0}


def _state(step: int, value: float = 1.0) -> dict:
    return {"step": step, "epoch": 0, "sample_in_epoch": step * 16, "samples_seen": step * 16,
            "model": {"w": torch.full((3,), value)}, "optimizer": {"state": {}, "param_groups": []},
            "config": {"identity": IDENT}}


def test_write_then_read_returns_the_newest_offered_state(tmp_path):
    s = Snapshots(tmp_path / "run", rank=0, root=str(tmp_path / "shm"))
    live = _state(3)
    assert s.offer(lambda: live)
    live["model"]["w"].fill_(9.0)  # training goes on: the snapshot holds the copy taken at offer time
    s.writer.wait()
    got = s.read(IDENT)
    assert got["step"] == 3 and torch.equal(got["model"]["w"], torch.ones(3))
    assert s.read({"model": "other"}) is None, "another run's snapshot is not used"
    s.remove()
    assert s.read(IDENT) is None


def test_a_failed_snapshot_write_turns_snapshots_off_and_training_goes_on(tmp_path, monkeypatch):
    """ENOSPC on a small /dev/shm: the next offer must not raise into the training loop (it did: the writer's
    error surfaced on the next submit and killed the run)."""
    s = Snapshots(tmp_path / "run", rank=0, root=str(tmp_path / "shm"))
    s.offer(lambda: _state(1))
    s.writer.wait()

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot.ckpt, "atomic_write_bytes", full)
    monkeypatch.setattr(snapshot, "_clock", lambda: 1e9)  # no copy budget in the way
    assert s.offer(lambda: _state(2))
    s.writer.wait()
    assert not s.enabled and s.offer(lambda: _state(3)) is False
    s.offer(lambda: _state(4), final=True)
    s.writer.wait()


def test_non_finite_state_is_never_written(tmp_path):
    s = Snapshots(tmp_path / "run", rank=0, root=str(tmp_path / "shm"))
    s.offer(lambda: _state(2))
    s.writer.wait()
    s.offer(lambda: _state(3, float("nan")))
    s.writer.wait()
    assert s.read(IDENT)["step"] == 2


def test_only_one_write_in_flight(tmp_path, monkeypatch):
    s = Snapshots(tmp_path / "run", rank=0, root=str(tmp_path / "shm"))
    monkeypatch.setattr(s.writer, "busy", lambda: True)
    assert not s.offer(lambda: _state(1))
    assert Snapshots(tmp_path / "run", 0, root="off").offer(lambda: _state(1)) is False


def _worker(rank: int, port: int, root: str, steps: list[int], durable: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=len(steps))
    try:
        env = DistEnv(rank, 0, len(steps), torch.device("cpu"), "gloo", 0)
        s = Snapshots(Path(root) / "run", rank, root=root)
        if steps[rank] >= 0:
            s.offer(lambda: _state(steps[rank], float(rank)))
            s.writer.wait()
        got = agree(env, s.read(IDENT), durable)
        Path(out, f"{rank}").write_text("none" if got is None else f"{got['step']} {got['model']['w'][0].item()}")
    finally:
        dist.destroy_process_group()


def _agree(tmp_path: Path, steps: list[int], durable: int) -> list[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path), steps, durable, str(tmp_path)), nprocs=len(steps))
    return [(tmp_path / f"{r}").read_text() for r in range(len(steps))]


@pytest.mark.slow  # two or three gloo processes
def test_ranks_agree_on_the_newest_snapshot_from_the_lowest_rank_holding_it(tmp_path):
    # rank 0 has none (its node was replaced), ranks 1 and 2 hold step 7: rank 1's copy goes to all.
    assert _agree(tmp_path, [-1, 7, 7], durable=5) == ["7 1.0"] * 3


@pytest.mark.slow  # two or three gloo processes
def test_no_snapshot_newer_than_the_durable_checkpoint_means_the_checkpoint(tmp_path):
    assert _agree(tmp_path, [5, 4], durable=5) == ["none", "none"]


def test_snapshots_reuse_their_buffers(tmp_path, monkeypatch):
    """The copies go into buffers allocated once (pinned on a GPU), not new ones per snapshot. Time is stepped by
    hand, so the copy budget (test below) never decides whether the second snapshot is taken."""
    now = [100.0]
    monkeypatch.setattr(snapshot, "_clock", lambda: now[0])
    s = Snapshots(tmp_path / "run", rank=0, root=str(tmp_path / "shm"))
    live = _state(1)
    assert s.offer(lambda: live)
    s.writer.wait()
    first = s._buffers["model"]["w"].data_ptr()
    live["model"]["w"].fill_(5.0)
    live["step"] = 2
    now[0] += 3600.0
    assert s.offer(lambda: live)
    s.writer.wait()
    assert s._buffers["model"]["w"].data_ptr() == first
    got = s.read(IDENT)
    assert got["step"] == 2 and torch.equal(got["model"]["w"], torch.full((3,), 5.0)), "the reused buffer holds step 2"
    s.remove()


def test_snapshot_copies_stay_within_their_share_of_wall_time(tmp_path, monkeypatch):
    """A snapshot whose copies took c seconds is followed by the next no sooner than c / SNAPSHOT_BUDGET after it
    began; the run's last step is snapshotted regardless. Time is stepped by hand (no wall clock)."""
    now = [100.0]
    monkeypatch.setattr(snapshot, "_clock", lambda: now[0])
    s = Snapshots(tmp_path / "run", rank=0, root=str(tmp_path / "shm"))

    real_to_cpu = snapshot.to_cpu

    def slow_to_cpu(obj, into=None):
        if isinstance(obj, dict) and "step" in obj:  # the whole state (to_cpu recurses through this too)
            now[0] += 0.003  # the copies take 3 ms
        return real_to_cpu(obj, into)

    monkeypatch.setattr(snapshot, "to_cpu", slow_to_cpu)

    def state(step: int):
        return lambda: _state(step)

    assert s.offer(state(1))
    s.writer.wait()
    gap = 0.003 / snapshot.SNAPSHOT_BUDGET  # 0.1 s
    now[0] = 100.0 + 0.9 * gap
    assert not s.offer(state(2)), "too soon: the copies would take more than their share"
    assert s.offer(state(3), final=True), "the last step is always snapshotted"
    s.writer.wait()
    assert s.read(IDENT)["step"] == 3
    now[0] += 1.1 * gap
    assert s.offer(state(4))
    s.writer.wait()
    s.remove()
