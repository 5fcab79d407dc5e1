"""Peer heartbeat: a silent peer (SIGSTOP, a hung kernel, a network partition) is noticed in seconds.

A dead peer that sends TCP resets fails the next collective at once, but a silent one leaves every
survivor blocked in gloo/NCCL until the process-group timeout (minutes). One global timeout cannot
be both short and safe: a first step, a slow checkpoint write or an evaluation would trip it.

So each worker runs a side thread that, every ``interval`` seconds, bumps its own counter in the
worker group's TCPStore (hosted by rank 0, MASTER_ADDR:MASTER_PORT) and reads the counter of the
next rank in a ring. The thread beats whatever the training thread is doing (a long step, a write to
a slow EFS, evaluation), so slowness is never mistaken for death. When the neighbour's counter has
not moved for ``deadline`` seconds, or the store has not answered for that long, the worker exits with
:data:`PEER_LOST` (transient: the agent restarts the group at the next rendezvous, without the lost
node). A ring keeps the cost at three store calls per rank and interval at any world size; when one
rank exits, its sockets close and the other ranks' collectives fail at once.

Environment: ``EKS_DDP_PEER_DEADLINE_S`` (default 5), ``EKS_DDP_PEER_INTERVAL_S`` (default 0.5);
a deadline of 0 turns the watchdog off.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta

PEER_LOST = 75
"""Worker exit code when a peer went silent (EX_TEMPFAIL): transient, never in exitcodes.FATAL."""
DEADLINE_ENV = "EKS_DDP_PEER_DEADLINE_S"
INTERVAL_ENV = "EKS_DDP_PEER_INTERVAL_S"
DEFAULT_DEADLINE_S = 5.0
DEFAULT_INTERVAL_S = 0.5


class PeerWatchdog:
    def __init__(self, store, rank: int, world: int, *, deadline_s: float, interval_s: float) -> None:
        self.store, self.rank, self.world = store, rank, world
        self.deadline_s, self.interval_s = deadline_s, interval_s
        self.peer = (rank + 1) % world
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-watchdog", daemon=True)

    def start(self) -> PeerWatchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Tell the neighbour this rank finished on purpose, then stop beating."""
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 1)
        try:
            self.store.add(f"eks-ddp/wd/done/{self.rank}", 1)
        except Exception:  # the store host may be gone already; the neighbour is finishing too
            pass

    def _lost(self, why: str) -> None:
        if self._stop.is_set():
            return
        print(f"[watchdog] rank {self.rank}: {why}; exiting {PEER_LOST} so the agent re-forms the group",
              file=sys.stderr, flush=True)
        os._exit(PEER_LOST)

    def _run(self) -> None:
        mine, theirs, done = (f"eks-ddp/wd/hb/{self.rank}", f"eks-ddp/wd/hb/{self.peer}",
                              f"eks-ddp/wd/done/{self.peer}")
        now = time.monotonic()
        last_ok, last_change, last_loop, seen = now, now, now, -1
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            if now - last_loop > self.deadline_s / 2:
                # This thread itself was starved (a paused or overloaded process): blame nobody for it.
                last_ok = last_change = now
            last_loop = now
            try:
                self.store.add(mine, 1)
                value = self.store.add(theirs, 0)
                if self.store.add(done, 0):
                    return  # the neighbour finished training; nothing more to watch
            except Exception as e:
                if time.monotonic() - last_ok > self.deadline_s:
                    self._lost(f"the worker-group store has not answered for {self.deadline_s:.0f} s ({e})")
                continue
            now = last_ok = time.monotonic()
            if value != seen:
                seen, last_change = value, now
            elif now - last_change > self.deadline_s:
                self._lost(f"rank {self.peer} has not beaten for {self.deadline_s:.0f} s")


def start_from_env(rank: int, world: int) -> PeerWatchdog | None:
    """Start the watchdog for a torchrun worker (MASTER_ADDR/PORT set); None for a world of one or when off."""
    deadline = float(os.environ.get(DEADLINE_ENV, DEFAULT_DEADLINE_S))
    if world < 2 or deadline <= 0 or "MASTER_ADDR" not in os.environ:
        return None
    import torch.distributed as dist

    interval = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    # A client of its own, with a short timeout: the process group's store waits minutes on a silent host.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=max(1.0, deadline / 2)), wait_for_workers=False)
    return PeerWatchdog(store, rank, world, deadline_s=deadline, interval_s=interval).start()
