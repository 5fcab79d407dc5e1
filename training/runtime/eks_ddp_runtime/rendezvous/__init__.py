"""The agents' rendezvous, named as torch names its own (``torch.distributed.elastic.rendezvous``).

* ``handler.py`` — the ``eks-etcd`` backend's handler: torch's dynamic rendezvous with the changes that let it ride
  out store outages and never form two worlds (its docstring is the concept doc);
* ``etcd_backend.py`` — the etcd side torch calls a rendezvous backend and a store: the state key, retries,
  idempotent adds, the store keys that go with the state;
* ``state.py`` — the state as checked JSON (nothing is unpickled from the store);
* ``etcd_client.py`` — the standard library's HTTP client for etcd's v3 JSON API.
"""

from .handler import BACKEND, KEY_PREFIX, STORE_PREFIX, ElasticHandler, allow_close, register

__all__ = ["BACKEND", "KEY_PREFIX", "STORE_PREFIX", "ElasticHandler", "allow_close", "register"]
