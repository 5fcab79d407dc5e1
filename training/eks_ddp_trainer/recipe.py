"""The optimisation recipes: per-model hyperparameters, the LR schedule, and the optimizer.

Everything here is a function of the global batch and the model, never of the number of processes,
so an elastic resize leaves the optimisation unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from eks_ddp_trainer.lookahead import LookaheadConfig
from eks_ddp_trainer.model import AirNet


@dataclass(frozen=True)
class Recipe:
    """Per-model hyperparameters in airbench's decoupled form (arXiv 2404.00498, airbench94.py).

    ``lr`` and ``weight_decay`` are per 1,024 examples and independent of the momentum; the loss is
    summed over the batch, so the step grows with the batch: Goyal et al.'s linear scaling rule
    (arXiv 1706.02677) up to REFERENCE_BATCH, square-root scaling above it.
    """

    lr: float
    weight_decay: float
    momentum: float
    bn_bias_lr_scale: float = 1.0
    """airnet: BatchNorm biases learn 64x faster (their scales are frozen)."""
    whiten_bias_epochs: int = 0
    """airnet: the whitening layer's bias trains for this many epochs, then stays fixed."""
    lookahead: LookaheadConfig | None = None
    """airnet: Lookahead toward an EMA of the weights (training/eks_ddp_trainer/lookahead.py)."""


RECIPES = {
    "airnet": Recipe(lr=11.5, weight_decay=0.0153, momentum=0.85, bn_bias_lr_scale=64.0, whiten_bias_epochs=3,
                     lookahead=LookaheadConfig()),
    # SGD 0.9 at lr 0.4, wd 5e-4 per 512 images, the usual CIFAR ResNet recipe, in the same units.
    "resnet-small": Recipe(lr=8.8, weight_decay=0.0044, momentum=0.9),
    "resnet18": Recipe(lr=8.8, weight_decay=0.0044, momentum=0.9),
    "workshop-cnn": Recipe(lr=1.1, weight_decay=0.0044, momentum=0.9),
}
REFERENCE_BATCH = 1024
FP16_INIT_SCALE = 16.0
"""fp16 (T4): the GradScaler's first loss scale. The loss is summed over the global batch, so gradients are
large already: at initialisation the largest is ~19 at 1,024 images (measured 2026-11-24), growing about
linearly with the batch. torch's default 65,536 overflows fp16 (max 65,504) and skips the first ~5 steps
while it halves; 16 leaves >= 200x headroom at 1,024 images and still >= 6x at 32,768. The scaler only
grows after 2,000 clean steps, more than a default run has."""
# One-cycle triangle (airbench94's): from START up to 1 at PEAK of training, then down to END.
LR_START, LR_PEAK, LR_END = 0.2, 0.23, 0.07


def lr_factor(progress: float) -> float:
    """The one-cycle triangle: LR_START -> 1 at LR_PEAK of training -> LR_END at the end."""
    progress = min(max(progress, 0.0), 1.0)
    if progress < LR_PEAK:
        return LR_START + (1 - LR_START) * progress / LR_PEAK
    return 1 + (LR_END - 1) * (progress - LR_PEAK) / (1 - LR_PEAK)


def torch_lr(recipe_lr: float, momentum: float, global_batch: int) -> float:
    """PyTorch SGD's per-example LR (summed loss) for a peak LR per 1,024 images; square root above 1,024."""
    per_example = recipe_lr / (REFERENCE_BATCH * (1 + 1 / (1 - momentum)))
    return per_example * min(1.0, math.sqrt(REFERENCE_BATCH / global_batch))


def build_optimizer(model: nn.Module, recipe: Recipe, lr: float, global_batch: int) -> torch.optim.SGD:
    """SGD (Nesterov) with three groups: BatchNorm biases, the whitening bias, the rest. Each group's
    ``base_lr`` is its peak LR; ``weight_decay`` is set so each step decays by the same amount in every group."""
    base = torch_lr(lr, recipe.momentum, global_batch)
    decay = recipe.weight_decay * global_batch / (REFERENCE_BATCH * (1 + 1 / (1 - recipe.momentum)))
    bn_bias = [p for n, p in model.named_parameters() if p.requires_grad and _is_bn_bias(model, n)]
    whiten = [model.whiten.bias] if isinstance(model, AirNet) else []
    taken = {id(p) for p in bn_bias + whiten}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
    groups = []
    for name, params, scale in (("bn_bias", bn_bias, recipe.bn_bias_lr_scale), ("whiten_bias", whiten, 1.0),
                                ("rest", rest, 1.0)):
        if params:
            lr_g = base * scale
            groups.append({"params": params, "name": name, "lr": lr_g, "base_lr": lr_g, "weight_decay": decay / lr_g})
    return torch.optim.SGD(groups, lr=base, momentum=recipe.momentum, nesterov=True)


def _is_bn_bias(model: nn.Module, name: str) -> bool:
    mod_name, _, leaf = name.rpartition(".")
    return leaf == "bias" and isinstance(model.get_submodule(mod_name), nn.BatchNorm2d)
