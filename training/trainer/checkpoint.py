"""Crash-safe checkpoints on a shared volume.

Only global rank 0 writes. A checkpoint is written to a temp file in the same directory,
flushed and fsynced, then ``os.replace``d over its final name and the directory fsynced:
a reader sees either the whole file or nothing, whatever moment the writer dies at.
Loading walks from the newest file down; a file that does not load (written by something
else, a truncated copy) is renamed aside with a warning naming it, never deleted. When
checkpoints exist and none loads, the resume fails (:class:`CheckpointError`) rather than
silently training from scratch. Retention only ever deletes files older than the one just
written, so the newest valid checkpoint is never deleted.
"""

from __future__ import annotations

import io
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoints"
_NAME = re.compile(r"^ckpt-(\d{9})\.pt$")
FORMAT = 2
UNREADABLE_SUFFIX = ".unreadable"
REQUIRED = ("format", "model", "optimizer", "step", "epoch", "sample_in_epoch", "config")

# Test hook: pause rank 0 between writing the temp file and replacing, so a test can kill it mid-save.
PAUSE_STEP_ENV = "EKS_DDP_TEST_PAUSE_SAVE_STEP"
PAUSE_MARKER_ENV = "EKS_DDP_TEST_PAUSE_MARKER"
# Test hook: every checkpoint write takes this many seconds longer (a slow shared volume).
SLOW_SAVE_ENV = "EKS_DDP_TEST_SLOW_SAVE_S"


class CheckpointError(Exception):
    """Checkpoints exist but none can be loaded; the message names the files."""


def ckpt_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CKPT_DIR


def ckpt_path(run_dir: str | os.PathLike, step: int) -> Path:
    return ckpt_dir(run_dir) / f"ckpt-{step:09d}.pt"


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files, oldest first (by the step in the name, not mtime, which a copy can change)."""
    d = ckpt_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, before_replace=None) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename itself lives in the directory: without this a power cut could lose it on some filesystems.
    fsync_dir(path.parent)


def _pause_hook(step: int):
    want = os.environ.get(PAUSE_STEP_ENV)
    marker = os.environ.get(PAUSE_MARKER_ENV)
    if want is None or marker is None or int(want) != step or Path(marker).exists():
        return None

    def pause() -> None:
        Path(marker).write_text(str(os.getpid()))
        time.sleep(120)

    return pause


def save_checkpoint(run_dir: str | os.PathLike, state: dict[str, Any], *, keep: int) -> Path:
    """Write ``state`` (must hold ``step``) atomically and delete all but the newest ``keep`` checkpoints."""
    if keep < 1:
        raise ValueError(f"keep_checkpoints: got {keep}; expected >= 1")
    step = int(state["step"])
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buf)
    d = ckpt_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    # Temp files of a writer that was killed before its replace; only rank 0 writes, and it is us.
    for stale in d.glob(".ckpt-*.tmp-*"):
        stale.unlink(missing_ok=True)
    path = ckpt_path(run_dir, step)
    time.sleep(float(os.environ.get(SLOW_SAVE_ENV, "0")))
    atomic_write_bytes(path, buf.getvalue(), before_replace=_pause_hook(step))
    # Only files older than the one just written (a valid one) are candidates: a file with a higher
    # step is not ours to judge, and the newest valid checkpoint is never among those deleted.
    older = [p for p in list_checkpoints(run_dir) if _step_of(p) < step]
    for old in older[:max(0, len(older) - (keep - 1))]:
        old.unlink(missing_ok=True)
    return path


def same_run(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What differs between a checkpoint's run identity and this run's, as {key: (saved, now)}; {} when the
    checkpoint belongs to this run. Keys the checkpoint has and this run no longer counts (``epochs``, which
    older checkpoints held: the run resumes with the new count) are ignored."""
    return {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}


def _step_of(path: Path) -> int:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else -1


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    state = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(state, dict) or any(k not in state for k in REQUIRED):
        raise ValueError(f"{path}: not an eks-ddp checkpoint (missing keys)")
    if state["format"] != FORMAT:
        raise ValueError(f"{path}: checkpoint format {state['format']}; expected {FORMAT}")
    return state


def load_latest(run_dir: str | os.PathLike, map_location: str | torch.device = "cpu", *, set_aside: bool = False,
                allow_none_valid: bool = False) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that loads, or None when there is no checkpoint file at all.

    Unreadable files are logged by name (and with ``set_aside`` renamed to ``*.unreadable``, out of
    the way of retention). If there are checkpoint files and none loads, raises CheckpointError
    unless ``allow_none_valid`` (then returns None: train from scratch).
    """
    bad: list[Path] = []
    reasons: list[str] = []
    found = None
    for path in reversed(list_checkpoints(run_dir)):
        try:
            found = load_checkpoint(path, map_location), path
            break
        except Exception as e:  # any failure to load is reported with the file's name
            log.warning("unreadable checkpoint %s: %s", path, e)
            bad.append(path)
            reasons.append(f"{path}: {type(e).__name__}: {e}")
    if bad and found is None and not allow_none_valid:
        # Left in place: a retry must fail the same way, not find an empty folder and start over.
        raise CheckpointError("no readable checkpoint; unreadable: " + "; ".join(reasons))
    if set_aside:
        for path in bad:
            path.rename(path.with_name(path.name + UNREADABLE_SUFFIX))
    return found
