"""Counting the opens of committed durable checkpoints in real trainer processes (open_audit/sitecustomize.py)."""

from __future__ import annotations

import os
from pathlib import Path

AUDIT_DIR = Path(__file__).parent / "open_audit"
OPENS_ENV = "EKS_DDP_TEST_OPENS_FILE"


def audit_env(opens_file: Path, pythonpath: str | None = None) -> dict[str, str]:
    """What a process's environment needs for its committed-checkpoint opens to be counted into ``opens_file``."""
    rest = pythonpath if pythonpath is not None else os.environ.get("PYTHONPATH", "")
    return {OPENS_ENV: str(opens_file), "PYTHONPATH": os.pathsep.join(p for p in (str(AUDIT_DIR), rest) if p)}


def opens_after(opens_file: Path, t: float) -> list[tuple[float, int, str, str]]:
    """(time, pid, RANK, path) of every counted open at or after ``t``."""
    if not opens_file.exists():
        return []
    out = []
    for line in opens_file.read_text().splitlines():
        when, pid, rank, _mode, path = line.split(" ", 4)
        if float(when) >= t:
            out.append((float(when), int(pid), rank, path))
    return out
