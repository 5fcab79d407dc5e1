"""RunQueue: the Kueue objects every run of a stack is admitted through (Kueue v0.16.4, ``kueue.x-k8s.io/v1beta2``).

Built from the stack's GPU node groups (any object with ``NodeGroupLike``'s fields: a
:class:`~eks_ddp.infra.gpu_nodegroup.GpuNodeGroup`)::

    queue = RunQueue("queue", RunQueueArgs(namespace=ns.metadata.name, groups=[gpu_a, gpu_b]),
                     opts=pulumi.ResourceOptions(provider=k8s_provider, depends_on=[kueue]))
    ElasticJobArgs(..., placement=Placement.on(gpu_a), queue=queue.queued("high"))

It renders, as ``CustomResource`` objects (their CRDs come with Kueue itself, ``eks_ddp.Kueue``, a Helm release:
pulumi-kubernetes reads a release's CRDs at preview from 4.32.0 on, pulumi/pulumi-kubernetes#4417; before, a first
preview could not tell whether such a kind is namespaced. :data:`MIN_PULUMI_KUBERNETES` is checked in the tests):

- a ``ResourceFlavor`` ``gpu-<group>`` per group: the group's node label and taint. Kueue assigns a flavor only to a
  pod set that tolerates its ``nodeTaints`` (pkg/scheduler/flavorassigner/flavorassigner.go, checkFlavorForPodSets:
  FindMatchingUntoleratedTaint) and whose nodeSelector agrees with its ``nodeLabels`` (flavorSelector);
- the ``ClusterQueue`` ``eks-ddp``, admitting only the training namespace: one resource group covering ``cpu``,
  ``memory``, ``nvidia.com/gpu`` (and ``vpc.amazonaws.com/efa`` when a group has EFA), each flavor's quota what the
  group can hold (``max_size`` x one training pod's requests, ``pod_resources``: the function the Job's pods are sized
  with), so GPUs and nodes bind, never a rounding of cpu or memory. Every flavor lists every covered resource (the
  CRD's rule ``self.flavors.all(x, size(x.resources) == size(self.coveredResources))``): 0 EFA on a group without;
- with ``all_or_nothing``, the ``AdmissionCheck`` ``gpu-capacity`` (controller ``kueue.x-k8s.io/provisioning-request``)
  on every GPU flavor, with its ``ProvisioningRequestConfig`` ``gpu-atomic`` (class
  ``best-effort-atomic-scale-up.autoscaling.x-k8s.io``, managed resource ``nvidia.com/gpu``): a run is admitted only
  once the cluster autoscaler has provisioned nodes for all its admitted pods at once (the request's count is the
  admitted count: pkg/controller/admissionchecks/provisioning/controller.go, ``ptr.Deref(psa.Count, ps.Count)``),
  with an explicit ``retryStrategy`` (:data:`PROVISIONING_RETRY`, sized below) instead of the CRD's default of 3;
- the ``LocalQueue`` ``training`` in the namespace (what a Job's ``kueue.x-k8s.io/queue-name`` label names);
- ``WorkloadPriorityClass`` ``eks-ddp-low`` (100), ``eks-ddp-normal`` (1000), ``eks-ddp-high`` (10000).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.core import catalog, rules
from eks_ddp.core.types import Priority, QueuePreemption
from eks_ddp.workloads.elastic_job.args import NodeGroupLike, Queued
from eks_ddp.workloads.elastic_job.pods import EFA_RESOURCE, GPU_RESOURCE, pod_resources

MIN_PULUMI_KUBERNETES = (4, 32, 0)
"""The first pulumi-kubernetes whose preview resolves the scope of a kind a Helm release's CRDs bring."""

API_VERSION = "kueue.x-k8s.io/v1beta2"
"""Served and stored by every CRD of Kueue v0.16.4 this renders (config/components/crd/bases)."""
CLUSTER_QUEUE = "eks-ddp"
LOCAL_QUEUE = "training"
ADMISSION_CHECK = "gpu-capacity"
PROVISIONING_CONFIG = "gpu-atomic"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
ATOMIC_SCALE_UP = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
PROVISIONING_RETRY: Mapping[str, int] = {"backoffLimitCount": 10, "backoffBaseSeconds": 60, "backoffMaxSeconds": 600}
"""The ProvisioningRequestConfig's ``retryStrategy`` (CRD ``kueue.x-k8s.io_provisioningrequestconfigs.yaml`` at
v0.16.4: ``backoffLimitCount``, ``backoffBaseSeconds``, ``backoffMaxSeconds``; without it the default 3 / 60 / 1800).

What spends an attempt (kubernetes-sigs/kueue v0.16.4 ``pkg/controller/admissionchecks/provisioning/controller.go``
``syncCheckStates``): a request the autoscaler marks ``Failed``, and one whose booking expired before the workload
was admitted, become ``Retry`` while ``attempt <= backoffLimitCount``, else ``Rejected``; a Rejected check
deactivates the workload (``pkg/controller/core/workload_controller.go`` ``reconcileCheckBasedEviction``: Evicted
reason ``DeactivatedDueToAdmissionCheck``). ``CapacityRevoked`` is Rejected at once, whatever the budget.

Why these numbers. Waiting for EC2 spends nothing: the best-effort-atomic class only answers ``Provisioned=False``
("CA will try to find it later") and the autoscaler marks a request Failed after 7 days unprovisioned
(kubernetes/autoscaler ``processors/provreq/processor.go`` ``defaultExpirationTime``). What does spend attempts is a
run sent back to the queue after it was provisioned: a preemption (its last request is booking-expired by its next
quota reservation) and a ``waitForPodsReady`` requeue (``infra/kueue.py`` :data:`~eks_ddp.infra.kueue.PODS_READY`:
at most 3 per Workload, each after a 45-minute wait, so its request has expired too). 10 retries cover those 3
and 7 preemptions (``backoffLimitCount`` less ``PODS_READY_REQUEUES``: the number docs/day-two.md states,
tests/test_docs.py ties the two); the backoff before attempt n is 60 s x 2^(n-1), at most 10 minutes (the
review's figure: long enough not to churn the autoscaler, short beside a node's ~4 minutes to boot), 75 minutes
over all 10. The 11th such return deactivates the run: bounded, and reported as ``deactivated`` by ``eks-ddp
status`` with Kueue's reason (docs/day-two.md "A run Kueue deactivated")."""
PRIORITY_VALUES: Mapping[str, int] = {"low": 100, "normal": 1000, "high": 10000}
"""Each ``Priority``'s WorkloadPriorityClass value: the higher value is admitted first (and preempts, if allowed)."""
NODE_GROUP_LABEL = "eks-ddp/node-group"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}
"""The taint every GpuNodeGroup carries (eks_ddp/infra/gpu_nodegroup.py: GPU_TAINT_KEY, value "true")."""


def flavor_name(group: str) -> str:
    """The ResourceFlavor of node group ``group``."""
    return f"gpu-{group}"


def priority_class(priority: Priority) -> str:
    """The WorkloadPriorityClass a run of ``priority`` names (``kueue.x-k8s.io/priority-class``)."""
    return f"eks-ddp-{priority}"


def flavor_quota(group: NodeGroupLike, efa_covered: bool) -> dict[str, str]:
    """What node group ``group`` can hold, per covered resource: ``max_size`` x one training pod."""
    it = catalog.lookup(group.instance_type)
    cpu, memory, _ = pod_resources(it)
    n = group.max_size
    quota = {"cpu": str(n * cpu), "memory": f"{n * memory}Gi", GPU_RESOURCE: str(n * it.gpus)}
    if efa_covered:
        quota[EFA_RESOURCE] = str(n * it.efa_interfaces if group.efa else 0)
    return quota


class KueueObject(k8s.apiextensions.CustomResource):
    """A Kueue object at :data:`API_VERSION`: a ``CustomResource`` whose body may hold top-level fields besides
    ``spec`` (a WorkloadPriorityClass has ``value`` and ``description``, no spec)."""

    def __init__(self, resource_name: str, kind: str, metadata: k8s.meta.v1.ObjectMetaArgs, body: dict[str, Any],
                 opts: pulumi.ResourceOptions):
        # CustomResource.__init__ takes a spec only; its base registers the same type token and properties.
        pulumi.CustomResource.__init__(self, f"kubernetes:{API_VERSION}:{kind}", resource_name, {
            "apiVersion": API_VERSION, "kind": kind, "metadata": metadata, **body}, opts)


@dataclass(frozen=True, kw_only=True)
class RunQueueArgs:
    """Inputs of :class:`RunQueue`."""

    namespace: pulumi.Input[str]
    """The training namespace: the LocalQueue's, and the only one the ClusterQueue admits workloads from."""
    groups: Sequence[NodeGroupLike]
    """The GPU node groups (``GpuNodeGroup``s): a ResourceFlavor and a quota each, in this order."""
    preemption: QueuePreemption = "never"
    """'never', or 'lowerPriority': a pending run may evict admitted runs of lower priority
    (``preemption.withinClusterQueue: LowerPriority``)."""
    all_or_nothing: bool = True
    """Admit GPU work only through the ProvisioningRequest check (the cluster autoscaler must run with
    ``--enable-provisioning-requests`` and have the ProvisioningRequest CRD: ``ClusterAutoscalerArgs``)."""

    def __post_init__(self) -> None:
        names = [getattr(g, "group_name", None) for g in self.groups]
        rules.require(
            None if self.groups else "groups: got []; expected at least one GPU node group",
            None if len(set(names)) == len(names) else f"groups: got the names {names}; expected each group once",
            None if self.preemption in get_args(QueuePreemption) else
            f"preemption: got {self.preemption!r}; expected one of {', '.join(map(repr, get_args(QueuePreemption)))}",
            *(f"groups[{i}].instance_type: got {g.instance_type!r}; expected a GPU type of the catalog"
              for i, g in enumerate(self.groups) if catalog.CATALOG.get(g.instance_type) is None
              or catalog.lookup(g.instance_type).gpus < 1))


class RunQueue(pulumi.ComponentResource):
    """ResourceFlavors, ClusterQueue, LocalQueue, priority classes (and the provisioning check) for a stack's runs."""

    local_queue: str
    """The LocalQueue's name (a queued Job's ``kueue.x-k8s.io/queue-name``)."""
    quotas: dict[str, dict[str, str]]
    """Flavor name -> resource -> nominalQuota, as rendered."""

    def __init__(self, name: str, args: RunQueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:queue:RunQueue", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.args = a = args
        self.local_queue = LOCAL_QUEUE
        efa = any(g.efa for g in a.groups)
        self.quotas = {flavor_name(g.group_name): flavor_quota(g, efa) for g in a.groups}

        def cr(suffix: str, kind: str, obj_name: str, body: dict[str, Any], deps: list[pulumi.Resource] | None = None,
               namespace: pulumi.Input[str] | None = None) -> KueueObject:
            return KueueObject(f"{name}-{suffix}", kind, k8s.meta.v1.ObjectMetaArgs(
                name=obj_name, namespace=namespace, labels={"app.kubernetes.io/part-of": "eks-ddp"}), body,
                pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=deps or [])))

        flavors = [cr(f"flavor-{g.group_name}", "ResourceFlavor", flavor_name(g.group_name), {"spec": {
            "nodeLabels": {NODE_GROUP_LABEL: g.group_name}, "nodeTaints": [dict(GPU_TAINT)]}}) for g in a.groups]
        self.priority_classes = [cr(f"priority-{p}", "WorkloadPriorityClass", priority_class(p), {
            "value": PRIORITY_VALUES[p], "description": f"eks-ddp runs of priority {p}"}) for p in get_args(Priority)]
        deps: list[pulumi.Resource] = list(flavors)
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": a.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "LowerPriority" if a.preemption == "lowerPriority" else "Never"},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", GPU_RESOURCE, *([EFA_RESOURCE] if efa else [])],
                "flavors": [{"name": f, "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()]}
                            for f, quota in self.quotas.items()]}],
        }
        if a.all_or_nothing:
            config = cr("provisioning-config", "ProvisioningRequestConfig", PROVISIONING_CONFIG, {"spec": {
                "provisioningClassName": ATOMIC_SCALE_UP, "managedResources": [GPU_RESOURCE],
                "retryStrategy": dict(PROVISIONING_RETRY)}})
            check = cr("admission-check", "AdmissionCheck", ADMISSION_CHECK, {"spec": {
                "controllerName": PROVISIONING_CONTROLLER, "parameters": {
                    "apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": PROVISIONING_CONFIG}}},
                deps=[config])
            spec["admissionChecksStrategy"] = {"admissionChecks": [
                {"name": ADMISSION_CHECK, "onFlavors": list(self.quotas)}]}
            deps.append(check)
        self.cluster_queue = cr("cluster-queue", "ClusterQueue", CLUSTER_QUEUE, {"spec": spec}, deps=deps)
        self.local_queue_resource = cr("local-queue", "LocalQueue", LOCAL_QUEUE, {"spec": {
            "clusterQueue": CLUSTER_QUEUE}}, deps=[self.cluster_queue], namespace=a.namespace)
        self.register_outputs({"local_queue": self.local_queue, "quotas": self.quotas})

    @property
    def ready(self) -> list[pulumi.Resource]:
        """What a queued Job waits on: the LocalQueue (after the ClusterQueue, flavors, check) and the priorities."""
        return [self.local_queue_resource, *self.priority_classes]

    def queued(self, priority: Priority = "normal") -> Queued:
        """The ``ElasticJobArgs.queue`` part of a run of ``priority`` through this queue."""
        return Queued(local_queue=self.local_queue, priority_class=priority_class(priority))
