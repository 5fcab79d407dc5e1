"""Test-set evaluation: overall and per-class accuracy, shared by the trainer and the standalone command.

    python -m eks_ddp_trainer.evaluate --data-dir /shared/data --run-dir /shared/runs/<run-id>

reads ``<run-dir>/model.pt``, evaluates it on the test batch, prints the table and
(re)writes ``<run-dir>/metrics.json`` atomically.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from eks_ddp_runtime import exitcodes
from eks_ddp_runtime.dist import all_reduce_sum
from eks_ddp_trainer.checkpoint import atomic_write_bytes
from eks_ddp_trainer.data import DataError, Split, load_cifar, normalize
from eks_ddp_trainer.model import Precision, build_model, precision_for

MODEL_FILE = "model.pt"
METRICS_FILE = "metrics.json"


@torch.no_grad()
def evaluate_model(model: nn.Module, split: Split, classes: list[str], *, precision: Precision,
                   batch_size: int = 1000, rank: int = 0, world: int = 1, tta: bool = True) -> dict[str, Any]:
    """Accuracy over ``split``. With world > 1 each rank takes every world-th image and counts are summed."""
    was_training = model.training
    model.eval()
    dev = split.images.device
    n_cls = len(classes)
    correct = torch.zeros(n_cls, dtype=torch.float64, device=dev)
    total = torch.zeros(n_cls, dtype=torch.float64, device=dev)
    idx = torch.arange(rank, len(split), world, device=dev)
    for chunk in idx.split(batch_size):
        x = normalize(split.images[chunk]).contiguous(memory_format=torch.channels_last)
        y = split.labels[chunk]
        with precision.autocast(dev.type):
            logits = tta_logits(model, x) if tta else model(x).float()
        hit = (logits.argmax(1) == y).double()
        correct.index_add_(0, y, hit)
        total.index_add_(0, y, torch.ones_like(hit))
    all_reduce_sum(correct)
    all_reduce_sum(total)
    model.train(was_training)
    c, t = correct.cpu().tolist(), total.cpu().tolist()
    return {
        "accuracy": sum(c) / max(1.0, sum(t)),
        "correct": int(sum(c)),
        "total": int(sum(t)),
        "per_class": {name: (c[i] / t[i] if t[i] else None) for i, name in enumerate(classes)},
        "per_class_total": {name: int(t[i]) for i, name in enumerate(classes)},
    }


def _mirror(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (model(x).float() + model(x.flip(-1)).float())


def tta_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Flip-and-translate test-time augmentation (airbench's level 2, arXiv 2404.00498 section 3.7).

    Six views: the image and its mirror, unshifted (weight 1/2) and shifted one pixel up-left and
    down-right (1/4 each). The net was trained on mirrored and translated images, so it costs
    six forward passes and no training.
    """
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    h, w = x.shape[-2:]
    shifted = 0.5 * (_mirror(model, padded[..., :h, :w].contiguous(memory_format=torch.channels_last)) +
                     _mirror(model, padded[..., 2:, 2:].contiguous(memory_format=torch.channels_last)))
    return 0.5 * _mirror(model, x) + 0.5 * shifted


def format_table(metrics: dict[str, Any]) -> str:
    lines = [f"[eval] acc={metrics['accuracy']:.4f} correct={metrics['correct']} total={metrics['total']}",
             f"{'class':<12} {'acc':>7} {'n':>6}"]
    for name, acc in metrics["per_class"].items():
        shown = "-" if acc is None else f"{acc:.4f}"
        lines.append(f"{name:<12} {shown:>7} {metrics['per_class_total'][name]:>6}")
    return "\n".join(lines)


def write_metrics(run_dir: str | Path, metrics: dict[str, Any], *, before_replace=None) -> Path:
    path = Path(run_dir) / METRICS_FILE
    atomic_write_bytes(path, (json.dumps(metrics, indent=2, sort_keys=True) + "\n").encode(),
                       before_replace=before_replace)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eks_ddp_trainer.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True, help="directory containing cifar-10-batches-py")
    p.add_argument("--run-dir", required=True, help="run directory holding model.pt")
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--no-tta", action="store_true", help="no flip-and-translate test-time augmentation")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model_path = Path(args.run_dir) / MODEL_FILE
    if not model_path.exists():
        print(f"[eval] {model_path}: no final model (has the run finished?)", file=sys.stderr)
        return 2
    try:
        # Before the model: a data set that fails its integrity check is never unpickled (training/eks_ddp_trainer/integrity.py).
        data = load_cifar(args.data_dir, device, train=False)
    except (OSError, DataError) as e:
        print(f"[eval] data set: {e}", file=sys.stderr, flush=True)
        return exitcodes.BAD_INPUT
    saved = torch.load(model_path, map_location=device, weights_only=True)
    cfg = saved["config"]
    model = build_model(cfg["model"], cfg["num_classes"], cfg.get("width"))
    model.load_state_dict(saved["model"])
    model.to(device, memory_format=torch.channels_last)
    metrics = evaluate_model(model, data.test, data.classes, precision=precision_for(device),
                             batch_size=args.eval_batch_size, tta=not args.no_tta)
    metrics.update(model=cfg["model"], width=cfg.get("width"), step=saved.get("step"), source="eks_ddp_trainer.evaluate")
    print(format_table(metrics), flush=True)
    write_metrics(args.run_dir, metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
