"""Node-local snapshots: one per node, written off the training thread, read back and checked, never non-finite."""

from __future__ import annotations

import os

import torch

from eks_ddp_trainer import snapshot
from eks_ddp_trainer.snapshot import Snapshots

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


def test_only_the_nodes_writer_writes_and_a_damaged_copy_is_not_used(tmp_path):
    """One copy per node: the node's local rank 0 writes it; a copy whose payload fails its header's SHA-256 is
    not used (and the header alone, what a restore decides from, still names its step)."""
    root = str(tmp_path / "shm")
    assert Snapshots(tmp_path / "run", rank=1, root=root, writer=False).offer(lambda: _state(1)) is False
    s = Snapshots(tmp_path / "run", rank=0, root=root)
    s.offer(lambda: _state(4))
    s.writer.wait()
    assert [p.name for p in (tmp_path / "shm").rglob("*") if p.is_file()] == [snapshot.SNAPSHOT_NAME]
    blob = bytearray(s.path.read_bytes())
    blob[-20] ^= 0xFF
    s.path.write_bytes(bytes(blob))
    assert s.meta(IDENT)["step"] == 4 and s.read(IDENT) is None


def test_a_copy_that_does_not_fit_says_its_size_and_the_limit(tmp_path, monkeypatch, capsys):
    """A state too big for the node's /dev/shm: one line in the run's log naming the copy's size and the limit,
    snapshots off, training goes on (docs/trainer.md "Node-local snapshots")."""
    s = Snapshots(tmp_path / "run", rank=0, root=str(tmp_path / "shm"))
    real = os.statvfs(tmp_path)

    class Tiny:
        f_frsize, f_bavail, f_blocks = real.f_frsize, 0, 2

    monkeypatch.setattr(snapshot.os, "statvfs", lambda _p: Tiny)
    assert s.offer(lambda: _state(1))
    s.writer.wait()
    out = capsys.readouterr().out
    assert not s.enabled and not s.path.exists() and s.offer(lambda: _state(2)) is False
    assert "[snapshot] step 1: node-local snapshot" in out and "does not fit" in out and "GiB free of" in out, out
    assert "the node's copy of the state (0.00 GiB)" in out


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
