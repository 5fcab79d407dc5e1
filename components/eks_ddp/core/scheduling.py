"""What a zero-sized node group offers, and whether the cluster autoscaler would scale it up for a pod.

A managed node group at 0 nodes has no Node object to simulate a pod against. The cluster
autoscaler (AWS provider) then builds a *template node* from the Auto Scaling group: CPU,
memory and GPUs of the instance type, plus whatever the group's ``node-template`` tags say
(kubernetes/autoscaler ``cluster-autoscaler/cloudprovider/aws/README.md``):

* ``k8s.io/cluster-autoscaler/node-template/label/<name>: <value>``
* ``k8s.io/cluster-autoscaler/node-template/taint/<key>: <value>:<effect>``
* ``k8s.io/cluster-autoscaler/node-template/resources/<resource>: <quantity>``

Without the label tags a pod with our nodeSelector matches no template and the group is never
scaled up; without the taint tag the autoscaler would bring up GPU nodes for pods that then
cannot land there. :func:`node_template_tags` writes those tags for a GPU group, and
:func:`would_scale_up` replays the autoscaler's predicate checks (resources fit, taints
tolerated, nodeSelector and required node affinity matched) on a rendered pod spec against a
template built from them. Pure module: no Pulumi, no AWS.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from eks_ddp.core import catalog

N = TypeVar("N", int, float)

TAG_PREFIX = "k8s.io/cluster-autoscaler/"
LABEL_TAG = TAG_PREFIX + "node-template/label/"
TAINT_TAG = TAG_PREFIX + "node-template/taint/"
RESOURCE_TAG = TAG_PREFIX + "node-template/resources/"

# The GPU label the autoscaler's AWS provider knows (cloudprovider/aws: GPULabel). A node carrying it counts
# as a GPU node: the autoscaler treats it as not ready until nvidia.com/gpu appears on it, and uses the GPU
# utilization threshold for its scale-down.
AWS_GPU_LABEL = "k8s.amazonaws.com/accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# The root volume also holds the OS, the kubelet's state and the images: a pod may use what is left.
# The kubelet's default hard eviction threshold is nodefs.available<10 %.
EPHEMERAL_FRACTION = 0.9
MAX_PODS = 110  # the kubelet's default; the VPC CNI's per-type limit is higher on GPU types


def node_template_tags(*, labels: Mapping[str, str], taints: Sequence[tuple[str, str, str]],
                       instance_type: str, efa: bool, root_volume_gib: int) -> dict[str, str]:
    """ASG tags telling the autoscaler what a node of this GPU group will look like.

    ``taints`` are (key, value, Kubernetes effect such as ``NoSchedule``).
    """
    it = catalog.lookup(instance_type)
    tags = {LABEL_TAG + k: v for k, v in labels.items()}
    tags.update({TAINT_TAG + key: f"{value}:{effect}" for key, value, effect in taints})
    resources = {GPU_RESOURCE: str(it.gpus),
                 "ephemeral-storage": f"{int(root_volume_gib * EPHEMERAL_FRACTION)}Gi"}
    if efa:
        resources[EFA_RESOURCE] = str(it.efa_interfaces)
    tags.update({RESOURCE_TAG + k: v for k, v in resources.items()})
    return tags


# --- the template node ----------------------------------------------------------------------------

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3}


def quantity(value: Any) -> float:
    """A Kubernetes quantity (``500m``, ``2Gi``, ``4``) as a number."""
    text = str(value)
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if not m or (m.group(2) and m.group(2) not in _SUFFIX):
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    return float(m.group(1)) * _SUFFIX.get(m.group(2), 1)


@dataclass(frozen=True)
class TemplateNode:
    """A node as the autoscaler imagines it for a group at zero."""

    labels: dict[str, str]
    taints: tuple[tuple[str, str, str], ...]
    allocatable: dict[str, float]
    name: str = ""

    @classmethod
    def from_tags(cls, tags: Mapping[str, str], instance_type: str, *, name: str = "") -> TemplateNode:
        """The template of an ASG with these tags and instance type (what the AWS provider builds)."""
        it = catalog.lookup(instance_type)
        labels = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "node.kubernetes.io/instance-type": it.name}
        allocatable = {"cpu": float(it.vcpus), "memory": float(it.memory_gib * 2**30), "pods": float(MAX_PODS),
                       GPU_RESOURCE: float(it.gpus)}
        taints = []
        for key, value in tags.items():
            if key.startswith(LABEL_TAG):
                labels[key[len(LABEL_TAG):]] = value
            elif key.startswith(TAINT_TAG):
                taint_value, _, effect = value.rpartition(":")
                taints.append((key[len(TAINT_TAG):], taint_value, effect))
            elif key.startswith(RESOURCE_TAG):
                allocatable[key[len(RESOURCE_TAG):]] = quantity(value)
        return cls(labels=labels, taints=tuple(taints), allocatable=allocatable, name=name)


@dataclass(frozen=True)
class Decision:
    """Whether the autoscaler would scale the group up for the pod, and every reason it would not."""

    fits: bool
    reasons: tuple[str, ...] = field(default=())

    def __bool__(self) -> bool:
        return self.fits


@overload
def pod_requests(spec: Mapping[str, Any]) -> dict[str, float]: ...
@overload
def pod_requests(spec: Mapping[str, Any], value: Callable[[str, Any], N]) -> dict[str, N]: ...


def pod_requests(spec: Mapping[str, Any], value: Callable[[str, Any], Any] | None = None) -> dict[str, Any]:
    """Effective requests of a pod (k8s component-helpers ``PodRequests``): the sum over containers, at least the
    largest init container's, plus the pod's ``overhead``; a resource with only a limit requests its limit (the API
    server defaults it so). ``value(name, quantity)`` turns an amount into a number: a float by default, Kueue's
    integer units for the queue contract (tooling/contracts/queue.py ``resource_value``)."""
    amount_of = value or (lambda _name, v: quantity(v))

    def one(container: Mapping[str, Any]) -> dict[str, Any]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: amount_of(k, v) for k, v in merged.items()}

    total: dict[str, Any] = {}
    for c in spec.get("containers") or []:
        for k, v in one(c).items():
            total[k] = total[k] + v if k in total else v
    for c in spec.get("initContainers") or []:
        for k, v in one(c).items():
            total[k] = max(total[k], v) if k in total else v
    for k, v in (spec.get("overhead") or {}).items():
        amount = amount_of(k, v)
        total[k] = total[k] + amount if k in total else amount
    return total


def toleration_matches(toleration: Mapping[str, Any], key: str, value: str, effect: str) -> bool:
    """``v1.Toleration.ToleratesTaint``: effect (empty: all), key (empty: all), then ``Exists``, or ``Equal`` (the
    default) comparing the values."""
    if toleration.get("effect") and toleration["effect"] != effect:
        return False
    if toleration.get("key") and toleration["key"] != key:
        return False
    op = toleration.get("operator") or "Equal"
    return op == "Exists" or (op == "Equal" and str(toleration.get("value") or "") == (value or ""))


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: tuple[str, str, str]) -> bool:
    return any(toleration_matches(t, *taint) for t in tolerations or [])


def expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A node selector requirement against a node's labels (k8s ``labels.Requirement.Matches``): ``Gt``/``Lt`` need
    an integer label value (anything else does not match); an operator the API does not know matches nothing (the
    selector fails to build: ``NodeSelectorRequirementsAsSelector``)."""
    key, op, values = str(expr.get("key")), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _required_terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or [])


def would_scale_up(spec: Mapping[str, Any], node: TemplateNode) -> Decision:
    """Would the autoscaler pick ``node``'s group for a Pending pod with this (rendered) pod ``spec``?

    The checks the autoscaler's scheduler simulation runs on a template node: resources fit
    (``NodeResourcesFit``), taints with NoSchedule/NoExecute tolerated (``TaintToleration``),
    ``nodeSelector`` and required node affinity matched (``NodeAffinity``). Pod (anti-)affinity is
    not checked: on an empty group it never blocks the first node.
    """
    reasons = []
    for k, v in pod_requests(spec).items():
        have = node.allocatable.get(k, 0.0)
        if v > have:
            reasons.append(f"requests {k}={v:g}, the template offers {have:g}")
    for taint in node.taints:
        if taint[2] in ("NoSchedule", "NoExecute") and not tolerates(spec.get("tolerations") or [], taint):
            reasons.append(f"does not tolerate taint {taint[0]}={taint[1]}:{taint[2]}")
    for k, v in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(k) != v:
            reasons.append(f"nodeSelector {k}={v}: the template has {node.labels.get(k)!r}")
    terms = _required_terms(spec)
    if terms and not any(all(expression_matches(e, node.labels) for e in t.get("matchExpressions") or [])
                         for t in terms):
        reasons.append("no required node affinity term matches the template's labels")
    return Decision(fits=not reasons, reasons=tuple(reasons))


# --- what must fit on the system nodes --------------------------------------------------------------

# Pods of the EKS-managed add-ons that run on the system nodes, with their default requests (from each
# add-on's default manifest); the stack's own system pods (etcd, autoscaler, data prep) are read from the
# rendered program instead. The device plugins are DaemonSets on the GPU nodes only and do not count.
SYSTEM_ADDON_PODS: dict[str, tuple[int, dict[str, str]]] = {
    "coredns": (2, {"cpu": "100m", "memory": "70Mi"}),
    "metrics-server": (2, {"cpu": "100m", "memory": "200Mi"}),
    "efs-csi-controller": (2, {"cpu": "120m", "memory": "168Mi"}),  # efs-plugin + provisioner + liveness probe
    "aws-node (DaemonSet)": (1, {"cpu": "25m", "memory": "0"}),
    "kube-proxy (DaemonSet)": (1, {"cpu": "100m", "memory": "0"}),
    "efs-csi-node (DaemonSet)": (1, {"cpu": "100m", "memory": "128Mi"}),
    # observability.cloudwatch and observability.nodeRepair (both on by default): the chart defaults of the
    # amazon-cloudwatch-observability add-on (aws-observability/helm-charts 6.4.0 values.yaml: manager, agent,
    # containerLogs.fluentBit) and of eks-node-monitoring-agent 1.7.0 (nodeAgent); the agent's CPU request is the
    # one eks_ddp.infra.observability configures (AGENT_CPU_REQUEST), not the chart's 250m.
    "amazon-cloudwatch-observability-controller-manager": (1, {"cpu": "100m", "memory": "64Mi"}),
    "cloudwatch-agent (DaemonSet)": (1, {"cpu": "100m", "memory": "128Mi"}),
    "fluent-bit (DaemonSet)": (1, {"cpu": "50m", "memory": "25Mi"}),
    "eks-node-monitoring-agent (DaemonSet)": (1, {"cpu": "10m", "memory": "30Mi"}),
}
"""name -> (pods per cluster, requests per pod); a DaemonSet counts once per node."""

# Pods per node the VPC CNI allows (EKS eni-max-pods.txt), for the CPU types of the catalog.
ENI_MAX_PODS = {"t3.medium": 17, "t3.large": 35, "t3.xlarge": 58, "m6i.large": 29, "m6i.xlarge": 58,
                "m7i.large": 29, "m7i.xlarge": 58, "c6i.xlarge": 58}


def eks_allocatable(instance_type: str) -> dict[str, float]:
    """Allocatable CPU (cores), memory (bytes) and pods of an EKS AL2023 node (nodeadm's reservations):
    kube-reserved CPU 6 % of the first core, 1 % of the second, 0.5 % of cores 3-4, 0.25 % above; memory
    255 MiB + 11 MiB per pod; eviction threshold 100 MiB."""
    it = catalog.lookup(instance_type)
    pods = ENI_MAX_PODS.get(instance_type, MAX_PODS)
    cores = it.vcpus
    reserved_cpu = 0.06 + 0.01 * (cores >= 2) + 0.005 * max(0, min(cores, 4) - 2) + 0.0025 * max(0, cores - 4)
    reserved_mem = (255 + 11 * pods + 100) * 2**20
    # The kernel reports ~5 % less memory than the nominal size (firmware, kernel reservations).
    return {"cpu": cores - reserved_cpu, "memory": 0.95 * it.memory_gib * 2**30 - reserved_mem, "pods": float(pods)}


def system_load(stack_pods: Mapping[str, Mapping[str, float]], node_count: int) -> dict[str, float]:
    """Summed requests of everything that runs on the system nodes: the add-ons above (DaemonSets once per
    node) plus ``stack_pods`` (name -> requests, e.g. from :func:`pod_requests` of the rendered pods)."""
    total = {"cpu": 0.0, "memory": 0.0, "pods": 0.0}
    for name, (count, requests) in SYSTEM_ADDON_PODS.items():
        n = node_count if "DaemonSet" in name else count
        for k, v in requests.items():
            total[k] += n * quantity(v)
        total["pods"] += n
    for pod in stack_pods.values():
        for k in ("cpu", "memory"):
            total[k] += pod.get(k, 0.0)
        total["pods"] += 1
    return total
