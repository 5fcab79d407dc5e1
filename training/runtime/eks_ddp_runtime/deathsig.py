"""Processes that die with their parent: the zygote with its agent, each forked worker with the zygote.

Inside a pod the container's end takes every process with it; outside one (a laptop, bare metal, ``eks-ddp-local``,
another scheduler) an agent killed by SIGKILL or the OOM killer would leave its zygote and its workers running: a
worker would train on alone and then wait for a lease only the dead agent could renew. Linux's
``prctl(PR_SET_PDEATHSIG, sig)`` has the kernel send ``sig`` to a process when its parent goes (prctl(2)).

Two rules of that call shape this module (prctl(2), "PR_SET_PDEATHSIG"):

* the signal is sent when the parent **thread** that created the child exits, not the parent process. The agent
  starts the zygote from its main thread (``workers.warm_workers`` runs in ``launch``), and the zygote forks
  workers from its main loop, so both parents are threads that live as long as their process;
* the setting is cleared in a child of ``fork``, so each process sets it for itself, first thing; and since the
  parent may have died before the call, the caller compares ``getppid()`` with the parent it expects and ends at
  once where they differ (the race prctl(2) describes).

Elsewhere than Linux :func:`tie_to_parent` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
AGENT_PID_ENV = "EKS_DDP_AGENT_PID"
"""Set by the agent for the zygote it starts: the pid the zygote must find as its parent."""


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, loaded once: call it before a fork whose child calls :func:`tie_to_parent` between fork and
    exec (a ``preexec_fn``), so the child only calls into it."""
    return ctypes.CDLL(None, use_errno=True)


def tie_to_parent(expected_parent: int, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent thread exits; if the parent is already not
    ``expected_parent`` (it died before this call), send it now. False where the platform has no such call."""
    if not sys.platform.startswith("linux"):
        return False
    if libc().prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return True
