"""The rendezvous store at 128 and 1,000 nodes, without torch workers: the backend's own classes, many light agents.

    .venv/bin/python bench/store_sim.py [--nodes 16,128,1000] [--procs 4] [--window-s 20] [--out FILE]

Each simulated agent is the real thing minus its workers: the handler the launcher builds
(``--rdzv-backend=eks-etcd``, torch's registry with training/runtime/eks_ddp_runtime/rendezvous/handler.py's ``register``;
rdzv-conf ``CLUSTER_TIMEOUTS`` and the TLS client files, as ``training/runtime/eks_ddp_runtime/launch_command.py`` renders them), driven
the way torch's agent drives it (``torch.distributed.elastic.agent.server.api.SimpleElasticAgent``):

* a round: ``next_rendezvous()`` then torch's own ``SimpleElasticAgent._assign_worker_ranks`` on the store it returns
  (each agent ``set``s its role info, rank 0 ``multi_get``s them all and ``multi_set``s the assignments, each agent
  ``get``s its own), with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` as ``AGENT_ENV`` sets;
* while training: the handler's heartbeat thread (torch's ``_PeriodicTimer``, every ``keep_alive_interval``) and the
  monitor loop's ``num_nodes_waiting()`` every ``--monitor-interval`` 0.5 s; a non-zero answer restarts that agent
  into the next round (the agent's ``_restart_workers``);
* a lost node: its heartbeats stop (``_stop_heartbeats``) and it never calls again; the survivors' workers fail (their
  collective lost a peer), so each survivor starts the next round at once, as the agent does on a worker failure.

``--procs`` processes share the agents (threads; one store client per agent, as each agent has one). Figures:
``rendezvous_s`` (all N agents started at once -> the last one has its ranks), the store's load in steady training
from etcd's /metrics (bench/store.py: requests/s, writes/s, WAL bytes/s, database size), the client side's own count
of requests and bytes per call kind (each agent's EtcdV3Client, wrapped), and the re-form after 1 and after 10 % lost.
When this machine's CPUs cannot drive N agents in real time, heartbeats fall behind: ``heartbeat_lag`` reports the
heartbeats written per agent per second against the one the agents mean to write, and the load is then what the
store got, not what N real agents would send (docs: the model in bench/RESULTS.md "Store at 128 and 1,000 nodes").
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MONITOR_INTERVAL_S = 0.5
"""torchrun's ``--monitor-interval`` as the Job renders it (AgentOptions.monitor_interval)."""


# --------------------------------------------------------------------------------------------- the agents' side


class Counting:
    """Counts every request an EtcdV3Client sends, by path: calls, request and response bytes."""

    lock = threading.Lock()
    calls: collections.Counter = collections.Counter()
    sent: collections.Counter = collections.Counter()
    received: collections.Counter = collections.Counter()

    @classmethod
    def install(cls) -> None:
        from eks_ddp_runtime.rendezvous import etcd_client

        original = etcd_client.EtcdV3Client.call

        def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            out = original(self, path, body)
            size = len(json.dumps(body, separators=(",", ":")))
            back = len(json.dumps(out, separators=(",", ":")))
            kind = _kind(path, body)
            with cls.lock:
                cls.calls[kind] += 1
                cls.sent[kind] += size
                cls.received[kind] += back
            return out
        etcd_client.EtcdV3Client.call = call  # type: ignore[method-assign]

    @classmethod
    def snapshot(cls) -> dict[str, dict[str, int]]:
        with cls.lock:
            return {k: {"calls": cls.calls[k], "sent": cls.sent[k], "received": cls.received[k]} for k in cls.calls}


def _kind(path: str, body: dict[str, Any]) -> str:
    """A request's kind: ``kv/range``, ``kv/txn:put`` (a transaction that writes), ``kv/txn:read``, ``lease/...``."""
    if path == "kv/txn":
        ops = [*body.get("success", []), *body.get("failure", [])]
        writes = any("request_put" in o or "request_delete_range" in o for o in ops)
        return "kv/txn:write" if writes else "kv/txn:read"
    return path


class SimAgent:
    """One agent without workers: the real handler, rounds as torch's agent runs them."""

    def __init__(self, index: int, params_kw: dict[str, Any]) -> None:
        from torch.distributed.elastic.agent.server.api import WorkerSpec
        from torch.distributed.elastic.rendezvous import RendezvousParameters, registry

        self.index = index
        self.handler = registry.get_rendezvous_handler(RendezvousParameters(**params_kw))
        self.spec = WorkerSpec(role="default", local_world_size=1, rdzv_handler=self.handler, entrypoint="sim")
        self.alive, self.busy = True, False
        self.result: dict[str, Any] | None = None
        self.rounds = 0

    def round(self) -> dict[str, Any]:
        """``next_rendezvous`` + torch's rank assignment, as ``SimpleElasticAgent._rendezvous`` does."""
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

        self.busy = True
        t = time.time()
        try:
            info = self.handler.next_rendezvous()
            workers = SimpleElasticAgent._assign_worker_ranks(None, info.store, info.rank, info.world_size,  # type: ignore[arg-type]
                                                              self.spec)
            self.rounds += 1
            self.result = {"i": self.index, "ok": True, "start": t, "done": time.time(),
                           "round": self.handler._state_holder.state.round, "rank": info.rank,
                           "world": info.world_size, "global_rank": workers[0].global_rank}
        except Exception as e:  # noqa: BLE001 - reported, the master decides
            self.result = {"i": self.index, "ok": False, "start": t, "done": time.time(), "error": repr(e)[:300]}
        finally:
            self.busy = False
        return self.result

    def lose(self) -> None:
        """A node lost: nothing of it calls the store again, its lease renewals included, so its heartbeat key
        lapses one TTL later, as a dead node's does."""
        self.alive = False
        self.handler._stop_heartbeats()
        self.handler._state_holder._backend.stop_renewing()


def _delay_requests(path: Path) -> None:
    """Every store request of this process waits the seconds ``path`` holds (read at each call; 0 or unreadable: no
    wait) before it is sent, and still succeeds: a slow store, not a failed one."""
    from eks_ddp_runtime.rendezvous import etcd_client

    original = etcd_client.EtcdV3Client.call

    def call(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            seconds = float(path.read_text().strip() or 0)
        except (OSError, ValueError):
            seconds = 0.0
        if seconds > 0:
            time.sleep(seconds)
        return original(self, route, body)
    etcd_client.EtcdV3Client.call = call  # type: ignore[method-assign]


class Worker:
    """One process's share of the agents, commanded over stdin/stdout (one JSON object a line)."""

    def __init__(self, a: argparse.Namespace) -> None:
        os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        Counting.install()
        if a.latency_file:
            _delay_requests(Path(a.latency_file))
        from eks_ddp_runtime.rendezvous import handler
        from eks_ddp_runtime.rendezvous.etcd_backend import EtcdV3Backend

        if a.design == "core":  # the design before claims: every move a compare-and-set of the one state key
            EtcdV3Backend._claim_for = lambda self, new, core, known: None  # type: ignore[method-assign]
        if a.no_renewer:  # leases renewed only by torch's keep-alive op, between its reads (the design before)
            EtcdV3Backend.start_renewing = lambda self: None  # type: ignore[method-assign]

        handler.register()
        conf = dict(item.split("=", 1) for item in a.conf.split(",") if item)
        kw = {"backend": handler.BACKEND, "endpoint": a.endpoint, "run_id": a.run_id, "min_nodes": 1,
              "max_nodes": a.max_nodes, "local_addr": "127.0.0.1", **conf}
        self.agents = [SimAgent(i, kw) for i in range(a.first, a.first + a.count)]
        self.monitoring = False
        self.restarts = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._monitor, daemon=True).start()

    def _monitor(self) -> None:
        """Every agent's ``num_nodes_waiting()`` once per monitor interval, spread over it; a non-zero answer starts
        that agent's next round (the agent restarts its workers: a membership change)."""
        while True:
            if not self.monitoring:
                time.sleep(0.05)
                continue
            live = [g for g in self.agents if g.alive and not g.busy]
            step = MONITOR_INTERVAL_S / max(1, len(live))
            t0 = time.monotonic()
            for k, g in enumerate(live):
                time.sleep(max(0.0, t0 + k * step - time.monotonic()))
                if not self.monitoring or not g.alive or g.busy:
                    continue
                try:
                    waiting = g.handler.num_nodes_waiting()
                except Exception:  # noqa: BLE001 - the agent would exit; the sim counts it as a restart
                    waiting = 1
                if waiting > 0:
                    with self.lock:
                        self.restarts += 1
                    g.busy = True
                    threading.Thread(target=g.round, daemon=True).start()
            time.sleep(max(0.0, t0 + MONITOR_INTERVAL_S - time.monotonic()))

    def rounds(self, agents: list[SimAgent], timeout_s: float) -> list[dict[str, Any]]:
        for g in agents:
            g.busy, g.result = True, None
        threads = [threading.Thread(target=g.round, daemon=True) for g in agents]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [g.result or {"i": g.index, "ok": False, "error": "timeout"} for g in agents]

    def serve(self) -> None:
        print(json.dumps({"ready": len(self.agents)}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "join":  # every live agent starts a round now (the first, or after their workers failed)
                self.monitoring = False
                out: Any = self.rounds([g for g in self.agents if g.alive], cmd["timeout_s"])
            elif op == "monitor":
                self.monitoring = bool(cmd["on"])
                out = "ok"
            elif op == "lose":
                for g in self.agents:
                    if g.index in cmd["agents"]:
                        g.lose()
                out = "ok"
            elif op == "stats":
                out = {"requests": Counting.snapshot(), "restarts": self.restarts,
                       "live": sum(g.alive for g in self.agents), "cpu_s": sum(os.times()[:2]),
                       "rounds": [g.result for g in self.agents if g.alive and g.result]}
            elif op == "quit":
                print(json.dumps({"op": op, "out": "bye"}), flush=True)
                return
            else:
                out = f"unknown op {op}"
            print(json.dumps({"op": op, "out": out}), flush=True)


# --------------------------------------------------------------------------------------------- the master


class Sim:
    """``procs`` worker processes holding ``n`` agents of one run on one store."""

    def __init__(self, etcd: Any, n: int, procs: int, *, design: str = "claims", latency_file: Path | None = None,
                 per_proc: list[int] | None = None, renewer: bool = True) -> None:
        from eks_ddp_runtime.launch_command import RdzvTls, cluster_timeouts

        tls = RdzvTls.of(etcd.tls)
        conf = f"{cluster_timeouts(n).conf()},{tls.conf()}"  # the Job's timeouts for a run of n nodes
        run_id = f"sim-{uuid.uuid4().hex[:8]}"
        self.n = n
        sizes = per_proc or [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        self.procs: list[subprocess.Popen] = []
        first = 0
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        for size in sizes:
            if size == 0:
                continue
            self.procs.append(subprocess.Popen(
                [sys.executable, str(Path(__file__)), "--worker", f"--endpoint={etcd.endpoint}", f"--conf={conf}",
                 f"--run-id={run_id}", f"--max-nodes={n}", f"--first={first}", f"--count={size}", f"--design={design}",
                 f"--latency-file={latency_file or ''}", *([] if renewer else ["--no-renewer"])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True))
            first += size
        for p in self.procs:
            self._read(p)

    @staticmethod
    def _read(p: subprocess.Popen) -> Any:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"a sim process exited ({p.poll()})")
        return json.loads(line)

    def all(self, cmd: dict[str, Any]) -> list[Any]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps(cmd) + "\n")
            p.stdin.flush()
        return [self._read(p)["out"] for p in self.procs]

    def join(self, timeout_s: float) -> list[dict[str, Any]]:
        return [r for out in self.all({"op": "join", "timeout_s": timeout_s}) for r in out]

    def stats(self) -> dict[str, Any]:
        outs = self.all({"op": "stats"})
        req: dict[str, dict[str, int]] = {}
        for o in outs:
            for k, v in o["requests"].items():
                d = req.setdefault(k, {"calls": 0, "sent": 0, "received": 0})
                for f in d:
                    d[f] += v[f]
        return {"requests": req, "restarts": sum(o["restarts"] for o in outs), "live": sum(o["live"] for o in outs),
                "cpu_s": sum(o["cpu_s"] for o in outs), "rounds": [r for o in outs for r in o["rounds"]]}

    def close(self) -> None:
        for p in self.procs:
            try:
                assert p.stdin is not None
                p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                p.stdin.flush()
                p.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _formed(results: list[dict[str, Any]], world: int, since: float) -> dict[str, Any]:
    ok = [r for r in results if r.get("ok")]
    worlds = sorted({r["world"] for r in ok})
    rounds = sorted({r["round"] for r in ok})
    out: dict[str, Any] = {"ok": len(ok) == len(results) and worlds == [world] and len(rounds) == 1,
                           "worlds": worlds, "rounds": rounds, "failed": len(results) - len(ok)}
    if ok:
        out["s"] = round(max(r["done"] for r in ok) - since, 2)
    if len(ok) != len(results):
        out["errors"] = sorted({r.get("error", "") for r in results if not r.get("ok")})[:3]
    return out


def _delta(a: dict[str, Any], b: dict[str, Any], seconds: float, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in b["requests"].items():
        before = a["requests"].get(k, {"calls": 0, "sent": 0, "received": 0})
        calls = v["calls"] - before["calls"]
        if calls:
            out[k] = {"per_agent_per_s": round(calls / seconds / n, 3),
                      "bytes_sent_per_call": round((v["sent"] - before["sent"]) / calls),
                      "bytes_received_per_call": round((v["received"] - before["received"]) / calls)}
    return out


def _store_work(a: dict[str, float], b: dict[str, float]) -> dict[str, int]:
    """What the store did between two scrapes: raft proposals, WAL bytes, leases it expired."""
    return {"proposals": int(b["proposals_applied"] - a["proposals_applied"]),
            "wal_bytes": int(b["wal_write_bytes"] - a["wal_write_bytes"]),
            "leases_expired": int(b["lease_expired"] - a["lease_expired"])}


def one_size(n: int, procs: int, tmp: Path, window_s: float, timeout_s: float, design: str = "claims"
             ) -> dict[str, Any]:
    from store import RenderedEtcd, rates

    etcd = RenderedEtcd(tmp / "etcd")
    etcd.start()
    out: dict[str, Any] = {"nodes": n, "procs": min(procs, n), "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    sim = None
    try:
        sim = Sim(etcd, n, min(procs, n), design=design)
        t, before = time.time(), etcd.scrape()
        out["rendezvous"] = {**_formed(sim.join(timeout_s), n, t), **_store_work(before, etcd.scrape())}
        print(n, "rendezvous", json.dumps(out["rendezvous"]), flush=True)
        if not out["rendezvous"]["ok"]:
            return out
        sim.all({"op": "monitor", "on": True})
        time.sleep(3)
        a, sa, ta = etcd.scrape(), sim.stats(), time.time()
        time.sleep(window_s)
        b, sb, tb = etcd.scrape(), sim.stats(), time.time()
        r = rates(a, b, tb - ta)
        st = {"window_s": round(tb - ta, 1), "load_avg_1m": round(os.getloadavg()[0], 2),
              "requests_per_s": round(r["grpc_handled_per_s"], 1), "writes_per_s": round(r["proposals_applied_per_s"], 1),
              "writes_per_agent_per_s": round(r["proposals_applied_per_s"] / n, 3),
              "wal_bytes_per_s": round(r["wal_write_bytes_per_s"]),
              "wal_bytes_per_agent_per_s": round(r["wal_write_bytes_per_s"] / n),
              "received_bytes_per_s": round(r["received_bytes_per_s"]), "sent_bytes_per_s": round(r["sent_bytes_per_s"]),
              "db_size": int(r["db_size"]), "db_growth_bytes_per_s": round(r["db_size_growth_per_s"]),
              "etcd_cpu_per_s": round(r["cpu_seconds_per_s"], 3), "sim_cpu_per_s": round((sb["cpu_s"] - sa["cpu_s"]) / (tb - ta), 2),
              "restarts_in_window": sb["restarts"] - sa["restarts"],
              "client": _delta(sa, sb, tb - ta, n)}
        writes = st["client"].get("kv/txn:write", {}).get("per_agent_per_s", 0.0)
        st["heartbeat_lag"] = {"writes_per_agent_per_s": writes, "meant": 1.0}
        out["steady"] = st
        print(n, "steady", json.dumps(st), flush=True)
        for label, k in (("lose_1", 1), ("lose_10pct", max(1, math.ceil(0.1 * n)))):
            live = sb["live"]
            if live - k < 1:
                break
            victims = list(range(n - (n - live) - k, n - (n - live)))  # the last live agents
            before = etcd.scrape()
            sim.all({"op": "lose", "agents": victims})
            t = time.time()
            out[label] = {"from": live, "lost": k, **_formed(sim.join(timeout_s), live - k, t),
                          **_store_work(before, etcd.scrape())}
            print(n, label, json.dumps(out[label]), flush=True)
            if not out[label]["ok"]:
                break
            sim.all({"op": "monitor", "on": True})
            time.sleep(2)
            sb = sim.stats()
        m = etcd.scrape()
        out["end"] = {"db_size": int(m["db_size"]), "revision": int(m["revision"]), "alarms": etcd.alarms()}
        return out
    finally:
        if sim is not None:
            sim.close()
        etcd.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--endpoint")
    p.add_argument("--conf", default="")
    p.add_argument("--run-id")
    p.add_argument("--max-nodes", type=int)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--nodes", default="16,128,1000")
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--label", default="current")
    p.add_argument("--design", choices=("claims", "core"), default="claims",
                   help="core: every rendezvous move a compare-and-set of the one state key (the design before claims)")
    p.add_argument("--latency-file", default="", help=argparse.SUPPRESS)
    p.add_argument("--no-renewer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(HERE / "store_sim.json"))
    a = p.parse_args()
    if a.worker:
        sys.path.insert(0, str(HERE.parent))
        Worker(a).serve()
        return 0
    from common import ROOT, machine

    os.chdir(ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    res: dict[str, Any] = {"label": a.label, "design": a.design, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(),
                           "sizes": []}
    for n in [int(x) for x in a.nodes.split(",") if x]:
        res["sizes"].append(one_size(n, a.procs, tmp / f"n{n}", a.window_s, a.timeout_s, a.design))
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
