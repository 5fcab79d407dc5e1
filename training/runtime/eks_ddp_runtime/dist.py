"""Process-group setup: the one place that reads rank, local rank and world size.

torchrun exports RANK, LOCAL_RANK, WORLD_SIZE (and MASTER_ADDR/PORT); a plain
``python -m eks_ddp_trainer.train`` run has none of them and trains as a world of one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from . import watchdog


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    restart_count: int
    """TORCHELASTIC_RESTART_COUNT: how many times the agent restarted this node's workers."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()


SHARE_ONE_GPU_ENV = "EKS_DDP_SHARE_ONE_GPU"
"""Test-only (bench/gpu_check.py, the 2-process CUDA item): ``1`` puts every local worker on GPU 0 with gloo,
which takes CUDA tensors, so the multi-process CUDA path runs on a one-GPU machine (NCCL refuses two ranks on one
GPU: "Duplicate GPU detected"). Never set on a cluster."""


def read_env() -> DistEnv:
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # NCCL on GPU, gloo on CPU: chosen from the hardware, never from a flag, so one image fits every node.
    if torch.cuda.is_available() and os.environ.get(SHARE_ONE_GPU_ENV) == "1":
        device, backend = torch.device("cuda", 0), "gloo"
    elif torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    return DistEnv(rank, local_rank, world_size, device, backend,
                   int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


@contextlib.contextmanager
def process_group(timeout_s: float = 120.0) -> Iterator[DistEnv]:
    """Set the device, join the process group, and always destroy it on the way out."""
    env = read_env()
    if env.device.type == "cuda":
        # Before init_process_group, so NCCL binds this process to its own GPU.
        torch.cuda.set_device(env.device)
    use_pg = "MASTER_ADDR" in os.environ and env.world_size >= 1 and dist.is_available()
    if use_pg:
        # A dead peer surfaces as a gloo/NCCL error; the timeout only bounds a silent hang.
        dist.init_process_group(backend=env.backend, timeout=timedelta(seconds=timeout_s),
                                device_id=env.device if env.backend == "nccl" else None)
    # A silent peer (SIGSTOP, partition) is noticed in seconds, not after ``timeout_s`` (watchdog.py).
    wd = watchdog.start_from_env(env.rank, env.world_size) if use_pg else None
    try:
        yield env
    finally:
        if wd is not None:
            wd.stop()
        if use_pg and dist.is_initialized():
            dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def process_age_s() -> float | None:
    """Seconds since this process started (Linux), to show how much of a restart is worker start-up."""
    try:
        uptime = float(open("/proc/uptime").read().split()[0])
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        return None
