"""Pointing the trainer's fences at a real etcd, as the launcher does for its workers (eks_ddp_runtime/fence_store.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from eks_ddp_runtime import fence_store


def use_store(monkeypatch, endpoint, read_timeout: float = 2.0) -> str:
    """Set :data:`fence_store.FENCE_STORE_ENV` for ``endpoint`` (a store from training/eks_ddp_local/etcd_server.py,
    its client files in ``.tls``) under a fresh rendezvous id, which is returned: each call gets its own keys."""
    tls = endpoint.tls
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(fence_store.FENCE_STORE_ENV, fence_store.config_for(
        str(endpoint), run_id, {"protocol": "https", "ca_cert": str(tls.ca_cert), "ssl_cert": str(tls.client_cert),
                                "ssl_cert_key": str(tls.client_key), "read_timeout": read_timeout}, 600.0))
    return run_id


@pytest.fixture
def closed_stores() -> Iterator[None]:
    """Close the store clients the trainer's checkpoint module opened during a test."""
    yield
    from eks_ddp_trainer import checkpoint as ckpt

    stores = getattr(ckpt, "_stores", {})
    for store in stores.values():
        if store is not None:
            store.close()
    stores.clear()


def store_records(endpoint, rdzv_id: str) -> dict[int, dict]:
    """The fence records the run ``rdzv_id`` keeps in the store at ``endpoint``, by generation."""
    store = fence_store.FenceStore(*str(endpoint).rsplit(":", 1)[:1], int(str(endpoint).rsplit(":", 1)[1]),
                                   run_id=rdzv_id, context=endpoint.tls.client_context(), read_timeout=5.0,
                                   retry_timeout_s=10.0)
    try:
        return store.records(10.0)
    finally:
        store.close()


def wipe_keys() -> None:
    """Delete the current run's fence keys (the store the trainer's checkpoint module uses now): the next order of
    an enumeration starts on an empty store without a new connection."""
    from eks_ddp_runtime.rendezvous.etcd_client import prefix_end
    from eks_ddp_trainer import checkpoint as ckpt

    store = ckpt._store()
    assert store is not None
    prefix = store.prefix.encode()
    store._call("reset", lambda c: c.delete(prefix, range_end=prefix_end(prefix)), 5.0)
