"""Stop mid-epoch and resume vs an uninterrupted run, against this checkout or another one.

    .venv/bin/python bench/exactness.py [--tree DIR]

The check of tests/trainer/test_exact.py::test_stop_mid_epoch_and_resume_is_bit_identical_to_uninterrupted,
run as plain processes so that it works on any checkout of the trainer (``git worktree add DIR dc9e592``
for the trainer the review measured): 100 synthetic images, batch 16 (7 steps an epoch), 3 epochs; one
run straight through, one stopped at step 10 (inside the second epoch) and started again on its run
directory. Prints the largest absolute weight difference between the two final models (0.0: the resumed
run is the run that would have happened).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, env, synthetic

from tests.support.etcd_server import max_weight_diff


def _train(tree: Path, flags: list[str]) -> None:
    e = {**env(threads=1), "PYTHONPATH": str(tree), "EKS_DDP_SNAPSHOT_DIR": "off"}
    proc = subprocess.run([sys.executable, "-m", "eks_ddp_trainer.train", *flags], cwd=tree, env=e, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"eks_ddp_trainer.train {' '.join(flags)} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
                         f"{proc.stderr[-3000:]}")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tree", type=Path, default=ROOT, help="a checkout of the trainer (default: this one)")
    a = p.parse_args()
    tree = a.tree.resolve()
    helptext = subprocess.run([sys.executable, "-m", "eks_ddp_trainer.train", "--help"], cwd=tree, capture_output=True,
                              text=True, env={**env(threads=1), "PYTHONPATH": str(tree)}).stdout
    # The trainer's own names for "16 images a step" and "a tiny model".
    batch = (["--global-batch-size=16", "--bn-group=4", "--min-steps=0"] if "--global-batch-size" in helptext
             else ["--batch-size=16"])
    tmp = Path(tempfile.mkdtemp(prefix="bench-exact-"))
    data = synthetic(tmp / "data", n_train=100, n_test=40)

    def flags(run: Path, *extra: str) -> list[str]:
        return [f"--data-dir={data}", f"--run-dir={run}", "--epochs=3", *batch, "--width=4", "--log-every=50", *extra]

    _train(tree, flags(tmp / "straight"))
    _train(tree, flags(tmp / "stopped", "--max-steps=10"))
    _train(tree, flags(tmp / "stopped"))
    diff = max_weight_diff(tmp / "straight", tmp / "stopped")
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"tree {tree} ({commit}): stop at step 10 and resume vs uninterrupted: max |dw| = {diff:.3g}")
    return 0 if diff == 0.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
