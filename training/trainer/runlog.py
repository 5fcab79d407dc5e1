"""Rank 0's training log: compact stdout lines and the same records as JSON in ``<run-dir>/history.jsonl``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

HISTORY_FILE = "history.jsonl"


class RunLog:
    """Rank 0's log: one compact stdout line per record, and the same record as JSON in history.jsonl."""

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool) -> None:
        self.enabled = enabled
        self.path = run_dir / HISTORY_FILE
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
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
        if self.tb is not None and event == "train" and fields.get("kind") == "step":
            for k in ("loss", "acc", "lr", "img_s"):
                self.tb.add_scalar(f"train/{k}", fields[k], fields["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
