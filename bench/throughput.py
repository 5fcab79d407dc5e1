"""Images/s of the default model (resnet-small, width 64) running the real trainer.

    .venv/bin/python bench/throughput.py [--steps 12] [--batch-size 64] [--out bench/throughput.json]

CPU, one process (all cores); CPU, two processes under torchrun with DDP over gloo (one
thread each); GPU when one is present (else reported as not measured). The first log
window (warm-up: first iterations, allocator) is left out.
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


def measure(prefix: list[str], threads: int, data: Path, tmp: Path, name: str, steps: int, batch: int,
            extra: list[str] | None = None) -> dict:
    run = tmp / name
    shutil.rmtree(run, ignore_errors=True)
    args = [f"--data-dir={data}", f"--run-dir={run}", "--epochs=100", f"--batch-size={batch}",
            f"--max-steps={steps}", "--log-every=2", "--checkpoint-every=100000", *(extra or [])]
    hist = run_trainer(prefix, args, threads, timeout_s=1800)
    windows = [r["img_s"] for r in hist if r.get("kind") == "step"][1:]
    start = next(r for r in hist if r.get("kind") == "start")
    return {"img_s_median": round(statistics.median(windows)), "img_s_windows": [round(w) for w in windows],
            "world": start["world"], "threads_per_process": threads, "batch_per_process": batch, "steps": steps}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", default=str(Path(__file__).with_name("throughput.json")))
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tp-"))
    try:
        data = synthetic(tmp / "data", n_train=4096)
        torchrun = str(Path(sys.executable).parent / "torchrun")
        cores = machine()["cores"] or 1
        res = {"machine": machine(), "model": "resnet-small width=64 (default)"}
        res["cpu_1proc"] = measure([sys.executable], cores, data, tmp, "cpu1", a.steps, a.batch_size)
        res["cpu_2proc_ddp_gloo"] = measure([torchrun, "--standalone", "--nproc-per-node=2"], 1, data, tmp, "cpu2",
                                            a.steps, a.batch_size)
        import torch

        if torch.cuda.is_available():
            res["gpu_1proc"] = measure([sys.executable], 4, data, tmp, "gpu1", 60, 512)
        else:
            res["gpu_1proc"] = "not measured: no GPU available"
        print(json.dumps(res, indent=2))
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
