"""A run's kept logs: every agent's and worker's output in the run's directory, readable after the pods are gone.

When a failed run's GPU nodes are scaled away, the pods and their ``kubectl logs`` go with them; the run's
directory (the shared volume) stays. The launcher therefore keeps, per agent, under ``<run dir>/logs/<pod>/``
(``EKS_DDP_LOG_DIR`` instead of ``<run dir>/logs``; ``<pod>`` is ``EKS_DDP_LOG_NAME``, else ``HOSTNAME``, which
Kubernetes sets to the pod's name):

* ``agent.log``: the launcher's own log (rendezvous rounds, restarts, why it exited), torch's elastic log included;
* ``rank-<G>.log``: global rank G's stdout and stderr on this pod, written line by line as they arrive (the pod's
  stdout and stderr still show them), every round appended under a header line naming the round (the restart
  count), the local rank and the world size;
* ``failures.jsonl``: one JSON record per worker that failed (rank, local rank, exit code, signal, round, whether
  the agent restarts the workers, the last lines it wrote);
* ``exit.json``: the agent's exit code and why.

Each log file is capped at ``EKS_DDP_LOG_MAX_BYTES`` (default 32 MiB): past it the file is renamed to ``<name>.1``
(replacing an older one) and a new one starts with a line saying so, so a rank keeps at most about twice the cap,
its newest output included. Files are fsync'd when a worker fails and when the agent exits.

Stdlib only: the ``eks-ddp`` command (components/eks_ddp/tooling/runs/) reads these files on a machine without torch.
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .contract import LOGS_SUBDIR, RUN_DIR_ENV

FINAL_MARKER = "eks-ddp-final.json"
"""The launcher's record that the run finished (launch.py): in the run's directory, beside ``logs/``."""
AGENT_LOG = "agent.log"
FAILURES = "failures.jsonl"
EXIT_RECORD = "exit.json"
LOG_DIR_ENV = "EKS_DDP_LOG_DIR"
"""Where the agents keep their logs; unset: ``$EKS_DDP_RUN_DIR/logs``; neither set: nothing is kept."""
LOG_NAME_ENV = "EKS_DDP_LOG_NAME"
"""This agent's folder under the log directory (the local runner names its agents); unset: ``HOSTNAME``."""
LOG_MAX_ENV = "EKS_DDP_LOG_MAX_BYTES"
FIFO_DIR_ENV = "EKS_DDP_LOG_FIFO_DIR"
"""Where an agent makes the private folder of its workers' FIFOs (default: the system's temp folder; the local
runner names its own run's temp folder, which it removes even when the agents are killed)."""
DEFAULT_MAX_BYTES = 32 << 20
WORKER_STDOUT_ENV = "EKS_DDP_WORKER_STDOUT"
WORKER_STDERR_ENV = "EKS_DDP_WORKER_STDERR"
"""A forked worker's FIFOs (keptlogs.py ``RunLogsSpecs``), put on its fd 1 and 2 by :func:`redirect_worker`."""
TAIL_LINES = 20
"""Lines of a failed worker's output kept in its failure record."""
_READ = 1 << 16
_MAX_PARTIAL = 1 << 16
"""A line longer than this (a progress bar redrawn with carriage returns) is written out in pieces."""
_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def rank_log(rank: int | str) -> str:
    return f"rank-{rank}.log"


def log_root(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The run's log directory, or None when the agent has no run directory (nothing is kept)."""
    if environ.get(LOG_DIR_ENV):
        return Path(environ[LOG_DIR_ENV])
    if environ.get(RUN_DIR_ENV):
        return Path(environ[RUN_DIR_ENV]) / LOGS_SUBDIR
    return None


def agent_name(environ: Mapping[str, str] = os.environ) -> str:
    """This agent's folder name: ``EKS_DDP_LOG_NAME``, else the pod's name (``HOSTNAME``), made path-safe."""
    raw = environ.get(LOG_NAME_ENV) or environ.get("HOSTNAME") or socket.gethostname() or "agent"
    return _NAME.sub("_", raw).strip("._") or "agent"


def max_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """The per-file cap (ValueError naming the variable for a bad value)."""
    raw = environ.get(LOG_MAX_ENV, "")
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 4096:
        raise ValueError(f"{LOG_MAX_ENV}: got {raw!r}; expected bytes per log file, at least 4096")
    return value


def redirect_worker(environ=os.environ) -> None:
    """In a forked worker, before anything runs: its stdout and stderr into the FIFOs the agent reads (the
    variables are removed, so the user's code never sees them). Opened non-blocking, which fails at once (ENXIO)
    rather than hang should the agent's reader be gone, then made blocking, as a worker's stdout is."""
    import fcntl

    for name, fd in ((WORKER_STDOUT_ENV, 1), (WORKER_STDERR_ENV, 2)):
        path = environ.pop(name, None)
        if not path:
            continue
        try:
            target = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # the console it inherited stays its output
        fcntl.fcntl(target, fcntl.F_SETFL, fcntl.fcntl(target, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        os.dup2(target, fd)
        os.close(target)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        view = view[n:]


def fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CappedFile:
    """An append-only log file of at most ``limit`` bytes: past it, it becomes ``<name>.1`` and a new one starts
    with a note. Write errors (a full or unreachable volume) are remembered, never raised: logging must not stop
    the workers."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path, self.limit = path, limit
        self.error: OSError | None = None
        self._fd: int | None = None
        self._size = 0
        self._open()

    def _open(self) -> None:
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._size = os.fstat(self._fd).st_size
        except OSError as e:
            self.error, self._fd = e, None

    def write(self, data: bytes) -> None:
        if self._fd is None or not data:
            return
        try:
            if self._size and self._size + len(data) > self.limit:
                self._rotate()
            _write_all(self._fd, data)
            self._size += len(data)
        except OSError as e:
            self.error = e

    def _rotate(self) -> None:
        assert self._fd is not None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._open()
        if self._fd is not None:
            note = (f"[eks-ddp] {self.path.name} reached {self.limit} bytes ({LOG_MAX_ENV}): the output before this "
                    f"line is in {self.path.name}.1, anything older was dropped\n").encode()
            _write_all(self._fd, note)
            self._size = len(note)

    def sync(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as e:
                self.error = e

    def close(self) -> None:
        if self._fd is not None:
            self.sync()
            os.close(self._fd)
            self._fd = None


@dataclass
class _Stream:
    """One worker stream (stdout or stderr): a FIFO the worker writes, read here."""

    local_rank: int
    echo_fd: int
    fifo: Path
    rfd: int
    keep_wfd: int
    """Our own writer: the FIFO never reads as ended, so it is closed here, when the round ends."""
    sink: _RankLog
    partial: bytes = b""
    closed: bool = False


class _RankLog:
    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.file = CappedFile(path, limit)
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def lines(self, data: bytes) -> None:
        self.file.write(data)
        for line in data.decode("utf-8", "replace").splitlines():
            self.tail.append(line.rstrip("\r").rsplit("\r", 1)[-1])


class WorkerLogs:
    """The agent's side: one FIFO per worker stream, read by one thread that writes each complete line to the
    rank's file (:class:`CappedFile`) and to the agent's own stdout or stderr, as the workers' output appeared
    before (unprefixed: the local runner and ``kubectl logs`` read the lines as they are)."""

    def __init__(self, directory: Path, limit: int = DEFAULT_MAX_BYTES, *, echo: bool = True) -> None:
        self.directory, self.limit, self.echo = directory, limit, echo
        directory.mkdir(parents=True, exist_ok=True)
        self.fifo_dir = Path(tempfile.mkdtemp(prefix="eks-ddp-logs-", dir=os.environ.get(FIFO_DIR_ENV) or None))
        self._lock = threading.RLock()
        self._streams: list[_Stream] = []
        self._ranks: dict[int, _RankLog] = {}
        self._by_local: dict[int, _RankLog] = {}
        self._round = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eks-ddp-worker-logs", daemon=True)
        self._thread.start()

    # --- rounds ----------------------------------------------------------------------------------
    def start_round(self, workers: Iterable[tuple[int, int, str]], restart: int) -> dict[int, tuple[str, str]]:
        """FIFOs for a new round's workers, given as (local rank, global rank, header); returns local rank ->
        (stdout path, stderr path). The previous round's streams are read to their end and closed first."""
        self.end_round()
        paths: dict[int, tuple[str, str]] = {}
        with self._lock:
            self._round = restart
            self._by_local = {}
            for local, rank, header in workers:
                sink = self._ranks.get(rank)
                if sink is None:
                    sink = self._ranks[rank] = _RankLog(self.directory / rank_log(rank), self.limit)
                sink.tail.clear()
                sink.file.write(f"[eks-ddp] ---- {header} ----\n".encode())
                self._by_local[local] = sink
                pair = []
                for name, echo_fd in (("stdout", 1), ("stderr", 2)):
                    fifo = self.fifo_dir / f"r{restart}-{local}.{name}"
                    fifo.unlink(missing_ok=True)
                    os.mkfifo(fifo, 0o600)
                    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
                    keep = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                    self._streams.append(_Stream(local, echo_fd, fifo, rfd, keep, sink))
                    pair.append(str(fifo))
                paths[local] = (pair[0], pair[1])
        return paths

    def end_round(self) -> None:
        with self._lock:
            for s in self._streams:
                self._drain(s)
                self._flush_partial(s)
                s.closed = True
                for fd in (s.rfd, s.keep_wfd):
                    os.close(fd)
                s.fifo.unlink(missing_ok=True)
            self._streams = []

    def drain(self, local_rank: int | None = None) -> None:
        """Read what the workers (or one) wrote so far, partial last lines included."""
        with self._lock:
            for s in self._streams:
                if local_rank is None or s.local_rank == local_rank:
                    self._drain(s)
                    self._flush_partial(s)

    def tail(self, local_rank: int) -> list[str]:
        with self._lock:
            sink = self._by_local.get(local_rank)
            return list(sink.tail) if sink else []

    def path_of(self, local_rank: int) -> Path | None:
        sink = self._by_local.get(local_rank)
        return sink.path if sink else None

    def sync(self, local_rank: int | None = None) -> None:
        with self._lock:
            for local, sink in self._by_local.items():
                if local_rank is None or local == local_rank:
                    sink.file.sync()

    def errors(self) -> list[str]:
        return [f"{s.path}: {s.file.error}" for s in self._ranks.values() if s.file.error is not None]

    def close(self) -> None:
        """Read everything, close and fsync every file, remove the FIFOs."""
        self._stop.set()
        self._thread.join(5)
        self.end_round()
        with self._lock:
            for sink in self._ranks.values():
                sink.file.close()
        shutil.rmtree(self.fifo_dir, ignore_errors=True)

    # --- the reader thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                watched = {s.rfd: s for s in self._streams}
            if not watched:
                self._stop.wait(0.1)
                continue
            poller = select.poll()
            for fd in watched:
                poller.register(fd, select.POLLIN)
            try:
                ready = poller.poll(200)
            except OSError:  # a stream closed while polled: the next turn sees the new list
                continue
            for fd, _ in ready:
                with self._lock:
                    s = watched[fd]
                    if not s.closed:
                        self._read(s)

    def _read(self, s: _Stream) -> bool:
        try:
            chunk = os.read(s.rfd, _READ)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return False
        if not chunk:
            return False
        data = s.partial + chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) > _MAX_PARTIAL:
            cut = len(data)
        s.partial = data[cut:]
        if cut:
            self._emit(s, data[:cut])
        return True

    def _drain(self, s: _Stream) -> None:
        if s.closed:
            return
        for _ in range(1 << 12):  # bounded: a writer that never stops cannot hold the agent here
            if not self._read(s):
                return

    def _flush_partial(self, s: _Stream) -> None:
        if s.partial and not s.closed:
            data, s.partial = s.partial + b"\n", b""
            self._emit(s, data)

    def _emit(self, s: _Stream, data: bytes) -> None:
        try:
            s.sink.lines(data)
        except Exception as e:  # noqa: BLE001  (the reader must go on: a worker blocks on a full FIFO otherwise)
            s.sink.file.error = OSError(f"keeping the output failed: {e!r}")
        if self.echo:
            try:
                _write_all(s.echo_fd, data)
            except OSError:  # the agent's console is gone (a closed pipe): keep the files
                self.echo = False


# --- records ----------------------------------------------------------------------------------------
def append_record(path: Path, doc: Mapping[str, object]) -> None:
    """One JSON line, written in one call and fsync'd."""
    line = (json.dumps(doc, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        _write_all(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, doc: Mapping[str, object]) -> None:
    """Atomically: a temporary file in the same folder, fsync'd, renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def signal_name(exit_code: int) -> str | None:
    """``SIGKILL`` for torch's ``-9`` (a worker ended by a signal), None for an exit status."""
    if exit_code >= 0:
        return None
    import signal

    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


# --- reading (the eks-ddp command) ------------------------------------------------------------------
def tail_file(path: Path, lines: int = TAIL_LINES, max_read: int = 1 << 20) -> list[str]:
    """The last ``lines`` lines of a file (reads at most ``max_read`` bytes from its end)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_read))
        data = f.read()
    return data.decode("utf-8", "replace").splitlines()[-lines:] if lines else []


def read_records(path: Path) -> list[dict]:
    """A JSON-lines file's records (a torn last line, from an agent killed while writing, is skipped)."""
    out: list[dict] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out
