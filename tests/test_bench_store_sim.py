"""bench/store_sim.py, the store at 128 and 1,000 nodes, runs at 2 agents: its agents are the launcher's own handler with
the Job's rdzv-conf, and its figures come out of a real store."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from eks_ddp_local.etcd_server import make_tls
from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, RdzvTls

ROOT = Path(__file__).resolve().parents[1]


def _sim():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("store_sim", ROOT / "bench" / "store_sim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sim_agents_are_the_launchers_handler_with_the_jobs_conf(tmp_path: Path) -> None:
    from eks_ddp_runtime.rendezvous import handler

    sim = _sim()
    handler.register()
    tls = RdzvTls.of(make_tls(tmp_path / "tls"))
    conf = dict(item.split("=", 1) for item in f"{CLUSTER_TIMEOUTS.conf()},{tls.conf()}".split(","))
    agent = sim.SimAgent(0, {"backend": handler.BACKEND, "endpoint": "127.0.0.1:1", "run_id": "pin", "min_nodes": 1,
                             "max_nodes": 2, "local_addr": "127.0.0.1", **conf})  # contacts nobody (K3)
    assert type(agent.handler) is handler.ElasticHandler
    s = agent.handler._settings
    assert s.keep_alive_interval.total_seconds() == CLUSTER_TIMEOUTS.keep_alive_interval
    assert s.keep_alive_max_attempt == CLUSTER_TIMEOUTS.keep_alive_max_attempt
    assert s.timeout.last_call.total_seconds() == CLUSTER_TIMEOUTS.last_call
    assert agent.handler.retry.timeout_s == CLUSTER_TIMEOUTS.store_retry
    assert agent.handler.first_round_s == CLUSTER_TIMEOUTS.first_round
    assert sim.MONITOR_INTERVAL_S == 0.5  # AgentOptions.monitor_interval, what the Job renders


@pytest.mark.long  # ~45 s on 2 loaded cores: make test-long
def test_sim_runs_two_agents_on_a_real_store(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "store_sim.py"), "--nodes=2", "--procs=1",
                           "--window-s=2", "--timeout-s=60", f"--out={out}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())["sizes"][0]
    assert r["rendezvous"]["ok"] and r["rendezvous"]["worlds"] == [2], r
    st = r["steady"]
    assert st["requests_per_s"] > 0 and st["db_size"] > 0 and st["writes_per_s"] >= 0, st
    assert st["client"] and all(v["per_agent_per_s"] > 0 for v in st["client"].values()), st["client"]
    assert r["lose_1"]["ok"] and r["lose_1"]["worlds"] == [1], r["lose_1"]
    assert r["end"]["alarms"] == [], r["end"]
