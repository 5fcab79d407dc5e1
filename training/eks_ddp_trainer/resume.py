"""The fence a (re)started trainer's world writes before it trains, and the wait for a lease before the final
commits. What it resumes from: restore.py."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from eks_ddp_runtime import fence
from eks_ddp_runtime.dist import DistEnv
from eks_ddp_trainer import checkpoint as ckpt


def fence_world(env: DistEnv, run_dir: Path, restored: dict[str, Any] | None,
                lineage: Any = ckpt._FROM_FENCES) -> tuple[int, int | None]:
    """Rank 0 fences ``run_dir`` for this world before it trains (checkpoint.write_fence: the next generation, naming
    the state every rank ``restored``, chosen from ``lineage``), waiting while its agent holds no lease or the run's
    store does not answer; returns (generation, rendezvous round) on every rank. Each wait is a short collective, so
    no rank times out in a long one."""
    round_env = os.environ.get(fence.ROUND_ENV)
    round_ = int(round_env) if round_env else None
    base = (ckpt.generation_of(restored), int(restored["step"])) if restored is not None else None
    elsewhere: ckpt.ReplacedElsewhere | None = None
    while True:
        box = torch.tensor([-1], dtype=torch.int64, device=env.device)
        if env.is_main:
            try:
                generation = ckpt.write_fence(run_dir, base, round_, lineage)
                box[0] = -1 if generation is None else generation
                if generation is not None:
                    ckpt.deferrals.allowed("fence of a new world", said="taken")
            except ckpt.ReplacedElsewhere as e:
                elsewhere, box[0] = e, REPLACED_ELSEWHERE
        if env.distributed:
            dist.broadcast(box, src=0)
        if int(box.item()) == REPLACED_ELSEWHERE:  # every rank stops with the same code, not only rank 0
            raise elsewhere or ckpt.ReplacedElsewhere(f"rank 0 found {run_dir} fenced by another rendezvous store's "
                                                      "world")
        if int(box.item()) >= 0:
            return int(box.item()), round_
        time.sleep(1.0)


REPLACED_ELSEWHERE = -2
"""What rank 0 broadcasts from :func:`fence_world` when another live store's world holds the run directory."""


def hold_until_leased(env: DistEnv, run_dir: Path, generation: int, what: str) -> None:
    """Every rank waits, in short collectives, until rank 0 may commit ``what`` (its agent holds the lease and no
    newer world fenced ``run_dir``). A world another one replaced waits here until its agent stops it."""
    while True:
        ok = torch.ones(1, dtype=torch.int64, device=env.device)
        if env.is_main:
            try:
                ckpt.commit_gate(run_dir, generation, what)()
            except ckpt.CommitRefused:
                ok[0] = 0
        if env.distributed:
            dist.broadcast(ok, src=0)
        if int(ok.item()):
            return
        time.sleep(1.0)
