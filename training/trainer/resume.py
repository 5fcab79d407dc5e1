"""Which durable checkpoint a (re)started trainer resumes from: rank 0 chooses, every rank loads the same file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
from eks_ddp_runtime import exitcodes
from eks_ddp_runtime.dist import DistEnv
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.guards import TrainerError


def choose_checkpoint(env: DistEnv, run_dir: Path, start_over: bool) -> dict[str, Any] | None:
    """Rank 0 picks the newest valid checkpoint and every rank loads that same file.

    Unreadable checkpoints are set aside (renamed, never deleted) with a warning naming them. If
    checkpoints exist and none is readable, the run fails with BAD_INPUT unless ``start_over``.
    """
    chosen: list[str | None] = [None, None]
    if env.is_main:
        try:
            found = ckpt.load_latest(run_dir, set_aside=True, allow_none_valid=start_over)
            chosen[0] = str(found[1]) if found else None
        except ckpt.CheckpointError as e:
            chosen[1] = str(e)
    if env.distributed:
        dist.broadcast_object_list(chosen, src=0)
    if chosen[1]:
        raise TrainerError(exitcodes.BAD_INPUT, f"{chosen[1]} (--start-over trains from scratch instead)")
    if not chosen[0]:
        return None
    try:
        return ckpt.load_checkpoint(Path(chosen[0]), map_location="cpu")
    except Exception as e:
        raise TrainerError(exitcodes.BAD_INPUT, f"{chosen[0]}: unreadable on rank {env.rank}: {e}") from e
