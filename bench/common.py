"""Shared bits of the benchmarks: machine description, synthetic data, running the real trainer."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eks_ddp_trainer.data import write_synthetic_cifar  # noqa: E402


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu_model": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "gpu": gpu, "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}


def synthetic(dir_: Path, n_train: int, n_test: int = 500, noise: float = 60.0) -> Path:
    if not (dir_ / "cifar-10-batches-py" / "test_batch").exists():
        write_synthetic_cifar(dir_, n_train=n_train, n_test=n_test, seed=0, noise=noise)
    return dir_


def env(threads: int) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # keeps eks_ddp_runtime's
    e.update({"OMP_NUM_THREADS": str(threads), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"})
    return e


def run_trainer(cmd_prefix: list[str], args: list[str], threads: int, timeout_s: float) -> list[dict[str, Any]]:
    """Run eks_ddp_trainer.train (plain or under torchrun) to completion; return its history records."""
    run_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("--run-dir=")))
    proc = subprocess.run([*cmd_prefix, "-m", "eks_ddp_trainer.train", *args], cwd=ROOT, env=env(threads),
                          capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
    if proc.returncode != 0:
        raise RuntimeError(f"trainer failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
