"""etcd access for the ``eks-etcd`` rendezvous: TLS clients, retries of what a retry can fix, idempotent adds.

* :func:`make_client` builds python-etcd 0.4.5's ``etcd.Client`` over HTTPS with a client certificate
  (rdzv-conf ``protocol``, ``ca_cert``, ``ssl_cert``, ``ssl_cert_key``: torch's own etcd-v2 keys). It uses
  ``allow_reconnect=False``: python-etcd then sends nothing at construction (with ``True`` it asks the
  server for its members, so an agent started while the store is away failed at once, review K3) and
  always talks to the endpoint it was given (the Service name the server certificate is issued for).
* :class:`Retrier` retries only connection failures (refused, reset, timed out, TLS handshake cut) on a
  fresh client, for up to ``store_retry_timeout`` seconds, or once when called ``impatient`` (the
  heartbeat thread and the monitor loop, which must never block the agent on a dead store). etcd's
  answers (key not found, compare failed, already exists) are never retried (review K7 a).
* :class:`RetryingEtcdStore` makes ``add`` idempotent: each call carries an id, and the counter's value
  records the ids of the last adds with their results, so an add re-sent after a lost reply returns
  its first result instead of counting twice (review K7 b).
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token
from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore, cas_delay
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

KEY_PREFIX = "/torch/elastic/rendezvous"
STORE_PREFIX = "/torch/elastic/store"
COUNTER_MARK = "eks-ddp-counter:"
"""Prefix of a counter value written by :meth:`RetryingEtcdStore.add` (``<mark><n>;<id>=<result>,...``)."""
COUNTER_IDS_KEPT = 256
"""Add ids a counter remembers: more than the agents of any job, each of which adds once per barrier."""

log = logging.getLogger("training.rendezvous")
T = TypeVar("T")


class RendezvousConfigError(ValueError):
    """A store-client setting no retry can fix (the launcher exits 2 at start, a usage error)."""


def client_settings(params: RendezvousParameters) -> dict[str, Any]:
    """The ``etcd.Client`` arguments from the rdzv-conf, checked before anything is contacted:
    ``read_timeout`` a positive number, ``protocol`` http or https, and for https the three certificate files
    present, readable and loadable (the CA, the client certificate and its matching key). RendezvousConfigError
    names the key, the value and what is allowed."""
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
                                    "'http' for an unauthenticated store, which lets any writer run code in the agents)")
    kw: dict[str, Any] = {}
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
        try:
            ctx = ssl.create_default_context(cafile=files["ca_cert"])
            ctx.load_cert_chain(files["ssl_cert"], files["ssl_cert_key"])
        except (ssl.SSLError, OSError, ValueError) as e:
            raise RendezvousConfigError(f"rdzv-conf ca_cert/ssl_cert/ssl_cert_key: got {files['ca_cert']!r}, "
                                        f"{files['ssl_cert']!r}, {files['ssl_cert_key']!r}, which do not load ({e}); "
                                        "expected PEM files: the store's CA, a client certificate and its key") from e
        kw = {"ca_cert": files["ca_cert"], "cert": (files["ssl_cert"], files["ssl_cert_key"])}
    return {"host": host, "port": port, "read_timeout": read_timeout, "protocol": protocol, **kw}


def make_client(params: RendezvousParameters):
    """An ``etcd.Client`` from the rdzv-conf (:func:`client_settings`); HTTPS with a client certificate unless
    ``protocol=http``. urllib3 does not retry under it: python-etcd's ``PoolManager`` has urllib3's default
    ``Retry(total=3)``, which made one call take up to 4 x ``read_timeout`` while the :class:`Retrier` already
    retries what a retry can fix."""
    import etcd

    kw = client_settings(params)
    if kw["protocol"] == "http":
        log.warning("rendezvous store over plain HTTP: anyone who can write it can run code in this agent")
    client = etcd.Client(allow_reconnect=False, **kw)
    client.http.connection_pool_kw["retries"] = False  # read by every pool the manager creates (lazily)
    client.http.clear()
    return client


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    # Explicit causes only (torch wraps etcd's errors with ``from``): an implicit __context__ may be an
    # unrelated error handled on the way (e.g. a key found missing just before the write that failed).
    seen = 0
    while exc is not None and seen < 10:
        yield exc
        exc, seen = exc.__cause__, seen + 1


def is_retryable(exc: BaseException) -> bool:
    """A failure to reach the store (a retry can fix it), not an answer from it (a retry cannot)."""
    import etcd
    import urllib3.exceptions

    for e in _chain(exc):
        if isinstance(e, (etcd.EtcdKeyError, etcd.EtcdValueError, etcd.EtcdEventIndexCleared,
                          etcd.EtcdInsufficientPermissions)):
            return False
    return any(isinstance(e, (etcd.EtcdConnectionFailed, etcd.EtcdLeaderElectionInProgress,
                              urllib3.exceptions.HTTPError, OSError, TimeoutError)) for e in _chain(exc))


def _has(exc: BaseException, kind: type) -> bool:
    return any(isinstance(e, kind) for e in _chain(exc))


class Retrier:
    """Calls ``fn(client)`` until it succeeds, building a fresh client after each connection failure."""

    def __init__(self, params: RendezvousParameters, timeout_s: float) -> None:
        self.params, self.timeout_s = params, timeout_s
        self._client = None
        self._local = threading.local()
        self.failing_since: float | None = None
        """Monotonic time of the first failure of the current outage; None while the store answers."""
        self.last_failure = -1e18
        """Monotonic time of the last failed call."""

    def client(self):
        if self._client is None:
            self._client = make_client(self.params)
        return self._client

    @contextlib.contextmanager
    def impatient(self) -> Iterator[None]:
        """Calls in this block (this thread) try once: the caller tolerates a failure."""
        self._local.impatient = True
        try:
            yield
        finally:
            self._local.impatient = False

    def outage_s(self) -> float:
        """Seconds the store has been failing continuously (0 while it answers)."""
        return 0.0 if self.failing_since is None else time.monotonic() - self.failing_since

    def __call__(self, what: str, fn: Callable[[Any], T]) -> T:
        deadline = time.monotonic() + self.timeout_s
        impatient = getattr(self._local, "impatient", False)
        delay, attempt = 0.1, 0
        while True:
            try:
                result = fn(self.client())
                self.failing_since = None
                return result
            except Exception as e:
                if not is_retryable(e):
                    raise
                now = self.last_failure = time.monotonic()
                if self.failing_since is None:
                    self.failing_since = now
                self._client = None
                if impatient or now + delay > deadline:
                    raise RendezvousConnectionError(f"etcd {what}: the store did not answer ({e})") from e
                attempt += 1
                if attempt == 1 or attempt % 30 == 0:
                    log.warning("etcd %s failed (%s: %s); retrying for up to %.0f s", what, type(e).__name__, e,
                                max(0.0, deadline - now))
                time.sleep(delay)
                delay = min(delay * 2, 1.0)


class RetryingEtcdBackend(RendezvousBackend):
    """torch's EtcdRendezvousBackend (same keys and TTL), each call retried through :class:`Retrier`."""

    def __init__(self, retry: Retrier, run_id: str, name: str) -> None:
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import EtcdRendezvousBackend

        self._retry, self._run_id, self._name = retry, run_id, name
        self._make = lambda client: EtcdRendezvousBackend(client, run_id, key_prefix=KEY_PREFIX)

    @property
    def name(self) -> str:
        return self._name

    def get_state(self) -> tuple[bytes, Token] | None:
        return self._retry("get_state", lambda c: self._make(c).get_state())

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        import etcd

        def call(client):
            backend = self._make(client)
            try:
                return backend.set_state(state, token)
            except RendezvousConnectionError as e:
                if not _has(e, etcd.EtcdKeyNotFound):
                    raise
                # The key vanished under a compare-and-set (the store came back empty): not set; the
                # handler re-reads the current state (None: none) and decides again.
                current = backend.get_state()
                return None if current is None else (*current, False)

        # A compare-and-set whose reply was lost is retried with the same token: it then fails the
        # comparison and returns the current state, which the handler re-reads; no update is applied twice.
        return self._retry("set_state", call)


def _parse_counter(value: str) -> tuple[int, list[tuple[str, int]]]:
    if not value.startswith(COUNTER_MARK):
        return int(value), []
    n, _, ids = value[len(COUNTER_MARK):].partition(";")
    pairs = [p.split("=", 1) for p in ids.split(",") if p]
    return int(n), [(k, int(v)) for k, v in pairs]


class RetryingEtcdStore(EtcdStore):
    """The agents' key-value store (rank assignment, exit barrier) with the same retries and idempotent adds."""

    def __init__(self, retry: Retrier) -> None:
        # No client yet: building one contacts nobody, but keep start-up free of store calls anyway.
        super().__init__(None, STORE_PREFIX)
        self._retry = retry

    def _call(self, name: str, *args: Any) -> Any:
        def call(client):
            self.client = client
            return getattr(EtcdStore, name)(self, *args)
        return self._retry(f"store.{name}", call)

    def set(self, key, value):
        return self._call("set", key, value)

    def get(self, key) -> bytes:
        value = self._call("get", key)
        with contextlib.suppress(UnicodeDecodeError):
            text = value.decode()
            if text.startswith(COUNTER_MARK):
                return str(_parse_counter(text)[0]).encode()
        return value

    def add(self, key, num: int) -> int:
        op = uuid.uuid4().hex[:12]
        return self._retry("store.add", lambda client: self._add_once(client, key, num, op))

    def _add_once(self, client, key, num: int, op: str) -> int:
        import etcd

        path = self.prefix + self._encode(key)
        while True:
            try:
                node = client.get(key=path)
            except etcd.EtcdKeyNotFound:
                try:
                    client.write(key=path, value=self._encode(f"{COUNTER_MARK}{num};{op}={num}"), prevExist=False)
                    return num
                except etcd.EtcdAlreadyExist:
                    continue
            n, ids = _parse_counter(self._decode(node.value).decode())
            done = dict(ids)
            if op in done:
                return done[op]  # this add landed before its reply was lost: do not count it twice
            new = n + num
            ids = [*ids, (op, new)][-COUNTER_IDS_KEPT:]
            value = f"{COUNTER_MARK}{new};" + ",".join(f"{k}={v}" for k, v in ids)
            try:
                client.test_and_set(key=path, value=self._encode(value), prev_value=node.value)
                return new
            except etcd.EtcdCompareFailed:
                cas_delay()

    def wait(self, keys, override_timeout=None):
        return self._call("wait", keys, override_timeout)

    def check(self, keys) -> bool:
        return self._call("check", keys)
