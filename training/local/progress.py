"""Reading the trainer's one-line records and showing a compact progress line.

The trainer (rank 0) logs ``[train] start world=W resumed_step=S run_dir=...``,
``[train] epoch=E step=S loss=L acc=A img_s=N world=W lr=X`` and ``[eval] acc=...``.
The local runner prefixes every agent line with ``[agentN]`` and keeps one status
line (step/total, loss, images/s, world size, elapsed) up to date: redrawn in place
on a terminal, otherwise printed after a step record every few seconds (logs, CI).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

_RECORD = re.compile(r"\[(train|eval)\]\s+(.*)$")
_FIELD = re.compile(r"([A-Za-z_][\w.]*)=(\S+)")


@dataclass(frozen=True)
class Record:
    """One trainer record: kind is "start", "step" or "eval"."""

    kind: str
    fields: dict[str, str]

    def num(self, key: str) -> float | None:
        try:
            return float(self.fields[key])
        except (KeyError, ValueError):
            return None

    def as_int(self, key: str) -> int | None:
        value = self.num(key)
        return None if value is None else int(value)


def parse_record(line: str) -> Record | None:
    """The record in a log line, or None for any other line (agent and torch chatter)."""
    m = _RECORD.search(line)
    if not m:
        return None
    tag, rest = m.groups()
    fields = dict(_FIELD.findall(rest))
    if tag == "eval":
        return Record("eval", fields)
    if rest.split(maxsplit=1)[:1] == ["start"]:
        return Record("start", fields)
    if "step" in fields:
        return Record("step", fields)
    return None


_EXCEPTION = re.compile(r"^(?:\[[^\]]*\]:?\s*)*((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure))"
                        r"(?::\s?(.*))?$")
_TRAINER_USAGE = re.compile(r"eks_ddp_trainer\.train: error: (.*)$")
_ENOSPC = ("No space left on device", "[Errno 28]")


def root_cause(line: str) -> str | None:
    """The one-line cause of a failure no retry can fix, when ``line`` states one; else None.

    The trainer reports those as ``[train] error: ...`` (exit codes in training/runtime/exitcodes.py: a
    corrupt data file is named there) or as a usage error; a full disk shows as ENOSPC anywhere."""
    if "[train] error:" in line:
        return line.split("[train] error:", 1)[1].strip()
    m = _TRAINER_USAGE.search(line)
    if m:
        return f"bad trainer flag: {m.group(1).strip()}"
    if any(s in line for s in _ENOSPC):
        return f"disk full (ENOSPC): {line.strip()[-300:]}"
    return None


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
    """Redraw the status line in place; default: whether the stream is a terminal."""
    started: float = field(default_factory=time.monotonic)
    last_step: Record | None = None
    note: str = ""
    """Extra text at the end of the status line (for example "worker killed, recovering")."""
    every_s: float = 5.0
    """Without a terminal, print the status line at most this often (and at the last step)."""
    _shown: bool = False
    _printed_at: float = float("-inf")

    def __post_init__(self) -> None:
        if self.tty is None:
            self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def status(self) -> str:
        parts = []
        r = self.last_step
        if r is None:
            parts.append("waiting for the first step")
        else:
            step = r.as_int("step")
            world = r.as_int("world")
            total = f"/{self.total_steps(world)}" if self.total_steps and world else ""
            parts.append(f"step {step}{total}")
            for key, fmt in (("epoch", "epoch {:.0f}"), ("loss", "loss {:.3f}"), ("acc", "acc {:.1%}"),
                             ("img_s", "{:,.0f} img/s"), ("world", "world {:.0f}")):
                value = r.num(key)
                if value is not None:
                    parts.append(fmt.format(value))
        parts.append(format_duration(time.monotonic() - self.started))
        if self.note:
            parts.append(self.note)
        return "[progress] " + " | ".join(parts)

    def line(self, source: str, text: str) -> Record | None:
        """Show one agent line; returns its record, if it is one."""
        record = parse_record(text)
        if record is not None and record.kind == "step":
            self.last_step = record
        self._clear()
        self.stream.write(f"[{source}] {text}\n")
        if record is not None and record.kind == "step" and not self.tty and self._due(record):
            self.stream.write(self.status() + "\n")
        self._draw()
        return record

    def _due(self, record: Record) -> bool:
        now = time.monotonic()
        world, step = record.as_int("world"), record.as_int("step")
        last = bool(self.total_steps and world and step is not None and step >= self.total_steps(world))
        if last or now - self._printed_at >= self.every_s:
            self._printed_at = now
            return True
        return False

    def message(self, text: str) -> None:
        """A line from the runner itself."""
        self._clear()
        self.stream.write(f"[local] {text}\n")
        self._draw()

    def refresh(self) -> None:
        """Redraw the status line (the elapsed time moves even when no line arrives)."""
        if self.tty:
            self._clear()
            self._draw()

    def close(self) -> None:
        self._clear()
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\r\033[K")
            self._shown = False

    def _draw(self) -> None:
        if self.tty:
            self.stream.write(self.status())
            self._shown = True
        self.stream.flush()
