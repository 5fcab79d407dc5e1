"""Rank 0's training log: compact stdout lines and the same records as JSON in ``<run-dir>/history.jsonl``.

The history is a result: a record is appended only while this world may commit (checkpoint.commit_gate: its
agent holds the lease and no newer world has fenced the run directory). Records made meanwhile wait in memory,
in order and with their own times, and are appended once commits are allowed again; a replaced world's are
never written.

The check reads the run's store (up to ``checkpoint.STORE_WAIT_S`` while it does not answer), so it runs on a
thread of its own, never on the training path: a store that hangs for minutes costs no step, only the records'
delay. An error the check raises there (``checkpoint.ReplacedElsewhere``: another store's world replaced this one)
is raised in the training thread at its next record.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
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
        self._pending: deque[tuple[int, str]] = deque(maxlen=PENDING_MAX)
        """(sequence number, line): the oldest are dropped beyond PENDING_MAX, whichever thread is appending."""
        self._seq = itertools.count()
        self._lock = threading.Lock()
        """Held while records are appended to the file (by the writer thread, or by :meth:`flush`)."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._writer: threading.Thread | None = None
        self._writing = False
        """Whether a writer thread runs (changed under ``_state`` only, with the check of what is pending)."""
        self._state = threading.Lock()
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
        if self._error is not None:
            e, self._error = self._error, None
            raise e
        if line is not None:
            print(f"[{event}] {line}", flush=True)
        self._pending.append((next(self._seq), json.dumps({"event": event, "time": time.time(), **fields}) + "\n"))
        with self._state:
            if not self._writing and not self._stop.is_set():
                self._writing = True
                self._writer = threading.Thread(target=self._write_loop, name="history-writer", daemon=True)
                self._writer.start()
        self._wake.set()
        if self.tb is not None and event == "train" and fields.get("kind") == "step":
            for k in ("loss", "acc", "lr", "img_s"):
                self.tb.add_scalar(f"train/{k}", fields[k], fields["step"])

    def _write_loop(self) -> None:
        """Runs while records wait, then ends (the next record starts another): a trainer that exits on an error
        (exitcodes.exit_process drains its side threads) never waits for an idle writer."""
        while True:
            self._wake.wait(0.5)  # also every half second: records refused earlier are retried
            self._wake.clear()
            try:
                if not self.flush(wait=False):
                    # Refused: checked again in half a second, not at every record (each check reads the run's store).
                    self._stop.wait(0.5)
            except BaseException as e:  # handed to the training thread at its next record
                self._error = e
                with self._state:
                    self._writing = False
                return
            with self._state:
                if not self._pending or self._stop.is_set():
                    self._writing = False
                    return

    def flush(self, wait: bool) -> bool:
        """Append the records made so far, when this world may (with ``wait``: once it may); False when refused."""
        from .checkpoint import CommitRefused

        with self._lock:
            while self._pending:
                try:
                    if self.gate is not None:
                        self.gate()
                except CommitRefused:
                    if not wait:
                        return False
                    time.sleep(0.5)
                    continue
                batch = list(self._pending)
                with open(self.path, "a") as f:
                    f.write("".join(line for _, line in batch))
                while self._pending and self._pending[0][0] <= batch[-1][0]:
                    self._pending.popleft()
        return True

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._writer is not None:
            self._writer.join()
        if self._error is not None:
            e, self._error = self._error, None
            raise e
        if self.enabled:
            self.flush(wait=True)
        if self.tb is not None:
            self.tb.close()
