"""The rendezvous store's size from the fleet it serves: etcd's quota, history compaction, CPU and memory as a pure
function of the most agents one run can have (the largest GPU group's ``maxSize``). Pure Python: no Pulumi.

**The load model** (what one agent sends: ``REQUEST_PATTERN`` in
training/runtime/eks_ddp_runtime/rendezvous/etcd_backend.py; figures: bench/RESULTS.md).

* *Steady state writes nothing.* A heartbeat renews the agent's own etcd lease (``lease/keepalive``, which etcd 3.5
  answers on the leader without a raft entry) and reads are read-only transactions that return two counts while
  nothing changed. So an agent costs :data:`REQUESTS_PER_AGENT_S` small requests per second and no WAL bytes, at
  any N.
* *A re-form writes O(N) bytes.* Each agent leaves the old round, waits and joins the new one with a claim on its
  own heartbeat key (rendezvous/claims.py), and writes its few c10d store keys: :data:`REFORM_REVISIONS_PER_AGENT`
  revisions of about :data:`AGENT_REVISION_BYTES` each. One write of the core, :func:`core_bytes` (N), about
  :data:`BYTES_PER_NODE` per node, closes the round: :func:`reform_bytes` (N). Measured with the launcher's own
  handler on a real etcd: 5.0 proposals per agent for one lost agent at N = 8, 16, 32 and 64 (bench/RESULTS.md;
  tests/runtime/test_rendezvous_reform.py). Before claims, every move was a compare-and-set of the whole core that
  the others' writes made fail: about N^2 revisions of O(N) bytes.
* *History is compacted by etcd itself*, ``--auto-compaction-mode=periodic`` with
  ``--auto-compaction-retention`` :data:`COMPACTION_RETENTION`: etcd 3.5 compacts every retention period (for
  retentions under an hour) to the revision of one period ago (etcd docs v3.5, "Maintenance": "Auto Compaction";
  server/etcdserver/api/v3compactor/periodic.go). So at most two periods of history are ever held.
* *No defragmentation is needed.* etcd's quota is checked against bbolt's high-water mark of pages (``backend.Size``),
  and compaction returns the pages of superseded revisions to bbolt's freelist, from which later writes are served
  before the file grows ("Compacting the keyspace history drops all information about keys superseded prior to a
  given keyspace revision. The space used by these keys then becomes available for additional writes to the
  keyspace", etcd docs v3.5 "Maintenance": "History compaction"). Defragmentation only hands free pages back to the
  file system, which an emptyDir of a few hundred MiB does not need. The quota is therefore sized to hold the
  history of :data:`REFORMS_PER_WINDOW` re-forms (a worst sustained rate: one per 30 s, every re-form costing a
  detection window and a worker start) plus the live keys, times :data:`FRAGMENTATION` (values larger than a page
  take runs of contiguous overflow pages, which a fragmented freelist serves less well).
* *Memory*: etcd keeps the raft log since its last snapshot in memory (``--snapshot-count`` entries, plus 5,000
  catch-up entries after a snapshot, etcd docs v3.5 "Maintenance": "Raft log retention"); the snapshot count is
  chosen so that log holds about :data:`RAFT_LOG_BYTES` at the largest entry (a core), above a base of
  :data:`BASE_MEMORY_MIB`.
* *CPU*: :data:`REQUESTS_PER_CORE_S` small requests per second per core through etcd's JSON gateway with TLS (a
  conservative figure; bench/RESULTS.md measures it).

The model *holds* at N when the quota it needs is at most :data:`MAX_QUOTA_BYTES` (etcd's documented suggested
maximum, 8 GiB: etcd docs v3.5 "System limits": "Storage size limit") and the CPU at most :data:`MAX_CPU_M`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

BYTES_PER_NODE = 96
"""Bytes of one node in the core's JSON: a participant entry and a heartbeat entry (address, pid, local id, rank,
the epoch time): ~85 for a pod address of a /16, 93 for the longest IPv4 address (tests/core/test_rendezvous_store.py measures it with the encoder)."""
CORE_BASE_BYTES = 200
REVISION_OVERHEAD = 120
"""Bytes etcd stores per revision besides the value: the key, its revision and lease fields (bbolt's key)."""
REFORM_REVISIONS_PER_AGENT = 6
"""Revisions one re-form writes per agent, rounded up from the 5.0 measured (leave, wait and join claims, a lease,
the c10d store's keys)."""
AGENT_REVISION_BYTES = 400
"""One such revision in etcd's history: a key of ~80 bytes, a value of at most ~200 (a claim is ~70), the
overhead."""
REFORMS_PER_WINDOW = 20
"""Re-forms whose history the quota must hold at once: one every 30 s for two compaction periods (10 minutes)."""
COMPACTION_RETENTION = "5m"
"""etcd's ``--auto-compaction-retention`` (periodic mode): history older than this is compacted, every 5 minutes
(nothing reads the rendezvous' history: no watches, no reads at old revisions)."""
COMPACTION_WINDOW_S = 2 * 300
"""At most this much history is held: the retention plus one compaction period."""
FRAGMENTATION = 4
MIN_QUOTA_BYTES = 256 << 20
MAX_QUOTA_BYTES = 8 << 30
REQUESTS_PER_AGENT_S = 5.0
"""A steady agent's requests per second (k = 1 s): keep-alive read, lease renewal, check read, two monitor reads."""
REQUESTS_PER_CORE_S = 2000.0
MIN_CPU_M, MAX_CPU_M = 100, 4000
BASE_MEMORY_MIB = 256
RAFT_LOG_BYTES = 64 << 20
CATCH_UP_ENTRIES = 5000
"""Entries etcd keeps after a snapshot for a slow follower (``snapshotCatchUpEntries``)."""


def core_bytes(agents: int) -> int:
    """The rendezvous core's size in bytes with ``agents`` nodes."""
    return CORE_BASE_BYTES + BYTES_PER_NODE * agents


def reform_bytes(agents: int) -> int:
    """History one re-form of ``agents`` writes to etcd: each agent's claims and c10d store keys, and one core."""
    return agents * REFORM_REVISIONS_PER_AGENT * AGENT_REVISION_BYTES + core_bytes(agents) + REVISION_OVERHEAD + 4096


@dataclass(frozen=True)
class StoreSize:
    """etcd's settings for a store that serves runs of at most ``agents`` agents, and the model behind them."""

    agents: int
    quota_bytes: int
    compaction_retention: str
    snapshot_count: int
    cpu_request_m: int
    cpu_limit_m: int
    memory_request_mib: int
    memory_limit_mib: int
    history_bytes: int
    """The most history etcd holds between compactions under the model."""
    requests_per_s: float
    holds: bool
    """Whether the model says one store serves this many agents (quota within etcd's 8 GiB, CPU within 4 cores)."""

    @property
    def data_dir_mib(self) -> int:
        """The data volume's size: the quota plus etcd's WAL (5 files of 64 MiB kept, ``--max-wals``) and snapshots."""
        return (self.quota_bytes >> 20) + 512

    def scaled(self, factor: int) -> StoreSize:
        """The same store with its quota and compaction period divided by ``factor`` (a soak that plays hours of a
        run in minutes)."""
        minutes = int(self.compaction_retention.removesuffix("m"))
        seconds = max(1, minutes * 60 // factor)
        return dataclasses.replace(self, quota_bytes=max(1 << 20, self.quota_bytes // factor),
                                   compaction_retention=f"{seconds}s")


def _mib_pow2(n_bytes: float) -> int:
    mib = max(1, math.ceil(n_bytes / (1 << 20)))
    return 1 << (mib - 1).bit_length()


def store_size(agents: int) -> StoreSize:
    """The store for runs of up to ``agents`` agents (one per node: the largest GPU group's ``maxSize``)."""
    if type(agents) is not int or agents < 1:
        raise ValueError(f"agents: got {agents!r}; expected the largest GPU group's maxSize, an integer >= 1")
    history = REFORMS_PER_WINDOW * reform_bytes(agents)
    needed = FRAGMENTATION * (history + 64 * agents + (1 << 20))
    quota = max(MIN_QUOTA_BYTES, _mib_pow2(needed) << 20)
    entry = core_bytes(agents) + REVISION_OVERHEAD
    snapshot_count = max(1000, min(10000, RAFT_LOG_BYTES // entry))
    raft_mib = math.ceil((snapshot_count + CATCH_UP_ENTRIES) * entry / (1 << 20))
    memory_limit = max(512, _mib_pow2((BASE_MEMORY_MIB + raft_mib) << 20))
    requests = REQUESTS_PER_AGENT_S * agents
    cpu = max(MIN_CPU_M, 100 * math.ceil(1000 * requests / REQUESTS_PER_CORE_S / 100))
    return StoreSize(
        agents=agents, quota_bytes=min(quota, MAX_QUOTA_BYTES), compaction_retention=COMPACTION_RETENTION,
        snapshot_count=snapshot_count, cpu_request_m=min(cpu, MAX_CPU_M), cpu_limit_m=max(1000, min(2 * cpu, MAX_CPU_M)),
        memory_request_mib=max(128, memory_limit // 4), memory_limit_mib=memory_limit, history_bytes=history,
        requests_per_s=requests, holds=quota <= MAX_QUOTA_BYTES and cpu <= MAX_CPU_M)


__all__ = ["StoreSize", "core_bytes", "reform_bytes", "store_size"]
