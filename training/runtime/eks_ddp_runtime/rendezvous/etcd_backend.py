"""etcd access for the ``eks-etcd`` rendezvous: etcd's v3 API, JSON state, retries of what a retry can fix.

* :func:`make_client` builds an :class:`~eks_ddp_runtime.rendezvous.etcd_client.EtcdV3Client` (the standard library over etcd's
  v3 JSON gateway) with HTTPS and a client certificate, from torch's etcd rdzv-conf keys (``protocol``,
  ``ca_cert``, ``ssl_cert``, ``ssl_cert_key``, ``read_timeout``). It contacts nobody when built (review K3), and
  one call is one request that waits at most ``read_timeout`` (no retries underneath, E5).
* :class:`Retrier` retries only connection failures (refused, reset, timed out, TLS handshake cut, etcd's
  "unavailable", the NOSPACE alarm, which an operator can clear: one line names it and the fix) on a fresh client,
  for up to ``store_retry_timeout`` seconds (or a caller's own deadline, a waiting ``get``), or once when called
  ``impatient`` (the heartbeat thread and the monitor loop, which must never block the agent on a dead store).
  etcd's answers (compare failed, key or lease not found) are never retried (review K7 a).
* :class:`EtcdV3Backend` is torch's ``RendezvousBackend`` over one key per run
  (``/torch/elastic/rendezvous/<run-id>``) and one heartbeat key per node
  (``/torch/elastic/rendezvous-heartbeat/<run-id>/<node>``) on that node's own etcd lease, whose TTL is torch's drop
  window. The state key holds the *core*: the state with every heartbeat time at :data:`EPOCH`, so a heartbeat does
  not change it. ``set_state`` of a new core is a transaction comparing the key's ``mod_revision`` with the token
  (``create_revision == 0`` to create it), so at most one of several writers of one state wins, and requiring the
  heartbeat key of every node it drops to be gone; ``set_state`` of a newer heartbeat renews the node's lease (no
  write). ``get_state`` fills the heartbeat times in (a live key: now; a gone one: the epoch) and is one read-only
  transaction that returns a count while nothing changed. The per-agent requests are :data:`REQUEST_PATTERN`. The
  core is JSON (rendezvous/state.py) and ``get_state`` hands torch a pickle built here from checked fields, never
  bytes from the store; a value that does not check out is deleted and reads as no state, like a store that came
  back empty (the agents then re-form, rendezvous/handler.py). The state key lives on a lease of torch's TTL (2 h,
  ``etcd_rendezvous_backend._DEFAULT_TTL``), renewed every 5 minutes while agents beat.
* :class:`EtcdV3Store` is the c10d ``Store`` the handler gives the agents (rank assignment, master address, exit
  barrier). Its keys live under ``/torch/elastic/store/<run-id>/<incarnation>/<round>/``, where the incarnation
  is the state key's ``create_revision``, and on the state key's lease: they go when the state goes (expiry, wipe,
  a malformed value deleted), and a round's first write deletes the keys of rounds older than the one before it
  and of older incarnations, so a long run keeps a bounded number of keys and a new incarnation never reads an old
  one's ``MASTER_ADDR`` (review E6). ``add`` is idempotent: each call carries an id and the counter's value keeps
  the ids of its last adds with their results, so an add re-sent after a lost reply returns its first result
  instead of counting twice (review K7 b).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import os
import pickle
import random
import re
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torch.distributed import Store
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token, _RendezvousState
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from . import claims as rdzv_claims
from . import etcd_client
from . import state as rdzv_state
from .cert_check import certificate_problem
from .etcd_client import EtcdAnswerError, EtcdConnectionError, EtcdV3Client, compare, op_delete, op_put, op_range

KEY_PREFIX = "/torch/elastic/rendezvous"
STORE_PREFIX = "/torch/elastic/store"
STATE_TTL_S = 7200
"""Seconds the state (and the store keys of its rounds) outlive the last agent that wrote it: torch's etcd
backend's ``_DEFAULT_TTL``."""
RENEW_EVERY_S = 300.0
"""An agent that writes the state renews its lease at most this often (a write no later than this after the last
renewal renews it again)."""
ABSENT = 0
"""The token of "no state key" (no key has ``mod_revision`` 0): a write with it creates the key."""
COUNTER_MARK = "eks-ddp-counter:"
"""Prefix of a counter value written by :meth:`EtcdV3Store.add` (``<mark><n>;<id>=<result>,...``)."""
COUNTER_IDS_KEPT = 256
"""Add ids a counter remembers: more than the agents of any job, each of which adds once per barrier."""
HEARTBEAT_SUFFIX = "-heartbeat"
"""Heartbeat keys live under ``<key prefix>-heartbeat/<run-id>/<addr>|<pid>|<local id>``."""
DEFAULT_HEARTBEAT_TTL_S = 15.0
"""A heartbeat lease's TTL when the handler does not set it: torch's default drop window (5 s x 3)."""
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)  # noqa: UP017  (Python 3.10: make test-compat)
"""The heartbeat time of a node whose key is gone (torch's ``_sanitize`` drops it), and every time in the core."""
CAS_JITTER_S = 0.05
"""After a lost compare-and-set an agent waits up to this long (uniformly) before torch's holder tries again."""
CLOSE_DEFER_S = 0.5
"""A round is closed (ranks assigned, one write of the core) by its first participant in torch's node order; every
other participant that finds the last call over waits this long plus up to as long again (uniformly) and closes it
only if the core has not moved meanwhile, so one write closes a round instead of one attempt per agent."""
CLOSE_POLL_S = 0.05
"""How often such a participant reads the state while it waits (a read, no raft entry)."""
REQUEST_PATTERN = """
What one agent sends to etcd (the bench's 128- and 1,000-agent simulation follows this table; k = keep_alive_interval,
N = agents, S = the core's size, ~85 bytes per node + ~140 (eks_ddp.core.rendezvous_store.core_bytes); every request
one HTTP POST to etcd's JSON gateway). Keys: the core at ``/torch/elastic/rendezvous/<run-id>``; each agent's
heartbeat at ``/torch/elastic/rendezvous-heartbeat/<run-id>/<addr>|<pid>|<local id>`` (empty value) on its own lease,
TTL ceil(k x keep_alive_max_attempt) (4 s on the cluster). tests/runtime/test_rendezvous_fleet.py pins the steady
state: 3 requests per heartbeat (the backend without its renewer, as those tests build it), ~630 bytes sent each, no
revision, the same at 4 and 12 agents.

| when | request | etcd's WAL | bytes written |
|---|---|---|---|
| every k (torch's keep-alive timer), steady state | ``txn`` compare core mod_revision; ranges of the heartbeat prefix: ``count_only``, and keys created or changed since the last read (``min_mod_revision``, ``limit`` 1); read-only | none | 0 |
| every k, right after | the same read-only ``txn`` (with the renewer running, the op renews nothing itself) | none | 0 |
| every 0.5 s (``RENEW_EVERY_S``, the renewer's own timer; overlapping while the store answers late) | ``lease/keepalive`` of the agent's heartbeat lease | none (a renewal is not a raft entry in etcd 3.5) | 0 |
| every ~0.5 s (the monitor loop, ``num_nodes_waiting``; state cache 0.25 s) | the same read-only ``txn`` | none | 0 |
| every 300 s | ``lease/keepalive`` of the state key's lease | none | 0 |
| a heartbeat lease found expired | ``lease/grant`` + ``txn`` put own heartbeat key, read core and heartbeat keys | 2 entries | ~100 |
| the agent's own move (join a forming round, wait, stand by, leave; ~3 per agent per re-form) | ``txn`` put of its claim on its own heartbeat key (~70 bytes; + ``lease/grant`` on a first join), reading the core and heartbeat keys | 1 entry, never lost to another agent's write | ~150 |
| closing a round (ranks) or the rendezvous; any change claims cannot express | a read-only check, then ``txn`` compare-and-set of the core (its revision, and no heartbeat key changed since the read); a round is closed by its first participant, others wait ``CLOSE_DEFER_S`` and write only if nothing moved | 1 entry (also when it loses) | S |
| a lost compare-and-set | the reply carries the core and heartbeat keys; wait U(0, 50 ms), retry | | |
| the core, the heartbeat set or a claim changed since the last read | one more read: core + heartbeat keys with their claims | none | 0 (reads S + N x ~130) |
| per round (c10d store: rank 0's MASTER_ADDR/PORT, ranks, barriers) | 3-5 small puts/txns on the state's lease | 3-5 entries | < 1 KiB |

Steady state: ~5 requests/s per agent (k = 1 s), none of them a write; the store's writes grow only with
re-forms (each costs O(N) compare-and-sets of O(N) bytes). A dead agent's key goes when its lease expires
(k x keep_alive_max_attempt after its last renewal): one WAL entry.
"""
POLL_FIRST_S, POLL_MAX_S = 0.01, 0.1
"""A store read that waits for keys polls after 10 ms, then twice as long each time, up to every 100 ms."""

log = logging.getLogger("training.rendezvous")
T = TypeVar("T")


class RendezvousConfigError(ValueError):
    """A store-client setting no retry can fix (the launcher exits 2 at start, a usage error)."""


def client_settings(params: RendezvousParameters) -> dict[str, Any]:
    """The store client's settings from the rdzv-conf, checked before anything is contacted: ``read_timeout`` a
    positive number, ``protocol`` http or https, and for https the three certificate files present, readable and
    loadable (the CA, the client certificate and its matching key). RendezvousConfigError names the key, the value
    and what is allowed."""
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=2379)
    raw_timeout = params.get("read_timeout", 5)
    try:
        read_timeout = float(raw_timeout)
    except (TypeError, ValueError):
        read_timeout = float("nan")
    if not read_timeout > 0:
        raise RendezvousConfigError(f"rdzv-conf read_timeout: got {raw_timeout!r}; expected seconds > 0")
    protocol = str(params.get("protocol", "https")).strip().lower()
    if protocol not in ("http", "https"):
        raise RendezvousConfigError(f"rdzv-conf protocol: got {params.get('protocol')!r}; expected 'https' (or "
                                    "'http' for an unauthenticated store, which lets anyone rewrite the rendezvous)")
    kw: dict[str, Any] = {"context": None}
    if protocol == "https":
        files = {k: params.get(k) for k in ("ca_cert", "ssl_cert", "ssl_cert_key")}
        missing = [k for k, v in files.items() if not v]
        if missing:
            raise RendezvousConfigError(f"rdzv-conf {', '.join(missing)}: missing; expected file paths (the store's "
                                        "CA, this job's client certificate and key) with protocol=https")
        for key, path in files.items():
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                raise RendezvousConfigError(f"rdzv-conf {key}: got {path!r}; expected a readable file (is the "
                                            "rendezvous TLS Secret mounted?)")
        if problem := certificate_problem("ssl_cert", files["ssl_cert"]):
            raise RendezvousConfigError(problem)
        try:
            ctx = ssl.create_default_context(cafile=files["ca_cert"])
            ctx.load_cert_chain(files["ssl_cert"], files["ssl_cert_key"])
        except (ssl.SSLError, OSError, ValueError) as e:
            raise RendezvousConfigError(f"rdzv-conf ca_cert/ssl_cert/ssl_cert_key: got {files['ca_cert']!r}, "
                                        f"{files['ssl_cert']!r}, {files['ssl_cert_key']!r}, which do not load ({e}); "
                                        "expected PEM files: the store's CA, a client certificate and its key") from e
        kw = {"context": ctx, "ca_cert": files["ca_cert"], "cert": (files["ssl_cert"], files["ssl_cert_key"])}
    return {"host": host, "port": port, "read_timeout": read_timeout, "protocol": protocol, **kw}


def make_client(params: RendezvousParameters) -> EtcdV3Client:
    """A v3 client from the rdzv-conf (:func:`client_settings`); HTTPS with a client certificate unless
    ``protocol=http``. Nothing is sent until the first call."""
    kw = client_settings(params)
    if kw["protocol"] == "http":
        log.warning("rendezvous store over plain HTTP: anyone who can reach it can rewrite the rendezvous")
    return EtcdV3Client(kw["host"], kw["port"], read_timeout=kw["read_timeout"], context=kw["context"])


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    # Explicit causes only: an implicit __context__ may be an unrelated error handled on the way.
    seen = 0
    while exc is not None and seen < 10:
        yield exc
        exc, seen = exc.__cause__, seen + 1


def is_retryable(exc: BaseException) -> bool:
    """A failure to reach the store (a retry can fix it), not an answer from it (a retry cannot)."""
    for e in _chain(exc):
        if isinstance(e, EtcdAnswerError):
            return e.retryable
        if isinstance(e, (EtcdConnectionError, ConnectionError, TimeoutError)):
            return True
    return False


NO_SPACE_LINE = (
    "the rendezvous store is full: etcd raised its NOSPACE alarm (\"mvcc: database space exceeded\", "
    "--quota-backend-bytes reached), so no rendezvous write lands (joins, drops, the c10d store) until space is "
    "freed; heartbeats and training go on and the workers' commits stay fenced by the lease. Fix: restart the store "
    "pod (kubectl -n <namespace> delete pod <store>-0: an empty store, which the agents rebuild), or compact, "
    "defragment and disarm it (etcdctl compact <revision>; etcdctl defrag; etcdctl alarm disarm); then raise the "
    "store's quota (docs/rendezvous.md \"Store\")")
"""The one line an agent logs when its store calls start failing on etcd's NOSPACE alarm."""
NO_SPACE_LOG_EVERY_S = 600.0
"""...and at most once per this many seconds while the alarm lasts."""


def no_space(exc: BaseException) -> bool:
    """Whether ``exc`` is etcd's answer while its NOSPACE alarm is raised."""
    return any(isinstance(e, EtcdAnswerError) and etcd_client.NO_SPACE in e.message for e in _chain(exc))


class Retrier:
    """Calls ``fn(client)`` until it succeeds, building a fresh client after each connection failure."""

    def __init__(self, params: RendezvousParameters, timeout_s: float) -> None:
        self.params, self.timeout_s = params, timeout_s
        self._client: EtcdV3Client | None = None
        self._settings: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self.failing_since: float | None = None
        """Monotonic time of the first failure of the current outage; None while the store answers."""
        self.last_failure = -1e18
        """Monotonic time of the last failed call."""
        self.no_space_logged = -1e18

    def client(self) -> EtcdV3Client:
        """The current client; a fresh one reads the certificate files again (a rotated Secret is picked up on the
        next reconnect). If they no longer load, the last settings that did are kept: a mount being swapped is not
        a reason to stop an agent whose settings were checked at start."""
        with self._lock:
            if self._client is None:
                try:
                    kw = client_settings(self.params)
                except RendezvousConfigError as e:
                    if self._settings is None:
                        raise
                    log.warning("%s; reconnecting with the certificates loaded before", e)
                    kw = self._settings
                if kw["protocol"] == "http" and self._settings is None:
                    log.warning("rendezvous store over plain HTTP: anyone who can reach it can rewrite the rendezvous")
                self._settings = kw
                self._client = EtcdV3Client(kw["host"], kw["port"], read_timeout=kw["read_timeout"],
                                            context=kw["context"])
            return self._client

    def _drop(self, client: EtcdV3Client) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
        client.close()

    @contextlib.contextmanager
    def impatient(self) -> Iterator[None]:
        """Calls in this block (this thread) try once: the caller tolerates a failure."""
        before = getattr(self._local, "impatient", False)
        self._local.impatient = True
        try:
            yield
        finally:
            self._local.impatient = before

    def outage_s(self) -> float:
        """Seconds the store has been failing continuously (0 while it answers)."""
        return 0.0 if self.failing_since is None else time.monotonic() - self.failing_since

    def __call__(self, what: str, fn: Callable[[EtcdV3Client], T], *, deadline: float | None = None) -> T:
        """``fn(client)``, retried on connection failures for ``store_retry_timeout`` or until ``deadline``
        (time.monotonic()) if that comes first: a caller with a wait of its own (a store ``get``) ends with it."""
        own = time.monotonic() + self.timeout_s
        deadline = own if deadline is None else min(own, deadline)
        impatient = getattr(self._local, "impatient", False)
        delay, attempt = 0.1, 0
        while True:
            client = self.client()
            try:
                result = fn(client)
                self.failing_since = None
                return result
            except Exception as e:
                if not is_retryable(e):
                    raise
                now = self.last_failure = time.monotonic()
                if self.failing_since is None:
                    self.failing_since = now
                if no_space(e) and now - self.no_space_logged > NO_SPACE_LOG_EVERY_S:
                    self.no_space_logged = now
                    log.error(NO_SPACE_LINE)
                self._drop(client)
                if impatient or now + delay > deadline:
                    raise RendezvousConnectionError(f"etcd {what}: the store did not answer ({e})") from e
                attempt += 1
                if attempt == 1 or attempt % 30 == 0:
                    log.warning("etcd %s failed (%s: %s); retrying for up to %.0f s", what, type(e).__name__, e,
                                max(0.0, deadline - now))
                time.sleep(delay)
                delay = min(delay * 2, 1.0)


class _Beat:
    """A heartbeat key this backend keeps alive: its etcd lease, the wall time of the last renewal sent that etcd
    answered, when an answer last came (monotonic) and whether etcd said the lease is gone."""

    __slots__ = ("answered", "expired", "lease", "sent")

    def __init__(self, lease: int, sent: datetime.datetime) -> None:
        self.lease, self.sent = lease, sent
        self.answered = time.monotonic()
        self.expired = False

    def renewed(self, sent: datetime.datetime) -> None:
        self.sent = max(self.sent, sent)
        self.answered = time.monotonic()


RENEW_EVERY_S = 0.5
"""How often a heartbeat lease is renewed (at most TTL/3). A renewal that reaches etcd late extends the lease from
then, so when a store turns slow the gap between two renewals that land is this interval plus the new latency: at
0.5 s a store that starts answering 3 s late leaves a 4 s lease 0.5 s to spare (etcd's own client renews at TTL/3,
1.3 s here, which would leave none)."""


class _Renewer:
    """Renews a backend's own heartbeat leases from a timer of its own, as etcd's own client does (etcd-io/etcd
    ``client/v3/lease.go`` ``recvKeepAlive``: the next keep-alive one third of the answered TTL after the answer), every
    :meth:`interval` (:data:`RENEW_EVERY_S`, at most TTL/3), independent of torch's keep-alive op, its lock and the
    reads. A renewal never waits for the one before: on a store that answers slowly (an fsync stall, a throttled pod)
    they overlap, up to one TTL's worth, and each that lands extends the lease. A renewal that fails, or whose answer
    takes longer than TTL/3, counts as a store failure for the handler's outage grace (``Retrier.last_failure``)."""

    def __init__(self, backend: EtcdV3Backend) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.backend = backend
        self.most = math.ceil(backend.heartbeat_ttl / self.interval())
        """Renewals of one lease in flight at most: those sent within one TTL (later ones could not save it)."""
        self.pool = ThreadPoolExecutor(max_workers=self.most, thread_name_prefix="rdzv-renew")
        self.inflight: dict[str, int] = {}
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._tick, name="rdzv-renew-timer", daemon=True)
        self.thread.start()

    def _tick(self) -> None:
        while True:
            for nid, mine in list(self.backend._mine.items()):
                with self._lock:
                    if mine.expired or self.inflight.get(nid, 0) >= self.most:
                        continue
                    self.inflight[nid] = self.inflight.get(nid, 0) + 1
                try:
                    self.pool.submit(self._renew, nid, mine)
                except RuntimeError:  # the pool was shut down (close(), or the interpreter exiting): stop ticking
                    return
            if self.stop.wait(self.interval()):
                return

    def interval(self) -> float:
        return min(RENEW_EVERY_S, self.backend.heartbeat_ttl / 3)

    def _renew(self, nid: str, mine: _Beat) -> None:
        retry = self.backend._retry
        sent = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017
        started = time.monotonic()
        try:
            ttl = retry.client().lease_keepalive(mine.lease)
            if ttl > 0:
                mine.renewed(sent)
            else:
                mine.expired = True
        except EtcdAnswerError as e:
            if e.code == 5:  # NOT_FOUND: expired
                mine.expired = True
            else:
                retry.last_failure = time.monotonic()
        except Exception:  # noqa: BLE001  (no answer: an outage, which the handler's own calls ride out)
            retry.last_failure = time.monotonic()
        finally:
            if time.monotonic() - started > self.backend.heartbeat_ttl / 3:
                retry.last_failure = time.monotonic()  # slow: the outage grace covers it as it covers a failure
            with self._lock:
                self.inflight[nid] = max(0, self.inflight.get(nid, 1) - 1)

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=False)


def node_id(node: Any) -> str:
    """The name of a node's heartbeat key: ``<addr>|<pid>|<local_id>`` (a torch ``_NodeDesc``)."""
    return f"{node.addr}|{node.pid}|{node.local_id}"


def _node_of(nid: str) -> Any:
    """The ``_NodeDesc`` a heartbeat key names (:func:`node_id`); None for a name that is not one."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    addr, _, rest = nid.rpartition("|")
    addr, _, pid = addr.rpartition("|")
    if not addr or not pid.isdigit() or not rest.isdigit():
        return None
    return _NodeDesc(addr, int(pid), int(rest))


def _without_deadline(core: bytes) -> bytes:
    doc = json.loads(core)
    doc["deadline"] = None
    return json.dumps(doc, sort_keys=True).encode()


class EtcdV3Backend(RendezvousBackend):
    """torch's rendezvous state over etcd v3: the *core* in one key written by compare-and-set on its
    ``mod_revision`` (the token), each node's heartbeat a key of its own on an etcd lease; every call through
    :class:`Retrier`. See :data:`REQUEST_PATTERN` for what each agent sends."""

    def __init__(self, retry: Retrier, run_id: str, name: str, *, key_prefix: str = KEY_PREFIX,
                 ttl_s: int = STATE_TTL_S, heartbeat_ttl_s: float = DEFAULT_HEARTBEAT_TTL_S) -> None:
        if not run_id:
            raise ValueError("run_id: got ''; expected the rendezvous id")
        self._retry, self._name, self._ttl_s = retry, name, int(ttl_s)
        self.key = f"{key_prefix}/{run_id}".encode()
        self.heartbeats = f"{key_prefix}{HEARTBEAT_SUFFIX}/{run_id}/".encode()
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.incarnation: tuple[int, int] | None = None
        """``(create_revision, lease)`` of the state key as last read or written; (0, 0) when it was absent."""
        self._renewed: tuple[int, float] = (0, -1e18)
        self._lock = threading.RLock()
        self._core: bytes | None = None
        """The core (the state with every heartbeat time at :data:`EPOCH`) as last read or written."""
        self._rev = 0
        """Its ``mod_revision`` (0: none known)."""
        self.live: set[str] = set()
        """Node ids whose heartbeat key existed at the last read."""
        self._live_max_mod = 0
        """Highest ``mod_revision`` among the heartbeat keys at the last read (a key created or given a new claim
        since then has a higher one)."""
        self._claims: dict[str, rdzv_claims.Claim] = {}
        """The claims on the heartbeat keys at the last read, by node id (claims.py)."""
        self._my_claims: dict[str, bytes] = {}
        """This backend's own nodes' latest claims: written again on a heartbeat key made anew."""
        self._merged: bytes | None = None
        """The state last handed to torch's holder (core merged with the claims), heartbeat times at the epoch."""
        self.min_nodes = 1
        self.max_nodes = 2**31
        """torch's ``min_nodes`` and ``max_nodes`` (claims.merge)."""
        """torch's ``min_nodes``: a forming round has a deadline once this many take part (claims.merge)."""
        self.last_call_s = 30.0
        """The last call this agent's arrival asks for (the handler sets it per round: the first round's is longer)."""
        self.claim_writes = 0
        """Claims put on this backend's heartbeat keys (the bench counts them)."""
        self._mine: dict[str, _Beat] = {}
        self._own: set[str] = set()
        """Node ids this backend has made heartbeat keys for."""
        self._unused: dict[str, tuple[int, datetime.datetime, float]] = {}
        self._renewer: _Renewer | None = None
        """Leases granted for a node's new heartbeat key by an attempt that lost: (lease, sent, monotonic grant)."""
        self._reported: dict[Any, datetime.datetime] = {}
        self.core_writes = 0
        """Compare-and-sets sent on the core (the bench counts them)."""

    @property
    def name(self) -> str:
        return self._name

    def start_renewing(self) -> None:
        """Renew this backend's own heartbeat leases from a timer of their own (:class:`_Renewer`); torch's
        keep-alive op then only creates keys, never renews them. Idempotent."""
        if self._renewer is None:
            self._renewer = _Renewer(self)

    def stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.close()
            self._renewer = None

    def alive(self, node: Any) -> bool:
        """Whether ``node`` is this backend's and, by etcd's last answers, its heartbeat lease is alive: the last
        renewal answered found it, and an answer came within its TTL. An agent judges itself by this, not by the age
        of its last renewal's send time, which a slow store makes look old while the key is there."""
        mine = self._mine.get(node_id(node))
        return (mine is not None and not mine.expired
                and time.monotonic() - mine.answered < self.heartbeat_ttl)

    @property
    def heartbeat_ttl(self) -> int:
        """Whole seconds of a heartbeat lease (etcd's TTLs are integers): never shorter than the drop window."""
        return max(2, math.ceil(self.heartbeat_ttl_s))

    def get_state(self) -> tuple[bytes, Token] | None:
        with self._lock:
            return self._retry("get_state", self._get)

    def _get(self, c: EtcdV3Client) -> tuple[bytes, Token] | None:
        if self._core is not None and self._rev:
            # One read-only transaction: nothing but a count comes back while the core and the set of heartbeat
            # keys are what this backend last saw (steady state: O(1) bytes, no WAL entry). Same count and no key
            # created since the last read: the same set (keys only vanish or appear).
            # Same count and no key created or given a new claim since the last read: the same keys and claims
            # (keys only vanish, appear or change).
            ok, responses = c.txn([compare(self.key, "MOD", self._rev)],
                                  [op_range(self.heartbeats, prefix=True, count_only=True),
                                   op_range(self.heartbeats, prefix=True, keys_only=True, limit=1,
                                            min_mod_revision=self._live_max_mod + 1)],
                                  [op_range(self.key), op_range(self.heartbeats, prefix=True)])
            if ok:
                total = etcd_client.as_int(responses[0].get("count"))
                changed = len(etcd_client.kvs_of(responses[1]))
                if total == len(self.live) and changed == 0:
                    return self._view(), self._rev
                _, responses = c.txn([], [op_range(self.key), op_range(self.heartbeats, prefix=True)])
        else:
            _, responses = c.txn([], [op_range(self.key), op_range(self.heartbeats, prefix=True)])
        return self._absorb(c, responses[0], responses[1])

    def _absorb(self, c: EtcdV3Client, core_response: dict[str, Any], beats_response: dict[str, Any]
                ) -> tuple[bytes, Token] | None:
        """Take a read of the core and of the heartbeat keys (one revision) as what the store holds now."""
        kvs = etcd_client.kvs_of(core_response)
        kv = kvs[0] if kvs else None
        beats = etcd_client.kvs_of(beats_response)
        self.live = {b.key[len(self.heartbeats):].decode(errors="replace") for b in beats}
        self._live_max_mod = max((b.mod_revision for b in beats), default=0)
        self._claims = {}
        for b in beats:
            claim = rdzv_claims.decode(b.value)
            if claim is not None:
                self._claims[b.key[len(self.heartbeats):].decode(errors="replace")] = claim
        if kv is None:
            self._core, self._rev, self.incarnation = None, 0, (0, 0)
            return (self._view(), ABSENT) if self._claims else None
        try:
            rdzv_state.from_json(kv.value)
        except rdzv_state.StateError as e:
            self._core, self._rev = None, 0
            self._heal(c, kv, e)
            return None
        self._core, self._rev = kv.value, kv.mod_revision
        self.incarnation = (kv.create_revision, kv.lease)
        return self._view(), self._rev

    def _merge(self, extra: tuple[str, rdzv_claims.Claim] | None = None) -> Any:
        """The core (the empty state when there is none) merged with the claims of the live keys (claims.py), and
        ``extra``, a claim of one of this backend's nodes, as if it were written."""
        core = rdzv_state.from_json(self._core) if self._core is not None else _RendezvousState()
        # This backend's own nodes count as live whatever the read said: whether a node of its own whose key lapsed
        # is dropped is torch's _sanitize's call on its last renewal's time (handler._HealingStateHolder), and its
        # next heartbeat makes the key again, as before claims.
        claims, live = dict(self._claims), set(self.live) | self._own
        for nid in self._own - set(self.live):
            mine = rdzv_claims.decode(self._my_claims.get(nid, b""))
            if mine is not None:
                claims[nid] = mine
        if extra is not None:
            claims[extra[0]] = extra[1]
            live.add(extra[0])
        nodes = {nid: _node_of(nid) for nid in live}
        return rdzv_claims.merge(core, {nodes[n]: c for n, c in claims.items()},
                                 {n for n in nodes.values() if n is not None}, self.min_nodes, self.max_nodes)

    def _view(self) -> bytes:
        """The state torch's holder reads: the core merged with the claims (claims.py), each node's heartbeat time
        filled in (its own nodes: when their last renewal was sent; others: now, as only nodes whose key exists are
        listed; torch's ``_sanitize`` drops a node whose lease expired, which merge() left out already)."""
        state = self._merge()
        self._merged = rdzv_state.to_json(state)
        now = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017  (Python 3.10: make test-compat)
        for node in list(state.last_heartbeats):
            nid = node_id(node)
            mine = self._mine.get(nid)
            state.last_heartbeats[node] = mine.sent if mine is not None else now if nid in self.live else EPOCH
        self._reported = dict(state.last_heartbeats)
        return pickle.dumps(state)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        new = rdzv_state.state_from_pickle(state)
        with self._lock:
            # A compare-and-set whose reply was lost is retried with the same token: it then fails the comparison
            # and returns the current state, which the handler re-reads; no update is applied twice.
            result = self._retry("set_state", lambda c: self._set(c, new, token))
        if result is not None and result[2]:
            self._renew()
        return result

    def _set(self, c: EtcdV3Client, new: Any, token: Token | None):
        times = dict(new.last_heartbeats)
        # A heartbeat is this backend's to write when its time grew since the last read and the node is one of its
        # own, or new to the state (torch adds only its own node). A peer's time from an older read (a holder that
        # synced before the peer's key went) is never taken for a heartbeat: that would bring the peer back.
        known = self._known()
        beats = [n for n, t in times.items() if (n not in self._reported or t > self._reported[n])
                 and (node_id(n) in self._mine or node_id(n) not in known)]
        for node in new.last_heartbeats:
            new.last_heartbeats[node] = EPOCH
        core = rdzv_state.to_json(new)
        current = type(token) is int and token > 0 and token == self._rev and self._core is not None
        if current and core == self._merged:
            # Only heartbeats changed: renew their leases (no write to the core, no WAL entry in etcd). With the
            # renewer running, a live lease of this backend's is its business: only a missing or expired one is
            # made here.
            for node in beats:
                mine = self._mine.get(node_id(node))
                if self._renewer is None or mine is None or mine.expired:
                    self._beat(c, node)
            got = self._get(c)  # the read-only check: the core may have moved or vanished meanwhile
            if got is None:
                return self._current()
            return got[0], got[1], got[1] == token
        if self._merged is not None or self._core is None:
            claim = self._claim_for(new, core, known)
            if claim is not None:
                return self._put_claim(c, *claim)
        return self._cas(c, new, core, token, beats)

    def _claims_of(self, new: Any) -> dict[str, bytes]:
        """The claim of each of this agent's nodes that ``new`` lists (or that it listed before), as ``new`` has it."""
        out = {}
        for node in {*new.participants, *new.wait_list, *new.redundancy_list, *new.last_heartbeats}:
            nid = node_id(node)
            if nid not in self._own and nid not in self._unused:
                continue
            role = ("participant" if node in new.participants else "waiting" if node in new.wait_list
                    else "redundant" if node in new.redundancy_list else "gone")
            out[nid] = rdzv_claims.Claim(new.round, role).encode()
        for nid in self._own:
            out.setdefault(nid, rdzv_claims.Claim(new.round, "gone").encode())
        return out

    def _known(self) -> set[str]:
        """Node ids the store's state names (the core's and the merged view's): a node not among them is new, and
        only its own agent can have added it."""
        known: set[str] = set()
        for value in (self._core, self._merged):
            if value is not None:
                known |= {node_id(n) for n in rdzv_state.from_json(value).last_heartbeats}
        return known | set(self._claims)

    def _claim_for(self, new: Any, core: bytes, known: set[str]) -> tuple[str, rdzv_claims.Claim] | None:
        """The claim of one of this backend's nodes that makes the merged state exactly ``new`` (its deadline aside:
        merge() decides it from the arrivals), or None when no single claim does (a round closed, the rendezvous
        closed, anything else): that change goes through compare-and-set on the core."""
        base = rdzv_state.from_json(self._merged) if self._merged is not None else _RendezvousState()
        listed = (set(new.participants) | new.wait_list | new.redundancy_list | set(base.participants)
                  | base.wait_list | base.redundancy_list)
        own = sorted({node_id(n) for n in listed} & (set(self._mine) | ({node_id(n) for n in listed} - known)))
        if len(own) != 1:
            return None
        nid = own[0]
        wanted = _without_deadline(core)
        ask = rdzv_claims.now() + datetime.timedelta(seconds=self.last_call_s)
        if new.deadline is not None:
            ask = max(ask, new.deadline)
        for claim in (rdzv_claims.Claim(new.round, "participant", ask), rdzv_claims.Claim(new.round, "waiting"),
                      rdzv_claims.Claim(new.round, "redundant"), rdzv_claims.Claim(base.round, "gone")):
            merged = self._merge((nid, claim))
            merged.last_heartbeats = dict.fromkeys(merged.last_heartbeats, EPOCH)
            if _without_deadline(rdzv_state.to_json(merged)) == wanted:
                return nid, claim
        return None

    def _put_claim(self, c: EtcdV3Client, nid: str, claim: rdzv_claims.Claim):
        """Write ``claim`` on node ``nid``'s heartbeat key (one put of ~70 bytes on its lease; a new lease when it has
        none), reading the core and the heartbeat keys in the same transaction."""
        value = claim.encode()
        self._my_claims[nid] = value
        for _ in range(2):
            mine = self._mine.get(nid)
            fresh = None
            if mine is None or mine.expired:
                fresh = self._unused_lease(c, nid)
            lease = fresh[0] if fresh is not None else mine.lease  # type: ignore[union-attr]
            self.claim_writes += 1
            try:
                _, responses = c.txn([], [op_put(self.heartbeats + nid.encode(), value, lease=lease),
                                          op_range(self.key), op_range(self.heartbeats, prefix=True)])
            except EtcdAnswerError as e:
                if e.code != 5:  # NOT_FOUND: the lease expired under us; a new one, once
                    raise
                self._mine.pop(nid, None)
                self._unused.pop(nid, None)
                continue
            if fresh is not None:
                self._own.add(nid)
                self._mine[nid] = _Beat(*fresh)
                self._unused.pop(nid, None)
            got = self._absorb(c, responses[1], responses[2])
            assert got is not None  # the key just written carries a claim
            return got[0], got[1], True
        raise etcd_client.EtcdError(f"etcd put of the claim on {nid}: its new lease is not found either")

    def _beat(self, c: EtcdV3Client, node: Any) -> None:
        nid = node_id(node)
        if self._renew_only(c, nid):
            return  # the lease never lapsed: the key stayed, so no peer can have dropped this node
        sent = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017
        # No live lease (first beat, or it expired while this agent could not reach the store): a new one, with
        # the core read in the same transaction, so what this agent learns of its membership postdates the key.
        lease = c.lease_grant(self.heartbeat_ttl)
        _, responses = c.txn([], [op_put(self.heartbeats + nid.encode(), self._my_claims.get(nid, b""), lease=lease),
                                  op_range(self.key), op_range(self.heartbeats, prefix=True)])
        self._own.add(nid)
        self._mine[nid] = _Beat(lease, sent)
        self._absorb(c, responses[1], responses[2])

    def _cas(self, c: EtcdV3Client, new: Any, core: bytes, token: Token | None, beats: list[Any]):
        revision = token if type(token) is int and token > 0 else None
        if token is not None and token != ABSENT and revision is None:  # not a token of this backend: not current
            self._get(c)
            return self._current()
        # A read (no raft entry) before the write: a token that is already stale costs the store nothing.
        self._get(c)
        if (revision or ABSENT) != self._rev or (new.complete and not new.closed and self._leave_close(c, new)):
            for node in beats:  # a keep-alive renews this agent's own leases whatever became of its write
                self._renew_only(c, node_id(node))
            return self._current()
        nids = {node_id(n) for n in new.last_heartbeats}
        old = rdzv_state.from_json(self._merged) if self._merged is not None and revision == self._rev else None
        beat_ids = {node_id(n) for n in beats}
        # A node dropped by another agent is dropped only while its heartbeat key is still gone: a node that
        # renewed meanwhile (its key is back) fails the transaction and stays (docs/rendezvous.md).
        dropped = [] if old is None else sorted({node_id(n) for n in old.last_heartbeats} - nids - beat_ids
                                                - set(self._mine))
        compares = [compare(self.heartbeats + d.encode(), "CREATE", 0) for d in dropped]
        # ...and only while no claim changed since the read it was built from (a node that arrived meanwhile is in
        # the next read's merge, and a round is not closed without it).
        compares.append(compare(self.heartbeats, "MOD", self._live_max_mod + 1, "LESS", prefix=True))
        # The send time before the grants: etcd counts a lease's TTL from its grant, so a time taken after it would
        # make the lease look younger than it is (the lease in fence.py must never outlast the key).
        fresh = {nid: self._unused_lease(c, nid) for nid in sorted(beat_ids) if nid not in self._mine}
        # This agent's own nodes get a claim that says what the core written here says of them, in the same
        # transaction: a claim left from an earlier move (it left the round, say) would otherwise take them out of the
        # state that the write puts them in.
        claims = self._claims_of(new)
        leases = {**{nid: b.lease for nid, b in self._mine.items() if not b.expired}, **{n: f[0] for n, f in fresh.items()}}
        puts = [op_put(self.heartbeats + nid.encode(), claims[nid], lease=leases[nid])
                for nid in sorted(claims) if nid in leases]
        reads = [op_range(self.key), op_range(self.heartbeats, prefix=True)]
        state_lease = 0
        if revision is None:
            state_lease = c.lease_grant(self._ttl_s)
            compares.insert(0, compare(self.key, "CREATE", 0))
            put = op_put(self.key, core, lease=state_lease)
        else:
            # The key keeps its lease (ignore_lease); the compare fails if it vanished meanwhile.
            compares.insert(0, compare(self.key, "MOD", revision))
            put = op_put(self.key, core, ignore_lease=True)
        self.core_writes += 1
        try:
            ok, responses = c.txn(compares, [put, *puts, *reads], reads)
        except EtcdAnswerError as e:
            if e.code != 5:  # NOT_FOUND: a kept lease is gone (it lapsed, or the store came back empty meanwhile)
                raise
            self._unused.clear()
            for nid in [n for n in leases if n in self._mine]:
                if not self._renew_only(c, nid):
                    self._mine.pop(nid, None)
            self._get(c)
            return self._current()
        if not ok:
            # The joining nodes' leases are kept for the next attempt (_unused_lease): a lost attempt neither
            # grants nor revokes one. Only the state key's own lease, granted for a create that did not land, goes.
            if state_lease:
                with contextlib.suppress(etcd_client.EtcdError):
                    c.lease_revoke(state_lease)
            self._absorb(c, responses[0], responses[1])
            # A keep-alive renews this agent's own leases whatever its compare-and-set did: under contention (a
            # re-forming fleet) a lost write must not also let its heartbeat key lapse, which would drop it.
            for node in beats:
                self._renew_only(c, node_id(node))
            # Back off a moment when many agents race for the one key (a re-forming fleet): each failed attempt
            # costs every agent a read, and the store a WAL entry.
            time.sleep(random.uniform(0, CAS_JITTER_S))
            return self._current()
        for nid, (lease, sent) in fresh.items():
            self._own.add(nid)
            self._mine[nid] = _Beat(lease, sent)
            self._unused.pop(nid, None)

        self._my_claims.update({nid: value for nid, value in claims.items() if nid in leases})
        kvs = etcd_client.kvs_of(responses[-2])
        if not kvs:  # the put applied and the key is gone within the same transaction: impossible
            raise etcd_client.EtcdError("etcd txn: the state key written is not there")
        self._absorb(c, responses[-2], responses[-1])
        for node in beats:
            if node_id(node) not in fresh:
                self._beat(c, node)
        return self._view(), self._rev, True

    def closed_round(self, rnd: int) -> dict[Any, int] | None:
        """The participants of round ``rnd`` and their ranks as the round was closed (the core as last read), or
        None when the core does not hold that round closed."""
        if self._core is None:
            return None
        core = rdzv_state.from_json(self._core)
        return dict(core.participants) if core.complete and core.round == rnd else None

    def _leave_close(self, c: EtcdV3Client, new: Any) -> bool:
        """For a write that closes the forming round (just read again): True to not write it. Not when a node that
        arrived since torch's read is missing from it (torch re-reads and decides again); and left to the round's
        first participant in torch's node order: any other waits :data:`CLOSE_DEFER_S` (jittered), reads again and
        writes only if nothing moved meanwhile, so one write closes a round, not one attempt per agent."""
        if self._merged is None:
            return False
        base = rdzv_state.from_json(self._merged)
        if base.complete or base.round != new.round:
            return False
        if set(base.participants) - set(new.participants):
            return True
        first = min(new.participants, key=lambda n: (n.addr, n.pid, n.local_id))
        if node_id(first) in self._mine:
            return False
        seen = (self._rev, self._live_max_mod, len(self.live))
        until = time.monotonic() + CLOSE_DEFER_S * (1 + random.random())
        while time.monotonic() < until:  # a read (no raft entry) every CLOSE_POLL_S: done as soon as it closed
            time.sleep(CLOSE_POLL_S)
            self._get(c)
            if (self._rev, self._live_max_mod, len(self.live)) != seen:
                return True
        return False

    def _unused_lease(self, c: EtcdV3Client, nid: str) -> tuple[int, datetime.datetime]:
        """A lease for node ``nid``'s new heartbeat key, with the wall time sent before it was granted (the key's
        life counts from the grant, so that is the time its lease is judged by). One granted for an attempt that
        lost its compare-and-set is used again while it has at least half its TTL left, so a node that joins a
        contended store grants about one lease per half TTL, not one per attempt, and revokes none."""
        unused = self._unused.get(nid)
        if unused is not None and time.monotonic() - unused[2] < self.heartbeat_ttl / 2:
            return unused[0], unused[1]
        sent = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017
        granted = time.monotonic()
        lease = c.lease_grant(self.heartbeat_ttl)
        self._unused[nid] = (lease, sent, granted)
        return lease, sent

    def _renew_only(self, c: EtcdV3Client, nid: str) -> bool:
        """Renew node ``nid``'s heartbeat lease if this backend holds a live one; nothing else (no grant, no write).
        Whether it was renewed; an expired one is forgotten (the next write carrying the node's heartbeat makes a new
        key)."""
        mine = self._mine.get(nid)
        if mine is None:
            return False
        sent = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017
        try:
            if c.lease_keepalive(mine.lease) > 0:
                mine.renewed(sent)
                return True
        except EtcdAnswerError as e:
            if e.code != 5:  # NOT_FOUND: expired; anything else is an answer to pass on
                raise
        del self._mine[nid]
        return False

    def _current(self):
        """Not set: the state the store holds now. No key (it vanished under the compare-and-set: the store came back
        empty, or a bad value was deleted) is answered as the empty state with the token :data:`ABSENT`, not None:
        on None torch's holder keeps its own state (dynamic_rendezvous.py ``sync``) and its next write would create
        the key with that stale world."""
        if self._core is None:
            return pickle.dumps(_RendezvousState()), ABSENT, False
        return self._view(), self._rev, False

    def _heal(self, c: EtcdV3Client, kv: etcd_client.KeyValue, why: Exception) -> None:
        """A value that is not a state this backend writes: delete it (if nobody changed it meanwhile) and its
        lease with the store keys on it, so the agents start a fresh state, as after a wipe."""
        log.error("the rendezvous state in etcd (%s, revision %s) is not a valid state (%s): deleting it; the "
                  "agents re-form as after a store wipe", self.key.decode(), kv.mod_revision, why)
        c.txn([compare(self.key, "MOD", kv.mod_revision)], [op_delete(self.key)])
        if kv.lease:
            c.lease_revoke(kv.lease)
        self.incarnation = (0, 0)

    def _renew(self) -> None:
        """Renew the state's lease when due (best effort: one try; the next write or heartbeat tries again)."""
        if self.incarnation is None or not self.incarnation[1]:
            return
        lease = self.incarnation[1]
        last_lease, last = self._renewed
        if lease == last_lease and time.monotonic() - last < min(RENEW_EVERY_S, self._ttl_s / 4):
            return
        try:
            with self._retry.impatient():
                self._retry("lease keepalive", lambda c: c.lease_keepalive(lease))
            self._renewed = (lease, time.monotonic())
        except (RendezvousConnectionError, etcd_client.EtcdError) as e:
            log.debug("renewing the rendezvous state's lease failed (%s); the next write tries again", e)

    def refresh_incarnation(self, deadline: float | None = None) -> tuple[int, int]:
        """Read the state key's ``(create_revision, lease)`` now (the store's keys live under and on them)."""
        def read(c: EtcdV3Client) -> tuple[int, int]:
            kv = c.get(self.key)
            return (0, 0) if kv is None else (kv.create_revision, kv.lease)
        self.incarnation = self._retry("get_state", read, deadline=deadline)
        return self.incarnation


def _parse_counter(value: str) -> tuple[int, list[tuple[str, int]]]:
    if not value.startswith(COUNTER_MARK):
        return int(value), []
    n, _, ids = value[len(COUNTER_MARK):].partition(";")
    pairs = [p.split("=", 1) for p in ids.split(",") if p]
    return int(n), [(k, int(v)) for k, v in pairs]


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list):  # the c10d bindings may hand values over as lists of ints
        return bytes(value)
    raise TypeError(f"store value: got {type(value).__name__}; expected bytes or str")


class EtcdV3Store(Store):
    """The agents' c10d store on etcd v3: set/get/add/wait/check/compare_set/multi_get/multi_set/delete_key, each
    through the :class:`Retrier`; keys scoped by the state's incarnation and round, on the state's lease."""

    def __init__(self, retry: Retrier, backend: EtcdV3Backend, run_id: str, *, prefix: str = STORE_PREFIX,
                 timeout: datetime.timedelta | None = None) -> None:
        super().__init__()  # the pybind trampoline needs it; nothing is contacted here (K3)
        self._retry, self._backend = retry, backend
        self.base = f"{prefix}/{run_id}/".encode()
        self._round_key = re.compile(rf"^torch\.rendezvous\.{re.escape(run_id)}\.(\d{{1,15}})/(.*)$", re.S)
        self._cleaned: set[tuple[int, int]] = set()
        if timeout is not None:
            self.set_timeout(timeout)

    # -- keys ---------------------------------------------------------------------------------------------------

    def _incarnation(self, deadline: float | None = None) -> tuple[int, int]:
        return self._backend.incarnation or self._backend.refresh_incarnation(deadline)

    def _path(self, key: str, incarnation: int) -> tuple[bytes, int | None]:
        """The etcd key of a store key, and its round (None: not a round's key)."""
        m = self._round_key.match(key)
        head = self.base + f"{incarnation:016d}/".encode()
        if m is None:
            return head + b"_/" + key.encode(), None
        rnd = int(m.group(1))
        return head + f"r{rnd:015d}/".encode() + m.group(2).encode(), rnd

    def key_of(self, key: str) -> bytes:
        """The etcd key that holds ``key`` (as this agent sees the state now)."""
        return self._path(key, self._incarnation()[0])[0]

    def _writing(self, c: EtcdV3Client, key: str) -> tuple[bytes, int]:
        """Before a write: the key's etcd path and the lease to put it on; the first write of a round deletes
        older incarnations' keys and the keys of rounds before the previous one (E6)."""
        incarnation, lease = self._incarnation()
        path, rnd = self._path(key, incarnation)
        if rnd is not None and (incarnation, rnd) not in self._cleaned:
            head = self.base + f"{incarnation:016d}/".encode()
            ops = [op_delete(self.base, range_end=head)]
            if rnd >= 2:
                ops.append(op_delete(head + b"r", range_end=head + f"r{rnd - 1:015d}/".encode()))
            c.txn([], ops)
            self._cleaned.add((incarnation, rnd))
        return path, lease

    def _put_leased(self, c: EtcdV3Client, ops: Callable[[int], list[dict[str, Any]]], lease: int,
                    compares: list[dict[str, Any]] | None = None, failure: list[dict[str, Any]] | None = None):
        """A transaction whose puts go on ``lease``; when that lease is gone (the state expired or was replaced
        under us) once more with the state's lease read now, else with none."""
        try:
            return c.txn(compares or [], ops(lease), failure or [])
        except EtcdAnswerError as e:
            if etcd_client.LEASE_NOT_FOUND not in e.message or not lease:
                raise
        _, fresh = self._backend.refresh_incarnation()
        try:
            return c.txn(compares or [], ops(fresh), failure or [])
        except EtcdAnswerError as e:
            if etcd_client.LEASE_NOT_FOUND not in e.message:
                raise
        log.warning("the rendezvous state's lease is gone; store keys are written without one")
        return c.txn(compares or [], ops(0), failure or [])

    # -- c10d Store -----------------------------------------------------------------------------------------------

    def set(self, key, value) -> None:
        data = _bytes(value)

        def call(c: EtcdV3Client) -> None:
            path, lease = self._writing(c, key)
            self._put_leased(c, lambda ls: [op_put(path, data, lease=ls)], lease)
        self._retry("store.set", call)

    def multi_set(self, keys, values) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys, {len(values)} values")
        data = [_bytes(v) for v in values]

        def call(c: EtcdV3Client) -> None:
            paths = [self._writing(c, k) for k in keys]
            lease = paths[0][1] if paths else 0
            self._put_leased(c, lambda ls: [op_put(p, d, lease=ls) for (p, _), d in zip(paths, data, strict=True)], lease)
        if keys:
            self._retry("store.multi_set", call)

    def _read(self, keys: list[str], timeout: datetime.timedelta | None) -> list[bytes] | None:
        """The values of ``keys`` once all exist (polled), or None after ``timeout`` (the store's by default)."""
        wait_s = (self.timeout if timeout is None else timeout).total_seconds()
        deadline = time.monotonic() + wait_s
        delay = POLL_FIRST_S
        while True:
            # Every request of the wait, retries of connection failures included, ends by the wait's deadline
            # (plus one read_timeout): a get never outlasts its timeout by store_retry_timeout.
            paths = [self._path(k, self._incarnation(deadline)[0])[0] for k in keys]
            kvs = self._retry("store.get", lambda c, paths=paths: c.get_many(paths),  # type: ignore[misc]
                              deadline=deadline)
            found = [kv for kv in kvs if kv is not None]
            if len(found) == len(kvs):
                return [self._value(kv.value) for kv in found]
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX_S)

    @staticmethod
    def _value(value: bytes) -> bytes:
        if value.startswith(COUNTER_MARK.encode()):
            with contextlib.suppress(UnicodeDecodeError, ValueError):
                return str(_parse_counter(value.decode())[0]).encode()
        return value

    def get(self, key) -> bytes:
        values = self._read([key], None)
        if values is None:
            raise LookupError(f"store key {key!r}: not set within {self.timeout.total_seconds():.0f} s")
        return values[0]

    def multi_get(self, keys) -> list[bytes]:
        values = self._read(list(keys), None)
        if values is None:
            raise LookupError(f"store keys {list(keys)[:4]!r}...: not all set within "
                              f"{self.timeout.total_seconds():.0f} s")
        return values

    def wait(self, keys, override_timeout: datetime.timedelta | None = None) -> None:
        if self._read(list(keys), override_timeout) is None:
            raise LookupError(f"store keys {list(keys)[:4]!r}: not all set in time")

    def check(self, keys) -> bool:
        paths = [self.key_of(k) for k in keys]
        return all(kv is not None for kv in self._retry("store.check", lambda c: c.get_many(paths)))

    def add(self, key, num: int) -> int:
        op = uuid.uuid4().hex[:12]
        return self._retry("store.add", lambda c: self._add_once(c, key, int(num), op))

    def _add_once(self, c: EtcdV3Client, key: str, num: int, op: str) -> int:
        path, lease = self._writing(c, key)
        for _ in range(10_000):
            kv = c.get(path)
            if kv is None:
                value = f"{COUNTER_MARK}{num};{op}={num}".encode()
                ok, _ = self._put_leased(c, lambda ls, value=value: [op_put(path, value, lease=ls)],  # type: ignore[misc]
                                         lease,
                                         [compare(path, "CREATE", 0)])
                if ok:
                    return num
                continue
            n, ids = _parse_counter(kv.value.decode())
            done = dict(ids)
            if op in done:
                return done[op]  # this add landed before its reply was lost: do not count it twice
            new = n + num
            ids = [*ids, (op, new)][-COUNTER_IDS_KEPT:]
            value = f"{COUNTER_MARK}{new};".encode() + ",".join(f"{k}={v}" for k, v in ids).encode()
            ok, _ = c.txn([compare(path, "MOD", kv.mod_revision)], [op_put(path, value, ignore_lease=True)])
            if ok:
                return new
            time.sleep(random.uniform(0, 0.05))
        raise RuntimeError(f"store.add {key!r}: no compare-and-set won in 10000 attempts")

    def compare_set(self, key, expected_value, desired_value) -> bytes:
        expected, desired = _bytes(expected_value), _bytes(desired_value)

        def call(c: EtcdV3Client) -> bytes:
            path, lease = self._writing(c, key)
            cond = [compare(path, "CREATE", 0)] if not expected else [compare(path, "VALUE", expected)]
            ok, responses = self._put_leased(c, lambda ls: [op_put(path, desired, lease=ls)], lease, cond,
                                             [op_range(path)])
            if ok:
                return desired
            kvs = etcd_client.kvs_of(responses[0]) if responses else []
            return kvs[0].value if kvs else expected  # c10d: a missing key with an expected value answers it
        return self._retry("store.compare_set", call)

    def delete_key(self, key) -> bool:
        path = self.key_of(key)
        return self._retry("store.delete_key", lambda c: c.delete(path)) > 0

    def num_keys(self) -> int:
        head = self.base + f"{self._incarnation()[0]:016d}/".encode()
        return len(self._retry("store.num_keys", lambda c: c.get_prefix(head, keys_only=True)))
