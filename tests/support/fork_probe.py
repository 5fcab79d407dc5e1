"""A worker module for the launcher tests: reports whether it can use CUDA the way the trainer does.

Run as ``python -m eks_ddp_runtime.launch <the cluster's flags> -m tests.support.fork_probe OUT_DIR``. It imports the trainer
first, so a worker prepares exactly as for training (forked from the launcher's zygote, or a fresh process). Each
rank writes ``OUT_DIR/rank-<RANK>.json``: torch's bad-fork flag, what CUDA's lazy initialisation (the path
``torch.cuda.set_device`` takes) raises, on a machine with a GPU whether ``set_device`` and a kernel ran, and which
process forked the worker with how many threads (tests/support/fork_threads_probe.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import eks_ddp_trainer.train  # noqa: F401  (the agent imports what the trainer imports)
from tests.support.fork_threads_probe import probe as threads_at_fork


def probe() -> dict:
    out: dict = {**threads_at_fork(), "rank": int(os.environ.get("RANK", "0")),
                 "in_bad_fork": bool(torch.cuda._is_in_bad_fork()), "lazy_init_error": None, "set_device": None}
    try:
        torch.cuda._lazy_init()  # what set_device runs first; raises in a bad fork before it looks for a driver
    except Exception as e:  # noqa: BLE001  (on a machine without a GPU it raises "no NVIDIA driver"; recorded)
        out["lazy_init_error"] = f"{type(e).__name__}: {e}"
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        out["set_device"] = float(torch.ones(4, device=f"cuda:{local}").sum().item())
    return out


if __name__ == "__main__":
    result = probe()
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank-{result['rank']}.json").write_text(json.dumps(result))
