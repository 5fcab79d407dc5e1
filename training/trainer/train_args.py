"""The trainer's command line (``python -m eks_ddp_trainer.train --help``): flags, defaults and their checks.

A bad flag or value exits CONFIG_ERROR (eks_ddp_runtime/exitcodes.py), never argparse's 2, so the Job does not
retry it.
"""

from __future__ import annotations

import argparse
import math
import sys

from eks_ddp_runtime import exitcodes
from eks_ddp_trainer.data import DEFAULT_BN_GROUP, DEFAULT_GLOBAL_BATCH, MIN_STEPS
from eks_ddp_trainer.model import DEFAULT_MODEL, DEFAULT_PRECISION, MODELS, PRECISIONS

DESCRIPTION = "Elastic DDP training of a CIFAR-10 classifier; the torchrun target."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        # argparse's own exit code 2 looks like any crash; a bad flag must not be retried.
        self.print_usage(sys.stderr)
        self.exit(exitcodes.CONFIG_ERROR, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="torchrun ... -m eks_ddp_trainer.train", description=DESCRIPTION)
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
    p.add_argument("--compile", action="store_true", help="torch.compile the model (training/trainer/wrap.py)")
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
