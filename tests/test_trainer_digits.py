"""On a small real image set, the trainer's defaults beat logistic regression by a clear margin.

scikit-learn's handwritten digits (1,797 real 8x8 images, upsampled to 32x32, three channels) split
1,297 train / 500 test, stratified; the same split for both. The trainer gets only --data-dir and
--run-dir: every other setting is its default (model, width, global batch and its cap for small data
sets, learning rate, schedule, augmentation, BatchNorm calibration, test-time augmentation).
"""

from __future__ import annotations

import json

import pytest
import torch

from training import train
from training.data import load_cifar, write_digits_cifar

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


@pytest.mark.long  # 150 s on 2 cores: make test-long and bench/digits.py
def test_defaults_beat_logistic_regression_on_digits(tmp_path, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    write_digits_cifar(tmp_path / "data")
    baseline = logistic_regression_accuracy(tmp_path / "data")
    assert 0.95 < baseline < 0.985, baseline  # the reference figures: 96-97%

    run = tmp_path / "run"
    assert train.main([f"--data-dir={tmp_path / 'data'}", f"--run-dir={run}"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    print(f"[measure] digits trainer_accuracy={metrics['accuracy']:.4f} logistic_regression={baseline:.4f} "
          f"global_batch={metrics['global_batch']} steps={metrics['step']}")
    assert metrics["total"] == 500 and metrics["model"] == "airnet"
    # A clear margin: at most half the errors of logistic regression.
    assert 1 - metrics["accuracy"] <= 0.5 * (1 - baseline), (metrics["accuracy"], baseline)
