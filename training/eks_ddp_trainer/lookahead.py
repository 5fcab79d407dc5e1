"""Lookahead with an exponential moving average of the weights (hlb-CIFAR10, airbench94 section 3.5).

Every ``every`` steps once ``start`` of training has passed (airbench: epoch 3 of 9.9), the average moves toward the weights and the weights
are set to the average; the average's decay rises over training (``decay_base**every * progress**power``),
so training moves fast early and averages strongly at the end. After the last step of training the
weights are set to the average (airbench's final ``decay=1`` update). ``reset_each_epoch`` also does that
at every epoch's end, which the trainer did before 2026-11-24 (it discards most of an epoch's last
steps' updates, 11 of 490 at the defaults); off by default, as in airbench. Every rank holds the same replicas and does the same arithmetic, so the result
does not depend on the world size; the average is part of the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class LookaheadConfig:
    start: float = 0.3
    every: int = 5
    decay_base: float = 0.95
    power: float = 3.0
    reset_each_epoch: bool = False
    """Set the weights to the average at every epoch's end too (not airbench's)."""


class Lookahead:
    def __init__(self, model: nn.Module, cfg: LookaheadConfig) -> None:
        self.cfg = cfg
        self.params = [p for p in model.parameters() if p.is_floating_point()]
        self.average: list[torch.Tensor] | None = None

    @torch.no_grad()
    def after_step(self, step: int, total_steps: int) -> None:
        """Call after the optimizer step that made the step count ``step``."""
        if step >= self.cfg.start * total_steps and not step % self.cfg.every:
            if self.average is None:
                self.average = [p.detach().clone() for p in self.params]
            else:
                self._pull(self.cfg.decay_base ** self.cfg.every * (step / total_steps) ** self.cfg.power)
        if step == total_steps and self.average is not None:
            self._pull(1.0)  # the end of training: the weights are the average

    @torch.no_grad()
    def end_of_epoch(self) -> None:
        if self.cfg.reset_each_epoch and self.average is not None:
            self._pull(1.0)

    def _pull(self, decay: float) -> None:
        average = self.average
        if average is None:  # no average yet: nothing to pull towards
            return
        torch._foreach_lerp_(average, [p.detach() for p in self.params], 1 - decay)
        for p, a in zip(self.params, average, strict=True):
            p.copy_(a)

    def state_dict(self) -> list[torch.Tensor] | None:
        """The average itself, on its device (no copy, no host sync): the caller copies it (snapshot.HostCopy)."""
        return None if self.average is None else [a.detach() for a in self.average]

    def load_state_dict(self, state: list[torch.Tensor] | None) -> None:
        if state is None:
            self.average = None
        else:
            self.average = [s.to(p.device, p.dtype).clone() for s, p in zip(state, self.params, strict=True)]
            # Keep the parameters' memory format (channels_last) so the in-place copies stay cheap.
            self.average = [torch.empty_like(p).copy_(a) for p, a in zip(self.params, self.average, strict=True)]
