"""airbench94's training loop, for the GPU check's headline ratio (bench/gpu_check.py item b).

``python bench/airbench94_loop.py --data-dir DIR --out FILE.json [--epochs 9.9]``: trains airbench94's network
(bench/airbench94_net.py) the way airbench94 does, on the same CIFAR-format files the trainer reads, and writes
images/s of the steps from ``--from-frac`` of training to the end (the steps after the trainer's Lookahead starts,
so both sides are timed over the same stretch of a run).

The loop follows the published recipe (K. Jordan, "94% on CIFAR-10 in 3.29 Seconds on a Single GPU", arXiv
2404.00498, sections 3.1-3.6, and the hyperparameters of github.com/KellerJordan/cifar10-airbench airbench94.py),
re-implemented here, not copied:

* the whole training set on the device as normalized fp16, channels_last; per epoch a fresh permutation, a random
  translation of up to 2 pixels (reflect padding) and alternating flips; batch 1,024, the last partial batch dropped;
* the network in fp16 (``.half()``) with BatchNorm in fp32, whitening from 2x2 patches of the first 5,000 images;
* Nesterov SGD, momentum 0.85, three groups (BatchNorm biases at a 64x learning rate, the whitening bias frozen
  after 3 epochs, the rest), weight decay, a triangular learning-rate schedule, label smoothing 0.2 with a summed
  loss, and a Lookahead-style pull toward an EMA of the weights every 5 steps.

No evaluation, no host sync inside the timed stretch (one ``synchronize`` where it starts and one where it ends),
no checkpoints, snapshots, divergence checks or logs: the reference a trainer with all of those is held against.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from airbench94_net import Airbench94Net  # noqa: E402

from eks_ddp_trainer.data import MEAN, STD, load_cifar  # noqa: E402

BATCH = 1024
LR, MOMENTUM, WD, BIAS_SCALER = 11.5, 0.85, 0.0153, 64.0
WHITEN_BIAS_EPOCHS = 3
LABEL_SMOOTHING = 0.2
EMA_EVERY = 5


def _epoch_images(padded: torch.Tensor, flip_bits: torch.Tensor, epoch: int, gen: torch.Generator) -> torch.Tensor:
    """The whole training set for one epoch, as airbench's loader makes it at each epoch's start: each image
    translated by up to 2 px (a 32x32 crop of the reflect-padded image) and mirrored where its bit differs from
    the epoch's parity (alternating flips)."""
    n, c = padded.shape[:2]
    dev = padded.device
    out = torch.empty(n, c, 32, 32, dtype=padded.dtype, device=dev)
    ar = torch.arange(32, device=dev)
    cidx = torch.arange(c, device=dev)[None, :, None, None]
    for a in range(0, n, 10_000):  # chunks bound the index tensors' memory
        b = min(n, a + 10_000)
        d = torch.randint(0, 5, (2, b - a), device=dev, generator=gen)
        rows = (d[0][:, None] + ar)[:, None, :, None]
        cols = (d[1][:, None] + ar)[:, None, None, :]
        flip = flip_bits[a:b] ^ bool(epoch % 2)
        cols = torch.where(flip[:, None, None, None], cols.flip(-1), cols)
        bidx = torch.arange(a, b, device=dev)[:, None, None, None]
        out[a:b] = padded[bidx, cidx, rows, cols]
    return out


def _whiten_init(conv: nn.Conv2d, x: torch.Tensor, eps: float = 5e-4) -> None:
    """Whitening weights from the eigenvectors of the 2x2 patch covariance (paper, section 3.2)."""
    c = x.shape[1]
    patches = x.float().unfold(2, 2, 1).unfold(3, 2, 1)  # (N, C, 31, 31, 2, 2)
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * 4)
    cov = torch.cov(patches.T)
    evals, evecs = torch.linalg.eigh(cov)
    filters = (evecs.T / torch.sqrt(evals + eps)[:, None]).reshape(-1, c, 2, 2)
    half = conv.weight.shape[0] // 2
    conv.weight.data[:half] = filters[-half:].to(conv.weight.dtype)
    conv.weight.data[half:] = -filters[-half:].to(conv.weight.dtype)


def _triangle(step: int, total: int, start: float = 0.2, peak: float = 0.23, end: float = 0.07) -> float:
    t = step / total
    return start + (1 - start) * t / peak if t < peak else 1 + (end - 1) * (t - peak) / (1 - peak)


def train(data_dir: str, epochs: float = 9.9, batch: int = BATCH, from_frac: float = 0.3, width: int = 64,
          limit: int | None = None) -> dict:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    half = torch.float16 if dev.type == "cuda" else torch.float32
    cifar = load_cifar(data_dir, dev)
    imgs, labels = cifar.train.images, cifar.train.labels
    if limit:
        imgs, labels = imgs[:limit], labels[:limit]
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1) * 255
    images = ((imgs.float() - mean) / std).to(half).contiguous(memory_format=torch.channels_last)
    model = Airbench94Net(width=width).to(dev, memory_format=torch.channels_last)
    _whiten_init(model.whiten, images[:5000])
    model = model.to(half)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.float()
    steps_per_epoch = len(labels) // batch
    total = max(1, math.ceil(epochs * steps_per_epoch))
    kilostep = batch * (1 + 1 / (1 - MOMENTUM))
    lr, wd = LR / kilostep, WD * batch / kilostep
    norm_biases = [p for n, p in model.named_parameters() if "norm" in n and p.requires_grad]
    whiten_bias = [model.whiten.bias]
    rest = [p for n, p in model.named_parameters() if "norm" not in n and "whiten" not in n and p.requires_grad]
    groups = [{"params": norm_biases, "lr": lr * BIAS_SCALER, "weight_decay": wd / BIAS_SCALER},
              {"params": whiten_bias, "lr": lr * BIAS_SCALER, "weight_decay": wd / BIAS_SCALER},
              {"params": rest, "lr": lr, "weight_decay": wd}]
    opt = torch.optim.SGD(groups, momentum=MOMENTUM, nesterov=True)
    for g in opt.param_groups:
        g["initial_lr"] = g["lr"]
    ema = [p.detach().clone() for p in model.state_dict().values() if p.is_floating_point()]
    live = [p for p in model.state_dict().values() if p.is_floating_point()]
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    padded = F.pad(images, (2, 2, 2, 2), mode="reflect")
    flip_bits = torch.rand(len(labels), device=dev, generator=gen) < 0.5
    timed_from = int(from_frac * total)
    step, images_timed, t0 = 0, 0, None
    model.train()
    epoch = 0
    while step < total:
        if epoch == WHITEN_BIAS_EPOCHS:
            opt.param_groups[1]["initial_lr"] = 0.0
        epoch_images = _epoch_images(padded, flip_bits, epoch, gen)
        perm = torch.randperm(len(labels), device=dev, generator=gen)
        for i in range(steps_per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            x, y = epoch_images[idx].contiguous(memory_format=torch.channels_last), labels[idx]
            if step == timed_from:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            for g in opt.param_groups:
                g["lr"] = g["initial_lr"] * _triangle(step, total)
            out = model(x)
            loss = F.cross_entropy(out.float(), y, label_smoothing=LABEL_SMOOTHING, reduction="sum")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step % EMA_EVERY == 0:
                decay = 0.95 ** EMA_EVERY * (step / total) ** 3
                with torch.no_grad():
                    torch._foreach_lerp_(ema, live, 1 - decay)
                    torch._foreach_copy_(live, ema)
            if t0 is not None:
                images_timed += len(y)
            if step >= total:
                break
        epoch += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - (t0 if t0 is not None else time.perf_counter())
    return {"device": str(dev), "steps": step, "timed_from_step": timed_from, "images_timed": images_timed,
            "seconds_timed": round(seconds, 4), "img_s": round(images_timed / seconds) if seconds > 0 else None,
            "batch": batch, "epochs": epochs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=float, default=9.9)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--from-frac", type=float, default=0.3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--limit", type=int, default=None, help="use only the first N training images (smoke tests)")
    a = p.parse_args(argv)
    result = train(a.data_dir, a.epochs, a.batch, a.from_frac, a.width, a.limit)
    a.out.write_text(json.dumps(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
