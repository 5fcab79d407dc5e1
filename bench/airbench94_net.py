"""airbench94's network, re-implemented from its published description for side-by-side benchmarks.

Source: K. Jordan, "94% on CIFAR-10 in 3.29 Seconds on a Single GPU" (arXiv 2404.00498) and the
``airbench94.py`` script of github.com/KellerJordan/cifar10-airbench: a 2x2 patch-whitening conv
(24 channels, with bias, frozen weights) + GELU, three blocks of conv3x3 -> max-pool 2 -> BN -> GELU
-> conv3x3 -> BN -> GELU with widths 64, 256, 256, a 3x3 max-pool, a bias-free linear layer and a
1/9 logit scale. BatchNorm: momentum 0.4 (PyTorch's convention), eps 1e-12, frozen weight, learned
bias, kept in fp32 when the net runs in half precision. Used only by bench/, never by the trainer.
"""

from __future__ import annotations

import torch
from torch import nn


class _BN(nn.BatchNorm2d):
    def __init__(self, c: int) -> None:
        super().__init__(c, eps=1e-12, momentum=0.4)
        self.weight.requires_grad_(False)


class _Conv(nn.Conv2d):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(cin, cout, 3, padding="same", bias=False)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        w = self.weight.data
        nn.init.dirac_(w[:w.size(1)])


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1, self.pool, self.norm1 = _Conv(cin, cout), nn.MaxPool2d(2), _BN(cout)
        self.conv2, self.norm2, self.act = _Conv(cout, cout), _BN(cout), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.pool(self.conv1(x))))
        return self.act(self.norm2(self.conv2(x)))


class Airbench94Net(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        self.whiten = nn.Conv2d(3, 24, 2, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)
        self.body = nn.Sequential(nn.GELU(), _Block(24, width), _Block(width, 4 * width),
                                  _Block(4 * width, 4 * width), nn.MaxPool2d(3), nn.Flatten())
        self.head = nn.Linear(4 * width, num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.whiten(x))) / 9
