"""Recovery time of the elastic job: real etcd, two real torchrun agents (gloo, CPU), tiny model.

    .venv/bin/python bench/recovery.py [--repeats 3] [--out bench/recovery.json]

Two scenarios, each repeated: SIGKILL of one trainer process (its agent restarts the group),
and loss of a whole agent with its worker (the other continues at world size 1). Measured
from the kill to the next ``[train] start ... resumed_step>0`` record and to the next step
record, both from history.jsonl. Same launch path as tests/test_trainer_elastic.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, synthetic

from components.torchrun import TrainerOptions  # importable because common put the repo on sys.path
from tests.etcd_server import Job
from training import checkpoint as ckpt
from training.etcd_local import start_etcd


def scenario(kind: str, endpoint: str, data: Path, tmp: Path) -> dict:
    trainer = TrainerOptions(data_dir=str(data), run_dir=str(tmp / "run"), epochs=8, batch_size=16, width=8,
                             checkpoint_every=5, log_every=2, keep_checkpoints=3)
    job = Job(tmp, endpoint, trainer)
    try:
        job.wait_for(lambda: [r for r in job.history() if r.get("kind") == "step" and r["world"] == 2
                              and r["step"] >= 10], 120, "world-2 training")
        job.wait_for(lambda: ckpt.list_checkpoints(job.run_dir), 30, "a checkpoint")
        killed = time.time()
        if kind == "worker_sigkill":
            os.kill(job.agents[1].workers()[0], signal.SIGKILL)
        else:
            job.agents[1].kill_node()
        start = job.wait_for(lambda: [r for r in job.history() if r.get("kind") == "start" and r["time"] > killed
                                      and r["resumed_step"] > 0], 120, "resumed start")[0]
        step = job.wait_for(lambda: [r for r in job.history() if r.get("kind") == "step"
                                     and r["time"] > start["time"]], 60, "next step")[0]
        codes = [a.wait(300) for a in (job.agents if kind == "worker_sigkill" else job.agents[:1])]
        assert codes == [0] * len(codes), job.logs()
        return {"to_start_s": round(start["time"] - killed, 2), "to_next_step_s": round(step["time"] - killed, 2),
                "worker_startup_s": start.get("startup_s"), "world_after": start["world"],
                "resumed_step": start["resumed_step"], "load_avg_1m": round(os.getloadavg()[0], 2)}
    finally:
        job.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).with_name("recovery.json")))
    a = p.parse_args()
    os.chdir(ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="bench-rec-"))
    data = synthetic(tmp / "data", n_train=960, n_test=100)
    res: dict = {"machine": machine(), "runs": {"worker_sigkill": [], "agent_loss": []}}
    with start_etcd(tmp / "etcd") as endpoint:
        for i in range(a.repeats):
            for kind in ("worker_sigkill", "agent_loss"):
                r = scenario(kind, endpoint, data, tmp / f"{kind}-{i}")
                res["runs"][kind].append(r)
                print(kind, json.dumps(r), flush=True)
    for kind, runs in res["runs"].items():
        res[kind] = {k: {"median": statistics.median(r[k] for r in runs), "max": max(r[k] for r in runs)}
                     for k in ("to_start_s", "to_next_step_s")}
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("worker_sigkill", "agent_loss")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
