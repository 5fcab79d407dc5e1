"""No interleaving lets a replaced world's commit be loaded (training/eks_ddp_trainer/checkpoint.py "Fences"), checked exhaustively.

World A (generation 1) keeps committing checkpoints while world C forms: C's loader picks a base, C writes its
fence (generation 2) and commits. A's commits here skip every commit-time check (its lease, the newer fence):
the worst case, a writer stalled between its check and its rename. Every order of A's and C's events is run on
a real run directory with the real save, fence and load functions; a loader after C's fence must never return a
state A committed after that fence. The same enumeration with the pre-fence loader (no lineage) is the negative
control: there, some order loads such a stale state.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.snapshot import Snapshots
from tests.support.fence_store import closed_stores, use_store, wipe_keys  # noqa: F401  (fixture)

A_STEPS = (5, 10, 15)


def _state(step: int, generation: int) -> dict:
    return {"model": {"w": torch.tensor([float(step)])}, "optimizer": {}, "step": step, "epoch": 0,
            "sample_in_epoch": step, "config": {"identity": {}}, "fence": {"generation": generation, "round": 0}}


def _orders(a: int, c: int):
    """Every interleaving of a sequence of ``a`` events with one of ``c`` (True: the next A event)."""
    for slots in itertools.combinations(range(a + c), a):
        yield [i in slots for i in range(a + c)]


def _run(run: Path, order: list[bool], keep: int, fenced_loader: bool, monkeypatch) -> list[str]:
    """Play one order; returns the violations (a loader after C's fence that returned a stale A commit)."""
    real_superseded = ckpt.superseded
    a_gen = ckpt.write_fence(run, None, 0)  # world A: 1 (with the run's store: 2, above the seed the store starts at)
    assert a_gen in (1, 2)
    a_steps, c_events = list(A_STEPS), ["load", "fence", "commit", "commit"]
    c_base = c_gen = None
    c_step = 0
    stale: set[tuple[int, int]] = set()  # A's commits made after C's fence
    bad = []

    def load(after: str) -> None:
        lineage = ckpt.read_lineage(run) if fenced_loader else None
        found = ckpt.load_latest(run, lineage=lineage)
        if found is not None and (ckpt.generation_of(found[0]), found[0]["step"]) in stale:
            bad.append(f"{after}: loaded A's step {found[0]['step']} committed after C's fence")

    for a_next in order:
        if a_next:
            step = a_steps.pop(0)
            with monkeypatch.context() as m:  # a stalled writer: its checks passed before the newer fence existed
                m.setattr(ckpt, "superseded", lambda *_: False)
                assert ckpt.save_checkpoint(run, _state(step, a_gen), keep=keep) is not None
            if c_gen is not None:
                stale.add((a_gen, step))
        else:
            event = c_events.pop(0)
            if event == "load":
                found = ckpt.load_latest(run)
                c_base = (ckpt.generation_of(found[0]), found[0]["step"]) if found else None
                c_step = c_base[1] if c_base else 0
            elif event == "fence":
                c_gen = ckpt.write_fence(run, c_base, 1)
                assert c_gen == a_gen + 1
            else:
                c_step += 5  # C commits the steps A also commits: same names, files replaced both ways
                assert real_superseded(run, c_gen) is False
                assert ckpt.save_checkpoint(run, _state(c_step, c_gen), keep=keep) is not None
        if c_gen is not None:
            load(f"order {order}")  # a third world's loader at this point
    return bad


@pytest.fixture
def no_fsync(monkeypatch):
    """The orders are about which rename happens when, not about durability: skip the disk flushes."""
    import os

    monkeypatch.setattr(os, "fsync", lambda _fd: None)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """One real store for the module; each order uses its own rendezvous id (its own fence keys)."""
    from eks_ddp_local.etcd_server import start_etcd

    with start_etcd(tmp_path_factory.mktemp("etcd")) as endpoint:
        yield endpoint


@pytest.mark.parametrize(("keep", "fences"), [(1000, "files"), (2, "files"), (2, "store")])
@pytest.mark.usefixtures("closed_stores")
def test_no_order_of_events_loads_a_replaced_worlds_commit(tmp_path, monkeypatch, no_fsync, keep, fences, request):
    """With the files alone (the c10d backend) and with the run's store as the fence's source of truth (the etcd
    rendezvous: tests/trainer/test_fence_store.py adds a client that answers from a stale cache)."""
    if fences == "store":
        use_store(monkeypatch, request.getfixturevalue("etcd"))
    checked = 0
    for i, order in enumerate(_orders(len(A_STEPS), 4)):
        if fences == "store":
            wipe_keys()  # each order on its own run directory and an empty store
        bad = _run(tmp_path / f"run-{i}", order, keep, True, monkeypatch)
        assert not bad, bad
        checked += 1
    assert checked == 35


def test_the_pre_fence_loader_loads_a_replaced_worlds_commit(tmp_path, monkeypatch, no_fsync):
    # Negative control: the same orders, loaded without the lineage (the loader before fences) go wrong.
    bad = [b for i, order in enumerate(_orders(len(A_STEPS), 4))
           for b in _run(tmp_path / f"run-{i}", order, 1000, False, monkeypatch)]
    assert bad, "the enumeration never produced a stale load: it would not catch one either"


def test_the_lineage_follows_the_chain_of_bases(tmp_path):
    run = tmp_path / "run"
    assert ckpt.read_lineage(run) is None  # no fence: everything loads (run directories from before fences)
    assert ckpt.write_fence(run, (0, 40), 0) == 1  # resumed from a checkpoint written before fences
    assert ckpt.write_fence(run, (1, 55), 1) == 2
    assert ckpt.write_fence(run, None, 2) == 3  # --start-over
    assert ckpt.write_fence(run, (3, 7), 3) == 4
    assert ckpt.read_lineage(run) == {4: None, 3: 7}
    fences = ckpt.read_fences(run)
    del fences[3], fences[4]
    assert ckpt.lineage_of(fences) == {2: None, 1: 55, 0: 40}
    assert ckpt.on_lineage({2: None, 1: 55, 0: 40}, {"step": 40}) and not ckpt.on_lineage({2: None, 1: 55}, {"step": 1})


def test_a_fence_is_written_once_per_generation(tmp_path, monkeypatch):
    # Two worlds that saw the same newest fence both try its successor: link(2) gives it to one; the other
    # takes the next generation.
    run = tmp_path / "run"
    ckpt.write_fence(run, None, 0)
    monkeypatch.setattr(ckpt, "_fence_generations", lambda _run: [1])  # a stale listing: generation 2 looks free
    assert ckpt.write_fence(run, None, 1) == 2
    assert ckpt.write_fence(run, None, 1) == 3
    monkeypatch.undo()
    assert sorted(ckpt.read_fences(run)) == [1, 2, 3]


def test_a_replaced_worlds_snapshot_is_not_used(tmp_path):
    run = tmp_path / "run"
    snaps = Snapshots(run, rank=0, root=str(tmp_path / "shm"))
    snaps._write(_state(30, 1))  # world 1 trained on past the step world 2 restored (25)
    ckpt.write_fence(run, None, 0)
    ckpt.write_fence(run, (1, 25), 1)
    assert snaps.read({}, ckpt.read_lineage(run)) is None
    snaps._write(_state(25, 1))  # the state world 2 restored is on the lineage
    assert snaps.read({}, ckpt.read_lineage(run))["step"] == 25
    assert snaps.read({}, None)["step"] == 25  # no lineage: as before


def test_a_replaced_world_neither_commits_nor_deletes(tmp_path):
    run = tmp_path / "run"
    ckpt.write_fence(run, None, 0)
    for step in (5, 10):
        ckpt.save_checkpoint(run, _state(step, 1), keep=2)
    ckpt.write_fence(run, (1, 10), 1)
    assert ckpt.save_checkpoint(run, _state(15, 1), keep=1) is None  # refused: generation 2 fenced the folder
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000005.pt", "ckpt-000000010.pt"]
    assert ckpt.save_checkpoint(run, _state(15, 2), keep=1).name == "ckpt-000000015.pt"
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000015.pt"]


def test_history_records_wait_while_commits_are_refused_and_keep_their_order(tmp_path):
    import json

    from eks_ddp_trainer.runlog import RunLog

    allowed = {"now": True}

    def gate() -> None:
        if not allowed["now"]:
            raise ckpt.CommitRefused("history record")

    log = RunLog(tmp_path, enabled=True, tensorboard=False)
    log.gate = gate
    log.record("train", None, kind="step", step=1)
    log.flush(wait=False)  # what its writer thread does; here, to look at the file at a known moment
    allowed["now"] = False  # the lease lapsed (a store outage): nothing is appended, nothing is lost
    log.record("train", None, kind="step", step=2)
    log.record("train", None, kind="step", step=3)
    log.flush(wait=False)
    steps = lambda: [json.loads(line)["step"] for line in (tmp_path / "history.jsonl").read_text().splitlines()]  # noqa: E731
    assert steps() == [1]
    allowed["now"] = True
    log.record("train", None, kind="step", step=4)
    log.flush(wait=False)
    assert steps() == [1, 2, 3, 4]
    log.close()
    assert steps() == [1, 2, 3, 4]


def test_a_commit_check_that_hangs_never_holds_up_a_record(tmp_path):
    """The history's check reads the run's store: a store that hangs held each step's record for the check's wait
    (5 s), and a 5-minute hang stopped training. The check runs on the log's own thread now: here it blocks until
    the test releases it, which the test can only do once record() has returned (a record that waited for the check
    would find it unreleased after its 30 s timeout, the negative case)."""
    import json
    import threading

    from eks_ddp_trainer.runlog import RunLog

    released, outcomes = threading.Event(), []

    def hanging_gate() -> None:
        outcomes.append(released.wait(30))

    log = RunLog(tmp_path, enabled=True, tensorboard=False)
    log.gate = hanging_gate
    for step in range(3):
        log.record("train", None, kind="step", step=step)
    released.set()
    log.close()
    assert outcomes and outcomes[0] is True, outcomes
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]


def test_an_error_of_the_history_check_reaches_the_training_thread(tmp_path):
    """ReplacedElsewhere raised by the check on the log's thread stops the trainer at its next record (or close)."""
    from eks_ddp_trainer.runlog import RunLog

    def replaced() -> None:
        raise ckpt.ReplacedElsewhere("another store's world")

    log = RunLog(tmp_path, enabled=True, tensorboard=False)
    log.gate = replaced
    log.record("train", None, kind="step", step=1)
    with pytest.raises(ckpt.ReplacedElsewhere):
        for step in range(2, 2000):  # the writer thread's first try lands within one of these
            log.record("train", None, kind="step", step=step)
            log._writer.join(0.01)
    assert not (tmp_path / "history.jsonl").exists()


def _save_while_live_writes(run: Path, live: dict, other, monkeypatch) -> Path | None:
    """The live world's rank 0 saves ``live``; between its write+fsync and its rename (where a large checkpoint on
    EFS spends seconds to minutes) ``other()`` runs: another writer's save on the same folder."""
    real = ckpt.atomic_write_bytes

    def write(path, data, *, before_replace=None, **kw):
        def hook() -> None:
            monkeypatch.setattr(ckpt, "atomic_write_bytes", real)  # the other writer's save is a plain one
            other()
            if before_replace is not None:
                before_replace()
        return real(path, data, before_replace=hook, **kw)

    monkeypatch.setattr(ckpt, "atomic_write_bytes", write)
    try:
        return ckpt.save_checkpoint(run, live, keep=2)
    finally:
        monkeypatch.setattr(ckpt, "atomic_write_bytes", real)


def test_a_replaced_worlds_refused_save_leaves_the_live_save_committed(tmp_path, monkeypatch):
    """The review's stale-save reproduction: world 1 was replaced by world 2 and keeps trying to checkpoint while
    world 2's rank 0 writes step 20; world 1's refused save must not touch world 2's temp file."""
    run = tmp_path / "run"
    ckpt.write_fence(run, None, 0)
    ckpt.save_checkpoint(run, _state(10, 1), keep=2)
    ckpt.write_fence(run, (1, 10), 1)
    refused: list = []
    saved = _save_while_live_writes(run, _state(20, 2), lambda: refused.append(
        ckpt.save_checkpoint(run, _state(15, 1), keep=2)), monkeypatch)
    assert refused == [None]
    assert saved is not None and saved.name == "ckpt-000000020.pt"
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000010.pt", "ckpt-000000020.pt"]
    assert ckpt.on_lineage(ckpt.read_lineage(run), torch.load(saved, weights_only=False))


def test_two_writers_with_one_pid_on_two_hosts_never_remove_each_others_files(tmp_path, monkeypatch):
    """Two nodes' rank 0s (pid namespaces: the same pid on both) write into one folder at once; each may only
    clean its own temp files. A writer's leftover from an earlier killed try is still cleaned by that writer."""
    import socket

    run = tmp_path / "run"
    monkeypatch.setattr(ckpt.os, "getpid", lambda: 7)
    monkeypatch.setattr(socket, "gethostname", lambda: "node-a")
    d = ckpt.ckpt_dir(run)
    d.mkdir(parents=True)
    own_leftover = d / f".ckpt-000000003.pt.tmp-{ckpt.writer_tag(None)}"
    own_leftover.write_bytes(b"killed before its rename")
    seen: list[list[str]] = []

    def node_b() -> None:
        monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
        try:
            seen.append(sorted(p.name for p in d.glob(".ckpt-*.tmp-*")))
            assert ckpt.save_checkpoint(run, {**_state(4, 0), "fence": None}, keep=5) is not None
        finally:
            monkeypatch.setattr(socket, "gethostname", lambda: "node-a")

    saved = _save_while_live_writes(run, {**_state(5, 0), "fence": None}, node_b, monkeypatch)
    assert saved is not None and saved.exists()
    assert seen == [[f".ckpt-000000005.pt.tmp-{ckpt.writer_tag(None)}"]]  # node-a's leftover cleaned, its live file kept
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000004.pt", "ckpt-000000005.pt"]
    assert not list(d.glob(".ckpt-*.tmp-*"))
    # Negative control: the same names on both hosts (today's pid-only tag) would have let node-b's save take it.
    assert ckpt.writer_tag(None) != ckpt.writer_tag(0) and "node-a" in ckpt.writer_tag(None)
