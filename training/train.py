"""Elastic DDP training of a CIFAR-10 classifier; the torchrun target.

On each node the cluster's job pod runs this line (built by components/torchrun.py ``job_command``;
``python -m eks_ddp_runtime.launch`` is torchrun with the Job's exit-code contract and an etcd rendezvous
that survives etcd restarting)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTORCH_NVML_BASED_CUDA_CHECK=1 EKS_DDP_PEER_DEADLINE_S=5 PYTHONUNBUFFERED=1 \\
    python -m eks_ddp_runtime.launch --nnodes=1:2 --nproc-per-node=1 \\
        --rdzv-backend=eks-etcd --rdzv-endpoint=ETCD_HOST:2379 --rdzv-id=RUN_ID \\
        --rdzv-conf=join_timeout=900,last_call_timeout=1,first_round_timeout=300,close_timeout=30,keep_alive_interval=1,keep_alive_max_attempt=4,store_retry_timeout=600,read_timeout=5,protocol=https,ca_cert=/etc/eks-ddp/rdzv-tls/ca.crt,ssl_cert=/etc/eks-ddp/rdzv-tls/tls.crt,ssl_cert_key=/etc/eks-ddp/rdzv-tls/tls.key \\
        --max-restarts=20 --monitor-interval=0.5 --local-addr=POD_IP \\
        -m training.train --data-dir=/shared/data --run-dir=/shared/runs/RUN_ID --epochs=10 \\
        --global-batch-size=1024 --model=airnet --keep-checkpoints=3 --seed=0

The optimisation is defined by the *global* batch, never by the number of processes: each step
trains on the same samples, with the same BatchNorm statistics, augmentation and learning rate at any
world size, and the processes share it (data.Batching). A worker or node that dies makes torchrun
restart the workers at whatever world size the rendezvous reaches; they resume from the newest
node-local snapshot any of them holds (training/snapshot.py, taken every few steps) or else the newest
valid checkpoint in ``--run-dir``, and the run carries on as if nothing had happened. A run started again
on the same ``--run-dir`` with another ``--epochs`` resumes and trains to the new count (the LR schedule is
re-derived for the new total); another model, width, global batch, BatchNorm group, seed or data set is
refused (CONFIG_ERROR): that is a new run, with a new ``--run-dir`` (on the cluster: a new ``job.runId``).
Rank 0 logs one line per ``--log-every`` steps and appends each record to ``history.jsonl``.
Exit codes: training/runtime/exitcodes.py (bad flags, divergence, unreadable data or checkpoints).
"""

from __future__ import annotations

import argparse
import importlib
import io
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
from eks_ddp_runtime import exitcodes
from torch import nn

from . import checkpoint as ckpt
from . import snapshot
from .data import (
    DEFAULT_BN_GROUP,
    DEFAULT_GLOBAL_BATCH,
    MIN_STEPS,
    Batching,
    Cifar,
    DataError,
    StepNoise,
    augment,
    epoch_permutation,
    flip_parity,
    load_cifar,
    normalize,
    plan_batching,
    rank_indices,
)
from .dist import DistEnv, all_reduce_sum, barrier, process_age_s, process_group
from .evaluate import MODEL_FILE, evaluate_model, format_table, write_metrics
from .guards import TrainerError, all_finite, check_divergence, flat_params, guarded_parameters, weight_change_limit
from .lookahead import Lookahead
from .model import (
    DEFAULT_MODEL,
    DEFAULT_PRECISION,
    MODELS,
    PRECISIONS,
    AirNet,
    build_model,
    calibrate_bn,
    precision_for,
    sync_batchnorm,
)
from .recipe import FP16_INIT_SCALE, LR_END, LR_PEAK, LR_START, RECIPES, build_optimizer, lr_factor
from .results import upload_from_env
from .wrap import compile_cache_dir, compiled_step, full_share, wrap_ddp

HISTORY_FILE = "history.jsonl"
CALIBRATION_IMAGES = 4096
SAVE_GRACE_S = 1.0
"""Seconds a due durable checkpoint waits for the previous write before it is skipped (a slow shared volume)."""
"""Training images that set the BatchNorm statistics before evaluation."""
_AGE_AFTER_IMPORTS = process_age_s()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        # argparse's own exit code 2 looks like any crash; a bad flag must not be retried.
        self.print_usage(sys.stderr)
        self.exit(exitcodes.CONFIG_ERROR, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="torchrun ... -m training.train", description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True, help="directory containing cifar-10-batches-py")
    p.add_argument("--run-dir", required=True, help="checkpoints, model.pt, metrics.json, history.jsonl")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--global-batch-size", type=int, default=DEFAULT_GLOBAL_BATCH,
                   help="images per optimizer step over all processes; capped so a run has at least "
                        "data.MIN_STEPS steps (default %(default)s)")
    p.add_argument("--bn-group", type=int, default=DEFAULT_BN_GROUP,
                   help="images per unit in which a step's samples are dealt to the processes; the global batch is "
                        "a multiple of it. BatchNorm statistics are those of the whole step (default %(default)s)")
    p.add_argument("--min-steps", type=int, default=MIN_STEPS,
                   help="shrink the global batch until the run has this many steps; 0: never (default %(default)s)")
    p.add_argument("--model", choices=MODELS, default=DEFAULT_MODEL)
    p.add_argument("--width", type=int, default=None, help="airnet/resnet-small base width (default 64)")
    p.add_argument("--lr", type=float, default=None, help="peak LR per 1,024 images (default: the model's recipe)")
    p.add_argument("--label-smoothing", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (training/wrap.py)")
    p.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                   help="autocast on a GPU (a CPU trains in fp32; default %(default)s, as airbench94)")
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps (default: once per epoch)")
    p.add_argument("--log-every", type=int, default=50, help="steps")
    p.add_argument("--check-every", type=int, default=5,
                   help="steps between checks that the loss is finite (one host sync each)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--start-over", action="store_true",
                   help="set unreadable checkpoints aside and train from scratch instead of failing")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events to <run-dir>/tb")
    a = p.parse_args(argv)
    for name in ("epochs", "global_batch_size", "bn_group", "keep_checkpoints", "log_every", "check_every",
                 "checkpoint_every", "max_steps", "width", "eval_batch_size"):
        v = getattr(a, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')}: got {v}; expected >= 1")
    if a.min_steps < 0:
        p.error(f"--min-steps: got {a.min_steps}; expected >= 0")
    if a.global_batch_size % a.bn_group:
        # Also below the group (e.g. 7 with the default 32): a step trains whole BatchNorm groups only.
        p.error(f"--global-batch-size: got {a.global_batch_size}; expected a multiple of --bn-group "
                f"({a.bn_group}): a step trains whole BatchNorm groups (pass a --bn-group that divides it)")
    if a.lr is not None and not (0 < a.lr and math.isfinite(a.lr)):
        p.error(f"--lr: got {a.lr}; expected a positive number")
    if not 0 <= a.label_smoothing < 1:
        p.error(f"--label-smoothing: got {a.label_smoothing}; expected 0 <= x < 1")
    if a.width is not None and a.model not in ("airnet", "resnet-small"):
        p.error(f"--width applies to airnet and resnet-small only; got --model={a.model}")
    return a


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
        if self.tb is not None and event == "train" and fields.get("kind") == "step":
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


# ---------------------------------------------------------------------------- resume and save

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


# ---------------------------------------------------------------------------- training

def train(args: argparse.Namespace, env: DistEnv) -> dict[str, Any]:
    age_at_pg = process_age_s()
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(run_dir, env.is_main, args.tensorboard)
    dev, world = env.device, env.world_size
    torch.manual_seed(args.seed)
    t_data = time.perf_counter()
    try:
        data = load_cifar(args.data_dir, dev)
    except (OSError, DataError) as e:
        raise TrainerError(exitcodes.BAD_INPUT, f"data set: {e}") from e
    t_data = time.perf_counter() - t_data
    n_train = len(data.train)
    plan = plan_batching(n_train, args.epochs, args.global_batch_size, args.bn_group, args.min_steps)
    recipe = RECIPES[args.model]
    peak = args.lr if args.lr is not None else recipe.lr
    model = build_model(args.model, len(data.classes), args.width)
    if isinstance(model, AirNet):
        model.init_whitening(normalize(data.train.images[:5000]))
    model = model.to(dev, memory_format=torch.channels_last)
    try:
        precision = precision_for(dev, args.precision)
    except ValueError as e:
        raise TrainerError(exitcodes.CONFIG_ERROR, str(e)) from e
    opt = build_optimizer(model, recipe, peak, plan.global_batch)
    scaler = torch.amp.GradScaler(dev.type, init_scale=FP16_INIT_SCALE, enabled=precision.use_scaler)
    lookahead = Lookahead(model, recipe.lookahead) if recipe.lookahead else None
    total_steps = args.epochs * plan.steps_per_epoch
    pos = {"step": 0, "epoch": 0, "sample_in_epoch": 0, "samples_seen": 0}
    # What makes a checkpoint this run's: anything else (--epochs, --lr, ...) may change on a resume.
    identity = {"model": args.model, "width": args.width, "global_batch": plan.global_batch, "bn_group": plan.group,
                "bn_stats": "step", "seed": args.seed, "n_train": n_train}

    state = choose_checkpoint(env, run_dir, args.start_over)
    # A node-local snapshot newer than the durable checkpoint (any rank's: the states are replicas) wins.
    snaps = snapshot.Snapshots(run_dir, env.rank)
    newer = snapshot.agree(env, snaps.read(identity), int(state["step"]) if state is not None else 0)
    state = newer if newer is not None else state
    if state is not None:
        saved_epochs = state["config"].get("epochs")
        diff = ckpt.same_run(state["config"].get("identity", {}), identity)
        if diff:
            why = (f" (--epochs {saved_epochs} -> {args.epochs} changes the global batch on this {n_train}-image "
                   f"set: --min-steps caps it)" if "global_batch" in diff and saved_epochs != args.epochs else "")
            raise TrainerError(exitcodes.CONFIG_ERROR, f"{run_dir}: the checkpoint's run differs from this one "
                               f"(checkpoint, now): {diff}{why}. A changed model, width, global batch, BatchNorm "
                               "group, seed or data set is a new run: use a new --run-dir (on the cluster, a new "
                               "job.runId).")
        if saved_epochs is not None and saved_epochs != args.epochs and env.is_main:
            print(f"[train] resuming at step {state['step']} with --epochs={args.epochs} (the checkpoint's run "
                  f"had {saved_epochs}): the LR schedule and Lookahead now run to step {total_steps}", flush=True)
        model.load_state_dict(state["model"])
        # load_state_dict would bring back the saved groups' LR and weight decay too: keep this run's (from
        # --lr; the same values when it is unchanged), so a changed learning rate applies from here on.
        hyper = [{k: g[k] for k in ("lr", "base_lr", "weight_decay")} for g in opt.param_groups]
        opt.load_state_dict(state["optimizer"])
        for g, h in zip(opt.param_groups, hyper, strict=True):
            g.update(h)
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if lookahead is not None:
            lookahead.load_state_dict(state.get("lookahead"))
        _set_rng_state(state["rng"])
        pos = {k: int(state[k]) for k in pos}

    # A plain `python -m training.train` (no torchrun) trains as a world of one, without DDP. DDP's settings and
    # the compiled path: training/wrap.py. BatchNorm statistics span the processes of the step when there are several.
    wrapped: nn.Module = wrap_ddp(model, dev) if env.distributed else model
    sync_bn = env.distributed and world > 1
    compiled = compiled_step(wrapped, args.run_dir) if args.compile else None
    share = full_share(plan, world, env.rank)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing, reduction="sum")
    flips = flip_parity(n_train, args.seed).to(dev)
    # The agent that restarted counts the restart; rank 0 may sit on another node, so take the max.
    restarts = torch.tensor([env.restart_count], device=dev)
    if env.distributed:
        dist.all_reduce(restarts, op=dist.ReduceOp.MAX)
    log.record("train", f"start world={world} resumed_step={pos['step']} run_dir={run_dir}", kind="start",
               world=world, resumed_step=pos["step"], restart=int(restarts.item()), run_dir=str(run_dir),
               startup_s=process_age_s(), imported_s=_AGE_AFTER_IMPORTS, group_ready_s=age_at_pg, data_s=round(t_data, 3),
               precision=precision.name, backend=env.backend, model=args.model, global_batch=plan.global_batch,
               bn_group=plan.group, steps_per_epoch=plan.steps_per_epoch, total_steps=total_steps)
    if plan.groups_per_step < world and env.is_main:
        print(f"[train] warning: {world} processes share {plan.groups_per_step} BatchNorm groups per step; "
              f"{world - plan.groups_per_step} idle each step (raise --global-batch-size or lower --bn-group)",
              flush=True)

    def full_state(final: bool = False) -> dict[str, Any]:
        return {
            **pos, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": {"kind": "triangle", "start": LR_START, "peak": LR_PEAK, "end": LR_END,
                          "total_steps": total_steps},
            "scaler": scaler.state_dict() if precision.use_scaler else None,
            "lookahead": lookahead.state_dict() if lookahead is not None else None,
            "rng": _rng_state(), "config": {**vars(args), "identity": identity, "world_size": world, "final": final},
        }

    durable = snapshot.BackgroundWriter()

    def save(final: bool = False) -> None:
        # Nothing diverged or non-finite is ever written: it would poison every resume. (The window of the
        # weight check stays the --check-every one: its baseline only moves at the regular checks.)
        check_divergence(pos["step"], loss_since_check, trainable, weights_at_check, world, guard_limit)
        if not all_finite(model):
            raise TrainerError(exitcodes.DIVERGED, f"step {pos['step']}: non-finite weights; not checkpointed")
        if env.is_main:
            # Rank 0 writes a CPU copy on a side thread; the peers do not wait for the shared volume. A save
            # due while the previous one is still being written gets SAVE_GRACE_S for it, then is skipped
            # (the per-step node-local snapshots cover recovery meanwhile): a slow volume costs training at
            # most that much per checkpoint interval. The final save waits.
            if not final and not durable.done_within(SAVE_GRACE_S):
                print(f"[train] step {pos['step']}: durable checkpoint skipped, the previous write is still "
                      "running (slow shared volume)", flush=True)
                return
            copy = snapshot.HostCopy(full_state(final))

            def write() -> None:
                copy.wait()  # the device-to-host copies land before anything is serialised
                ckpt.save_checkpoint(run_dir, copy.state, keep=args.keep_checkpoints)

            durable.submit(write)

    def finished() -> bool:
        return pos["step"] >= total_steps or (args.max_steps is not None and pos["step"] >= args.max_steps)

    gen = torch.Generator(device=dev)
    win = torch.zeros(3, dtype=torch.float64, device=dev)  # loss sum, correct, n since the last log line
    loss_since_check = torch.zeros((), dtype=torch.float64, device=dev)
    trainable = guarded_parameters(model)
    guard_limit = weight_change_limit(plan.global_batch)
    weights_at_check = flat_params(trainable)
    win_t, last_saved = time.perf_counter(), pos["step"]
    t0 = time.perf_counter()
    while not finished():
        epoch = pos["epoch"]
        perm = epoch_permutation(n_train, epoch, args.seed).to(dev)
        for g in opt.param_groups:
            if g["name"] == "whiten_bias" and epoch >= recipe.whiten_bias_epochs:
                g["base_lr"] = 0.0
        # Leave at the epoch boundary so that the next epoch draws its own order.
        while pos["epoch"] == epoch and not finished():
            step_in_epoch = plan.step_of(pos["sample_in_epoch"])
            idx, span = rank_indices(perm, pos["sample_in_epoch"], world, env.rank, plan)
            a, _ = plan.rank_range(step_in_epoch, world, env.rank)
            start, _ = plan.step_range(step_in_epoch)
            weight = float(world)
            if len(idx) == 0:
                # More processes than BN groups in this step: DDP needs every process in the gradient
                # all-reduce, so this one trains on the step's first group with a loss weight of zero.
                a, weight = start, 0.0
                idx = perm[start:start + plan.group]
            # Augmentation is drawn for the whole step from (seed, step): the same at any world size.
            gen.manual_seed((args.seed * 1_000_003 + pos["step"] * 7919) % (2**62))
            noise = StepNoise.draw(span, 2, gen, dev).part(a - start, a - start + len(idx))
            x = augment(data.train.images[idx], noise, flips[idx] ^ bool(epoch % 2))
            x = x.contiguous(memory_format=torch.channels_last)
            y = data.train.labels[idx]
            sched = lr_factor(pos["step"] / total_steps)
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * sched
            sync_batchnorm(model, sync_bn, contributes=weight > 0)
            step_fn = compiled if compiled is not None and len(idx) == share else wrapped  # no 2nd graph (wrap.py)
            with precision.autocast(dev.type):
                logits = step_fn(x)
                loss = criterion(logits.float(), y)
            opt.zero_grad(set_to_none=True)
            # DDP averages gradients over processes; scaling by the world size makes that the gradient of the
            # loss summed over the whole global batch, however the batch is split.
            scaler.scale(loss * weight).backward()
            scaler.step(opt)
            scaler.update()
            if weight:
                with torch.no_grad():
                    win[0] += loss.detach()
                    win[1] += (logits.argmax(1) == y).sum()
                    loss_since_check.add_(loss.detach())
                win[2] += len(y)
            pos["step"] += 1
            pos["sample_in_epoch"] += span
            pos["samples_seen"] += span
            if lookahead is not None:
                lookahead.after_step(pos["step"], total_steps)
            if pos["sample_in_epoch"] >= n_train:
                pos["epoch"] += 1
                pos["sample_in_epoch"] = 0
                if lookahead is not None:
                    lookahead.end_of_epoch()
            # Node-local; skipped while the previous write runs or the copy budget is spent; the last step waits.
            snaps.offer(full_state, final=finished())
            if pos["step"] % args.check_every == 0 or finished():
                weights_at_check = check_divergence(pos["step"], loss_since_check, trainable, weights_at_check,
                                                    world, guard_limit)
                loss_since_check.zero_()
            if pos["step"] % args.log_every == 0 or finished():
                tot = all_reduce_sum(win.clone()).tolist()
                now = time.perf_counter()
                loss_v, acc_v, img_s = tot[0] / max(tot[2], 1), tot[1] / max(tot[2], 1), tot[2] / (now - win_t)
                epoch_shown = pos["epoch"] + (1 if pos["sample_in_epoch"] else 0)
                lr_main = opt.param_groups[-1]["lr"]
                log.record("train", f"epoch={epoch_shown} step={pos['step']} loss={loss_v:.4f} acc={acc_v:.3f} "
                           f"img_s={img_s:.0f} world={world} lr={lr_main:.4f}", kind="step", epoch=epoch_shown,
                           step=pos["step"], loss=loss_v, acc=acc_v, img_s=img_s, world=world, lr=lr_main)
                win.zero_()
                win_t = now
            due = (pos["step"] % args.checkpoint_every == 0) if args.checkpoint_every else pos["sample_in_epoch"] == 0
            if due and not finished():
                save()
                last_saved = pos["step"]
    train_s = time.perf_counter() - t0
    if last_saved != pos["step"]:
        save(final=True)
    durable.wait()  # the last checkpoint is complete before the model file, the evaluation and the exit
    barrier()
    snaps.remove()
    return finish(args, env, model, data, plan, precision, pos, train_s, log)


def finish(args: argparse.Namespace, env: DistEnv, model: nn.Module, data: Cifar, plan: Batching, precision,
           pos: dict[str, int], train_s: float, log: RunLog) -> dict[str, Any]:
    """BatchNorm statistics from training images, the final model file, and the test-set evaluation."""
    calibrate_bn(model, normalize(data.train.images[:CALIBRATION_IMAGES]).contiguous(memory_format=torch.channels_last),
                 args.eval_batch_size)
    if env.is_main:
        ckpt.atomic_write_bytes(Path(args.run_dir) / MODEL_FILE, _model_bytes(model, args, data, plan, pos["step"]))
    metrics = evaluate_model(model, data.test, data.classes, precision=precision, batch_size=args.eval_batch_size,
                             rank=env.rank, world=env.world_size)
    metrics.update(model=args.model, width=args.width, step=pos["step"], epochs=args.epochs,
                   samples_seen=pos["samples_seen"], world_size=env.world_size, precision=precision.name,
                   global_batch=plan.global_batch, bn_group=plan.group,
                   train_seconds_this_attempt=round(train_s, 3), restart=env.restart_count)
    if env.is_main:
        write_metrics(args.run_dir, metrics)
        print(format_table(metrics), flush=True)
        log.record("eval", None, kind="eval", accuracy=metrics["accuracy"],
                   per_class=metrics["per_class"], step=pos["step"])
    log.close()
    barrier()
    if env.is_main:
        upload_from_env(args.run_dir)  # results off the cluster; never fails the run
    return metrics


def _model_bytes(model: nn.Module, args: argparse.Namespace, data: Cifar, plan: Batching, step: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "step": step,
                "config": {"model": args.model, "width": args.width, "num_classes": len(data.classes),
                           "bn_group": plan.group}}, buf)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compile:
        compile_cache_dir(args.run_dir)  # before torch._dynamo's import, which sets the variable to /tmp/...
    # DDP's constructor imports torch._dynamo (~1 s of CPU). Importing it on a side thread overlaps that
    # with the rendezvous wait and data loading, which shortens every restart.
    threading.Thread(target=importlib.import_module, args=("torch._dynamo",), daemon=True).start()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    torch.backends.cudnn.benchmark = True
    # SIGTERM from the agent keeps its default action (exit now): a Python handler would wait for a
    # blocked collective to return and stall the restart. The OS tears the process group down then.
    try:
        with process_group() as env:
            train(args, env)
    except TrainerError as e:
        print(f"[train] error: {e}", file=sys.stderr, flush=True)
        return e.code
    return 0


if __name__ == "__main__":
    # Not SystemExit: a write still running on a side thread would turn a FATAL code into an abort (134).
    exitcodes.exit_process(main())
