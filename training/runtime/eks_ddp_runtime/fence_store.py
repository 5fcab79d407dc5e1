"""The run's fence in its own rendezvous store: which world may commit, answered by a linearizable read.

With the ``eks-etcd`` rendezvous, the agent passes its store to its workers (:data:`FENCE_STORE_ENV`: the endpoint,
the TLS client files it was started with, the run's rendezvous id and ``store_retry_timeout``); a worker's rank 0
(the bundled trainer: training/eks_ddp_trainer/checkpoint.py) keeps its world's fence there instead of trusting
what a shared file system's client may answer from cache (docs/rendezvous.md "Why two worlds never both commit").

Keys, under ``/eks-ddp/fence/<rendezvous id>/``:

* ``newest``: the newest world's record (JSON: ``generation``, ``lineage``, ``base``, a random ``nonce``...). A world
  takes a generation with one transaction that compares the key's value with the one it read
  (``create_revision == 0`` when there was none) and writes ``newest`` and ``gen/<generation>`` together, so at most
  one of several writers that read the same ``newest`` wins, and generations only grow in the store's order.
* ``gen/<generation, 9 digits>``: every world's record, kept for reading back (one key per world).

Reads are etcd's default range, which is linearizable ("Range requests are linearizable by default; linearizable
requests have higher latency and lower throughput than serializable requests", ``RangeRequest.serializable`` in
etcd-io/etcd ``api/etcdserverpb/rpc.proto``): a read that starts after a write completed sees it, whatever member or
client it comes through. The keys live on no lease: they outlive the rendezvous state's 2 h TTL.

Retries are the launcher's own (rendezvous/etcd_backend.py ``Retrier``): connection failures and etcd's "try
again" codes (:data:`~eks_ddp_runtime.rendezvous.etcd_client.RETRYABLE_CODES`) only, with a fresh connection,
100 ms doubling to 1 s, until the caller's bound (never more than ``store_retry_timeout``); an answer is never
retried. When the bound passes, :class:`StoreUnavailable`: the caller defers its commit (a check it could not make
is a check that failed). Standard library only (the runtime has no third-party dependency).
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .rendezvous.etcd_client import (
    EtcdAnswerError,
    EtcdConnectionError,
    EtcdV3Client,
    compare,
    op_put,
)

__all__ = ["FENCE_STORE_ENV", "KEY_PREFIX", "FenceStore", "FenceStoreConfigError", "StoreUnavailable", "config_for",
           "from_env"]

FENCE_STORE_ENV = "EKS_DDP_FENCE_STORE"
"""Set by the launcher (``eks-etcd`` rendezvous) for its workers: JSON ``{endpoint, protocol, ca_cert, ssl_cert,
ssl_cert_key, read_timeout, retry_timeout_s, run_id}``. Absent: no store, the fences are files only."""
KEY_PREFIX = "/eks-ddp/fence"
DEFAULT_PORT = 2379

log = logging.getLogger(__name__)
T = TypeVar("T")


class FenceStoreConfigError(ValueError):
    """:data:`FENCE_STORE_ENV` does not describe a store (names the field, the value and what is allowed)."""


class StoreUnavailable(Exception):
    """The store did not answer within the caller's bound: nothing may be committed on this check."""


def config_for(endpoint: str, run_id: str, rdzv_configs: dict[str, Any], retry_timeout_s: float) -> str:
    """The value of :data:`FENCE_STORE_ENV` for an agent of rendezvous ``run_id`` at ``endpoint`` (``host:port``)
    with torch's etcd rdzv-conf keys (``protocol``, ``ca_cert``, ``ssl_cert``, ``ssl_cert_key``, ``read_timeout``)."""
    keys = ("protocol", "ca_cert", "ssl_cert", "ssl_cert_key", "read_timeout")
    return json.dumps({"endpoint": endpoint, "run_id": run_id, "retry_timeout_s": float(retry_timeout_s),
                       **{k: rdzv_configs[k] for k in keys if rdzv_configs.get(k) is not None}})


def from_env(environ: dict[str, str] | None = None) -> FenceStore | None:
    """The store named by :data:`FENCE_STORE_ENV`, or None when it is not set."""
    raw = (os.environ if environ is None else environ).get(FENCE_STORE_ENV)
    if not raw:
        return None
    try:
        conf = json.loads(raw)
        if not isinstance(conf, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise FenceStoreConfigError(f"{FENCE_STORE_ENV}: got {raw[:80]!r} ({e}); expected a JSON object") from e
    endpoint, run_id = conf.get("endpoint"), conf.get("run_id")
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise FenceStoreConfigError(f"{FENCE_STORE_ENV} endpoint: got {endpoint!r}; expected 'host[:port]'")
    if not isinstance(run_id, str) or not run_id or "/" in run_id:
        raise FenceStoreConfigError(f"{FENCE_STORE_ENV} run_id: got {run_id!r}; expected the rendezvous id (no '/')")
    host, _, port = endpoint.strip().rpartition(":")
    if not host or not port.isdigit() or host.count(":") and not host.endswith("]"):
        host, port = endpoint.strip(), str(DEFAULT_PORT)  # no port: etcd's (torch's parse_rendezvous_endpoint too)
    protocol = str(conf.get("protocol", "https")).lower()
    if protocol not in ("http", "https"):
        raise FenceStoreConfigError(f"{FENCE_STORE_ENV} protocol: got {protocol!r}; expected 'https' or 'http'")
    context = None
    if protocol == "https":
        raw_files = [conf.get(k) for k in ("ca_cert", "ssl_cert", "ssl_cert_key")]
        files = [f for f in raw_files if isinstance(f, str) and f]
        if len(files) != 3:
            raise FenceStoreConfigError(f"{FENCE_STORE_ENV} ca_cert/ssl_cert/ssl_cert_key: got {raw_files!r}; "
                                        "expected the agent's three TLS file paths")
        try:
            context = ssl.create_default_context(cafile=files[0])
            context.load_cert_chain(files[1], files[2])
        except (ssl.SSLError, OSError) as e:
            raise FenceStoreConfigError(f"{FENCE_STORE_ENV} ca_cert/ssl_cert/ssl_cert_key: got {files!r}, which do "
                                        f"not load ({e}); expected PEM files") from e
    try:
        read_timeout = float(conf.get("read_timeout", 5))
        retry_timeout_s = float(conf.get("retry_timeout_s", 600))
        port_n = int(port)
    except (TypeError, ValueError) as e:
        raise FenceStoreConfigError(f"{FENCE_STORE_ENV}: got {conf!r} ({e}); expected numbers for the port, "
                                    "read_timeout and retry_timeout_s") from e
    return FenceStore(host.strip("[]"), port_n, run_id=run_id, context=context, read_timeout=read_timeout,
                      retry_timeout_s=retry_timeout_s)


class FenceStore:
    """The fence keys of one run in one etcd (see the module docstring)."""

    def __init__(self, host: str, port: int, *, run_id: str, context: ssl.SSLContext | None, read_timeout: float,
                 retry_timeout_s: float) -> None:
        self.host, self.port, self.run_id = host, port, run_id
        self.context, self.read_timeout, self.retry_timeout_s = context, read_timeout, retry_timeout_s
        self.prefix = f"{KEY_PREFIX}/{run_id}/"
        self._client: EtcdV3Client | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FenceStore({self.host}:{self.port}, {self.prefix})"

    @property
    def newest_key(self) -> bytes:
        return f"{self.prefix}newest".encode()

    def generation_key(self, generation: int) -> bytes:
        return f"{self.prefix}gen/{generation:09d}".encode()

    def _call(self, what: str, fn: Callable[[EtcdV3Client], T], wait_s: float) -> T:
        deadline = time.monotonic() + min(wait_s, self.retry_timeout_s)
        delay = 0.1
        while True:
            with self._lock:
                if self._client is None:
                    self._client = EtcdV3Client(self.host, self.port, read_timeout=self.read_timeout,
                                                context=self.context)
                client = self._client
            try:
                return fn(client)
            except (EtcdConnectionError, EtcdAnswerError) as e:
                if isinstance(e, EtcdAnswerError) and not e.retryable:
                    raise
                with self._lock:
                    if self._client is client:
                        self._client = None
                client.close()
                if time.monotonic() + delay > deadline:
                    raise StoreUnavailable(f"the run's store {self.host}:{self.port} did not answer the fence's "
                                           f"{what} ({e})") from e
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def newest(self, wait_s: float) -> tuple[dict[str, Any] | None, bytes | None]:
        """(the newest world's record, the key's value as stored), or (None, None) in an empty store; a
        linearizable read. StoreUnavailable after ``wait_s`` of failures."""
        kv = self._call("read", lambda c: c.get(self.newest_key), wait_s)
        if kv is None:
            return None, None
        try:
            record = json.loads(kv.value)
            int(record["generation"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{self.newest_key.decode()}: got {kv.value[:120]!r}; expected a fence record") from e
        return record, kv.value

    def claim(self, record: dict[str, Any], expected: bytes | None, wait_s: float) -> bool:
        """Make ``record`` the newest if ``newest`` still holds ``expected`` (its value as read; None: absent, i.e.
        ``create_revision == 0``); whether it won. The value, not the revision, is compared: a wiped store counts
        revisions from 1 again, while every record holds a random ``nonce``. A reply lost after the store applied
        it is recognised by that nonce on the next read."""
        body = json.dumps(record, sort_keys=True).encode()
        cond = (compare(self.newest_key, "CREATE", 0) if expected is None
                else compare(self.newest_key, "VALUE", expected))
        ops = [op_put(self.newest_key, body), op_put(self.generation_key(int(record["generation"])), body)]
        won, _ = self._call("claim", lambda c: c.txn([cond], ops), wait_s)
        return won

    def records(self, wait_s: float) -> dict[int, dict[str, Any]]:
        """Every world's record in the store, by generation (one linearizable read)."""
        prefix = f"{self.prefix}gen/".encode()
        out = {}
        for kv in self._call("read", lambda c: c.get_prefix(prefix), wait_s):
            try:
                record = json.loads(kv.value)
                out[int(record["generation"])] = record
            except (ValueError, KeyError, TypeError):
                log.warning("fence record %s in the store does not parse: left out", kv.key.decode(errors="replace"))
        return out

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
