"""``python -m tests.support.busy_exit_probe <trainer flags>``: the trainer run as ``__main__`` while a side thread is
inside torch's C++ code for the whole run (as a snapshot or checkpoint write can be when a FATAL error ends it),
so the exit path always meets a busy thread instead of only when the timing is unlucky."""

from __future__ import annotations

import runpy
import sys
import threading

import torch


def _busy() -> None:
    a = torch.ones(256, 256)
    while True:
        torch.mm(a, a)  # releases the GIL inside C++, where interpreter shutdown would stop it


if __name__ == "__main__":
    threading.Thread(target=_busy, daemon=True, name="busy-torch").start()
    sys.argv = ["eks_ddp_trainer.train", *sys.argv[1:]]
    runpy.run_module("eks_ddp_trainer.train", run_name="__main__", alter_sys=True)
