"""A start failure: every worker of an agent failed the same way before its first step, in the agent's first round.

A ``ModuleNotFoundError`` at import, a typo'd ``-m`` module, a ``NameError`` at the top of a script: each worker
hits it on every start, so the elastic fault budget (``--max-restarts`` per agent, then the Job's own retries) would
only repeat it, on GPU nodes, for hours. The launcher stops at once instead with the usage error's code
(contract.py ``USAGE``, 2), which the Job's pod failure policy already treats as fatal. Real faults are still
retried: a worker killed by a signal, a node lost, an error once training ran, an error in a later round.

"Before its first step" is taken as "before the worker called ``torch.distributed.init_process_group``": no DDP step
can run before it, and no peer was involved yet, so the error is the worker's own code and data. The two halves:

* the worker (:func:`watch` and :func:`record`, called by workers.py ``run_worker`` in workers forked from the
  zygote): marks ``<TORCHELASTIC_ERROR_FILE>.started`` when it enters ``init_process_group``, and on an uncaught
  exception writes torch's own error file (the format of torch's ``ErrorHandler.record_exception``,
  torch/distributed/elastic/multiprocessing/errors/error_handler.py, which torch's ``ProcessFailure`` reads back as
  the failure's message) with :data:`KEY` telling whether it came before the first step and whether its kind can
  be transient;
* the agent (:func:`start_failure`, in launch.py ``Agent._monitor_workers``): in its first round, when the worker
  that failed and every other local worker that ran to its end recorded the same non-transient exception before
  the first step, and no local worker it stopped had reached ``init_process_group``, that is a start failure.

Each agent decides from its own workers only: the first to decide exits 2 and the Job fails (pod failure policy).
Workers started as fresh processes (``EKS_DDP_FORK_WORKERS=0``, or a zygote unsafe to fork) write no record: their
failures are retried as torchrun's are.

**A repeated failure** (:func:`round_failure` and :class:`RepeatedFailure`, the agent's check over consecutive
rounds): most scripts call ``init_process_group`` first and only then create their checkpoint folder, read a file or
build the model, so a mistake there comes after the start marker and is no start failure. It is as certain, though:
the same exception, raised at the same place, before any step completed, in every round. A worker marks
``<error file>.stepped`` when its first optimizer step completes (torch's global
``register_optimizer_step_post_hook``, called after every ``torch.optim`` optimizer's ``step``), and its record
names the place (:func:`place`: the innermost frame outside this runtime). When :data:`REPEATS` consecutive rounds
of an agent failed with one non-transient exception at one place and no worker of theirs completed a step, the agent
exits 2: a restart, or a resume, would repeat it. Peers that fail noticing the failed one (torch's ``RuntimeError``:
a closed connection) do not hide it. Still retried: an error once a step completed, a different error or place in
the next round, a transient kind (:func:`transient`), a worker killed by a signal. A loop without a ``torch.optim``
optimizer (its own update rule) never marks a step, so the same error at the same place in :data:`REPEATS` rounds
stops it too, however long each round trained.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
import sysconfig
import time
import traceback

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
"""Where torch's agent reads a worker's failure (set by the agent's logs specs for every worker)."""
KEY = "eks_ddp"
"""The runtime's part of the record, under torch's ``extraInfo``."""
STARTED_SUFFIX = ".started"
STEPPED_SUFFIX = ".stepped"
"""Beside a worker's error file once an optimizer step of its completed (this round)."""
REPEATS = 3
"""Consecutive rounds of an agent that must fail with the same error at the same place, before any step completed,
for it to stop (:class:`RepeatedFailure`): the first start and two restarts."""
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.ESTALE, errno.EAGAIN, errno.EBUSY, errno.ENOMEM,
                              errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH})
"""OSErrors a retry (or another node) can fix: the disk, the network, the shared file system."""

_started = False
_stepped = False


def transient(e: BaseException) -> bool:
    """Kinds of error that can pass on their own, so that a start failure of this kind is still retried:
    torch's errors (``RuntimeError``: CUDA, NCCL, the store, a GPU fault on one node), memory, the network, a
    timeout, a flaky disk or file system (:data:`TRANSIENT_ERRNOS`), and an interruption (``KeyboardInterrupt``:
    not the code's fault). ``sys.exit("message")`` is the code's own decision: not transient."""
    if isinstance(e, SystemExit):
        return False
    if not isinstance(e, Exception):
        return True
    if isinstance(e, (RuntimeError, MemoryError, ConnectionError, TimeoutError)):
        return True
    return isinstance(e, OSError) and e.errno in TRANSIENT_ERRNOS


def _started_path(suffix: str = STARTED_SUFFIX) -> str | None:
    path = os.environ.get(ERROR_FILE_ENV, "")
    return path + suffix if path and path != os.devnull else None


def place(e: BaseException) -> str | None:
    """Where ``e`` was raised: ``file:line`` of the innermost frame of its traceback outside this runtime (whose
    wrappers, the read-only root of podfs.py and the worker's runner, are not the user's place) and outside Python's
    standard library (``os.makedirs`` is not the place; the line that called it is); None without one."""
    paths = sysconfig.get_paths()
    stdlib = [os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib")]
    installed = [os.path.abspath(paths[k]) + os.sep for k in ("purelib", "platlib")]  # under stdlib outside a venv
    runtime = os.path.dirname(os.path.abspath(__file__)) + os.sep
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        name = os.path.abspath(frame.filename)
        if frame.filename.startswith("<") or name.startswith(runtime) or (
                name.startswith(tuple(stdlib)) and not name.startswith(tuple(installed))):
            continue
        return f"{frame.filename}:{frame.lineno}"
    return None


def _watch_steps() -> None:
    """Mark this worker as having completed a step on its first optimizer step (torch.optim's global hook)."""
    optimizer = sys.modules.get("torch.optim.optimizer")
    register = getattr(optimizer, "register_optimizer_step_post_hook", None)
    if register is None:
        return

    def stepped(*_args) -> None:
        global _stepped
        if _stepped:
            return
        _stepped = True
        marker = _started_path(STEPPED_SUFFIX)
        if marker is not None:
            try:
                with open(marker, "w") as f:
                    f.write(str(time.time()))
            except OSError:
                pass

    register(stepped)


def watch() -> None:
    """In a worker, before the user's code runs: a call of ``torch.distributed.init_process_group`` (whichever name
    it is reached by, e.g. ``torch.distributed.init_process_group`` or through ``init_device_mesh``) marks this
    worker as started. A stale marker of an earlier start with the same error file is removed."""
    global _started, _stepped
    _started = _stepped = False
    for suffix in (STARTED_SUFFIX, STEPPED_SUFFIX):
        marker = _started_path(suffix)
        if marker is not None:
            try:
                os.unlink(marker)
            except OSError:
                pass
    _watch_steps()
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    original = getattr(c10d, "init_process_group", None)
    if original is None or getattr(original, "_eks_ddp_watch", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        _mark_started()
        return original(*args, **kwargs)

    init_process_group._eks_ddp_watch = True  # type: ignore[attr-defined]
    for module in list(sys.modules.values()):  # every name it is already bound to (torch.distributed, device_mesh)
        if getattr(module, "init_process_group", None) is original:
            setattr(module, "init_process_group", init_process_group)  # noqa: B010


def _mark_started() -> None:
    global _started
    if _started:
        return
    _started = True
    marker = _started_path()
    if marker is not None:
        try:
            with open(marker, "w") as f:
                f.write(str(time.time()))
        except OSError:
            pass


def record(e: BaseException, message: str | None = None) -> None:
    """In a worker, for an uncaught exception (or ``sys.exit("a message")``, as ``python -m`` ends for a module it
    cannot find): torch's error file, with :data:`KEY` saying whether it came before the first step."""
    path = os.environ.get(ERROR_FILE_ENV, "")
    if not path or path == os.devnull:
        return
    text = message if message is not None else f"{type(e).__name__}: {e}"
    data = {"message": {"message": text[:2000], "extraInfo": {
        "py_callstack": "".join(traceback.format_exception(e))[-20000:],
        "timestamp": str(int(time.time())),
        KEY: {"before_first_step": not _started, "transient": transient(e), "stepped": _stepped,
              "place": place(e)}}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


def read(path: str | None) -> dict | None:
    """A worker's record: ``{"message", "before_first_step", "transient", "stepped", "place"}``; None when it wrote
    none (``stepped`` and ``place`` are False and None in a record of an older runtime)."""
    if not path or path == os.devnull:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        message = data["message"]
        mine = message["extraInfo"][KEY]
        return {"message": str(message["message"]), "before_first_step": bool(mine["before_first_step"]),
                "transient": bool(mine["transient"]), "stepped": bool(mine.get("stepped", False)),
                "place": mine.get("place")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def start_failure(error_files: dict[int, str], failed: set[int]) -> str | None:
    """The one error every local worker failed with before its first step, or None when this is not a start failure.

    ``error_files``: every local worker's error file; ``failed``: the local ranks torch reported as failed (the
    first to exit non-zero; the agent stopped the others). A start failure needs a failed worker's record, before
    the first step and not transient, that every other record repeats, and no worker without a record (one the
    agent stopped) that had entered ``init_process_group``."""
    records = {local: read(path) for local, path in error_files.items()}
    if not failed or any(records.get(local) is None for local in failed):
        return None
    messages = set()
    for local, rec in records.items():
        if rec is None:
            if os.path.exists(error_files[local] + STARTED_SUFFIX):
                return None  # a peer was already in init_process_group: not the same failure
            continue
        if not rec["before_first_step"] or rec["transient"]:
            return None
        messages.add(rec["message"])
    return messages.pop() if len(messages) == 1 else None


def round_failure(error_files: dict[int, str], failed: set[int]) -> tuple[str, str] | None:
    """The error this round of an agent's workers failed with, as ``(message, place)``, when it can repeat in every
    round: every failed worker left a record; those that are not transient name one message at one place; and no
    local worker completed a step (its record or its ``.stepped`` marker says so). None otherwise: a worker killed
    by a signal (no record), only transient errors, two different errors, or a step done."""
    records = {local: read(path) for local, path in error_files.items()}
    if not failed or any(records.get(local) is None for local in failed):
        return None
    seen: set[tuple[str, str]] = set()
    for local, rec in records.items():
        if os.path.exists(error_files[local] + STEPPED_SUFFIX) or (rec is not None and rec["stepped"]):
            return None
        if rec is not None and not rec["transient"]:
            if rec["place"] is None:
                return None
            seen.add((rec["message"], rec["place"]))
    return seen.pop() if len(seen) == 1 else None


class RepeatedFailure:
    """An agent's memory of its failed rounds: :meth:`add` returns the error once :data:`REPEATS` consecutive worker
    starts (``n``, ``n + 1``, ...) failed with the same :func:`round_failure`."""

    def __init__(self, repeats: int = REPEATS) -> None:
        self.repeats = repeats
        self._last: tuple[int, tuple[str, str] | None] | None = None
        self._count = 0
        self.hit = False
        """Whether the last round made it :attr:`repeats` in a row."""

    def add(self, start: int, error: tuple[str, str] | None) -> tuple[str, str] | None:
        previous = self._last
        same = previous is not None and error is not None and previous[0] == start - 1 and previous[1] == error
        self._count = self._count + 1 if same else (1 if error is not None else 0)
        self._last = (start, error)
        self.hit = error is not None and self._count >= self.repeats
        return error if self.hit else None
