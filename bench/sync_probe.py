"""``python -m bench.sync_probe <trainer flags>`` with ``EKS_DDP_SYNC_WINDOW=FIRST:LAST``: the real trainer
(eks_ddp_trainer.train as ``__main__``) with ``torch.cuda.set_sync_debug_mode("error")`` on from optimizer step FIRST to
step LAST, so any host sync in a steady-state step raises there. Prints "sync window clean" when the window closed
without one. Used by bench/gpu_check.py item (d); needs a GPU."""

from __future__ import annotations

import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

first, last = (int(v) for v in os.environ.get("EKS_DDP_SYNC_WINDOW", "52:56").split(":"))
calls = {"n": 0}


def _hook(optimizer, args, kwargs) -> None:
    calls["n"] += 1
    if calls["n"] == first:
        torch.cuda.set_sync_debug_mode("error")
    elif calls["n"] == last:
        torch.cuda.set_sync_debug_mode("default")
        print(f"sync window clean (optimizer steps {first}-{last})", flush=True)


if __name__ == "__main__":
    register_optimizer_step_post_hook(_hook)
    sys.argv = ["eks_ddp_trainer.train", *sys.argv[1:]]
    runpy.run_module("eks_ddp_trainer.train", run_name="__main__", alter_sys=True)
