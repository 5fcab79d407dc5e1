"""Rank 0's durable checkpoints, committed on a side thread: a slow volume or a store that does not answer costs no
step, and at most one checkpoint waits.

A checkpoint is committed behind its gate (checkpoint.commit_gate: the agent's lease, and the run's store saying this
world is still the newest). While the store does not answer that check (a hung or unreachable etcd: each check waits
up to ``checkpoint.STORE_WAIT_S``) or the lease has lapsed, the commit is refused and tried again, every
:data:`RETRY_S`, until the gate allows it: the pending checkpoint lands as soon as the store answers, never without
the check. A world that a newer one replaced is refused for good and waits, committing nothing, until its agent stops
it (an error the check raises, ``checkpoint.ReplacedElsewhere``, reaches the training thread at its next checkpoint).

The training thread only hands over a CPU copy (snapshot.HostCopy) and goes on. **At most one checkpoint is
pending**: one due while another waits (for its gate, or for a slow volume) replaces the one that waits, which is
dropped; the one being written at that moment (past its gate, on the volume) finishes. So a store hang of any
length holds one CPU copy of the state beyond the one being written, and the newest state lands when the store is
back. The replacements and the wait are said once per episode, with a summary when a checkpoint lands again.

Only rank 0 commits; nothing here is collective, so the ranks never wait on each other for a commit.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.snapshot import HostCopy

RETRY_S = 0.5
"""How soon a refused checkpoint is tried again (each try reads the run's store once or twice)."""


class Checkpoints:
    """Rank 0's checkpoint committer: :meth:`submit` never waits; :meth:`wait` waits for every commit handed over."""

    def __init__(self, run_dir: Path, keep: int) -> None:
        self.run_dir, self.keep = run_dir, keep
        self._cond = threading.Condition()
        self._pending: tuple[int, HostCopy] | None = None
        """(step, copy): the one checkpoint waiting to be committed."""
        self._busy = False
        """Whether the writer thread holds a checkpoint (committing it, or waiting for its gate)."""
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._episode: list | None = None
        """[since (monotonic), replaced count, first replaced step] while checkpoints are replaced before they land."""
        self.committed: list[int] = []
        """Steps committed by this world, in order."""

    def raise_error(self) -> None:
        """An error of the writer thread (ReplacedElsewhere, a failing volume), raised in the caller's thread."""
        with self._cond:
            e, self._error = self._error, None
        if e is not None:
            raise e

    def submit(self, step: int, copy: HostCopy) -> None:
        """Hand over the checkpoint of ``step``; returns at once. A checkpoint still pending is replaced (dropped)."""
        self.raise_error()
        with self._cond:
            replaced = self._pending
            self._pending = (step, copy)
            if replaced is not None:
                self._dropped(replaced[0], step)
            if not self._busy:
                self._busy = True
                self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _dropped(self, old: int, new: int) -> None:
        """Checkpoint ``old`` gives way to ``new`` before it landed (called under the lock); said once per episode."""
        if self._episode is None:
            self._episode = [time.monotonic(), 0, old]
            print(f"[train] step {new}: durable checkpoint replaces step {old}'s, not yet committed "
                  f"({self._waiting_for()}); at most one checkpoint waits, the newest (said once until one lands)",
                  flush=True)
        self._episode[1] += 1

    def _waiting_for(self) -> str:
        if ckpt.deferrals.deferring("checkpoint"):
            return "its commit is deferred: the fence's check refused it"
        return "the previous write is still running: a slow shared volume"

    def busy(self) -> bool:
        with self._cond:
            return self._busy

    def wait(self) -> None:
        """Until every checkpoint handed over is committed (a refused one: once its gate allows it; a replaced world
        waits here until its agent stops it), then any error of the writer."""
        with self._cond:
            while self._busy:
                self._cond.wait(0.5)
        self.raise_error()

    def _take(self) -> tuple[int, HostCopy] | None:
        with self._cond:
            job, self._pending = self._pending, None
            if job is None:
                self._busy = False  # the thread ends; the next submit starts another (no idle thread at exit)
                self._cond.notify_all()
            return job

    def _run(self) -> None:
        job = self._take()
        while job is not None:
            step, copy = job
            try:
                copy.wait()  # the device-to-host copies land before anything is serialised
                while ckpt.save_checkpoint(self.run_dir, copy.state, keep=self.keep) is None:
                    with self._cond:  # refused: try again, unless a newer checkpoint replaced this one meanwhile
                        if self._pending is None:
                            self._cond.wait(RETRY_S)
                        if self._pending is not None:
                            self._dropped(step, self._pending[0])
                            break
                else:
                    self._landed(step)
            except BaseException as e:  # handed to the training thread at its next checkpoint or wait
                with self._cond:
                    self._error, self._pending, self._busy = e, None, False
                    self._cond.notify_all()
                return
            job = self._take()

    def _landed(self, step: int) -> None:
        self.committed.append(step)
        with self._cond:
            episode, self._episode = self._episode, None
        if episode is not None:
            since, replaced, first = episode
            print(f"[train] step {step}: durable checkpoint committed; {replaced} checkpoint(s) from step {first} on "
                  f"were replaced before they could land, over {time.monotonic() - since:.1f} s", flush=True)
