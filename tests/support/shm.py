"""What a local run keeps in memory: its own folders under /dev/shm (eks_ddp_local.cli)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from eks_ddp_local.job import shm_root


def run_shm(run_id: str) -> list[Path]:
    """The run's own folders in /dev/shm (else the temp folder): its node-local snapshots and the agents' leases."""
    return list(Path(shm_root() or tempfile.gettempdir()).glob(f"eks-ddp-local-{run_id}-*"))
