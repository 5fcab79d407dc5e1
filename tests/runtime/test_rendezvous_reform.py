"""A re-form at fleet size costs the store O(N): one lost agent among N simulated agents (the launcher's own handler
with the Job's rdzv-conf for N nodes, bench/store_sim.py's agents) on a real etcd with the store's rendered flags;
the store's own counters (/metrics: raft proposals applied, WAL bytes, leases expired) from the loss to the next
world. The larger sizes and their timings are bench/store_sim.py's (bench/RESULTS.md)."""

from __future__ import annotations

import importlib.util
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str) -> Any:
    """bench/<name>.py, as a module of its own name (another ``store`` may be imported already)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    key = f"eks_ddp_bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
    return mod


def _reform(tmp: Path, n: int, design: str) -> dict[str, Any]:
    """N agents form a world; the last one is lost (no call to the store again, its lease lapses); the survivors
    start their next round at once, as the agent does when its workers fail. The store's work from the loss until
    every survivor has its rank in a world of N - 1."""
    sim_mod, store = _bench("store_sim"), _bench("store")
    etcd = store.RenderedEtcd(tmp / f"etcd-{design}-{n}")
    etcd.start()
    try:
        sim = sim_mod.Sim(etcd, n, 1, design=design)
        try:
            formed = sim.join(90)
            assert all(r["ok"] and r["world"] == n for r in formed), formed
            before = etcd.scrape()
            sim.all({"op": "lose", "agents": [n - 1]})
            again = sim.join(120)
            work = sim_mod._store_work(before, etcd.scrape())
            assert all(r["ok"] and r["world"] == n - 1 for r in again), (design, n, again)
            return work
        finally:
            sim.close()
    finally:
        etcd.stop()


def test_one_lost_agents_reform_costs_the_store_linear_work_in_n(tmp_path: Path) -> None:
    """Before, every agent's join, leave and wait was a compare-and-set of the one state key that every other agent's
    write made fail: ~N^2 proposals per re-form (74, 232, 1,005, 5,498 at N = 8-64, the review of 2026-12-07). Now
    each is a claim on the agent's own key and one write closes the round (rendezvous/claims.py). Negative control:
    the design before (bench/store_sim.py --design=core) on the same store grows faster than linearly."""
    configs = [(8, "claims"), (16, "claims"), (32, "claims"), (8, "core"), (16, "core")]
    _bench("store_sim"), _bench("store")  # imported once, before the threads share them
    with ThreadPoolExecutor(len(configs)) as pool:  # each on its own store; the counts do not depend on timing
        results = dict(zip(configs, pool.map(lambda c: _reform(tmp_path, *c), configs), strict=True))
    claims = {n: results[(n, "claims")] for n in (8, 16, 32)}
    core = {n: results[(n, "core")] for n in (8, 16)}
    for n, work in claims.items():
        assert work["proposals"] <= 7 * n, (n, work)  # ~5 per agent: leave, wait, join, the c10d store's keys
        assert work["leases_expired"] <= 2, (n, work)  # the lost agent's (heartbeat); nobody else's lapsed
    for small, large in ((8, 16), (16, 32)):  # twice the agents, at most about twice the work
        assert claims[large]["proposals"] <= 2.4 * claims[small]["proposals"], claims
        assert claims[large]["wal_bytes"] <= 2.6 * claims[small]["wal_bytes"], claims
    # The negative control: every write carrying the whole state (its size grows with N) and lost writes repeated.
    assert core[16]["wal_bytes"] > 3.2 * core[8]["wal_bytes"], core
    assert core[16]["wal_bytes"] > 3 * claims[16]["wal_bytes"], (core, claims)


def _slow_store(tmp: Path, latencies: tuple[float, ...], renewer: bool = True) -> list[dict[str, Any]]:
    """4 agents in 4 processes form a world and train (monitor loop on); then every store request of every agent is
    answered ``latency`` seconds late (and still succeeds) for 25 s, each latency in turn: per latency, the leases
    etcd expired, the agents that left their world (a worker restart) and the worlds afterwards."""
    sim_mod, store = _bench("store_sim"), _bench("store")
    etcd = store.RenderedEtcd(tmp / f"etcd-slow-{renewer}")
    etcd.start()
    delay = tmp / f"latency-{renewer}"
    delay.write_text("0")
    out = []
    try:
        sim = sim_mod.Sim(etcd, 4, 4, latency_file=delay, renewer=renewer)
        try:
            assert all(r["ok"] and r["world"] == 4 for r in sim.join(60))
            sim.all({"op": "monitor", "on": True})
            for latency in latencies:
                before, stats = etcd.scrape(), sim.stats()
                delay.write_text(str(latency))
                time.sleep(25)
                delay.write_text("0")
                time.sleep(3)
                after = sim.stats()
                out.append({"latency_s": latency, "leases_expired": sim_mod._store_work(before, etcd.scrape())[
                    "leases_expired"], "restarts": after["restarts"] - stats["restarts"],
                    "worlds": sorted({(r["round"], r["world"]) for r in after["rounds"]})})
            return out
        finally:
            sim.close()
    finally:
        etcd.stop()


@pytest.mark.long  # 2 x 25 s of a slow store, and the control: make test-long
def test_a_store_answering_late_for_25_s_drops_no_one(tmp_path: Path) -> None:
    """Every store request of every agent answered 1.2 s, then 3 s late for 25 s (an fsync stall, a throttled store
    pod): no lease expires, no agent leaves its world, no worker restarts (each agent renews its own lease from a
    timer of its own, renewals overlapping; rendezvous/etcd_backend.py _Renewer). Negative control: leases renewed
    only by torch's keep-alive op between its reads (the design before) lapse at 1.2 s, and agents leave."""
    for r in _slow_store(tmp_path, (1.2, 3.0)):
        assert (r["leases_expired"], r["restarts"], r["worlds"]) == (0, 0, [(0, 4)]), r
    control = _slow_store(tmp_path, (1.2,), renewer=False)[0]
    assert control["leases_expired"] > 0 and control["restarts"] > 0, control
