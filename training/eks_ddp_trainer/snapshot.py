"""Node-local snapshots of the training state, and background writers, so that a crash redoes <= 1 step.

Durable checkpoints on the shared volume come every ``--checkpoint-every`` steps; resuming from them alone
redoes up to that many steps. So after an optimizer step the node's local rank 0 copies the full state (the same
dict a checkpoint holds) to CPU and a background thread writes it to the node's one snapshot file
(``/dev/shm/eks-ddp-<run key>/node.snap``: a JSON header with step, generation, run identity, size and SHA-256,
then the ``torch.save`` payload), atomically. The state is replicated, so one copy per node is enough: the node's
other ranks write nothing. At most one write is in flight: a step whose predecessor is still being written is
skipped, the point being the newest available state, not every state. The worker that dies loses nothing its
peers do not still have on their own nodes.

The replace holds the old and the new copy at once, so a node snapshots a state of at most half its ``/dev/shm``
(a quarter of the training pod's memory request: components/eks_ddp/workloads/elastic_job/pods.py). A copy that
does not fit is not written: the run's log gets one line, ``[snapshot] step N: node-local snapshot ... not written:
the node's copy of the state (X GiB) does not fit ...``, and snapshots stay off for that world.

Cost on a GPU (bench/snapshot_cost.py). The copies go into pinned host buffers allocated once and reused
(the writer is idle whenever they are refilled), queued on the training stream, and the training thread
never waits for them: the writer thread does (a CUDA event). They still take stream time, so a snapshot is
taken only when the previous one's copies took at most SNAPSHOT_BUDGET of the wall time since it began:
with ~15 MiB of device state (~0.8 ms over PCIe) and 12 ms steps that is one snapshot every ~3 steps, so
a crash redoes at most a few steps and the copies cost <= 3% of step time. The final step of a run (or of
``--max-steps``) is always snapshotted, after the previous write has finished.

Every copy to the host (these snapshots and the durable checkpoints alike) is a HostCopy: its ``wait``
returns once the device-to-host copies have landed, and nothing is serialised before that.

On (re)start (restore.py) every rank reads only its node's snapshot header (:meth:`Snapshots.meta`), and the copy
to resume from is chosen from those headers and the durable checkpoints' sidecars: the newest, a snapshot at an
equal step. The lowest rank whose node holds the newest snapshot reads it (:meth:`Snapshots.read`, checked against
its header) and sends it to the others as tensors (``restore.broadcast_state``); when no snapshot is as new as the
durable checkpoint, rank 0 reads that (one open; a damaged one is set aside and the next considered).

A non-finite state is never written (checked in the writer thread).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

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


SNAPSHOT_NAME = "node.snap"
"""The node's one snapshot file of a run, inside the run's folder under the snapshot root."""
_MAGIC = b"EKSDDPS1"
_HEADER_MAX = 1 << 20


class Snapshots:
    """The node's snapshot file of one run: one copy per node, written by its local rank 0 (``writer``).

    The file is a small JSON header (step, generation, run identity, size and SHA-256 of the payload) followed by the
    ``torch.save`` payload, replaced atomically as a whole: :meth:`meta` reads the header alone (what a restore
    decides from), :meth:`read` the payload, checked against the header's checksum."""

    def __init__(self, run_dir: Path, rank: int = 0, root: str | None = None, *, writer: bool = True) -> None:
        root = os.environ.get(DIR_ENV) if root is None else root
        self.enabled = root != "off"
        self.writes = writer
        if root is None:
            root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
        self.path = Path(root) / f"eks-ddp-{key}" / SNAPSHOT_NAME
        self.writer = BackgroundWriter()
        self._buffers: Any = None
        self._next_at = float("-inf")
        self.refused: str | None = None
        """Why this node's copy was refused (it does not fit the snapshot folder's file system), once it was."""

    def offer(self, state: Callable[[], dict[str, Any]], *, final: bool = False) -> bool:
        """Snapshot ``state()`` unless the previous write is still running or the copy budget is spent;
        whether it was taken. ``final``: always, after waiting for the previous write (the run's last step).
        Only the node's writer (local rank 0) takes them: the state is replicated, one copy per node is enough."""
        if not self.enabled or not self.writes:
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
        payload = buf.getvalue()
        header = json.dumps({"format": ckpt.FORMAT, "step": int(cpu["step"]),
                             "generation": ckpt.generation_of(cpu),
                             "identity": (cpu.get("config") or {}).get("identity", {}),
                             "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}).encode()
        blob = _MAGIC + len(header).to_bytes(8, "little") + header + payload
        why = self._does_not_fit(len(blob))
        if why is not None:
            self._turn_off(cpu.get("step"), why)
            return
        try:
            ckpt.atomic_write_bytes(self.path, blob)
        except OSError as e:
            # A full or failing node-local disk loses a shortcut, not the run: training goes on with durable
            # checkpoints only.
            self._turn_off(cpu.get("step"), f"{e}")

    def _does_not_fit(self, size: int) -> str | None:
        """Why a copy of ``size`` bytes cannot be written next to the current one (the atomic replace holds both),
        naming the size and the limit; None when it fits."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return None
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        if size <= free:
            return None
        return (f"the node's copy of the state ({_gib(size)}) does not fit {self.path.parent.parent} "
                f"({_gib(free)} free of {_gib(total)}; the replace needs the old and the new copy at once)")

    def _turn_off(self, step: Any, why: str) -> None:
        self.enabled = False
        self.refused = why
        # stdout: the run's log (kubectl logs, the local runner's agent log), where users look.
        print(f"[snapshot] step {step}: node-local snapshot {self.path} not written: {why}; snapshots are off for "
              "the rest of this world, recovery falls back to the durable checkpoints (docs/trainer.md, "
              "\"Node-local snapshots\")", flush=True)
        log.error("step %s: node-local snapshot %s not written (%s)", step, self.path, why)

    def meta(self, identity: dict[str, Any], lineage: ckpt.Lineage | None = None) -> dict[str, Any] | None:
        """The header of this node's snapshot of this run, or None (none, unreadable, another run's, or off
        ``lineage``: written by a world that a newer one replaced, after the state the newer one restored;
        checkpoint.py). Reads a few hundred bytes, never the state."""
        if not self.enabled:
            return None
        try:
            with open(self.path, "rb") as f:
                head = f.read(16)
                if len(head) < 16 or head[:8] != _MAGIC:
                    raise ValueError("not an eks-ddp snapshot")
                n = int.from_bytes(head[8:], "little")
                if n > _HEADER_MAX:
                    raise ValueError(f"header of {n} bytes")
                meta = json.loads(f.read(n))
            if not isinstance(meta, dict) or meta.get("format") != ckpt.FORMAT:
                raise ValueError("unknown header")
            meta["offset"] = 16 + n
        except FileNotFoundError:
            return None
        except Exception as e:  # a snapshot is only a shortcut: fall back to the durable checkpoint
            log.warning("unreadable snapshot %s: %s", self.path, e)
            return None
        state_like = {"step": meta["step"], "fence": {"generation": meta["generation"]}}
        if not ckpt.on_lineage(lineage, state_like):
            log.warning("snapshot %s (world %s, step %s) is not on the run's lineage %s: not used", self.path,
                        meta["generation"], meta["step"], lineage)
            return None
        return meta if ckpt.same_run(meta.get("identity") or {}, identity) == {} else None

    def read(self, identity: dict[str, Any], lineage: ckpt.Lineage | None = None) -> dict[str, Any] | None:
        """The snapshot of this run (:meth:`meta`'s conditions), its payload checked against the header's size and
        SHA-256; None when any check fails."""
        meta = self.meta(identity, lineage)
        if meta is None:
            return None
        try:
            with open(self.path, "rb") as f:
                f.seek(meta["offset"])
                payload = f.read()
            if len(payload) != meta["size"] or hashlib.sha256(payload).hexdigest() != meta["sha256"]:
                raise ValueError(f"size or SHA-256 differs from its header ({len(payload)} bytes, header "
                                 f"{meta['size']})")
            state = ckpt.load_checkpoint_bytes(payload, str(self.path))
        except Exception as e:
            log.warning("unreadable snapshot %s: %s", self.path, e)
            return None
        if int(state["step"]) != int(meta["step"]) or ckpt.generation_of(state) != int(meta["generation"]):
            log.warning("snapshot %s: its header (step %s, world %s) does not match its state: not used", self.path,
                        meta["step"], meta["generation"])
            return None
        return state

    def set_aside(self) -> None:
        """Remove this node's copy after it failed its check (every rank of the node reads the same file)."""
        self.path.unlink(missing_ok=True)

    def remove(self) -> None:
        self.writer.wait()
        if self.writes:
            self.path.unlink(missing_ok=True)
        try:
            self.path.parent.rmdir()  # the run's folder, once the node's writer is done
        except OSError:
            pass


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
