"""A run's state and the cause of its failure, read from files alone: the kept logs (eks_ddp_runtime/runlogs.py),
the launcher's final marker and the local runner's ``result.json`` / ``pids.json``. No process, pod or node of the
run needs to exist any more.

The cause of a failure is one worker's failure record: of each agent's last round that failed (the most recent
restart count in its ``failures.jsonl``), the record that explains the others best: a fatal exit code (the
workload's own no-retry codes), then a signal other than SIGTERM/SIGINT (SIGKILL: the kernel's OOM killer or a
kill; SIGSEGV, SIGABRT), then any other non-zero exit, then SIGTERM/SIGINT (what the agent sends the survivors);
the earliest first, the lowest rank on a tie. Its peers usually fail after it, noticing it is gone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from eks_ddp_runtime.contract import FABRIC_JSON, FABRIC_NODE_REPORT_PREFIX, LOGS_SUBDIR
from eks_ddp_runtime.runlogs import (
    AGENT_LOG,
    EXIT_RECORD,
    FAILURES,
    FINAL_MARKER,
    rank_log,
    read_records,
    tail_file,
)

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
"""A Job Kueue queues carries it (the stack's queued training Job)."""
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""Kueue labels the Workload it makes for a Job with the Job's UID (v0.16.4 pkg/controller/jobframework/reconciler.go,
``wl.Labels[JobUIDLabel] = string(object.GetUID())``; constants.JobUIDLabel)."""
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
"""Kueue writes it into an admitted Job's pod template once the ProvisioningRequest is Provisioned (kueue v0.16.4
pkg/controller/admissionchecks/provisioning/controller.go ``podSetUpdates``); the cluster autoscaler never scales up
for a pod carrying it (kubernetes/autoscaler cluster-autoscaler/processors/provreq/pods_filter.go)."""
KUEUE_DEACTIVATION_CAUSES = {
    "AdmissionCheck": "its admission check (gpu-capacity, the ProvisioningRequest for the whole run) was Rejected: "
                      "the retry budget (ProvisioningRequestConfig retryStrategy.backoffLimitCount) was spent, or "
                      "the autoscaler revoked the capacity",
    "RequeuingLimitExceeded": "its pods were not all Ready within waitForPodsReady's timeout once more than "
                              "requeuingStrategy.backoffLimitCount allows (nodes EC2 did not deliver, or lost and "
                              "not replaced)",
    "MaximumExecutionTimeExceeded": "it ran past its maximum execution time",
}
"""What Kueue's deactivation causes mean for a run: the Evicted reason ``Deactivated`` + ``DueTo`` + the
DeactivationTarget's reason (kueue v0.16.4 pkg/workload/workload.go ``Evict``/``ReasonWithCause``;
pkg/controller/core/workload_controller.go ``reconcileCheckBasedEviction``, ``triggerDeactivation``,
``reconcileMaxExecutionTime``)."""
RESULT_FILE = "result.json"
"""The local runner's verdict (eks_ddp_local/cli.py)."""
PIDS_FILE = "pids.json"
RUN_MARKERS = (LOGS_SUBDIR, FINAL_MARKER, RESULT_FILE, PIDS_FILE, "run.json", FABRIC_JSON)
"""What makes a folder a run's directory."""
_LATE_SIGNALS = ("SIGTERM", "SIGINT")


@dataclass
class Failure:
    pod: str
    rank: int
    local_rank: int | None
    exit_code: int
    signal: str | None
    restart: int
    fatal: bool
    time: str
    last_lines: list[str]
    log: str | None
    message: str | None = None

    @classmethod
    def of(cls, doc: dict) -> Failure:
        return cls(pod=str(doc.get("pod")), rank=int(doc.get("rank", -1)), local_rank=doc.get("local_rank"),
                   exit_code=int(doc.get("exit_code", 1)), signal=doc.get("signal"), restart=int(doc.get("restart", 0)),
                   fatal=bool(doc.get("fatal")), time=str(doc.get("time", "")),
                   last_lines=[str(x) for x in doc.get("last_lines") or []], log=doc.get("log"),
                   message=doc.get("message"))

    def how(self) -> str:
        if self.signal:
            return f"was killed by {self.signal} (exit code {self.exit_code})"
        return f"exited with code {self.exit_code}" + (" (a fatal code: not retried)" if self.fatal else "")

    def where(self) -> str:
        local = "" if self.local_rank is None else f", local rank {self.local_rank}"
        return f"rank {self.rank} (pod {self.pod}{local}, round {self.restart})"

    def weight(self) -> tuple:
        kind = 0 if self.fatal else 3 if self.signal in _LATE_SIGNALS else 1 if self.signal else 2
        return kind, self.time, self.rank


@dataclass
class AgentExit:
    pod: str
    exit_code: int | None
    reason: str


@dataclass
class Status:
    run: str
    state: str
    """running, succeeded, failed, cancelled or unknown; for a queued run also queued, waiting for capacity,
    admitted, nodes provisioned, booting, partially delivered, preempted, evicted, rejected or deactivated (``queue_state``)."""
    because: str
    """What says so (the final marker, result.json, the Job's condition, the agents' exit records)."""
    logs: Path | None = None
    logs_missing: str | None = None
    cause: Failure | None = None
    others: list[Failure] = field(default_factory=list)
    agents: list[AgentExit] = field(default_factory=list)
    fabric: str | None = None
    """The fabric check's verdict from the run's ``fabric.json`` (the slow node named), when there is one."""
    late_nodes: list[str] = field(default_factory=list)
    """Per late node whose node-only check failed (``fabric-node-<node>.json``): the node and its reason."""
    snapshots_off: list[str] = field(default_factory=list)
    """Per pod whose node-local snapshot was not written (it does not fit /dev/shm, or the write failed): the
    trainer's reason, with its size and the limit (``read_snapshot_refusals``)."""

    def as_dict(self) -> dict:
        def f(x: Failure | None) -> dict | None:
            return None if x is None else vars(x)
        return {"run": self.run, "state": self.state, "because": self.because,
                "logs": str(self.logs) if self.logs else None, "logs_missing": self.logs_missing,
                "cause": f(self.cause), "others": [f(o) for o in self.others],
                "agents": [vars(a) for a in self.agents], "fabric": self.fabric, "late_nodes": self.late_nodes,
                "snapshots_off": self.snapshots_off}

    def render(self) -> str:
        out = [f"run {self.run}: {self.state} ({self.because})"]
        if self.fabric:
            out.append(f"fabric check: {self.fabric}")
        out += [f"late node failed: {line}" for line in self.late_nodes]
        out += [f"node-local snapshots off: {line}" for line in self.snapshots_off]
        if self.logs_missing:
            out.append(f"cause: unknown: the kept logs are missing ({self.logs_missing})")
        elif self.cause is not None:
            c = self.cause
            out.append(f"cause: {c.where()} {c.how()} at {c.time}")
            if c.message:
                out.append(f"  message: {c.message}")
            where = f"{LOGS_SUBDIR}/{c.pod}/{c.log or rank_log(c.rank)}"
            out.append(f"last lines of rank {c.rank} ({where}):" if c.last_lines else
                       f"rank {c.rank} wrote nothing before it ended ({where})")
            out += [f"  | {line}" for line in c.last_lines]
        elif self.state == "failed":
            out.append("cause: no worker failure recorded; the agents' exit reasons below say why")
        if self.others:
            out.append("also failed: " + "; ".join(f"{o.where()} {o.how()}" for o in self.others[:8])
                       + (f"; and {len(self.others) - 8} more" if len(self.others) > 8 else ""))
        if self.agents:
            out.append("agents: " + "; ".join(
                f"{a.pod} " + ("still running or killed without a record" if a.exit_code is None else
                               f"exited {a.exit_code} ({a.reason})") for a in self.agents))
        if self.logs and not self.logs_missing:
            out.append(f"logs: {self.logs}")
        return "\n".join(out)


def _conditions(workload: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}


def _said(c: dict | None) -> str:
    return ": ".join(x for x in ((c or {}).get("reason"), (c or {}).get("message")) if x)


def reactivate_command(workload: dict) -> str:
    """What puts a deactivated Workload back in its queue (Kueue clears its requeue state then: workload_controller.go,
    the Reactivated requeue)."""
    meta = workload.get("metadata") or {}
    return (f"kubectl -n {meta.get('namespace', '<namespace>')} patch workloads.kueue.x-k8s.io {meta.get('name', '?')} "
            "--type=merge -p '{\"spec\":{\"active\":true}}'")


def deactivation(workload: dict) -> str:
    """Why a Workload is (being) deactivated: Kueue's cause (the Evicted reason ``DeactivatedDueTo<cause>``, or the
    DeactivationTarget condition before the eviction), or someone's ``spec.active: false`` (reason ``Deactivated``
    alone); and how to reactivate it."""
    name = (workload.get("metadata") or {}).get("name", "?")
    conds = _conditions(workload)
    evicted = conds.get("Evicted") if (conds.get("Evicted") or {}).get("status") == "True" else None
    target = conds.get("DeactivationTarget") if (conds.get("DeactivationTarget") or {}).get("status") == "True" \
        else None
    reason = str((evicted or {}).get("reason") or "")
    cause = reason.removeprefix("DeactivatedDueTo") if reason.startswith("DeactivatedDueTo") else \
        str((target or {}).get("reason") or "")
    said = _said(evicted) if reason.startswith("Deactivated") else _said(target)
    if cause:
        why = f"deactivated by Kueue: {KUEUE_DEACTIVATION_CAUSES.get(cause, cause)}"
    else:
        why = ("deactivated by hand (spec.active set to false, not by Kueue and not by eks-ddp cancel, which deletes "
               "a queued run's Job)")
    pending = " (being deactivated)" if (workload.get("spec") or {}).get("active") is not False else ""
    return (f"Workload {name} {why}{pending}" + (f" ({said})" if said else "") +
            f"; its Job stays suspended until it is reactivated: {reactivate_command(workload)}")


def queue_state(workload: dict | None, job: str) -> tuple[str, str]:
    """(state, why) of a queued Job from its Kueue Workload (``kueue.x-k8s.io/v1beta2``, v0.16.4
    apis/kueue/v1beta2/workload_types.go): ``queued`` (no quota reserved: the QuotaReserved condition's message is the
    scheduler's reason, e.g. "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu
    ..."), ``waiting for capacity`` (quota reserved, an admission check such as ``gpu-capacity``, the
    ProvisioningRequest the cluster autoscaler fulfils for the whole run, still Pending or Retry: its message),
    ``admitted`` (Admitted True: Kueue unsuspends the Job), ``preempted`` / ``evicted`` (Evicted True, its reason
    Preempted or another: PodsReadyTimeout, AdmissionCheck, ClusterQueueStopped ...; Requeued says when it queues
    again), ``deactivated`` (``spec.active: false``, or about to be: DeactivationTarget; with Kueue's reason and the
    command that reactivates it; never ``cancelled``: ``eks-ddp cancel`` deletes a queued run's Job) and ``rejected``
    (an admission check Rejected)."""
    if workload is None:
        return "queued", (f"Job {job} is suspended and has no Kueue Workload yet (Kueue makes one when it sees the "
                          "Job: is its controller running? kubectl -n kueue-system get pods)")
    name = (workload.get("metadata") or {}).get("name", "?")
    conds = _conditions(workload)
    true = {t for t, c in conds.items() if c.get("status") == "True"}
    checks = (workload.get("status") or {}).get("admissionChecks") or []
    where = f"Workload {name}"
    if (workload.get("spec") or {}).get("active") is False or "DeactivationTarget" in true:
        return "deactivated", deactivation(workload)
    if "Evicted" in true:
        ev = conds["Evicted"]
        kind = "preempted" if ev.get("reason") == "Preempted" or "Preempted" in true else "evicted"
        why = f"{where} {kind} ({_said(ev)})"
        requeued = conds.get("Requeued")
        if requeued is not None:
            why += ("; requeued: it waits in the queue again" if requeued.get("status") == "True" else
                    f"; not requeued yet ({_said(requeued)})")
        return kind, why
    rejected = [c for c in checks if c.get("state") == "Rejected"]
    if rejected:
        return "rejected", "; ".join(f"admission check {c.get('name')} Rejected: {c.get('message', '')}"
                                     for c in rejected)
    if "Admitted" in true:
        admission = (workload.get("status") or {}).get("admission") or {}
        counts = ", ".join(f"{a.get('count', '?')} pod(s) on {', '.join(sorted(set((a.get('flavors') or {}).values())))}"
                           for a in admission.get("podSetAssignments") or [])
        return "admitted", f"{where} admitted by ClusterQueue {admission.get('clusterQueue', '?')}" + (
            f": {counts}" if counts else "")
    if "QuotaReserved" in true:
        waiting = [c for c in checks if c.get("state") in ("Pending", "Retry")]
        if waiting:
            return "waiting for capacity", f"{where}: {conds['QuotaReserved'].get('message', 'quota reserved')}; " + \
                "; ".join(f"admission check {c.get('name')} {c.get('state')}" +
                          (f": {c['message']}" if c.get("message") else "") for c in waiting)
        return "waiting for capacity", f"{where}: {_said(conds['QuotaReserved'])}; {_said(conds.get('Admitted'))}"
    reserved = conds.get("QuotaReserved")
    return "queued", f"{where} waits in its queue" + (f" ({_said(reserved)})" if reserved else
                                                      " (not yet tried by the scheduler)")


def requeued(workload: dict) -> bool:
    """The Workload's ``Requeued`` condition is True (kueue v0.16.4 apis/kueue/v1beta2/workload_types.go
    ``WorkloadRequeued``): an evicted or preempted run waits in its queue again, so it has a queue position."""
    return (_conditions(workload).get("Requeued") or {}).get("status") == "True"


def _job_of(workload: dict) -> str:
    owners = (workload.get("metadata") or {}).get("ownerReferences") or []
    return next((o.get("name", "?") for o in owners if o.get("kind") == "Job"),
                str((workload.get("metadata") or {}).get("name", "?")))


def _admitted_pods(workload: dict) -> int | None:
    admission = (workload.get("status") or {}).get("admission") or {}
    counts = [int(a.get("count", 0)) for a in admission.get("podSetAssignments") or []]
    return sum(counts) if counts else None


PREEMPTING = ("LowerPriority", "LowerOrNewerEqualPriority")
"""``withinClusterQueue`` policies under which a waiting workload evicts an admitted one of lower priority (kueue
v0.16.4 ``pkg/scheduler/preemption/common/preemption_policy.go``)."""


def competition(mine: dict, workloads: list[dict], within_cluster_queue: str | None) -> str | None:
    """The other runs of ``mine``'s queue (the same LocalQueue, ``spec.queueName``; a Job's older Workloads are not
    other runs): each one's state (``queue_state``), the pods it was admitted with (an elastic run admitted at fewer
    than its maximum stays that size: Kueue admits a workload at one count, ``flavorassigner/podset_reducer.go``) and
    its priority; then who would preempt whom under the ClusterQueue's ``withinClusterQueue`` policy
    (:data:`PREEMPTING`: a waiting run of higher priority evicts an admitted one of lower priority,
    ``preemption.go`` ``classicalPreemptions``; ``Never``: a waiting run waits until an admitted one ends). None when
    the run has its queue to itself."""
    def uid(w: dict) -> str:
        return str(((w.get("metadata") or {}).get("labels") or {}).get(JOB_UID_LABEL, ""))

    def prio(w: dict) -> int:
        return int((w.get("spec") or {}).get("priority") or 0)

    queue = (mine.get("spec") or {}).get("queueName")
    others = [w for w in workloads if uid(w) != uid(mine) and (w.get("spec") or {}).get("queueName") == queue
              and "Finished" not in {c.get("type") for c in (w.get("status") or {}).get("conditions") or []
                                     if c.get("status") == "True"}]
    if not others:
        return None
    states = {id(w): queue_state(w, _job_of(w))[0] for w in [mine, *others]}
    parts = []
    for w in sorted(others, key=_job_of):
        pods = _admitted_pods(w)
        parts.append(f"{_job_of(w)} {states[id(w)]}" + (f" with {pods} pod(s)" if pods is not None and
                                                        states[id(w)] == "admitted" else "") + f", priority {prio(w)}")
    text = f"competes in LocalQueue {queue} with: " + "; ".join(parts)
    admitted = [w for w in others if states[id(w)] == "admitted"]
    waiting = [w for w in others if states[id(w)] in ("queued", "waiting for capacity")]
    if within_cluster_queue in PREEMPTING:
        if states[id(mine)] == "admitted" and (over := [w for w in waiting if prio(w) > prio(mine)]):
            text += (f"; this run would be preempted by {', '.join(sorted(map(_job_of, over)))} (higher priority; "
                     f"ClusterQueue preemption {within_cluster_queue})")
        if states[id(mine)] in ("queued", "waiting for capacity") and (
                under := [w for w in admitted if prio(w) < prio(mine)]):
            text += (f"; this run would preempt {', '.join(sorted(map(_job_of, under)))} (lower priority; "
                     f"ClusterQueue preemption {within_cluster_queue})")
    elif within_cluster_queue == "Never":
        text += "; no run is preempted (ClusterQueue preemption Never): a waiting run waits for an admitted one to end"
    else:
        text += "; the ClusterQueue's preemption policy could not be read"
    return text


def _on_no_node(pod: dict) -> bool:
    """Not yet bound to a node: ``spec.nodeName`` empty and PodScheduled not True (kubernetes/kubernetes
    pkg/apis/core/types.go: the scheduler binds by setting ``nodeName``; the kubelet then pulls images and runs init
    containers, which the fabric check is one of, with the pod still ``Pending``)."""
    if (pod.get("spec") or {}).get("nodeName"):
        return False
    scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
                     None)
    return (scheduled or {}).get("status") != "True"


def _age_minutes(stamp: str | None, now: datetime) -> float | None:
    try:
        then = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (now - then).total_seconds() / 60


def max_node_provision_minutes() -> float:
    """The autoscaler's ``--max-node-provision-time`` (infra/autoscaler.py :data:`MAX_NODE_PROVISION_TIME`): how long
    a provisioned node may take to register before the autoscaler gives it up. Imported here, not at module level:
    the infra module brings the AWS provider, which ``eks-ddp status`` otherwise never loads."""
    from eks_ddp.core.rules import duration_minutes
    from eks_ddp.infra.autoscaler import MAX_NODE_PROVISION_TIME

    return duration_minutes(MAX_NODE_PROVISION_TIME)


EVICTION_WAIT = "5m"
"""How long the printed requeue command waits for Kueue to evict the deactivated Workload before reactivating it."""


def requeue_command(workload: dict) -> str:
    """Deactivate, wait for Kueue's eviction (condition ``Evicted``, kueue v0.16.4 apis/kueue/v1beta2/workload_types.go
    ``WorkloadEvicted``; the fixtures' Evicted/DeactivatedDueTo... conditions), then reactivate: a reactivation
    before the eviction lands would leave the Workload admitted on the consumed request, and nothing requeued."""
    meta = workload.get("metadata") or {}
    ns, name = meta.get("namespace", "<namespace>"), meta.get("name", "?")
    patch = "kubectl -n {ns} patch workloads.kueue.x-k8s.io {name} --type=merge -p '{{\"spec\":{{\"active\":{v}}}}}'"
    wait = (f"kubectl -n {ns} wait --for=condition=Evicted --timeout={EVICTION_WAIT} "
            f"workloads.kueue.x-k8s.io/{name}")
    return f"{patch.format(ns=ns, name=name, v='false')} && {wait} && {patch.format(ns=ns, name=name, v='true')}"


def consumed_pending(pods: list[dict], job: dict, workload: dict | None, now: datetime | None = None,
                     provision_minutes: float | None = None) -> tuple[str, str] | None:
    """(state, why and the fix) for an admitted queued Job some of whose pods are Pending on no node while carrying
    :data:`CONSUME_ANNOTATION`: the cluster autoscaler will never add a node for them (the pods filter), so they
    wait for Kueue's waitForPodsReady eviction (infra/kueue.py); None when no pod is in that state. A pod already on
    a node (pulling its image, running its init containers: the fabric check) is starting, not stuck. While the
    Workload's Admitted condition is younger than the autoscaler's max node provisioning time, the nodes may still
    be booting: ``nodes provisioned, booting``, with no fix offered (a requeue would discard a healthy start);
    after it, ``partially delivered``."""
    stuck = [p for p in pods if (p.get("status") or {}).get("phase") == "Pending" and _on_no_node(p)
             and CONSUME_ANNOTATION in ((p.get("metadata") or {}).get("annotations") or {})]
    if not stuck:
        return None
    status, spec = job.get("status") or {}, job.get("spec") or {}
    wanted = spec.get("parallelism", len(pods))
    request = stuck[0]["metadata"]["annotations"][CONSUME_ANNOTATION]
    names = ", ".join(sorted(str((p.get("metadata") or {}).get("name")) for p in stuck))
    said = (f"{len(stuck)} pod(s) pending on a consumed ProvisioningRequest, on no node yet ({names}: "
            f"{CONSUME_ANNOTATION}={request}); {status.get('ready', 0)} of {wanted} pod(s) ready")
    admitted = _conditions(workload or {}).get("Admitted") or {}
    if admitted.get("status") == "True":
        age = _age_minutes(admitted.get("lastTransitionTime"), now or datetime.now(UTC))
        limit = max_node_provision_minutes() if provision_minutes is None else provision_minutes
        if age is not None and age < limit:
            return "nodes provisioned, booting", (
                f"{said}. Admitted {age:.0f} min ago, within the autoscaler's max node provisioning time "
                f"({limit:.0f} min): the nodes may still be registering; nothing to do yet")
    why = (f"{said}. The cluster autoscaler never adds a node for such a "
           "pod (its ProvisioningRequest pods filter): the node was not delivered by EC2 or was lost and not "
           "replaced. Kueue evicts the run and queues it again for a new request once waitForPodsReady's timeout "
           "passes (since admission, or since the pod went missing)")
    if workload is not None:
        why += f"; to requeue it now (its pods stop, training resumes from the last checkpoint): {requeue_command(workload)}"
    return "partially delivered", why


VISIBILITY_API = "/apis/visibility.kueue.x-k8s.io/v1beta2"
"""Kueue's visibility API (v0.16.4 apis/visibility/v1beta2/types.go; served by the controller through the chart's
APIService ``v1beta2.visibility.kueue.x-k8s.io``): ``namespaces/<ns>/localqueues/<lq>/pendingworkloads``."""


def pending_path(namespace: str, local_queue: str) -> str:
    """The raw path of a LocalQueue's pending workloads (``kubectl get --raw``)."""
    return f"{VISIBILITY_API}/namespaces/{namespace}/localqueues/{local_queue}/pendingworkloads"


def queue_position(summary: dict, workload: str) -> str:
    """Where ``workload`` stands in a ``PendingWorkloadsSummary``: its ``positionInClusterQueue`` and
    ``positionInLocalQueue``, both counted from 0 (pkg/visibility/storage/pending_workloads_lq.go: the index in the
    ClusterQueue's pending workloads, those it tries and those it set aside as inadmissible together, sorted in its
    queueing order, priority then creation: pkg/cache/queue/cluster_queue.go ``Snapshot``)."""
    for item in summary.get("items") or []:
        if (item.get("metadata") or {}).get("name") == workload:
            cq, lq = int(item.get("positionInClusterQueue", 0)), int(item.get("positionInLocalQueue", 0))
            return (f"position {cq + 1} in its ClusterQueue ({cq} workload(s) ahead), {lq + 1} in LocalQueue "
                    f"{item.get('localQueueName', '?')}, priority {item.get('priority', '?')}")
    return "not in the LocalQueue's pending list (being admitted, or held back by a backoff)"


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).exists() for m in RUN_MARKERS)


def _json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def pods(logs: Path) -> list[Path]:
    """The agents' folders under a run's ``logs/`` (each holds agent.log or a rank log)."""
    if not logs.is_dir():
        return []
    return sorted(p for p in logs.iterdir() if p.is_dir() and (
        (p / AGENT_LOG).exists() or (p / EXIT_RECORD).exists() or any(p.glob("rank-*.log"))))


def read_failures(logs: Path) -> tuple[Failure | None, list[Failure]]:
    """The cause (see the module docstring) and the other failures of the same last rounds."""
    last: list[Failure] = []
    for pod in pods(logs):
        records = [Failure.of(d) for d in read_records(pod / FAILURES)]
        if records:
            final = max(r.restart for r in records)
            last += [r for r in records if r.restart == final]
    if not last:
        return None, []
    ranked = sorted(last, key=Failure.weight)
    return ranked[0], ranked[1:]


def read_agents(logs: Path) -> list[AgentExit]:
    out = []
    for pod in pods(logs):
        doc = _json(pod / EXIT_RECORD)
        out.append(AgentExit(pod.name, None, "") if doc is None else
                   AgentExit(pod.name, doc.get("exit_code"), str(doc.get("reason", ""))))
    return out


SNAPSHOT_REFUSED = "[snapshot] step "
"""How the trainer's one line for a node-local snapshot it did not write begins (eks_ddp_trainer/snapshot.py
``Snapshots._turn_off``: ``[snapshot] step N: node-local snapshot PATH not written: WHY; snapshots are off ...``);
tests/tooling/test_runs_cli.py feeds this reader the trainer's own line."""
_NOT_WRITTEN, _OFF = " not written: ", "; snapshots are off"


def read_snapshot_refusals(logs: Path) -> list[str]:
    """Per pod, the first line in its rank logs that says its node-local snapshot was not written: ``POD, step N:
    WHY (logs/POD/FILE)``. Stops at a pod's first such line; reads a pod's logs to the end when there is none."""
    out = []
    for pod in pods(logs):
        for path in sorted(pod.glob("rank-*.log*")):
            line = _first_refusal(path)
            if line is not None:
                step, _, rest = line[len(SNAPSHOT_REFUSED):].partition(":")
                why = rest.partition(_NOT_WRITTEN)[2].partition(_OFF)[0]
                out.append(f"{pod.name}, step {step}: {why} ({LOGS_SUBDIR}/{pod.name}/{path.name})")
                break
    return out


def _first_refusal(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                at = line.find(SNAPSHOT_REFUSED)
                if at >= 0 and _NOT_WRITTEN in line:  # a prefix (a timestamp) before it is allowed
                    return line[at:].rstrip("\n")
    except OSError:
        return None
    return None


def runner_alive(run_dir: Path) -> int | None:
    """The local runner's pid while it still runs this run (pids.json; a reused pid does not count)."""
    from eks_ddp_local.procs import alive, cmdline

    doc = _json(run_dir / PIDS_FILE) or {}
    pid = doc.get("runner")
    if not isinstance(pid, int) or pid == os.getpid() or not alive(pid):
        return None
    return pid if "eks_ddp_local" in cmdline(pid) or "eks-ddp-local" in cmdline(pid) else None


def fabric_verdict(doc: dict) -> str:
    """One line from ``fabric.json`` (eks_ddp_runtime/fabric_check.py ``Report``): the verdict, its reasons, the slow
    nodes."""
    slow = [str(n) for n in doc.get("slow_nodes") or []]
    reasons = "; ".join(str(r) for r in doc.get("reasons") or [])
    return ("passed" if doc.get("passed") else "FAILED") + (f": {reasons}" if reasons else "") + (
        f" (slow node(s): {', '.join(slow)})" if slow else "")


def late_node_failures(run_dir: Path) -> list[str]:
    """``NODE: REASON`` per ``fabric-node-<node>.json`` (eks_ddp_runtime/fabric_check.py ``write_node_report``): a
    node that joined after the job's check passed and failed its node-only check."""
    out = []
    for path in sorted(run_dir.glob(f"{FABRIC_NODE_REPORT_PREFIX}*.json")):
        doc = _json(path) or {}
        node = str(doc.get("node") or path.stem.removeprefix(FABRIC_NODE_REPORT_PREFIX))
        out.append(f"{node}: " + ("; ".join(str(r) for r in doc.get("reasons") or []) or "no reason recorded")
                   + f" ({path.name})")
    return out


def local_status(run_dir: Path, name: str | None = None) -> Status:
    """The state of a run from its directory (a local run's, or a cluster run's kept logs fetched here)."""
    name = name or run_dir.name
    logs = run_dir / LOGS_SUBDIR
    agents = read_agents(logs)
    result = _json(run_dir / RESULT_FILE)
    if (run_dir / FINAL_MARKER).exists():
        state, because = "succeeded", f"{FINAL_MARKER}: the launcher recorded that the run finished"
    elif runner_alive(run_dir):
        state, because = "running", f"the local runner (pid {runner_alive(run_dir)}) is running it"
    elif result is not None:
        code = result.get("returncode")
        stopped_by = result.get("stopped_by")
        state = "succeeded" if code == 0 else "cancelled" if stopped_by else "failed"
        because = f"{RESULT_FILE}: exit status {code}" + (
            f", stopped by {stopped_by} (eks-ddp cancel, Ctrl-C or a closed terminal)" if stopped_by else "")
    elif any(a.exit_code == 0 for a in agents):
        state, because = "succeeded", "an agent exited 0: its workers finished"
    elif agents and all(a.exit_code is not None for a in agents):
        state, because = "failed", "every agent exited non-zero"
    elif agents:
        state, because = "unknown", "an agent left no exit record: still running, or killed without warning"
    else:
        state, because = "unknown", "no agent record"
    fabric = _json(run_dir / FABRIC_JSON)
    if fabric is not None and fabric.get("passed") is False and state == "unknown":
        # The check (the training pods' init container) failed before any training agent ran.
        state, because = "failed", f"{FABRIC_JSON}: the fabric check failed, so training never started"
    status = Status(run=name, state=state, because=because, logs=logs, agents=agents,
                    fabric=fabric_verdict(fabric) if fabric is not None else None,
                    late_nodes=late_node_failures(run_dir))
    if not logs.is_dir():
        status.logs_missing = f"{logs}: no such folder"
    elif not agents:
        status.logs_missing = f"{logs}: no agent's folder in it"
    else:
        status.snapshots_off = read_snapshot_refusals(logs)
        status.cause, status.others = read_failures(logs)
        if state in ("succeeded", "cancelled"):  # restarts along the way, or the stop asked for, are no cause
            status.cause, status.others = None, []
    return status


def log_files(logs: Path, rank: int | None = None) -> list[Path]:
    """The kept log files in reading order: per agent, agent.log then its ranks (a rotated ``.1`` before its file);
    with ``rank``: that rank's files only, on every agent that ran it."""
    out: list[Path] = []
    for pod in pods(logs):
        if rank is None:
            names = [AGENT_LOG, *sorted((p.name for p in pod.glob("rank-*.log")),
                                        key=lambda n: int(n[5:-4]) if n[5:-4].isdigit() else 1 << 30)]
        else:
            names = [rank_log(rank)]
        for n in names:
            for p in (pod / f"{n}.1", pod / n):
                if p.exists():
                    out.append(p)
    return out


def last_lines(path: Path, n: int) -> list[str]:
    return tail_file(path, n)
