"""The eks-etcd rendezvous against a real etcd 3.5 (v3 API only, TLS with client certificates).

Review 2026-11-24: S1 (an unauthenticated writer steers the agents), K3 (an agent started while the store is away),
K7 (a compare-and-set on a vanished key retried as an outage; an ``add`` re-sent after a lost reply counted twice).
Review 2026-11-25: E6 (per-round store keys outlive the state), E10 (agents unpickled what the store held),
E13 (the v2 API and its unmaintained client).
"""

from __future__ import annotations

import ast
import base64
import json
import pickle
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from eks_ddp_local.etcd_server import make_tls, start_etcd
from eks_ddp_runtime.rendezvous import handler as rendezvous
from eks_ddp_runtime.rendezvous import state as rdzv_state
from eks_ddp_runtime.rendezvous.etcd_backend import EPOCH, node_id
from eks_ddp_runtime.rendezvous.etcd_client import EtcdV3Client, b64
from tests.support.etcd_server import client_tls, etcd_endpoint  # noqa: F401  (pytest fixture)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """One store for the tests of this module that need no fresh one (each uses its own run id)."""
    with start_etcd(tmp_path_factory.mktemp("etcd")) as endpoint:
        yield endpoint


def _run_id() -> str:
    return f"store-{uuid.uuid4().hex[:10]}"


def _params(endpoint: str, retry_s: float = 30.0, run_id: str = "store-test", nodes: int = 2, **conf):
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    tls = client_tls(endpoint)
    base = {"protocol": "https", "ca_cert": tls.ca_cert, "ssl_cert": tls.cert, "ssl_cert_key": tls.key,
            "read_timeout": "3", "store_retry_timeout": str(retry_s), "keep_alive_interval": "1",
            "keep_alive_max_attempt": "4", "last_call_timeout": "1", "join_timeout": "30"}
    return RendezvousParameters(backend=rendezvous.BACKEND, endpoint=endpoint, run_id=run_id, min_nodes=1,
                                max_nodes=nodes, local_addr="127.0.0.1", **{**base, **conf})


def _handler(endpoint: str, retry_s: float = 30.0, run_id: str = "store-test", nodes: int = 2):
    return rendezvous._create(_params(endpoint, retry_s, run_id, nodes))


def _client(endpoint) -> EtcdV3Client:
    """A client of the test's own (with the job's certificate): what any pod holding the certificate can do."""
    host, port = str(endpoint).split(":")
    return EtcdV3Client(host, int(port), read_timeout=5, context=endpoint.tls.client_context())


def _post(url: str, body: dict, context: ssl.SSLContext | None = None) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5, context=context) as r:
        return r.status


def _state_key(run_id: str) -> bytes:
    return f"{rendezvous.KEY_PREFIX}/{run_id}".encode()


class _Payload:
    """Unpickling this touches a marker file: what a hostile state would do inside every agent."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _sample_state():
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

    now = datetime.now(timezone.utc)  # noqa: UP017  (Python 3.10: make test-compat)
    state = _RendezvousState()
    state.round, state.complete, state.closed = 7, True, False
    state.deadline = now + timedelta(seconds=30)
    a, b, c, d = (_NodeDesc(f"10.0.0.{i}", 100 + i, i) for i in range(4))
    state.participants = {a: 0, b: 1}
    state.wait_list, state.redundancy_list = {c}, {d}
    state.last_heartbeats = {a: now, b: now - timedelta(seconds=2), c: now, d: now}
    return state


# -- who may write ---------------------------------------------------------------------------------------------


def test_writes_without_a_client_certificate_are_refused(etcd, tmp_path):
    put = {"key": b64(_state_key("outsider")), "value": b64(b"x")}
    # Plain HTTP on the client port: no answer an HTTP client accepts.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _post(f"http://{etcd}/v3/kv/put", put)
    # HTTPS that trusts the server but shows no client certificate: refused in the handshake.
    no_cert = ssl.create_default_context(cafile=str(etcd.tls.ca_cert))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        _post(f"https://{etcd}/v3/kv/put", put, no_cert)
    # A client certificate from another CA (someone else's store): refused too.
    other = make_tls(tmp_path / "other")
    foreign = ssl.create_default_context(cafile=str(etcd.tls.ca_cert))
    foreign.load_cert_chain(str(other.client_cert), str(other.client_key))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        _post(f"https://{etcd}/v3/kv/put", put, foreign)
    assert _client(etcd).get(_state_key("outsider")) is None
    # Negative control: the job's own certificate writes.
    assert _post(f"https://{etcd}/v3/kv/put", put, etcd.tls.client_context()) == 200
    assert _client(etcd).get(_state_key("outsider")).value == b"x"


def test_the_v3_gateway_needs_a_server_certificate_that_may_be_a_client(tmp_path):
    """etcd's JSON gateway dials etcd's own gRPC port with the server certificate as its client certificate (etcd
    server/embed/serve.go ``serveCtx.serve``: ``dtls := tlscfg.Clone()``; etcd-io/etcd#16590); with
    ``--client-cert-auth`` a server certificate without client authentication fails every /v3 call (HTTP 503, "tls:
    bad certificate"). The stores made here and by the stack (components/eks_ddp/workloads/etcd_tls.py) allow both."""
    from eks_ddp_local.etcd_server import EtcdEndpoint
    from eks_ddp_runtime.rendezvous.etcd_client import EtcdAnswerError
    from tests.support.etcd_server import RestartableEtcd

    for gateway in (False, True):
        store = RestartableEtcd(tmp_path / f"etcd-{gateway}")
        store.tls = make_tls(tmp_path / f"tls-{gateway}", [store.host], gateway=gateway)
        store.endpoint = EtcdEndpoint(str(store.endpoint), store.tls)
        try:
            store.start()
            client = _client(store.endpoint)
            if gateway:
                client.put(b"/control", b"ok")
                assert client.get(b"/control").value == b"ok"
            else:  # the negative control: the rule is real
                with pytest.raises(EtcdAnswerError) as err:
                    client.put(b"/control", b"ok")
                assert err.value.status == 503 and "bad certificate" in err.value.message
        finally:
            store.kill()


def test_the_v2_api_is_not_served(etcd):
    """The store runs without etcd's v2 API (gone in etcd 3.6; E13): nothing of the rendezvous needs it."""
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"https://{etcd}/v2/keys/x", timeout=5, context=etcd.tls.client_context())
    assert err.value.code == 404


# -- what the store holds is data, never code (E10) --------------------------------------------------------------


def test_a_pickle_planted_by_a_certificate_holder_is_refused_not_executed(etcd, tmp_path):
    """Any pod with the job's certificate (worker code, its dependencies) can write the state key. What it writes
    is read as JSON and checked; a pickle is not a state: it is deleted, and the agents re-form as after a wipe."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Payload(marker))
    run_id = _run_id()
    handler = _handler(etcd, run_id=run_id, nodes=1)
    client = _client(etcd)
    # torch's etcd-v2 backend stored base64 of the pickle; the raw pickle too.
    for value in (payload, base64.b64encode(payload)):
        client.put(_state_key(run_id), value)
        handler._state_holder._last_sync_time = -1
        handler._state_holder.sync()  # one read of the state, as every agent does about once a second
        assert not marker.exists(), "the agent executed a pickle it read from the store"
        assert vars(handler._state_holder.state) == vars(type(handler._state_holder.state)())  # empty: a wipe
        assert client.get(_state_key(run_id)) is None, "the planted value was not deleted"
    # The agent forms a round on the healed key.
    info = handler.next_rendezvous()
    handler._stop_heartbeats()
    assert (info.rank, info.world_size) == (0, 1)
    assert json.loads(client.get(_state_key(run_id)).value)["schema"] == rdzv_state.SCHEMA
    # Negative control: the payload is live; unpickled, it runs (what torch's own backends do with it).
    pickle.loads(payload)
    assert marker.exists()


def test_set_state_unpickles_only_the_states_own_classes(tmp_path):
    """The bytes torch hands to set_state come from its own pickle.dumps; they are still read with an unpickler
    that resolves only the state's classes."""
    marker = tmp_path / "pwned"
    for bad in (pickle.dumps(_Payload(marker)), b"x", pickle.dumps({"round": 1}), pickle.dumps(None)):
        with pytest.raises(rdzv_state.StateError):
            rdzv_state.state_from_pickle(bad)
    assert not marker.exists()
    state = _sample_state()
    assert vars(rdzv_state.state_from_pickle(pickle.dumps(state))) == vars(state)


def test_the_state_round_trips_through_json():
    state = _sample_state()
    value = rdzv_state.to_json(state)
    assert vars(rdzv_state.from_json(value)) == vars(state)
    assert b"pickle" not in value and json.loads(value)["round"] == 7
    # The bits torch's holder unpickles are a pickle of a state built here from the JSON.
    assert vars(pickle.loads(rdzv_state.decode(value))) == vars(state)


def _bad_states() -> list[tuple[str, object]]:
    good = json.loads(rdzv_state.to_json(_sample_state()))

    def with_(**kw):
        return json.dumps({**good, **kw}).encode()
    node = ["10.0.0.9", 1, 1]
    return [
        ("not json", b"\x80\x04garbage"),
        ("a list", b"[1, 2]"),
        ("unknown field", with_(extra=1)),
        ("missing field", json.dumps({k: v for k, v in good.items() if k != "closed"}).encode()),
        ("other schema", with_(schema=2)),
        ("round as text", with_(round="7")),
        ("round as bool", with_(round=True)),
        ("negative round", with_(round=-1)),
        ("huge round", with_(round=2**80)),
        ("complete as int", with_(complete=1)),
        ("deadline not a time", with_(deadline="tomorrow")),
        ("naive deadline", with_(deadline="2026-01-01T00:00:00")),
        ("participant short", with_(participants=[["10.0.0.9", 1]])),
        ("participant twice", with_(participants=[[*node, 0], [*node, 1]])),
        ("address empty", with_(wait_list=[["", 1, 1]])),
        ("address too long", with_(wait_list=[["a" * 300, 1, 1]])),
        ("address with control", with_(wait_list=[["a\nb", 1, 1]])),
        ("pid as float", with_(wait_list=[["a", 1.5, 1]])),
        ("too many waiting", with_(wait_list=[[f"n{i}", 1, i] for i in range(rdzv_state.MAX_NODES + 1)])),
        ("heartbeat naive", with_(last_heartbeats=[[*node, "2026-01-01T00:00:00"]])),
        ("duplicate key", b'{"round": 1, "round": 2}'),
        ("NaN", with_(round=float("nan"))),
        ("too big", b" " * (rdzv_state.MAX_STATE_BYTES + 1)),
        ("nested deep", b"[" * 100000 + b"]" * 100000),
    ]


@pytest.mark.parametrize("why,value", _bad_states(), ids=[w for w, _ in _bad_states()])
def test_a_malformed_state_is_refused_field_by_field(why, value):
    with pytest.raises(rdzv_state.StateError):
        rdzv_state.from_json(value)


def test_a_malformed_state_in_the_store_reads_as_a_wiped_store(etcd):
    run_id = _run_id()
    backend = _handler(etcd, run_id=run_id)._state_holder._backend
    client = _client(etcd)
    for _, value in _bad_states()[:4]:
        client.put(_state_key(run_id), value)
        assert backend.get_state() is None
        assert client.get(_state_key(run_id)) is None
    # A valid state written by another agent reads as that state; heartbeat times come from the heartbeat keys, not
    # the state: a node whose key exists reads as alive (a time after the epoch), and one without a key (its lease
    # expired) is in no list at all (claims.merge: what torch's _sanitize would drop).
    state = _sample_state()
    client.put(_state_key(run_id), rdzv_state.to_json(state))
    lease = client.lease_grant(60)
    for node in state.last_heartbeats:
        client.put(backend.heartbeats + node_id(node).encode(), b"", lease=lease)
    bits, token = backend.get_state()
    read = vars(pickle.loads(bits))
    assert {k: v for k, v in read.items() if k != "last_heartbeats"} == \
        {k: v for k, v in vars(state).items() if k != "last_heartbeats"} and isinstance(token, int)
    assert set(read["last_heartbeats"]) == set(state.last_heartbeats)
    assert all(t > EPOCH for t in read["last_heartbeats"].values())
    client.lease_revoke(lease)
    gone = vars(pickle.loads(backend.get_state()[0]))
    assert (gone["participants"], gone["wait_list"], gone["redundancy_list"], gone["last_heartbeats"]) == ({}, set(),
                                                                                                         set(), {})
    assert (gone["round"], gone["complete"]) == (state.round + 1, False)  # nobody left in the round: the next one


# -- compare-and-set and retries (K7) ----------------------------------------------------------------------------


def _bits(round_: int) -> bytes:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    state = _RendezvousState()
    state.round = round_
    return pickle.dumps(state)


def test_a_compare_and_set_on_a_vanished_key_answers_at_once(etcd):
    run_id = _run_id()
    backend = _handler(etcd, retry_s=30, run_id=run_id)._state_holder._backend
    _, token, has_set = backend.set_state(_bits(1))
    assert has_set
    _client(etcd).delete(_state_key(run_id))
    t0 = time.monotonic()
    bits, absent, has_set = backend.set_state(_bits(2), token)  # not set; the state is empty: start a fresh one
    assert (pickle.loads(bits).round, has_set) == (0, False) and not pickle.loads(bits).participants
    assert time.monotonic() - t0 < 10  # one round trip, not store_retry_timeout (30 s) of retries
    _, created, has_set = backend.set_state(_bits(3), absent)  # that token creates the key
    assert has_set and created != absent
    # With the key back, a stale token is told the current state, not set.
    state, _, has_set = backend.set_state(_bits(4), token)
    assert (pickle.loads(state).round, has_set) == (3, False)


def test_a_write_that_finds_the_state_gone_adopts_the_empty_store_not_its_own_view(etcd):
    """An agent's write was pending when the store went away (a keep-alive whose write failed); the store comes back
    empty. torch's state holder keeps its own state when set_state answers None (dynamic_rendezvous.py ``sync``:
    ``state_bits`` stays its own pickle, the token None), and its next write then creates the key with that stale
    world: the old round, complete, with every old participant, which the other agents join and wait in for peers
    that never come (seen as test_etcd_rescheduled_empty_costs_no_agent hanging). The backend answers a
    compare-and-set on a vanished key with the empty state instead, so the holder sees what the store holds."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    run_id = _run_id()
    handler = _handler(etcd, run_id=run_id, nodes=1)
    handler.next_rendezvous()
    handler._stop_heartbeats()
    holder = handler._state_holder
    assert holder.state.complete and holder.state.participants
    holder.state.last_heartbeats[handler._this_node] = datetime.now(timezone.utc)  # noqa: UP017  (3.10)
    holder.mark_dirty()  # the pending write
    from eks_ddp_runtime.rendezvous.etcd_client import prefix_end

    beats = holder._backend.heartbeats
    _client(etcd).delete(_state_key(run_id))  # the store came back empty: the state and every heartbeat key
    _client(etcd).delete(beats, range_end=prefix_end(beats))
    assert holder.sync() is False
    assert vars(holder.state) == vars(_RendezvousState()), "the holder kept its own stale state"
    assert _client(etcd).get(_state_key(run_id)) is None


def test_the_state_key_and_the_store_keys_share_one_lease_of_torchs_ttl(etcd):
    """The state lives on a lease of torch's TTL (2 h after the last agent wrote it, as torch's etcd backend's key
    TTL); every store key of its rounds is on the same lease, so none outlives it (E6). torch's value is read from
    its source: importing that module needs python-etcd's urllib3, which a runtime-only install lacks."""
    import importlib.util
    import re

    origin = importlib.util.find_spec("torch.distributed.elastic.rendezvous.etcd_rendezvous_backend").origin
    torch_ttl = int(re.search(r"^\s*_DEFAULT_TTL\s*=\s*(\d+)", Path(origin).read_text(), re.M).group(1))

    run_id = _run_id()
    handler = _handler(etcd, run_id=run_id, nodes=1)
    info = handler.next_rendezvous()
    handler._stop_heartbeats()
    info.store.set("role_info0", b"x")
    client = _client(etcd)
    state = client.get(_state_key(run_id))
    ttl = client.call("lease/timetolive", {"ID": str(state.lease)})
    assert 0 < int(ttl["TTL"]) <= int(ttl["grantedTTL"]) == torch_ttl == 7200
    keys = client.get_prefix(f"{rendezvous.STORE_PREFIX}/{run_id}/".encode())
    assert {kv.key.rsplit(b"/", 1)[1] for kv in keys} >= {b"MASTER_ADDR", b"MASTER_PORT", b"role_info0"}
    assert {kv.lease for kv in keys} == {state.lease}
    # The lease expires (stands in for 2 h without an agent): the state and every store key go with it.
    client.lease_revoke(state.lease)
    assert client.get(_state_key(run_id)) is None
    assert client.get_prefix(f"{rendezvous.STORE_PREFIX}/{run_id}/".encode()) == []


def test_store_keys_stay_bounded_over_many_rounds(etcd):
    """Each round writes its own keys (master address and port, each agent's role info and ranks, barriers); a
    round's first write deletes those of rounds before the previous one, so a run that restarts its workers
    N times keeps two rounds' keys, not N (E6). On the v2 backend every round's keys stayed."""
    run_id = _run_id()
    handler = _handler(etcd, run_id=run_id, nodes=1)
    counts = []
    try:
        for _ in range(8):
            info = handler.next_rendezvous()  # a new round each time (the node leaves its last one first)
            info.store.set("role_info0", b"x")
            info.store.multi_set(["assigned_ranks0"], [b"[0]"])
            info.store.add("barrier/num_members", 1)
            counts.append(len(_client(etcd).get_prefix(f"{rendezvous.STORE_PREFIX}/{run_id}/".encode())))
    finally:
        handler._stop_heartbeats()
    assert handler._state_holder.state.round == 7
    assert max(counts) <= 2 * 5, counts  # two rounds of five keys
    from torch.distributed import PrefixStore

    assert not PrefixStore(f"torch.rendezvous.{run_id}.0", handler._store).check(["MASTER_ADDR"])


def test_a_new_incarnation_of_the_state_never_reads_an_old_rounds_keys(etcd):
    """The state key is gone (its TTL ran out, or a malformed value was deleted) while etcd keeps the store keys:
    rounds start again at 0, and round 0's old MASTER_ADDR must not be what a non-zero rank reads (E6: it dialled
    the old incarnation's port and timed out)."""
    from torch.distributed import PrefixStore

    run_id = _run_id()
    handler = _handler(etcd, run_id=run_id, nodes=1)
    handler.next_rendezvous()
    handler._stop_heartbeats()
    round0 = f"torch.rendezvous.{run_id}.0"
    assert PrefixStore(round0, handler._store).check(["MASTER_ADDR"])  # control: the key is there
    _client(etcd).delete(_state_key(run_id))  # the state alone goes (its store keys stay, as in E6's repro)
    newcomer = _handler(etcd, run_id=run_id)
    newcomer._state_holder.sync()
    assert newcomer._state_holder.state.round == 0
    assert not PrefixStore(round0, newcomer._store).check(["MASTER_ADDR"]), "a new round 0 reads the old one's key"


def test_an_add_resent_after_a_lost_reply_counts_once(etcd):
    from eks_ddp_runtime.rendezvous.etcd_client import EtcdConnectionError

    handler = _handler(etcd, run_id=_run_id())
    store, retry = handler._store, handler.retry
    real = retry.client
    lost: list[str] = []

    class LosesOneReply:
        """The write (a create or a compare-and-set transaction) reaches etcd, then its reply is lost, once."""

        def __init__(self, client) -> None:
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def txn(self, compares, success, failure=()):
            result = self.client.txn(compares, success, failure)
            writes = any("request_put" in op for op in success)
            if writes and compares and not lost:
                lost.append(str(compares[0]["target"]))
                raise EtcdConnectionError("connection reset after the write")
            return result

    for key, before in (("barrier-new", 0), ("barrier-old", 4)):
        if before:
            store.add(key, before)
        lost.clear()
        retry.client = lambda: LosesOneReply(real())
        try:
            assert store.add(key, 1) == before + 1
        finally:
            retry.client = real
        assert lost, "the fault was not injected"
        assert store.add(key, 0) == before + 1, f"the re-sent add was counted twice ({lost[0]})"
        assert int(store.get(key)) == before + 1


def test_certificates_that_stop_loading_mid_run_keep_the_last_good_ones(etcd, tmp_path):
    """A fresh client after a connection failure reads the certificate files again (a rotated Secret is picked up);
    a mount caught mid-swap (files absent) keeps the settings that loaded at start instead of ending the agent."""
    import shutil

    from eks_ddp_runtime.rendezvous.etcd_backend import RendezvousConfigError, Retrier

    tls = client_tls(etcd)
    files = {k: shutil.copy(v, tmp_path / Path(v).name) for k, v in
             (("ca_cert", tls.ca_cert), ("ssl_cert", tls.cert), ("ssl_cert_key", tls.key))}
    params = _params(etcd, **{k: str(v) for k, v in files.items()})
    retry = Retrier(params, 5.0)
    first = retry.client()
    for path in files.values():
        Path(path).unlink()
    retry._drop(first)  # what a connection failure does
    retry("probe", lambda c: c.put(b"/probe", b"ok"))
    assert retry.client() is not first and _client(etcd).get(b"/probe").value == b"ok"
    # Negative control: at start the same missing files are a usage error.
    with pytest.raises(RendezvousConfigError):
        Retrier(params, 5.0).client()


def test_one_connection_per_live_thread(etcd):
    """torch starts a new keep-alive thread every round: the connections of threads that ended are closed, so an
    agent that restarts its workers N times holds one connection per live thread, not N."""
    import threading

    client = _client(etcd)
    for _ in range(5):
        t = threading.Thread(target=client.get, args=(b"/x",))
        t.start()
        t.join()
    client.get(b"/x")
    assert len(client._open) <= 2  # this thread's, and at most the last ended thread's until the next new one
    client.close()


# -- outages (K3) -----------------------------------------------------------------------------------------------


def test_the_handler_is_built_and_waits_while_the_store_is_down(tmp_path):
    from eks_ddp_local.etcd_server import EtcdEndpoint, free_port

    down = EtcdEndpoint(f"127.0.0.1:{free_port()}", make_tls(tmp_path / "tls"))
    handler = _handler(down, retry_s=2)  # K3: building it contacted the store and raised
    assert handler.num_nodes_waiting() == 0  # a monitor tick during an outage: keep training
    # Only an outage longer than store_retry_timeout (the cluster's: 600 s) ends the agent.
    deadline = time.monotonic() + 30
    while handler.retry.outage_s() <= 2 and time.monotonic() < deadline:
        assert handler.num_nodes_waiting() == 0
        time.sleep(0.2)
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    with pytest.raises(RendezvousConnectionError):
        handler.num_nodes_waiting()


def test_the_cluster_rides_out_ten_minutes_of_store_outage():
    from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, LOCAL_TIMEOUTS

    assert CLUSTER_TIMEOUTS.store_retry >= 600 and f"store_retry_timeout={CLUSTER_TIMEOUTS.store_retry}" in \
        CLUSTER_TIMEOUTS.conf()
    assert LOCAL_TIMEOUTS.store_retry == CLUSTER_TIMEOUTS.store_retry


def test_status_endpoint_is_not_a_backdoor(etcd):
    # The version endpoint over the certificate-checked port needs a certificate too.
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(f"https://{etcd}/version", timeout=5,
                               context=ssl.create_default_context(cafile=str(etcd.tls.ca_cert)))
    with urllib.request.urlopen(f"https://{etcd}/version", timeout=5, context=etcd.tls.client_context()) as r:
        assert "etcdserver" in json.loads(r.read())


# -- no python-etcd (E13) ---------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_nothing_imports_python_etcd():
    files = [p for d in ("training", "components", "bench", "tests") for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    offenders = [str(p.relative_to(ROOT)) for p in files if "etcd" in _imports(p)]
    assert offenders == []


@pytest.mark.slow
def test_a_round_forms_where_python_etcd_cannot_be_imported(etcd):
    """A real process in which ``import etcd`` fails (the package absent, as in the runtime's install now): the
    agents' rendezvous forms a round on the real store, and nothing tried to import it."""
    code = """
import sys
sys.modules["etcd"] = None  # any `import etcd` raises ImportError
from torch.distributed.elastic.rendezvous import RendezvousParameters
from eks_ddp_runtime.rendezvous import handler as rendezvous
p = RendezvousParameters(backend=rendezvous.BACKEND, endpoint=sys.argv[1], run_id=sys.argv[2], min_nodes=1,
                         max_nodes=1, local_addr="127.0.0.1", protocol="https", ca_cert=sys.argv[3],
                         ssl_cert=sys.argv[4], ssl_cert_key=sys.argv[5], last_call_timeout="1")
rendezvous.register()
from torch.distributed.elastic.rendezvous import registry
h = registry.get_rendezvous_handler(p)
info = h.next_rendezvous()
h._stop_heartbeats()
assert sys.modules["etcd"] is None
print("round", info.rank, info.world_size, info.bootstrap_store_info.master_addr)
"""
    tls = client_tls(etcd)
    proc = subprocess.run([sys.executable, "-c", code, str(etcd), _run_id(), tls.ca_cert, tls.cert, tls.key],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "round 0 1 127.0.0.1" in proc.stdout


def test_a_waiting_get_ends_with_its_own_timeout_while_the_store_is_away(etcd):
    """torch's non-zero ranks wait for MASTER_ADDR with ``store.get`` (RendezvousStoreInfo.build). Each poll went
    through the Retrier, which retries a store that does not answer for store_retry_timeout (600 s on the cluster),
    so a get with a timeout of 1 s could take 600 s. Now every request of the wait, its retries included, ends by the
    wait's deadline (plus at most one read_timeout)."""
    import datetime as dt

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    from eks_ddp_local.etcd_server import free_port
    from eks_ddp_runtime.rendezvous.etcd_backend import EtcdV3Backend, EtcdV3Store, Retrier

    tls = client_tls(etcd)
    params = RendezvousParameters(backend=rendezvous.BACKEND, endpoint=f"127.0.0.1:{free_port()}", run_id="away",
                                  min_nodes=1, max_nodes=2, protocol="https", ca_cert=tls.ca_cert,
                                  ssl_cert=tls.cert, ssl_cert_key=tls.key, read_timeout="2")
    retry = Retrier(params, 20.0)  # a store outage the other calls ride out
    store = EtcdV3Store(retry, EtcdV3Backend(retry, "away", rendezvous.BACKEND), "away",
                        timeout=dt.timedelta(seconds=1))
    for call in (lambda: store.get("torch.rendezvous.away.0/MASTER_ADDR"),
                 lambda: store.wait(["torch.rendezvous.away.0/MASTER_ADDR"], dt.timedelta(seconds=1))):
        started = time.monotonic()
        with pytest.raises((RendezvousConnectionError, LookupError)):
            call()
        assert time.monotonic() - started < 1 + 2 + 1.5  # the wait, one read_timeout, a retry's pause
