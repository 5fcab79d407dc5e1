"""Node-local snapshots of the training state, and background writers, so that a crash redoes <= 1 step.

Durable checkpoints on the shared volume come every ``--checkpoint-every`` steps; resuming from them alone
redoes up to that many steps. So after an optimizer step each rank copies the full state (the same dict
a checkpoint holds) to CPU and a background thread writes it to a node-local file (``/dev/shm``, keyed by
the run directory and the rank), atomically. At most one write is in flight: a step whose predecessor is
still being written is skipped, the point being the newest available state, not every state. The worker
that dies loses nothing its peers do not still have on their own nodes: all ranks hold the same state.

Cost on a GPU (bench/snapshot_cost.py). The copies go into pinned host buffers allocated once and reused
(the writer is idle whenever they are refilled), queued on the training stream, and the training thread
never waits for them: the writer thread does (a CUDA event). They still take stream time, so a snapshot is
taken only when the previous one's copies took at most SNAPSHOT_BUDGET of the wall time since it began:
with ~15 MiB of device state (~0.8 ms over PCIe) and 12 ms steps that is one snapshot every ~3 steps, so
a crash redoes at most a few steps and the copies cost <= 3% of step time. The final step of a run (or of
``--max-steps``) is always snapshotted, after the previous write has finished.

Every copy to the host (these snapshots and the durable checkpoints alike) is a HostCopy: its ``wait``
returns once the device-to-host copies have landed, and nothing is serialised before that.

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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from eks_ddp_runtime.dist import DistEnv
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.guards import tensors_finite

log = logging.getLogger(__name__)

DIR_ENV = "EKS_DDP_SNAPSHOT_DIR"
"""Where snapshots live (default /dev/shm, else the temp dir); ``off`` turns them off."""


SNAPSHOT_BUDGET = 0.03
"""Largest share of wall time the per-step snapshot's copies may take (they run on the training stream)."""

_clock = time.monotonic  # a test replaces it to step time by hand


def to_cpu(obj: Any, into: Any = None) -> Any:
    """A deep copy of ``obj`` with every tensor copied to CPU (the live tensors keep training meanwhile).

    ``into``: a previous result of the same shape whose tensors are reused as the destination (preallocated
    buffers); a tensor without a matching buffer gets a new one. From a GPU the copy is asynchronous, into
    pinned memory, queued on the current stream (so it reads the values of this step, before the next step
    changes them): wait for it with HostCopy.wait before reading the result.
    """
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if (isinstance(into, torch.Tensor) and into.shape == t.shape and into.dtype == t.dtype
                and into.stride() == t.stride() and into.is_pinned() == t.is_cuda):
            return into.copy_(t, non_blocking=t.is_cuda)
        if t.is_cuda:
            return torch.empty_like(t, device="cpu", pin_memory=True).copy_(t, non_blocking=True)
        return t.to("cpu", copy=True)
    if isinstance(obj, dict):
        same_keys = into if isinstance(into, dict) else {}
        return {k: to_cpu(v, same_keys.get(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        reuse = into if isinstance(into, (list, tuple)) and len(into) == len(obj) else [None] * len(obj)
        return type(obj)(to_cpu(v, r) for v, r in zip(obj, reuse, strict=True))
    return obj


class HostCopy:
    """A CPU copy of a state dict, and the fence that says its device-to-host copies have landed.

    Pinned results come from asynchronous copies: an event recorded after them on the current stream is
    waited for in ``wait`` (by the thread that serialises, never by the training thread).
    """

    def __init__(self, state: Any, into: Any = None, *, timed: bool = False) -> None:
        self.started = _clock()
        self._start_event = None
        cuda = torch.cuda.is_available()
        if timed and cuda:
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
        self.state = to_cpu(state, into)
        self.host_s = _clock() - self.started
        self._event = None
        if cuda and any(t.is_pinned() for t in _tensors(self.state)):
            self._event = torch.cuda.Event(enable_timing=self._start_event is not None)
            self._event.record()  # no host sync here: wait() (on the writer thread) waits for it

    def wait(self) -> float:
        """Block until the copies have landed; returns the seconds they took (stream time on a GPU)."""
        if self._event is None:
            return self.host_s
        self._event.synchronize()
        if self._start_event is not None:
            return max(self.host_s, self._start_event.elapsed_time(self._event) / 1000)
        return self.host_s


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
        self._buffers: Any = None
        self._next_at = float("-inf")

    def offer(self, state: Callable[[], dict[str, Any]], *, final: bool = False) -> bool:
        """Snapshot ``state()`` unless the previous write is still running or the copy budget is spent;
        whether it was taken. ``final``: always, after waiting for the previous write (the run's last step)."""
        if not self.enabled:
            return False
        if final:
            self.writer.wait()
        elif self.writer.busy() or _clock() < self._next_at:
            return False
        started = _clock()
        copy = HostCopy(state(), self._buffers, timed=True)
        self._buffers = copy.state  # reused by the next snapshot: the writer is done with them by then


        def write() -> None:
            # The copies' cost: queueing them (on CPU: doing them) and, on a GPU, their time on the stream.
            cost = copy.wait()
            # The next snapshot starts no earlier than this one's copies allow within SNAPSHOT_BUDGET.
            self._next_at = started + cost / SNAPSHOT_BUDGET
            self._write(copy.state)

        self.writer.submit(write)
        return True

    def _write(self, cpu: dict[str, Any]) -> None:
        if not tensors_finite(_tensors(cpu)):
            log.warning("step %s: non-finite state; not snapshotted", cpu.get("step"))
            return
        buf = io.BytesIO()
        torch.save({"format": ckpt.FORMAT, **cpu}, buf)
        try:
            ckpt.atomic_write_bytes(self.path, buf.getvalue())
        except OSError as e:
            # A full or failing node-local disk (/dev/shm is small on some nodes) loses a shortcut, not the run:
            # training goes on with durable checkpoints only.
            self.enabled = False
            log.error("step %s: node-local snapshot %s failed (%s); snapshots are off for the rest of this run",
                      cpu.get("step"), self.path, e)

    def read(self, identity: dict[str, Any], lineage: ckpt.Lineage | None = None) -> dict[str, Any] | None:
        """The snapshot of this run, or None (none, unreadable, another run's, or off ``lineage``: written by a
        world that a newer one replaced, after the state the newer one restored; checkpoint.py)."""
        if not self.enabled or not self.path.exists():
            return None
        try:
            state = ckpt.load_checkpoint(self.path)
        except Exception as e:  # a snapshot is only a shortcut: fall back to the durable checkpoint
            log.warning("unreadable snapshot %s: %s", self.path, e)
            return None
        if not ckpt.on_lineage(lineage, state):
            log.warning("snapshot %s (world %s, step %s) is not on the run's lineage %s: not used", self.path,
                        ckpt.generation_of(state), state["step"], lineage)
            return None
        return state if ckpt.same_run(state["config"].get("identity", {}), identity) == {} else None

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
