"""Runs the trainer with each rank logging the sample indices of every step it trains (coverage tests).

    torchrun ... tests/support/sample_log.py <trainer flags>      (EKS_DDP_SAMPLE_LOG=<path prefix>)

Each rank appends one JSON line per step, ``{"pos": <sample position in the epoch>, "idx": [...]}``,
to ``<prefix>.<rank>``. Only the trainer's public helper ``rank_indices`` is wrapped.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

LOG_ENV = "EKS_DDP_SAMPLE_LOG"
ORIGINAL = None


def install(path: str | Path) -> None:
    from eks_ddp_trainer import train

    global ORIGINAL
    orig = ORIGINAL = ORIGINAL or train.rank_indices

    def logged(perm, pos, *args, **kwargs):
        idx, span = orig(perm, pos, *args, **kwargs)
        with open(path, "a") as f:
            f.write(json.dumps({"pos": int(pos), "idx": idx.tolist()}) + "\n")
        return idx, span

    train.rank_indices = logged


def per_epoch(paths: list[Path], first_epoch: int = 0) -> dict[int, list[int]]:
    """Samples by epoch from per-rank logs of one process group: a step at position 0 starts a new epoch."""
    out: dict[int, list[int]] = {}
    for path in paths:
        epoch = first_epoch
        for n, line in enumerate(path.read_text().splitlines()):
            rec = json.loads(line)
            if rec["pos"] == 0 and n > 0:
                epoch += 1
            out.setdefault(epoch, []).extend(rec["idx"])
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    install(f"{os.environ[LOG_ENV]}.{os.environ.get('RANK', '0')}")
    from eks_ddp_trainer import train

    raise SystemExit(train.main(sys.argv[1:]))
