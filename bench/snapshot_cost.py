"""What a node-local snapshot of the default model's training state costs (2026-11-24).

    .venv/bin/python bench/snapshot_cost.py [--rounds 20]

Builds the default airnet with its optimizer momentum and Lookahead average (the state a snapshot holds
after 30% of training), then times, on whatever device this machine has: the copy into reused host
buffers (snapshot.HostCopy, the part on the training thread / stream), and the writer's part (finiteness
check, torch.save, atomic write to the snapshot directory). Prints the snapshot interval the 3% budget
allows (snapshot.SNAPSHOT_BUDGET) and the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import machine

from eks_ddp_trainer import snapshot
from eks_ddp_trainer.config import DEFAULT_MODEL
from eks_ddp_trainer.lookahead import Lookahead
from eks_ddp_trainer.model import build_model
from eks_ddp_trainer.recipe import RECIPES, build_optimizer


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(DEFAULT_MODEL, 10).to(dev, memory_format=torch.channels_last)
    opt = build_optimizer(model, RECIPES[DEFAULT_MODEL], RECIPES[DEFAULT_MODEL].lr, 1024)
    model(torch.randn(64, 3, 32, 32, device=dev).contiguous(memory_format=torch.channels_last)).sum().backward()
    opt.step()
    look = Lookahead(model, RECIPES[DEFAULT_MODEL].lookahead)
    look.after_step(490, 490)
    state = {"step": 1, "model": model.state_dict(), "optimizer": opt.state_dict(), "lookahead": look.state_dict(),
             "config": {"identity": {}}}
    mib = sum(t.numel() * t.element_size() for t in snapshot._tensors(state)) / 2**20
    snaps = snapshot.Snapshots(Path(tempfile.mkdtemp()) / "run", 0, root=tempfile.mkdtemp())
    copy_ms, write_ms, buffers = [], [], None
    for _ in range(a.rounds):
        t = time.perf_counter()
        c = snapshot.HostCopy(state, buffers, timed=True)
        host = time.perf_counter() - t
        buffers = c.state
        copy_ms.append(1000 * max(c.wait(), host))
        t = time.perf_counter()
        snaps._write(c.state)
        write_ms.append(1000 * (time.perf_counter() - t))
    snaps.remove()
    copy, write = statistics.median(copy_ms), statistics.median(write_ms)
    res = {"machine": machine(), "device": str(dev), "state_mib": round(mib, 1), "tensors": len(snapshot._tensors(state)),
           "copy_ms_median": round(copy, 2), "writer_ms_median": round(write, 1),
           "min_interval_ms_at_budget": round(copy / snapshot.SNAPSHOT_BUDGET, 1),
           "load_avg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
