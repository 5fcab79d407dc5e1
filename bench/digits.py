"""A small real image set: the trainer's defaults vs logistic regression and the workshop CNN.

    .venv/bin/python bench/digits.py [--out bench/digits.json]

scikit-learn's digits (1,797 real 8x8 images, bilinear to 32x32, three channels), split 1,297 train
/ 500 test (stratified, seed 0): eks_ddp_trainer.data.write_digits_cifar. The trainer runs with its
defaults (only --data-dir, --run-dir; ``--model workshop-cnn`` for the baseline), one process, all
cores; logistic regression (scikit-learn, standardised pixels) on the original 8x8 pixels. On this
small set the defaults cap the global batch to 32 (400 steps), so a third run lifts the cap
(``--min-steps=0 --epochs=200``: the default global batch of 1,024, the same 400 steps).
tests/trainer/test_digits.py asserts the same comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import machine, run_trainer

from eks_ddp_trainer.data import write_digits_cifar


def logistic_regression() -> float:
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    d = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(d.data, d.target, test_size=500, random_state=0, stratify=d.target)
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(x_tr, y_tr).score(x_te, y_te)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(Path(__file__).with_name("digits.json")))
    a = p.parse_args()
    res: dict = {"machine": machine(), "split": "1297 train / 500 test, stratified, seed 0"}
    res["logistic_regression_8x8"] = round(logistic_regression(), 4)
    tmp = Path(tempfile.mkdtemp(prefix="bench-digits-"))
    try:
        write_digits_cifar(tmp / "data")
        for name, extra in (("airnet (defaults)", []), ("workshop-cnn (defaults)", ["--model=workshop-cnn"]),
                            ("airnet (global batch 1024)", ["--min-steps=0", "--epochs=200"])):
            run = tmp / "".join(c if c.isalnum() else "-" for c in name)
            t = time.perf_counter()
            hist = run_trainer([sys.executable], [f"--data-dir={tmp / 'data'}", f"--run-dir={run}", *extra],
                               os.cpu_count() or 1, timeout_s=3600)
            ev = next(r for r in hist if r.get("kind") == "eval")
            start = next(r for r in hist if r.get("kind") == "start")
            res[name] = {"test_accuracy": round(ev["accuracy"], 4), "steps": ev["step"],
                         "global_batch": start["global_batch"], "wall_s": round(time.perf_counter() - t, 1)}
            print(name, json.dumps(res[name]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
