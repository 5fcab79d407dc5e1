"""Process bookkeeping for the local runner, the tests and the GPU check, through psutil (Linux and macOS alike).

torchrun starts every worker in its own session, so signalling an agent's process
group does not reach its workers: the runner finds them as descendants of the agent
and signals them by pid.

The runner ends only what it started (:class:`Owned`): the processes it started and their descendants, each known
by its pid *and* its start time (a pid the system gave to someone else since is not ours), never a process found
by its name or command line: a user's ``eks-ddp logs --follow``, ``eks-ddp cancel`` or TensorBoard given the run's
folder is not the run's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence

import psutil

from eks_ddp_runtime import deathsig


def proc_table() -> dict[int, int]:
    """pid -> parent pid for every live (non-zombie) process."""
    return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.info["ppid"] is not None}


def descendants(root: int, table: dict[int, int] | None = None) -> list[int]:
    """Children, grandchildren, ... of ``root``, sorted by pid."""
    table = proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(out)


ZYGOTE_MARK = "from multiprocessing.forkserver import main"
"""In the command line of a launcher's zygote (workers.py), and so of every worker forked from it."""
_TRACKER_MARK = "from multiprocessing.resource_tracker import main"


def worker_pids(agent: int, table: dict[int, int] | None = None) -> list[int]:
    """The worker processes of one launcher agent, sorted: its children that run the user's code as fresh
    processes (torchrun's way), and the children of its zygote (workers forked from it carry the zygote's command
    line, so they are told apart from it by their parent). Not the zygote, nor multiprocessing's resource tracker."""
    table = proc_table() if table is None else table
    out: list[int] = []
    for pid, ppid in table.items():
        if ppid != agent:
            continue
        line = cmdline(pid)
        if ZYGOTE_MARK in line:
            out.extend(p for p, pp in table.items() if pp == pid)
        elif _TRACKER_MARK not in line:
            out.append(pid)
    return sorted(out)


def cmdline(pid: int) -> str:
    """The process's arguments joined by spaces ("" when it is gone, a zombie, or not ours to read)."""
    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # ZombieProcess is a NoSuchProcess
        return ""


def executable_name(pid: int) -> str:
    first = cmdline(pid).split(" ", 1)[0]
    return os.path.basename(first)


def alive(pid: int) -> bool:
    """Running; a zombie is not (it only waits for its parent to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def send(pid: int, sig: int, *, group: bool = False) -> None:
    """Signal a process (or the process group it leads), ignoring one that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def listening(port: int) -> bool:
    """Whether some socket listens on TCP ``port`` (IPv4 or IPv6)."""
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
               for c in psutil.net_connections(kind="tcp"))


def started_at(pid: int) -> float | None:
    """The process's start time (psutil's ``create_time``); None when it is gone or a zombie."""
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.NoSuchProcess:
        return None


class Owned:
    """The processes a runner started, each as its pid and start time: :meth:`live` is those still running as the
    same process (a pid reused by another process since is not ours)."""

    def __init__(self) -> None:
        self._started: dict[int, float] = {}

    def add(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid not in self._started:
                when = started_at(pid)
                if when is not None:
                    self._started[pid] = when

    def __contains__(self, pid: object) -> bool:
        return pid in self._started

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is one of ours and still the process we started."""
        when = self._started.get(pid)
        return when is not None and started_at(pid) == when

    def live(self) -> list[int]:
        return sorted(p for p in self._started if self.owns(p))


def kill_owned(owned: Owned, *, spare: Iterable[int] = ()) -> list[int]:
    """SIGKILL every live process of ``owned`` (but ``spare``) and what descends from them now (a process's
    children are its own: a worker an agent forked after the last look), each process group one of them leads
    too (torchrun makes each worker a session leader). Returns the pids signalled. Nothing is chosen by name."""
    keep = {os.getpid(), *spare}
    table = proc_table()
    roots = [p for p in owned.live() if p not in keep]
    targets = sorted({*roots, *(d for r in roots for d in descendants(r, table))} - keep)
    for pid in targets:
        with contextlib.suppress(OSError):
            if pid in roots and os.getpgid(pid) == pid:
                send(pid, signal.SIGKILL, group=True)
        send(pid, signal.SIGKILL)
    return targets


def stop_agents(agents: Sequence[subprocess.Popen], workers: Callable[[], list[int]], owned: Owned, *,
                grace_s: float, hurry: Callable[[], bool] = lambda: False) -> None:
    """SIGTERM the agents' process groups and their workers, wait up to ``grace_s`` (less once ``hurry()``),
    then SIGKILL what is left. A worker pid is killed only while it is still the process ``owned`` recorded
    (by then the pid may belong to someone else)."""
    live = [p for p in workers() if alive(p)]
    for a in agents:
        if a.poll() is None:
            send(a.pid, signal.SIGTERM, group=True)
    for pid in live:
        send(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and not hurry():
        if all(a.poll() is not None for a in agents) and not any(alive(p) for p in live):
            break
        time.sleep(0.1)
    for a in agents:
        if a.poll() is None:
            send(a.pid, signal.SIGKILL, group=True)
    for pid in workers():
        if alive(pid) and owned.owns(pid):
            send(pid, signal.SIGKILL, group=True)  # torchrun makes each worker a session (and group) leader
            send(pid, signal.SIGKILL)
    for a in agents:
        with contextlib.suppress(subprocess.TimeoutExpired):
            a.wait(timeout=5)


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` making the kernel send ``sig`` to the child when the runner dies, whatever kills it
    (SIGKILL included): the runtime's :func:`~eks_ddp_runtime.deathsig.tie_to_parent` against this process, with
    the C library loaded here, before the fork, so the child only calls it. Linux only (prctl); elsewhere None and
    the reaper alone cleans up."""
    if not sys.platform.startswith("linux"):
        return None
    deathsig.libc()
    parent = os.getpid()

    def preexec() -> None:
        deathsig.tie_to_parent(parent, sig)

    return preexec


PR_SET_CHILD_SUBREAPER = 36
"""From <linux/prctl.h>."""


def become_subreaper() -> bool:
    """Make this process the one that inherits its orphaned descendants (a worker whose agent died), instead of
    init: they stay below it in the process tree, where :func:`descendants` finds them (prctl(2),
    PR_SET_CHILD_SUBREAPER). Linux only; False elsewhere or when refused."""
    if not sys.platform.startswith("linux"):
        return False
    return deathsig.libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def start_reaper(remove: Iterable[str]) -> subprocess.Popen:
    """A watchdog process that outlives the runner: while the runner lives it records the runner's descendants
    (pid and start time); once the runner is gone (SIGKILL, SIGHUP, a crash) it SIGKILLs those still running --
    the workers too, which torchrun puts in sessions of their own, out of reach of the death signal -- and removes
    the ``remove`` folders. It ignores SIGHUP/SIGINT and runs in its own session, so closing the terminal does not
    stop it. It ends nothing it did not see descend from the runner."""
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "reap", str(os.getpid()), *remove],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def reap(parent: int, remove: Sequence[str], *, poll_s: float = 0.2, scan_s: float = 0.5) -> None:
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    owned = Owned()
    me = os.getpid()
    next_scan = 0.0
    while alive(parent):
        if time.monotonic() >= next_scan:
            owned.add(p for p in descendants(parent) if p != me)
            next_scan = time.monotonic() + scan_s
        time.sleep(poll_s)
    for _ in range(3):  # a worker forked while the first sweep ran is caught by the next (a descendant of ours)
        kill_owned(owned)
        time.sleep(poll_s)
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__" and len(sys.argv) >= 3 and sys.argv[1] == "reap":
    reap(int(sys.argv[2]), sys.argv[3:])
