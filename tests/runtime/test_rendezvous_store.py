"""The eks-etcd rendezvous against a real etcd 3.5 with TLS: who may write it, and which calls are retried.

Review 2026-11-24: S1 (an unauthenticated writer runs code in every agent, which unpickles the state),
K3 (an agent started while the store is away), K7 (a compare-and-set on a vanished key retried as an
outage; an ``add`` re-sent after a lost reply counted twice).
"""

from __future__ import annotations

import base64
import json
import pickle
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from eks_ddp_local.etcd import make_tls
from eks_ddp_runtime import rendezvous

from tests.support.etcd_server import client_tls, etcd_endpoint  # noqa: F401  (pytest fixture)

RUN_ID = "store-test"


def _params(endpoint: str, retry_s: float = 30.0, **conf):
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    tls = client_tls(endpoint)
    base = {"protocol": "https", "ca_cert": tls.ca_cert, "ssl_cert": tls.cert, "ssl_cert_key": tls.key,
            "read_timeout": "3", "store_retry_timeout": str(retry_s), "keep_alive_interval": "1",
            "keep_alive_max_attempt": "4", "last_call_timeout": "1", "join_timeout": "30"}
    return RendezvousParameters(backend=rendezvous.BACKEND, endpoint=endpoint, run_id=RUN_ID, min_nodes=1,
                                max_nodes=2, local_addr="127.0.0.1", **{**base, **conf})


def _handler(endpoint: str, retry_s: float = 30.0):
    return rendezvous._create(_params(endpoint, retry_s))


def _put(url: str, value: str, context: ssl.SSLContext | None = None) -> int:
    data = urllib.parse.urlencode({"value": value}).encode()
    req = urllib.request.Request(url, data=data, method="PUT")
    with urllib.request.urlopen(req, timeout=5, context=context) as r:
        return r.status


class _Payload:
    """Unpickling this touches a marker file: what an attacker's state would do inside every agent."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_writes_without_a_client_certificate_are_refused(etcd_endpoint, tmp_path):  # noqa: F811
    key = f"{rendezvous.KEY_PREFIX}/{RUN_ID}"
    # Plain HTTP on the client port: no answer an HTTP client accepts.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _put(f"http://{etcd_endpoint}/v2/keys{key}", "x")
    # HTTPS that trusts the server but shows no client certificate: refused in the handshake.
    no_cert = ssl.create_default_context(cafile=str(etcd_endpoint.tls.ca_cert))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        _put(f"https://{etcd_endpoint}/v2/keys{key}", "x", no_cert)
    # A client certificate from another CA (someone else's store): refused too.
    other = make_tls(tmp_path / "other")
    foreign = ssl.create_default_context(cafile=str(etcd_endpoint.tls.ca_cert))
    foreign.load_cert_chain(str(other.client_cert), str(other.client_key))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        _put(f"https://{etcd_endpoint}/v2/keys{key}", "x", foreign)
    # Negative control: the job's own certificate writes.
    assert _put(f"https://{etcd_endpoint}/v2/keys/control", "ok", etcd_endpoint.tls.client_context()) in (200, 201)


def test_an_outsider_cannot_plant_state_that_the_agents_unpickle(etcd_endpoint, tmp_path):  # noqa: F811
    marker = tmp_path / "pwned"
    evil = base64.b64encode(pickle.dumps(_Payload(marker))).decode()
    url = f"{rendezvous.KEY_PREFIX}/{RUN_ID}"
    for scheme, ctx in (("http", None), ("https", ssl.create_default_context(cafile=str(etcd_endpoint.tls.ca_cert)))):
        try:
            _put(f"{scheme}://{etcd_endpoint}/v2/keys{url}", evil, ctx)
        except (urllib.error.URLError, ssl.SSLError, ConnectionError, OSError):
            pass
    handler = _handler(etcd_endpoint)
    handler._state_holder.sync()  # one read of the state, as every agent does about once a second
    assert not marker.exists(), "state written without a client certificate was unpickled by the agent"
    # Negative control: the same bytes written with the job's certificate do run (why the certificate matters).
    _put(f"https://{etcd_endpoint}/v2/keys{url}", evil, etcd_endpoint.tls.client_context())
    handler._state_holder._last_sync_time = -1
    with pytest.raises(Exception):  # noqa: B017  (Path.touch returns None: not a state; the touch happened)
        handler._state_holder.sync()
    assert marker.exists()


def test_a_compare_and_set_on_a_vanished_key_answers_at_once(etcd_endpoint):  # noqa: F811
    backend = _handler(etcd_endpoint, retry_s=30)._state_holder._backend
    _, token, has_set = backend.set_state(b"x")
    assert has_set
    req = urllib.request.Request(f"https://{etcd_endpoint}/v2/keys{rendezvous.KEY_PREFIX}/{RUN_ID}", method="DELETE")
    urllib.request.urlopen(req, timeout=5, context=etcd_endpoint.tls.client_context()).close()
    t0 = time.monotonic()
    assert backend.set_state(b"y", token) is None  # not set, and no state: the handler starts a fresh one
    assert time.monotonic() - t0 < 10  # one round trip, not store_retry_timeout (30 s) of retries
    # With the key back, a stale token is told the current state, not set.
    _, token2, _ = backend.set_state(b"z")
    state, _, has_set = backend.set_state(b"w", token)
    assert (state, has_set) == (b"z", False)


def test_an_add_resent_after_a_lost_reply_counts_once(etcd_endpoint):  # noqa: F811
    import urllib3.exceptions

    handler = _handler(etcd_endpoint)
    store, retry = handler._store, handler.retry
    real = retry.client
    lost: list[str] = []

    class LosesOneReply:
        """The write (create, or compare-and-set) reaches etcd, then its reply is lost, once."""

        def __init__(self, client) -> None:
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def _then_lose(self, name, *a, **kw):
            result = getattr(self.client, name)(*a, **kw)
            if not lost:
                lost.append(name)
                raise urllib3.exceptions.ProtocolError("connection reset after the write")
            return result

        def write(self, *a, **kw):
            return self._then_lose("write", *a, **kw)

        def test_and_set(self, *a, **kw):
            return self._then_lose("test_and_set", *a, **kw)

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


def test_the_handler_is_built_and_waits_while_the_store_is_down(tmp_path):
    from eks_ddp_local.etcd import EtcdEndpoint, free_port

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
    from eks_ddp.core.torchrun import CLUSTER_TIMEOUTS, LOCAL_TIMEOUTS

    assert CLUSTER_TIMEOUTS.store_retry >= 600 and f"store_retry_timeout={CLUSTER_TIMEOUTS.store_retry}" in \
        CLUSTER_TIMEOUTS.conf()
    assert LOCAL_TIMEOUTS.store_retry == CLUSTER_TIMEOUTS.store_retry


def test_status_endpoint_is_not_a_backdoor(etcd_endpoint):  # noqa: F811
    # /v2/keys over the certificate-checked port is the only way in: the version endpoint needs a cert too.
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(f"https://{etcd_endpoint}/version", timeout=5,
                               context=ssl.create_default_context(cafile=str(etcd_endpoint.tls.ca_cert)))
    with urllib.request.urlopen(f"https://{etcd_endpoint}/version", timeout=5,
                                context=etcd_endpoint.tls.client_context()) as r:
        assert "etcdserver" in json.loads(r.read())


def test_without_the_cryptography_package_openssl_makes_the_stores_tls(tmp_path, monkeypatch):
    """An offline GPU machine (make gpu-check) has no 'cryptography': the local store's CA and certificates come
    from the openssl command, and the store still serves only the job's own client certificate."""
    import sys

    from eks_ddp_local import etcd as etcd_local

    monkeypatch.setitem(sys.modules, "cryptography", None)  # import cryptography -> ImportError
    with etcd_local.start_etcd(tmp_path / "etcd") as endpoint:
        assert (tmp_path / "etcd" / "tls" / "server.ext").exists(), "the openssl path was not taken"
        assert _put(f"https://{endpoint}/v2/keys/control", "ok", endpoint.tls.client_context()) in (200, 201)
        no_cert = ssl.create_default_context(cafile=str(endpoint.tls.ca_cert))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _put(f"https://{endpoint}/v2/keys/control", "x", no_cert)
