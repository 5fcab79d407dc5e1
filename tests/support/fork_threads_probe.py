"""A worker module for tests/runtime/test_fork_threads.py: which process forked this worker, and how many threads it had
at that instant (``eks_ddp_runtime.workers.FORKED_FROM``), and how many the agent runs meanwhile.

Run as ``python -m eks_ddp_runtime.launch <the cluster's flags> -m tests.support.fork_threads_probe OUT_DIR``; each rank
writes ``OUT_DIR/rank-<RANK>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _status(pid: int, key: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split()[1] for line in f if line.startswith(f"{key}:")), None)
    except OSError:
        return None


def probe() -> dict:
    from eks_ddp_runtime import workers

    parent = os.getppid()
    # Forked from the zygote: its parent is the agent. A fresh process: the parent is the agent itself.
    agent = int(_status(parent, "PPid")) if workers.FORKED_FROM is not None else parent
    return {"rank": int(os.environ["RANK"]), "pid": os.getpid(), "ppid": parent, "agent": agent,
            "agent_threads": int(_status(agent, "Threads") or -1), "forked_from": workers.FORKED_FROM}


if __name__ == "__main__":
    result = probe()
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{result['rank']}.json").write_text(json.dumps(result))
