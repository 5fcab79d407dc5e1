"""The run's fence kept in its etcd store (training/eks_ddp_trainer/checkpoint.py, eks_ddp_runtime/fence_store.py),
with a real etcd and the real save, fence and load functions.

A shared file system's client may answer a lookup or a listing of ``fences/`` from its cache: the Linux NFS client
trusts a cached negative entry while the directory's cached change attribute matches and its attribute cache has
not expired (fs/nfs/dir.c ``nfs_neg_need_reval`` / ``nfs_check_verifier``; acdirmax 60 s with EFS's mount options).
:class:`StaleFenceDir` plays such a client: ``exists()``, ``is_dir()`` and listings of ``fences/`` are answered
from a snapshot taken earlier (``open`` too, where a test says so); link(2), an exclusive create, reaches the
"server" (the real directory), as NFS's LINK does. With the store nothing of that reaches a decision; with the
file fences alone (today's design, still used without a store) it loads a replaced world's commit (the negative
control).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from eks_ddp_local.etcd_server import start_etcd
from eks_ddp_runtime import fence_store
from eks_ddp_trainer import checkpoint as ckpt
from tests.support.etcd_server import RestartableEtcd
from tests.support.fence_store import closed_stores, use_store, wipe_keys  # noqa: F401  (fixture)
from tests.trainer.test_fence_lineage import _orders, _state

pytestmark = pytest.mark.usefixtures("closed_stores")
A_STEPS = (5, 10, 15)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory) -> Iterator[object]:
    """One store for the module (each test and each order uses its own rendezvous id, so its own keys)."""
    with start_etcd(tmp_path_factory.mktemp("etcd")) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def restartable(tmp_path_factory) -> Iterator[RestartableEtcd]:
    """A store the wipe and outage tests stop, wipe and start again (one for the module)."""
    server = RestartableEtcd(tmp_path_factory.mktemp("etcd-r"))
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.fixture
def no_fsync(monkeypatch):
    """The orders are about which rename happens when, not about durability: skip the disk flushes."""
    monkeypatch.setattr(os, "fsync", lambda _fd: None)


class StaleFenceDir:
    """A client whose cache of ``fences/`` dates from :meth:`freeze`: ``exists()``/``is_dir()`` of the folder's
    entries and its listing answer from the snapshot (lookupcache=all within the attribute cache time). With
    ``opens=True`` opening an entry that is not in the snapshot fails with ENOENT too (a cached negative entry).
    Creating (link(2)) is not intercepted: an exclusive create is the server's answer."""

    def __init__(self, monkeypatch) -> None:
        self.snap: dict[str, set[str]] = {}
        self.opens = False
        real_exists, real_is_dir, real_iterdir = Path.exists, Path.is_dir, Path.iterdir
        cache = self

        def exists(path, *a, **kw):
            names = cache.snap.get(str(path.parent))
            return path.name in names if names is not None else real_exists(path, *a, **kw)

        def is_dir(path, *a, **kw):
            return True if str(path) in cache.snap else real_is_dir(path, *a, **kw)

        def iterdir(path):
            names = cache.snap.get(str(path))
            return iter([path / n for n in sorted(names)]) if names is not None else real_iterdir(path)

        def opener(file, mode="r", *a, **kw):
            names = cache.snap.get(str(Path(file).parent))
            if cache.opens and "r" in mode and names is not None and Path(file).name not in names:
                raise FileNotFoundError(2, "No such file or directory (a cached negative entry)", str(file))
            return open(file, mode, *a, **kw)

        monkeypatch.setattr(Path, "exists", exists)
        monkeypatch.setattr(Path, "is_dir", is_dir)
        monkeypatch.setattr(Path, "iterdir", iterdir)
        monkeypatch.setattr(ckpt, "open", opener, raising=False)

    def freeze(self, run: Path) -> None:
        d = ckpt.fence_dir(run)
        self.snap[str(d)] = set(os.listdir(d)) if os.path.isdir(d) else set()

    def thaw(self) -> None:
        self.snap.clear()


def _play(run: Path, order: list[bool], stale: StaleFenceDir, stalled: bool, monkeypatch) -> list[str]:
    """World A keeps committing while world C loads, fences and commits; a third world's loader runs after every
    event from C's fence on. Every read of ``fences/`` after A's fence comes from a cache taken then. ``stalled``:
    A's commits skip the newer-fence check (a writer stalled between its check and its rename); otherwise A uses
    its real gate. Returns the violations: a loader after C's fence that returned a commit A made after it."""
    a_gen = ckpt.write_fence(run, None, 0)
    assert a_gen is not None
    stale.freeze(run)  # this client never sees a newer fence by lookup or listing
    a_steps, c_events = list(A_STEPS), ["load", "fence", "commit", "commit"]
    c_base = c_gen = c_lineage = None
    c_step = 0
    late: set[tuple[int, int]] = set()
    bad = []
    for a_next in order:
        if a_next:
            step = a_steps.pop(0)
            with monkeypatch.context() as m:
                if stalled:
                    m.setattr(ckpt, "superseded", lambda *_: False)
                saved = ckpt.save_checkpoint(run, _state(step, a_gen), keep=1000)
            if saved is not None and c_gen is not None:
                late.add((a_gen, step))
        else:
            event = c_events.pop(0)
            if event == "load":
                c_lineage = ckpt.read_lineage(run)
                found = ckpt.load_latest(run, lineage=c_lineage)
                c_base = (ckpt.generation_of(found[0]), found[0]["step"]) if found else None
                c_step = c_base[1] if c_base else 0
            elif event == "fence":
                c_gen = ckpt.write_fence(run, c_base, 1, c_lineage)
                assert c_gen is not None and c_gen > a_gen
            else:
                c_step += 5
                assert ckpt.save_checkpoint(run, _state(c_step, c_gen), keep=1000) is not None
        if c_gen is not None:
            found = ckpt.load_latest(run)  # a third world's loader, on the stale client
            if found is not None and (ckpt.generation_of(found[0]), found[0]["step"]) in late:
                bad.append(f"order {order}: loaded A's step {found[0]['step']} committed after C's fence")
    return bad


@pytest.mark.parametrize("stalled", [False, True], ids=["a-checks", "a-stalled"])
def test_no_order_loads_a_replaced_worlds_commit_on_a_stale_client_with_the_store(tmp_path, monkeypatch, no_fsync,
                                                                                  etcd, stalled):
    stale = StaleFenceDir(monkeypatch)
    use_store(monkeypatch, etcd)
    checked = 0
    for i, order in enumerate(_orders(len(A_STEPS), 4)):
        wipe_keys()  # each order on its own run directory and an empty store
        stale.thaw()
        bad = _play(tmp_path / f"run-{i}", order, stale, stalled, monkeypatch)
        assert not bad, bad
        checked += 1
    assert checked == 35


def test_the_file_fences_on_a_stale_client_load_a_replaced_worlds_commit(tmp_path, monkeypatch, no_fsync):
    # Negative control: the same orders with the file fences alone (no store: the design before, and the c10d
    # backend's) go wrong on a client that answers lookups and listings from its cache.
    monkeypatch.delenv(fence_store.FENCE_STORE_ENV, raising=False)
    stale = StaleFenceDir(monkeypatch)
    bad = []
    for i, order in enumerate(_orders(len(A_STEPS), 4)):
        stale.thaw()
        bad += _play(tmp_path / f"run-{i}", order, stale, False, monkeypatch)
    assert bad, "a stale client never loaded a replaced world's commit: the fake would not catch one either"


def test_a_replaced_world_on_a_stale_client_commits_nothing(tmp_path, monkeypatch, etcd):
    use_store(monkeypatch, etcd)
    stale = StaleFenceDir(monkeypatch)
    run = tmp_path / "run"
    a = ckpt.write_fence(run, None, 0)
    assert ckpt.save_checkpoint(run, _state(5, a), keep=2) is not None
    stale.freeze(run)
    c = ckpt.write_fence(run, (a, 5), 1, ckpt.read_lineage(run))
    assert c == a + 1 and not ckpt.fence_path(run, c).exists()  # the stale client does not see C's fence file...
    assert ckpt.superseded(run, a) and not ckpt.superseded(run, c)  # ...the store answers
    assert ckpt.save_checkpoint(run, _state(10, a), keep=2) is None
    with pytest.raises(ckpt.CommitRefused):
        ckpt.commit_gate(run, a, "metrics")()
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000005.pt"]
    assert ckpt.read_lineage(run) == {c: None, a: 5}


def test_two_worlds_that_read_the_same_newest_take_two_generations(tmp_path, monkeypatch, etcd):
    use_store(monkeypatch, etcd)
    run = tmp_path / "run"
    first = ckpt.write_fence(run, None, 0)
    seen = ckpt.read_lineage(run)  # both loaders read this newest
    x = ckpt.write_fence(run, (first, 0), 1, seen)
    real_newest = ckpt.fence_store.FenceStore.newest
    calls = {"n": 0}

    def stale_first_read(self, wait_s):  # y read the newest before x's transaction landed
        calls["n"] += 1
        if calls["n"] == 1:
            return {"generation": first, "lineage": ckpt._encode_lineage(seen)}, b"not the stored value"
        return real_newest(self, wait_s)

    monkeypatch.setattr(ckpt.fence_store.FenceStore, "newest", stale_first_read)
    y = ckpt.write_fence(run, (first, 0), 1, seen)
    monkeypatch.undo()
    assert (x, y) == (first + 1, first + 2)  # y's read was stale: its transaction lost, it took the next one
    assert ckpt.superseded(run, x) and not ckpt.superseded(run, y)
    assert ckpt.read_lineage(run) == {y: None, first: 0}


def test_the_lineage_follows_the_chain_of_bases_in_the_store(tmp_path, monkeypatch, etcd):
    use_store(monkeypatch, etcd)
    run = tmp_path / "run"
    assert ckpt.read_lineage(run) is None  # a new run: the store is seeded (generation 1), everything loads
    assert ckpt.write_fence(run, (0, 40), 0, None) == 2
    assert ckpt.write_fence(run, (2, 55), 1) == 3
    assert ckpt.read_lineage(run) == {3: None, 2: 55, 0: 40}
    assert ckpt.write_fence(run, None, 2) == 4  # --start-over
    assert ckpt.write_fence(run, (4, 7), 3) == 5
    assert ckpt.read_lineage(run) == {5: None, 4: 7}
    records = ckpt._store().records(5.0)
    assert sorted(records) == [1, 2, 3, 4, 5] and records[1]["seed"] and not records[2]["seed"]


def test_a_wiped_store_is_reseeded_above_every_fence_on_a_stale_client(tmp_path, monkeypatch, no_fsync, restartable):
    """The store comes back empty while a replaced world's writer is stalled: the fence must not go backwards
    (the seed probes names upward with link(2), each EEXIST the server's), the stale commit stays off the lineage,
    and every world fenced before the wipe is replaced."""
    use_store(monkeypatch, restartable.endpoint)
    stale = StaleFenceDir(monkeypatch)
    run = tmp_path / "run"
    a = ckpt.write_fence(run, None, 0)
    assert ckpt.save_checkpoint(run, _state(5, a), keep=10) is not None
    stale.freeze(run)  # the client's cache: fences up to A's
    c = ckpt.write_fence(run, (a, 5), 1, ckpt.read_lineage(run))
    with monkeypatch.context() as m:  # A's writer, stalled past its check, renames after C's fence
        m.setattr(ckpt, "superseded", lambda *_: False)
        assert ckpt.save_checkpoint(run, _state(10, a), keep=10) is not None
    restartable.wipe()
    restartable.start()
    # On the stale client the seed cannot open fence C (a cached negative entry): it waits, then refuses.
    stale.opens = True
    monkeypatch.setattr(ckpt, "REREAD_WAIT_S", 0.3)
    with pytest.raises(ckpt.FenceError, match=f"{c:09d}.json"):
        ckpt.read_lineage(run)
    assert ckpt._store().newest(5.0) == (None, None)  # nothing was seeded from a view it could not check
    stale.opens = False  # the entry's cache time ran out: the name opens
    lineage = ckpt.read_lineage(run)
    seed = c + 1
    assert lineage == {seed: None, c: None, a: 5}
    found = ckpt.load_latest(run, lineage=lineage)
    assert found is not None and found[0]["step"] == 5  # not A's stale step 10
    assert ckpt.superseded(run, a) and ckpt.superseded(run, c)  # every world of the old store is replaced
    d = ckpt.write_fence(run, (a, 5), 2, lineage)
    assert d == seed + 1 and not ckpt.superseded(run, d)
    assert ckpt.read_lineage(run) == {d: None, a: 5}


def test_a_store_outage_defers_commits_and_fences_until_it_answers(tmp_path, monkeypatch, restartable):
    use_store(monkeypatch, restartable.endpoint, read_timeout=0.3)
    monkeypatch.setattr(ckpt, "STORE_WAIT_S", 0.5)
    monkeypatch.setattr(ckpt, "FENCE_WAIT_S", 0.5)
    run = tmp_path / "run"
    a = ckpt.write_fence(run, None, 0)
    restartable.pause()  # a hung store: connections open, nothing answers
    try:
        assert ckpt.save_checkpoint(run, _state(5, a), keep=2) is None
        with pytest.raises(ckpt.CommitRefused):
            ckpt.commit_gate(run, a, "metrics")()
        assert ckpt._superseded_why(run, a) is not None
        assert ckpt.write_fence(run, None, 1) is None
        with pytest.raises(fence_store.StoreUnavailable):
            ckpt.read_lineage(run)
    finally:
        restartable.resume()
    restartable.kill()  # and a store that is gone (refused connections), then back with its data
    try:
        assert ckpt.save_checkpoint(run, _state(5, a), keep=2) is None
    finally:
        restartable.start()
    assert ckpt.save_checkpoint(run, _state(5, a), keep=2) is not None
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000005.pt"]


@pytest.mark.parametrize(("value", "names"), [
    ("{not json", "expected a JSON object"),
    ('{"run_id": "r"}', "endpoint: got None; expected 'host[:port]'"),
    ('{"endpoint": "h:1", "run_id": "a/b"}', "run_id: got 'a/b'"),
    ('{"endpoint": "h:1", "run_id": "r", "protocol": "ftp"}', "protocol: got 'ftp'"),
    ('{"endpoint": "h:1", "run_id": "r"}', "ca_cert/ssl_cert/ssl_cert_key: got [None, None, None]"),
])
def test_a_bad_store_setting_is_refused_naming_it(value, names):
    with pytest.raises(fence_store.FenceStoreConfigError, match=f"{fence_store.FENCE_STORE_ENV}.*") as e:
        fence_store.from_env({fence_store.FENCE_STORE_ENV: value})
    assert names in str(e.value)
    assert fence_store.from_env({}) is None  # not under the etcd launcher: the files alone


def test_an_endpoint_without_a_port_uses_etcds():
    for endpoint, want in (("store.ns.svc", ("store.ns.svc", 2379)), ("10.0.0.1:12379", ("10.0.0.1", 12379)),
                           ("[::1]:2380", ("::1", 2380))):
        conf = fence_store.config_for(endpoint, "r", {"protocol": "http"}, 600)
        store = fence_store.from_env({fence_store.FENCE_STORE_ENV: conf})
        assert store is not None and (store.host, store.port) == want


def test_a_run_directory_fenced_without_a_store_seeds_it_with_its_lineage(tmp_path, monkeypatch, etcd):
    # Fences written by the file-only design (records without a lineage): the first store seeds above them, the
    # chain of bases followed by opening each base's file by name.
    run = tmp_path / "run"
    monkeypatch.delenv(fence_store.FENCE_STORE_ENV, raising=False)
    assert ckpt.write_fence(run, (0, 40), 0) == 1
    assert ckpt.write_fence(run, (1, 55), 1) == 2
    assert "lineage" not in ckpt.read_fences(run)[2]
    use_store(monkeypatch, etcd)
    assert ckpt.read_lineage(run) == {3: None, 2: None, 1: 55, 0: 40}
    assert ckpt.superseded(run, 2)  # the world of fence 2 ran before the store held the fence: replaced
    assert ckpt.write_fence(run, (2, 60), 2) == 4
    assert ckpt.read_lineage(run) == {4: None, 2: 60, 1: 55, 0: 40}
