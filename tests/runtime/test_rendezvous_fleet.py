"""The rendezvous backend at fleet size, pinned small: per-agent store writes that do not grow with N, heartbeats as
keys on leases, and a drop that only lands while the dropped node's key is gone (docs/rendezvous.md "Why two worlds
never both commit"). Large N and timings go to the bench (bench/), not here."""

from __future__ import annotations

import pickle
import time
import uuid
from datetime import datetime, timezone

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

from eks_ddp_runtime.rendezvous import handler as handler_module
from eks_ddp_runtime.rendezvous import handler as rendezvous
from eks_ddp_runtime.rendezvous.etcd_backend import EPOCH, EtcdV3Backend, Retrier, node_id
from eks_ddp_runtime.rendezvous.etcd_client import EtcdV3Client
from tests.support.etcd_server import client_tls, etcd_endpoint  # noqa: F401  (pytest fixture)

pytestmark = pytest.mark.slow

WRITES = ("kv/put", "kv/deleterange", "lease/grant", "lease/revoke")


def _now() -> datetime:
    return datetime.now(timezone.utc)  # noqa: UP017  (Python 3.10: make test-compat)


def _backend(etcd, run_id: str, ttl_s: float = 30.0) -> EtcdV3Backend:
    tls = client_tls(etcd)
    params = RendezvousParameters(backend=rendezvous.BACKEND, endpoint=str(etcd), run_id=run_id, min_nodes=1,
                                  max_nodes=64, protocol="https", ca_cert=tls.ca_cert, ssl_cert=tls.cert,
                                  ssl_cert_key=tls.key, read_timeout="5")
    return EtcdV3Backend(Retrier(params, 10.0), run_id, rendezvous.BACKEND, heartbeat_ttl_s=ttl_s)


def _client(etcd) -> EtcdV3Client:
    host, port = str(etcd).split(":")
    return EtcdV3Client(host, int(port), read_timeout=5, context=etcd.tls.client_context())


def _revision(etcd) -> int:
    return int(_client(etcd).call("kv/range", {"key": "AA=="})["header"]["revision"])


def _update(backend: EtcdV3Backend, change) -> _RendezvousState:
    """What torch's state holder does: read, change, compare-and-set, again until it lands."""
    for _ in range(100):
        got = backend.get_state()
        state, token = (pickle.loads(got[0]), got[1]) if got else (_RendezvousState(), None)
        change(state)
        bits, _, ok = backend.set_state(pickle.dumps(state), token)
        if ok:
            return pickle.loads(bits)
    raise AssertionError("no compare-and-set landed in 100 tries")


def _world(etcd, n: int, ttl_s: float = 30.0) -> tuple[list[EtcdV3Backend], list[_NodeDesc]]:
    """``n`` agents (one backend each, as on n nodes) that joined one round and completed it."""
    run_id = f"fleet-{uuid.uuid4().hex[:10]}"
    backends = [_backend(etcd, run_id, ttl_s) for _ in range(n)]
    nodes = [_NodeDesc(f"10.0.{i // 250}.{i % 250 + 1}", 1000 + i, 0) for i in range(n)]

    def join(node):
        def change(s):
            s.participants[node] = 0
            s.last_heartbeats[node] = _now()
            if len(s.participants) == n:
                s.complete = True
                for rank, p in enumerate(sorted(s.participants)):
                    s.participants[p] = rank
        return change

    for backend, node in zip(backends, nodes, strict=True):
        _update(backend, join(node))
    return backends, nodes


class _Recorder:
    """Every request one agent's client sends: (path, body bytes)."""

    def __init__(self, monkeypatch, backend: EtcdV3Backend) -> None:
        self.calls: list[tuple[str, int, bool]] = []
        client = backend._retry.client()
        real = client.call

        def call(path, body):
            import json

            size = len(json.dumps(body))
            writes = path in WRITES or (path == "kv/txn" and any(
                "request_put" in op or "request_delete_range" in op
                for op in [*body.get("success", []), *body.get("failure", [])]))
            self.calls.append((path, size, writes))
            return real(path, body)
        monkeypatch.setattr(client, "call", call)


def _beats(backend: EtcdV3Backend, node: _NodeDesc, count: int) -> None:
    """torch's keep-alive op, ``count`` times: sync, set this node's heartbeat, write."""
    for _ in range(count):
        got = backend.get_state()
        assert got is not None
        state = pickle.loads(got[0])
        assert state.last_heartbeats[node] > EPOCH
        state.last_heartbeats[node] = _now()
        _, _, ok = backend.set_state(pickle.dumps(state), got[1])
        assert ok


def test_an_agents_store_writes_per_heartbeat_do_not_grow_with_the_number_of_agents(etcd_endpoint, monkeypatch):  # noqa: F811
    """Each heartbeat rewrote the shared state, which holds every agent: one etcd revision and O(N) bytes per agent
    per second, O(N^2) for the store (issue: WAL bytes x4 for x2 agents). Now a heartbeat renews the agent's lease:
    no revision at all, and the same requests of the same size at N=4 and N=12."""
    per_n = {}
    for n in (4, 12):
        backends, nodes = _world(etcd_endpoint, n)
        _beats(backends[0], nodes[0], 1)  # the first beat after joining (its lease is the join's)
        recorder = _Recorder(monkeypatch, backends[0])
        before = _revision(etcd_endpoint)
        _beats(backends[0], nodes[0], 5)
        after = _revision(etcd_endpoint)
        monkeypatch.undo()
        written = sum(size for _, size, w in recorder.calls if w)
        per_n[n] = (after - before, written, len(recorder.calls), sum(size for _, size, _ in recorder.calls))
    (revs4, written4, requests4, bytes4), (revs12, written12, requests12, bytes12) = per_n[4], per_n[12]
    assert revs4 == revs12 == 0, per_n  # no write reached etcd's keyspace (before: one revision per beat)
    assert written4 == written12 == 0, per_n
    assert requests12 <= 1.5 * requests4 and bytes12 <= 1.5 * bytes4, per_n


def test_a_dead_agent_reads_as_expired_once_its_lease_lapses_and_only_then(etcd_endpoint):  # noqa: F811
    backends, nodes = _world(etcd_endpoint, 3)
    seen = pickle.loads(backends[0].get_state()[0])
    assert all(seen.last_heartbeats[n] > EPOCH for n in nodes)
    # Agent 2 dies: its lease is gone (revoked here; expiry after the drop window on a real loss).
    _client(etcd_endpoint).lease_revoke(backends[2]._mine[node_id(nodes[2])].lease)
    seen = pickle.loads(backends[0].get_state()[0])
    assert nodes[2] not in seen.participants and nodes[2] not in seen.last_heartbeats  # what torch's _sanitize drops
    assert seen.last_heartbeats[nodes[1]] > EPOCH and nodes[1] in seen.participants


def test_a_drop_lands_only_while_the_dropped_agents_key_is_gone(etcd_endpoint):  # noqa: F811
    """The lease argument: an agent is out of the state only while its heartbeat key is gone (the merged view leaves
    it out), and a peer's write of the core that leaves it out lands only while the key is still gone. An agent
    that renewed in between (its key is back) is in the state again, and the write that would drop it fails."""
    backends, nodes = _world(etcd_endpoint, 3)
    victim, peer = nodes[2], backends[0]
    _client(etcd_endpoint).lease_revoke(backends[2]._mine[node_id(victim)].lease)
    got = peer.get_state()
    state = pickle.loads(got[0])
    assert victim not in state.participants
    # The victim comes back (its next heartbeat finds its lease gone and makes a new key) before the peer writes.
    backends[2].set_state(*_own_beat(backends[2], victim))
    assert victim in pickle.loads(peer.get_state()[0]).participants
    state.closed = True  # a write of the core, built on the read that left the victim out
    bits, _, ok = peer.set_state(pickle.dumps(state), got[1])
    assert not ok and victim in pickle.loads(bits).participants
    assert pickle.loads(bits).last_heartbeats[victim] > EPOCH
    # Negative control: with the key gone at the write, the same write lands, and the core no longer lists it.
    _client(etcd_endpoint).lease_revoke(backends[2]._mine[node_id(victim)].lease)
    got = peer.get_state()
    state = pickle.loads(got[0])
    state.closed = True
    bits, _, ok = peer.set_state(pickle.dumps(state), got[1])
    assert ok and victim not in pickle.loads(bits).participants
    assert node_id(victim) not in peer._core.decode()


def _own_beat(backend: EtcdV3Backend, node: _NodeDesc) -> tuple[bytes, int]:
    """torch's keep-alive op on the agent's own last read: its node's heartbeat time now."""
    got = backend.get_state()
    assert got is not None
    state = pickle.loads(got[0])
    state.last_heartbeats[node] = _now()
    return pickle.dumps(state), got[1]


def test_a_heartbeat_lease_lives_the_drop_window_after_the_last_renewal(etcd_endpoint):  # noqa: F811
    backends, nodes = _world(etcd_endpoint, 2)
    lease = backends[1]._mine[node_id(nodes[1])].lease
    ttl = int(_client(etcd_endpoint).call("lease/timetolive", {"ID": str(lease)})["grantedTTL"])
    assert ttl == backends[1].heartbeat_ttl == 30


def _agents(etcd, run_id: str, n: int, join_s: int):
    tls = client_tls(etcd)
    params = {"protocol": "https", "ca_cert": tls.ca_cert, "ssl_cert": tls.cert, "ssl_cert_key": tls.key,
              "read_timeout": "5", "store_retry_timeout": "10", "keep_alive_interval": "1",
              "keep_alive_max_attempt": "4", "last_call_timeout": "1", "join_timeout": str(join_s)}
    handlers = []
    for _ in range(n):
        h = rendezvous._create(RendezvousParameters(backend=rendezvous.BACKEND, endpoint=str(etcd), run_id=run_id,
                                                    min_nodes=1, max_nodes=n + 2, local_addr="127.0.0.1", **params))
        h.joined = True  # survivors re-forming (after a wipe: the round is open, nobody is in it yet)
        handlers.append(h)
    return handlers


def _spread_join(handlers, gap_s: float) -> list:
    """Each agent calls next_rendezvous ``gap_s`` after the one before; their world sizes (or the errors)."""
    import threading

    out: list = [None] * len(handlers)

    def join(i):
        time.sleep(i * gap_s)
        try:
            out[i] = handlers[i].next_rendezvous().world_size
        except Exception as e:  # noqa: BLE001  (a straggler left out times out: the control's outcome)
            out[i] = type(e).__name__
        finally:
            handlers[i]._stop_heartbeats()

    threads = [threading.Thread(target=join, args=(i,), daemon=True) for i in range(len(handlers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_agents_arriving_spread_within_the_last_call_of_one_another_form_one_round(etcd_endpoint, monkeypatch):  # noqa: F811
    """Four survivors arrive 0.6 s apart (1.8 s in all; last_call_timeout 1 s, min_nodes 1): one round of 4. torch's
    rule (the deadline set once, when the minimum joined) closes the round 1 s after the first arrival, and the
    stragglers wait for the next one (the control)."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    worlds = _spread_join(_agents(etcd_endpoint, f"spread-{uuid.uuid4().hex[:8]}", 4, 30), 0.6)
    assert worlds == [4, 4, 4, 4], worlds

    monkeypatch.setattr(rendezvous.ElasticHandler, "next_rendezvous", _without_converge, raising=True)
    monkeypatch.setattr(EtcdV3Backend, "_claim_for", lambda self, new, core, known: None)  # every move a write of the core
    monkeypatch.setattr(EtcdV3Backend, "_leave_close", lambda self, c, new: False)  # any participant closes at once
    worlds = _spread_join(_agents(etcd_endpoint, f"spread-{uuid.uuid4().hex[:8]}", 4, 4), 0.6)
    assert worlds != [4, 4, 4, 4], worlds  # torch's rule: a first world of 1-2, the rest later


_original_next = rendezvous.ElasticHandler.next_rendezvous


class _TorchExecutor(handler_module._ConvergingOpExecutor):
    """torch's own last call: the deadline set once (the control)."""

    converge = property(lambda self: False, lambda self, value: None)  # type: ignore[assignment]


def _without_converge(self):
    self._op_executor.__class__ = _TorchExecutor
    return _original_next(self)


def test_a_peers_time_from_an_older_read_never_brings_it_back(etcd_endpoint):  # noqa: F811
    """A holder that read the state while a peer was alive and writes after the peer's key went must not renew the
    peer: only an agent's own heartbeats (or a node new to the state) make keys."""
    backends, nodes = _world(etcd_endpoint, 3)
    me, peer = backends[0], nodes[2]
    got = me.get_state()
    stale = pickle.loads(got[0])
    assert stale.last_heartbeats[peer] > EPOCH
    _client(etcd_endpoint).lease_revoke(backends[2]._mine[node_id(peer)].lease)
    assert peer not in pickle.loads(me.get_state()[0]).last_heartbeats
    stale.last_heartbeats[nodes[0]] = _now()  # this agent's own beat, on the older read
    bits, _, _ = me.set_state(pickle.dumps(stale), got[1])
    assert peer not in pickle.loads(bits).last_heartbeats
    assert not _client(etcd_endpoint).get_prefix(me.heartbeats + node_id(peer).encode())


_SERIALIZE = r"""
import json, sys
from datetime import datetime, timezone
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState
from eks_ddp_runtime.rendezvous import state as rdzv_state
s = _RendezvousState()
s.round, s.complete = 3, True
t = datetime(2026, 12, 7, tzinfo=timezone.utc)
nodes = [_NodeDesc(f"10.0.0.{i}", 100 + i, 0) for i in range(8)]
for n in (nodes[:4] if sys.argv[1] == "a" else reversed(nodes[:4])):
    s.participants[n] = nodes.index(n)
    s.last_heartbeats[n] = t
s.wait_list = set(nodes[4:6])
s.redundancy_list = set(nodes[6:])
print(json.dumps([rdzv_state.to_json(s).decode(), [n.pid for n in s.wait_list] + [n.pid for n in s.redundancy_list]]))
"""


def test_two_agents_with_other_hash_seeds_write_the_same_bytes_for_one_state():
    """The backend recognises a heartbeat-only change by comparing the core it would write with the bytes it read;
    sets iterate in per-process hash order and dicts in insertion order. Three processes with other hash seeds (as
    the launcher runs them), two waiters and two spares, participants added in two orders: one value. The raw set
    order those processes see is the negative control: it differs, which before made every keep-alive a
    compare-and-set of the whole core (2.6 writes/s with two spares among six agents)."""
    import json
    import os
    import subprocess
    import sys

    from tests.support.etcd_server import ROOT

    out = []
    for seed, order in (("1", "a"), ("2", "b"), ("3", "a")):
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "training" / "runtime"), os.environ.get("PYTHONPATH")) if p)}
        proc = subprocess.run([sys.executable, "-c", _SERIALIZE, order], capture_output=True, text=True, env=env,
                              timeout=120, check=True)
        out.append(json.loads(proc.stdout))
    assert len({value for value, _ in out}) == 1, out
    assert len({tuple(raw) for _, raw in out}) > 1, out  # the sets' own orders differ across the processes


def test_a_keepalive_that_loses_its_compare_and_set_still_renews_its_lease(etcd_endpoint, monkeypatch):  # noqa: F811
    """Under contention a keep-alive's write may lose; its lease must be renewed all the same, or a waiting agent's
    key lapses and it is dropped (11 of 31 leases expired during one re-form at N=32)."""
    backends, nodes = _world(etcd_endpoint, 2)
    got = backends[0].get_state()
    state = pickle.loads(got[0])
    _update(backends[1], lambda s: setattr(s, "closed", True))  # the core moves on: got is stale
    state.last_heartbeats[nodes[0]] = _now()
    state.wait_list.add(_NodeDesc("10.0.9.8", 8, 0))  # a change of the core: a compare-and-set, which loses
    recorder = _Recorder(monkeypatch, backends[0])
    _, _, ok = backends[0].set_state(pickle.dumps(state), got[1])
    monkeypatch.undo()
    assert not ok
    assert [p for p, _, _ in recorder.calls].count("lease/keepalive") == 1, recorder.calls


def _arrive(etcd, n_joiners: int, monkeypatch) -> tuple[list[bool], list[list[str]], set[_NodeDesc]]:
    """A world of 2, then ``n_joiners`` newcomers that all read the state, then all write their arrival (each adds
    itself to the wait list): whether each first attempt landed, each one's requests, the wait list after."""
    backends, _ = _world(etcd, 2)
    run_id = backends[0].key.decode().rsplit("/", 1)[1]
    joiners = [_backend(etcd, run_id) for _ in range(n_joiners)]
    nodes = [_NodeDesc(f"10.0.8.{i + 1}", 801 + i, 0) for i in range(n_joiners)]
    reads = [j.get_state() for j in joiners]
    recorders = [_Recorder(monkeypatch, j) for j in joiners]
    landed = []
    for joiner, node, got in zip(joiners, nodes, reads, strict=True):
        state = pickle.loads(got[0])
        state.wait_list.add(node)
        state.last_heartbeats[node] = _now()
        landed.append(joiner.set_state(pickle.dumps(state), got[1])[2])
    monkeypatch.undo()
    return landed, [[p for p, _, _ in r.calls] for r in recorders], pickle.loads(backends[0].get_state()[0]).wait_list


def test_newcomers_arriving_together_each_land_with_one_put_on_one_lease(etcd_endpoint, monkeypatch):  # noqa: F811
    """Each newcomer's arrival is a claim on its own key (claims.py): one lease granted, one put, and it lands on the
    first attempt whatever the others wrote since its read. Negative control: as one compare-and-set of the shared
    state (the design before), every arrival after the first loses against the others' writes."""
    landed, calls, waiting = _arrive(etcd_endpoint, 3, monkeypatch)
    assert landed == [True, True, True] and len(waiting) == 3
    for c in calls:
        assert c.count("lease/grant") == 1 and c.count("lease/revoke") == 0 and c.count("kv/txn") <= 2, c
    monkeypatch.setattr(EtcdV3Backend, "_claim_for", lambda self, new, core, known: None)
    landed, _, _ = _arrive(etcd_endpoint, 3, monkeypatch)
    assert landed == [True, False, False], landed


def test_a_store_answering_3_s_late_lets_no_renewed_lease_lapse(etcd_endpoint, monkeypatch):  # noqa: F811
    """Every request of both agents answered 3 s late (an fsync stall, a throttled store pod) for 9 s, more than
    twice the 4 s TTL. Agent 0 renews from its own timer every TTL/3, renewals overlapping: its lease never
    lapses, and it judges itself alive by etcd's answers. Agent 1 renews as torch's keep-alive op did, one
    request after another (read, renewal, read): its lease lapses (the negative control; before, every agent was
    agent 1, and at 1.2 s per request all four of a world dropped themselves)."""
    import threading

    backends, nodes = _world(etcd_endpoint, 2, ttl_s=4.0)
    for backend, node in zip(backends, nodes, strict=True):
        _beats(backend, node, 1)
    leases = [b._mine[node_id(n)].lease for b, n in zip(backends, nodes, strict=True)]
    backends[0].start_renewing()
    checker = _client(etcd_endpoint)
    for backend in backends:
        client = backend._retry.client()
        real = client.call

        def late(path, body, real=real):
            time.sleep(3.0)
            return real(path, body)
        monkeypatch.setattr(client, "call", late)
    end = time.monotonic() + 9.0
    stop = threading.Event()

    def torch_keepalive() -> None:
        while not stop.is_set():
            try:
                _beats(backends[1], nodes[1], 1)
            except Exception:  # noqa: BLE001  (a re-made key, a lost write: the lapse is what is looked at)
                pass
            stop.wait(1.0)

    sequential = threading.Thread(target=torch_keepalive, daemon=True)
    sequential.start()
    lapsed = [False, False]
    try:
        while time.monotonic() < end:
            for i, lease in enumerate(leases):
                # -1: gone (a live lease's last second reads as 0, which the gateway's JSON leaves out)
                if int(checker.call("lease/timetolive", {"ID": str(lease)}).get("TTL", 0)) < 0:
                    lapsed[i] = True
            time.sleep(0.25)
        assert backends[0].alive(nodes[0]), lapsed  # by etcd's answers, which came 3 s late
    finally:
        stop.set()
        backends[0].stop_renewing()
        monkeypatch.undo()
        sequential.join(30)
    assert lapsed == [False, True], lapsed
    assert backends[0]._mine[node_id(nodes[0])].lease == leases[0]


def test_an_agent_judges_itself_by_its_leases_answers_not_by_the_age_of_its_last_renewal(etcd_endpoint):  # noqa: F811
    """torch's sanitize drops every node whose heartbeat time is older than the window, the agent itself included:
    with a slow store its own last renewal's send time looks old while its key is there. The holder keeps it while
    etcd's answers say its lease is alive, and gives the fence's lease the conservative time back; once the answers
    say the lease is gone it is dropped (the control)."""
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        RendezvousSettings,
        RendezvousTimeout,
        _BackendRendezvousStateHolder,
    )

    backends, nodes = _world(etcd_endpoint, 1, ttl_s=4.0)
    backend, node = backends[0], nodes[0]
    settings = RendezvousSettings("r", 1, 2, RendezvousTimeout(), timedelta(seconds=1), 4)
    holder = _BackendRendezvousStateHolder(backend, settings, 0.25)
    holder.__class__ = handler_module._HealingStateHolder
    holder.retry, holder.node = backend._retry, node
    old = _now() - timedelta(seconds=10)

    def sanitized() -> _RendezvousState:
        holder._state = _RendezvousState()
        holder._state.participants[node] = 0
        holder._state.last_heartbeats[node] = old
        holder._sanitize()
        return holder._state

    state = sanitized()
    assert node in state.participants and state.last_heartbeats[node] == old
    backend._mine[node_id(node)].expired = True  # a renewal answered: lease not found
    assert node not in sanitized().participants


def test_a_newcomer_whose_key_lapsed_is_back_on_the_wait_list_with_its_next_heartbeat(etcd_endpoint):  # noqa: F811
    """A newcomer's place on the wait list is its claim, on its own key: when the key lapses (a store that could not
    renew it) peers no longer see it waiting, and its next heartbeat makes the key again with the same claim, so it
    is not silently left off the wait list (review of 2026-12-07, MINOR)."""
    backends, _ = _world(etcd_endpoint, 2)
    newcomer = _backend(etcd_endpoint, backends[0].key.decode().rsplit("/", 1)[1])
    node = _NodeDesc("10.0.8.1", 801, 0)
    _update(newcomer, lambda s: (s.wait_list.add(node), s.last_heartbeats.__setitem__(node, _now())))
    assert node in pickle.loads(backends[0].get_state()[0]).wait_list
    _client(etcd_endpoint).lease_revoke(newcomer._mine[node_id(node)].lease)
    assert node not in pickle.loads(backends[0].get_state()[0]).wait_list  # its key is gone: not waiting
    newcomer._mine[node_id(node)].expired = True  # what its renewer learns from etcd's "lease not found"
    bits, token = _own_beat(newcomer, node)
    assert newcomer.set_state(bits, token)[2]
    assert node in pickle.loads(backends[0].get_state()[0]).wait_list
    # Negative control: a key made anew without the claim (an empty value) leaves the newcomer off the wait list.
    _client(etcd_endpoint).lease_revoke(newcomer._mine[node_id(node)].lease)
    newcomer._mine[node_id(node)].expired = True
    newcomer._my_claims.clear()
    bits, token = _own_beat(newcomer, node)
    newcomer.set_state(bits, token)
    assert node not in pickle.loads(backends[0].get_state()[0]).wait_list


def test_every_agent_of_a_closed_round_gets_the_world_size_it_was_closed_with(etcd_endpoint):  # noqa: F811
    """A peer whose lease lapses right after the round closed is gone from the state an agent reads next; torch's
    handler takes the world's size from that read, so agents that read before and after it disagree (worlds of 125-128
    in one round at 128 simulated agents on an overloaded machine) and their rank assignment waits for ranks nobody
    has. The agents' handler takes the size the round was closed with, from the core. Control: torch's own."""
    from types import SimpleNamespace

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    backends, nodes = _world(etcd_endpoint, 3)
    _client(etcd_endpoint).lease_revoke(backends[2]._mine[node_id(nodes[2])].lease)
    state = pickle.loads(backends[0].get_state()[0])
    assert state.complete and nodes[2] not in state.participants
    handler = rendezvous.ElasticHandler.__new__(rendezvous.ElasticHandler)
    handler._state_holder = SimpleNamespace(state=state, _backend=backends[0])
    handler._this_node = nodes[0]
    assert handler._get_world() == (state.participants[nodes[0]], 3)
    assert DynamicRendezvousHandler._get_world(handler) == (state.participants[nodes[0]], 2)  # torch's: smaller
    # The lapsed peer's own handler, reading after its lease lapsed, takes its rank from the core; torch's raised
    # KeyError (114 of 127 agents at 128 simulated agents on an overloaded machine).
    handler._this_node = nodes[2]
    closed = pickle.loads(backends[1].get_state()[0]).participants
    assert handler._get_world() == (backends[0].closed_round(state.round)[nodes[2]], 3)
    with pytest.raises(KeyError):
        DynamicRendezvousHandler._get_world(handler)
    assert nodes[2] not in closed


def test_a_store_outage_is_said_once_and_its_end_once(caplog, monkeypatch):
    """The monitor loop asks the store about every second; while the store is away each agent said so every 30 s
    (and each of 128 agents at once). Now once when the outage starts and once when the store answers again, with
    the count of checks that failed meanwhile."""
    import contextlib
    import logging
    import threading
    from types import SimpleNamespace

    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    answers = [False] * 40 + [True] * 3  # 40 failed checks, then the store answers
    state = _RendezvousState()

    def sync():
        if not answers.pop(0):
            raise RendezvousConnectionError("etcd get_state: the store did not answer")

    handler = rendezvous.ElasticHandler.__new__(rendezvous.ElasticHandler)
    handler._heartbeat_lock = threading.Lock()
    handler.retry = SimpleNamespace(impatient=contextlib.nullcontext, outage_s=lambda: 5.0, timeout_s=600.0)
    handler._state_holder = SimpleNamespace(sync=sync, state=state)
    handler._this_node = _NodeDesc("10.0.0.1", 1, 0)
    clock = iter(range(0, 10**6, 31))  # each check 31 s after the one before: a long outage (the old rate limit: 30 s)
    monkeypatch.setattr(handler_module.time, "monotonic", lambda: float(next(clock)))
    with caplog.at_level(logging.WARNING, logger=handler_module.log.name):
        waiting = [handler.num_nodes_waiting() for _ in range(43)]
    assert waiting == [0] * 43
    lines = [r.getMessage() for r in caplog.records if r.name == handler_module.log.name]
    assert len([m for m in lines if "unreachable" in m]) == 1, lines
    assert [m for m in lines if "answers again" in m] == ["rendezvous store answers again (40 checks failed during "
                                                          "the outage)"], lines
