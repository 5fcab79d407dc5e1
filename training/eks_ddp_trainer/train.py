"""Elastic DDP training of a CIFAR-10 classifier; the torchrun target.

On each node the cluster's job pod runs this line (built by training/runtime/eks_ddp_runtime/launch_command.py ``job_command``;
``python -m eks_ddp_runtime.launch`` is torchrun with the Job's exit-code contract and an etcd rendezvous
that survives etcd restarting)::

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 PYTORCH_NVML_BASED_CUDA_CHECK=1 EKS_DDP_PEER_DEADLINE_S=5 PYTHONUNBUFFERED=1 \\
    python -m eks_ddp_runtime.launch --nnodes=1:2 --nproc-per-node=1 \\
        --rdzv-backend=eks-etcd --rdzv-endpoint=ETCD_HOST:2379 --rdzv-id=RUN_ID \\
        --rdzv-conf=join_timeout=900,last_call_timeout=1,first_round_timeout=300,close_timeout=30,keep_alive_interval=1,keep_alive_max_attempt=4,store_retry_timeout=600,read_timeout=5,protocol=https,ca_cert=/etc/eks-ddp/rdzv-tls/ca.crt,ssl_cert=/etc/eks-ddp/rdzv-tls/tls.crt,ssl_cert_key=/etc/eks-ddp/rdzv-tls/tls.key \\
        --max-restarts=20 --monitor-interval=0.5 --local-addr=POD_IP \\
        -m eks_ddp_trainer.train --data-dir=/shared/data --run-dir=/shared/runs/RUN_ID --epochs=10 \\
        --global-batch-size=1024 --model=airnet --keep-checkpoints=3 --seed=0

The optimisation is defined by the *global* batch, never by the number of processes: each step
trains on the same samples, with the same BatchNorm statistics, augmentation and learning rate at any
world size, and the processes share it (data.Batching). A worker or node that dies makes torchrun
restart the workers at whatever world size the rendezvous reaches; they resume from the newest
node-local snapshot any of them holds (training/eks_ddp_trainer/snapshot.py, taken every few steps) or else the newest
valid checkpoint in ``--run-dir``, and the run carries on as if nothing had happened. A run started again
on the same ``--run-dir`` with another ``--epochs`` resumes and trains to the new count (the LR schedule is
re-derived for the new total); another model, width, global batch, BatchNorm group, seed or data set is
refused (CONFIG_ERROR): that is a new run, with a new ``--run-dir`` (on the cluster: a new ``job.runId``).
Rank 0 logs one line per ``--log-every`` steps and appends each record to ``history.jsonl``.
Exit codes: training/runtime/eks_ddp_runtime/exitcodes.py (bad flags, divergence, unreadable data or checkpoints).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from eks_ddp_runtime import exitcodes
from eks_ddp_runtime.dist import DistEnv, all_reduce_sum, barrier, process_age_s, process_group
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import snapshot
from eks_ddp_trainer.commits import Checkpoints
from eks_ddp_trainer.config import TrainerConfig
from eks_ddp_trainer.data import (
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
from eks_ddp_trainer.finish import finish
from eks_ddp_trainer.guards import (
    TrainerError,
    all_finite,
    check_divergence,
    flat_params,
    guarded_parameters,
    weight_change_limit,
)
from eks_ddp_trainer.lookahead import Lookahead
from eks_ddp_trainer.model import (
    AirNet,
    build_model,
    precision_for,
    sync_batchnorm,
)
from eks_ddp_trainer.recipe import FP16_INIT_SCALE, LR_END, LR_PEAK, LR_START, RECIPES, build_optimizer, lr_factor
from eks_ddp_trainer.restore import restore_state
from eks_ddp_trainer.resume import fence_world, hold_until_leased
from eks_ddp_trainer.runlog import HISTORY_FILE, RunLog  # noqa: F401  (HISTORY_FILE: the history's name, as train.HISTORY_FILE)
from eks_ddp_trainer.train_args import parse_args
from eks_ddp_trainer.wrap import compile_cache_dir, compiled_step, full_share, wrap_ddp

_AGE_AFTER_IMPORTS = process_age_s()


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


# ---------------------------------------------------------------------------- training

def train(args: TrainerConfig, env: DistEnv) -> dict[str, Any]:
    """One world's part of the run: set up, restore, join the run's fence, train the remaining steps, finish."""
    age_at_pg = process_age_s()
    run = Training(args, env)
    run.restore()
    run.start_world(age_at_pg)
    return run.finish(run.train_steps())


class Training:
    """The state of one world's training (the steps are its methods, in the order :func:`train` runs them)."""

    def __init__(self, args: TrainerConfig, env: DistEnv) -> None:
        """Setup: the run directory and its log, the data, the batching plan, the model and its optimizer."""
        self.args, self.env = args, env
        self.run_dir = Path(args.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log = RunLog(self.run_dir, env.is_main, args.tensorboard)
        self.dev, self.world = env.device, env.world_size
        torch.manual_seed(args.seed)
        t_data = time.perf_counter()
        try:
            self.data = load_cifar(args.data_dir, self.dev)
        except (OSError, DataError) as e:
            raise TrainerError(exitcodes.BAD_INPUT, f"data set: {e}") from e
        self.t_data = time.perf_counter() - t_data
        self.n_train = len(self.data.train)
        self.plan = plan_batching(self.n_train, args.epochs, args.global_batch_size, args.bn_group, args.min_steps)
        self.recipe = RECIPES[args.model]
        peak = args.lr if args.lr is not None else self.recipe.lr
        self.model = build_model(args.model, len(self.data.classes), args.width).to(
            self.dev, memory_format=torch.channels_last)
        try:
            self.precision = precision_for(self.dev, args.precision)
        except ValueError as e:
            raise TrainerError(exitcodes.CONFIG_ERROR, str(e)) from e
        self.opt = build_optimizer(self.model, self.recipe, peak, self.plan.global_batch)
        self.scaler = torch.amp.GradScaler(self.dev.type, init_scale=FP16_INIT_SCALE,
                                           enabled=self.precision.use_scaler)
        self.lookahead = Lookahead(self.model, self.recipe.lookahead) if self.recipe.lookahead else None
        self.total_steps = args.epochs * self.plan.steps_per_epoch
        self.pos = {"step": 0, "epoch": 0, "sample_in_epoch": 0, "samples_seen": 0}
        # What makes a checkpoint this run's: anything else (--epochs, --lr, ...) may change on a resume.
        self.identity = {"model": args.model, "width": args.width, "global_batch": self.plan.global_batch,
                         "bn_group": self.plan.group, "bn_stats": "step", "seed": args.seed, "n_train": self.n_train}

    def restore(self) -> None:
        """The newest state of this run (a node-local snapshot or the durable checkpoint), or a fresh start."""
        args, env, opt = self.args, self.env, self.opt
        # One copy per node (its local rank 0 writes it). Which copy to resume from is decided from metadata, one
        # rank reads it and sends it to the others as tensors (restore.py); a node-local snapshot written by a
        # replaced world is off the lineage and never used (checkpoint.py).
        self.snaps = snapshot.Snapshots(self.run_dir, env.rank, writer=env.local_rank == 0)
        restored = restore_state(env, self.run_dir, args.start_over, self.snaps, self.identity)
        self.lineage = restored.lineage  # what this world's base is chosen from: its fence records it
        self.resumed_from = restored.source
        self.state = state = restored.state
        if state is None:
            if isinstance(self.model, AirNet):
                # Only on a fresh start: a resumed model's whitening comes from its checkpoint, and computing it (a
                # float64 patch covariance and eigh of 5,000 images) is seconds of every restart on a CPU, a
                # cuSOLVER start on a GPU.
                self.model.init_whitening(normalize(self.data.train.images[:5000]))
            return
        saved_epochs = state["config"].get("epochs")
        diff = ckpt.same_run(state["config"].get("identity", {}), self.identity)
        if diff:
            why = (f" (--epochs {saved_epochs} -> {args.epochs} changes the global batch on this {self.n_train}-image "
                   f"set: --min-steps caps it)" if "global_batch" in diff and saved_epochs != args.epochs else "")
            raise TrainerError(exitcodes.CONFIG_ERROR, f"{self.run_dir}: the checkpoint's run differs from this one "
                               f"(checkpoint, now): {diff}{why}. A changed model, width, global batch, BatchNorm "
                               "group, seed or data set is a new run: use a new --run-dir (on the cluster, a new "
                               "job.runId).")
        if saved_epochs is not None and saved_epochs != args.epochs and env.is_main:
            print(f"[train] resuming at step {state['step']} with --epochs={args.epochs} (the checkpoint's run "
                  f"had {saved_epochs}): the LR schedule and Lookahead now run to step {self.total_steps}", flush=True)
        self.model.load_state_dict(state["model"])
        # load_state_dict would bring back the saved groups' LR and weight decay too: keep this run's (from
        # --lr; the same values when it is unchanged), so a changed learning rate applies from here on.
        hyper = [{k: g[k] for k in ("lr", "base_lr", "weight_decay")} for g in opt.param_groups]
        opt.load_state_dict(state["optimizer"])
        for g, h in zip(opt.param_groups, hyper, strict=True):
            g.update(h)
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.lookahead is not None:
            self.lookahead.load_state_dict(state.get("lookahead"))
        _set_rng_state(state["rng"])
        self.pos = {k: int(state[k]) for k in self.pos}

    def start_world(self, age_at_pg: float | None) -> None:
        """This world's training pieces (DDP, the compiled step, its share of a step) and its fence, recorded."""
        args, env, dev, world, plan, pos = self.args, self.env, self.dev, self.world, self.plan, self.pos
        # A plain `python -m eks_ddp_trainer.train` (no torchrun) trains as a world of one, without DDP. DDP's
        # settings and the compiled path: training/eks_ddp_trainer/wrap.py. BatchNorm statistics span the processes
        # of the step when there are several.
        self.wrapped: nn.Module = wrap_ddp(self.model, dev) if env.distributed else self.model
        self.sync_bn = env.distributed and world > 1
        self.compiled = compiled_step(self.wrapped, args.run_dir) if args.compile else None
        self.share = full_share(plan, world, env.rank)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing, reduction="sum")
        self.flips = flip_parity(self.n_train, args.seed).to(dev)
        # The agent that restarted counts the restart; rank 0 may sit on another node, so take the max.
        restarts = torch.tensor([env.restart_count], device=dev)
        if env.distributed:
            dist.all_reduce(restarts, op=dist.ReduceOp.MAX)
        # This world's fence (checkpoint.py), before anything it trains is recorded or committed: from here on a
        # world that another one replaces commits nothing the run directory's loaders would use.
        self.world_gen, rdzv_round = fence_world(env, self.run_dir, self.state, self.lineage)
        self.world_fence = {"generation": self.world_gen, "round": rdzv_round}
        self.log.gate = ckpt.commit_gate(self.run_dir, self.world_gen, "history record")
        self.log.record("train", f"start world={world} resumed_step={pos['step']} run_dir={self.run_dir}",
                        kind="start", fence=self.world_gen, rdzv_round=rdzv_round,
                        world=world, resumed_step=pos["step"], resumed_from=self.resumed_from,
                        restart=int(restarts.item()), run_dir=str(self.run_dir),
                        startup_s=process_age_s(), imported_s=_AGE_AFTER_IMPORTS, group_ready_s=age_at_pg,
                        data_s=round(self.t_data, 3), precision=self.precision.name, backend=env.backend,
                        model=args.model, global_batch=plan.global_batch, bn_group=plan.group,
                        steps_per_epoch=plan.steps_per_epoch, total_steps=self.total_steps)
        if plan.groups_per_step < world and env.is_main:
            print(f"[train] warning: {world} processes share {plan.groups_per_step} BatchNorm groups per step; "
                  f"{world - plan.groups_per_step} idle each step (raise --global-batch-size or lower --bn-group)",
                  flush=True)
        self.durable = Checkpoints(self.run_dir, args.keep_checkpoints)

    def full_state(self, final: bool = False) -> dict[str, Any]:
        return {
            **self.pos, "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
            "scheduler": {"kind": "triangle", "start": LR_START, "peak": LR_PEAK, "end": LR_END,
                          "total_steps": self.total_steps},
            "scaler": self.scaler.state_dict() if self.precision.use_scaler else None,
            "lookahead": self.lookahead.state_dict() if self.lookahead is not None else None,
            "rng": _rng_state(), "config": {**dataclasses.asdict(self.args), "identity": self.identity,
                                            "world_size": self.world, "final": final},
            "fence": self.world_fence,
        }

    def save(self, final: bool = False) -> None:
        """A durable checkpoint, checked first: nothing diverged or non-finite is ever written (it would poison
        every resume; the weight check's window stays the --check-every one: its baseline moves only there)."""
        pos = self.pos
        check_divergence(pos["step"], self.loss_since_check, self.trainable, self.weights_at_check, self.world,
                         self.guard_limit)
        if not all_finite(self.model):
            raise TrainerError(exitcodes.DIVERGED, f"step {pos['step']}: non-finite weights; not checkpointed")
        if not self.env.is_main:
            return
        # Rank 0 hands a CPU copy to its committer (training/eks_ddp_trainer/commits.py) and goes on: neither a slow
        # shared volume nor a run's store that does not answer the fence's check holds a step. At most one checkpoint
        # waits (a newer one replaces it); the final one is waited for in finish().
        self.durable.submit(pos["step"], snapshot.HostCopy(self.full_state(final)))

    def finished(self) -> bool:
        step = self.pos["step"]
        return step >= self.total_steps or (self.args.max_steps is not None and step >= self.args.max_steps)

    def train_steps(self) -> float:
        """Every remaining step, epoch by epoch (each epoch draws its own order); the seconds they took."""
        dev, pos = self.dev, self.pos
        self.gen = torch.Generator(device=dev)
        self.win = torch.zeros(3, dtype=torch.float64, device=dev)  # loss sum, correct, n since the last log line
        self.loss_since_check = torch.zeros((), dtype=torch.float64, device=dev)
        self.trainable = guarded_parameters(self.model)
        self.guard_limit = weight_change_limit(self.plan.global_batch)
        self.weights_at_check = flat_params(self.trainable)
        self.win_t, self.last_saved = time.perf_counter(), pos["step"]
        t0 = time.perf_counter()
        while not self.finished():
            epoch = pos["epoch"]
            perm = epoch_permutation(self.n_train, epoch, self.args.seed).to(dev)
            for g in self.opt.param_groups:
                if g["name"] == "whiten_bias" and epoch >= self.recipe.whiten_bias_epochs:
                    g["base_lr"] = 0.0
            # Leave at the epoch boundary so that the next epoch draws its own order.
            while pos["epoch"] == epoch and not self.finished():
                self.step(perm, epoch)
                self.after_step()
        return time.perf_counter() - t0

    def step(self, perm: torch.Tensor, epoch: int) -> None:
        """One optimizer step on this process's share of the global batch."""
        args, env, plan, pos, dev, world = self.args, self.env, self.plan, self.pos, self.dev, self.world
        step_in_epoch = plan.step_of(pos["sample_in_epoch"])
        idx, span = rank_indices(perm, pos["sample_in_epoch"], world, env.rank, plan)
        a, _ = plan.rank_range(step_in_epoch, world, env.rank)
        start, _ = plan.step_range(step_in_epoch)
        weight = float(world)
        if len(idx) == 0:
            # More processes than BN groups in this step: DDP needs every process in the gradient all-reduce, so
            # this one trains on the step's first group with a loss weight of zero.
            a, weight = start, 0.0
            idx = perm[start:start + plan.group]
        # Augmentation is drawn for the whole step from (seed, step): the same at any world size.
        self.gen.manual_seed((args.seed * 1_000_003 + pos["step"] * 7919) % (2**62))
        noise = StepNoise.draw(span, 2, self.gen, dev).part(a - start, a - start + len(idx))
        x = augment(self.data.train.images[idx], noise, self.flips[idx] ^ bool(epoch % 2))
        x = x.contiguous(memory_format=torch.channels_last)
        y = self.data.train.labels[idx]
        sched = lr_factor(pos["step"] / self.total_steps)
        for g in self.opt.param_groups:
            g["lr"] = g["base_lr"] * sched
        sync_batchnorm(self.model, self.sync_bn, contributes=weight > 0)
        compiled = self.compiled
        step_fn = compiled if compiled is not None and len(idx) == self.share else self.wrapped  # no 2nd graph (wrap.py)
        with self.precision.autocast(dev.type):
            logits = step_fn(x)
            loss = self.criterion(logits.float(), y)
        self.opt.zero_grad(set_to_none=True)
        # DDP averages gradients over processes; scaling by the world size makes that the gradient of the loss
        # summed over the whole global batch, however the batch is split.
        self.scaler.scale(loss * weight).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        if weight:
            with torch.no_grad():
                self.win[0] += loss.detach()
                self.win[1] += (logits.argmax(1) == y).sum()
                self.loss_since_check.add_(loss.detach())
            self.win[2] += len(y)
        pos["step"] += 1
        pos["sample_in_epoch"] += span
        pos["samples_seen"] += span
        if self.lookahead is not None:
            self.lookahead.after_step(pos["step"], self.total_steps)
        if pos["sample_in_epoch"] >= self.n_train:
            pos["epoch"] += 1
            pos["sample_in_epoch"] = 0
            if self.lookahead is not None:
                self.lookahead.end_of_epoch()

    def after_step(self) -> None:
        """A step's bookkeeping: the node-local snapshot, the divergence check, the log line, a due checkpoint."""
        args, pos = self.args, self.pos
        # Node-local; skipped while the previous write runs or the copy budget is spent; the last step waits.
        self.snaps.offer(self.full_state, final=self.finished())
        if pos["step"] % args.check_every == 0 or self.finished():
            self.weights_at_check = check_divergence(pos["step"], self.loss_since_check, self.trainable,
                                                     self.weights_at_check, self.world, self.guard_limit)
            self.loss_since_check.zero_()
        if pos["step"] % args.log_every == 0 or self.finished():
            self.log_line()
        due = (pos["step"] % args.checkpoint_every == 0) if args.checkpoint_every else pos["sample_in_epoch"] == 0
        if due and not self.finished():
            self.save()
            self.last_saved = pos["step"]

    def log_line(self) -> None:
        """Rank 0's line (and history record) over the steps since the last one, summed over the processes."""
        pos, world = self.pos, self.world
        tot = all_reduce_sum(self.win.clone()).tolist()
        now = time.perf_counter()
        loss_v, acc_v, img_s = tot[0] / max(tot[2], 1), tot[1] / max(tot[2], 1), tot[2] / (now - self.win_t)
        epoch_shown = pos["epoch"] + (1 if pos["sample_in_epoch"] else 0)
        lr_main = self.opt.param_groups[-1]["lr"]
        self.log.record("train", f"epoch={epoch_shown} step={pos['step']} loss={loss_v:.4f} acc={acc_v:.3f} "
                        f"img_s={img_s:.0f} world={world} lr={lr_main:.4f}", kind="step", epoch=epoch_shown,
                        step=pos["step"], loss=loss_v, acc=acc_v, img_s=img_s, world=world, lr=lr_main)
        self.win.zero_()
        self.win_t = now

    def finish(self, train_s: float) -> dict[str, Any]:
        """The final checkpoint once this world may commit, then the model file, the evaluation and the upload."""
        env, pos = self.env, self.pos
        hold_until_leased(env, self.run_dir, self.world_gen, "final checkpoint")  # short steps, not a barrier
        if self.last_saved != pos["step"]:
            self.save(final=True)
        self.durable.wait()  # the last checkpoint is complete before the model file, the evaluation and the exit
        barrier()
        self.snaps.remove()
        return finish(self.args, env, self.model, self.data, self.plan, self.precision, pos, train_s, self.log,
                      self.world_gen)


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
