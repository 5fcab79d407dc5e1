"""``python -m tests.support.shutdown_abort_probe MODULE <flags>``: MODULE (the trainer, the fabric check) run as ``__main__``
in a process whose interpreter shutdown aborts (an atexit handler calls ``os.abort``), standing in for what torch's
C++ teardown can do there: a static destructor meeting a still-joinable ``std::thread`` ends the process with
"terminate called without an active exception" (SIGABRT) whatever the module returned. The exit status must be
decided before shutdown."""

from __future__ import annotations

import atexit
import os
import runpy
import sys

if __name__ == "__main__":
    atexit.register(os.abort)
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
