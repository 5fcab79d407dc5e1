"""On a small real image set, the trainer's defaults beat logistic regression by a clear margin.

scikit-learn's handwritten digits (1,797 real 8x8 images, upsampled to 32x32, three channels) split
1,297 train / 500 test, stratified; the same split for both. The trainer gets only --data-dir and
--run-dir: every other setting is its default (model, width, global batch and its cap for small data
sets, learning rate, schedule, augmentation, BatchNorm calibration, test-time augmentation).

On 1,297 images the defaults cap the global batch to 32 (so that the run has --min-steps=400 steps), so a
second case lifts the cap (--min-steps=0) and trains at the default global batch of 1,024 for 200 epochs:
the same 400 steps (one of 1,024 images and one of 256 per epoch, the rest of the 1,280 in whole groups),
with the learning rate, warm-up, divergence guard and whole-step BatchNorm statistics that a CIFAR-10 run
at the defaults uses. Both must have at most half of logistic regression's test errors.
"""

from __future__ import annotations

import json

import pytest
import torch

from eks_ddp_trainer import train
from eks_ddp_trainer.data import load_cifar, write_digits_cifar

pytestmark = pytest.mark.slow


def logistic_regression_accuracy(data_dir) -> float:
    """Best of logistic regression on the original 8x8 pixels and on the 32x32 images the trainer sees."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    d = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(d.data, d.target, test_size=500, random_state=0, stratify=d.target)
    small = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(x_tr, y_tr).score(x_te, y_te)
    data = load_cifar(data_dir, torch.device("cpu"))
    xs, xt = (s.images[:, 0].reshape(len(s), -1).float().numpy() / 255 for s in (data.train, data.test))
    big = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(xs, data.train.labels.numpy())
    return max(small, big.score(xt, data.test.labels.numpy()))


# (flags beyond --data-dir/--run-dir, the global batch the run must use, its steps)
CASES = {
    "defaults": ([], 32, 400),
    "global-batch-1024": (["--min-steps=0", "--epochs=200"], 1024, 400),
}


# make test-long and bench/digits.py: ~1 min (defaults) and ~10 min (global batch 1,024) on 2 cores (RESULTS.md)
@pytest.mark.long
@pytest.mark.parametrize("case", list(CASES))
def test_defaults_beat_logistic_regression_on_digits(case, tmp_path, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    write_digits_cifar(tmp_path / "data")
    baseline = logistic_regression_accuracy(tmp_path / "data")
    assert 0.95 < baseline < 0.985, baseline  # the reference figures: 96-97%

    flags, global_batch, steps = CASES[case]
    run = tmp_path / "run"
    assert train.main([f"--data-dir={tmp_path / 'data'}", f"--run-dir={run}", *flags]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    print(f"[measure] digits case={case} trainer_accuracy={metrics['accuracy']:.4f} "
          f"logistic_regression={baseline:.4f} global_batch={metrics['global_batch']} steps={metrics['step']}")
    assert metrics["total"] == 500 and metrics["model"] == "airnet"
    assert (metrics["global_batch"], metrics["step"]) == (global_batch, steps), metrics
    # A clear margin: at most half the errors of logistic regression.
    assert 1 - metrics["accuracy"] <= 0.5 * (1 - baseline), (metrics["accuracy"], baseline)
