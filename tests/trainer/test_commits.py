"""Rank 0's checkpoint committer (training/eks_ddp_trainer/commits.py): a refused commit waits off the training
thread, at most one checkpoint waits (the newest), it lands once the fence's check passes, never before, and a
replaced world commits nothing."""

from __future__ import annotations

import time

import pytest
import torch

from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import commits
from eks_ddp_trainer.snapshot import HostCopy
from tests.trainer.test_fence_lineage import _state


@pytest.fixture(autouse=True)
def _fast_retry(monkeypatch):
    monkeypatch.setattr(commits, "RETRY_S", 0.05)


def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_store_that_does_not_answer_holds_no_submit_and_the_newest_pending_checkpoint_lands_after(
        tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    gen = ckpt.write_fence(run, None, 0)
    checks = {"n": 0}
    real = ckpt._superseded_why

    def hung(run_dir, generation):  # the run's store does not answer: each check waits, then refuses
        checks["n"] += 1
        time.sleep(0.1)
        return "the run's store 127.0.0.1:2379 did not answer the fence's read: a commit needs that check"

    monkeypatch.setattr(ckpt, "_superseded_why", hung)
    c = commits.Checkpoints(run, keep=2)
    t0 = time.monotonic()
    for step in (5, 10, 15):
        c.submit(step, HostCopy(_state(step, gen)))
    assert time.monotonic() - t0 < 0.1  # the training thread never waits for the check
    _until(lambda: checks["n"] >= 5)
    assert ckpt.list_checkpoints(run) == [] and c.busy()  # never committed without the check
    monkeypatch.setattr(ckpt, "_superseded_why", real)  # the store answers again
    c.wait()
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000015.pt"]
    assert c.committed == [15]  # 10 was replaced before it could land; 5 was being tried and was dropped
    out = capsys.readouterr().out
    assert out.count("commit deferred") == 1 and out.count("commits resume") == 1, out  # once per episode
    assert out.count("replaces step") == 1 and "were replaced before they could land" in out, out


def test_a_replaced_world_commits_nothing_however_long_it_retries(tmp_path):
    run = tmp_path / "run"
    old = ckpt.write_fence(run, None, 0)
    ckpt.write_fence(run, None, 1)  # a newer world fenced the run directory
    c = commits.Checkpoints(run, keep=2)
    c.submit(5, HostCopy(_state(5, old)))
    time.sleep(0.5)
    assert c.busy() and ckpt.list_checkpoints(run) == []


def test_an_error_of_the_check_reaches_the_training_thread_at_its_next_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    gen = ckpt.write_fence(run, None, 0)

    def elsewhere(run_dir, generation):
        raise ckpt.ReplacedElsewhere("a world of another store")

    monkeypatch.setattr(ckpt, "_superseded_why", elsewhere)
    c = commits.Checkpoints(run, keep=2)
    c.submit(5, HostCopy(_state(5, gen)))
    _until(lambda: not c.busy())
    with pytest.raises(ckpt.ReplacedElsewhere):
        c.submit(10, HostCopy({"step": 10, "model": {"w": torch.zeros(1)}}))
