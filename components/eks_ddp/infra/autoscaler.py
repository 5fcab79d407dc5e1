"""Cluster autoscaler: GPU nodes appear for Pending pods and leave after the run.

* The upstream Helm chart (kubernetes/autoscaler ``cluster-autoscaler``) and the autoscaler image,
  both pinned per Kubernetes minor version (:data:`PINS`): the image's minor matches the cluster's (it
  simulates the scheduler of its own minor version), and the chart's ClusterRole grants every list/watch
  that image makes before its first loop (from 1.35: the DRA resources), checked against the vendored
  chart RBAC in ``tests/fixtures/autoscaler``.
* Runs on the system nodes (nodeSelector), never on the GPU nodes it removes.
* Discovers node groups by the tags EKS puts on every managed group's Auto Scaling group
  (``k8s.io/cluster-autoscaler/enabled``, ``k8s.io/cluster-autoscaler/<cluster>``); scale from
  zero works through the node-template tags (``components/eks_ddp/core/scheduling.py``, ``gpu_nodegroup.py``).
* IRSA role of least privilege (:func:`iam_policy`): the read-only Describe calls on ``*`` (they
  take no resource ARNs), and the two mutating calls only on Auto Scaling groups tagged
  ``k8s.io/cluster-autoscaler/<cluster>: owned``, i.e. this cluster's managed node groups.
* ``scale-down-unneeded-time`` from config: how long a GPU node sits empty before it is removed.
* ProvisioningRequests (``provisioning_requests``, for Kueue's all-or-nothing admission check,
  ``components/eks_ddp/infra/kueue.py``): ``--enable-provisioning-requests=true`` (``config/flags/flags.go`` from 1.33,
  ``main.go`` in 1.32; every pinned image has it and handles both classes, ``check-capacity.autoscaling.x-k8s.io``
  and ``best-effort-atomic-scale-up.autoscaling.x-k8s.io``, ``provisioningrequest/supported_classes.go``), the
  ProvisioningRequest CRD (autoscaling.x-k8s.io, vendored in ``infra/crds``: :data:`PROVREQ_CRD_FILE`), and a
  ClusterRole of its own (:func:`provisioning_request_rules`): the charts pinned for 1.32-1.35 grant neither
  ``provisioningrequests`` nor ``podtemplates``, and the image blocks its start on both informers' cache sync
  (``provisioningrequest/provreqclient/client.go`` ``newPRsLister``/``newPodTemplatesLister``).
  On AWS "best-effort atomic" is atomic in the simulation only: the scale-up is asked for only if one node group
  can take every pod of the request within its max size and the cluster limits (``core/scaleup/orchestrator``
  ``allOrNothing``), but ``AwsNodeGroup.AtomicIncreaseSize`` is ``ErrNotImplemented``, so the executor falls back
  to a plain ``SetDesiredCapacity`` (``executor.go`` ``increaseSize``) and the request is marked Provisioned as soon
  as the desired size is raised, before EC2 has launched anything: instances EC2 cannot supply are not rolled back
  as a unit.

Reserved and capacity-block groups work the same way: the autoscaler raises their desired size
when pods are Pending, and the instances launch into the reservation/block; it removes them when
idle. Their capacity is billed anyway (reservation until its end, block up front), so removing
idle nodes saves nothing there but frees the reservation for other users of the account.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import yaml

from eks_ddp.core import k8s_versions, rules
from eks_ddp.infra.iam import irsa_trust_policy

CHART = "cluster-autoscaler"
CHART_REPO = "https://kubernetes.github.io/autoscaler"
IMAGE_REPOSITORY = "registry.k8s.io/autoscaling/cluster-autoscaler"


@dataclass(frozen=True, kw_only=True)
class AutoscalerPin:
    """The chart and image pinned for one Kubernetes minor version."""

    chart_version: str
    """cluster-autoscaler chart version: its ClusterRole must grant what the image lists and watches."""
    image_tag: str
    """Autoscaler image tag of the same minor as the cluster (it simulates that minor's scheduler)."""
    image_digest: str | None = None
    """The tag's digest (its multi-arch index) where one could be read from a public record, each cited where it is
    set; None: the tag alone is rendered, and preflight resolves it to a digest against registry.k8s.io before
    ``up`` and fails when it does not resolve (tooling/preflight/pins.py ``TAGGED``)."""

    @property
    def image_reference(self) -> str:
        """The chart's ``image.tag``: ``<tag>@<digest>`` where a digest is pinned, else the tag."""
        return f"{self.image_tag}@{self.image_digest}" if self.image_digest else self.image_tag


PINS: dict[str, AutoscalerPin] = {
    # Chart appVersion 1.32.0. DRA is off by default in 1.32-1.34 images, so no resource.k8s.io rule is needed.
    "1.32": AutoscalerPin(chart_version="9.46.6", image_tag="v1.32.7"),
    # Last chart of appVersion 1.33.0.
    "1.33": AutoscalerPin(chart_version="9.51.0", image_tag="v1.33.6"),
    # Chart appVersion 1.34.2.
    "1.34": AutoscalerPin(chart_version="9.53.0", image_tag="v1.34.5"),
    # From 1.35 the image locks --enable-dynamic-resource-allocation to true and waits for the
    # resource.k8s.io informers to sync before its first loop: the chart must grant list/watch on
    # resourceslices, deviceclasses and resourceclaims. 9.54.0 (appVersion 1.35.0) is the first that does.
    # Digest read from: not from registry.k8s.io by this project (no registry access where it is built), but from
    # third-party public pins of this tag that agree (a project's tool-pin decision record, which says its image
    # digests were resolved against the registry, and two of its cluster scripts pinning
    # registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.2@sha256:aac369dc...). preflight resolves it against
    # registry.k8s.io before every `up` and fails naming this pin if it does not (tooling/preflight/pins.py).
    "1.35": AutoscalerPin(chart_version="9.54.1", image_tag="v1.35.2",
                          image_digest="sha256:aac369dc283927a623deb1af54696efcc722ae79255aa07788422e495bab887d"),
    # No chart has appVersion 1.36 yet; the newest one grants everything the 1.36 image lists and watches
    # with eks-ddp's flags (tests/infra/test_autoscaler_rbac.py).
    # Digest read from: the same third-party decision record as 1.35's (one source, not the registry).
    # preflight resolves it against registry.k8s.io before every `up` and fails naming this pin if it does not.
    "1.36": AutoscalerPin(chart_version="9.59.0", image_tag="v1.36.1",
                          image_digest="sha256:461388d03eb5b55db58941ee7a81d9a619dd15302b01cbab9f5a9946715994b4"),
}
"""Kubernetes minor -> the autoscaler chart and image pinned for it."""
IMAGE_TAGS: dict[str, str] = {v: p.image_tag for v, p in PINS.items()}
"""Autoscaler release per Kubernetes minor version: the newest patch tag of kubernetes/autoscaler in
tests/fixtures/autoscaler/tags.txt (its snapshot of 2026-08-22; 1.33.6, 1.34.5, 1.35.2 and 1.36.1 were tagged
2026-07-22). tests/infra/test_autoscaler_tags.py fails when a pin falls behind that list."""
CHART_VERSIONS: dict[str, str] = {v: p.chart_version for v, p in PINS.items()}
"""Chart version per Kubernetes minor version."""
MAX_INACTIVITY = "5m"
"""``--max-inactivity``: /health-check (the chart's liveness probe) answers 500 once the main loop has
recorded no activity for this long, so a loop stuck after start is restarted (upstream default 10m).
The loop records activity every scan (10 s)."""
MAX_FAILING_TIME = "10m"
"""``--max-failing-time``: /health-check answers 500 once no loop has succeeded for this long (a loop
that fails every time, e.g. on AWS API errors, is restarted; upstream default 15m)."""
MAX_NODE_PROVISION_TIME = "25m"
"""``--max-node-provision-time``: p4de/p5 nodes can take longer than the default 15 min to boot and register their
devices. Kueue's ``waitForPodsReady`` timeout (``infra/kueue.py``) must lie above it."""
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"
# Requests measured from upstream's examples (100m / 300Mi for clusters of this size); the limit leaves room
# for a burst of Pending pods to simulate.
RESOURCES = {"requests": {"cpu": "100m", "memory": "300Mi"}, "limits": {"memory": "600Mi"}}

DESCRIBE_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeTags",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
)
"""Read-only calls from the autoscaler's AWS README (auto-discovery, launch templates) that take no resource ARN."""
NODEGROUP_ACTION = "eks:DescribeNodegroup"
"""Read of a managed group's labels and taints (scale from zero); it takes a node group ARN, so it is scoped."""
MUTATING_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")

PROVREQ_FLAG = "enable-provisioning-requests"
"""The autoscaler's switch for ProvisioningRequests (default false in every pinned image)."""
PROVREQ_CRD_FILE = Path(__file__).parent / "crds" / "autoscaling.x-k8s.io_provisioningrequests.yaml"
"""The ProvisioningRequest CRD, vendored from kubernetes/autoscaler ``cluster-autoscaler-1.36.1``
``cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml`` (v1 served and stored,
v1beta1 served; the v1 schema is the same at every pinned tag)."""
PROVREQ_CRD_NAME = "provisioningrequests.autoscaling.x-k8s.io"


def provisioning_request_crd() -> dict:
    """The vendored CRD manifest."""
    doc = yaml.safe_load(PROVREQ_CRD_FILE.read_text())
    if doc["metadata"]["name"] != PROVREQ_CRD_NAME:
        raise ValueError(f"{PROVREQ_CRD_FILE.name}: got CRD {doc['metadata']['name']!r}; expected {PROVREQ_CRD_NAME}")
    return dict(doc)


def provisioning_request_rules() -> list[dict]:
    """What the image does with ProvisioningRequests, read from its source at the pinned tags: it lists and
    watches ProvisioningRequests and PodTemplates (``provreqclient.NewProvisioningRequestClient``, which waits for
    both caches before the first loop), writes the requests' status (``UpdateStatus`` in 1.32, server-side apply
    of the status from 1.34: ``ApplyProvisioningRequest``) and deletes requests a week after they end
    (``processors/provreq`` ``DeleteOldProvReqs``). Nothing else: no create, and no write on PodTemplates (Kueue
    creates them)."""
    return [
        {"apiGroups": ["autoscaling.x-k8s.io"], "resources": ["provisioningrequests"],
         "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": ["autoscaling.x-k8s.io"], "resources": ["provisioningrequests/status"],
         "verbs": ["get", "update", "patch"]},
        {"apiGroups": [""], "resources": ["podtemplates"], "verbs": ["get", "list", "watch"]},
    ]


def pin(kubernetes_version: str) -> AutoscalerPin:
    """The autoscaler chart and image for a cluster's Kubernetes minor version."""
    try:
        return PINS[kubernetes_version]
    except KeyError:
        raise ValueError(f"kubernetes_version: got {kubernetes_version!r}; the cluster autoscaler is pinned for "
                         + ", ".join(PINS)) from None


def image_tag(kubernetes_version: str) -> str:
    """The autoscaler image tag for a cluster's Kubernetes minor version."""
    return pin(kubernetes_version).image_tag


def chart_version(kubernetes_version: str) -> str:
    """The autoscaler chart version for a cluster's Kubernetes minor version."""
    return pin(kubernetes_version).chart_version


def owner_tag(cluster_name: str) -> str:
    return f"k8s.io/cluster-autoscaler/{cluster_name}"


def partition(region: str) -> str:
    """The AWS partition of a region (ARNs name it)."""
    return rules.partition(region)


def iam_policy(cluster_name: str, region: str) -> dict:
    """Least privilege: describe what takes no ARN, read only this cluster's node groups, change only this
    cluster's Auto Scaling groups (by the owner tag)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "Describe", "Effect": "Allow", "Action": list(DESCRIBE_ACTIONS), "Resource": "*"},
        {"Sid": "DescribeOwnNodeGroups", "Effect": "Allow", "Action": [NODEGROUP_ACTION],
         "Resource": f"arn:{partition(region)}:eks:{region}:*:nodegroup/{cluster_name}/*/*"},
        {"Sid": "ScaleOwnNodeGroups", "Effect": "Allow", "Action": list(MUTATING_ACTIONS), "Resource": "*",
         "Condition": {"StringEquals": {f"aws:ResourceTag/{owner_tag(cluster_name)}": "owned"}}},
    ]}


@dataclass(frozen=True, kw_only=True)
class ClusterAutoscalerArgs:
    """Inputs of :class:`ClusterAutoscaler`."""

    cluster_name: str
    """EKS cluster name: the auto-discovery tag and the IAM condition name it."""
    region: str
    """AWS region of the cluster (the chart's ``awsRegion``)."""
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    node_selector: Mapping[str, str]
    """Labels of the system nodes."""
    kubernetes_version: str = k8s_versions.DEFAULT_VERSION
    """Cluster minor version, e.g. ``1.33``: picks the image tag. Default: ``EksClusterArgs``' default, so the two
    never drift when neither is set; pass ``EksCluster.kubernetes_version`` otherwise."""
    scale_down_unneeded_time: str = "10m"
    """How long a node must be unneeded before it is removed (Go duration)."""
    provisioning_requests: bool = False
    """Handle ProvisioningRequests (Kueue's all-or-nothing GPU admission check): the flag, the CRD and the RBAC.
    The CRD is :attr:`ClusterAutoscaler.provisioning_request_crd`; give it to ``KueueArgs`` so Kueue starts after
    it (its ProvisioningRequest controller starts only if the API exists when Kueue starts)."""


def validate(args: ClusterAutoscalerArgs) -> None:
    """Raise ValueError naming the bad field: the stack config's rules (cluster name, region, duration)."""
    rules.require(
        rules.known("cluster_name", args.cluster_name, "a string", "the IAM policy and the discovery tag name it")
        or rules.cluster_name("cluster_name", args.cluster_name),
        rules.known("region", args.region, "a region name", "it goes into the IAM policy and the chart values")
        or rules.region("region", args.region),
        rules.known("kubernetes_version", args.kubernetes_version, "a version string", "it picks the image")
        or (None if args.kubernetes_version in PINS else
            f"kubernetes_version: got {args.kubernetes_version!r}; expected one of {', '.join(PINS)} (the "
            "versions the cluster autoscaler is pinned for)"),
        rules.known("scale_down_unneeded_time", args.scale_down_unneeded_time, "a duration", "it goes into the "
                    "chart values") or rules.scale_down_time("scale_down_unneeded_time", args.scale_down_unneeded_time),
        rules.known("node_selector", args.node_selector, "a mapping of labels", "it goes into the chart values"),
        None if isinstance(args.provisioning_requests, bool) else
        f"provisioning_requests: got {args.provisioning_requests!r}; expected true or false")


def helm_values(args: ClusterAutoscalerArgs, role_arn: pulumi.Input[str]) -> dict:
    """The chart values (names from the chart's values.yaml)."""
    return {
        "cloudProvider": "aws",
        "awsRegion": args.region,
        "autoDiscovery": {"clusterName": args.cluster_name,
                          "tags": ["k8s.io/cluster-autoscaler/enabled", owner_tag(args.cluster_name)]},
        "image": {"repository": IMAGE_REPOSITORY, "tag": pin(args.kubernetes_version).image_reference},
        "rbac": {"serviceAccount": {"create": True, "name": SERVICE_ACCOUNT,
                                    "annotations": {"eks.amazonaws.com/role-arn": role_arn}}},
        "nodeSelector": dict(args.node_selector),
        "resources": RESOURCES,
        "extraArgs": {
            "scale-down-unneeded-time": args.scale_down_unneeded_time,
            # After a scale-up, scale-down waits this long; the same as unneeded-time, so a short run's nodes
            # leave the configured time after it, not a fixed 10 min after they came.
            "scale-down-delay-after-add": args.scale_down_unneeded_time,
            # Among groups that fit a Pending pod, the one wasting the least CPU/memory.
            "expander": "least-waste",
            "max-node-provision-time": MAX_NODE_PROVISION_TIME,
            # A main loop that stops recording activity or success turns /health-check red, and the chart's
            # liveness probe restarts the pod (metrics/liveness.go). It cannot see a start that never reaches
            # the loop (informer sync blocked by missing RBAC): PINS keeps the chart's RBAC matching the image.
            "max-inactivity": MAX_INACTIVITY,
            "max-failing-time": MAX_FAILING_TIME,
            **({PROVREQ_FLAG: "true"} if args.provisioning_requests else {}),
        },
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containerSecurityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                     "capabilities": {"drop": ["ALL"]}},
    }


class ClusterAutoscaler(pulumi.ComponentResource):
    """The cluster autoscaler Helm release with its IRSA role."""

    role_arn: pulumi.Output[str]
    provisioning_request_crd: k8s.apiextensions.v1.CustomResourceDefinition | None
    """The ProvisioningRequest CRD (None without ``provisioning_requests``)."""

    def __init__(self, name: str, args: ClusterAutoscalerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:autoscaler:ClusterAutoscaler", name, None, opts)
        validate(args)
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(
            f"{name}-role",
            description="Cluster autoscaler (IRSA): scales this cluster's node groups",
            assume_role_policy=pulumi.Output.all(args.oidc_provider_arn, args.oidc_provider_url).apply(
                lambda a: irsa_trust_policy(a[0], a[1], NAMESPACE, SERVICE_ACCOUNT)),
            opts=child)
        policy = aws.iam.RolePolicy(f"{name}-policy", role=role.id, policy=json.dumps(iam_policy(args.cluster_name, args.region)),
                                    opts=child)
        before: list[pulumi.Resource] = [policy]
        self.provisioning_request_crd = None
        if args.provisioning_requests:
            before += self._create_provisioning_requests(name)
        k8s.helm.v3.Release(
            f"{name}-release", name="cluster-autoscaler", chart=CHART, version=chart_version(args.kubernetes_version),
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=CHART_REPO), namespace=NAMESPACE,
            values=helm_values(args, role.arn), atomic=True,
            # The CRD and the grant first: the image waits for the ProvisioningRequest informer before its first loop.
            opts=pulumi.ResourceOptions(parent=self, depends_on=before))
        self.role_arn = role.arn
        self.register_outputs({"role_arn": self.role_arn})

    def _create_provisioning_requests(self, name: str) -> list[pulumi.Resource]:
        crd = provisioning_request_crd()
        child = pulumi.ResourceOptions(parent=self)
        self.provisioning_request_crd = k8s.apiextensions.v1.CustomResourceDefinition(
            f"{name}-provisioning-requests-crd", metadata={"name": crd["metadata"]["name"],
                                                         "annotations": crd["metadata"].get("annotations") or {}},
            spec=crd["spec"], opts=child)
        role = k8s.rbac.v1.ClusterRole(
            f"{name}-provisioning-requests", metadata={"name": "eks-ddp-cluster-autoscaler-provisioning-requests"},
            rules=provisioning_request_rules(), opts=child)
        binding = k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-provisioning-requests", metadata={"name": "eks-ddp-cluster-autoscaler-provisioning-requests"},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role.metadata.name},
            subjects=[{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}], opts=child)
        return [self.provisioning_request_crd, binding]
