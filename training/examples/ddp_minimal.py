"""A minimal DDP training script that gets everything from eks-ddp's elastic runtime: a worked example.

Run on the cluster as any workload (the Job's agent command), or on one machine:

    python -m eks_ddp_runtime.launch --nnodes=1:2 --nproc-per-node=1 --rdzv-backend=c10d \\
        --rdzv-endpoint=127.0.0.1:29500 --rdzv-id=demo training/examples/ddp_minimal.py --steps 200
    # with EKS_DDP_RUN_DIR=/tmp/run set (the Job sets it to /shared/runs/<run id>)

What it does to survive faults (docs/own-workloads.md):

* reads rank and world size from torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT);
* writes checkpoints into ``$EKS_DDP_RUN_DIR`` from rank 0 only, atomically (temporary file in the same
  folder, fsync, ``os.replace``), keeping the newest two;
* on every start, including each restart after a lost worker or node, resumes from the newest readable
  checkpoint there, so a fault costs the steps since the last checkpoint, not the run;
* exits 0 when done and uses the exit-code contract for what a retry cannot fix: 3 for bad arguments,
  4 when the loss is not finite, 5 when checkpoints exist but none can be read. Any other failure is
  transient and the launcher restarts the workers.

Rank 0 appends one JSON record per event to ``$EKS_DDP_RUN_DIR/history.jsonl`` (and prints it).
Needs only torch (and optionally eks_ddp_runtime for the peer watchdog).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

CONFIG_ERROR, DIVERGED, BAD_INPUT = 3, 4, 5  # the Job's contract (eks_ddp_runtime/exitcodes.py)
CKPT = re.compile(r"ckpt-(\d+)\.pt")
KEEP = 2


class Args(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2; a bad argument is a config error to the Job
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = Args(prog="ddp_minimal", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="optimizer steps in all")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step (demos and tests)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1:
        p.error("--steps and --checkpoint-every: expected >= 1")
    if not os.environ.get("EKS_DDP_RUN_DIR"):
        p.error("EKS_DDP_RUN_DIR is not set; expected the run's directory (the Job sets it)")
    return args


def save_atomically(path: Path, state: dict) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path), newest first."""
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := CKPT.fullmatch(p.name))]
    return sorted(found, reverse=True)


def load_newest(run_dir: Path) -> dict | None:
    """The newest checkpoint that reads back; None on a fresh run. Exits BAD_INPUT when none of them reads."""
    found = checkpoints(run_dir)
    for _, path in found:
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a torn or corrupt file: try the one before it
            print(f"[ddp_minimal] skipping unreadable {path.name}: {e}", file=sys.stderr)
    if found:
        print(f"[ddp_minimal] error: no readable checkpoint among {[p.name for _, p in found]}", file=sys.stderr)
        raise SystemExit(BAD_INPUT)
    return None


def batch(step: int, rank: int, world: int, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of step ``step``'s data: a function of the step, so a resumed run sees the same data."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(64 // world, target.numel(), generator=g)
    return x, x @ target + 0.01 * torch.randn(x.shape[0], generator=g)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    run_dir = Path(os.environ["EKS_DDP_RUN_DIR"])
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)  # before init_process_group: NCCL binds this process to its GPU
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    watchdog = None
    try:  # optional: notice a silent peer in seconds (a SIGSTOPped node, a partition) instead of minutes
        from eks_ddp_runtime.watchdog import start_from_env

        watchdog = start_from_env(rank, world)
    except ImportError:
        pass
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        target = torch.arange(1.0, 9.0)
        model = nn.Linear(8, 1, bias=False).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        state = load_newest(run_dir)
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            start = state["step"]
        ddp = DDP(model)  # broadcasts rank 0's weights: every rank starts equal
        log(rank, run_dir, kind="start", step=start, world=world,
            restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), pid=os.getpid())
        for step in range(start + 1, args.steps + 1):
            x, y = (t.to(device) for t in batch(step, rank, world, target))
            loss = nn.functional.mse_loss(ddp(x).squeeze(1), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if not math.isfinite(loss.item()):
                print(f"[ddp_minimal] error: loss is {loss.item()} at step {step}", file=sys.stderr)
                return DIVERGED
            log(rank, run_dir, kind="step", step=step, loss=round(loss.item(), 6), world=world)
            if rank == 0 and (step % args.checkpoint_every == 0 or step == args.steps):
                save_atomically(run_dir / f"ckpt-{step}.pt", {"step": step, "model": model.state_dict(),
                                                              "optimizer": opt.state_dict()})
                for _, old in checkpoints(run_dir)[KEEP:]:
                    old.unlink(missing_ok=True)
                log(rank, run_dir, kind="checkpoint", step=step)
            time.sleep(args.step_time)
        dist.barrier()  # nobody leaves before the last checkpoint is written
        log(rank, run_dir, kind="done", step=args.steps)
        return 0
    finally:
        if watchdog is not None:
            watchdog.stop()
        dist.destroy_process_group()


def log(rank: int, run_dir: Path, **record) -> None:
    if rank != 0:
        return
    line = json.dumps({**record, "time": time.time()})
    print(line, flush=True)
    with open(run_dir / "history.jsonl", "a") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
