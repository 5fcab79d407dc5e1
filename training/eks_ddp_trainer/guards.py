"""Guards that stop a run instead of training on garbage: divergence checks, and the trainer's error type."""

from __future__ import annotations

import math

import torch
from torch import nn

from eks_ddp_runtime import exitcodes
from eks_ddp_runtime.dist import all_reduce_sum


class TrainerError(Exception):
    """An error a retry cannot fix; ``main`` prints the message and exits with ``code`` (training/runtime/eks_ddp_runtime/exitcodes.py)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


MAX_WEIGHT_CHANGE = 8.0
"""Divergence guard: the guarded weights (guarded_parameters) may not move by more than this multiple of
their norm within one --check-every window, at global batches up to 1,024 (weight_change_limit above).
Measured on CPU: healthy runs move them by at most 0.78 at batch <= 32 (airnet at 2.6x its default LR on
a tiny set; 0.01-0.4 at the defaults), and in the first windows at the default global batch 1,024 (the
490-step schedule, a noisy 10,240-image synthetic set) by 1.39-1.61 (bench/RESULTS.md) and 1.35-1.97
at width 16 (tests/trainer/test_guard_calibration.py): 8 leaves >= 4x headroom. --lr 5000 moves them by
128-1,900x in the first window, often into a dead network whose loss sits at ln(classes) and stays
finite, so a finite loss alone does not show it. (It was 2.0: healthy runs at batch 1,024 came within
1.0-1.25x of a FATAL exit.)"""


def weight_change_limit(global_batch: int) -> float:
    """The guard's limit at ``global_batch``. Above 1,024 images the recipe's LR grows with the square root
    of the batch (recipe.torch_lr), and so does a window's movement: the limit follows it."""
    return MAX_WEIGHT_CHANGE * max(1.0, math.sqrt(global_batch / 1024))


def tensors_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every floating-point tensor is finite, on this rank only (no collective: snapshot writers)."""
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def all_finite(model: nn.Module, *tensors: torch.Tensor) -> bool:
    """Whether every parameter, buffer and given tensor is finite, on every rank (one collective, one sync)."""
    vals = [t.detach().float().sum() for t in (*model.parameters(), *model.buffers(), *tensors) if t.is_floating_point()]
    bad = (~torch.isfinite(torch.stack(vals))).any().float().reshape(1) if vals else torch.zeros(1)
    return all_reduce_sum(bad).item() == 0


def check_divergence(step: int, loss_sum: torch.Tensor, trainable: list[nn.Parameter], before: torch.Tensor,
                     world: int, limit: float = MAX_WEIGHT_CHANGE) -> torch.Tensor:
    """Raise DIVERGED when the loss is non-finite or the weights jumped (``limit``) since the last check.

    Called every --check-every steps and before each save, not every step: it is one all-reduce and one
    host sync. Returns the weights now, the baseline for the next window.
    """
    now = flat_params(trainable)
    change = (now - before).norm() / before.norm().clamp_min(1e-12)
    stats = all_reduce_sum(torch.stack([loss_sum.double(), change.double()])).tolist()
    change_v = stats[1] / world  # the same on every rank: the weights are replicas
    if not math.isfinite(stats[0]) or not math.isfinite(change_v):
        raise TrainerError(exitcodes.DIVERGED, f"step {step}: the loss or the weights are not finite; the run "
                           "diverged (lower --lr). Checkpoints hold only finite states.")
    if change_v > limit:
        raise TrainerError(exitcodes.DIVERGED, f"step {step}: the weights moved by {change_v:.1f}x their norm "
                           f"since the previous check (limit {limit:.3g}); the run diverged "
                           "(lower --lr). Checkpoints hold only finite states.")
    return now


def guarded_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters whose relative change shows divergence: biases, BatchNorm affine parameters and linear
    layers. Convolution weights followed by BatchNorm are left out: the net does not depend on their scale,
    so their norm may legitimately jump (e.g. after a whitening layer on a low-rank data set)."""
    return [p for m in model.modules() for p in m.parameters(recurse=False)
            if p.requires_grad and (p.ndim <= 1 or isinstance(m, nn.Linear))]


def flat_params(params: list[nn.Parameter]) -> torch.Tensor:
    """A float32 copy of ``params`` as one vector (reshape: channels_last weights are not views of a flat one)."""
    return torch.cat([p.detach().float().reshape(-1) for p in params])
