"""The divergence guard does not trip on a healthy run at the default global batch (review 2026-11-24, F3).

The guard (training/eks_ddp_trainer/guards.py) fails the run (exit 4, FATAL for the Job) when the guarded weights move by
more than MAX_WEIGHT_CHANGE x their norm in one --check-every window. It was calibrated at batch <= 32; at
the default 1,024 a healthy run moved by 1.35-1.61 in its first windows against a limit of 2. Here the
trainer runs the default recipe's 490-step schedule at global batch 1,024 on a 10,240-image synthetic set
(noisy, as the review's probe) and every window must leave at least 3x headroom.
"""

from __future__ import annotations

import pytest
import torch

from eks_ddp_trainer import guards, train
from eks_ddp_trainer.data import write_synthetic_cifar

N_TRAIN, BATCH, HEADROOM = 10_240, 1024, 3.0

pytestmark = pytest.mark.usefixtures("in_process_trainer")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_synthetic_cifar(d, n_train=N_TRAIN, n_test=20, seed=0, noise=250.0)
    return d


def _windows(data_dir, run, monkeypatch, *extra: str) -> list[float]:
    """The guarded weights' relative change in every --check-every window of a run."""
    seen: dict[int, float] = {}
    real = train.check_divergence

    def probe(step, loss_sum, trainable, before, world, *a):
        # The final save checks again right after the last window (change 0): keep each step's first check.
        now = guards.flat_params(trainable)
        seen.setdefault(step, float((now - before).norm() / before.norm()))
        return real(step, loss_sum, trainable, before, world, *a)

    monkeypatch.setattr(train, "check_divergence", probe)
    epochs = 490 * BATCH // N_TRAIN  # the default run's 490 steps: the same LR schedule and warm-up
    assert train.main([f"--data-dir={data_dir}", f"--run-dir={run}", f"--epochs={epochs}",
                       f"--global-batch-size={BATCH}", "--min-steps=0", "--eval-batch-size=20", "--log-every=1000",
                       "--checkpoint-every=1000", *extra]) == 0
    return list(seen.values())


def _assert_headroom(windows: list[float], count: int) -> None:
    print(f"[measure] guard windows at global batch {BATCH}: {[round(w, 3) for w in windows]}, "
          f"limit {guards.MAX_WEIGHT_CHANGE}")
    assert len(windows) == count
    assert all(w > 0.05 for w in windows), "the windows must measure training, not nothing"
    worst = max(windows)
    assert HEADROOM * worst <= guards.MAX_WEIGHT_CHANGE, f"{worst:.3f}: less than {HEADROOM}x headroom"


def test_guard_leaves_3x_headroom_at_the_default_global_batch_short(data_dir, tmp_path, monkeypatch):
    """The first two windows (the largest: the biases start at zero), at width 16 to stay short."""
    torch.manual_seed(0)
    _assert_headroom(_windows(data_dir, tmp_path / "run", monkeypatch, "--width=16", "--max-steps=10"), 2)


@pytest.mark.long
def test_guard_leaves_3x_headroom_at_the_default_global_batch_default_model(data_dir, tmp_path, monkeypatch):
    """The default model, four windows (the review's probe: 1.389, 1.613, 0.618, 0.528)."""
    _assert_headroom(_windows(data_dir, tmp_path / "run", monkeypatch, "--max-steps=20"), 4)
