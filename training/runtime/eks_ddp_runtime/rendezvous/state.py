"""The rendezvous state as the store holds it: JSON, checked field by field, never a pickle.

torch's ``_BackendRendezvousStateHolder`` (elastic/rendezvous/dynamic_rendezvous.py, ``sync``) exchanges the state
with its backend as ``pickle.dumps(state)`` and ``pickle.loads`` whatever ``get_state`` returns: with torch's own
backends, whoever can write the store runs code in every agent. Here the store holds :func:`to_json` of the state,
and ``get_state`` returns ``pickle.dumps`` of a ``_RendezvousState`` built *here* by :func:`from_json` from checked
fields (types, ranges, sizes), so the only bytes torch unpickles are bytes this process pickled. A value that does
not pass (a pickle, garbage, a field out of range, an unknown field) raises :class:`StateError`; the backend
treats it as a wiped state (rendezvous/etcd_backend.py).

The bytes torch hands to ``set_state`` (its own ``pickle.dumps`` in this process) are read back with
:func:`state_from_pickle`, an unpickler that knows only the state's own classes (``_RendezvousState``,
``_NodeDesc``, ``datetime``, ``timezone``, ``timedelta``), and then checked like anything read from the store.
"""

from __future__ import annotations

import io
import json
import pickle
from datetime import datetime, timezone
from typing import Any

SCHEMA = 1
"""Version of the JSON layout (``"schema"``); another version is refused like any malformed value."""
MAX_NODES = 4096
"""Most nodes in ``participants``, ``wait_list`` and ``redundancy_list`` each (``last_heartbeats``: three times).
At that size the JSON is ~1.2 MB, inside etcd's default request limit (1.5 MiB)."""
MAX_STATE_BYTES = 2 << 20
"""A stored value larger than this is refused before it is parsed."""
MAX_ADDR = 255
"""Longest node address (a DNS name is at most 253 characters)."""
MAX_INT = 2**53
"""Largest round, pid, local id or rank accepted (the range JSON numbers carry exactly)."""
_FIELDS = ("round", "complete", "deadline", "closed", "participants", "wait_list", "redundancy_list",
           "last_heartbeats")
_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_ALLOWED = {(_MODULE, "_RendezvousState"), (_MODULE, "_NodeDesc"), ("datetime", "datetime"),
            ("datetime", "timezone"), ("datetime", "timedelta"), ("builtins", "set"), ("builtins", "frozenset")}


class StateError(ValueError):
    """A rendezvous state that is not one this module writes."""


def _torch():
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    return dynamic_rendezvous


# -- the state -> JSON ---------------------------------------------------------------------------------------------


def _node_out(node: Any) -> list[Any]:
    if type(node) is not _torch()._NodeDesc:
        raise StateError(f"rendezvous state: a node is {type(node).__name__}; expected _NodeDesc")
    return [_addr(node.addr), _int(node.pid, "pid"), _int(node.local_id, "local_id")]


def _time_out(value: Any, what: str) -> str:
    if type(value) is not datetime or value.tzinfo is None:
        raise StateError(f"rendezvous state {what}: got {value!r}; expected a datetime with a time zone")
    return value.astimezone(timezone.utc).isoformat()  # noqa: UP017  (Python 3.10: make test-compat)


def to_json(state: Any) -> bytes:
    """The store's value for ``state`` (a torch ``_RendezvousState``); StateError when it holds anything else."""
    dr = _torch()
    if type(state) is not dr._RendezvousState:
        raise StateError(f"rendezvous state: got {type(state).__name__}; expected _RendezvousState")
    fields = set(vars(state))
    if fields != set(_FIELDS):
        raise StateError(f"rendezvous state fields: got {sorted(fields)}; expected {sorted(_FIELDS)} (torch's "
                         "_RendezvousState changed: see eks_ddp_runtime/compat.py for the supported torch)")
    for name, limit in (("participants", MAX_NODES), ("wait_list", MAX_NODES), ("redundancy_list", MAX_NODES),
                        ("last_heartbeats", 3 * MAX_NODES)):
        if len(getattr(state, name)) > limit:
            raise StateError(f"rendezvous state {name}: {len(getattr(state, name))} nodes; at most {limit}")
    if type(state.participants) is not dict or type(state.last_heartbeats) is not dict:
        raise StateError("rendezvous state: participants and last_heartbeats must be dicts")
    if type(state.wait_list) is not set or type(state.redundancy_list) is not set:
        raise StateError("rendezvous state: wait_list and redundancy_list must be sets")
    doc = {
        "schema": SCHEMA,
        "round": _int(state.round, "round"),
        "complete": _bool(state.complete, "complete"),
        "deadline": None if state.deadline is None else _time_out(state.deadline, "deadline"),
        "closed": _bool(state.closed, "closed"),
        # Every list in one canonical order (by address, pid, local id): a set iterates in its process's hash order
        # (string hashes are randomized per process) and a dict in its insertion order, so two agents holding the
        # same state would write different bytes, and the backend's "only heartbeats changed" test, a byte
        # comparison with the core it read, would turn every keep-alive into a compare-and-set of the whole core.
        "participants": sorted([*_node_out(n), _int(rank, "rank")] for n, rank in state.participants.items()),
        "wait_list": sorted(_node_out(n) for n in state.wait_list),
        "redundancy_list": sorted(_node_out(n) for n in state.redundancy_list),
        "last_heartbeats": sorted([*_node_out(n), _time_out(t, "heartbeat")] for n, t in state.last_heartbeats.items()),
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


# -- JSON -> the state (everything checked) ------------------------------------------------------------------------


def _int(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_INT:
        raise StateError(f"rendezvous state {what}: got {value!r}; expected an integer 0..{MAX_INT}")
    return value


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise StateError(f"rendezvous state {what}: got {value!r}; expected true or false")
    return value


def _addr(value: Any) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_ADDR or not value.isprintable():
        raise StateError(f"rendezvous state node address: got {value!r:.80}; expected 1..{MAX_ADDR} printable "
                         "characters")
    return value


def _time_in(value: Any, what: str) -> datetime:
    if type(value) is not str or len(value) > 40:
        raise StateError(f"rendezvous state {what}: got {value!r:.80}; expected an ISO 8601 time")
    try:
        t = datetime.fromisoformat(value)
    except ValueError as e:
        raise StateError(f"rendezvous state {what}: got {value!r}; expected an ISO 8601 time ({e})") from e
    if t.tzinfo is None:
        raise StateError(f"rendezvous state {what}: got {value!r}; expected a time with its UTC offset")
    return t.astimezone(timezone.utc)  # noqa: UP017  (Python 3.10: make test-compat)


def _list(value: Any, what: str, limit: int) -> list[Any]:
    if type(value) is not list or len(value) > limit:
        raise StateError(f"rendezvous state {what}: expected a list of at most {limit} entries")
    return value


def _node_in(entry: Any, what: str, extra: int):
    if type(entry) is not list or len(entry) != 3 + extra:
        raise StateError(f"rendezvous state {what}: got {entry!r:.120}; expected [address, pid, local_id"
                         f"{', value' if extra else ''}]")
    return _torch()._NodeDesc(_addr(entry[0]), _int(entry[1], "pid"), _int(entry[2], "local_id"))


def _unique(nodes: list[Any], what: str) -> None:
    if len(set(nodes)) != len(nodes):
        raise StateError(f"rendezvous state {what}: a node is listed twice")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise StateError(f"rendezvous state: a field is given twice ({sorted(keys)})")
    return dict(pairs)


def _no_constants(name: str) -> Any:
    raise StateError(f"rendezvous state: {name} is not a number")


def from_json(data: bytes) -> Any:
    """A torch ``_RendezvousState`` built from a stored value; StateError unless every field checks out."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_STATE_BYTES:
        raise StateError(f"rendezvous state: expected at most {MAX_STATE_BYTES} bytes of JSON")
    try:
        doc = json.loads(bytes(data).decode("utf-8"), object_pairs_hook=_no_duplicate_keys,
                         parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, StateError):
            raise
        raise StateError(f"rendezvous state: not JSON ({type(e).__name__})") from e
    if type(doc) is not dict:
        raise StateError("rendezvous state: expected a JSON object")
    if set(doc) != {"schema", *_FIELDS}:
        raise StateError(f"rendezvous state fields: got {sorted(doc)[:12]}; expected {sorted(['schema', *_FIELDS])}")
    if doc["schema"] != SCHEMA or type(doc["schema"]) is not int:
        raise StateError(f"rendezvous state schema: got {doc['schema']!r}; expected {SCHEMA}")
    state = _torch()._RendezvousState()
    state.round = _int(doc["round"], "round")
    state.complete = _bool(doc["complete"], "complete")
    state.deadline = None if doc["deadline"] is None else _time_in(doc["deadline"], "deadline")
    state.closed = _bool(doc["closed"], "closed")
    participants = {}
    for entry in _list(doc["participants"], "participants", MAX_NODES):
        node = _node_in(entry, "participants", 1)
        if node in participants:
            raise StateError("rendezvous state participants: a node is listed twice")
        participants[node] = _int(entry[3], "rank")
    state.participants = participants
    for name in ("wait_list", "redundancy_list"):
        nodes = [_node_in(e, name, 0) for e in _list(doc[name], name, MAX_NODES)]
        _unique(nodes, name)
        setattr(state, name, set(nodes))
    heartbeats = {}
    for entry in _list(doc["last_heartbeats"], "last_heartbeats", 3 * MAX_NODES):
        node = _node_in(entry, "last_heartbeats", 1)
        if node in heartbeats:
            raise StateError("rendezvous state last_heartbeats: a node is listed twice")
        heartbeats[node] = _time_in(entry[3], "heartbeat")
    state.last_heartbeats = heartbeats
    return state


# -- what torch hands to set_state ---------------------------------------------------------------------------------


class _StateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"rendezvous state: {module}.{name} is not part of a rendezvous state")
        return super().find_class(module, name)


def state_from_pickle(bits: bytes) -> Any:
    """The ``_RendezvousState`` torch's state holder pickled for ``set_state``, read with an unpickler that
    resolves only the state's own classes, then checked (:func:`to_json` refuses anything else)."""
    if not isinstance(bits, (bytes, bytearray)):
        raise StateError(f"rendezvous state: got {type(bits).__name__}; expected the pickled _RendezvousState")
    try:
        state = _StateUnpickler(io.BytesIO(bits)).load()
    except Exception as e:  # noqa: BLE001  (any failure to read it is "not a state")
        raise StateError(f"rendezvous state: not a pickled _RendezvousState ({type(e).__name__}: {e})") from e
    to_json(state)  # every field checked
    return state


def encode(state: Any) -> tuple[bytes, bytes]:
    """``(json, bits)``: the store's value and the pickle torch's state holder reads, both of the checked state."""
    value = to_json(state)
    return value, pickle.dumps(from_json(value))


def decode(value: bytes) -> bytes:
    """The bits torch's state holder unpickles for a stored value: a pickle of a state built here."""
    return pickle.dumps(from_json(value))


__all__ = ["MAX_NODES", "SCHEMA", "StateError", "decode", "encode", "from_json", "state_from_pickle", "to_json"]
