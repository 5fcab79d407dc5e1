"""A small client for etcd's v3 API through its JSON gRPC gateway, on the standard library only.

etcd serves its v3 gRPC API as JSON over HTTP at ``/v3/...`` on the client port (etcd.io docs, "Why gRPC gateway";
etcd 3.5 and later serve only the ``/v3/`` prefix). The request and response shapes are the protobuf messages of
etcd-io/etcd ``api/etcdserverpb/rpc.proto`` in proto3's JSON mapping: ``bytes`` fields (keys, values) are base64,
``int64`` fields come back as decimal strings, and fields at their zero value are left out of responses (an absent
``kvs`` is no key, an absent ``succeeded`` is false). Errors come back as an HTTP status with a body
``{"error", "code", "message"}``, ``code`` being the gRPC status code.

Only what the rendezvous needs: ``range``, ``put``, ``deleterange`` and ``txn`` (compare-and-set on a key's
``mod_revision`` or ``create_revision``, atomic multi-key reads), ``lease/grant``, ``lease/keepalive`` and
``lease/revoke``. Each call sends one request on a kept-alive connection (one per thread: the agent's keep-alive
thread never waits behind the main thread's call); it never retries by itself except once, at once, when a
connection it reused had been closed by the server while idle (the request was never read). Deciding about retries
is the caller's job (rendezvous/etcd_backend.py ``Retrier``).

TLS: the caller passes an ``ssl.SSLContext`` holding the store's CA and the client certificate. With
``--client-cert-auth`` etcd's gateway dials etcd's own gRPC port with the *server* certificate as its client
certificate (etcd server/embed/serve.go, ``serveCtx.serve``: ``dtls := tlscfg.Clone()``; etcd-io/etcd#16590), so
the server certificate must allow client authentication too (components/eks_ddp/workloads/etcd_tls.py, training/eks_ddp_local/etcd_server.py).
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
from collections.abc import Iterable
from typing import Any

MAX_RESPONSE_BYTES = 16 << 20
"""A response larger than this is refused (etcd's own request limit is 1.5 MiB by default)."""
RETRYABLE_CODES = frozenset({4, 8, 14})
"""gRPC codes that mean "the store could not answer now": DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (the NOSPACE
alarm, ``ErrGRPCNoSpace`` "etcdserver: mvcc: database space exceeded": writes are refused until an operator frees
space and disarms it, after which a retry succeeds), UNAVAILABLE (no leader, leader changed, request timed out:
etcd-io/etcd api/v3rpc/rpctypes ``ErrGRPCNoLeader``, ``ErrGRPCTimeout``...)."""
NO_SPACE = "database space exceeded"
"""etcd's answer while its NOSPACE alarm is raised (api/v3rpc/rpctypes ``ErrGRPCNoSpace``)."""
LEASE_NOT_FOUND = "requested lease not found"


class EtcdError(Exception):
    """Base of this client's errors."""


class EtcdConnectionError(EtcdError):
    """The store did not answer (refused, reset, timed out, TLS handshake cut, a proxy's 502/503/504)."""


class EtcdAnswerError(EtcdError):
    """The store answered with an error (``code``: the gRPC status code; ``message``: etcd's text)."""

    def __init__(self, code: int, message: str, status: int) -> None:
        super().__init__(f"etcd: {message} (grpc code {code}, http {status})")
        self.code, self.message, self.status = code, message, status

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise EtcdError(f"etcd response: got {type(text).__name__}; expected a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise EtcdError(f"etcd response: not base64 ({e})") from e


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range every key starting with ``prefix`` (rpc.proto ``RangeRequest``)."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def as_int(value: Any, default: int = 0) -> int:
    """An int64 field from a response (a decimal string, or absent at zero)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise EtcdError(f"etcd response: got {value!r}; expected an integer")
    try:
        return int(value)
    except ValueError as e:
        raise EtcdError(f"etcd response: got {value!r}; expected an integer") from e


class KeyValue:
    """One ``mvccpb.KeyValue`` of a response."""

    __slots__ = ("create_revision", "key", "lease", "mod_revision", "value", "version")

    def __init__(self, raw: Any) -> None:
        if not isinstance(raw, dict):
            raise EtcdError(f"etcd response: a key-value is {type(raw).__name__}; expected an object")
        self.key = unb64(raw.get("key", ""))
        self.value = unb64(raw.get("value", ""))
        self.create_revision = as_int(raw.get("create_revision"))
        self.mod_revision = as_int(raw.get("mod_revision"))
        self.version = as_int(raw.get("version"))
        self.lease = as_int(raw.get("lease"))


def kvs_of(response: dict[str, Any]) -> list[KeyValue]:
    raw = response.get("kvs", [])
    if not isinstance(raw, list):
        raise EtcdError("etcd response: kvs is not a list")
    return [KeyValue(kv) for kv in raw]


def op_range(key: bytes, *, prefix: bool = False, keys_only: bool = False, count_only: bool = False,
             min_create_revision: int = 0, min_mod_revision: int = 0, limit: int = 0) -> dict[str, Any]:
    """A ``RangeRequest``; ``count_only`` answers ``count`` alone (no keys; filters do not change the count),
    ``min_create_revision`` keeps only keys created at or after that revision, applied before ``limit`` (rpc.proto
    ``RangeRequest``; etcd server/etcdserver/txn ``executeRange`` fetches the whole range when a filter is set)."""
    body: dict[str, Any] = {"key": b64(key)}
    if prefix:
        body["range_end"] = b64(prefix_end(key))
    if keys_only:
        body["keys_only"] = True
    if count_only:
        body["count_only"] = True
    if min_create_revision:
        body["min_create_revision"] = str(int(min_create_revision))
    if min_mod_revision:
        body["min_mod_revision"] = str(int(min_mod_revision))
    if limit:
        body["limit"] = str(int(limit))
    return {"request_range": body}


def op_put(key: bytes, value: bytes, *, lease: int = 0, ignore_lease: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if ignore_lease:
        body["ignore_lease"] = True
    elif lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def op_delete(key: bytes, *, range_end: bytes | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"key": b64(key)}
    if range_end is not None:
        body["range_end"] = b64(range_end)
    return {"request_delete_range": body}


def compare(key: bytes, target: str, value: int | bytes, result: str = "EQUAL", *, prefix: bool = False
            ) -> dict[str, Any]:
    """A ``Compare`` on ``target`` (``MOD``, ``CREATE``, ``VERSION``, ``VALUE``, ``LEASE``) of ``key``, or with
    ``prefix`` of every key under it (rpc.proto ``Compare.range_end``, etcd 3.3+: true when it holds for each key)."""
    field = {"MOD": "mod_revision", "CREATE": "create_revision", "VERSION": "version", "VALUE": "value",
             "LEASE": "lease"}[target]
    body = {"key": b64(key), "target": target, "result": result,
            field: b64(value) if isinstance(value, bytes) else str(int(value))}
    if prefix:
        body["range_end"] = b64(prefix_end(key))
    return body


class EtcdV3Client:
    """HTTP(S) to one etcd endpoint; ``host`` is also the name its certificate is checked against."""

    def __init__(self, host: str, port: int, *, read_timeout: float, context: ssl.SSLContext | None) -> None:
        self.host, self.port, self.read_timeout, self.context = host, port, read_timeout, context
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[tuple[threading.Thread, http.client.HTTPConnection]] = []
        self._closed = False

    def __repr__(self) -> str:
        return f"EtcdV3Client({'https' if self.context else 'http'}://{self.host}:{self.port})"

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        if self.context is not None:
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.read_timeout, context=self.context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.read_timeout)
        with self._lock:
            if self._closed:
                raise EtcdConnectionError(f"{self!r} is closed")
            # torch starts a new keep-alive thread every round: close the connections of threads that ended.
            ended = [c for t, c in self._open if not t.is_alive()]
            self._open = [(t, c) for t, c in self._open if t.is_alive()]
            self._open.append((threading.current_thread(), conn))
        for old in ended:
            old.close()
        self._local.conn = conn
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            self._open = [(t, c) for t, c in self._open if c is not conn]

    def close(self) -> None:
        """Close every connection of every thread (the Retrier drops a client after a connection failure)."""
        with self._lock:
            self._closed = True
            conns, self._open = self._open, []
        for _, conn in conns:
            conn.close()

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>``; the response object, EtcdAnswerError for etcd's error answers,
        EtcdConnectionError when the store did not answer."""
        payload = json.dumps(body, separators=(",", ":")).encode()
        for _ in range(2):
            conn, reused = self._connection()
            try:
                conn.request("POST", f"/v3/{path}", payload, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read(MAX_RESPONSE_BYTES + 1)
                status = response.status
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self._drop(conn)
                if reused:
                    continue  # the server closed the idle connection before reading this request: once more, now
                raise EtcdConnectionError(f"etcd {path}: {type(e).__name__}: {e}") from e
            except (OSError, http.client.HTTPException) as e:  # refused, timed out, TLS, garbled
                self._drop(conn)
                raise EtcdConnectionError(f"etcd {path}: {type(e).__name__}: {e}") from e
            if response.will_close:
                self._drop(conn)
            break
        if len(data) > MAX_RESPONSE_BYTES:
            self._drop(conn)
            raise EtcdError(f"etcd {path}: response larger than {MAX_RESPONSE_BYTES} bytes")
        try:
            parsed = json.loads(data.decode())
        except (UnicodeDecodeError, ValueError):
            parsed = None
        if status != 200:
            if isinstance(parsed, dict) and "code" in parsed:
                raise EtcdAnswerError(as_int(parsed.get("code")), str(parsed.get("message") or parsed.get("error")),
                                      status)
            if status in (502, 503, 504):  # a proxy in front of a store that is not there
                raise EtcdConnectionError(f"etcd {path}: http {status}")
            raise EtcdError(f"etcd {path}: http {status}: {data[:200]!r}")
        if not isinstance(parsed, dict):
            raise EtcdError(f"etcd {path}: not a JSON object: {data[:200]!r}")
        return parsed

    # -- KV -------------------------------------------------------------------------------------------------------

    def get(self, key: bytes) -> KeyValue | None:
        found = kvs_of(self.call("kv/range", {"key": b64(key)}))
        return found[0] if found else None

    def get_prefix(self, prefix: bytes, *, keys_only: bool = False) -> list[KeyValue]:
        return kvs_of(self.call("kv/range", op_range(prefix, prefix=True, keys_only=keys_only)["request_range"]))

    def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Write ``key``; returns the store's revision after the write."""
        response = self.call("kv/put", op_put(key, value, lease=lease)["request_put"])
        return as_int(response.get("header", {}).get("revision"))

    def delete(self, key: bytes, *, range_end: bytes | None = None) -> int:
        """Delete ``key`` (or ``[key, range_end)``); returns how many keys were deleted."""
        return as_int(self.call("kv/deleterange", op_delete(key, range_end=range_end)["request_delete_range"])
                      .get("deleted"))

    def txn(self, compares: Iterable[dict[str, Any]], success: Iterable[dict[str, Any]],
            failure: Iterable[dict[str, Any]] = ()) -> tuple[bool, list[dict[str, Any]]]:
        """One transaction: ``(succeeded, responses)``, each response the ``response_*`` object of its request."""
        response = self.call("kv/txn", {"compare": list(compares), "success": list(success),
                                        "failure": list(failure)})
        ops = response.get("responses", [])
        if not isinstance(ops, list):
            raise EtcdError("etcd txn response: responses is not a list")
        out = []
        for op in ops:
            if not isinstance(op, dict) or len(op) != 1:
                raise EtcdError(f"etcd txn response: got {op!r}; expected one response_* object")
            (inner,) = op.values()
            out.append(inner if isinstance(inner, dict) else {})
        return bool(response.get("succeeded", False)), out

    def get_many(self, keys: list[bytes]) -> list[KeyValue | None]:
        """Several keys read at one revision (one request)."""
        if not keys:
            return []
        _, responses = self.txn([], [op_range(k) for k in keys])
        out: list[KeyValue | None] = []
        for r in responses:
            found = kvs_of(r)
            out.append(found[0] if found else None)
        if len(out) != len(keys):
            raise EtcdError(f"etcd txn response: {len(out)} answers for {len(keys)} reads")
        return out

    # -- leases ---------------------------------------------------------------------------------------------------

    def lease_grant(self, ttl_s: int) -> int:
        response = self.call("lease/grant", {"TTL": str(int(ttl_s))})
        if response.get("error"):
            raise EtcdAnswerError(0, str(response["error"]), 200)
        lease = as_int(response.get("ID"))
        if lease <= 0:
            raise EtcdError(f"etcd lease/grant: got ID {response.get('ID')!r}")
        return lease

    def lease_keepalive(self, lease: int) -> int:
        """Renew ``lease``; returns its TTL in seconds, 0 when it no longer exists. (A stream in gRPC; through the
        gateway one request is answered by one ``{"result": ...}`` before the request body ends the stream.)"""
        response = self.call("lease/keepalive", {"ID": str(lease)})
        if isinstance(response.get("error"), dict):  # a stream's error (grpc-gateway: {"error": {"grpc_code": ...}})
            err = response["error"]
            raise EtcdAnswerError(as_int(err.get("grpc_code")), str(err.get("message")), as_int(err.get("http_code")))
        result = response.get("result", response)
        return as_int(result.get("TTL")) if isinstance(result, dict) else 0

    def lease_revoke(self, lease: int) -> None:
        try:
            self.call("lease/revoke", {"ID": str(lease)})
        except EtcdAnswerError as e:
            if e.code != 5:  # NOT_FOUND: gone already
                raise
