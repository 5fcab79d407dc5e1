"""How the launcher starts its workers: torchrun's semantics, with restarts that skip the interpreter start.

Under ``torchrun`` every worker is a fresh ``python -u (-m MODULE | SCRIPT) args`` process: the user's code runs
only there, with the worker's ``sys.argv``, environment, ``sys.path[0]`` and ``__main__``. Starting a fresh
interpreter and importing torch costs seconds per restart on a busy node, so by default the launcher forks its
workers from a **zygote** instead: Python's forkserver process (``multiprocessing.forkserver``), started once by
the agent as a fresh interpreter that imports torch and this runtime and nothing of the user's. Each worker is a
fork of it that then runs the user's module or script exactly as ``python -u`` would (:func:`run_worker`). So:

* the user's module is never imported in the agent (its top level, argument parsing and environment reads run
  only in the workers, with their argv and env);
* ``-m MODULE`` and ``SCRIPT`` restart equally fast;
* the zygote never touches CUDA and runs no thread of its own (only what ``import torch`` starts: numpy's
  OpenBLAS pool, none with ``OMP_NUM_THREADS=1``), so a fork of it can use a GPU (the agent, which asks torch for
  an accelerator and runs the rendezvous' heartbeat thread, forks nothing); a probe forked at start checks torch's
  bad-fork flag and falls back to fresh processes otherwise.
* no Python thread is alive in the process that forks a worker: every fork records, in the forking process just
  before it forks, its own pid and thread counts (:data:`FORKED_FROM`, inherited by the child); the probe's record
  must show one Python thread, or the workers start as fresh processes. A lock held by another thread at the fork
  instant (the heartbeat's TLS connection, logging, urllib3) would stay held in the worker for ever.

``EKS_DDP_FORK_WORKERS=0`` starts fresh processes (torchrun's way). ``EKS_DDP_PRELOAD=mod1,mod2`` imports more
modules in the zygote (heavy libraries the workers import, e.g. ``torchvision``): they are imported once there
and never in the agent; one that touches CUDA on import makes the probe fall back to fresh processes.
"""

from __future__ import annotations

import atexit
import builtins
import importlib.machinery
import io
import logging
import multiprocessing
import os
import re
import runpy
import sys
import threading
import types
from dataclasses import dataclass
from typing import NoReturn

from . import podfs, startfail
from .deathsig import AGENT_PID_ENV, tie_to_parent
from .runlogs import redirect_worker

log = logging.getLogger("training.launch")

FORK_ENV = "EKS_DDP_FORK_WORKERS"
"""``0``: start every worker as a fresh ``python -u`` process (torchrun's way). ``1`` (the default): fork workers
from the zygote while a probe fork of it is clean for CUDA and single-threaded."""
PRELOAD_ENV = "EKS_DDP_PRELOAD"
"""Comma-separated modules the zygote imports besides torch and the runtime (never the agent)."""
ZYGOTE_GUARD = "eks_ddp_runtime.zygote_guard"
"""Imported first by the zygote, before the preload: it ties the zygote's life to the agent's."""
ZYGOTE_PRELOAD = ("torch", "torch.distributed", "torch.distributed.run", "torch.distributed.elastic.multiprocessing.api",
                  "torch.distributed.elastic.agent.server.local_elastic_agent", "torch._dynamo", "torch.optim",
                  "torch.nn.parallel", "eks_ddp_runtime.rendezvous", "eks_ddp_runtime.workers",
                  "eks_ddp_runtime.exitcodes", "eks_ddp_runtime.dist", "eks_ddp_runtime.watchdog")
"""What every worker needs before the user's code runs: torch, the worker wrapper torch's agent pickles
(``_wrap``), this module, what the launcher imports (each child re-runs the launcher's module as ``__mp_main__``:
multiprocessing's spawn preparation for an agent started with ``python -m``; the launcher itself is left out so
that runpy does not warn about a module run while already imported), and ``torch._dynamo``, which torch imports on
a model's first optimizer step (~900 modules, 1-3 s on a busy node: the bulk of a restart otherwise)."""
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class Entrypoint:
    """What torchrun would run in each worker: ``python -u -m MODULE argv`` or ``python -u SCRIPT argv``."""

    kind: str
    """``module`` or ``script``."""
    target: str
    argv: tuple[str, ...]


def parse_entrypoint(entrypoint: object, args: list[str]) -> Entrypoint | None:
    """The user's module or script from torchrun's worker command (``config_from_args``: ``sys.executable``,
    ``-u``, then ``-m MODULE`` or ``SCRIPT``, then its arguments); None for anything else (``--no-python``,
    ``--run-path``, ``PYTHON_EXEC`` naming another interpreter, ``--no-use-env``'s ``--local-rank`` macro)."""
    if entrypoint != sys.executable or len(args) < 2 or args[0] != "-u":
        return None
    if any("${local_rank}" in a for a in args):
        return None
    if args[1] == "-m":
        return Entrypoint("module", args[2], tuple(args[3:])) if len(args) >= 3 else None
    return Entrypoint("script", args[1], tuple(args[2:]))


def preload_modules(environ: dict[str, str] | os._Environ = os.environ) -> list[str]:
    """The zygote's imports: :data:`ZYGOTE_PRELOAD` plus ``EKS_DDP_PRELOAD`` (ValueError naming a bad name)."""
    extra = [m.strip() for m in environ.get(PRELOAD_ENV, "").split(",") if m.strip()]
    bad = [m for m in extra if not _MODULE_NAME.match(m)]
    if bad:
        raise ValueError(f"{PRELOAD_ENV}: got {', '.join(map(repr, bad))}; expected comma-separated module names "
                         "(e.g. torchvision,transformers)")
    return [*ZYGOTE_PRELOAD, *(m for m in extra if m not in ZYGOTE_PRELOAD)]


FORKED_FROM: dict | None = None
"""In a process forked with ``os.fork`` from one that imported this module (a worker forked from the zygote):
the forking process's pid, Python threads (``threading.active_count()``) and OS threads at the fork instant,
recorded there by an ``os.register_at_fork`` hook. None in a fresh process."""


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _record_fork() -> None:
    global FORKED_FROM
    FORKED_FROM = {"pid": os.getpid(), "python_threads": threading.active_count(), "os_threads": _os_threads()}


def _forget_fork_in_parent() -> None:
    global FORKED_FROM
    FORKED_FROM = None


os.register_at_fork(before=_record_fork, after_in_parent=_forget_fork_in_parent)


def _probe(conn, preload: list[str]) -> None:
    """Runs in a fork of the zygote: can it use CUDA, how many threads has the zygote (its parent), and which
    preloads did it fail to import (the forkserver skips an ImportError silently)?"""
    import torch

    threads = -1
    try:
        with open(f"/proc/{os.getppid()}/status") as f:
            threads = int(next(line.split()[1] for line in f if line.startswith("Threads:")))
    except (OSError, StopIteration, ValueError):
        pass
    conn.send({"bad_fork": bool(torch.cuda._is_in_bad_fork()), "cuda_initialized": torch.cuda.is_initialized(),
               "zygote_threads": threads, "zygote": os.getppid(), "forked_from": FORKED_FROM,
               "not_imported": [m for m in preload if m not in sys.modules]})
    conn.close()


class Zygote:
    """The forkserver with ``preload`` imported, and one probe forked from it. Starting returns at once: the
    zygote imports torch while the agent's first rendezvous round forms; :meth:`report` waits for the probe."""

    def __init__(self, preload: list[str]) -> None:
        import multiprocessing.forkserver as forkserver

        self.preload = preload
        forkserver.set_forkserver_preload(preload)
        ctx = multiprocessing.get_context("forkserver")
        self._conn, child = ctx.Pipe(duplex=False)
        self._probe = ctx.Process(target=_probe, args=(child, preload), name="eks-ddp-zygote-probe")
        self._probe.start()
        child.close()
        self._report: dict | None = None
        self._done = False

    def report(self, timeout_s: float = 600.0) -> dict | None:
        """The probe's answer (None when it gave none within ``timeout_s``)."""
        if not self._done:
            self._done = True
            try:
                self._report = self._conn.recv() if self._conn.poll(timeout_s) else None
            except (EOFError, OSError):
                self._report = None
            self._probe.join(10)
            if self._probe.is_alive():
                self._probe.kill()
                self._probe.join()
        return self._report

    def clean(self) -> bool:
        """A fork of it can use CUDA, and it had no Python thread but its main one when it forked the probe. (Its
        OS thread count is reported, not required to be 1: ``import torch`` loads numpy's OpenBLAS, which starts
        its pool unless ``OMP_NUM_THREADS=1`` (torchrun sets it for more than one worker per node) and shuts it
        down around every fork (its ``pthread_atfork`` handler), as for the DataLoader workers torch forks from
        any training process.)"""
        r = self.report()
        return (r is not None and not r["bad_fork"] and not r["cuda_initialized"]
                and (r.get("forked_from") or {}).get("python_threads") == 1)


@dataclass
class _Pending:
    zygote: Zygote
    entrypoint: object
    args: list[str]
    target: str


_pending: _Pending | None = None
"""The zygote whose probe the first worker start waits for, and torchrun's command to fall back to."""


def warm_workers(config, entrypoint, args: list[str]):
    """The worker entrypoint and arguments the agent uses: :func:`run_worker` forked from the zygote (and
    ``config.start_method = "forkserver"``), or torchrun's fresh processes where that is asked for
    (``EKS_DDP_FORK_WORKERS=0``) or not possible (not a Python module or script). The zygote starts here; the
    first worker start checks its probe (:func:`settle`) and falls back to fresh processes if it is not clean.
    Also sets ``TORCHELASTIC_SIGNALS_TO_HANDLE`` as torchrun's ``launch_agent`` does, so workers see it either way.
    ValueError (a usage error) for a bad ``EKS_DDP_FORK_WORKERS`` or ``EKS_DDP_PRELOAD``."""
    global _pending
    signals = getattr(config, "signals_to_handle", None)
    if signals:
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = signals
    choice = os.environ.get(FORK_ENV, "1")
    if choice not in ("0", "1"):
        raise ValueError(f"{FORK_ENV}: got {choice!r}; expected 0 (fresh worker processes) or 1 (fork from a "
                         "clean zygote where CUDA-safe, the default)")
    preload = preload_modules()
    ep = parse_entrypoint(entrypoint, args)
    if choice == "0" or ep is None:
        return entrypoint, args
    run_id = str(getattr(config, "run_id", "") or "")
    if run_id and ":" not in run_id:
        # multiprocessing starts the zygote with this interpreter's -W options (subprocess's
        # _args_from_interpreter_flags): a filter that matches no warning puts the run id into the command line of
        # the zygote and of every worker forked from it, as in the agent's, for whoever finds a run's processes by it.
        sys.warnoptions.append(f"ignore:eks-ddp-rdzv-id={run_id}")
    # The zygote dies with this agent (zygote_guard, imported first there), each worker with the zygote (run_worker).
    os.environ[AGENT_PID_ENV] = str(os.getpid())
    _pending = _Pending(Zygote([ZYGOTE_GUARD, *preload]), entrypoint, list(args), f"{ep.kind} {ep.target}")
    config.start_method = "forkserver"
    return run_worker, [ep.kind, ep.target, *ep.argv]


def settle(agent) -> None:
    """Before the first worker start (the agent's ``_start_workers``): wait for the zygote's probe; if it is not
    clean, start torchrun's fresh processes from now on instead."""
    global _pending
    pending, _pending = _pending, None
    if pending is None:
        return
    z = pending.zygote
    missing = (z.report() or {}).get("not_imported")
    if missing:
        log.warning("the zygote could not import %s (%s): the workers import it themselves", ", ".join(missing),
                    PRELOAD_ENV)
    if z.clean():
        r = z.report() or {}
        log.info("workers are forked from a zygote (pid %s, %s thread(s), clean for CUDA, %s Python thread at fork; "
                 "preloaded: %s); the %s runs only in the workers", r.get("zygote"), r.get("zygote_threads"),
                 (r.get("forked_from") or {}).get("python_threads"), ", ".join(z.preload), pending.target)
        return
    log.warning("%s=1 overridden: the zygote is not safe to fork (%s); starting each worker as a fresh process",
                FORK_ENV, z.report() or "its probe did not answer")
    agent._worker_group.spec.entrypoint = pending.entrypoint
    agent._worker_group.spec.args = tuple(pending.args)
    agent._start_method = "spawn"


def _unbuffered() -> None:
    """``python -u``: stdout and stderr written through to their file descriptors (a worker killed by a signal
    loses nothing it printed)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or not hasattr(stream, "fileno"):
            continue
        try:
            stream.flush()
            fd = stream.fileno()
        except (OSError, ValueError, io.UnsupportedOperation):
            continue
        setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=stream.encoding,
                                            errors=stream.errors, write_through=True))


def exit_status(code: object) -> int:
    """The exit status a fresh interpreter ends with for ``SystemExit(code)`` (Python's ``handle_system_exit``):
    None is 0, an int is taken modulo 256, anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr, flush=True)
    return 1


def _join_non_daemon_threads() -> None:
    """What interpreter shutdown does first: wait for the threads that are not daemons."""
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()


def _fresh_main() -> types.ModuleType:
    """A new, empty ``__main__`` (the zygote's is the launcher's ``__mp_main__``), as a fresh interpreter has."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return main


def _run_module_as_main(module: str, argv: tuple[str, ...]) -> None:
    """``python -m module argv``: ``sys.path[0]`` is the working directory, and runpy's ``_run_module_as_main``
    (what ``-m`` itself calls) sets ``sys.argv[0]`` to the module's file and runs it in ``__main__``."""
    sys.argv = [module, *argv]
    sys.path[0] = os.getcwd()
    _fresh_main()
    as_main = getattr(runpy, "_run_module_as_main", None)
    if as_main is None:  # not in this Python: the public equivalent, with __main__ swapped in for the run
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        as_main(module, alter_argv=True)


def _run_script_as_main(script: str, argv: tuple[str, ...]) -> None:
    """``python script argv``: ``sys.argv[0]`` as given, ``__file__`` absolute, ``sys.path[0]`` the script's
    (resolved) directory, the code compiled from the file and run in a fresh ``__main__``; a missing file is
    Python's message and status 2."""
    sys.argv = [script, *argv]
    path = os.path.abspath(script)
    try:
        with io.open_code(path) as f:
            source = f.read()
    except OSError as e:
        print(f"{sys.executable}: can't open file {path!r}: [Errno {e.errno}] {e.strerror}", file=sys.stderr,
              flush=True)
        raise SystemExit(2) from None
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = _fresh_main()
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    exec(compile(source, path, "exec"), main.__dict__)


def run_worker(kind: str, target: str, *argv: str) -> NoReturn:
    """A worker forked from the zygote: what ``python -u -m target argv`` (``kind`` module) or ``python -u target
    argv`` (script) does in a fresh interpreter, here: ``sys.argv``, ``sys.path[0]`` (the working directory, or
    the script's directory), ``__main__``, unbuffered output, an uncaught exception's traceback, non-daemon
    threads joined, ``atexit`` handlers, and the exit status (:func:`exit_status`).

    The process then ends at once with that status (``os._exit``), as a fresh interpreter would, rather than
    return to torch's worker wrapper, which would wait for the agent to collect a return value (and a worker
    whose SIGTERM handler exits 0 would sit there until the agent's shutdown timeout). The agent counts workers
    that all exited 0 as a success (:func:`all_exited_zero`)."""
    if FORKED_FROM is not None:  # forked from the zygote: die with it, as a fresh child of the agent would not outlive it
        tie_to_parent(FORKED_FROM["pid"])
    redirect_worker()
    _unbuffered()
    multiprocessing.current_process().name = "MainProcess"
    startfail.watch()  # whether it fails before its first step (startfail.py)
    podfs.install()  # eks-ddp-local: the pod's read-only working directory (podfs.py)
    status = 0
    try:
        if kind == "module":
            _run_module_as_main(target, argv)
        elif kind == "script":
            _run_script_as_main(target, argv)
        else:
            raise ValueError(f"kind: got {kind!r}; expected module or script")
    except SystemExit as e:
        status = exit_status(e.code)
        if e.code is not None and not isinstance(e.code, int):  # sys.exit("message"): python -m's missing module
            startfail.record(e, str(e.code))
        if getattr(e, "final", False):  # exitcodes.exit_process: the code is final, no thread join, no atexit
            _flush()
            os._exit(status)
    except BaseException as e:  # noqa: BLE001  (an uncaught exception: the traceback and 1, as python prints it)
        sys.excepthook(*sys.exc_info())
        startfail.record(e)
        status = 1
    try:
        _join_non_daemon_threads()
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(status)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def all_exited_zero(pcontext) -> bool:
    """True when every forked worker of ``pcontext`` has exited with status 0. torch's agent waits for a return
    value from each (``MultiprocessContext._poll``), which :func:`run_worker` never hands back (it ends the process
    as a fresh interpreter would), so the launcher's agent decides success from the exit statuses, as for
    torchrun's fresh processes. False for fresh-process contexts and while any worker runs."""
    procs = getattr(getattr(pcontext, "_pc", None), "processes", None)
    if not procs:
        return False
    return all(p.exitcode == 0 for p in procs)
