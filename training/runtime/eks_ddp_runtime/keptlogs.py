"""The launcher's side of a run's kept logs (runlogs.py has the layout): torch's own hook for where worker output
goes, ``LogsSpecs`` (torch/distributed/elastic/multiprocessing/api.py), given to the agent in place of torchrun's
``DefaultLogsSpecs``.

``DefaultLogsSpecs`` with ``--redirects``/``--tee`` has each worker write its own file directly (``redirect`` in
elastic/multiprocessing/redirects.py opens the path and ``dup2``s it onto fd 1 and 2; ``SubprocessHandler`` opens it
for ``Popen``) and tails it to the console: the file grows without bound, and a worker holding it open cannot be
capped or rotated. :class:`RunLogsSpecs` hands the workers named pipes instead (both of torch's paths open a FIFO
like a file), which :class:`~.runlogs.WorkerLogs` reads: each line goes to the rank's capped file and to the agent's
stdout or stderr, where the worker's output went before.

torchrun's own ``--log-dir``, ``--redirects``, ``--tee``, ``--local-ranks-filter`` or ``--logs-specs`` keep torch's
behaviour (workers' output is then not kept in the run's directory; the agent's log still is).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from .runlogs import (
    AGENT_LOG,
    EXIT_RECORD,
    FAILURES,
    WORKER_STDERR_ENV,
    WORKER_STDOUT_ENV,
    WorkerLogs,
    agent_name,
    append_record,
    fsync_path,
    log_root,
    max_bytes,
    now_iso,
    signal_name,
    write_json,
)

log = logging.getLogger("training.launch")
_TORCHRUN_LOG_FLAGS = {"log_dir": None, "redirects": "0", "tee": "0", "local_ranks_filter": "", "logs_specs": None}
"""torchrun's flags about worker output and their defaults (torch/distributed/run.py ``get_args_parser``)."""
_LOGGERS = ("", "torch", "torch.distributed")
"""The root logger, and torch's two that do not propagate to it (torch/_logging/_internal.py gives each its own
stderr handler): the agent's log gets torch's elastic records (rendezvous rounds, worker failures) too."""


class RunLogsSpecs(LogsSpecs):
    """Worker output into FIFOs read by :class:`WorkerLogs`; torch's error files in the same private folder.

    A fresh worker process gets its FIFOs as torch's ``stdouts``/``stderrs`` paths (``SubprocessHandler`` opens
    them for ``Popen``). A worker forked from the zygote gets them in its environment instead
    (:data:`~.runlogs.WORKER_STDOUT_ENV`), and :func:`~.workers.run_worker` puts them on its fd 1 and 2: torch's
    own redirect opens the path as ``open(path, "w+b")``, which Python refuses for a FIFO (not seekable)."""

    forked = False
    """Set by the agent before each start: the workers are forked (``run_worker``), not fresh processes."""

    def __init__(self, logs: WorkerLogs) -> None:
        super().__init__(log_dir=str(logs.directory))
        self.logs = logs

    @property
    def root_log_dir(self) -> str:
        return str(self.logs.directory)

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        restart = int(next(iter(envs.values()), {}).get("TORCHELASTIC_RESTART_COUNT", "0"))
        workers = []
        for local, env in sorted(envs.items()):
            rank = int(env.get("RANK", local))
            workers.append((local, rank, f"round {restart} (restart count) at {now_iso()}: global rank {rank} of "
                                        f"{env.get('WORLD_SIZE', '?')}, local rank {local}, agent pid {os.getpid()}"))
        paths = self.logs.start_round(workers, restart)
        errors = {}
        stdouts, stderrs = {}, {}
        for local in envs:
            path = self.logs.fifo_dir / f"r{restart}-{local}.error.json"
            path.unlink(missing_ok=True)
            errors[local] = str(path)
            envs[local]["TORCHELASTIC_ERROR_FILE"] = str(path)
            out, err = paths[local]
            if self.forked:
                envs[local][WORKER_STDOUT_ENV], envs[local][WORKER_STDERR_ENV] = out, err
                stdouts[local] = stderrs[local] = ""  # torch's "the console": the worker redirects itself
            else:
                stdouts[local], stderrs[local] = out, err
        return LogsDest(stdouts=stdouts, stderrs=stderrs, tee_stdouts={}, tee_stderrs={}, error_files=errors)


class KeptLogs:
    """Everything one agent keeps: ``agent.log``, the workers' files, ``failures.jsonl`` and ``exit.json``."""

    def __init__(self, directory: Path, limit: int) -> None:
        self.directory = directory
        self.workers: WorkerLogs | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self._handler = logging.handlers.RotatingFileHandler(directory / AGENT_LOG, maxBytes=limit, backupCount=1,
                                                             encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("[launch] %(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in _LOGGERS:
            logging.getLogger(name).addHandler(self._handler)
        self.limit = limit

    def install(self, config, args) -> None:
        """Give the agent :class:`RunLogsSpecs` unless torchrun's own log flags were given."""
        own = [f"--{k.replace('_', '-')}" for k, default in _TORCHRUN_LOG_FLAGS.items()
               if getattr(args, k, default) not in (default, None, "")]
        if own:
            log.info("torchrun's %s given: the workers' output follows torch's settings and is not kept in %s",
                     ", ".join(own), self.directory)
            return
        try:
            self.workers = WorkerLogs(self.directory, self.limit)
        except OSError as e:
            log.warning("cannot keep the workers' output in %s (%s): the pod's own log is the only copy",
                        self.directory, e)
            return
        config.logs_specs = RunLogsSpecs(self.workers)
        log.info("keeping this agent's log and its workers' output in %s (rank-<global rank>.log, failures.jsonl, "
                 "exit.json)", self.directory)

    def record_failures(self, failures, restart: int, *, restarting: bool, fatal: set[int]) -> None:
        """One record per failed worker (torch's ``ProcessFailure``s by global rank) in ``failures.jsonl``."""
        for rank, f in sorted(failures.items()):
            local = f.local_rank
            lines: list[str] = []
            log_path = None
            if self.workers is not None:
                self.workers.drain(local)
                self.workers.sync(local)
                lines = self.workers.tail(local)
                log_path = self.workers.path_of(local)
            message = getattr(f, "message", "") or ""
            if isinstance(message, dict):  # torch's error-file format (ErrorHandler.record_exception): the text inside
                message = str(message.get("message", ""))
            doc = {"time": now_iso(), "pod": self.directory.name, "rank": rank, "local_rank": local,
                   "exit_code": f.exitcode, "signal": signal_name(f.exitcode), "pid": f.pid, "restart": restart,
                   "restarting": restarting, "fatal": f.exitcode in fatal,
                   "log": log_path.name if log_path else None, "last_lines": lines}
            if message and not message.startswith("To enable traceback"):
                doc["message"] = message
            try:
                append_record(self.directory / FAILURES, doc)
            except OSError as e:
                log.warning("could not record the failure of rank %s in %s: %s", rank, self.directory, e)

    def close(self, exit_code: int, reason: str) -> None:
        """The agent's exit: its record, every file read to its end and fsync'd."""
        if self.workers is not None:
            self.workers.close()
            for err in self.workers.errors():
                log.warning("worker log not fully kept: %s", err)
        try:
            write_json(self.directory / EXIT_RECORD, {"time": now_iso(), "pod": self.directory.name,
                                                      "exit_code": exit_code, "reason": reason})
        except OSError as e:
            log.warning("could not write %s: %s", self.directory / EXIT_RECORD, e)
        for name in _LOGGERS:
            logging.getLogger(name).removeHandler(self._handler)
        self._handler.close()
        fsync_path(self.directory / AGENT_LOG)


def open_kept_logs(environ=os.environ) -> KeptLogs | None:
    """This agent's kept logs (``<run dir>/logs/<pod>/``), or None without a run directory. A folder that cannot
    be written loses the logs, never the run: a warning says so."""
    root = log_root(environ)
    if root is None:
        return None
    limit = max_bytes(environ)  # ValueError: a usage error
    try:
        return KeptLogs(root / agent_name(environ), limit)
    except OSError as e:
        log.warning("cannot keep logs in %s (%s): the pod's own log is the only copy", root, e)
        return None
