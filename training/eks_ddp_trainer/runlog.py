"""Rank 0's training log: compact stdout lines and the same records as JSON in ``<run-dir>/history.jsonl``.

The history is a result: a record is appended only while this world may commit (checkpoint.commit_gate: its
agent holds the lease and no newer world has fenced the run directory). Records made meanwhile wait in memory,
in order and with their own times, and are appended once commits are allowed again; a replaced world's are
never written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HISTORY_FILE = "history.jsonl"
PENDING_MAX = 100_000
"""Records kept in memory while commits wait (the oldest are dropped beyond it: ~10 minutes of steps)."""


class RunLog:
    """Rank 0's log: one compact stdout line per record, and the same record as JSON in history.jsonl."""

    gate: Callable[[], None] | None = None
    """Raises checkpoint.CommitRefused while this world may not append (set once the world is fenced)."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool) -> None:
        self.enabled = enabled
        self.path = run_dir / HISTORY_FILE
        self._pending: list[str] = []
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(run_dir / "tb"))
            except ImportError:
                print("[train] --tensorboard: the tensorboard package is not installed; not writing events",
                      flush=True)

    def record(self, event: str, line: str | None, **fields: Any) -> None:
        if not self.enabled:
            return
        if line is not None:
            print(f"[{event}] {line}", flush=True)
        self._pending.append(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
        del self._pending[:-PENDING_MAX]
        self.flush(wait=False)
        if self.tb is not None and event == "train" and fields.get("kind") == "step":
            for k in ("loss", "acc", "lr", "img_s"):
                self.tb.add_scalar(f"train/{k}", fields[k], fields["step"])

    def flush(self, wait: bool) -> None:
        """Append the records made so far, when this world may (with ``wait``: once it may)."""
        from .checkpoint import CommitRefused

        while self._pending:
            try:
                if self.gate is not None:
                    self.gate()
            except CommitRefused:
                if not wait:
                    return
                time.sleep(0.5)
                continue
            with open(self.path, "a") as f:
                f.write("".join(self._pending))
            self._pending.clear()

    def close(self) -> None:
        if self.enabled:
            self.flush(wait=True)
        if self.tb is not None:
            self.tb.close()
