"""The bundled trainer's settings, declared once: this dataclass IS ``eks_ddp_trainer.train``'s command line.

The trainer's parser is generated from it (train_args.py: a field ``global_batch_size`` is the flag
``--global-batch-size``, its docstring the flag's help, a ``Literal`` its choices, a ``bool`` a switch), and the
library renders a job's flags from it (``TrainerConfig.flags()``, called by ``eks_ddp_runtime.launch_command.job_command``),
so the flags the cluster passes are the flags the trainer reads, with one set of defaults. Standard library only:
the infrastructure library imports this module without torch.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Literal, get_args

ModelName = Literal["airnet", "resnet-small", "resnet18", "workshop-cnn"]
"""The trainer's models (model.py builds them); the stack config's ``job.model`` takes the same names."""
MODELS: tuple[str, ...] = get_args(ModelName)
DEFAULT_MODEL: ModelName = "airnet"

PrecisionName = Literal["fp16", "bf16", "fp32"]
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)
DEFAULT_PRECISION: PrecisionName = "fp16"
"""airbench94 trains in fp16. bf16's 8-bit mantissa rounds the frozen whitening conv's operands ~10x more
coarsely (1.2% median / 4.8% worst-channel output error vs 0.1% / 1.0% for fp16), and no GPU A/B
says that costs nothing, so fp16 is the default on every GPU: autocast with fp32 master weights and, as in
airbench, no loss scaling. The loss is summed over the batch, so gradients are large, not small (the
largest is ~19 at initialisation: far from fp16's limits either way); a GradScaler would start
by skipping steps and read its overflow flag on the host every step. A non-finite loss or weight is
caught by the trainer's divergence check (DIVERGED), as any other divergence."""

DEFAULT_GLOBAL_BATCH = 1024
DEFAULT_BN_GROUP = 32
MIN_STEPS = 400
"""Fewest optimizer steps a run is planned with: on a small data set the global batch shrinks (in whole
BN groups) until the run has at least this many steps. airbench94 trains ~490 steps of 1,024 on CIFAR-10;
a 1,300-image set at batch 512 would get 30 steps, far too few to converge."""

WIDTH_MODELS = ("airnet", "resnet-small")
"""The models that take ``--width``."""

# Rendered into every command even at its default, so a pod's command line shows the run's shape (and the
# commands the stack has always run stay as they were).
_ALWAYS = {"always": True}


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """Arguments of ``python -m eks_ddp_trainer.train``; each field is the flag of the same name."""

    data_dir: str
    """directory containing cifar-10-batches-py"""
    run_dir: str
    """checkpoints, model.pt, metrics.json, history.jsonl"""
    epochs: int = field(default=10, metadata=_ALWAYS)
    """passes over the training set"""
    global_batch_size: int = field(default=DEFAULT_GLOBAL_BATCH, metadata=_ALWAYS)
    """images per optimizer step over all processes (a resize keeps it); capped so a run has at least
    --min-steps steps"""
    model: ModelName = field(default=DEFAULT_MODEL, metadata=_ALWAYS)
    """the network to train"""
    keep_checkpoints: int = field(default=3, metadata=_ALWAYS)
    """checkpoints kept in --run-dir, the newest"""
    seed: int = field(default=0, metadata=_ALWAYS)
    """seed of the initial weights, the data order and the augmentation"""
    lr: float | None = None
    """peak LR per 1,024 images (default: the model's recipe)"""
    compile: bool = False
    """torch.compile the model (training/eks_ddp_trainer/wrap.py)"""
    checkpoint_every: int | None = None
    """steps between checkpoints (default: once per epoch)"""
    log_every: int = 50
    """steps between log records"""
    max_steps: int | None = None
    """stop after this many optimizer steps"""
    width: int | None = None
    """airnet/resnet-small base width (default 64)"""
    bn_group: int = DEFAULT_BN_GROUP
    """images per unit in which a step's samples are dealt to the processes; the global batch is a multiple of
    it. BatchNorm statistics are those of the whole step"""
    min_steps: int = MIN_STEPS
    """shrink the global batch until the run has this many steps; 0: never"""
    label_smoothing: float = 0.2
    """label smoothing of the cross-entropy loss"""
    precision: PrecisionName = DEFAULT_PRECISION
    """autocast on a GPU (a CPU trains in fp32; fp16 as airbench94)"""
    check_every: int = 5
    """steps between checks that the loss is finite (one host sync each)"""
    eval_batch_size: int = 1000
    """images per batch of the final evaluation"""
    start_over: bool = False
    """set unreadable checkpoints aside and train from scratch instead of failing"""
    tensorboard: bool = False
    """also write TensorBoard events to <run-dir>/tb"""

    def flags(self) -> list[str]:
        """The command-line flags that give this configuration: ``--name=value`` for every field that differs
        from its default (and the run's shape always), ``--name`` for a switch that is on."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("always") or f.default is MISSING or value != f.default:
                flag = "--" + f.name.replace("_", "-")
                if isinstance(value, bool):
                    out += [flag] if value else []
                elif value is not None:
                    out.append(f"{flag}={value}")
        return out

    def problem(self) -> str | None:
        """The first value the trainer refuses, as ``--flag: got X; expected Y``; None when all are good.

        The trainer's parser exits CONFIG_ERROR with it. Not checked at construction: tests hand the trainer bad
        values on purpose to see it refuse them."""
        for name in ("epochs", "global_batch_size", "bn_group", "keep_checkpoints", "log_every", "check_every",
                     "checkpoint_every", "max_steps", "width", "eval_batch_size"):
            v = getattr(self, name)
            if v is not None and v < 1:
                return f"--{name.replace('_', '-')}: got {v}; expected >= 1"
        if self.min_steps < 0:
            return f"--min-steps: got {self.min_steps}; expected >= 0"
        if self.global_batch_size % self.bn_group:
            # Also below the group (e.g. 7 with the default 32): a step trains whole BatchNorm groups only.
            return (f"--global-batch-size: got {self.global_batch_size}; expected a multiple of --bn-group "
                    f"({self.bn_group}): a step trains whole BatchNorm groups (pass a --bn-group that divides it)")
        if self.lr is not None and not (0 < self.lr and math.isfinite(self.lr)):
            return f"--lr: got {self.lr}; expected a positive number"
        if not 0 <= self.label_smoothing < 1:
            return f"--label-smoothing: got {self.label_smoothing}; expected 0 <= x < 1"
        if self.width is not None and self.model not in WIDTH_MODELS:
            return f"--width applies to airnet and resnet-small only; got --model={self.model}"
        return None
