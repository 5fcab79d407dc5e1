"""The store soak: 4 real agents with the Job's command on a store with the rendered flags and the quota and the
compaction period scaled down 256x (hours of a run in minutes), then a lost node and its replacement.

    .venv/bin/python bench/store_soak.py [--agents 4] [--soak-s 200] [--scale 256] [--out FILE]

The store runs etcd with the flags components/eks_ddp/workloads/etcd.py renders for a fleet of ``--agents``
(``--quota-backend-bytes``, ``--auto-compaction-mode/retention``, ``--snapshot-count``), with the quota and the
retention divided by ``--scale`` (eks_ddp.core.rendezvous_store ``StoreSize.scaled``). Every 10 s it samples etcd's
database size, revision and alarms. After the soak one agent's node is killed (agent and workers) and a replacement
agent started; figure: seconds from the kill to the first step of a world of ``--agents`` again
(``--no-replacement``: of the survivors, ``--agents`` - 1; ``--spread-s``: with three survivors reaching the
rendezvous up to that many seconds late). Pass: no alarm, and the world back. Prints a table and writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, synthetic

from eks_ddp.core.rendezvous_store import store_size
from eks_ddp.workloads.etcd import etcd_args
from eks_ddp_runtime.launch_command import AGENT_ENV, DEFAULT_MAX_RESTARTS, cluster_timeouts
from eks_ddp_runtime.rendezvous.etcd_client import EtcdV3Client
from eks_ddp_trainer.config import TrainerConfig
from tests.support.etcd_server import Job, RestartableEtcd

STORE_FLAGS = ("--quota-backend-bytes=", "--auto-compaction-mode=", "--auto-compaction-retention=",
               "--snapshot-count=")


def _status(client: EtcdV3Client) -> dict:
    status = client.call("maintenance/status", {})
    alarms = client.call("maintenance/alarm", {"action": "GET"}).get("alarms") or []
    return {"db_bytes": int(status.get("dbSize", 0)), "db_in_use": int(status.get("dbSizeInUse", 0)),
            "revision": int(status["header"]["revision"]), "alarms": [a.get("alarm", "?") for a in alarms]}


def _spread(job: Job, spread_s: float, late: int = 3) -> None:
    """Hold ``late`` surviving agents (the agent process, SIGSTOP) for spread_s/late, 2 spread_s/late, ... spread_s:
    agents that handle the loss and reach the rendezvous seconds apart (slow nodes)."""
    import os
    import signal
    import threading

    held = [a.pid for a in job.agents[:late]]
    for pid in held:
        os.kill(pid, signal.SIGSTOP)

    def release() -> None:
        for pid in held:
            time.sleep(spread_s / late)
            os.kill(pid, signal.SIGCONT)
    threading.Thread(target=release, daemon=True).start()


def soak(tmp: Path, agents: int, soak_s: float, scale: int, replace: bool = True, spread_s: float = 0.0) -> dict:
    size = store_size(agents).scaled(scale)
    flags = [a for a in etcd_args("soak", "bench", size) if a.startswith(STORE_FLAGS)]
    etcd = RestartableEtcd(tmp / "etcd", flags=flags)
    etcd.start()
    host, port = str(etcd.endpoint).split(":")
    client = EtcdV3Client(host, int(port), read_timeout=5, context=etcd.tls.client_context())
    data = synthetic(tmp / "data", n_train=2000)
    trainer = TrainerConfig(data_dir=str(data), run_dir=str(tmp / "run"), epochs=100000, global_batch_size=16,
                            bn_group=8, min_steps=0, width=8, checkpoint_every=50, log_every=1, keep_checkpoints=2)
    job = Job(tmp / "job", etcd.endpoint, trainer, nodes=agents, min_nodes=1, max_nodes=agents,
              env=dict(AGENT_ENV), timeouts=cluster_timeouts(agents), max_restarts=DEFAULT_MAX_RESTARTS)
    samples: list[dict] = []
    try:
        job.wait_for(lambda: [r for r in job.history() if r.get("kind") == "step" and r.get("world") == agents],
                     300, f"a world of {agents}")
        start = time.monotonic()
        while time.monotonic() - start < soak_s:
            samples.append({"t": round(time.monotonic() - start, 1), **_status(client)})
            time.sleep(10)
        samples.append({"t": round(time.monotonic() - start, 1), **_status(client)})
        steps_before = len([r for r in job.history() if r.get("kind") == "step"])
        killed = time.monotonic()
        seen = len(job.history())
        job.agents[-1].kill_node()
        if spread_s:
            _spread(job, spread_s)
        world = agents
        if replace:
            job.add_agent()
        else:
            world = agents - 1
        job.wait_for(lambda: [r for r in job.history()[seen:] if r.get("kind") == "step" and r.get("world") == world],
                     180, f"a world of {world} after the loss")
        replaced_s = time.monotonic() - killed
        after = _status(client)
    finally:
        job.close()
        etcd.kill()
    return {"machine": machine(), "agents": agents, "soak_s": soak_s, "scale": scale, "flags": flags,
            "replaced_by_world": world, "spread_s": spread_s,
            "samples": samples, "steps_during_soak": steps_before, "replaced_s": round(replaced_s, 2),
            "after": after, "alarm": any(s["alarms"] for s in [*samples, after]),
            "store_revisions_per_s": round((samples[-1]["revision"] - samples[0]["revision"]) / max(1.0, soak_s), 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--soak-s", type=float, default=200.0)
    p.add_argument("--scale", type=int, default=256)
    p.add_argument("--no-replacement", action="store_true",
                   help="after the loss, wait for a world of agents-1 (the survivors) instead of a replacement")
    p.add_argument("--spread-s", type=float, default=0.0,
                   help="after the loss, hold 3 survivors' agents for spread/3, 2 spread/3 and spread seconds")
    p.add_argument("--out", default=str(ROOT / "bench" / "store_soak.json"))
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="store-soak-") as tmp:
        res = soak(Path(tmp), a.agents, a.soak_s, a.scale, replace=not a.no_replacement,
                   spread_s=a.spread_s)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"flags: {' '.join(res['flags'])}")
    print("| t (s) | db bytes | in use | revision | alarms |\n|---|---|---|---|---|")
    for s in res["samples"]:
        print(f"| {s['t']} | {s['db_bytes']} | {s['db_in_use']} | {s['revision']} | {','.join(s['alarms']) or '-'} |")
    print(f"steps during the soak: {res['steps_during_soak']}; store revisions/s: {res['store_revisions_per_s']}; "
          f"alarm: {res['alarm']}; lost node: a world of {res['replaced_by_world']} in {res['replaced_s']} s")
    return 1 if res["alarm"] else 0


if __name__ == "__main__":
    sys.exit(main())
