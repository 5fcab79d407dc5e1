"""What a worker restart waits for, beyond the work itself (review of the worker-kill figure, issue 22).

Two waits sat on every restart, about 1 s each on an idle 2-core machine:

* torch's log formatter imports ``torch._dynamo`` the first time it formats an exception, and the agent formats
  one when a worker fails, between the failure and the next rendezvous;
* torch's rendezvous op executor reads the state of a forming round once a second (a 1 s ``_delay`` on ``SYNC``
  behind a 1 s state cache), so the agents saw a complete round up to a second late.

These tests pin both fixes to torch's behaviour, with torch's own code as the negative control; the figures are
in bench/RESULTS.md (``bench/recovery.py``, the cluster's command).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dyn
from torch.distributed.elastic.rendezvous import utils as rdzv_utils

from eks_ddp_runtime.rendezvous import handler as rendezvous
from tests.support.util import ROOT

_FIRST_EXCEPTION_LOG = textwrap.dedent("""
    import importlib.abc, json, sys
    from eks_ddp_runtime import launch
    if sys.argv[1] == "preloaded":
        launch.preload_failure_logging()
    from torch.distributed.elastic.multiprocessing import api
    imported = []
    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            imported.append(name)
            return None
    sys.meta_path.insert(0, Watch())
    try:
        raise RuntimeError("a worker failed")
    except RuntimeError:
        api.logger.exception("failed (exitcode: -9)")  # what the agent logs when a worker dies
    print(json.dumps(imported))
""")


def _imports_while_logging_a_failure(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _FIRST_EXCEPTION_LOG, mode], cwd=ROOT, capture_output=True,
                         text=True, timeout=180, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_agent_logs_a_worker_failure_without_importing_anything():
    """Negative control first: torch's formatter imports torch._dynamo on the first exception it formats."""
    assert "torch._dynamo" in _imports_while_logging_a_failure("plain")
    assert _imports_while_logging_a_failure("preloaded") == []


def test_the_preload_happens_before_workers_start():
    """The launcher preloads after torch's launch config and before warm_workers starts the zygote (main's body,
    launch._run)."""
    import inspect

    from eks_ddp_runtime import launch

    src = inspect.getsource(launch._run)
    assert src.index("preload_failure_logging()") < src.index("warm_workers(")


class _Holder:
    """A state holder whose state never changes: the executor polls it."""

    def __init__(self) -> None:
        self.state = dyn._RendezvousState()

    def sync(self):
        return None


def _sleeps_of_one_poll(monkeypatch) -> list[float]:
    """Run torch's op executor through one SYNC and record what it sleeps."""
    slept: list[float] = []
    monkeypatch.setattr(rdzv_utils, "time", SimpleNamespace(sleep=slept.append))
    settings = dyn.RendezvousSettings("speed", 1, 2, dyn.RendezvousTimeout(), timedelta(seconds=1), 4)
    node = dyn._NodeDesc("127.0.0.1", 1, 0)
    executor = dyn._DistributedRendezvousOpExecutor(node, _Holder(), settings)
    actions = iter([dyn._Action.SYNC, dyn._Action.FINISH])
    executor.run(lambda ctx, deadline: next(actions), deadline=float("inf"))
    return slept


def test_torch_polls_a_forming_round_once_a_second(monkeypatch):
    """What the cut relies on: torch's executor passes exactly TORCH_SYNC_DELAY_S to ``_delay`` on SYNC."""
    monkeypatch.setattr(dyn, "_delay", rendezvous._torch_delay)
    assert _sleeps_of_one_poll(monkeypatch) == [rendezvous.TORCH_SYNC_DELAY_S]


def test_agents_poll_a_forming_round_every_quarter_second(monkeypatch):
    monkeypatch.setattr(dyn, "_delay", rendezvous._torch_delay)
    rendezvous.register()
    assert _sleeps_of_one_poll(monkeypatch) == [rendezvous.SYNC_POLL_S]
    assert rendezvous.SYNC_POLL_S < rendezvous.TORCH_SYNC_DELAY_S


@pytest.mark.parametrize("jitter", [(0, 0.3), 0.5, 2])
def test_other_delays_are_left_as_torch_asks(monkeypatch, jitter):
    slept: list[float] = []
    me = threading.get_ident()
    # Only this thread's sleeps: a rendezvous thread an earlier test left running may sleep through the same module.
    monkeypatch.setattr(rdzv_utils, "time", SimpleNamespace(
        sleep=lambda s: slept.append(s) if threading.get_ident() == me else time.sleep(s)))
    # torch draws a jittered delay with random.uniform and skips one under 10 ms (1 draw in 30 for (0, 0.3)):
    # the draw is fixed here to the middle of the range, so the test asserts what _poll_delay passes on.
    monkeypatch.setattr(rdzv_utils, "random", SimpleNamespace(uniform=lambda lo, hi: (lo + hi) / 2))
    rendezvous._poll_delay(jitter)
    assert len(slept) == 1
    if isinstance(jitter, tuple):
        assert jitter[0] <= slept[0] <= jitter[1]
    else:
        assert slept == [jitter]


def test_the_state_cache_is_as_short_as_the_poll():
    """A 1 s cache would serve the same stale state to every quarter-second poll."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    params = RendezvousParameters(backend=rendezvous.BACKEND, endpoint="127.0.0.1:1", run_id="speed",
                                  min_nodes=1, max_nodes=2, local_addr="127.0.0.1", protocol="http")
    handler = rendezvous._create(params)  # builds its client without contacting the store
    assert handler._state_holder._cache_duration == rendezvous.SYNC_POLL_S
    plain = dyn._BackendRendezvousStateHolder(handler._state_holder._backend, handler._settings)
    assert plain._cache_duration == 1  # torch's default, which the handler overrides
