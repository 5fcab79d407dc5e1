"""Exit codes of the trainer's processes, and what the training Job does with each.

A retry cannot fix any of these, so the Job's pod failure policy fails the Job at once on them
(the numbers are defined once, in contract.py, which the library imports too) and the launcher
does not restart the workers for them. Every other non-zero exit is treated as transient
(a lost peer, a killed process) and recovered from.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import sys
import threading
import time
from typing import NoReturn

from .contract import (  # noqa: F401 (each code: API, as exitcodes.<NAME>)
    AGENT_LOST,
    BAD_INPUT,
    CONFIG_ERROR,
    DIVERGED,
    FABRIC_FAILED,
    FATAL,
    FATAL_CODES_ENV,
    SUPERSEDED,
    USAGE,
)


def fatal_codes(environ=None) -> frozenset[int]:
    """The worker exit codes that stop the launcher at once: :data:`USAGE`, :data:`FATAL` and the workload's own
    (``EKS_DDP_FATAL_EXIT_CODES``). ValueError naming the variable for a value that is not codes 1-255."""
    raw = (os.environ if environ is None else environ).get(FATAL_CODES_ENV, "")
    extra: set[int] = set()
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            continue
        if not item.isdigit() or not 1 <= int(item) <= 255:
            raise ValueError(f"{FATAL_CODES_ENV}: got {raw!r}; expected comma-separated exit codes between 1 and 255 "
                             "(e.g. 7,9)")
        extra.add(int(item))
    return frozenset({USAGE, *FATAL, *extra})


def exit_process(code: int, *, drain_s: float = 10.0) -> NoReturn:
    """End this process with exit status ``code``, whatever interpreter shutdown would do.

    The exit status is the pod's verdict (0 done, a FATAL code fails the Job, anything else is retried), so it
    is decided here and never left to interpreter shutdown, which can abort: a daemon thread inside torch's C++
    (a snapshot or checkpoint being written when a FATAL error ends the run) is unwound through a ``noexcept``
    frame, and torch's C++ teardown can meet a still-joinable ``std::thread`` (seen once at the end of a
    successful two-process run on a loaded machine); either way "terminate called without an active exception",
    SIGABRT (134 from a shell), not ``code``, and a Job that sees it retries what must fail at once or counts a
    finished worker as failed. So: wait up to ``drain_s`` for the side threads (a write in flight ends in
    milliseconds to seconds), flush the output and end the process without the interpreter's shutdown. Every
    file the trainer keeps is written and closed (atomically, fsynced) before it returns its code.
    """
    deadline = time.monotonic() + drain_s
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and t is not threading.main_thread():
            t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threading.enumerate() if t is not me and t.is_alive() and t is not threading.main_thread()]
    if alive:
        print(f"[exit] {len(alive)} side thread(s) still running after {drain_s:g} s ({', '.join(alive)}): "
              f"exiting {code} without interpreter shutdown", file=sys.stderr)
    if multiprocessing.parent_process() is not None:
        # A multiprocessing child, as the workers the launcher forks from its zygote are (workers.py ``run_worker``,
        # which ends the process with ``os._exit`` at once on a SystemExit marked ``final``, skipping the thread
        # join and atexit handlers as below), or another launcher's forked worker, whose wrapper must see the
        # code (torch's ``record`` hands a 0 to its agent as the return value it waits for; os._exit would leave
        # it waiting) and which then ends with ``os._exit`` itself.
        final = SystemExit(code)
        final.final = True  # type: ignore[attr-defined]
        raise final
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
