"""Test-only: counts the opens of committed durable checkpoints in every Python process that imports it.

Put this folder first on PYTHONPATH and set EKS_DDP_TEST_OPENS_FILE: each open of a committed checkpoint
(``<run>/checkpoints/ckpt-<9 digits>.pt``, not a temp file or a sidecar) appends ``<time> <pid> <RANK> <mode> <path>``
to that file. An audit hook (PEP 578) sees every ``open()``, ``torch.load``'s and ``Path.read_bytes``' included, in
any version of the trainer, so the same counter runs on old and new code alike (tests/support/opens.py).
"""

import os
import re
import sys
import time

_FILE = os.environ.get("EKS_DDP_TEST_OPENS_FILE")
_COMMITTED = re.compile(r"/checkpoints/ckpt-\d{9}\.pt$")
_busy = False


def _hook(event, args):
    global _busy
    if event != "open" or _busy or not args or not isinstance(args[0], str) or not _COMMITTED.search(args[0]):
        return
    mode = args[1] if len(args) > 1 and isinstance(args[1], str) else "r"
    if "r" not in mode or "+" in mode:
        return
    _busy = True
    try:
        with open(_FILE, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.3f} {os.getpid()} {os.environ.get('RANK', '-')} {mode} {args[0]}\n")
    finally:
        _busy = False


if _FILE:
    sys.addaudithook(_hook)
