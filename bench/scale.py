"""The rendezvous at N nodes: N real agents with the training Job's own command against one store with its rendered
flags, on this machine.

    .venv/bin/python bench/scale.py [--nodes 4,8,12,16] [--soak-s 200] [--label before] [--out FILE]

Each agent runs ``python -m eks_ddp_runtime.launch <flags> training/examples/ddp_minimal.py`` with the flags
``training/runtime/eks_ddp_runtime/launch_command.py`` renders into the EKS Job (``script_command`` with ``cluster_timeouts(N)``,
``DEFAULT_MAX_RESTARTS``, ``minNodes`` 1 (the stack's default) and the agent environment ``AGENT_ENV``), one gloo
worker each (a user's own script: a tiny model, a step every 0.5 s, no checkpoint during the bench). The store is
etcd 3.5 started with ``etcd_args`` as rendered for the store's pod (bench/store.py; TLS with client certificates).

For each N, in order:

* ``first_world_s``: seconds from starting the N agents (all at once) to the first worker start in a world of N
  (rank 0's ``start`` record; includes importing torch in N agents and N workers on this machine's cores);
* ``steady``: store load over ``--window-s`` seconds of training at full size: requests/s (gRPC calls handled,
  which the JSON gateway's requests become), proposals applied/s (every write), per-agent writes/s, WAL bytes
  written/s (``etcd_disk_wal_write_bytes_total``), database size and its growth/s;
* ``lose_1``: one node SIGKILLed (agent and worker) -> seconds to the first start of a world of N-1, and the worlds
  that started on the way (``worlds``: a clean re-form is ``[N-1]``); then a replacement node starts -> seconds to
  a world of N again (``rejoin``);
* ``lose_10pct``: ceil(10 % of N) nodes SIGKILLed at once -> world N-k; replacements -> N again;
* ``lose_1_spread``: one node SIGKILLed while the survivors' agents are held (SIGSTOP) for a spread of delays,
  survivor i for ``spread_s * (i % 4) / 3`` s (0, 1, 2, 3 s with the default 3 s): stragglers that reach the
  rendezvous seconds apart, as pods on a loaded fleet do -> seconds to a world of N-1 and the worlds on the way.

Then the soak (``--soak-s``, 0 to skip): the rendered flags with the quota scaled down 256x, 4 agents for that long;
the store's alarms every 5 s, its database size, and at the end one node lost and a replacement started: pass if no
alarm was raised and the job is back at 4.

Figures are wall-clock on a shared machine: the 1-minute load average is recorded with each. Prints JSON lines
and writes ``--out`` (default: scale.json beside this file; bench/RESULTS.md "Scale" holds the tables).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import ROOT, machine
from store import RenderedEtcd, rates

from eks_ddp_runtime.launch_command import (
    AGENT_ENV,
    DEFAULT_MAX_RESTARTS,
    AgentOptions,
    cluster_timeouts,
    script_command,
)
from tests.support.etcd_server import Agent, client_tls, trainer_env

SCRIPT = ROOT / "training" / "examples" / "ddp_minimal.py"
SOAK_QUOTA_DIV = 256


def load() -> float:
    return round(os.getloadavg()[0], 2)


class Fleet:
    """N agents of one job on one store; ``close()`` kills every agent and worker it started."""

    def __init__(self, tmp: Path, etcd: RenderedEtcd, nodes: int, step_time: float = 0.5) -> None:
        self.tmp, self.etcd = tmp, etcd
        self.run_dir = tmp / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        agent = AgentOptions(min_nodes=1, max_nodes=nodes, nproc_per_node=1, rdzv_backend="etcd",
                             rdzv_endpoint=etcd.endpoint, rdzv_id=f"scale-{uuid.uuid4().hex[:8]}",
                             max_restarts=DEFAULT_MAX_RESTARTS, local_addr="127.0.0.1", timeouts=cluster_timeouts(nodes),
                             tls=client_tls(etcd.endpoint))
        self.cmd = script_command(agent, str(SCRIPT), ["--steps=1000000", f"--step-time={step_time}",
                                                       "--checkpoint-every=1000000"], python=sys.executable)
        self.env = trainer_env({**AGENT_ENV, "EKS_DDP_RUN_DIR": str(self.run_dir)})
        self.agents: list[Agent] = []
        self._offset, self._records = 0, []  # type: ignore[var-annotated]
        for _ in range(nodes):
            self.add()

    def add(self) -> Agent:
        i = len(self.agents)
        a = Agent(f"agent{i}", self.cmd, self.tmp / f"agent{i}.log", self.env)
        self.agents.append(a)
        return a

    def live(self) -> list[Agent]:
        return [a for a in self.agents if a.proc.poll() is None]

    def starts(self) -> list[dict[str, Any]]:
        path = self.run_dir / "history.jsonl"
        if path.exists():
            with path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]
            self._offset += len(complete)
            for line in complete.splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("kind") == "start":
                    self._records.append(r)
        return list(self._records)

    def wait_world(self, world: int, since: float, timeout_s: float) -> dict[str, Any]:
        """Seconds from ``since`` to the first worker start of a world of ``world``, and the worlds started on the
        way; ``ok`` False after ``timeout_s`` or when every agent exited."""
        deadline = time.time() + timeout_s
        while time.time() < deadline and self.live():
            worlds = [r for r in self.starts() if r["time"] > since]
            hit = next((r for r in worlds if r["world"] == world), None)
            if hit is not None:
                return {"ok": True, "s": round(hit["time"] - since, 2),
                        "worlds": [r["world"] for r in worlds if r["time"] <= hit["time"]]}
            time.sleep(0.1)
        worlds = [r["world"] for r in self.starts() if r["time"] > since]
        return {"ok": False, "s": None, "worlds": worlds[-30:], "agents_alive": len(self.live())}

    def settle(self, quiet_s: float = 5.0, timeout_s: float = 60.0) -> int:
        """Wait until no worker started for ``quiet_s`` (a round that keeps restarting shows as extra starts)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            s = self.starts()
            if s and time.time() - s[-1]["time"] >= quiet_s:
                return s[-1]["world"]
            time.sleep(0.2)
        return self.starts()[-1]["world"] if self.starts() else 0

    def close(self) -> None:
        for a in self.agents:
            a.stop()


def _lose(fleet: Fleet, k: int, *, spread_s: float = 0.0, timeout_s: float) -> dict[str, Any]:
    live = fleet.live()
    n = len(live)
    victims, survivors = live[-k:], live[:-k]
    out: dict[str, Any] = {"from": n, "lost": k, "load_avg_1m": load()}
    t = time.time()
    if spread_s:
        delays = [spread_s * (i % 4) / 3 for i in range(len(survivors))]
        for a, d in zip(survivors, delays, strict=True):
            if d:
                a.kill_group(signal.SIGSTOP)
        out["delays_s"] = sorted(set(round(d, 2) for d in delays))
    for v in victims:
        v.kill_node()
    if spread_s:
        start = time.monotonic()
        for a, d in sorted(zip(survivors, delays, strict=True), key=lambda p: p[1]):
            if d:
                time.sleep(max(0.0, start + d - time.monotonic()))
                a.kill_group(signal.SIGCONT)
    out.update(fleet.wait_world(n - k, t, timeout_s))
    out["settled_world"] = fleet.settle()
    return out


def _rejoin(fleet: Fleet, k: int, timeout_s: float) -> dict[str, Any]:
    n = len(fleet.live())
    t = time.time()
    for _ in range(k):
        fleet.add()
    out = {"from": n, "added": k, "load_avg_1m": load(), **fleet.wait_world(n + k, t, timeout_s)}
    out["settled_world"] = fleet.settle()
    return out


def steady(fleet: Fleet, etcd: RenderedEtcd, window_s: float) -> dict[str, Any]:
    n = len(fleet.live())
    a, ta, wal_a = etcd.scrape(), time.time(), etcd.wal_bytes_on_disk()
    time.sleep(window_s)
    b, tb, wal_b = etcd.scrape(), time.time(), etcd.wal_bytes_on_disk()
    r = rates(a, b, tb - ta)
    restarts = [s for s in fleet.starts() if ta < s["time"] <= tb]
    return {"nodes": n, "window_s": round(tb - ta, 1), "load_avg_1m": load(),
            "requests_per_s": round(r["grpc_handled_per_s"], 1),
            "writes_per_s": round(r["proposals_applied_per_s"], 1),
            "writes_per_agent_per_s": round(r["proposals_applied_per_s"] / n, 2),
            "wal_bytes_per_s": round(r["wal_write_bytes_per_s"]),
            "wal_bytes_per_agent_per_s": round(r["wal_write_bytes_per_s"] / n),
            "received_bytes_per_s": round(r["received_bytes_per_s"]), "sent_bytes_per_s": round(r["sent_bytes_per_s"]),
            "db_size": int(r["db_size"]), "db_growth_bytes_per_s": round(r["db_size_growth_per_s"]),
            "db_in_use": int(r["db_in_use"]), "revisions_per_s": round(r["revision_growth_per_s"], 1),
            "keys": int(r["keys"]), "etcd_cpu_per_s": round(r["cpu_seconds_per_s"], 3),
            "wal_dir_bytes_growth_per_s": round((wal_b - wal_a) / (tb - ta)),
            "restarts_in_window": len(restarts)}


def one_size(n: int, tmp: Path, window_s: float, spread_s: float, timeout_s: float) -> dict[str, Any]:
    etcd = RenderedEtcd(tmp / "etcd")
    etcd.start()
    fleet = None
    out: dict[str, Any] = {"nodes": n, "load_avg_1m_at_start": load()}
    try:
        t = time.time()
        fleet = Fleet(tmp, etcd, n)
        out["first_world"] = fleet.wait_world(n, t, max(timeout_s, 60 + 15 * n))
        print(n, "first_world", json.dumps(out["first_world"]), flush=True)
        if not out["first_world"]["ok"]:
            return out
        fleet.settle()
        out["steady"] = steady(fleet, etcd, window_s)
        print(n, "steady", json.dumps(out["steady"]), flush=True)
        out["lose_1"] = _lose(fleet, 1, timeout_s=timeout_s)
        print(n, "lose_1", json.dumps(out["lose_1"]), flush=True)
        out["rejoin_1"] = _rejoin(fleet, 1, timeout_s)
        print(n, "rejoin_1", json.dumps(out["rejoin_1"]), flush=True)
        k = max(1, math.ceil(0.1 * n))
        out["lose_10pct"] = _lose(fleet, k, timeout_s=timeout_s)
        print(n, "lose_10pct", json.dumps(out["lose_10pct"]), flush=True)
        out["rejoin_10pct"] = _rejoin(fleet, k, timeout_s)
        print(n, "rejoin_10pct", json.dumps(out["rejoin_10pct"]), flush=True)
        out["lose_1_spread"] = _lose(fleet, 1, spread_s=spread_s, timeout_s=timeout_s)
        print(n, "lose_1_spread", json.dumps(out["lose_1_spread"]), flush=True)
        m = etcd.scrape()
        out["end"] = {"db_size": int(m["db_size"]), "revision": int(m["revision"]),
                      "compact_revision": int(m["compact_revision"]), "alarms": etcd.alarms()}
        return out
    finally:
        if fleet is not None:
            fleet.close()
        etcd.stop()


def soak(tmp: Path, seconds: float, nodes: int = 4, timeout_s: float = 120.0) -> dict[str, Any]:
    etcd = RenderedEtcd(tmp / "etcd", quota_div=SOAK_QUOTA_DIV)
    etcd.start()
    fleet = None
    out: dict[str, Any] = {"nodes": nodes, "quota_bytes": etcd.quota_bytes, "seconds": seconds,
                           "load_avg_1m_at_start": load()}
    try:
        t = time.time()
        fleet = Fleet(tmp, etcd, nodes)
        out["first_world"] = fleet.wait_world(nodes, t, timeout_s)
        if not out["first_world"]["ok"]:
            return out
        t0 = time.time()
        samples, alarm_at = [], None
        while time.time() - t0 < seconds:
            time.sleep(5)
            m = etcd.scrape()
            alarms = etcd.alarms()
            samples.append({"t": round(time.time() - t0), "db_size": int(m["db_size"]), "db_in_use": int(m["db_in_use"]),
                            "revision": int(m["revision"]), "alarms": alarms})
            if alarms and alarm_at is None:
                alarm_at = round(time.time() - t0, 1)
        out["samples"] = samples[::3] + ([samples[-1]] if samples and len(samples) % 3 != 1 else [])
        out["alarm_at_s"] = alarm_at
        out["alarms"] = etcd.alarms()
        out["db_size_end"] = samples[-1]["db_size"] if samples else None
        out["lose_1"] = _lose(fleet, 1, timeout_s=timeout_s)
        out["rejoin_1"] = _rejoin(fleet, 1, timeout_s)
        out["agents_alive"] = len(fleet.live())
        out["ok"] = bool(alarm_at is None and out["rejoin_1"]["ok"] and out["agents_alive"] == nodes)
        if not out["ok"]:
            logs = [a.log()[-600:] for a in fleet.agents[:2]]
            out["log_tail"] = logs
        return out
    finally:
        if fleet is not None:
            fleet.close()
        etcd.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", default="4,8,12,16")
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--spread-s", type=float, default=3.0)
    p.add_argument("--timeout-s", type=float, default=120.0, help="longest wait for one world")
    p.add_argument("--soak-s", type=float, default=200.0)
    p.add_argument("--label", default="current")
    p.add_argument("--out", default=str(Path(__file__).with_name("scale.json")))
    a = p.parse_args()
    os.chdir(ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    res: dict[str, Any] = {"label": a.label, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(),
                           "rdzv_conf": {n: cluster_timeouts(int(n)).conf() for n in a.nodes.split(",") if n}, "store_flags": RenderedEtcd(tmp / "flags").flags,
                           "sizes": []}
    for n in [int(x) for x in a.nodes.split(",") if x]:
        res["sizes"].append(one_size(n, tmp / f"n{n}", a.window_s, a.spread_s, a.timeout_s))
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    if a.soak_s > 0:
        res["soak"] = soak(tmp / "soak", a.soak_s)
        print("soak", json.dumps({k: v for k, v in res["soak"].items() if k != "samples"}), flush=True)
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(table(res))
    return 0


def table(res: dict[str, Any]) -> str:
    def s(d: dict | None) -> str:
        if not d:
            return "not run"
        if not d["ok"]:
            return f"NOT within the wait (worlds {d['worlds'][-8:]})"
        w = d["worlds"]
        return f"{d['s']} s" + ("" if len(w) == 1 else f" (worlds {w})")

    rows = ["| N | first world | req/s | writes/s | writes/agent/s | WAL B/s | WAL B/agent/s | db bytes (+/s) | "
            "lose 1 | lose 10 % | lose 1, spread | loads |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["sizes"]:
        st = r.get("steady") or {}
        loads = [r.get(k, {}).get("load_avg_1m") for k in ("lose_1", "lose_10pct", "lose_1_spread")]
        rows.append(f"| {r['nodes']} | {s(r.get('first_world'))} | {st.get('requests_per_s')} | {st.get('writes_per_s')}"
                    f" | {st.get('writes_per_agent_per_s')} | {st.get('wal_bytes_per_s')} | "
                    f"{st.get('wal_bytes_per_agent_per_s')} | {st.get('db_size')} (+{st.get('db_growth_bytes_per_s')})"
                    f" | {s(r.get('lose_1'))} | {s(r.get('lose_10pct'))} | {s(r.get('lose_1_spread'))} | "
                    f"{st.get('load_avg_1m')}/{'/'.join(map(str, loads))} |")
    if "soak" in res:
        sk = res["soak"]
        rows.append(f"\nsoak: {sk['nodes']} agents, quota {sk['quota_bytes']} B, {sk['seconds']} s: alarm at "
                    f"{sk.get('alarm_at_s')} s, db end {sk.get('db_size_end')} B, replacement "
                    f"{s(sk.get('rejoin_1'))}, ok {sk.get('ok')}")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
