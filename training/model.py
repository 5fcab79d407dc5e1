"""Models and the precision policy.

``resnet-small`` is the ResNet-9 of the fast CIFAR-10 training line (Myrtle.ai's DAWNBench
entry, later airbench): prep conv, three stages with a max-pool each, residual blocks after
the first and last stage, global max-pool, a scaled linear head. ``--width`` is its base
channel count (64 by default; stages use width, 2x, 4x, 8x), so tests can run a tiny one.
``resnet18`` is torchvision's ResNet-18 with a 32x32 stem. ``workshop-cnn`` is the PyTorch
CIFAR tutorial's net, kept as the baseline the benchmarks compare against.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

MODELS = ("resnet-small", "resnet18", "workshop-cnn")
DEFAULT_WIDTH = 64


def _conv_bn(cin: int, cout: int, pool: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                               nn.ReLU(inplace=True)]
    if pool:
        # Pool after the non-linearity: the ResNet-9 ordering that trains fastest.
        layers.insert(1, nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class _Residual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(c, c), _conv_bn(c, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResNetSmall(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = DEFAULT_WIDTH) -> None:
        super().__init__()
        w = width
        self.net = nn.Sequential(
            _conv_bn(3, w),
            _conv_bn(w, 2 * w, pool=True), _Residual(2 * w),
            _conv_bn(2 * w, 4 * w, pool=True),
            _conv_bn(4 * w, 8 * w, pool=True), _Residual(8 * w),
            nn.AdaptiveMaxPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(8 * w, num_classes, bias=False)
        # Scaling the logits down keeps early training stable at the high learning rates these nets use.
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
    if name == "resnet-small":
        return ResNetSmall(num_classes, width or DEFAULT_WIDTH)
    if width is not None and width != DEFAULT_WIDTH:
        raise ValueError(f"--width applies to resnet-small only; got --model={name} --width={width}")
    if name == "resnet18":
        return _resnet18(num_classes)
    if name == "workshop-cnn":
        return WorkshopCNN(num_classes)
    raise ValueError(f"--model: got {name!r}; expected one of {', '.join(MODELS)}")


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
