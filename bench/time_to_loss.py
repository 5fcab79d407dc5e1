"""Default model vs the workshop's CNN, in the same run: CPU images/s and wall time to a fixed training loss.

    .venv/bin/python bench/time_to_loss.py [--target 0.5] [--out bench/time_to_loss.json]

Both run through the real trainer (one process, all cores, batch 64, each model's default
learning rate, no label smoothing so the losses are comparable cross-entropies) on the same
synthetic CIFAR-format set. Time is measured from the trainer's start record (model built,
data loaded) to the first log window whose mean loss is at or below the target. Each model gets
its own step budget (the CNN is ~100x cheaper per image, so it gets many more steps), and its
schedule spans that budget.
The workshop CNN is the PyTorch CIFAR tutorial's conv(3,6,5)-pool-conv(6,16,5)-pool-fc120-fc84-fc10.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from common import machine, run_trainer, synthetic


def one(model: str, data: Path, tmp: Path, target: float, max_steps: int, n_train: int) -> dict:
    run = tmp / model
    epochs = max(1, -(-max_steps * 64 // n_train))
    args = [f"--data-dir={data}", f"--run-dir={run}", f"--epochs={epochs}", "--batch-size=64", f"--model={model}",
            f"--max-steps={max_steps}", "--log-every=2", "--label-smoothing=0", "--checkpoint-every=100000"]
    hist = run_trainer([sys.executable], args, machine()["cores"] or 1, timeout_s=3600)
    start = next(r for r in hist if r.get("kind") == "start")
    steps = [r for r in hist if r.get("kind") == "step"]
    hit = next((r for r in steps if r["loss"] <= target), None)
    ev = next(r for r in hist if r.get("kind") == "eval")
    return {
        "img_s_median": round(statistics.median(r["img_s"] for r in steps[1:])),
        "seconds_to_target": None if hit is None else round(hit["time"] - start["time"], 1),
        "step_at_target": None if hit is None else hit["step"],
        "final_loss": round(steps[-1]["loss"], 4), "steps_run": steps[-1]["step"],
        "test_accuracy_at_end": round(ev["accuracy"], 4),
        "train_seconds": round(steps[-1]["time"] - start["time"], 1),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=float, default=0.5, help="training cross-entropy to reach")
    p.add_argument("--resnet-steps", type=int, default=80)
    p.add_argument("--cnn-steps", type=int, default=2400)
    p.add_argument("--n-train", type=int, default=2560)
    p.add_argument("--noise", type=float, default=90.0, help="synthetic-data noise (higher: harder)")
    p.add_argument("--out", default=str(Path(__file__).with_name("time_to_loss.json")))
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ttl-"))
    try:
        data = synthetic(tmp / "data", n_train=a.n_train, noise=a.noise)
        res = {"machine": machine(), "target_loss": a.target, "batch": 64, "data": f"synthetic n_train={a.n_train} "
               f"noise={a.noise}"}
        for model, steps in (("resnet-small", a.resnet_steps), ("workshop-cnn", a.cnn_steps)):
            res[model] = one(model, data, tmp, a.target, steps, a.n_train)
            print(model, json.dumps(res[model]), flush=True)
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
