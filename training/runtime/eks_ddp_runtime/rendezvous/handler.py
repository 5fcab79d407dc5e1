"""The ``eks-etcd`` rendezvous backend: torch's dynamic rendezvous on etcd's v3 API, as soft state that heals.

torch 2.14.1's ``DynamicRendezvousHandler`` keeps one ``_RendezvousState`` per run and changes it only by
compare-and-set. Left alone it assumes the store never has a bad day: any failed call raises
``RendezvousConnectionError`` out of the agent's monitor loop (the agent exits although its workers need no
store), and after an outage or an empty restart the agents drop out of the state for good (review K2). This
backend is the same state machine over one etcd v3 key per run (``/torch/elastic/rendezvous/<run-id>``), with
these changes (``rendezvous/etcd_backend.py`` holds the etcd side: the v3 client, JSON state, retries, idempotent adds, store
keys that go with the state):

**No agent exits because the store is away** (``store_retry_timeout``, default 600 s). Calls a round
needs (``next_rendezvous``, the exit barrier, rank assignment) retry connection failures on a fresh
client for that long. The two background callers never block: the keep-alive thread (torch already
swallows its ``RendezvousError``) and ``num_nodes_waiting()``, which the agent's monitor loop calls about
every second while the workers are healthy (``agent/server/api.py`` ``_invoke_run``). Here it answers 0
("nobody waiting": keep training) while the store is unreachable, and only after ``store_retry_timeout``
of continuous failure does it raise. A compare-and-set on a key that vanished is an answer, not an
outage: it returns "not set" at once and the handler re-reads.

**Every live agent is a participant again after any outage or wipe.** Two torch internals make agents
leave for good: ``_BackendRendezvousStateHolder._sanitize`` deletes every node whose heartbeat is older
than ``keep_alive_interval * keep_alive_max_attempt`` (4 s) from ``participants``/``last_heartbeats``,
and ``_should_keep_alive`` stops a node's heartbeats once it is missing from ``last_heartbeats``. After an
outage every heartbeat is old (none could be written), so the first agent back deleted them all,
itself included. Two rules fix this:

1. *No blame for an outage.* The state holder skips ``_sanitize`` while its own store calls failed
   within the last expiry window plus one interval: heartbeats that could not be written prove nothing.
   Every live agent's keep-alive lands within one interval once the store answers, so a store that
   comes back with its data costs no restart at all. A node that really died meanwhile is dropped one
   window later (and its peers' collectives have failed already: watchdog.py).
2. *Absent means re-join.* ``num_nodes_waiting()`` returns 1 when this agent has completed a round and,
   after a successful sync, is no longer in ``participants`` (the store came back empty, or dropped it
   after a partial partition). The agent then restarts its workers (``_restart_workers``: a membership
   change, not counted against ``--max-restarts``) and ``next_rendezvous`` joins the next round. The
   long first-round wait (``first_round_timeout``, for image pulls) applies only to an agent that never
   completed a round, so survivors re-form with the short ``last_call_timeout``.

**A re-form costs the store O(N)** (claims.py): an agent's own move (join, wait, stand by, leave) is a claim on its
own heartbeat key, which no other agent's write can make fail; every agent reads the core merged with the claims,
and only closing a round writes the core, once. torch's compare-and-set of the whole state for every move cost about
N^2 attempts per re-form.

**Heartbeats cost the store no write** (etcd_backend.py, its ``REQUEST_PATTERN`` table). torch writes every
agent's heartbeat into the one state every ``keep_alive_interval``: N writes per second of a value that holds N
agents, O(N^2) bytes for the store and compare-and-set contention on one key. Here each agent's heartbeat is a key
of its own on an etcd lease whose TTL is the drop window (``keep_alive_interval * keep_alive_max_attempt``); a
heartbeat renews the lease (no raft entry, nothing written), and the state key holds only the *core* (the state
with its heartbeat times at the epoch), written on membership changes only. torch's holder sees each node's time
as: its own, when its last renewal was sent; a peer's, now while its key exists and the epoch once it is gone, so
torch's ``_sanitize`` drops exactly the nodes whose lease expired.

**Why no interleaving leaves two worlds training.** A world exists only while its round is the
``complete`` round in the one state key; every change goes through compare-and-set on that key, so
all agents see one sequence of rounds. Workers of an agent run only for the round it joined. Take any
agent A whose workers run in round r while the key no longer lists A in round r (wiped, or A dropped):
A's next monitor tick (``--monitor-interval`` 0.5 s + the ``SYNC_POLL_S`` sync cache) sees that and stops A's
workers before A joins anything. A newcomer C that finds the key empty starts round 0 and waits
``first_round_timeout`` (never completed a round) unless ``max_nodes`` join earlier; A re-joins within
those ~2 s, so C's round completes with A, not without it. A newcomer that finds A's round complete
puts itself on ``wait_list``, which A's ``num_nodes_waiting()`` reports, and A restarts into the next
round with C (torch's own scale-up path). The one case left to torch is a node cut off from the store
but not from its peers for longer than the expiry window: the others drop it (as torch does), and it
rejoins the moment it reaches the store again. Meanwhile its workers may go on training, a second world,
but they commit nothing: every state synced here renews or withdraws the agent's lease (fence.py), which
ends before any peer can drop the node, and the workers check it before each commit. A peer drops a node only by a
compare-and-set that also requires the node's heartbeat key to be absent, and that key lives at least the drop
window after the node's last successful renewal was sent (etcd 3.5 refuses to renew a lease that expired:
``lessor.Renew`` answers "lease not found" once it is revoked), so the lease the agent gives its workers, that
send time plus the window less one interval, ends before any drop can land, whatever the node clocks say.

**The store is authenticated, and what it holds is data.** The client speaks HTTPS with a client certificate,
and the server (components/eks_ddp/workloads/etcd.py, training/eks_ddp_local/etcd_server.py) requires one (``--client-cert-auth``). The state is
stored as JSON and checked field by field before torch's state holder sees it (rendezvous/state.py): torch unpickles
only bytes this agent pickled, so a writer of the key can disturb the rendezvous but never run code in an agent.

**Re-forming converges** (``_ConvergingOpExecutor``): every arrival after ``min_nodes`` re-opens the last call, so
agents arriving within ``last_call_timeout`` of one another form one round instead of a small world and a restart.

**Rounds form in a fraction of a second.** torch's op executor reads the state once a second while a round
forms (``_delay(seconds=1)`` on ``SYNC``, behind a 1 s state cache), so every restart waited up to a second
after the last agent had joined. Here both are ``SYNC_POLL_S``: a GET of one small key per agent every
quarter second while a round forms, and at most one per monitor tick otherwise.

Also kept from before: ``shutdown()`` closes the rendezvous only once the launcher has seen the run
finish (:func:`allow_close`); otherwise an agent that gave up would close it for every replacement pod.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _dynamic
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
    _BackendRendezvousStateHolder,
    _DistributedRendezvousOpExecutor,
    create_handler,
)

from .. import compat, fence
from .etcd_backend import KEY_PREFIX, STORE_PREFIX, EtcdV3Backend, EtcdV3Store, Retrier, client_settings

__all__ = ["BACKEND", "KEY_PREFIX", "STORE_PREFIX", "ElasticHandler", "allow_close", "register"]

BACKEND = "eks-etcd"
"""The name agents pass as ``--rdzv-backend``."""
DEFAULT_STORE_RETRY_S = 600.0
"""Seconds of continuous store failure an agent rides out before it gives up (rdzv-conf store_retry_timeout)."""
DEFAULT_FIRST_ROUND_S = 300.0
SYNC_POLL_S = 0.25
"""Seconds between an agent's reads of the rendezvous state while a round forms, and the state cache's age
(torch: 1 s each). Costs a few small GETs per agent per second, only while a round forms."""
TORCH_SYNC_DELAY_S = 1
"""What torch's ``_DistributedRendezvousOpExecutor.run`` passes to ``_delay`` on ``SYNC`` (tests keep it true)."""
_torch_delay = _dynamic._delay

log = logging.getLogger(__name__)


class _HealingStateHolder(_BackendRendezvousStateHolder):
    """torch's state holder that does not drop nodes for heartbeats the store could not take, and that shows
    every state it synced to the agent's lease (fence.py)."""

    retry: Retrier
    lease: fence.Lease | None = None
    node = None

    def sync(self):
        has_set = super().sync()  # raises when the store did not answer: only a state the store held gets here
        if self.lease is not None:
            self.lease.seen(self.node, self._state)
        return has_set

    def _sanitize(self) -> None:
        s = self._settings
        grace = (s.keep_alive_interval * (s.keep_alive_max_attempt + 1)).total_seconds()
        if time.monotonic() - self.retry.last_failure < grace:
            self._dead_nodes: list[Any] = []
            return
        # This agent judges itself by etcd's answers to its lease renewals (EtcdV3Backend.alive), not by the age of
        # its last renewal's send time, which a store that answers slowly makes look older than the window while the
        # key is there: torch would drop it from the state, and it would restart its workers. The time torch keeps
        # for it (what the fence's lease is computed from) is put back after torch's pass.
        heartbeats = self._state.last_heartbeats
        own = heartbeats.get(self.node) if self.node is not None else None
        backend = self._backend
        if own is not None and isinstance(backend, EtcdV3Backend) and backend.alive(self.node):
            heartbeats[self.node] = datetime.now(timezone.utc)  # noqa: UP017
            try:
                super()._sanitize()
            finally:
                if self.node in heartbeats:
                    heartbeats[self.node] = own
            return
        super()._sanitize()


class _ConvergingOpExecutor(_DistributedRendezvousOpExecutor):
    """torch's op executor whose last call re-opens at each arrival (outside the first round).

    torch sets a forming round's deadline once, ``last_call_timeout`` after ``min_nodes`` have joined: with a low
    minimum, a round closes with whoever arrived within that time, and every straggler then restarts the group
    into the next round (seen: 236 s of worlds of 3-5 agents for one lost agent of 12 on a loaded machine). Here
    every arrival after the minimum moves the deadline to ``last_call_timeout`` after it, so agents that arrive
    within ``last_call_timeout`` of one another form one round. The wait is bounded: at most
    ``(max_nodes - min_nodes) * last_call_timeout`` beyond torch's, and a round with ``max_nodes`` completes at once.
    The first round keeps torch's rule (it waits ``first_round_timeout`` for all ``max_nodes``).
    """

    converge = False
    """Set by the handler for every round but a first one."""

    def _add_to_participants(self) -> None:
        super()._add_to_participants()
        state, s = self._state, self._settings
        if self.converge and not state.complete and state.deadline is not None and \
                len(state.participants) > s.min_nodes:
            state.deadline = max(state.deadline, datetime.now(timezone.utc) + s.timeout.last_call)  # noqa: UP017


class ElasticHandler(DynamicRendezvousHandler):
    """DynamicRendezvousHandler that heals after store loss, rides out outages and keeps the run open."""

    close_allowed = False
    first_round_s = DEFAULT_FIRST_ROUND_S
    retry: Retrier
    joined = False
    """True once this agent completed a round: it is a survivor, never a first-round newcomer."""
    _outage_said = False
    _outage_checks = 0

    def next_rendezvous(self):
        with self._heartbeat_lock:
            self._state_holder.sync()
            state = self._state_holder.state
        executor = self._op_executor
        short = executor._settings
        first = not self.joined and state.round == 0 and not state.complete and not state.closed
        if first:
            t = short.timeout
            long = RendezvousTimeout(t.join, timedelta(seconds=self.first_round_s), t.close, t.heartbeat)
            executor._settings = dataclasses.replace(short, timeout=long)
        executor.converge = not first  # a _ConvergingOpExecutor (_create)
        backend = self._state_holder._backend
        if isinstance(backend, EtcdV3Backend):  # the last call this agent's arrival asks for (claims.py)
            backend.last_call_s = executor._settings.timeout.last_call.total_seconds()
        lease = self._state_holder.lease
        if lease is not None:
            lease.leaving()  # this node's workers are stopped: nothing of the last round commits any more
        try:
            info = super().next_rendezvous()
        finally:
            executor._settings = short
        self.joined = True
        if lease is not None:
            with self._heartbeat_lock:
                lease.joined(self._state_holder.state.round, self._this_node, self._state_holder.state)
        return info

    def _get_world(self) -> tuple[int, int]:
        """This node's rank and the world's size as the round was closed: the size is the count of participants in
        the core written when the round closed, the same for every agent, where torch takes the count in this agent's
        own view, which is smaller for an agent that read after a peer's lease lapsed (seen at 128 simulated agents
        on an overloaded machine: worlds of 125-128 in one round, and their rank assignment waited for ranks nobody
        had)."""
        backend = self._state_holder._backend
        if not isinstance(backend, EtcdV3Backend):
            return super()._get_world()
        closed = backend.closed_round(self._state_holder.state.round)
        if closed is not None and self._this_node in closed:
            # The core's ranks are the ones merged into this agent's view; the core still has them when its own lease
            # lapsed between the round's close and this read (torch's own read raised KeyError, seen at 128 agents).
            return closed[self._this_node], len(closed)
        return super()._get_world()

    def num_nodes_waiting(self) -> int:
        try:
            with self._heartbeat_lock, self.retry.impatient():
                self._state_holder.sync()
                state = self._state_holder.state
        except RendezvousConnectionError as e:
            outage = self.retry.outage_s()
            if outage > self.retry.timeout_s:
                log.error("the rendezvous store has not answered for %.0f s (store_retry_timeout=%.0f)",
                          outage, self.retry.timeout_s)
                raise
            if not self._outage_said:  # once per outage; its end is said with a summary
                self._outage_said, self._outage_checks = True, 0
                log.warning("rendezvous store unreachable for %.0f s (%s); workers keep training", outage, e)
            self._outage_checks += 1
            return 0
        if self._outage_said:
            self._outage_said = False
            log.warning("rendezvous store answers again (%d checks failed during the outage)", self._outage_checks)
        if self.joined and not state.closed and self._this_node not in state.participants:
            log.warning("this node is no longer a participant of the rendezvous (the store restarted empty, or "
                        "dropped it while unreachable): restarting its workers into a round with every live node")
            return 1
        return len(state.wait_list)

    def _keep_alive(self) -> None:
        with self.retry.impatient():
            super()._keep_alive()

    def shutdown(self) -> bool:
        backend = self._state_holder._backend
        if isinstance(backend, EtcdV3Backend):
            backend.stop_renewing()  # from here on this node's key lapses within its TTL, as the run expects
        if not ElasticHandler.close_allowed:
            # Stop heart-beating only: peers drop this node after the keep-alive window and carry on.
            self._stop_heartbeats()
            return True
        return super().shutdown()


def allow_close() -> None:
    """Called by the launcher once this agent's workers finished the run: the next shutdown() closes it."""
    ElasticHandler.close_allowed = True


def _create(params: RendezvousParameters, *, key_prefix: str = KEY_PREFIX, store=None) -> ElasticHandler:
    """The agent's handler (the registry calls it with ``params`` only); ``key_prefix`` and ``store`` let torch's
    own rendezvous test suite run it on its keys and its store (tests/runtime/test_rendezvous_torch_suite.py)."""
    client_settings(params)  # settings no retry can fix fail here, at start (RendezvousConfigError), not after 600 s
    retry = Retrier(params, float(params.config.pop("store_retry_timeout", DEFAULT_STORE_RETRY_S)))
    first_round_s = float(params.config.pop("first_round_timeout", DEFAULT_FIRST_ROUND_S))
    backend = EtcdV3Backend(retry, params.run_id, BACKEND, key_prefix=key_prefix)
    if store is None:
        store = EtcdV3Store(retry, backend, params.run_id)
    handler = create_handler(store, backend, params)
    compat.require(handler, "_state_holder", "_op_executor", "_heartbeat_lock", "_this_node", "_stop_heartbeats", "_get_world",
                   "_keep_alive", "_settings")
    compat.require(handler._state_holder, "_sanitize", "_settings", "_dead_nodes", "_cache_duration", "_backend",
                   "_state")
    compat.require(handler._op_executor, "_settings", "_add_to_participants")
    # Same object layouts; only the overridden methods differ.
    handler.__class__ = ElasticHandler
    handler._state_holder.__class__ = _HealingStateHolder
    handler._state_holder.retry = retry
    handler._state_holder.node = handler._this_node
    handler._op_executor.__class__ = _ConvergingOpExecutor
    lease = fence.agent_lease()
    if lease is not None:  # the launcher publishes a lease to its workers: valid for the drop window less one beat
        s = handler._settings
        lease.configure((s.keep_alive_interval * s.keep_alive_max_attempt).total_seconds(),
                        s.keep_alive_interval.total_seconds())
        handler._state_holder.lease = lease
    s = handler._settings
    # A node's heartbeat key lives as long as torch's drop window after its last renewal (etcd_backend.py).
    backend.heartbeat_ttl_s = (s.keep_alive_interval * s.keep_alive_max_attempt).total_seconds()
    backend.min_nodes, backend.max_nodes = s.min_nodes, s.max_nodes
    backend.last_call_s = s.timeout.last_call.total_seconds()
    handler.retry = retry
    handler.first_round_s = first_round_s
    handler._state_holder._cache_duration = SYNC_POLL_S
    backend.start_renewing()
    return handler


def _poll_delay(seconds) -> None:
    """torch's ``_delay`` with its one-second wait between reads of a forming round cut to ``SYNC_POLL_S``."""
    _torch_delay(seconds=SYNC_POLL_S if seconds == TORCH_SYNC_DELAY_S else seconds)


def register() -> None:
    """Register the ``eks-etcd`` backend with torch's rendezvous registry, and poll forming rounds every
    ``SYNC_POLL_S`` (idempotent)."""
    compat.require(_dynamic, "_delay")
    _dynamic._delay = _poll_delay
    try:
        rdzv_registry.handler_registry.register(BACKEND, _create)
    except ValueError:  # already registered in this process
        pass
