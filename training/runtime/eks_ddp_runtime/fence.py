"""The agent's lease, and the check a worker makes before it commits anything a later world could read.

**The problem.** Peers drop an agent whose heartbeat in the rendezvous state is older than
``keep_alive_interval * keep_alive_max_attempt`` (the *drop window*, 4 s on the cluster), while an agent that
cannot reach the store keeps its workers training for up to ``store_retry_timeout`` (600 s: store outages
must cost no agent). When only that agent is cut off (its node's path to the store breaks, the store and the
other nodes are fine), a replacement node that reaches the store drops it after the window and forms a world
of its own: two rank 0s, one run directory.

**The lease.** A world can only form without an agent once its heartbeat has expired in the store. So the
agent knows a deadline before which no other world can exist: after every successful read or write of the
rendezvous state in which it is a participant of the round its workers run and holds its heartbeat ``ts``
(which only it writes), its lease is valid until ``ts + drop window - margin`` (``margin`` = one
``keep_alive_interval``, for the skew between node clocks, which torch's drop decision compares, and for the
moment between a check and its commit). The agent publishes ``{round, valid_until}`` (CLOCK_MONOTONIC, which
is one clock for every process of a Linux host) to its workers in a file in a private directory (mode 0700,
atomically replaced, never in the run directory or anywhere another user can write); it withdraws the lease
at once when it sees itself absent from the state (dropped, or a store that came back empty).

**The check.** Right before each atomic commit (the rename of a checkpoint, a result file, a history record
appended) a worker calls :func:`commit_allowed`: false when the lease has expired or names another round than
the one the worker was started for. The worker logs one line, defers that commit and keeps going: a store
outage of any length costs no agent and no training, only commits, which resume when the heartbeat lands
again, with one more line saying how long they waited (:class:`Deferrals`: once per episode, not per check). Under any other launcher (torchrun, a plain ``python``) there is no lease file and every commit is
allowed, so users' own training code can call it unconditionally.

A stall between the check and the rename (a paused process) can still put a commit after the lease's end;
the trainer's fences (kept in the run's store, fence_store.py; training/eks_ddp_trainer/checkpoint.py) make such a
late commit unloadable. The argument for both, and its assumptions, is in docs/rendezvous.md "Why two worlds never both commit".
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

__all__ = ["LEASE_FILE_ENV", "LEASE_ROOT_ENV", "ROUND_ENV", "Deferrals", "Lease", "agent_lease", "commit_allowed",
           "lease", "published", "under_lease", "wait_for_lease"]

LEASE_FILE_ENV = "EKS_DDP_LEASE_FILE"
"""Where the agent publishes its lease (set by the launcher for its workers; absent: no lease, no fencing)."""
LEASE_ROOT_ENV = "EKS_DDP_LEASE_ROOT"
"""Where the agent's lease folder is made (default /dev/shm): the local runner points it into a folder of its own
run, which it and its reaper remove whatever becomes of the agent."""
ROUND_ENV = "EKS_DDP_RDZV_ROUND"
"""The rendezvous round the worker was started for (set by the launcher in each worker's environment)."""

log = logging.getLogger(__name__)


class Lease:
    """The agent side: tracks the lease from the rendezvous states it syncs and publishes it to its workers.

    The file lives in a fresh private directory (0700) under ``/dev/shm`` (tmpfs) or the temp folder;
    :meth:`close` removes it. The rendezvous handler sets the drop window and margin (:meth:`configure`);
    until it has, and until the agent has completed a round, the lease is never valid."""

    def __init__(self, root: str | None = None) -> None:
        if root is None:
            root = os.environ.get(LEASE_ROOT_ENV) or (
                "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None)
        self.dir = tempfile.mkdtemp(prefix="eks-ddp-lease-", dir=root)  # mode 0700, owned by this user
        self.path = os.path.join(self.dir, "lease.json")
        self.window_s = self.margin_s = 0.0
        self.round: int | None = None
        self.valid_until = 0.0
        self._ts: datetime | None = None
        self._lock = threading.Lock()
        self._publish()

    def configure(self, window_s: float, margin_s: float) -> None:
        """``window_s``: the drop window (``keep_alive_interval * keep_alive_max_attempt``); ``margin_s``:
        subtracted from it (``keep_alive_interval``)."""
        if not window_s > margin_s >= 0:
            raise ValueError(f"lease: got window {window_s} s, margin {margin_s} s; expected window > margin >= 0")
        self.window_s, self.margin_s = window_s, margin_s

    def valid(self) -> bool:
        return time.monotonic() < self.valid_until

    def leaving(self) -> None:
        """The agent stopped its workers and joins the next round: nothing of this round may commit any more."""
        with self._lock:
            self.round, self.valid_until, self._ts = None, 0.0, None
            self._publish()

    def joined(self, round_: int, node, state) -> None:
        """This agent completed round ``round_`` (``state``: the state that completed it); its next workers run
        for that round."""
        with self._lock:
            self.round, self.valid_until, self._ts = round_, 0.0, None
        self.seen(node, state)

    def seen(self, node, state) -> None:
        """A rendezvous state just read from (or written to) the store: renew or withdraw the lease.

        The monotonic clock is read first, before the lock and the wall clock: a pause anywhere after it (a GIL
        switch, GC, SIGSTOP) only makes the heartbeat look older, so it can shorten the lease, never lengthen it."""
        mono = time.monotonic()
        with self._lock:
            if self.round is None or not self.window_s:
                return
            ts = state.last_heartbeats.get(node)
            if state.round != self.round or not state.complete or node not in state.participants or ts is None:
                if self.valid_until:
                    log.warning("lease withdrawn: this node is no longer a participant of round %s in the "
                                "rendezvous state; its workers commit nothing until they are restarted", self.round)
                    self.valid_until, self._ts = 0.0, None
                    self._publish()
                return
            if ts == self._ts:
                return  # the same heartbeat: the lease it gives is already published
            age = max(0.0, (datetime.now(timezone.utc) - ts).total_seconds())  # noqa: UP017 (Python 3.10)
            until = mono - age + self.window_s - self.margin_s
            self._ts = ts
            if until > self.valid_until:
                self.valid_until = until
                self._publish()

    def withdraw(self, why: str) -> None:
        with self._lock:
            if self.valid_until:
                log.warning("lease withdrawn: %s", why)
            self.valid_until, self._ts = 0.0, None
            self._publish()

    def _publish(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"round": self.round, "valid_until": self.valid_until, "agent": os.getpid()}, f)
        os.replace(tmp, self.path)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ worker side

_checked_dirs: set[str] = set()


def under_lease() -> bool:
    """Whether this process runs under the launcher's lease (a worker of ``eks_ddp_runtime.launch``)."""
    return bool(os.environ.get(LEASE_FILE_ENV))


def lease(now: float | None = None) -> tuple[bool, str]:
    """(valid, why) for this worker's lease at ``now`` (time.monotonic()); (True, "no lease") outside the
    launcher. Read from the agent's file at every call (a few microseconds on tmpfs). When the agent the file
    names is gone (killed outside a pod, where nothing else ends its workers) the worker ends at once with
    :data:`contract.AGENT_LOST`: the lease it would wait for can never be renewed."""
    path = os.environ.get(LEASE_FILE_ENV)
    if not path:
        return True, "no lease (not under eks_ddp_runtime.launch)"
    try:
        _check_private(os.path.dirname(path))
        with open(path, encoding="utf-8") as f:
            published = json.load(f)
        valid_until = float(published["valid_until"])
        round_ = published["round"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return False, f"the agent's lease {path} is unreadable ({e})"
    if now is None and (gone := agent_gone(published.get("agent"))):
        _agent_lost(path, gone)
    mine = os.environ.get(ROUND_ENV)
    if mine is not None and str(round_) != mine:
        return False, f"the agent is in rendezvous round {round_}, this worker was started for round {mine}"
    now = time.monotonic() if now is None else now
    if now >= valid_until:
        return False, (f"the agent's lease expired {now - valid_until:.1f} s ago (its heartbeat has not reached the "
                       "rendezvous store: another world may form without it)" if valid_until else
                       "the agent holds no lease (it is not a participant of the current round)")
    return True, f"valid for {valid_until - now:.1f} s more"


def agent_gone(pid: object) -> str | None:
    """Why the agent process ``pid`` (the lease file's ``agent``) can no longer renew the lease, or None while it
    lives. Gone: no such process, or a zombie (dead, not yet reaped). A pid another user owns is alive."""
    if not isinstance(pid, int) or pid <= 0:
        return None  # a file from before the agent was recorded: nothing to check
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its agent (pid {pid}) is gone"
    except PermissionError:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
                return f"its agent (pid {pid}) has died (a zombie)"
    except OSError:
        pass
    return None


def _agent_lost(path: str, why: str) -> None:
    """End this worker with :data:`contract.AGENT_LOST`: only its agent could renew the lease it waits for."""
    from .contract import AGENT_LOST
    from .exitcodes import exit_process

    print(f"[fence] the worker stops: {why}; nothing can renew the lease in {path} (exit {AGENT_LOST}, agent lost)",
          file=sys.stderr, flush=True)
    exit_process(AGENT_LOST, drain_s=2.0)


def _check_private(directory: str) -> None:
    """The lease's directory belongs to this user and nobody else may write to it (checked once per process)."""
    if directory in _checked_dirs:
        return
    st = os.stat(directory)
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"{directory}: owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)}; expected "
                         f"this user's ({os.getuid()}) private directory")
    _checked_dirs.add(directory)


class Deferrals:
    """Says a deferral once per episode: the first refusal of a kind of commit (the first word of ``what``:
    "checkpoint", "history", ...) in one line with its reason, nothing for the refusals that follow (a commit is
    checked again every half second or every step for as long as the store or the lease is away), and one line
    when that kind is allowed again, with how long it waited, how many checks were refused and why. ``stream``:
    the name of the ``sys`` stream the lines go to (looked up when one is said)."""

    def __init__(self, prefix: str = "[fence]", stream: str = "stderr") -> None:
        self.prefix, self.stream = prefix, stream
        self._open: dict[str, list] = {}  # kind -> [since (monotonic), refused checks, distinct reasons]
        self._lock = threading.Lock()

    def _say(self, line: str) -> None:
        print(f"{self.prefix} {line}", file=getattr(sys, self.stream), flush=True)

    def refused(self, what: str, why: str, said: str = "commit deferred") -> None:
        kind, reason = what.split(" ")[0], _reason(why)
        with self._lock:
            episode = self._open.get(kind)
            if episode is None:
                self._open[kind] = [time.monotonic(), 1, [reason]]
            else:
                episode[1] += 1
                if reason not in episode[2] and len(episode[2]) < 5:
                    episode[2].append(reason)
                return
        self._say(f"{what}: {said}: {why} (said once until it resumes)")

    def allowed(self, what: str, detail: str = "", said: str = "commits resume") -> None:
        kind = what.split(" ")[0]
        with self._lock:
            episode = self._open.pop(kind, None)
        if episode is not None:
            since, n, reasons = episode
            self._say(f"{what}: {said} after {time.monotonic() - since:.1f} s deferred ({n} check"
                      f"{'s' if n != 1 else ''} refused: {'; '.join(reasons)}){f'; {detail}' if detail else ''}")

    def deferring(self, what: str) -> bool:
        """Whether ``what``'s kind is in an episode of refusals."""
        return what.split(" ")[0] in self._open


def _reason(why: str) -> str:
    """A reason without its figures (seconds, addresses), so that one cause counts once in a summary."""
    return re.sub(r"\d[\d.:]*", "#", why.split(" (")[0])[:80]


_deferrals = Deferrals()


def commit_allowed(what: str) -> bool:
    """Whether ``what`` (e.g. "checkpoint step 120") may be committed now; call it right before the atomic
    rename. Logs one line when a kind of commit is first refused and one, with how long it waited, when it is
    allowed again (:class:`Deferrals`); never raises. Always True outside the launcher."""
    ok, why = lease()
    if ok:
        _deferrals.allowed(what, why)
        return True
    _deferrals.refused(what, why)
    return False


def wait_for_lease(what: str, poll_s: float = 0.5, timeout_s: float | None = None) -> bool:
    """Block until :func:`commit_allowed` (True) or ``timeout_s`` has passed (False). A worker of a world that
    another one replaced waits here until its agent stops it."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not commit_allowed(what):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


_agent: Lease | None = None


def agent_lease() -> Lease | None:
    """The lease this agent publishes (None: not started by the launcher, or another rendezvous backend)."""
    return _agent


@contextlib.contextmanager
def published():
    """The agent's :class:`Lease`, its file named in the environment (:data:`LEASE_FILE_ENV`) for every worker
    started from here on (the zygote included); removed on exit."""
    global _agent
    held = _agent = Lease()
    os.environ[LEASE_FILE_ENV] = held.path
    try:
        yield held
    finally:
        _agent = None
        os.environ.pop(LEASE_FILE_ENV, None)
        held.close()
