"""Elastic DDP training of a CIFAR-10 classifier; the torchrun target.

On each node (the cluster's job pods build this same line with components/torchrun.py)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:2 --nproc-per-node=1 \\
        --rdzv-backend=etcd-v2 --rdzv-endpoint=ETCD_HOST:2379 --rdzv-id=RUN_ID \\
        --rdzv-conf=join_timeout=900,last_call_timeout=5,close_timeout=30,keep_alive_interval=5,keep_alive_max_attempt=3 \\
        --max-restarts=3 --monitor-interval=0.5 \\
        -m training.train --data-dir=/shared/data --run-dir=/shared/runs/RUN_ID --epochs=10 --batch-size=512

A worker or node that dies makes torchrun restart the workers at whatever world size the
rendezvous reaches; they resume from the newest valid checkpoint in ``--run-dir`` by the
global sample count, so the data order and the learning-rate schedule carry on unchanged.
Rank 0 logs one line per ``--log-every`` steps and appends each record to ``history.jsonl``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from training import checkpoint as ckpt
from training.data import augment, epoch_permutation, load_cifar, rank_indices
from training.dist import DistEnv, all_reduce_sum, barrier, process_age_s, process_group
from training.evaluate import MODEL_FILE, evaluate_model, format_table, write_metrics
from training.model import MODELS, build_model, precision_for

DEFAULT_LR = {"resnet-small": 0.4, "resnet18": 0.2, "workshop-cnn": 0.05}
"""Peak learning rate per 512 images of global batch (scaled linearly with the actual global batch)."""
REFERENCE_BATCH = 512
WARMUP = 0.2
"""Fraction of training spent warming the learning rate up; the rest decays it linearly to zero."""
HISTORY_FILE = "history.jsonl"
_AGE_AFTER_IMPORTS = process_age_s()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun ... -m training.train", description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True, help="directory containing cifar-10-batches-py")
    p.add_argument("--run-dir", required=True, help="checkpoints, model.pt, metrics.json, history.jsonl")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=512, help="per process")
    p.add_argument("--model", choices=MODELS, default="resnet-small")
    p.add_argument("--width", type=int, default=None, help="resnet-small base channel count (default 64)")
    p.add_argument("--lr", type=float, default=None, help="peak LR per 512 images of global batch")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--label-smoothing", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps (default: once per epoch)")
    p.add_argument("--log-every", type=int, default=50, help="steps")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events to <run-dir>/tb")
    a = p.parse_args(argv)
    for name in ("epochs", "batch_size", "keep_checkpoints", "log_every", "checkpoint_every", "max_steps", "width"):
        v = getattr(a, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')}: got {v}; expected >= 1")
    return a


def lr_factor(progress: float) -> float:
    """Linear warm-up to 1 over the first WARMUP of training, then linear decay to 0 (a one-cycle triangle)."""
    progress = min(max(progress, 0.0), 1.0)
    if progress < WARMUP:
        return progress / WARMUP
    return max(0.0, (1.0 - progress) / (1.0 - WARMUP))


def build_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    # No weight decay on BatchNorm parameters and biases: decaying them only hurts accuracy.
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    return torch.optim.SGD([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0}],
                           lr=lr, momentum=0.9, nesterov=True)


class RunLog:
    """Rank 0's log: one compact stdout line per record, and the same record as JSON in history.jsonl."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool) -> None:
        self.enabled = enabled
        self.path = run_dir / HISTORY_FILE
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:
                print("[train] --tensorboard: the tensorboard package is not installed; not writing events",
                      flush=True)

    def record(self, event: str, line: str | None, **fields: Any) -> None:
        if not self.enabled:
            return
        if line is not None:
            print(f"[{event}] {line}", flush=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
        if self.tb is not None and event == "train":
            for k in ("loss", "acc", "lr", "img_s"):
                self.tb.add_scalar(f"train/{k}", fields[k], fields["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _rng_state() -> dict[str, Any]:
    out: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def _choose_checkpoint(env: DistEnv, run_dir: Path) -> dict[str, Any] | None:
    """Rank 0 picks the newest valid checkpoint and every rank loads that same file."""
    chosen: list[str | None] = [None]
    if env.is_main:
        found = ckpt.load_latest(run_dir)
        chosen[0] = str(found[1]) if found else None
    if env.distributed:
        dist.broadcast_object_list(chosen, src=0)
    return ckpt.load_checkpoint(Path(chosen[0]), map_location="cpu") if chosen[0] else None


def train(args: argparse.Namespace, env: DistEnv) -> dict[str, Any]:
    age_at_pg = process_age_s()
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(run_dir, env.is_main, args.tensorboard)
    dev, world = env.device, env.world_size
    torch.manual_seed(args.seed)
    t_data = time.perf_counter()
    data = load_cifar(args.data_dir, dev)
    t_data = time.perf_counter() - t_data
    n_train = len(data.train)
    model = build_model(args.model, len(data.classes), args.width).to(dev, memory_format=torch.channels_last)
    precision = precision_for(dev)
    base_lr = (args.lr if args.lr is not None else DEFAULT_LR[args.model])
    peak_lr = base_lr * args.batch_size * world / REFERENCE_BATCH
    opt = build_optimizer(model, peak_lr, args.weight_decay)
    scaler = torch.amp.GradScaler(dev.type, enabled=precision.use_scaler)
    total_samples = args.epochs * n_train
    pos = {"step": 0, "epoch": 0, "sample_in_epoch": 0, "samples_seen": 0}

    state = _choose_checkpoint(env, run_dir)
    if state is not None:
        saved = state["config"]
        if (saved["model"], saved.get("width")) != (args.model, args.width):
            raise SystemExit(f"{run_dir}: checkpoint is {saved['model']} width={saved.get('width')}; this run asks "
                             f"for {args.model} width={args.width}. Use a new --run-dir.")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"])
        pos = {k: int(state[k]) for k in pos}

    # A plain `python -m training.train` (no torchrun) trains as a world of one, without DDP.
    wrapped: nn.Module = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None) if env.distributed else model
    step_fn = torch.compile(wrapped) if args.compile else wrapped
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    # The agent that restarted counts the restart; rank 0 may sit on another node, so take the max.
    restarts = torch.tensor([env.restart_count], device=dev)
    if env.distributed:
        dist.all_reduce(restarts, op=dist.ReduceOp.MAX)
    log.record("train", f"start world={world} resumed_step={pos['step']} run_dir={run_dir}", kind="start",
               world=world, resumed_step=pos["step"], restart=int(restarts.item()), run_dir=str(run_dir),
               startup_s=process_age_s(), imported_s=_AGE_AFTER_IMPORTS, group_ready_s=age_at_pg, data_s=round(t_data, 3),
               precision=precision.name, backend=env.backend, model=args.model)

    def save(final: bool = False) -> None:
        if env.is_main:
            ckpt.save_checkpoint(run_dir, {
                **pos, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": {"kind": "linear-warmup-decay", "warmup": WARMUP, "samples_seen": pos["samples_seen"],
                              "total_samples": total_samples, "base_lr": base_lr},
                "scaler": scaler.state_dict() if precision.use_scaler else None,
                "rng": _rng_state(), "config": {**vars(args), "world_size": world, "final": final},
            }, keep=args.keep_checkpoints)
        # Nobody races ahead (or exits) while rank 0 still writes.
        barrier()

    def finished() -> bool:
        return pos["samples_seen"] >= total_samples or (args.max_steps is not None and pos["step"] >= args.max_steps)

    gen = torch.Generator(device=dev)
    win = torch.zeros(3, dtype=torch.float64, device=dev)  # loss*n, correct, n since the last log line
    win_t, last_saved = time.perf_counter(), pos["step"]
    t0 = time.perf_counter()
    while not finished():
        perm = epoch_permutation(n_train, pos["epoch"], args.seed).to(dev)
        while pos["sample_in_epoch"] < n_train and not finished():
            idx, span = rank_indices(perm, pos["sample_in_epoch"], world, env.rank, args.batch_size)
            # Augmentation noise depends on (seed, step, rank) only, so a resumed run draws what it would have.
            gen.manual_seed((args.seed * 1_000_003 + pos["step"] * 7919 + env.rank) % (2**62))
            x = augment(data.train.images[idx], gen).contiguous(memory_format=torch.channels_last)
            y = data.train.labels[idx]
            lr = peak_lr * lr_factor(pos["samples_seen"] / total_samples)
            for g in opt.param_groups:
                g["lr"] = lr
            with precision.autocast(dev.type):
                logits = step_fn(x)
                loss = criterion(logits.float(), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            with torch.no_grad():
                win += torch.stack([loss.detach().double() * len(y), (logits.argmax(1) == y).sum().double(),
                                    torch.tensor(float(len(y)), dtype=torch.float64, device=dev)])
            pos["step"] += 1
            pos["sample_in_epoch"] += span
            pos["samples_seen"] += span
            if pos["sample_in_epoch"] >= n_train:
                pos["epoch"] += 1
                pos["sample_in_epoch"] = 0
            if pos["step"] % args.log_every == 0 or finished():
                tot = all_reduce_sum(win.clone()).tolist()
                now = time.perf_counter()
                loss_v, acc_v, img_s = tot[0] / max(tot[2], 1), tot[1] / max(tot[2], 1), tot[2] / (now - win_t)
                epoch_shown = pos["epoch"] + (1 if pos["sample_in_epoch"] else 0)
                log.record("train", f"epoch={epoch_shown} step={pos['step']} loss={loss_v:.4f} acc={acc_v:.3f} "
                           f"img_s={img_s:.0f} world={world} lr={lr:.4f}", kind="step", epoch=epoch_shown,
                           step=pos["step"], loss=loss_v, acc=acc_v, img_s=img_s, world=world, lr=lr)
                win.zero_()
                win_t = now
            due = (pos["step"] % args.checkpoint_every == 0) if args.checkpoint_every else pos["sample_in_epoch"] == 0
            if due and not finished():
                save()
                last_saved = pos["step"]
    train_s = time.perf_counter() - t0
    if last_saved != pos["step"]:
        save(final=True)
    if env.is_main:
        ckpt.atomic_write_bytes(run_dir / MODEL_FILE, _model_bytes(model, args, len(data.classes), pos["step"]))
    metrics = evaluate_model(model, data.test, data.classes, precision=precision, batch_size=args.eval_batch_size,
                             rank=env.rank, world=world)
    metrics.update(model=args.model, width=args.width, step=pos["step"], epochs=args.epochs,
                   samples_seen=pos["samples_seen"], world_size=world, precision=precision.name,
                   train_seconds_this_attempt=round(train_s, 3), restart=env.restart_count)
    if env.is_main:
        write_metrics(run_dir, metrics)
        print(format_table(metrics), flush=True)
        log.record("eval", None, kind="eval", accuracy=metrics["accuracy"],
                   per_class=metrics["per_class"], step=pos["step"])
    log.close()
    barrier()
    return metrics


def _model_bytes(model: nn.Module, args: argparse.Namespace, num_classes: int, step: int) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "step": step,
                "config": {"model": args.model, "width": args.width, "num_classes": num_classes}}, buf)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # DDP's constructor imports torch._dynamo (~1 s of CPU). Importing it on a side thread overlaps that
    # with the rendezvous wait and data loading, which shortens every restart.
    threading.Thread(target=importlib.import_module, args=("torch._dynamo",), daemon=True).start()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    torch.backends.cudnn.benchmark = True
    # SIGTERM from the agent keeps its default action (exit now): a Python handler would wait for a
    # blocked collective to return and stall the restart. The OS tears the process group down then.
    with process_group() as env:
        metrics = train(args, env)
    return 0 if math.isfinite(metrics["accuracy"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
