"""How the trainer wraps its model for a step: DDP's settings and the ``--compile`` path.

DDP (world > 1). airnet has 1,972,792 parameters, 7.9 MB of fp32 gradients, most of it in four 3x3
convolutions (block 2's second and block 3's two are 2.36 MB each, block 2's first 0.59 MB):

* ``bucket_cap_mb=DDP_BUCKET_CAP_MB`` (2): DDP's default 25 MB (after a first bucket of 1 MiB) puts the
  whole model in two buckets, so the all-reduce starts only when backward is nearly done and does not
  overlap it. At 2 MB each big convolution gets a bucket of its own (~5 buckets): the reduction of block
  3's gradients runs while block 2's and 1's backward computes. Much smaller buckets only add per-call
  latency (~10-50 us each over EFA/TCP) for no more overlap.
* ``gradient_as_bucket_view=True``: the gradients live in the buckets, which saves one 7.9 MB copy per
  step and as much memory; the optimizer only reads ``.grad``, and ``zero_grad(set_to_none=True)`` is
  supported (DDP points the next gradient back at its bucket).
* ``static_graph=False``: it buys nothing here (every parameter gets a gradient every step, no
  reentrant checkpointing, ``find_unused_parameters`` is off), and the trainer runs the same DDP module
  both compiled (full steps) and eagerly (an epoch's short last step).
* ``forward_sync_buffers=False``: training-mode BatchNorm keeps no running statistics to broadcast
  (model.calibrate_bn sets them before evaluation).

``--compile``: :func:`compiled_step` compiles the step's module once, for this process's share of a full
step (``dynamic=False``: static shapes, the fastest kernels). :func:`full_share` is that share; a step of
another shape (an epoch's short last step, a process without a sample in the step) runs the same module
eagerly instead of compiling a second graph, so no process ever compiles in the middle of training while
its peers wait in the all-reduce. Inductor's FX-graph and AOT-autograd caches are on (torch's
default) and kept in ``TORCHINDUCTOR_CACHE_DIR``: on the cluster the training Job sets it on the run's volume,
keyed by torch version and model (``<run-dir>/compile-cache/torch-<version>/<model>``, components/eks_ddp/core/
workload.py ``compile_cache_env``); when it is not set (a local run), ``<run-dir>/compile-cache``. So a restarted
worker, a rescheduled pod and every node of the run reuse the compiled artifacts instead of generating code again.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from eks_ddp_trainer.data import Batching, rank_slice

DDP_BUCKET_CAP_MB = 2.0
DDP_GRADIENT_AS_BUCKET_VIEW = True
DDP_STATIC_GRAPH = False
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
COMPILE_CACHE_DIR = "compile-cache"
"""Inductor's cache under the run directory when ``TORCHINDUCTOR_CACHE_DIR`` is not set."""


def wrap_ddp(model: nn.Module, device: torch.device) -> DDP:
    """The DDP wrapper of a distributed run, with the settings argued above."""
    kw = {"device_ids": [device.index] if device.type == "cuda" else None, "bucket_cap_mb": DDP_BUCKET_CAP_MB,
          "gradient_as_bucket_view": DDP_GRADIENT_AS_BUCKET_VIEW, "static_graph": DDP_STATIC_GRAPH}
    try:
        return DDP(model, forward_sync_buffers=False, **kw)
    except TypeError as e:  # torch < 2.14 (a GPU box may bring its own) names it broadcast_buffers
        if "forward_sync_buffers" not in str(e):
            raise
        return DDP(model, broadcast_buffers=False, **kw)


def full_share(plan: Batching, world: int, rank: int) -> int:
    """Samples this process trains on in a full step (the epoch's last step may hold fewer, or more)."""
    a, b = rank_slice(plan.groups_per_step, world, rank)
    return (b - a) * plan.group


def compile_cache_dir(run_dir: str | os.PathLike) -> str:
    """Point Inductor's on-disk cache at ``<run-dir>/compile-cache`` unless ``TORCHINDUCTOR_CACHE_DIR`` is set;
    returns the directory used. Call it before ``torch._dynamo`` is imported: that import sets the variable
    to torch's default (``/tmp/torchinductor_<user>``) when it is unset."""
    if not os.environ.get(CACHE_ENV):
        os.environ[CACHE_ENV] = str(Path(run_dir).resolve() / COMPILE_CACHE_DIR)
    return os.environ[CACHE_ENV]


def compiled_step(module: nn.Module, run_dir: str | os.PathLike) -> nn.Module:
    """``torch.compile`` of the step's module with static shapes and the persistent cache."""
    compile_cache_dir(run_dir)
    return torch.compile(module, dynamic=False)
