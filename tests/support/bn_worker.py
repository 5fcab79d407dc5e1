"""One process of a real gloo world for tests/trainer/test_model_speed.py: StepBatchNorm over a shared step.

    python tests/support/bn_worker.py RANK WORLD PORT OUT_DIR

Every process builds the same seeded batch of ``N`` samples, takes its part (parts of unequal size as
``data.rank_slice`` deals them; a process whose part is empty trains on a stand-in batch that does not
count, as the trainer does), runs a StepBatchNorm forward and backward with a loss weighted by the
world size, and writes its outputs, the gradient of its inputs and the bias gradient summed over the
processes to ``OUT_DIR/RANK.pt``; and, as a negative control, the outputs of the same layer without the
all-reduce (each process normalising its own part).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eks_ddp_trainer.data import rank_slice  # noqa: E402
from eks_ddp_trainer.model import StepBatchNorm, sync_batchnorm  # noqa: E402

N, C = 6, 5  # 6 samples: at world 8 two processes hold none


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, C, 3, 3, generator=g) * 3 + 2
    w = torch.randn(N, C, 3, 3, generator=g)  # the loss is sum(w * y): a gradient that differs per sample
    return x, w


def main() -> int:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        bn = StepBatchNorm(C, eps=1e-5)
        with torch.no_grad():
            bn.bias.copy_(torch.linspace(-1, 1, C))
        x_all, w_all = batch()
        a, b = rank_slice(N, world, rank)
        weight = float(world)
        if a == b:  # no sample of the step: a stand-in batch with loss weight 0
            a, b, weight = 0, 1, 0.0
        x = x_all[a:b].clone().requires_grad_(True)
        sync_batchnorm(bn, False)
        y_local = bn(x).detach()
        sync_batchnorm(bn, True, contributes=weight > 0)
        y = bn(x)
        ((y * w_all[a:b]).sum() * weight).backward()
        bias_grad = bn.bias.grad.clone()
        dist.all_reduce(bias_grad)  # what DDP does (a sum here; DDP's mean of world x the loss is the same)
        # Each process weights its loss by the world size (as the trainer does), so its input gradient is
        # world x the gradient of the loss summed over the step.
        torch.save({"range": (a, b), "counts": weight > 0, "y": y.detach(), "x_grad": x.grad / world,
                    "bias_grad": bias_grad / world, "y_local": y_local}, out / f"{rank}.pt")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # Its results are on disk. End without the interpreter's shutdown, where a thread torch's C++ still holds is
    # destroyed joinable and aborts the process ("terminate called without an active exception", seen once in a
    # full run at world 2): the exit status is this test's signal, not torch's teardown.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
