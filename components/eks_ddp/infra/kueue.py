"""Kueue: the job queueing controller that admits a suspended training Job when its quota (and GPU capacity) is there.

* The upstream chart ``kueue`` :data:`CHART_VERSION` from its OCI registry (:data:`CHART`; kubernetes-sigs/kueue
  ``charts/kueue/README.md`` at v0.16.4), installed with ``k8s.helm.v3.Release`` like the stack's other charts
  (pulumi-kubernetes takes an ``oci://`` chart reference with no repository). The controller image is pinned by
  digest: the chart renders ``"<repository>:<tag>"`` (``templates/manager/manager.yaml``), so the tag
  ``v0.16.4@sha256:...`` renders ``registry.k8s.io/kueue/kueue:v0.16.4@sha256:...``, which the kubelet pulls by the
  digest. The chart's other images (KueueViz backend/frontend) are rendered only with ``enableKueueViz`` (off,
  ``templates/kueueviz/*``); cert-manager and Prometheus objects stay off too (Kueue manages its own webhook
  certificate: the chart adds ``internalCertManagement`` to the config, ``templates/manager/manager-config.yaml``).
* On the system nodes: ``controllerManager.nodeSelector``/``tolerations`` from the args.
* Its own namespace :data:`NAMESPACE`, created here with Pod Security 'restricted' enforced. The chart's pod already
  satisfies it (``values.yaml`` ``controllerManager.manager.podSecurityContext``: runAsNonRoot, seccomp
  RuntimeDefault; ``containerSecurityContext``: no privilege escalation, drop ALL, read-only root), and
  :func:`helm_values` sets the same explicitly (with the image's own uid 65532) so a chart default that changes
  cannot loosen it. Scanned with checkov, the chart's Deployment fails only CKV_K8S_38 (service-account token
  mounted): the controller is an API client and needs it.
* The manager configuration (:func:`manager_config`, the chart's ``managerConfig.controllerManagerConfigYaml``):
  only the ``batch/job`` integration; ``manageJobsWithoutQueueName: false`` (a Job without the queue label is never
  touched); ``managedJobsNamespaceSelector`` naming the managed namespaces, which the chart also copies into its
  Job webhooks' ``namespaceSelector`` (``templates/webhook/manifests.yaml``), so Jobs elsewhere (kube-system, other
  charts' hook Jobs) never go through Kueue's webhooks. ProvisioningRequest support needs no feature gate in
  v0.16.4 (``pkg/features/kube_features.go`` has none): ``cmd/kueue/main.go`` starts the provisioning admission
  check controller only if the ``autoscaling.x-k8s.io/v1`` ProvisioningRequest API exists when Kueue starts
  (``ServerSupportsProvisioningRequest``, a REST mapping lookup), else logs "Skipping provisioning controller
  setup" and never retries. Hence ``provisioning_request_crd``: the release depends on the CRD, and a pod annotation
  that names it rolls the controller when it appears later.
* ``waitForPodsReady`` (:data:`PODS_READY`), on by default, because under the ProvisioningRequest check nothing
  else gives an admitted run its missing nodes. Once the request is Provisioned, Kueue writes
  ``autoscaling.x-k8s.io/consume-provisioning-request`` into the Job's pod template (kubernetes-sigs/kueue v0.16.4
  ``pkg/controller/admissionchecks/provisioning/controller.go`` ``podSetUpdates``, merged by
  ``pkg/controller/jobframework/reconciler.go`` through ``podset.FromUpdate``), so every later pod carries it,
  replacements included, and the cluster autoscaler never scales up for such a pod (kubernetes/autoscaler
  ``cluster-autoscaler/processors/provreq/pods_filter.go`` ``ProvisioningRequestPodsFilter``: "didn't trigger
  scale-up, because it's consuming ProvisioningRequest"). On AWS, Provisioned only means the group's desired size
  was raised; instances EC2 does not deliver are dropped from it again. With the timeout, a run whose pods are not
  all Ready :data:`PODS_READY_TIMEOUT` after admission (nodes never delivered), or not again that long after one
  went away (``recoveryTimeout``: a node lost and not replaced), is evicted (reason ``PodsReadyTimeout``): its pods
  go, the nodes that came scale down, and it queues again for a fresh ProvisioningRequest for the whole run
  (``pkg/controller/core/workload_controller.go`` ``reconcileNotReadyTimeout``). Requeues are bounded
  (``requeuingStrategy.backoffLimitCount`` :data:`PODS_READY_REQUEUES`; Kueue never resets the count during a
  Workload's life, ``pkg/workload/workload.go`` ``UpdateRequeueState``): one more deactivates the run (reason
  ``DeactivatedDueToRequeuingLimitExceeded``). The tooling contract ``replacements``
  (``tooling/contracts/replacements.py``) reports a plan that queues GPU runs through the check without this path.
  Kueue decodes this configuration strictly (``pkg/config/config.go``: ``serializer.EnableStrict``): a misspelt
  field stops the controller; tests/infra/test_kueue.py checks every field against the vendored Go types.
* Webhooks: Kueue's mutating/validating webhooks are called by the EKS control plane, whose ENIs sit in the VPC's
  subnets; they have ``failurePolicy: Fail`` (the chart's, kept). While the controller is down, creating a Job in a
  managed namespace is refused by the API server ("failed calling webhook mjob.kb.io"), and so is any change to a
  ClusterQueue, LocalQueue, ResourceFlavor or Workload; Jobs in other namespaces are not affected (the selector
  above), and Jobs that already exist keep running (webhooks act on requests, not on objects). ``pulumi up`` of a
  run while Kueue is down fails at the Job and succeeds on the next ``up``.
* NetworkPolicies (:func:`policies`): the namespace's default deny both ways, and the controller's pods may receive
  from the VPC (the control plane) on the webhook port (9443) and the visibility API port (8082, the chart's
  APIService ``v1beta2.visibility.kueue.x-k8s.io`` the aggregator calls), and send to the API server (TCP 443 to
  the ``kubernetes`` Service's ClusterIP and to the control plane's ENIs in the VPC) and to the cluster DNS. Its
  metrics port (8443) gets no ingress: nothing in the stack scrapes it. Kubelet probes (8081) come from the node's
  IP, which the VPC CNI's policy agent always admits (aws/aws-network-policy-agent #65). The network contract
  rebuilds the chart's pods (``tooling/contracts/charts.py`` ``kueue``) to judge these.

The Kubernetes provider comes from ``opts``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
import yaml

from eks_ddp.core import rules
from eks_ddp.infra.autoscaler import MAX_NODE_PROVISION_TIME, PROVREQ_CRD_NAME

CHART = "oci://registry.k8s.io/kueue/charts/kueue"
"""Where Kueue publishes its chart (``charts/kueue/README.md``: ``helm install kueue oci://registry.k8s.io/kueue/charts/kueue``)."""
CHART_VERSION = "0.16.4"
RELEASE = "kueue"
"""The release name: the chart's ``kueue.fullname`` is then ``kueue`` (it contains the chart name), so the objects are
``kueue-controller-manager``, ``kueue-webhook-service`` ... and Kueue's default webhook service/secret names match."""
NAMESPACE = "kueue-system"
IMAGE_REPOSITORY = "registry.k8s.io/kueue/kueue"
IMAGE_DIGEST = "sha256:dd67ad37e1f960277cfada27d3a144b73c8edcf7ad679ad62eb723262b4d793d"
"""The controller image ``registry.k8s.io/kueue/kueue:v0.16.4``. Read from Kueue's release record:
kubernetes-sigs/kueue issue #9949 (the v0.16.4 release checklist), comment of 2026-03-19 (issuecomment-4091701278)
quoting ``hack/releasing/wait_for_images.sh --prod v0.16.4``: "Image registry.k8s.io/kueue/kueue@sha256:dd67ad37...
is available". preflight resolves it against registry.k8s.io before every ``up`` and fails naming this constant if it
does not (tooling/preflight/pins.py)."""
IMAGE_TAG = f"v{CHART_VERSION}@{IMAGE_DIGEST}"
"""The chart's ``controllerManager.manager.image.tag``: rendered after ``<repository>:``."""
WEBHOOK_PORT = 9443
VISIBILITY_PORT = 8082
METRICS_PORT = 8443
HEALTH_PORT = 8081
RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
"""What the controller reserves on a system node. The chart's values.yaml asks 500m CPU and 512Mi (limits 2 CPU,
512Mi), sized for clusters with many queues and thousands of Workloads; the stack has one ClusterQueue and a run's
few Jobs, so it reserves 100m and 256Mi and keeps the chart's 512Mi memory ceiling. With 500m, the dev stack's single
t3.medium could not hold it beside the rest (tooling/cost.py ``system_nodes_needed``; tests/tooling/test_cost.py)."""
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}
"""The same labels as the training namespace (``workloads/namespace.py``, which infra may not import)."""
EKS_SERVICE_CIDRS = ("10.100.0.0/16", "172.20.0.0/16")
"""Where EKS puts ClusterIPs (the ``kubernetes`` Service's among them) when the cluster names no service CIDR."""
KUBE_DNS_LABELS = {"k8s-app": "kube-dns"}
KUEUE_UID = 65532
"""The image's own user (kueue ``Dockerfile``: ``USER 65532:65532``), set explicitly: a high uid (checkov CKV_K8S_40)."""
PROVREQ_ANNOTATION = "eks-ddp/provisioning-request-crd"
"""Pod annotation naming the ProvisioningRequest CRD Kueue started with: it changes when the CRD comes or goes, so the
controller restarts and (re)decides whether to run its provisioning admission check."""
FRAMEWORKS = ("batch/job",)
PODS_READY_TIMEOUT = "45m"
"""``waitForPodsReady.timeout`` (and ``recoveryTimeout``): above the autoscaler's ``max-node-provision-time``
(:data:`~eks_ddp.infra.autoscaler.MAX_NODE_PROVISION_TIME`, 25m) plus a multi-GB image pull on a fresh node and the
fabric check (the training pods' init container: a pod is not Ready before it passed), so a run whose nodes are
only slow is never requeued; short enough that the nodes of a run that got too few bill at
most this long per attempt."""
PODS_READY_MIN_MINUTES = 35
"""The shortest timeout allowed: ``max-node-provision-time`` plus 10 minutes for the image."""
PODS_READY_REQUEUES = 3
"""``requeuingStrategy.backoffLimitCount``: a run is requeued for its pods' readiness at most this often in its
Workload's life (each costs one ProvisioningRequest attempt, ``workloads/queue.py`` ``PROVISIONING_RETRY``)."""
PODS_READY_BACKOFF = {"backoffBaseSeconds": 60, "backoffMaxSeconds": 600}
"""The requeue's backoff: 60 s x 2^(n-1), at most 10 minutes (Kueue's defaults are 60 s and 3600 s)."""


def pods_ready(timeout: str, requeues: int) -> dict:
    """Kueue's ``waitForPodsReady`` (config.kueue.x-k8s.io/v1beta2 ``WaitForPodsReady`` and ``RequeuingStrategy``,
    ``apis/config/v1beta2/configuration_types.go`` at v0.16.4)."""
    return {"timeout": timeout, "blockAdmission": False, "recoveryTimeout": timeout,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffLimitCount": requeues, **PODS_READY_BACKOFF}}


PODS_READY = pods_ready(PODS_READY_TIMEOUT, PODS_READY_REQUEUES)
"""The stack's ``waitForPodsReady`` (module docstring)."""


def selector_labels() -> dict[str, str]:
    """The controller pods' labels (the chart's ``kueue.selectorLabels`` for release :data:`RELEASE`)."""
    return {"app.kubernetes.io/name": "kueue", "app.kubernetes.io/instance": RELEASE,
            "control-plane": "controller-manager"}


@dataclass(frozen=True, kw_only=True)
class KueueArgs:
    """Inputs of :class:`Kueue`."""

    node_selector: Mapping[str, str]
    """Labels of the system nodes (``EksCluster.system_node_labels``)."""
    managed_namespaces: Sequence[str]
    """Namespaces whose Jobs Kueue manages (the training namespace): its Job webhooks see only these."""
    vpc_cidrs: Sequence[str]
    """The VPC's CIDRs: the control plane's ENIs (which call the webhooks and serve the API) have addresses there."""
    tolerations: Sequence[Mapping[str, str]] = ()
    """Tolerations for the system nodes' taints, if they have any (the stack's system nodes have none)."""
    service_cidrs: Sequence[str] = EKS_SERVICE_CIDRS
    """Where the ``kubernetes`` Service's ClusterIP lies (EKS's defaults unless the cluster names its own)."""
    provisioning_request_crd: pulumi.Resource | None = None
    """The ProvisioningRequest CRD (``ClusterAutoscaler.provisioning_request_crd``): Kueue starts after it, so its
    ProvisioningRequest admission check controller runs. None: no all-or-nothing admission check."""
    depends_on: Sequence[pulumi.Resource] = ()
    """Anything else the release must wait for (the system node group)."""
    pods_ready_timeout: str | None = PODS_READY_TIMEOUT
    """Kueue's ``waitForPodsReady.timeout`` and ``recoveryTimeout`` (Go duration, at least
    :data:`PODS_READY_MIN_MINUTES` minutes), or None: off, and then an admitted run never gets back a node it did
    not receive or lost (module docstring)."""
    pods_ready_requeues: int = PODS_READY_REQUEUES
    """How often a run may be requeued for its pods' readiness before Kueue deactivates it (0 to 10)."""


def validate(args: KueueArgs) -> None:
    """Raise ValueError naming the bad field."""
    problems: list[str | None] = [
        rules.known("node_selector", args.node_selector, "a mapping of labels", "it goes into the chart values"),
        None if args.managed_namespaces and all(isinstance(n, str) and n for n in args.managed_namespaces) else
        f"managed_namespaces: got {args.managed_namespaces!r}; expected at least one namespace name",
        None if args.vpc_cidrs else "vpc_cidrs: got none; expected the VPC's CIDRs (the control plane calls the "
                                    "webhooks from there)",
        *[rules.ipv4_cidr("vpc_cidrs", c) for c in args.vpc_cidrs],
        *[rules.ipv4_cidr("service_cidrs", c) for c in args.service_cidrs],
        None if args.pods_ready_timeout is None else rules.scale_down_time("pods_ready_timeout",
                                                                           args.pods_ready_timeout) or (
            None if rules.duration_minutes(args.pods_ready_timeout) >= PODS_READY_MIN_MINUTES else
            f"pods_ready_timeout: got {args.pods_ready_timeout!r}; expected at least {PODS_READY_MIN_MINUTES}m (the "
            f"autoscaler's max-node-provision-time {MAX_NODE_PROVISION_TIME} plus an image pull): a shorter one "
            "requeues runs whose nodes are only still booting"),
        None if isinstance(args.pods_ready_requeues, int) and not isinstance(args.pods_ready_requeues, bool) and
        0 <= args.pods_ready_requeues <= 10 else
        f"pods_ready_requeues: got {args.pods_ready_requeues!r}; expected an integer from 0 to 10",
        *[None if isinstance(t, Mapping) and t.get("operator", "Equal") in ("Equal", "Exists") else
          f"tolerations: got {t!r}; expected a mapping with key/operator (Equal|Exists)/value/effect"
          for t in args.tolerations],
    ]
    rules.require(*problems)


def manager_config(args: KueueArgs) -> dict:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2, ``apis/config/v1beta2/configuration_types.go``): the
    chart's default without the integrations eks-ddp does not use, and with the Job webhooks scoped."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f":{HEALTH_PORT}"},
        "metrics": {"bindAddress": f":{METRICS_PORT}"},
        "webhook": {"port": WEBHOOK_PORT},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {"groupKindConcurrency": {
            "Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 5, "LocalQueue.kueue.x-k8s.io": 1,
            "ClusterQueue.kueue.x-k8s.io": 1, "ResourceFlavor.kueue.x-k8s.io": 1}},
        "clientConnection": {"qps": 50, "burst": 100},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(args.managed_namespaces)}]},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        **({"waitForPodsReady": pods_ready(args.pods_ready_timeout, args.pods_ready_requeues)}
           if args.pods_ready_timeout else {}),
    }


def helm_values(args: KueueArgs, crd_name: str | None = None) -> dict:
    """The chart values (names from ``charts/kueue/values.yaml`` at v0.16.4)."""
    return {
        "enableKueueViz": False,
        "enableCertManager": False,
        "enablePrometheus": False,
        "enableVisibilityAPF": False,
        "controllerManager": {
            "replicas": 1,
            "manager": {
                "image": {"repository": IMAGE_REPOSITORY, "tag": IMAGE_TAG, "pullPolicy": "IfNotPresent"},
                "resources": RESOURCES,
                "podAnnotations": {PROVREQ_ANNOTATION: crd_name or "none"},
                "podSecurityContext": {"runAsNonRoot": True, "runAsUser": KUEUE_UID, "runAsGroup": KUEUE_UID,
                                       "seccompProfile": {"type": "RuntimeDefault"}},
                "containerSecurityContext": {"runAsNonRoot": True, "runAsUser": KUEUE_UID,
                                             "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                             "capabilities": {"drop": ["ALL"]}},
            },
            "nodeSelector": dict(args.node_selector),
            "tolerations": [dict(t) for t in args.tolerations],
        },
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_config(args), sort_keys=False)},
    }


def policies(args: KueueArgs) -> dict[str, k8s.networking.v1.NetworkPolicySpecArgs]:
    """Policy name -> spec: the namespace's default deny and what the controller needs (module docstring)."""
    net, meta = k8s.networking.v1, k8s.meta.v1
    tcp = lambda port: net.NetworkPolicyPortArgs(port=port, protocol="TCP")  # noqa: E731
    vpc = [net.NetworkPolicyPeerArgs(ip_block=net.IPBlockArgs(cidr=c)) for c in args.vpc_cidrs]
    api = [net.NetworkPolicyPeerArgs(ip_block=net.IPBlockArgs(cidr=c)) for c in (*args.service_cidrs, *args.vpc_cidrs)]
    dns = net.NetworkPolicyEgressRuleArgs(
        to=[net.NetworkPolicyPeerArgs(
            namespace_selector=meta.LabelSelectorArgs(match_labels={"kubernetes.io/metadata.name": "kube-system"}),
            pod_selector=meta.LabelSelectorArgs(match_labels=dict(KUBE_DNS_LABELS)))],
        ports=[net.NetworkPolicyPortArgs(port=53, protocol="UDP"), tcp(53)])
    return {
        "default-deny": net.NetworkPolicySpecArgs(pod_selector=meta.LabelSelectorArgs(),
                                                  policy_types=["Ingress", "Egress"]),
        "kueue-controller": net.NetworkPolicySpecArgs(
            pod_selector=meta.LabelSelectorArgs(match_labels=selector_labels()),
            policy_types=["Ingress", "Egress"],
            ingress=[net.NetworkPolicyIngressRuleArgs(from_=vpc, ports=[tcp(WEBHOOK_PORT), tcp(VISIBILITY_PORT)])],
            egress=[net.NetworkPolicyEgressRuleArgs(to=api, ports=[tcp(443)]), dns]),
    }


class Kueue(pulumi.ComponentResource):
    """Kueue's namespace, NetworkPolicies and Helm release."""

    namespace: str
    """The namespace Kueue runs in."""
    release: k8s.helm.v3.Release
    """The Helm release: it installs Kueue's CRDs and waits for the controller (webhooks serving), so the queue
    objects and queued Jobs depend on it (and ``pulumi destroy`` removes them before Kueue)."""

    def __init__(self, name: str, args: KueueArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:kueue:Kueue", name, None, opts)
        validate(args)
        child = pulumi.ResourceOptions(parent=self)
        ns = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=NAMESPACE, labels={
                **POD_SECURITY_LABELS, "kubernetes.io/metadata.name": NAMESPACE}),
            opts=child)
        made = [k8s.networking.v1.NetworkPolicy(
            f"{name}-{policy}", metadata=k8s.meta.v1.ObjectMetaArgs(name=policy, namespace=NAMESPACE), spec=spec,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ns])) for policy, spec in policies(args).items()]
        crd = args.provisioning_request_crd
        crd_name = PROVREQ_CRD_NAME if crd is not None else None
        self.release = k8s.helm.v3.Release(
            f"{name}-release", name=RELEASE, chart=CHART, version=CHART_VERSION, namespace=NAMESPACE,
            values=helm_values(args, crd_name), atomic=True,
            # The policies first: the controller never runs unisolated; the CRD first: see the module docstring.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[
                ns, *made, *([crd] if crd is not None else []), *args.depends_on]))
        self.namespace = NAMESPACE
        self.register_outputs({"namespace": NAMESPACE})
