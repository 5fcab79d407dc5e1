"""Elastic DDP training of a CIFAR-10 classifier; the torchrun target.

On each node the cluster's job pod runs this line (built by components/eks_ddp/core/launch_command.py ``job_command``;
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
from eks_ddp_trainer.resume import choose_checkpoint, fence_world, hold_until_leased
from eks_ddp_trainer.runlog import HISTORY_FILE, RunLog  # noqa: F401  (HISTORY_FILE: the history's name, as train.HISTORY_FILE)
from eks_ddp_trainer.train_args import parse_args
from eks_ddp_trainer.wrap import compile_cache_dir, compiled_step, full_share, wrap_ddp

SAVE_GRACE_S = 1.0
"""Seconds a due durable checkpoint waits for the previous write before it is skipped (a slow shared volume)."""
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

    state, lineage = choose_checkpoint(env, run_dir, args.start_over)
    # A node-local snapshot newer than the durable checkpoint (any rank's: the states are replicas) wins, unless a
    # world that was replaced wrote it (off the lineage: checkpoint.py).
    snaps = snapshot.Snapshots(run_dir, env.rank)
    newer = snapshot.agree(env, snaps.read(identity, lineage), int(state["step"]) if state is not None else 0)
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
    elif isinstance(model, AirNet):
        # Only on a fresh start: a resumed model's whitening comes from its checkpoint, and computing it (a float64
        # patch covariance and eigh of 5,000 images) is seconds of every restart on a CPU, a cuSOLVER start on a GPU.
        model.init_whitening(normalize(data.train.images[:5000]))

    # A plain `python -m eks_ddp_trainer.train` (no torchrun) trains as a world of one, without DDP. DDP's settings and
    # the compiled path: training/eks_ddp_trainer/wrap.py. BatchNorm statistics span the processes of the step when there are several.
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
    # This world's fence (checkpoint.py), before anything it trains is recorded or committed: from here on a
    # world that another one replaces commits nothing the run directory's loaders would use.
    world_gen, rdzv_round = fence_world(env, run_dir, state)
    world_fence = {"generation": world_gen, "round": rdzv_round}
    log.gate = ckpt.commit_gate(run_dir, world_gen, "history record")
    log.record("train", f"start world={world} resumed_step={pos['step']} run_dir={run_dir}",
               kind="start", fence=world_gen, rdzv_round=rdzv_round,
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
            "rng": _rng_state(), "config": {**dataclasses.asdict(args), "identity": identity, "world_size": world, "final": final},
            "fence": world_fence,
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
                # Refused (None) while this world may not commit (checkpoint.commit_gate): deferred to the next
                # one due; the final one is retried until it may (a replaced world waits until it is stopped).
                while ckpt.save_checkpoint(run_dir, copy.state, keep=args.keep_checkpoints) is None and final:
                    time.sleep(0.5)

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
    hold_until_leased(env, run_dir, world_gen, "final checkpoint")  # every rank waits in short steps, not in a barrier
    if last_saved != pos["step"]:
        save(final=True)
    durable.wait()  # the last checkpoint is complete before the model file, the evaluation and the exit
    barrier()
    snaps.remove()
    return finish(args, env, model, data, plan, precision, pos, train_s, log, world_gen)


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
