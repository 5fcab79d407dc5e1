"""The agent's lease and the worker's commit check (eks_ddp_runtime/fence.py), against torch's own drop rule.

torch drops a node from the rendezvous once its heartbeat is older than ``keep_alive_interval *
keep_alive_max_attempt`` (``_BackendRendezvousStateHolder._sanitize``, torch/distributed/elastic/rendezvous/
dynamic_rendezvous.py); the lease must end before that moment for every heartbeat age, with a margin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousSettings,
    RendezvousTimeout,
    _BackendRendezvousStateHolder,
    _NodeDesc,
    _RendezvousState,
)

from eks_ddp_runtime import fence
from tests.support.etcd_server import ROOT, trainer_env

INTERVAL, ATTEMPTS = 1, 4  # the cluster's keep_alive_interval and keep_alive_max_attempt (training/runtime/eks_ddp_runtime/launch_command.py)
ME, PEER = _NodeDesc("10.0.0.1", 100, 0), _NodeDesc("10.0.0.2", 200, 0)


def _state(round_: int, age_s: float, *, participant: bool = True) -> _RendezvousState:
    s = _RendezvousState()
    s.round, s.complete = round_, True
    s.participants = {ME: 0, PEER: 1} if participant else {PEER: 0}
    now = datetime.now(timezone.utc)  # noqa: UP017  (torch's own clock call)
    s.last_heartbeats = {ME: now - timedelta(seconds=age_s), PEER: now}
    return s


def _lease(tmp_path, round_: int = 3) -> fence.Lease:
    lease = fence.Lease(root=str(tmp_path))
    lease.configure(INTERVAL * ATTEMPTS, INTERVAL)
    lease.round = round_
    return lease


def _torch_drops_me(state: _RendezvousState) -> bool:
    """torch's own _sanitize, as a peer running it now would apply it."""
    settings = RendezvousSettings("run", 1, 2, RendezvousTimeout(), timedelta(seconds=INTERVAL), ATTEMPTS)
    holder = _BackendRendezvousStateHolder(backend=None, settings=settings)
    holder._state = state
    holder._sanitize()
    return ME not in state.participants


@pytest.mark.parametrize("age_s", [0.0, 1.0, 2.5, 3.5, 3.9, 4.2, 10.0])
def test_the_lease_ends_before_torch_drops_the_node(tmp_path, age_s):
    lease = _lease(tmp_path)
    state = _state(3, age_s)
    lease.seen(ME, state)
    valid = lease.valid()
    assert valid == (age_s < INTERVAL * ATTEMPTS - INTERVAL), (age_s, lease.valid_until)  # the window less a beat
    if valid:  # while the lease holds, no peer may drop this node (torch's rule, run on a copy of the state)
        assert not _torch_drops_me(_state(3, age_s)), age_s
    # Negative control of the rule itself: past the drop window torch drops the node.
    assert _torch_drops_me(_state(3, INTERVAL * ATTEMPTS + 0.5))


def test_the_lease_is_published_to_a_private_file_and_withdrawn_when_the_node_is_absent(tmp_path):
    lease = _lease(tmp_path)
    assert os.stat(lease.dir).st_mode & 0o777 == 0o700
    lease.seen(ME, _state(3, 0.0))
    published = json.loads(open(lease.path).read())
    assert published["round"] == 3 and published["valid_until"] == lease.valid_until > time.monotonic() + 2.5
    # An older heartbeat never shortens it, the same one never lengthens it.
    until = lease.valid_until
    lease.seen(ME, _state(3, 2.0))
    assert lease.valid_until == until
    # Dropped from the state (or a store that came back empty), another round: withdrawn at once.
    forming = _state(3, 0.0)
    forming.complete = False
    for state in (_state(3, 0.0, participant=False), _state(4, 0.0), forming, _RendezvousState()):
        lease.seen(ME, _state(3, 0.0))
        assert lease.valid()
        lease.seen(ME, state)
        assert not lease.valid() and json.loads(open(lease.path).read())["valid_until"] == 0.0
    lease.close()
    assert not os.path.exists(lease.dir)


def test_a_lease_that_never_saw_a_round_is_never_valid(tmp_path):
    lease = fence.Lease(root=str(tmp_path))
    lease.configure(4, 1)
    lease.seen(ME, _state(0, 0.0))  # round None: the agent has not completed a round yet
    assert not lease.valid()
    with pytest.raises(ValueError, match="expected window > margin >= 0"):
        lease.configure(1, 1)


def _worker_check(env: dict[str, str], now_offset_s: float = 0.0) -> tuple[bool, str]:
    code = ("import time\nfrom eks_ddp_runtime import fence\n"
            f"ok, why = fence.lease(time.monotonic() + {now_offset_s})\nprint(ok)\nprint(why)\n"
            "print(fence.commit_allowed('checkpoint step 5'), fence.commit_allowed('checkpoint step 10'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=trainer_env(env), capture_output=True,
                          text=True, timeout=60)
    out = proc.stdout.splitlines()
    return out[0] == "True", out[1] + "\n" + "\n".join(out[2:]) + "\n" + proc.stderr


def test_a_worker_commits_only_under_its_agents_valid_lease_for_its_round(tmp_path):
    lease = _lease(tmp_path)
    lease.seen(ME, _state(3, 0.0))
    env = {fence.LEASE_FILE_ENV: lease.path, fence.ROUND_ENV: "3"}
    ok, out = _worker_check(env)
    assert ok, out
    ok, out = _worker_check(env, now_offset_s=5.0)  # the same file 5 s later: expired
    assert not ok and "lease expired" in out, out
    ok, out = _worker_check({**env, fence.ROUND_ENV: "2"})  # a worker of an older round
    assert not ok and "started for round 2" in out, out
    ok, out = _worker_check({**env, fence.LEASE_FILE_ENV: str(tmp_path / "missing.json")})
    assert not ok and "unreadable" in out, out
    lease.withdraw("test")
    ok, out = _worker_check(env)
    assert not ok and "holds no lease" in out, out
    assert "False False" in out and out.count("commit deferred") == 1, out  # one line per kind, not per attempt


def test_outside_the_launcher_every_commit_is_allowed():
    ok, out = _worker_check({fence.LEASE_FILE_ENV: ""})
    assert ok and "not under eks_ddp_runtime.launch" in out, out


def test_a_lease_file_others_can_write_is_not_trusted(tmp_path):
    # Negative control of the private-directory check: the same valid lease, in a folder anyone may write to.
    lease = _lease(tmp_path)
    lease.seen(ME, _state(3, 0.0))
    os.chmod(lease.dir, 0o777)
    ok, out = _worker_check({fence.LEASE_FILE_ENV: lease.path, fence.ROUND_ENV: "3"})
    assert not ok and "private directory" in out, out


def test_a_pause_between_the_clock_reads_cannot_extend_the_lease(tmp_path, monkeypatch):
    """R4: one clock for both reads (the wall clock is the monotonic one plus a fixed offset), and a 5 s pause
    right after the first read of either clock. The lease must end before the heartbeat is a drop window old."""
    epoch = datetime(2026, 1, 1, tzinfo=timezone.utc)  # noqa: UP017
    clock = {"t": 1000.0, "reads": 0}

    def read() -> float:
        value = clock["t"]
        clock["reads"] += 1
        if clock["reads"] == 1:
            clock["t"] += 5.0  # the pause
        return value

    class Wall(datetime):
        @classmethod
        def now(cls, tz=None):
            return epoch + timedelta(seconds=read())

    monkeypatch.setattr(fence.time, "monotonic", read)
    monkeypatch.setattr(fence, "datetime", Wall)
    lease = _lease(tmp_path)
    written = 999.5  # the heartbeat, on the same clock: 0.5 s old at the first read
    state = _state(3, 0.0)
    state.last_heartbeats[ME] = epoch + timedelta(seconds=written)
    lease.seen(ME, state)
    assert clock["reads"] == 2
    assert lease.valid_until <= written + INTERVAL * ATTEMPTS - INTERVAL, lease.valid_until
    # Negative control: without the pause the same heartbeat gives the full lease (the rule is not just "shorter").
    clock.update(t=1000.0, reads=-10)
    lease2 = _lease(tmp_path)
    lease2.seen(ME, state)
    assert lease2.valid_until == pytest.approx(written + INTERVAL * ATTEMPTS - INTERVAL)


_AGENT = """
import sys, time
from eks_ddp_runtime import fence
lease = fence.Lease(root=sys.argv[1])
lease.configure(4.0, 1.0)
lease.round = 3
lease._publish()
print(lease.path, flush=True)
time.sleep(120)
"""
_WAITER = """
from eks_ddp_runtime import fence
fence.wait_for_lease("final checkpoint", poll_s=0.2, timeout_s=60)
print("gave up waiting", flush=True)
"""


def test_a_worker_whose_agent_died_exits_naming_the_cause(tmp_path):
    """Issue 42: outside a pod nothing else ends a worker when its agent is SIGKILLed; it must not wait for a
    lease only the dead agent could renew. Real processes: an agent that publishes a lease and a worker waiting on
    it (as the final checkpoint does)."""
    from eks_ddp_runtime.contract import AGENT_LOST

    env = trainer_env()
    agent = subprocess.Popen([sys.executable, "-c", _AGENT, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        path = agent.stdout.readline().strip()
        assert path, "the agent published no lease"
        worker_env = {**env, fence.LEASE_FILE_ENV: path, fence.ROUND_ENV: "3"}
        worker = subprocess.Popen([sys.executable, "-c", _WAITER], env=worker_env, stderr=subprocess.PIPE, text=True)
        # Negative control: while the agent lives the worker waits (the lease was never valid, it stays deferred).
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(timeout=4)
        agent.kill()
        agent.wait(timeout=10)
        killed = time.monotonic()
        rc = worker.wait(timeout=30)
        took = time.monotonic() - killed
        err = worker.stderr.read()
        assert rc == AGENT_LOST, (rc, err)
        # "is gone" once the agent is reaped, "has died (a zombie)" if the worker looks between its death and the
        # reaping: both name the cause.
        assert (f"its agent (pid {agent.pid}) is gone" in err or f"its agent (pid {agent.pid}) has died" in err) \
            and "agent lost" in err, err
        assert took < 10, took
    finally:
        for p in (agent, worker):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
