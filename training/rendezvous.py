"""The ``eks-etcd`` rendezvous backend: torch's etcd-v2 rendezvous, made to survive its store restarting.

torch's ``etcd-v2`` backend turns any failed etcd call into ``RendezvousConnectionError``, and the agent's
monitor loop (``num_nodes_waiting()`` about once a second) does not catch it: a 1-3 s etcd restart makes
every agent exit while its workers are healthy. This backend is the same state machine
(``DynamicRendezvousHandler``) over the same etcd keys, with three changes:

* every etcd call is retried with backoff on a fresh client for up to ``store_retry_timeout`` seconds
  (rdzv-conf, default 60), so an etcd outage shorter than that only delays the agent;
* ``shutdown()`` closes the rendezvous only once the launcher has seen the run finish
  (:func:`allow_close`); torch closes it for good whenever an agent gives up, after which every
  replacement pod fails with ``RendezvousClosedError``;
* the first round of a run waits up to ``first_round_timeout`` seconds (rdzv-conf, default 300) for all
  ``max_nodes`` agents, so a job does not start at world 1 and restart when the second node has pulled
  its image; later rounds use the short ``last_call_timeout`` so a lost node costs seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousTimeout,
    Token,
    create_handler,
)
from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore

BACKEND = "eks-etcd"
"""The name agents pass as ``--rdzv-backend``."""
DEFAULT_STORE_RETRY_S = 60.0
DEFAULT_FIRST_ROUND_S = 300.0
KEY_PREFIX = "/torch/elastic/rendezvous"
STORE_PREFIX = "/torch/elastic/store"

log = logging.getLogger(__name__)
T = TypeVar("T")


def _is_connection_error(exc: BaseException) -> bool:
    import etcd
    import urllib3.exceptions

    return isinstance(exc, (RendezvousConnectionError, etcd.EtcdConnectionFailed, urllib3.exceptions.HTTPError,
                            ConnectionError, TimeoutError))


class _Retrier:
    """Calls ``fn(client)`` until it succeeds, building a fresh etcd client after each connection error.

    python-etcd drops a server from its cache on a failed request and, with one member, then has none
    left: the old client never recovers, so each retry starts from a new one.
    """

    def __init__(self, params: RendezvousParameters, timeout_s: float) -> None:
        self.params, self.timeout_s = params, timeout_s
        self._client = None

    def client(self):
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import _create_etcd_client

        if self._client is None:
            self._client = _create_etcd_client(self.params)
        return self._client

    def __call__(self, what: str, fn: Callable[[Any], T]) -> T:
        deadline = time.monotonic() + self.timeout_s
        delay, attempt = 0.1, 0
        while True:
            try:
                return fn(self.client())
            except Exception as e:
                if not _is_connection_error(e) or time.monotonic() + delay > deadline:
                    raise
                attempt += 1
                if attempt == 1 or attempt % 10 == 0:
                    log.warning("etcd %s failed (%s: %s); retrying for up to %.0f s", what, type(e).__name__, e,
                                max(0.0, deadline - time.monotonic()))
                self._client = None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)


class RetryingEtcdBackend(RendezvousBackend):
    """torch's EtcdRendezvousBackend (same keys and TTL), each call retried through :class:`_Retrier`."""

    def __init__(self, retry: _Retrier, run_id: str) -> None:
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import EtcdRendezvousBackend

        self._retry, self._run_id = retry, run_id
        self._make = lambda client: EtcdRendezvousBackend(client, run_id, key_prefix=KEY_PREFIX)

    @property
    def name(self) -> str:
        return BACKEND

    def get_state(self) -> tuple[bytes, Token] | None:
        return self._retry("get_state", lambda c: self._make(c).get_state())

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        # A compare-and-set whose reply was lost is retried with the same token: it then fails the
        # comparison and returns the current state, which the handler re-reads; no update is applied twice.
        return self._retry("set_state", lambda c: self._make(c).set_state(state, token))


class RetryingEtcdStore(EtcdStore):
    """The agents' key-value store (rank assignment, exit barrier) with the same retries."""

    def __init__(self, retry: _Retrier) -> None:
        super().__init__(retry.client(), STORE_PREFIX)
        self._retry = retry

    def _call(self, name: str, *args: Any) -> Any:
        def call(client):
            self.client = client
            return getattr(EtcdStore, name)(self, *args)
        return self._retry(f"store.{name}", call)

    def set(self, key, value):
        return self._call("set", key, value)

    def get(self, key) -> bytes:
        return self._call("get", key)

    def add(self, key, num: int) -> int:
        return self._call("add", key, num)

    def wait(self, keys, override_timeout=None):
        return self._call("wait", keys, override_timeout)

    def check(self, keys) -> bool:
        return self._call("check", keys)


class ElasticHandler(DynamicRendezvousHandler):
    """DynamicRendezvousHandler that keeps the rendezvous open after a failure and waits longer in round 0."""

    close_allowed = False
    first_round_s = DEFAULT_FIRST_ROUND_S

    def next_rendezvous(self):
        with self._heartbeat_lock:
            self._state_holder.sync()
            state = self._state_holder.state
        executor = self._op_executor
        short = executor._settings
        if state.round == 0 and not state.complete and not state.closed:
            t = short.timeout
            long = RendezvousTimeout(t.join, timedelta(seconds=self.first_round_s), t.close, t.heartbeat)
            executor._settings = dataclasses.replace(short, timeout=long)
        try:
            return super().next_rendezvous()
        finally:
            executor._settings = short

    def shutdown(self) -> bool:
        if not ElasticHandler.close_allowed:
            # Stop heart-beating only: peers drop this node after the keep-alive window and carry on.
            self._stop_heartbeats()
            return True
        return super().shutdown()


def allow_close() -> None:
    """Called by the launcher once this agent's workers finished the run: the next shutdown() closes it."""
    ElasticHandler.close_allowed = True


def _create(params: RendezvousParameters) -> ElasticHandler:
    retry = _Retrier(params, float(params.config.pop("store_retry_timeout", DEFAULT_STORE_RETRY_S)))
    first_round_s = float(params.config.pop("first_round_timeout", DEFAULT_FIRST_ROUND_S))
    backend = RetryingEtcdBackend(retry, params.run_id)
    store = RetryingEtcdStore(retry)
    handler = create_handler(store, backend, params)
    handler.__class__ = ElasticHandler  # same object layout; only the overridden methods differ
    handler.first_round_s = first_round_s
    return handler


def register() -> None:
    """Register the ``eks-etcd`` backend with torch's rendezvous registry (idempotent)."""
    try:
        rdzv_registry.handler_registry.register(BACKEND, _create)
    except ValueError:  # already registered in this process
        pass
