"""The queue contract: Kueue's admission arithmetic over a plan's ClusterQueue, ResourceFlavors and queued Jobs.

Which training Job Kueue admits, on which flavor, with how many pods, and what it says about one it does not admit,
are Kueue's rules (v0.16.4, https://github.com/kubernetes-sigs/kueue/tree/v0.16.4), implemented here from its source:

* **A Job's workload** (``pkg/controller/jobs/job/job_controller.go``, ``PodSets``/``podsCount``/``minPodsCount``):
  one pod set named ``main`` of ``min(parallelism, completions)`` pods; with the annotation
  ``kueue.x-k8s.io/job-min-parallelism`` its ``minCount``, which the Job webhook (``job_webhook.go``
  ``validatePartialAdmissionCreate``) refuses unless ``0 < min < count`` ("should be between 0 and count-1"). Its
  requests (``pkg/workload/workload.go`` ``totalRequestsFromPodSets``, k8s ``component-helpers/resource``
  ``PodRequests``): the containers' requests summed (a request left out defaults to its limit, as the API server
  defaults it), at least any init container's, times the count; cpu in millicores, everything else in units
  (``pkg/resources/requests.go`` ``ResourceValue``). Its queue is the ``kueue.x-k8s.io/queue-name`` label, its
  priority the ``value`` of the WorkloadPriorityClass its ``kueue.x-k8s.io/priority-class`` label names (0 without).
* **Flavor assignment** (``pkg/scheduler/flavorassigner/flavorassigner.go``): per resource group, the flavors in
  their ClusterQueue order; a flavor is skipped with ``untolerated taint {key value effect <nil>} in flavor F`` when
  one of its ``nodeTaints`` (NoSchedule/NoExecute) is not tolerated by the pod's tolerations plus the flavor's own
  (``checkFlavorForPodSets``), and with ``flavor F doesn't match node affinity`` when the pod's nodeSelector /
  required node affinity, restricted to the label keys the group's flavors carry (``flavorSelector``), does not
  match the flavor's ``nodeLabels``. On a matching flavor each covered resource is checked (``fitsResourceQuota``):
  over the nominal quota -> ``insufficient quota for R in flavor F, previously considered podsets requests (X) +
  current podset request (Y) > maximum capacity (Z)`` (no fit); within what is unused -> fit; else ``insufficient
  unused quota for R in flavor F, N more needed`` and the preemption oracle decides between "preempt" and "no
  candidates"; the first resource with no fit ends the flavor (Kueue meets the resources in Go's map order, so its
  message may name another of them; here they are taken sorted). The first flavor that fits wins (FlavorFungibility's defaults ``whenCanBorrow: MayStopSearch``,
  ``whenCanPreempt: TryNextFlavor``); a resource no group covers is ``resource R unavailable in ClusterQueue``.
  The reasons are sorted and joined with ", " (``Status.Message``) behind ``couldn't assign flavors to pod set
  main: `` (``Assignment.Message``). Quantities print as ``resource.Quantity`` does (cpu ``3`` / ``3500m``, memory
  ``12Gi``).
* **Order and partial admission** (``pkg/scheduler/scheduler.go``): pending workloads by priority (higher first),
  then creation (``entryOrdering.Less``); ``BestEffortFIFO`` lets a workload that does not fit step aside,
  ``StrictFIFO`` keeps it at the head, blocking those behind. A workload that does not fit whole, and cannot by
  preemption, is tried smaller when it allows partial admission (``getInitialAssignments``, feature PartialAdmission
  beta and on since v0.5): ``flavorassigner/podset_reducer.go``'s binary search from ``count`` down to ``minCount``
  finds the largest count that fits. It is admitted at that count once; nothing grows it later.
* **Preemption** (``pkg/scheduler/preemption/preemption.go`` ``classicalPreemptions``/``fillBackWorkloads``,
  ``common/ordering.go`` ``CandidatesOrdering``, ``common/preemption_policy.go``): with ``withinClusterQueue:
  LowerPriority`` the candidates are the admitted workloads of the queue of lower priority using a flavor/resource
  that needs preemption, lowest priority first, then the most recently admitted; they are removed until the
  preemptor fits, then those not needed are put back (newest removal kept). A preempted workload's condition says
  ``Preempted to accommodate a workload (UID: U, JobUID: J) due to prioritization in the ClusterQueue; preemptor
  path: /eks-ddp; preemptee path: /eks-ddp``; the preemptor waits with ``. Pending the preemption of N workload(s)``.
* **Can never be admitted** (a plan error): a queue name without its LocalQueue (``LocalQueue Q doesn't exist``,
  ``pkg/controller/core/workload_controller.go``) or ClusterQueue, a namespace the ClusterQueue's
  ``namespaceSelector`` leaves out (``Workload namespace doesn't match ClusterQueue selector``, scheduler.go
  ``nominate``), a min-parallelism the webhook refuses, and a workload that does not fit even alone in an empty
  queue at its minimum count. A Job holding GPUs without a queue name beside a ClusterQueue bypasses the queue.
* **CronJobs** are held to the same rules through their ``jobTemplate``: the Job made from one carries the
  template's labels and its spec (kubernetes/kubectl ``pkg/cmd/create/create_job.go`` ``createJobFromCronJob`` for
  ``kubectl create job --from=cronjob``; kubernetes ``pkg/controller/cronjob/utils.go`` ``getJobFromTemplate2`` for
  the CronJob controller), so a GPU template without the queue name makes GPU Jobs Kueue never sees. They are not
  in :func:`admission`'s simulation: nothing exists until someone starts one.

Two runs over the quota are not an error: one is admitted and the other waits, with the reason Kueue gives
(:func:`admission`, reported by ``eks-ddp`` and the tests).
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from eks_ddp.core import scheduling

from . import PlanView, Violation, contract

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
POD_SET = "main"
"""``kueue.DefaultPodSetName``: a batch/Job's one pod set."""
GPU = "nvidia.com/gpu"
KUEUE_KINDS = ("ClusterQueue", "ResourceFlavor", "LocalQueue", "WorkloadPriorityClass")

# --- quantities (k8s.io/apimachinery resource.Quantity, as Kueue reads and prints them) -------------------------
_SUFFIX: dict[str, Fraction | int] = {"": 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "k": 10**3,
           "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?)$")


def parse_quantity(value: Any) -> Fraction:
    """A Kubernetes quantity (``"3500m"``, ``"12Gi"``, ``8``) as an exact number."""
    if isinstance(value, bool):
        raise ValueError(f"quantity: got {value!r}; expected a number or a Kubernetes quantity string")
    if isinstance(value, int | float):
        return Fraction(value)
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"quantity: got {value!r}; expected a Kubernetes quantity such as 3500m, 12Gi or 8")
    number = Fraction(m.group(1))
    if m.group(2):
        return number * Fraction(10) ** int(m.group(2)[1:])
    return number * _SUFFIX[m.group(3) or ""]


def resource_value(name: str, value: Any) -> int:
    """``resources.ResourceValue``: millicores for cpu, whole units (rounded up, as ``Quantity.Value``) otherwise."""
    q = parse_quantity(value)
    q = q * 1000 if name == "cpu" else q
    return -((-q.numerator) // q.denominator)


def _decimal(v: int) -> str:
    if v == 0:
        return "0"
    for exp, suffix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if v % 10**exp == 0:
            return f"{v // 10**exp}{suffix}"
    return str(v)


def quantity_string(name: str, v: int) -> str:
    """``resources.ResourceQuantityString``: how Kueue prints an amount of a resource in its messages."""
    if name == "cpu":
        return _decimal(v // 1000) if v % 1000 == 0 else f"{v}m"
    if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        if abs(v) >= 1024 and v % 1024 == 0:
            for exp, suffix in ((60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")):
                if v % 2**exp == 0:
                    return f"{v // 2**exp}{suffix}"
        return _decimal(v)
    return _decimal(v)


# --- the objects, read from plain Kubernetes dicts ---------------------------------------------------------------
@dataclass(frozen=True)
class Flavor:
    name: str
    node_labels: Mapping[str, str]
    node_taints: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, m: Mapping[str, Any]) -> Flavor:
        spec = m.get("spec") or {}
        return cls(name=m["metadata"]["name"], node_labels=dict(spec.get("nodeLabels") or {}),
                   node_taints=tuple(spec.get("nodeTaints") or ()), tolerations=tuple(spec.get("tolerations") or ()))


@dataclass(frozen=True)
class ResourceGroup:
    covered: tuple[str, ...]
    flavors: tuple[tuple[str, Mapping[str, int]], ...]
    """(flavor, nominal quota by resource) in the ClusterQueue's order."""

    def label_keys(self, flavors: Mapping[str, Flavor]) -> set[str]:
        return {k for f, _ in self.flavors if f in flavors for k in flavors[f].node_labels}


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    groups: tuple[ResourceGroup, ...]
    strategy: str = "BestEffortFIFO"
    within_cluster_queue: str = "Never"
    namespace_selector: Mapping[str, Any] | None = None
    checks: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(admission check, the flavors it applies to; empty: all)."""

    @classmethod
    def of(cls, m: Mapping[str, Any]) -> ClusterQueue:
        spec = m.get("spec") or {}
        groups = []
        for g in spec.get("resourceGroups") or []:
            flavors = tuple((f["name"], {r["name"]: resource_value(r["name"], r.get("nominalQuota", 0))
                                         for r in f.get("resources") or []}) for f in g.get("flavors") or [])
            groups.append(ResourceGroup(covered=tuple(g.get("coveredResources") or ()), flavors=flavors))
        checks = tuple((c["name"], tuple(c.get("onFlavors") or ()))
                       for c in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or [])
        checks += tuple((c, ()) for c in spec.get("admissionChecks") or [])
        return cls(name=m["metadata"]["name"], groups=tuple(groups),
                   strategy=spec.get("queueingStrategy") or "BestEffortFIFO",
                   within_cluster_queue=(spec.get("preemption") or {}).get("withinClusterQueue") or "Never",
                   namespace_selector=spec.get("namespaceSelector"), checks=checks)

    def group_of(self, resource: str) -> ResourceGroup | None:
        return next((g for g in self.groups if resource in g.covered), None)

    def nominal(self, flavor: str, resource: str) -> int:
        for g in self.groups:
            for f, quota in g.flavors:
                if f == flavor and resource in g.covered:
                    return quota.get(resource, 0)
        return 0


@dataclass(frozen=True)
class Workload:
    """A batch/Job as Kueue's job integration makes it a Workload of one pod set."""

    name: str
    namespace: str
    queue: str | None
    priority: int
    priority_class: str | None
    count: int
    min_count: int | None
    pod_requests: Mapping[str, int]
    pod_spec: Mapping[str, Any]
    order: int
    """Creation order (the queue's FIFO tie-break)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    kind: str = "Job"
    """What the plan holds: a Job, or a CronJob whose ``jobTemplate`` this is."""

    @property
    def subject(self) -> str:
        return f"{self.kind}/{self.name}"

    def total(self, count: int | None = None) -> dict[str, int]:
        n = self.count if count is None else count
        return {r: v * n for r, v in self.pod_requests.items()}

    @property
    def partial(self) -> bool:
        return self.min_count is not None and self.count > self.min_count


def workload_of(job: Mapping[str, Any], order: int, priorities: Mapping[str, int]) -> Workload:
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    parallelism = int(spec.get("parallelism", 1))
    completions = spec.get("completions")
    count = min(parallelism, int(completions)) if completions is not None else parallelism
    raw_min = annotations.get(MIN_PARALLELISM)
    min_count = int(raw_min) if raw_min is not None and re.fullmatch(r"[+-]?\d+", str(raw_min)) else None
    pod_spec = ((spec.get("template") or {}).get("spec")) or {}
    pclass = labels.get(PRIORITY_CLASS_LABEL)
    return Workload(name=meta.get("name", "?"), namespace=meta.get("namespace", "default"),
                    queue=labels.get(QUEUE_NAME_LABEL), priority=int(priorities.get(pclass, 0)) if pclass else 0,
                    priority_class=pclass, count=count, min_count=min_count, pod_requests=scheduling.pod_requests(pod_spec, resource_value),
                    pod_spec=pod_spec, order=order, annotations=dict(annotations), kind=str(job.get(TEMPLATE_OF, "Job")))


TEMPLATE_OF = "x-eks-ddp-template-of"
"""Marks a Job built from a CronJob's template (:func:`cronjob_jobs`): its Workload's subject names the CronJob."""


def cronjob_jobs(manifests: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The Job each CronJob of the plan makes: its name and namespace, the ``jobTemplate``'s labels, annotations and
    spec (module docstring, "CronJobs")."""
    out = []
    for m in manifests:
        if m.get("kind") != "CronJob":
            continue
        meta, template = m.get("metadata") or {}, ((m.get("spec") or {}).get("jobTemplate") or {})
        tmeta = template.get("metadata") or {}
        out.append({"apiVersion": "batch/v1", "kind": "Job", TEMPLATE_OF: "CronJob",
                    "metadata": {"name": meta.get("name", "?"), "namespace": meta.get("namespace", "default"),
                                 "labels": dict(tmeta.get("labels") or {}),
                                 "annotations": dict(tmeta.get("annotations") or {})},
                    "spec": dict(template.get("spec") or {})})
    return tuple(out)


def workload_name(job_name: str, job_uid: str) -> str:
    """The Workload Kueue creates for a Job (``pkg/controller/jobframework/workload_names.go``
    ``GetWorkloadNameForOwnerWithGVK``): ``job-<name>-`` and 5 hex digits of sha1(kind, group, name, uid)."""
    prefixed = ("job-" + job_name)[:247]
    digest = hashlib.sha1(b"\n".join(x.encode() for x in ("Job", "batch", job_name, job_uid)),
                          usedforsecurity=False).hexdigest()
    return f"{prefixed}-{digest[:5]}"


# --- node matching (k8s component-helpers: taints/tolerations, nodeaffinity) ------------------------------------
def untolerated_taint(flavor: Flavor, pod_spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tolerations = [*(pod_spec.get("tolerations") or []), *flavor.tolerations]
    for taint in flavor.node_taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                scheduling.toleration_matches(t, taint.get("key", ""), taint.get("value", ""), taint["effect"])
                for t in tolerations):
            return taint
    return None


def matches_node_affinity(pod_spec: Mapping[str, Any], labels: Mapping[str, str], keys: set[str]) -> bool:
    """``flavorSelector`` then ``RequiredNodeAffinity.Match`` on a node carrying the flavor's labels: only the
    selector keys some flavor of the group carries count; an affinity term left empty by that filter matches all."""
    selector = {k: v for k, v in (pod_spec.get("nodeSelector") or {}).items() if k in keys}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = []
    for t in required.get("nodeSelectorTerms") or []:
        exprs = [e for e in t.get("matchExpressions") or [] if e.get("key") in keys]
        if not exprs:
            return True
        terms.append(exprs)
    return not terms or any(all(scheduling.expression_matches(e, labels) for e in exprs) for exprs in terms)


# --- the scheduler ---------------------------------------------------------------------------------------------
NO_FIT, NO_CANDIDATES, PREEMPT, FIT = 0, 1, 2, 4
"""``preemptionMode`` (flavorassigner.go), in its order; "reclaim" needs a cohort, which eks-ddp does not make."""


@dataclass(frozen=True)
class Outcome:
    """What Kueue does with one workload: ``admitted`` (quota reserved at ``count`` on ``flavors``; ``checks`` must
    then pass before the Job is unsuspended), ``pending`` with Kueue's message, or ``preempted``."""

    workload: str
    state: str
    count: int = 0
    flavors: Mapping[str, str] = field(default_factory=dict)
    message: str = ""
    preempts: tuple[str, ...] = ()
    preempted_by: str | None = None
    checks: tuple[str, ...] = ()

    @property
    def flavor(self) -> str | None:
        return self.flavors.get(GPU) or next(iter(sorted(set(self.flavors.values()))), None)


@dataclass
class _Assignment:
    mode: int
    flavors: dict[str, str]
    usage: dict[tuple[str, str], int]
    reasons: list[str]
    count: int

    def message(self) -> str:
        if self.mode == FIT:
            return ""
        return f"couldn't assign flavors to pod set {POD_SET}: " + ", ".join(sorted(self.reasons))


@dataclass
class Queue:
    """A ClusterQueue's state while it admits: its flavors and the workloads holding quota."""

    cq: ClusterQueue
    flavors: Mapping[str, Flavor]
    admitted: list[tuple[Workload, _Assignment]] = field(default_factory=list)

    def used(self, without: Sequence[Workload] = ()) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        skip = {w.name for w in without}
        for w, a in self.admitted:
            if w.name not in skip:
                for fr, v in a.usage.items():
                    out[fr] = out.get(fr, 0) + v
        return out

    def fits(self, usage: Mapping[tuple[str, str], int], without: Sequence[Workload] = ()) -> bool:
        used = self.used(without)
        return all(used.get(fr, 0) + v <= self.cq.nominal(*fr) for fr, v in usage.items())

    # preemption.go classicalPreemptions (one ClusterQueue, no cohort)
    def targets(self, wl: Workload, usage: Mapping[tuple[str, str], int], need: set[tuple[str, str]]) -> list[Workload]:
        if self.cq.within_cluster_queue != "LowerPriority":
            return []
        # CandidatesOrdering: lower priority first, then the most recently admitted first
        candidates = [w for i, (w, a) in sorted(enumerate(self.admitted), key=lambda x: (x[1][0].priority, -x[0]))
                      if w.priority < wl.priority and need & set(a.usage)]
        removed: list[Workload] = []
        for c in candidates:
            removed.append(c)
            if self.fits(usage, removed):
                for i in range(len(removed) - 2, -1, -1):  # fillBackWorkloads
                    trial = removed[:i] + removed[i + 1:]
                    if self.fits(usage, trial):
                        removed = trial
                return removed
        return []

    def _fits_resource(self, wl: Workload, flavor: str, resource: str, value: int,
                       used: Mapping[tuple[str, str], int]) -> tuple[int, str | None]:
        nominal = self.cq.nominal(flavor, resource)
        if value > nominal:
            return NO_FIT, (f"insufficient quota for {resource} in flavor {flavor}, previously considered podsets "
                            f"requests ({quantity_string(resource, 0)}) + current podset request "
                            f"({quantity_string(resource, value)}) > maximum capacity "
                            f"({quantity_string(resource, nominal)})")
        available = nominal - used.get((flavor, resource), 0)
        if value <= available:
            return FIT, None
        why = f"insufficient unused quota for {resource} in flavor {flavor}, {quantity_string(resource, value - available)} more needed"
        return (PREEMPT if self.targets(wl, {(flavor, resource): value}, {(flavor, resource)}) else NO_CANDIDATES), why

    def assign(self, wl: Workload, count: int) -> _Assignment:
        """``FlavorAssigner.assignFlavors`` for the workload's one pod set at ``count`` pods."""
        requests = wl.total(count)
        used = self.used()
        flavors: dict[str, str] = {}
        reasons: list[str] = []
        worst = FIT
        done: set[str] = set()
        for res in sorted(requests):
            if res in done or (requests[res] == 0 and self.cq.group_of(res) is None):
                continue
            group = self.cq.group_of(res)
            if group is None:
                return _Assignment(NO_FIT, {}, {}, [f"resource {res} unavailable in ClusterQueue"], count)
            wanted = {r: v for r, v in requests.items() if r in group.covered}
            done |= set(wanted)
            keys = group.label_keys(self.flavors)
            best: tuple[int, dict[str, str]] = (NO_FIT, {})
            group_reasons: list[str] = []
            for fname, _ in group.flavors:
                flavor = self.flavors.get(fname)
                if flavor is None:
                    group_reasons.append(f"flavor {fname} not found")
                    continue
                taint = untolerated_taint(flavor, wl.pod_spec)
                if taint is not None:
                    group_reasons.append(f"untolerated taint {{{taint.get('key')} {taint.get('value', '')} "
                                         f"{taint.get('effect')} <nil>}} in flavor {fname}")
                    continue
                if not matches_node_affinity(wl.pod_spec, flavor.node_labels, keys):
                    group_reasons.append(f"flavor {fname} doesn't match node affinity")
                    continue
                mode = FIT
                for r in sorted(wanted):
                    m, why = self._fits_resource(wl, fname, r, wanted[r], used)
                    if why:
                        group_reasons.append(why)
                    mode = min(mode, m)
                    if mode == NO_FIT:
                        break
                if mode == FIT:
                    best, group_reasons = (FIT, dict.fromkeys(wanted, fname)), []
                    break
                if mode > best[0]:
                    best = (mode, dict.fromkeys(wanted, fname))
            if best[0] == NO_FIT:
                return _Assignment(NO_FIT, {}, {}, reasons + group_reasons, count)
            flavors.update(best[1])
            reasons += group_reasons
            worst = min(worst, best[0])
        usage = {(flavors[r], r): v for r, v in requests.items() if r in flavors}
        return _Assignment(worst, flavors, usage, reasons, count)

    def short(self, usage: Mapping[tuple[str, str], int]) -> set[tuple[str, str]]:
        """``flavorResourcesNeedPreemption``: the flavor/resources the assignment does not fit in unused quota."""
        used = self.used()
        return {fr for fr, v in usage.items() if used.get(fr, 0) + v > self.cq.nominal(*fr)}

    def checks_for(self, flavors: Iterable[str]) -> tuple[str, ...]:
        used = set(flavors)
        return tuple(name for name, on in self.cq.checks if not on or used & set(on))

    def try_admit(self, wl: Workload) -> tuple[_Assignment, list[Workload]]:
        """``getInitialAssignments``: whole, else whole by preemption, else the largest partial count that fits
        (or fits by preemption) by ``PodSetReducer.Search``'s binary search."""
        full = self.assign(wl, wl.count)
        if full.mode == FIT:
            return full, []
        if full.mode in (PREEMPT, NO_CANDIDATES):
            targets = self.targets(wl, full.usage, self.short(full.usage))
            if targets:
                return full, targets
        if wl.partial:
            assert wl.min_count is not None
            delta = wl.count - wl.min_count
            last: list[tuple[int, tuple[_Assignment, list[Workload]]]] = []

            def fits(i: int) -> bool:
                a = self.assign(wl, wl.count - i)
                t = [] if a.mode == FIT else self.targets(wl, a.usage, self.short(a.usage)) \
                    if a.mode in (PREEMPT, NO_CANDIDATES) else []
                if a.mode == FIT or t:
                    last.append((i, (a, t)))
                    return True
                return False
            # sort.Search(totalDelta+1, fits): the smallest reduction (largest count) that fits
            idx = bisect.bisect_left(range(delta + 1), True, key=fits)
            if last and idx == last[-1][0]:
                return last[-1][1]
        return full, []


def schedule(cq: ClusterQueue, flavors: Mapping[str, Flavor], workloads: Sequence[Workload],
             running: Sequence[str] = ()) -> dict[str, Outcome]:
    """What Kueue ends with for ``workloads`` in one ClusterQueue: those named in ``running`` were admitted before
    (whole, in that order), the others arrive together and are taken by priority then creation."""
    queue = Queue(cq, flavors)
    by_name = {w.name: w for w in workloads}
    out: dict[str, Outcome] = {}
    for name in running:
        wl = by_name[name]
        a = queue.assign(wl, wl.count)
        queue.admitted.append((wl, a))
        out[name] = Outcome(name, "admitted", wl.count, a.flavors, checks=queue.checks_for(a.flavors.values()))
    pending = sorted((w for w in workloads if w.name not in running), key=lambda w: (-w.priority, w.order))
    head_blocked: str | None = None
    guard = 4 * len(workloads) + 4
    while pending and guard:
        guard -= 1
        wl = pending.pop(0)
        if head_blocked is not None:
            out[wl.name] = Outcome(wl.name, "pending", message=(
                f"behind {head_blocked} at the head of ClusterQueue {cq.name} (StrictFIFO: the head blocks the "
                "queue until it is admitted)"))
            continue
        a, targets = queue.try_admit(wl)
        if a.mode != FIT and not targets:
            before = out.get(wl.name)
            out[wl.name] = (replace(before, message=f"{before.message}; requeued: {a.message()}")
                            if before is not None and before.state == "preempted" else
                            Outcome(wl.name, "pending", message=a.message()))
            if cq.strategy == "StrictFIFO":
                head_blocked = wl.name
            continue
        message = a.message()
        if targets:
            message += f". Pending the preemption of {len(targets)} workload(s)"
            names = {t.name for t in targets}
            queue.admitted = [(w, x) for w, x in queue.admitted if w.name not in names]
            for t in targets:
                out[t.name] = Outcome(t.name, "preempted", preempted_by=wl.name, message=(
                    f"Preempted to accommodate a workload (UID: UNKNOWN, JobUID: UNKNOWN) due to prioritization in "
                    f"the ClusterQueue; preemptor path: /{cq.name}; preemptee path: /{cq.name}"))
                pending.append(t)  # requeued behind what was pending (its eviction time orders it)
            pending.sort(key=lambda w: (-w.priority, w.order if w.name not in names else len(workloads) + w.order))
            a = queue.assign(wl, a.count)
        queue.admitted.append((wl, a))
        out[wl.name] = Outcome(wl.name, "admitted", a.count, a.flavors, message=message,
                               preempts=tuple(sorted(t.name for t in targets)),
                               checks=queue.checks_for(a.flavors.values()),
                               preempted_by=out[wl.name].preempted_by if wl.name in out else None)
    return out


# --- over a plan -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanQueues:
    cluster_queues: Mapping[str, ClusterQueue]
    flavors: Mapping[str, Flavor]
    local_queues: Mapping[tuple[str, str], str]
    """(namespace, LocalQueue) -> its ClusterQueue."""
    priorities: Mapping[str, int]
    namespaces: Mapping[str, Mapping[str, str]]
    """Namespace -> its labels, for the Namespaces the plan makes."""
    jobs: tuple[Mapping[str, Any], ...]
    templates: tuple[Mapping[str, Any], ...] = ()
    """The Jobs the plan's CronJobs make (:func:`cronjob_jobs`): checked, not simulated."""


def read_plan(manifests: Sequence[Mapping[str, Any]]) -> PlanQueues:
    def kind(k: str) -> list[Mapping[str, Any]]:
        return [m for m in manifests if m.get("kind") == k]
    return PlanQueues(
        cluster_queues={m["metadata"]["name"]: ClusterQueue.of(m) for m in kind("ClusterQueue")},
        flavors={m["metadata"]["name"]: Flavor.of(m) for m in kind("ResourceFlavor")},
        local_queues={((m["metadata"].get("namespace") or "default"), m["metadata"]["name"]):
                      (m.get("spec") or {}).get("clusterQueue", "") for m in kind("LocalQueue")},
        priorities={m["metadata"]["name"]: int(m.get("value", 0)) for m in kind("WorkloadPriorityClass")},
        # The API server sets kubernetes.io/metadata.name on every namespace (the NamespaceDefaultLabelName feature,
        # GA in Kubernetes 1.22: pkg/registry/core/namespace/strategy.go), so selectors may name it.
        namespaces={m["metadata"]["name"]: {**(m["metadata"].get("labels") or {}),
                                            "kubernetes.io/metadata.name": m["metadata"]["name"]}
                    for m in kind("Namespace")},
        jobs=tuple(kind("Job")), templates=cronjob_jobs(manifests))


def _holds_gpus(w: Workload) -> bool:
    return w.pod_requests.get(GPU, 0) > 0


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    from .rendezvous import selects

    return selects(dict(selector) if selector is not None else None, dict(labels))


def admission(manifests: Sequence[Mapping[str, Any]], running: Sequence[str] = ()) -> dict[str, Outcome]:
    """Every queued Job of a plan (by name) and what Kueue does with it when they all arrive together."""
    plan = read_plan(manifests)
    workloads = [workload_of(j, i, plan.priorities) for i, j in enumerate(plan.jobs)]
    out: dict[str, Outcome] = {}
    by_cq: dict[str, list[Workload]] = {}
    for w in workloads:
        if w.queue is None:
            continue
        cq = plan.local_queues.get((w.namespace, w.queue))
        if cq is None:
            out[w.name] = Outcome(w.name, "pending", message=f"LocalQueue {w.queue} doesn't exist")
        elif cq not in plan.cluster_queues:
            out[w.name] = Outcome(w.name, "pending", message=f"ClusterQueue {cq} doesn't exist")
        elif w.namespace in plan.namespaces and not _selects(plan.cluster_queues[cq].namespace_selector,
                                                            plan.namespaces[w.namespace]):
            out[w.name] = Outcome(w.name, "pending", message="Workload namespace doesn't match ClusterQueue selector")
        else:
            by_cq.setdefault(cq, []).append(w)
    for cq, ws in by_cq.items():
        out.update(schedule(plan.cluster_queues[cq], plan.flavors, ws, [r for r in running if r in {w.name for w in ws}]))
    return out


def never_admitted(manifests: Sequence[Mapping[str, Any]]) -> list[Violation]:
    """The queued Jobs (and CronJob templates) Kueue can never admit, and GPU ones that bypass a queue the plan has."""
    plan = read_plan(manifests)
    out: list[Violation] = []
    for i, job in enumerate((*plan.jobs, *plan.templates)):
        w = workload_of(job, i, plan.priorities)
        if w.queue is None:
            if plan.cluster_queues and _holds_gpus(w):
                where = "" if w.kind == "Job" else " in its jobTemplate (every Job made from it)"
                out.append(Violation("queue", w.subject, f"requests {GPU} without the label {QUEUE_NAME_LABEL}"
                                     f"{where}: it starts outside the queue and takes GPU nodes the queue counts as "
                                     "free; expected it queued (label and spec.suspend: true)"))
            continue
        raw_min = w.annotations.get(MIN_PARALLELISM)
        if raw_min is not None and (w.min_count is None or not 0 < w.min_count < w.count):
            out.append(Violation("queue", w.subject, f"annotation {MIN_PARALLELISM}: got {raw_min!r}; expected an "
                                 f"integer between 1 and {w.count - 1} (Kueue's Job webhook refuses it: \"should be "
                                 f"between 0 and {w.count - 1}\"); leave it out for a fixed-size run"))
            continue
        if w.priority_class and w.priority_class not in plan.priorities:
            out.append(Violation("queue", w.subject, f"label {PRIORITY_CLASS_LABEL}: got {w.priority_class!r}; "
                                 f"expected one of the plan's WorkloadPriorityClasses {sorted(plan.priorities)}"))
        if not (job.get("spec") or {}).get("suspend"):
            out.append(Violation("queue", w.subject, "queued but not created with spec.suspend: true: its pods start "
                                 "before Kueue admits it"))
        alone = admission([*[m for m in manifests if m.get("kind") != "Job"],
                           _at_min(job, w)]).get(w.name)
        if alone is not None and alone.state != "admitted":
            out.append(Violation("queue", w.subject, f"can never be admitted, even alone in an empty queue at its "
                                 f"minimum of {w.min_count or w.count} pod(s): {alone.message}"))
    return out


def _at_min(job: Mapping[str, Any], w: Workload) -> dict[str, Any]:
    spec = dict(job.get("spec") or {})
    n = w.min_count if w.partial and w.min_count else w.count
    spec.update(parallelism=n, completions=n)
    meta = dict(job.get("metadata") or {})
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k != MIN_PARALLELISM}
    return {**{k: v for k, v in job.items() if k != TEMPLATE_OF}, "kind": "Job", "metadata": meta, "spec": spec}


@contract("queue")
def admissible(view: PlanView) -> list[Violation]:
    """Every queued Job of the plan can be admitted by Kueue (alone, at its minimum); over-quota runs only wait."""
    return never_admitted(view.manifests)


def render(outcomes: Mapping[str, Outcome]) -> str:
    """One line per workload, as ``eks-ddp`` reports an admission simulation."""
    lines = []
    for name, o in sorted(outcomes.items()):
        if o.state == "admitted":
            extra = f"; preempts {', '.join(o.preempts)}" if o.preempts else ""
            checks = f"; then waits for admission check(s) {', '.join(o.checks)}" if o.checks else ""
            lines.append(f"{name}: admitted, {o.count} pod(s) on {o.flavor}{extra}{checks}")
        else:
            lines.append(f"{name}: {o.state}: {o.message}")
    return "\n".join(lines)


def report(manifests: Sequence[Mapping[str, Any]]) -> str | None:
    """The queue's report for a plan with queued Jobs: each one's admission when they all arrive together, and the
    plan errors; None for a plan without a ClusterQueue."""
    if not any(m.get("kind") == "ClusterQueue" for m in manifests):
        return None
    lines = [render(admission(manifests))]
    lines += [f"ERROR {v}" for v in never_admitted(manifests)]
    return "\n".join(x for x in lines if x)



def _explained(name: str, o: Outcome, w: Workload | None) -> str:
    """One run's outcome in plain words, with the size an elastic run is admitted at when below its nodes."""
    if o.state == "admitted":
        size = f"{o.count} pod(s)"
        stays = ""
        if w is not None and o.count < w.count:
            size = f"{o.count} of {w.count} pod(s)"
            stays = (f"; elastic (minimum {w.min_count}): it stays at {o.count} pod(s), Kueue does not grow an "
                     "admitted Job")
        preempts = f"; preempts {', '.join(o.preempts)}" if o.preempts else ""
        checks = f"; then waits for admission check(s) {', '.join(o.checks)}" if o.checks else ""
        again = f"preempted by {o.preempted_by}, then admitted again, " if o.preempted_by else "admitted, "
        return f"{name}: {again}{size} on {o.flavor}{preempts}{checks}{stays}"
    if o.state == "preempted":
        return f"{name}: preempted by {o.preempted_by}, then waits: {o.message}"
    return f"{name}: waits: {o.message}"


def explain(manifests: Sequence[Mapping[str, Any]]) -> str | None:
    """For a plan with a queue, in plain lines: which run Kueue admits, which waits and why (Kueue's own reason),
    at what size an elastic run is admitted, and, for each run, what changes when it is already running as the
    others arrive (it is preempted by a higher priority where the queue allows it, or they wait for it). None for a
    plan without a ClusterQueue. The rules are Kueue's (:func:`schedule`)."""
    if not any(m.get("kind") == "ClusterQueue" for m in manifests):
        return None
    plan = read_plan(manifests)
    workloads = {w.name: w for w in (workload_of(j, i, plan.priorities) for i, j in enumerate(plan.jobs))}

    def lines(outcomes: Mapping[str, Outcome]) -> list[str]:
        return [f"  {_explained(n, outcomes[n], workloads.get(n))}" for n in sorted(outcomes)]

    def gist(outcomes: Mapping[str, Outcome]) -> dict[str, tuple]:
        return {n: (o.state, o.count, o.preempts) for n, o in outcomes.items()}

    together = admission(manifests)
    out = ["all runs arriving together (as one `pulumi up` creates them):", *lines(together)]
    for name in sorted(together):
        first = admission(manifests, running=[name])
        if first.get(name) is None or gist(first) == gist(together):
            continue
        out += [f"if {name} is already running, whole, when the others arrive:", *lines(first)]
    out += [f"ERROR {v}" for v in never_admitted(manifests)]
    return "\n".join(out)


def wiring(manifests: Sequence[Mapping[str, Any]], managed: Sequence[Mapping[str, Any]] | None,
           autoscaler: bool) -> list[str]:
    """What a program's queue wiring leaves a queued run to wait for in vain, as warnings: a queued Job in a
    namespace none of Kueue's ``managedJobsNamespaceSelector``s (``managed``, from its configuration; None: no Kueue
    seen in the program) selects, which Kueue never picks up (``KueueArgs.managed_namespaces``), and a ClusterQueue
    with admission checks (the ProvisioningRequest's all-or-nothing nodes) in a program without a cluster autoscaler,
    which alone answers them and starts the GPU nodes (and without which GPU groups at 0 nodes never start)."""
    plan = read_plan(manifests)
    if not plan.cluster_queues:
        return []
    out = []
    for i, job in enumerate(plan.jobs):
        w = workload_of(job, i, plan.priorities)
        if w.queue is None or managed is None:
            continue
        labels = {**plan.namespaces.get(w.namespace, {}), "kubernetes.io/metadata.name": w.namespace}
        if not any(_selects(s, labels) for s in managed):
            out.append(f"{w.subject}: in namespace {w.namespace!r}, which Kueue does not manage (its "
                       "managedJobsNamespaceSelector): Kueue never admits it and its Job stays suspended; expected "
                       f"{w.namespace!r} in KueueArgs.managed_namespaces")
    if not autoscaler:
        checks = sorted({name for cq in plan.cluster_queues.values() for name, _ in cq.checks})
        asks = (f"its admission check {', '.join(checks)} asks the cluster autoscaler for the GPU nodes "
                "(ProvisioningRequest), and " if checks else "")
        out.append(f"ClusterQueue: {asks}the program has no ClusterAutoscaler: GPU groups at 0 nodes never start, so "
                   "an admitted run's pods stay Pending; expected ClusterAutoscaler(ClusterAutoscalerArgs("
                   + ("provisioning_requests=True))" if checks else "...))"))
    return out
