"""The trainer's records, read as JSON, and the runner's console: prefixed agent lines and one status line.

Rank 0 of the trainer appends each record to ``<run-dir>/history.jsonl`` (training/eks_ddp_trainer/runlog.py):
``{"event": "train", "kind": "start", "world": W, "resumed_step": S, ...}``,
``{"event": "train", "kind": "step", "epoch": E, "step": S, "loss": L, "acc": A, "img_s": N, "world": W, ...}`` and
``{"event": "eval", "kind": "eval", ...}``. The local runner reads them from there (:class:`History`), not from the
log text, and prints every agent line it shows with an ``[agentN]`` prefix. The status line (step/total, loss,
images/s, world size, elapsed) is a rich ``Live`` display on a terminal, kept below the lines and erased at the end;
off a terminal (logs, CI) it is printed as a ``[progress] ...`` line after a step record every few seconds.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

Record = dict[str, Any]
"""One trainer record, as the trainer wrote it to history.jsonl."""


class History:
    """The records a run's history.jsonl gains from now on (the file may not exist yet; a resumed run's old records
    are not new). Each :meth:`read` returns the complete lines appended since the last one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self._partial = b""

    def read(self) -> list[Record]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out


_EXCEPTION = re.compile(r"^(?:\[[^\]]*\]:?\s*)*((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure))"
                        r"(?::\s?(.*))?$")
_TRAINER_USAGE = re.compile(r"eks_ddp_trainer\.train: error: (.*)$")
_ENOSPC = ("No space left on device", "[Errno 28]")
_START_FAILURE = "every worker failed before its first step with the same error:"
_REPEATED = re.compile(r"(\d+) rounds in a row failed with the same error before any step completed: (.*) at (\S+); "
                       r"a restart or a resume would repeat it")


def root_cause(line: str) -> str | None:
    """The one-line cause of a failure no retry can fix, when ``line`` states one; else None.

    The trainer reports those as ``[train] error: ...`` (exit codes in training/runtime/eks_ddp_runtime/exitcodes.py: a
    corrupt data file is named there) or as a usage error; a full disk shows as ENOSPC anywhere."""
    if "[train] error:" in line:
        return line.split("[train] error:", 1)[1].strip()
    m = _TRAINER_USAGE.search(line)
    if m:
        return f"bad trainer flag: {m.group(1).strip()}"
    if any(s in line for s in _ENOSPC):
        return f"disk full (ENOSPC): {line.strip()[-300:]}"
    return None


def start_failure(line: str) -> str | None:
    """The cause, when ``line`` is the launcher's start failure (eks_ddp_runtime/startfail.py: every worker of an
    agent failed the same way before its first step, or several rounds in a row failed with the same error at the
    same place before any step completed; the agent exits 2 without a restart); else None."""
    m = _REPEATED.search(line)
    if m:
        return (f"{m[2]} at {m[3]}, the same in {m[1]} rounds in a row before any step completed (a restart or a "
                f"resume would repeat it): fix it there and start the run again")
    if _START_FAILURE not in line:
        return None
    error = line.split(_START_FAILURE, 1)[1].split("; a restart would repeat it", 1)[0].strip()
    return f"every worker failed before its first step with {error} (a restart would repeat it)"


def exception_line(line: str) -> str | None:
    """``Type: message`` when ``line`` is the last line of a Python traceback, else None."""
    m = _EXCEPTION.match(line.strip())
    if not m:
        return None
    return f"{m.group(1)}: {(m.group(2) or '').strip()}"[:240].rstrip(": ")


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


@dataclass
class Progress:
    """Prefixed log lines plus one status line built from the latest step record."""

    total_steps: Callable[[int], int] | None = None
    """Steps the job will run at a world size (shown as step/total); None when unknown."""
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    tty: bool | None = None
    """Keep the status line below the lines, redrawn in place; default: whether the stream is a terminal."""
    started: float = field(default_factory=time.monotonic)
    last_step: Record | None = None
    note: str = ""
    """Extra text at the end of the status line (for example "worker killed, recovering")."""
    every_s: float = 5.0
    """Without a terminal, print the status line at most this often (and at the last step)."""
    _printed_at: float = float("-inf")
    _live: Live | None = None

    def __post_init__(self) -> None:
        # Text as the agents wrote it: no markup ("[agent0]" is not a style), no highlighting, no wrapping.
        self.console = Console(file=self.stream, force_terminal=self.tty, highlight=False, markup=False, emoji=False,
                               soft_wrap=True)
        if self.tty is None:
            self.tty = self.console.is_terminal

    def status(self) -> str:
        parts = []
        r = self.last_step
        if r is None:
            parts.append("waiting for the first step")
        else:
            world = r.get("world")
            total = f"/{self.total_steps(world)}" if self.total_steps and world else ""
            parts.append(f"step {r.get('step')}{total}")
            for key, fmt in (("epoch", "epoch {:.0f}"), ("loss", "loss {:.3f}"), ("acc", "acc {:.1%}"),
                             ("img_s", "{:,.0f} img/s"), ("world", "world {:.0f}")):
                if isinstance(r.get(key), (int, float)):
                    parts.append(fmt.format(r[key]))
        parts.append(format_duration(time.monotonic() - self.started))
        if self.note:
            parts.append(self.note)
        return "[progress] " + " | ".join(parts)

    def line(self, source: str, text: str) -> None:
        """Show one agent line."""
        self.console.print(f"[{source}] {text}")
        self.refresh()

    def record(self, record: Record) -> None:
        """Take one of the trainer's records: a step record updates the status line."""
        if record.get("kind") != "step":
            return
        self.last_step = record
        if self.tty:
            self.refresh()
        elif self._due(record):
            self.console.print(self.status())

    def _due(self, record: Record) -> bool:
        now = time.monotonic()
        world, step = record.get("world"), record.get("step")
        last = bool(self.total_steps and world and isinstance(step, int) and step >= self.total_steps(world))
        if last or now - self._printed_at >= self.every_s:
            self._printed_at = now
            return True
        return False

    def message(self, text: str) -> None:
        """A line from the runner itself."""
        self.console.print(f"[local] {text}")
        self.refresh()

    def refresh(self) -> None:
        """Redraw the status line (the elapsed time moves even when no line arrives); a terminal only."""
        if not self.tty:
            self.stream.flush()
            return
        status = Text(self.status(), style="bold")
        if self._live is None:
            self._live = Live(status, console=self.console, auto_refresh=False, transient=True,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start(refresh=True)
        else:
            self._live.update(status, refresh=True)

    def close(self) -> None:
        """Erase the status line (what follows is printed as plain lines)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        self.stream.flush()
