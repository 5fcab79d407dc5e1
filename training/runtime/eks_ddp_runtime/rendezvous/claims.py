"""Each agent's membership claim, written on its own heartbeat key, and the state every agent reads: the core merged
with the claims.

torch's dynamic rendezvous changes one shared state by compare-and-set (``dynamic_rendezvous.py``
``_BackendRendezvousStateHolder.sync``): when N agents re-form, each of them joins, leaves or waits by rewriting the
whole state, and every write another agent landed first makes its attempt fail and start again. That is about N^2
attempts for one re-form, each a raft proposal carrying the whole state (review of 2026-12-07: 5,498 proposals and
27 MB of WAL for one lost agent of 64; no re-form in 300 s at 128).

Here an agent's own moves (join a forming round, wait for the next one, stand by as redundant, leave) are a
:class:`Claim` written on the agent's heartbeat key (``<prefix>-heartbeat/<run-id>/<node>``, on its own lease): a
put of ~70 bytes that no other agent's write can make fail. The state torch's holder reads is :func:`merge` of the
core (the one state key) and the claims of the live keys, the same function in every agent, so all agents that read
the same revision see the same state. Only the moves that are not one agent's own go through compare-and-set on the
core: closing a round (ranks assigned), closing the rendezvous, and anything :func:`merge` cannot reproduce (the
backend falls back to the compare-and-set whenever the merged result is not exactly what torch asked for). A re-form
is then ~2 claims per agent and one write of the core: O(N) store work (tests/runtime/test_rendezvous_reform.py).

Rules of :func:`merge` (``r`` is the core's round; a claim is ``(round, role, deadline)``, the agent's latest move):

* nodes without a live heartbeat key are in no list (their lease expired: what torch's ``_sanitize`` drops);
* a complete round keeps the core's participants and their ranks, less those whose claim left it (``gone`` at
  ``r``, or any claim for a later round); when none is left the round is over: round ``r + 1``, forming (torch's
  ``_remove_participant_epilogue``);
* a forming round ``r``'s participants are the core's (when the core is that forming round) and every ``participant``
  claim for ``r``, less those whose claim moved on; its deadline, while at least ``min_nodes`` take part, is the
  latest an arrival asked for (each arrival asks for its own time plus its last call): the round closes one last call
  after the last arrival, torch's rule for every round but the first one, with no clock but the arrivals' own; once
  ``max_nodes`` take part the deadline is past (torch closes such a round at once);
* ``waiting`` and ``redundant`` claims put a node on ``wait_list`` / ``redundancy_list``; any other claim takes it off
  (a node without a claim keeps what the core says).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

ROLES = ("participant", "waiting", "redundant", "gone")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)  # noqa: UP017  (Python 3.10: make test-compat)
MAX_CLAIM_BYTES = 256


@dataclass(frozen=True)
class Claim:
    round: int
    role: str
    deadline: datetime | None = None

    def encode(self) -> bytes:
        doc = {"r": self.round, "role": self.role,
               "d": None if self.deadline is None else self.deadline.astimezone(timezone.utc).isoformat()}  # noqa: UP017
        return json.dumps(doc, separators=(",", ":")).encode()


def decode(value: bytes) -> Claim | None:
    """The claim stored on a heartbeat key; None for an empty value (a key written before any move) and for anything
    that is not a claim this module writes (it then counts as no claim: the core decides for that node)."""
    if not value or len(value) > MAX_CLAIM_BYTES:
        return None
    try:
        doc = json.loads(value.decode("utf-8"))
        rnd, role, d = doc["r"], doc["role"], doc["d"]
        if type(rnd) is not int or not 0 <= rnd <= 2**53 or role not in ROLES or set(doc) != {"r", "role", "d"}:
            return None
        deadline = None
        if d is not None:
            deadline = datetime.fromisoformat(d)
            if deadline.tzinfo is None:
                return None
        return Claim(rnd, role, deadline)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _left(claim: Claim | None, rnd: int) -> bool:
    return claim is not None and (claim.round > rnd or (claim.round == rnd and claim.role != "participant"))


def merge(core: Any, claims: dict[Any, Claim], live: set[Any], min_nodes: int, max_nodes: int = 2**31) -> Any:
    """The state every agent reads: ``core`` (a torch ``_RendezvousState``, not changed) with the ``claims`` of the
    live nodes applied; ``live`` the nodes whose heartbeat key exists. Heartbeat times are left to the caller (every
    listed node gets an entry)."""
    s = copy.deepcopy(core)
    claims = {n: c for n, c in claims.items() if n in live}
    s.participants = {n: rank for n, rank in s.participants.items() if n in live}
    if s.complete:
        s.participants = {n: rank for n, rank in s.participants.items() if not _left(claims.get(n), s.round)}
        if not s.participants:
            s.complete, s.round, s.deadline = False, s.round + 1, None
            s.participants = {}
    if not s.complete:
        rnd = s.round
        s.participants = {n: 0 for n in s.participants if not _left(claims.get(n), rnd)}
        asked = [s.deadline] if s.deadline is not None else []
        for n, c in sorted(claims.items(), key=lambda item: _key(item[0])):
            if c.round == rnd and c.role == "participant":
                s.participants[n] = 0
                if c.deadline is not None:
                    asked.append(c.deadline)
        s.deadline = max(asked) if asked and len(s.participants) >= min_nodes else None
        if len(s.participants) >= max_nodes:
            s.deadline = EPOCH  # torch closes a round the moment max_nodes take part (_add_to_participants)
    in_round = set(s.participants)
    s.wait_list = {n for n in s.wait_list if n in live and n not in claims and n not in in_round}
    s.wait_list |= {n for n, c in claims.items() if c.role == "waiting" and n not in in_round}
    s.redundancy_list = {n for n in s.redundancy_list if n in live and n not in claims and n not in in_round}
    s.redundancy_list |= {n for n, c in claims.items() if c.role == "redundant" and n not in in_round}
    listed = in_round | s.wait_list | s.redundancy_list
    s.last_heartbeats = {n: s.last_heartbeats.get(n, EPOCH) for n in sorted(listed, key=_key)}
    return s


def _key(node: Any) -> tuple[str, int, int]:
    return (node.addr, node.pid, node.local_id)


def now() -> datetime:
    return datetime.now(timezone.utc)  # noqa: UP017  (Python 3.10: make test-compat)


__all__ = ["ROLES", "Claim", "decode", "merge"]
