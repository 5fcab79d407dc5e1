"""The end of a training run: BatchNorm statistics, the final model file, the test-set evaluation, the upload."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eks_ddp_runtime.dist import DistEnv, barrier
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.config import TrainerConfig
from eks_ddp_trainer.data import Batching, Cifar, normalize
from eks_ddp_trainer.evaluate import MODEL_FILE, evaluate_model, format_table, write_metrics
from eks_ddp_trainer.model import calibrate_bn
from eks_ddp_trainer.resume import hold_until_leased
from eks_ddp_trainer.runlog import RunLog
from eks_ddp_trainer.upload import upload_from_env

CALIBRATION_IMAGES = 4096
"""Training images that set the BatchNorm statistics before evaluation."""


def finish(args: TrainerConfig, env: DistEnv, model: nn.Module, data: Cifar, plan: Batching, precision,
           pos: dict[str, int], train_s: float, log: RunLog, generation: int | None = None) -> dict[str, Any]:
    """BatchNorm statistics from training images, the final model file, and the test-set evaluation. ``generation``:
    this world's fence (checkpoint.py); each result is committed only while this world may commit, waiting
    for that (a world another one replaced never finishes: its agent stops it)."""
    calibrate_bn(model, normalize(data.train.images[:CALIBRATION_IMAGES]).contiguous(memory_format=torch.channels_last),
                 args.eval_batch_size)
    run_dir = Path(args.run_dir)
    if generation is not None:
        hold_until_leased(env, run_dir, generation, "final results")
    if env.is_main:
        ckpt.commit_bytes(run_dir / MODEL_FILE, _model_bytes(model, args, data, plan, pos["step"]), run_dir=run_dir,
                          generation=generation, what="model file")
    metrics = evaluate_model(model, data.test, data.classes, precision=precision, batch_size=args.eval_batch_size,
                             rank=env.rank, world=env.world_size)
    metrics.update(model=args.model, width=args.width, step=pos["step"], epochs=args.epochs,
                   samples_seen=pos["samples_seen"], world_size=env.world_size, precision=precision.name,
                   global_batch=plan.global_batch, bn_group=plan.group,
                   train_seconds_this_attempt=round(train_s, 3), restart=env.restart_count)
    if env.is_main:
        gate = ckpt.commit_gate(run_dir, generation, "metrics")
        ckpt.until_allowed(lambda: write_metrics(args.run_dir, metrics, before_replace=gate))
        print(format_table(metrics), flush=True)
        log.record("eval", None, kind="eval", accuracy=metrics["accuracy"],
                   per_class=metrics["per_class"], step=pos["step"])
    log.close()
    barrier()
    if env.is_main:
        ckpt.until_allowed(ckpt.commit_gate(run_dir, generation, "results upload"))  # an upload is a commit too
        upload_from_env(args.run_dir)  # results off the cluster; a failure is written to results-upload-failed
    return metrics


def _model_bytes(model: nn.Module, args: TrainerConfig, data: Cifar, plan: Batching, step: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "step": step,
                "config": {"model": args.model, "width": args.width, "num_classes": len(data.classes),
                           "bn_group": plan.group}}, buf)
    return buf.getvalue()
