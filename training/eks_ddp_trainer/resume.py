"""Which durable checkpoint a (re)started trainer resumes from (rank 0 chooses, every rank loads the same
file), the fence its world writes before it trains, and the wait for a lease before the final commits."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from eks_ddp_runtime import exitcodes, fence, fence_store
from eks_ddp_runtime.dist import DistEnv
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.guards import TrainerError


def choose_checkpoint(env: DistEnv, run_dir: Path, start_over: bool) -> tuple[dict[str, Any] | None,
                                                                              ckpt.Lineage | None]:
    """Rank 0 picks the newest valid checkpoint on the run directory's lineage (checkpoint.py: the states the
    newest fence allows) and every rank loads that same file; returns it (or None) and the lineage, which every
    rank then applies to its node-local snapshot.

    Unreadable checkpoints are set aside (renamed, never deleted) with a warning naming them. If
    checkpoints exist and none is readable, the run fails with BAD_INPUT unless ``start_over``.
    """
    while True:
        chosen: list[Any] = [None, None, None, False]
        if env.is_main:
            try:
                lineage = chosen[2] = ckpt.read_lineage(run_dir)
                found = ckpt.load_latest(run_dir, set_aside=True, allow_none_valid=start_over, lineage=lineage)
                chosen[0] = str(found[1]) if found else None
            except ckpt.CheckpointError as e:
                chosen[1] = str(e)
            except fence_store.StoreUnavailable as e:  # the run's store: tried again, in short collectives
                ckpt.deferrals.refused("choosing the checkpoint", str(e), said="waits for the run's store")
                chosen[3] = True
            else:
                ckpt.deferrals.allowed("choosing the checkpoint", said="done")
        if env.distributed:
            dist.broadcast_object_list(chosen, src=0)
        if not chosen[3]:
            break
        time.sleep(1.0)
    if chosen[1]:
        raise TrainerError(exitcodes.BAD_INPUT, f"{chosen[1]} (--start-over trains from scratch instead)")
    if not chosen[0]:
        return None, chosen[2]
    try:
        return ckpt.load_checkpoint(Path(chosen[0]), map_location="cpu"), chosen[2]
    except Exception as e:
        raise TrainerError(exitcodes.BAD_INPUT, f"{chosen[0]}: unreadable on rank {env.rank}: {e}") from e


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
