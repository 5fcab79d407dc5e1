"""Two live rendezvous stores over one run directory (training/eks_ddp_trainer/checkpoint.py "Fences",
docs/rendezvous.md "Two live stores"): real etcd servers, the real save, fence and load functions.

A store pod force-deleted while its node still serves it, a store recreated by hand or restored, a second stack on the
same volume: each store's worlds are the newest in their own store. Only the fence files on the shared volume are
seen by both, so a world's commit check consults the store and the next fence file, and a world whose own store still
names it the newest while another store's world fenced the run directory stops with SUPERSEDED instead of waiting
for an agent that will never stop it. The store-only check of the design before is the negative control.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from eks_ddp_local.etcd_server import start_etcd
from eks_ddp_runtime import contract, fence_store
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import resume
from eks_ddp_trainer.guards import TrainerError
from tests.support.fence_store import closed_stores  # noqa: F401  (fixture)
from tests.trainer.test_fence_lineage import _save_while_live_writes, _state

pytestmark = pytest.mark.usefixtures("closed_stores")


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Iterator[tuple[object, object]]:
    """Two separate etcd servers (two stores of one run: the same rendezvous id in each)."""
    with start_etcd(tmp_path_factory.mktemp("etcd-1")) as one, start_etcd(tmp_path_factory.mktemp("etcd-2")) as two:
        yield one, two


class Run:
    """One run id; :meth:`on` points this process's fences at one store, as the launcher does for a world's workers."""

    def __init__(self, monkeypatch, stores) -> None:
        self.monkeypatch, self.stores = monkeypatch, stores
        self.run_id = f"run-{uuid.uuid4().hex[:12]}"

    def on(self, i: int) -> None:
        endpoint = self.stores[i]
        tls = endpoint.tls
        self.monkeypatch.setenv(fence_store.FENCE_STORE_ENV, fence_store.config_for(
            str(endpoint), self.run_id, {"protocol": "https", "ca_cert": str(tls.ca_cert),
                                         "ssl_cert": str(tls.client_cert), "ssl_cert_key": str(tls.client_key),
                                         "read_timeout": 2.0}, 600.0))


def _store_only(run_dir, generation: int) -> bool:
    """The commit check before: only the world's own store decides."""
    record, _ = ckpt._store().newest(ckpt.STORE_WAIT_S)
    return record is None or int(record["generation"]) != generation


def _split(run: Path, r: Run) -> tuple[int, int]:
    """World A trains on store 0 and commits step 5; world B forms on store 1 (empty: seeded above A's fence file),
    resumes from A's step 5 and commits step 10. Returns (A's generation, B's)."""
    r.on(0)
    a = ckpt.write_fence(run, None, 0)
    assert a is not None and ckpt.save_checkpoint(run, _state(5, a), keep=10) is not None
    r.on(1)
    lineage = ckpt.read_lineage(run)
    found = ckpt.load_latest(run, lineage=lineage)
    assert found is not None and found[0]["step"] == 5
    b = ckpt.write_fence(run, (a, 5), 0, lineage)
    assert b == a + 2  # above store 1's seed, which is above A's file
    assert ckpt.save_checkpoint(run, _state(10, b), keep=10) is not None
    return a, b


def test_a_world_replaced_by_another_stores_world_commits_nothing_and_stops(tmp_path, monkeypatch, stores):
    r, run = Run(monkeypatch, stores), tmp_path / "run"
    a, b = _split(run, r)
    r.on(0)
    assert not _store_only(run, a)  # its own store still names A the newest...
    assert ckpt.superseded(run, a)  # ...the run directory's fences do not
    with pytest.raises(ckpt.ReplacedElsewhere, match="two live stores") as raised:
        ckpt.save_checkpoint(run, _state(15, a), keep=10)
    assert raised.value.code == contract.SUPERSEDED and isinstance(raised.value, TrainerError)
    with pytest.raises(ckpt.ReplacedElsewhere):
        ckpt.commit_gate(run, a, "history record")()
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000005.pt", "ckpt-000000010.pt"]
    # A restart into its own store fences nothing above B (it would take the run directory back): it stops too.
    with pytest.raises(ckpt.ReplacedElsewhere, match="does not fence above it"):
        ckpt.write_fence(run, (a, 5), 1, ckpt.read_lineage(run))
    assert not ckpt.fence_path(run, b + 1).exists()
    r.on(1)
    assert not ckpt.superseded(run, b)
    assert ckpt.read_lineage(run) == {b: None, a: 5}
    assert ckpt.save_checkpoint(run, _state(15, b), keep=10) is not None


def test_with_the_store_alone_two_live_stores_both_commit(tmp_path, monkeypatch, stores):
    # Negative control: the check of the design before (the world's own store only) lets A commit after B's fence.
    r, run = Run(monkeypatch, stores), tmp_path / "run"
    a, b = _split(run, r)
    r.on(0)
    monkeypatch.setattr(ckpt, "superseded", _store_only)
    assert ckpt.save_checkpoint(run, _state(15, a), keep=10) is not None
    assert [p.name for p in ckpt.list_checkpoints(run)][-1] == "ckpt-000000015.pt"  # A's, after B's fence


def test_a_replaced_worlds_stop_leaves_the_live_worlds_save_in_flight_committed(tmp_path, monkeypatch, stores):
    """While B's rank 0 writes step 20 (between its fsync and its rename), A tries to save: it stops before it
    touches the folder, and B's save lands; B's later save removes nothing of A's that A could still commit."""
    r, run = Run(monkeypatch, stores), tmp_path / "run"
    a, b = _split(run, r)
    stopped: list[int] = []

    def replaced_world_saves() -> None:
        r.on(0)
        try:
            ckpt.save_checkpoint(run, _state(15, a), keep=2)
        except ckpt.ReplacedElsewhere as e:
            stopped.append(e.code)
        finally:
            r.on(1)

    saved = _save_while_live_writes(run, _state(20, b), replaced_world_saves, monkeypatch)
    assert stopped == [contract.SUPERSEDED]
    assert saved is not None and saved.name == "ckpt-000000020.pt"
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000010.pt", "ckpt-000000020.pt"]
    assert not list(ckpt.ckpt_dir(run).glob(".ckpt-*.tmp-*"))


def test_a_contender_of_the_same_store_defers_commits_without_stopping_the_world(tmp_path, monkeypatch, stores):
    """A newer fence file whose world has not yet claimed its generation in this store (it is between its link and
    its transaction) refuses commits but is no other store: the world waits to be stopped by its agent. A file that
    names no store (older records, a restored store) counts as another store's only after SPLIT_GRACE_S."""
    r, run = Run(monkeypatch, stores), tmp_path / "run"
    r.on(0)
    a = ckpt.write_fence(run, None, 0)
    newest, _ = ckpt._store().newest(5.0)
    in_flight = ckpt._record(a + 1, (a, 0), 1, {a + 1: None}, store_id=newest["store"])
    assert ckpt._link_record(run, in_flight)
    with pytest.raises(ckpt.CommitRefused):
        ckpt.commit_gate(run, a, "history record")()
    assert ckpt.replaced_elsewhere(run, a, newest["store"]) is None
    unnamed = {**ckpt._record(a + 2, (a, 0), 1, {a + 2: None}), "store": None}
    assert ckpt._link_record(run, unnamed)
    assert ckpt.replaced_elsewhere(run, a, newest["store"]) is None  # not yet: first seen now
    monkeypatch.setattr(ckpt, "SPLIT_GRACE_S", 0.0)
    assert "has stood for" in (ckpt.replaced_elsewhere(run, a, newest["store"]) or "")


def test_every_rank_of_a_world_that_may_not_fence_stops_with_superseded(tmp_path, monkeypatch, stores):
    """fence_world: rank 0's refusal reaches every rank (one process here: the broadcast is the identity)."""
    r, run = Run(monkeypatch, stores), tmp_path / "run"
    a, _ = _split(run, r)
    r.on(0)

    class Env:
        is_main, distributed, device = True, False, "cpu"

    monkeypatch.setenv("EKS_DDP_RDZV_ROUND", "3")
    with pytest.raises(ckpt.ReplacedElsewhere) as raised:
        resume.fence_world(Env(), run, _state(5, a))  # type: ignore[arg-type]
    assert raised.value.code == contract.SUPERSEDED == 8
