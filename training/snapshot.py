"""Node-local snapshots of the training state, and background writers, so that a crash redoes <= 1 step.

Durable checkpoints on the shared volume come every ``--checkpoint-every`` steps; resuming from them alone
redoes up to that many steps. So after every optimizer step each rank copies the full state (the same dict
a checkpoint holds) to CPU and a background thread writes it to a node-local file (``/dev/shm``, keyed by
the run directory and the rank), atomically. At most one write is in flight: a step whose predecessor is
still being written is skipped, the point being the newest available state, not every state. The worker
that dies loses nothing its peers do not still have on their own nodes: all ranks hold the same state.

On (re)start every rank reads its own snapshot, the ranks agree on the newest step (all_reduce MAX), and
the lowest rank that holds it broadcasts it to all; when no snapshot is newer than the durable checkpoint
the run resumes from that as before. A non-finite state is never written (checked in the writer thread).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import checkpoint as ckpt
from .dist import DistEnv
from .guards import tensors_finite

log = logging.getLogger(__name__)

DIR_ENV = "EKS_DDP_SNAPSHOT_DIR"
"""Where snapshots live (default /dev/shm, else the temp dir); ``off`` turns them off."""


def to_cpu(obj: Any) -> Any:
    """A deep copy of ``obj`` with every tensor copied to CPU (the live tensors keep training meanwhile)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        # From a GPU: an asynchronous copy into pinned memory, queued on the current stream (so it reads the
        # values of this step, before the next step changes them); Snapshots.offer waits for it off-thread.
        return t.to("cpu", non_blocking=True) if t.is_cuda else t.to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


class BackgroundWriter:
    """Runs one write at a time on a side thread; an error surfaces on the next ``submit``/``wait``."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, fn: Callable[[], None]) -> None:
        self.wait()

        def run() -> None:
            try:
                fn()
            except BaseException as e:  # handed to the training thread on wait()
                self._error = e

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def done_within(self, timeout_s: float) -> bool:
        """Whether the write in flight (if any) finishes within ``timeout_s``; its error surfaces on ``wait``."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return not self.busy()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            raise e


class Snapshots:
    """This rank's node-local snapshot file of one run."""

    def __init__(self, run_dir: Path, rank: int, root: str | None = None) -> None:
        root = os.environ.get(DIR_ENV) if root is None else root
        self.enabled = root != "off"
        if root is None:
            root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
        self.path = Path(root) / f"eks-ddp-{key}" / f"rank-{rank}.pt"
        self.writer = BackgroundWriter()

    def offer(self, state: Callable[[], dict[str, Any]]) -> bool:
        """Snapshot ``state()`` unless the previous write is still running; whether it was taken."""
        if not self.enabled or self.writer.busy():
            return False
        cpu = to_cpu(state())
        copied = None
        if torch.cuda.is_available() and any(t.is_pinned() for t in _tensors(cpu)):
            copied = torch.cuda.Event()
            copied.record()  # no host sync here: the writer thread waits for the copies to land

        def write() -> None:
            if copied is not None:
                copied.synchronize()
            self._write(cpu)

        self.writer.submit(write)
        return True

    def _write(self, cpu: dict[str, Any]) -> None:
        if not tensors_finite(_tensors(cpu)):
            log.warning("step %s: non-finite state; not snapshotted", cpu.get("step"))
            return
        buf = io.BytesIO()
        torch.save({"format": ckpt.FORMAT, **cpu}, buf)
        ckpt.atomic_write_bytes(self.path, buf.getvalue())

    def read(self, identity: dict[str, Any]) -> dict[str, Any] | None:
        """The snapshot of this run, or None (none, unreadable, or another run's)."""
        if not self.enabled or not self.path.exists():
            return None
        try:
            state = ckpt.load_checkpoint(self.path)
        except Exception as e:  # a snapshot is only a shortcut: fall back to the durable checkpoint
            log.warning("unreadable snapshot %s: %s", self.path, e)
            return None
        return state if state["config"].get("identity") == identity else None

    def remove(self) -> None:
        self.writer.wait()
        self.path.unlink(missing_ok=True)
        try:
            self.path.parent.rmdir()  # the run's folder, once the last rank on this node is done
        except OSError:
            pass


def agree(env: DistEnv, mine: dict[str, Any] | None, durable_step: int) -> dict[str, Any] | None:
    """The newest snapshot held by any rank, sent to all; None when none is newer than ``durable_step``."""
    step = int(mine["step"]) if mine is not None else -1
    if not env.distributed:
        return mine if step > durable_step else None
    dev = env.device
    best = torch.tensor([step], device=dev)
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    newest = int(best.item())
    if newest <= durable_step:
        return None
    holder = torch.tensor([env.rank if step == newest else env.world_size], device=dev)
    dist.all_reduce(holder, op=dist.ReduceOp.MIN)
    src = int(holder.item())
    box = [mine if env.rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]
