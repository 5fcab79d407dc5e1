"""Models, world-size-independent BatchNorm, and the precision policy.

``airnet`` (the default) is an airbench94-class network (Jordan, "94% on CIFAR-10 in 3.29 seconds
on a single GPU", arXiv 2404.00498), written for this trainer: a frozen 2x2 patch-whitening
convolution initialised from the training images (Page 2018), three conv groups
(conv, max-pool, BN, GELU, conv, BN, GELU) of widths w, 4w, 4w, identity (Dirac) initialised
convolutions, BatchNorm without a learned scale, a final max-pool and a linear head whose logits
are scaled by 1/9. ``--width`` is its base width w (64 by default; tests use a tiny one).
``resnet-small`` is the ResNet-9 of Myrtle.ai's DAWNBench entry, ``resnet18`` torchvision's
ResNet-18 with a 32x32 stem, ``workshop-cnn`` the PyTorch CIFAR tutorial's net (the baseline).

Every BatchNorm layer is a :class:`GhostBatchNorm`: training-mode statistics are taken over fixed
groups of ``bn_group`` consecutive samples, so what a sample's forward pass computes does not
depend on how many processes share the global batch (Hoffer et al. 2017, "Train longer,
generalize better"; Goyal et al. 2017 keep the BN batch per worker fixed for the same reason).
Running statistics are not tracked during training; :func:`calibrate_bn` computes them from
training images right before evaluation ("precise BN", Wu & Johnson 2021), so evaluation never
uses stale statistics.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("airnet", "resnet-small", "resnet18", "workshop-cnn")
DEFAULT_MODEL = "airnet"
WIDTHS = {"airnet": 64, "resnet-small": 64}
"""Default base width of the models that take ``--width``."""


# ---------------------------------------------------------------------------- BatchNorm

class GhostBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are per group of ``group`` consecutive samples.

    A batch of N samples holds N // group groups; the last group also takes the N % group
    samples left over (the trainer only ever leaves a remainder in an epoch's last group).
    Statistics are computed in float32 whatever the input dtype.
    """

    def __init__(self, num_features: int, group: int = 32, *, eps: float = 1e-5, learn_scale: bool = True) -> None:
        super().__init__(num_features, eps=eps, momentum=None)
        self.group = group
        self.calibrating = False
        self.weight.requires_grad_(learn_scale)
        self._calib_groups = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        n, g = x.shape[0], self.group
        if n == 0:
            return x
        k = n // g
        full = (k - 1) * g if n % g and k else k * g
        if full == n:
            return self._normalize(x, k)
        if not full:
            return self._normalize(x, 1)
        # The epoch's last group also holds the samples left over: normalised on its own statistics.
        return torch.cat([self._normalize(x[:full], full // g), self._normalize(x[full:], 1)])

    def _normalize(self, x: torch.Tensor, groups: int) -> torch.Tensor:
        xg = x.float().reshape(groups, -1, *x.shape[1:])  # (groups, samples, C, H, W), a view
        var, mean = torch.var_mean(xg, dim=(1, 3, 4), correction=0)
        if self.calibrating:
            self._accumulate(mean, var, xg[0, :, 0].numel())
        scale = torch.rsqrt(var + self.eps) * self.weight.float()
        shift = self.bias.float() - mean * scale
        y = xg * scale[:, None, :, None, None] + shift[:, None, :, None, None]
        return y.reshape(x.shape).to(x.dtype)

    @torch.no_grad()
    def _accumulate(self, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
        # Average of the per-group statistics over every group seen while calibrating (variance unbiased).
        k, n = mean.shape[0], self._calib_groups
        self.running_mean.mul_(n / (n + k)).add_(mean.sum(0) / (n + k))
        self.running_var.mul_(n / (n + k)).add_(var.sum(0) * (count / max(1, count - 1)) / (n + k))
        self._calib_groups += k


def ghost_batchnorm(module: nn.Module, group: int) -> nn.Module:
    """Replace every BatchNorm2d in ``module`` by a GhostBatchNorm of that group size, keeping its parameters."""
    for name, child in module.named_children():
        if isinstance(child, GhostBatchNorm):
            child.group = group
        elif isinstance(child, nn.BatchNorm2d):
            gbn = GhostBatchNorm(child.num_features, group, eps=child.eps, learn_scale=child.weight.requires_grad)
            with torch.no_grad():
                gbn.weight.copy_(child.weight)
                gbn.bias.copy_(child.bias)
            setattr(module, name, gbn)
        else:
            ghost_batchnorm(child, group)
    return module


@torch.no_grad()
def calibrate_bn(model: nn.Module, images: torch.Tensor, batch: int) -> None:
    """Set every GhostBatchNorm's running statistics from ``images`` (normalised, float) in training mode.

    Deterministic and free of communication: every rank calibrates on the same images and gets the
    same statistics.
    """
    bns = [m for m in model.modules() if isinstance(m, GhostBatchNorm)]
    if not bns:
        return
    was_training = model.training
    model.train()
    for m in bns:
        m.reset_running_stats()
        m._calib_groups = 0
        m.calibrating = True
    try:
        g = bns[0].group
        usable = len(images) // g * g or len(images)
        for chunk in images[:usable].split(max(g, batch // g * g)):
            model(chunk)
    finally:
        for m in bns:
            m.calibrating = False
        model.train(was_training)


# ---------------------------------------------------------------------------- airnet

class _Conv(nn.Conv2d):
    """3x3 'same' convolution, Dirac-initialised on its first in_channels filters (an implicit residual)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(cin, cout, 3, padding="same", bias=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        w = self.weight.data
        nn.init.dirac_(w[:w.size(1)])


class _ConvGroup(nn.Module):
    def __init__(self, cin: int, cout: int, group: int) -> None:
        super().__init__()
        self.conv1, self.pool = _Conv(cin, cout), nn.MaxPool2d(2)
        self.norm1 = GhostBatchNorm(cout, group, learn_scale=False)
        self.conv2 = _Conv(cout, cout)
        self.norm2 = GhostBatchNorm(cout, group, learn_scale=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.norm1(self.pool(self.conv1(x))))
        return F.gelu(self.norm2(self.conv2(x)))


class AirNet(nn.Module):
    WHITEN_K = 2

    def __init__(self, num_classes: int = 10, width: int = 64, group: int = 32) -> None:
        super().__init__()
        k = self.WHITEN_K
        cw = 2 * 3 * k * k  # each whitening direction and its negative
        self.whiten = nn.Conv2d(3, cw, k, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)
        nn.init.zeros_(self.whiten.bias)
        self.groups = nn.Sequential(_ConvGroup(cw, width, group), _ConvGroup(width, 4 * width, group),
                                    _ConvGroup(4 * width, 4 * width, group))
        self.head = nn.Linear(4 * width, num_classes, bias=False)
        self.scale = 1 / 9

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.groups(F.gelu(self.whiten(x)))
        x = F.max_pool2d(x, 3).flatten(1)
        return self.head(x) * self.scale

    @torch.no_grad()
    def init_whitening(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        """Set the frozen first layer to whiten 2x2 patches of ``images`` (normalised float, N x 3 x H x W)."""
        k = self.WHITEN_K
        x = images.float()
        patches = x.unfold(2, k, 1).unfold(3, k, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, 3 * k * k).double()
        cov = patches.T @ patches / len(patches)
        evals, evecs = torch.linalg.eigh(cov)
        filters = (evecs.T / torch.sqrt(evals.clamp_min(0) + eps)[:, None]).flip(0).reshape(-1, 3, k, k)
        self.whiten.weight.copy_(torch.cat([filters, -filters]).to(self.whiten.weight.dtype))

    def bn_bias_params(self) -> list[nn.Parameter]:
        return [m.bias for m in self.modules() if isinstance(m, GhostBatchNorm)]


# ---------------------------------------------------------------------------- other models

def _conv_bn(cin: int, cout: int, pool: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                               nn.ReLU(inplace=True)]
    if pool:
        layers.insert(1, nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class _Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(c, c), _conv_bn(c, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResNetSmall(nn.Module):
    """Myrtle.ai's ResNet-9: prep conv, three pooled stages (w, 2w, 4w, 8w), two residual blocks."""

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        w = width
        self.net = nn.Sequential(
            _conv_bn(3, w), _conv_bn(w, 2 * w, pool=True), _Residual(2 * w), _conv_bn(2 * w, 4 * w, pool=True),
            _conv_bn(4 * w, 8 * w, pool=True), _Residual(8 * w), nn.AdaptiveMaxPool2d(1), nn.Flatten())
        self.head = nn.Linear(8 * w, num_classes, bias=False)
        self.scale = 0.125

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x)) * self.scale


class WorkshopCNN(nn.Module):
    """conv(3,6,5)-pool-conv(6,16,5)-pool-fc120-fc84-fc10, as in the PyTorch CIFAR-10 tutorial."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Sequential(nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                                        nn.Linear(84, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _resnet18(num_classes: int) -> nn.Module:
    import torchvision  # imported lazily: it adds ~2 s to every worker start, which recovery time pays

    m = torchvision.models.resnet18(num_classes=num_classes)
    # 32x32 inputs: a 7x7/2 stem plus max-pool would leave 8x8 maps after the stem; keep full resolution.
    m.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    m.maxpool = nn.Identity()
    return m


def build_model(name: str, num_classes: int = 10, width: int | None = None, bn_group: int = 32) -> nn.Module:
    if width is not None and name not in WIDTHS:
        raise ValueError(f"--width applies to {', '.join(WIDTHS)} only; got --model={name} --width={width}")
    if name == "airnet":
        return AirNet(num_classes, width or WIDTHS[name], bn_group)
    if name == "resnet-small":
        return ghost_batchnorm(ResNetSmall(num_classes, width or WIDTHS[name]), bn_group)
    if name == "resnet18":
        return ghost_batchnorm(_resnet18(num_classes), bn_group)
    if name == "workshop-cnn":
        return WorkshopCNN(num_classes)
    raise ValueError(f"--model: got {name!r}; expected one of {', '.join(MODELS)}")


# ---------------------------------------------------------------------------- precision

@dataclass(frozen=True)
class Precision:
    """Autocast dtype (None: full fp32) and whether fp16 needs a GradScaler."""

    dtype: torch.dtype | None
    use_scaler: bool

    def autocast(self, device_type: str):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.dtype)

    @property
    def name(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]


def precision_for(device: torch.device) -> Precision:
    if device.type != "cuda":
        # CPU autocast is slower than fp32 for these convs on most CPUs; keep CPU runs exact.
        return Precision(None, False)
    if torch.cuda.is_bf16_supported(including_emulation=False):
        return Precision(torch.bfloat16, False)
    # T4 (sm_75) has no bf16: fp16 with loss scaling.
    return Precision(torch.float16, True)
