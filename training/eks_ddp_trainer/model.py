"""Models, world-size-independent BatchNorm, and the precision policy.

``airnet`` (the default) is an airbench94-class network (Jordan, "94% on CIFAR-10 in 3.29 seconds
on a single GPU", arXiv 2404.00498), written for this trainer: a frozen 2x2 patch-whitening
convolution initialised from the training images (Page 2018), three conv groups
(conv, max-pool, BN, GELU, conv, BN, GELU) of widths w, 4w, 4w, identity (Dirac) initialised
convolutions, BatchNorm without a learned scale, a final max-pool and a linear head whose logits
are scaled by 1/9. ``--width`` is its base width w (64 by default; tests use a tiny one).
``resnet-small`` is the ResNet-9 of Myrtle.ai's DAWNBench entry, ``resnet18`` torchvision's
ResNet-18 with a 32x32 stem, ``workshop-cnn`` the PyTorch CIFAR tutorial's net (the baseline).

Every BatchNorm layer is a :class:`StepBatchNorm`: in training its statistics are those of the whole
optimizer step (the global batch), as in airbench94, at any world size. One process computes them
with one fused ``F.batch_norm`` (cuDNN on a GPU); when several processes share the step
(:func:`sync_batchnorm` on), each all-reduces its per-channel count, sum and sum of squares (float64)
once per layer, forward and backward, so a sample's forward pass does not depend on how many
processes share the step (an elastic resize keeps the optimisation) beyond float summation order.
Running statistics are not tracked during training; :func:`calibrate_bn` computes them from
training images right before evaluation ("precise BN", Wu & Johnson 2021), so evaluation never
uses stale statistics.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eks_ddp_trainer.config import DEFAULT_PRECISION, MODELS, PRECISIONS, WIDTH_MODELS

WIDTHS = dict.fromkeys(WIDTH_MODELS, 64)
"""Default base width of the models that take ``--width``."""


# ---------------------------------------------------------------------------- BatchNorm

AIRNET_BN_EPS = 1e-12
"""airbench94's BatchNorm epsilon."""


class StepBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are those of the whole optimizer step over every process.

    ``sync`` off (one process): plain ``F.batch_norm`` over the batch, fused. ``sync`` on: the
    per-channel count, sum and sum of squares of this process's part are all-reduced over the default
    process group (autograd-aware), so every process normalises with the statistics of the step's
    whole batch; ``contributes`` off (a process that holds no sample of the step and trains on a
    stand-in batch with loss weight 0) adds nothing to them.
    """

    def __init__(self, num_features: int, *, eps: float = 1e-5, learn_scale: bool = True) -> None:
        super().__init__(num_features, eps=eps, momentum=None)
        self.weight.requires_grad_(learn_scale)
        self.sync = False
        self.contributes = True
        self.calibrating = False
        self._calib: list[torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        if self.calibrating:
            self._accumulate(x)
        if self.sync:
            return _synced_fn()(x, self.weight, self.bias, self.eps, self.contributes)
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

    @torch.no_grad()
    def _accumulate(self, x: torch.Tensor) -> None:
        xf = x.double()
        part = torch.stack([xf.sum((0, 2, 3)), (xf * xf).sum((0, 2, 3))])
        n = torch.tensor(float(x.numel() // x.shape[1]), dtype=torch.float64, device=x.device)
        if self._calib is None:
            self._calib = [n, part]
        else:
            self._calib = [self._calib[0] + n, self._calib[1] + part]

    @torch.no_grad()
    def _finish_calibration(self) -> None:
        if self._calib is None:
            return
        n, (s1, s2) = self._calib[0], self._calib[1]
        mean = s1 / n
        var = (s2 / n - mean * mean).clamp_min(0) * (n / (n - 1).clamp_min(1))
        self.running_mean.copy_(mean)
        self.running_var.copy_(var)
        self._calib = None


@functools.cache
def _synced_fn():
    # A collective: under --compile one explicit graph break, run eagerly. Wrapped on first use, because
    # torch.compiler.disable imports torch._dynamo (~1 s), which the trainer imports on a side thread.
    return torch.compiler.disable(_synced_batch_norm)


def _synced_batch_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                       contributes: bool) -> torch.Tensor:
    from torch.distributed.nn.functional import all_reduce

    c = x.shape[1]
    xf = x.float()
    var, mean = torch.var_mean(xf, dim=(0, 2, 3), correction=0)
    n = x.numel() // c
    m = mean.double()
    # Per-channel sum and sum of squares from this process's (accurate, fp32) mean and variance, in float64
    # so that combining the parts loses nothing to cancellation.
    part = torch.cat([m * n, (var.double() + m * m) * n, m.new_full((1,), float(n))])
    total = all_reduce(part * (1.0 if contributes else 0.0))
    count = total[-1].clamp_min(1)
    g_mean = total[:c] / count
    g_var = (total[c:2 * c] / count - g_mean * g_mean).clamp_min(0)
    scale = (torch.rsqrt(g_var + eps) * weight.double()).float()
    shift = (bias.double() - g_mean * scale.double()).float()
    return (xf * scale[None, :, None, None] + shift[None, :, None, None]).to(x.dtype)


def step_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every plain BatchNorm2d in ``module`` by a StepBatchNorm, keeping its parameters and eps."""
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d) and not isinstance(child, StepBatchNorm):
            bn = StepBatchNorm(child.num_features, eps=child.eps, learn_scale=child.weight.requires_grad)
            with torch.no_grad():
                bn.weight.copy_(child.weight)
                bn.bias.copy_(child.bias)
            setattr(module, name, bn)
        else:
            step_batchnorm(child)
    return module


def sync_batchnorm(model: nn.Module, sync: bool, *, contributes: bool = True) -> None:
    """Whether the BatchNorm statistics are all-reduced over the processes (``sync``), and whether this
    process's part of the step counts in them (``contributes``). Called by the trainer for each step."""
    for m in model.modules():
        if isinstance(m, StepBatchNorm):
            m.sync, m.contributes = sync, contributes


@torch.no_grad()
def calibrate_bn(model: nn.Module, images: torch.Tensor, batch: int) -> None:
    """Set every StepBatchNorm's running statistics to the population statistics of ``images`` (normalised,
    float), fed through the model in training mode in chunks of ``batch`` (variance unbiased).

    Deterministic and free of communication: every rank calibrates on the same images and gets the
    same statistics.
    """
    bns = [m for m in model.modules() if isinstance(m, StepBatchNorm)]
    if not bns:
        return
    was_training = model.training
    saved = [(m.sync, m.contributes) for m in bns]
    model.train()
    for m in bns:
        m.reset_running_stats()
        m._calib = None
        m.calibrating, m.sync = True, False
    try:
        for chunk in images.split(max(1, batch)):
            model(chunk)
        for m in bns:
            m._finish_calibration()
    finally:
        for m, (sync, contributes) in zip(bns, saved, strict=True):
            m.calibrating, m.sync, m.contributes = False, sync, contributes
            m._calib = None
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
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1, self.pool = _Conv(cin, cout), nn.MaxPool2d(2)
        self.norm1 = StepBatchNorm(cout, eps=AIRNET_BN_EPS, learn_scale=False)
        self.conv2 = _Conv(cout, cout)
        self.norm2 = StepBatchNorm(cout, eps=AIRNET_BN_EPS, learn_scale=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.norm1(self.pool(self.conv1(x))))
        return F.gelu(self.norm2(self.conv2(x)))


class AirNet(nn.Module):
    WHITEN_K = 2

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        k = self.WHITEN_K
        cw = 2 * 3 * k * k  # each whitening direction and its negative
        self.whiten = nn.Conv2d(3, cw, k, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)
        nn.init.zeros_(self.whiten.bias)
        self.groups = nn.Sequential(_ConvGroup(cw, width), _ConvGroup(width, 4 * width),
                                    _ConvGroup(4 * width, 4 * width))
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


def build_model(name: str, num_classes: int = 10, width: int | None = None) -> nn.Module:
    if width is not None and name not in WIDTHS:
        raise ValueError(f"--width applies to {', '.join(WIDTHS)} only; got --model={name} --width={width}")
    if name == "airnet":
        return AirNet(num_classes, width or WIDTHS[name])
    if name == "resnet-small":
        return step_batchnorm(ResNetSmall(num_classes, width or WIDTHS[name]))
    if name == "resnet18":
        return step_batchnorm(_resnet18(num_classes))
    if name == "workshop-cnn":
        return WorkshopCNN(num_classes)
    raise ValueError(f"--model: got {name!r}; expected one of {', '.join(MODELS)}")


# ---------------------------------------------------------------------------- precision

@dataclass(frozen=True)
class Precision:
    """Autocast dtype (None: full fp32) and whether a GradScaler scales the loss (no policy uses one now)."""

    dtype: torch.dtype | None
    use_scaler: bool

    def autocast(self, device_type: str):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.dtype)

    @property
    def name(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]


def precision_for(device: torch.device, name: str = DEFAULT_PRECISION) -> Precision:
    """The autocast policy of ``--precision`` on ``device``; a CPU always trains in fp32 (exact, and CPU
    autocast is slower than fp32 for these convs on most CPUs)."""
    if name not in PRECISIONS:
        raise ValueError(f"--precision: got {name!r}; expected one of {', '.join(PRECISIONS)}")
    if device.type != "cuda" or name == "fp32":
        return Precision(None, False)
    if name == "bf16":
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            raise ValueError(f"--precision=bf16: {torch.cuda.get_device_name(device)} has no bf16; use fp16")
        return Precision(torch.bfloat16, False)
    return Precision(torch.float16, False)
