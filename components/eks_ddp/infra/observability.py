"""Logs that outlive the nodes, GPU health metrics, and the node health agent that node auto repair acts on.

* **Container logs in CloudWatch** (``cloudwatch``): the ``amazon-cloudwatch-observability`` EKS add-on (Fluent Bit
  and the CloudWatch agent: Container Insights) ships every container's stdout and stderr to
  ``/aws/containerinsights/<cluster>/application``, so a failed run's tracebacks stay readable after the autoscaler
  has removed its GPU nodes and PodGC its pods. The ``dataplane`` and ``host`` groups (kubelet, containerd, kernel)
  stay empty on these Amazon Linux 2023 nodes: "dataplane and host logs vended by Container Insights will not be
  available by default due to the change in the system logging mechanism introduced in Amazon Linux 2023"
  (CloudWatch user guide, "Quick start with the Amazon CloudWatch Observability EKS add-on"). Kernel XID events
  reach the node conditions (node health, below) and dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` instead.

  - The log groups are created here first, with ``log_retention_days``: Fluent Bit's ``cloudwatch_logs`` output
    creates a missing group itself with no expiry (``auto_create_group true`` in the chart's Fluent Bit
    configuration, aws-observability/helm-charts ``charts/amazon-cloudwatch-observability/values.yaml``), and the
    add-on has no retention setting. Like the control plane's group they are kept on destroy (they expire by
    retention, and a Fluent Bit pod flushing while the add-on is deleted would create them again) and adopted by
    the next ``up``; a group tagged with another stack's owner is never adopted.
  - The add-on's agents run with an IRSA role that may write only to those log groups (:func:`agent_policy`),
    not the ``CloudWatchAgentServerPolicy`` that AWS's quick start attaches to the node role (every log group of
    the account, ``ssm:GetParameter``, X-Ray).
  - Its configuration (:func:`cloudwatch_configuration`) tolerates every taint (so the GPU nodes, tainted
    ``nvidia.com/gpu``, ship their logs too), turns off the add-on's own DCGM exporter (the GPU metrics come from
    NVIDIA's chart below: two DCGM host engines on a node contend for the driver's profiling lock, NVIDIA/DCGM
    issues #56 and #191) and its Neuron monitor (no Neuron devices here), and turns off Application Signals'
    auto-monitoring, which would inject instrumentation into the stack's workloads. The add-on's default agent
    configuration still has Application Signals' traces pipeline; the role grants no X-Ray or
    ``/aws/application-signals/*`` writes, so nothing is sent there (AccessDenied lines in the agent's log, not a
    failure of the container logs).

* **GPU metrics** (``gpu_metrics``): NVIDIA's ``dcgm-exporter`` chart (:data:`DCGM_EXPORTER_VERSION`, image by
  digest) on the GPU nodes only, in ``kube-system`` beside the device plugins (the chart always mounts the kubelet's
  pod-resources directory, a hostPath that Pod Security 'baseline' forbids). Its counters (:data:`DCGM_COUNTERS`)
  include the XID, ECC, retired-page, row-remap and NVLink error counters. It runs as a non-root user with no
  capabilities: what that costs is written at :func:`dcgm_exporter_values`. A NetworkPolicy (:func:`dcgm_policy`)
  admits nothing to it but TCP 9400 from pods labelled ``eks-ddp/gpu-metrics-scraper=true`` in namespaces labelled
  the same, and lets it send nothing; ``kubectl port-forward`` reaches it inside its own network namespace.
  It runs its own embedded DCGM host engine beside the node-monitoring agent's (below): the contention that made
  the add-on's exporter go is over the profiling lock, and this exporter reads no ``DCGM_FI_PROF_*`` field, so the
  two engines only both poll the device counters. Pointing it at the agent's engine (``-r <host>:5555``) would need
  the agent's Service name and an egress rule from the exporter, neither of which the add-on documents.

* **Node health** (``node_monitoring``): the ``eks-node-monitoring-agent`` EKS add-on. Its DaemonSet reports
  ``AcceleratedHardwareReady`` (NVIDIA XID codes, DCGM diagnostics), ``KernelReady``, ``NetworkingReady`` ... as
  node conditions, which a GPU node group's ``node_repair_config`` acts on. Its DCGM host engine DaemonSet
  tolerates no taint by default (``dcgmAgent.tolerations: []``, aws/eks-node-monitoring-agent
  ``charts/eks-node-monitoring-agent/values.yaml``), so it is given the GPU taint's toleration: without it the agent
  on a GPU node has no DCGM to ask.

The Kubernetes provider comes from ``opts`` (``providers={"kubernetes": ...}``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from eks_ddp.core import k8s_versions, rules
from eks_ddp.core.ownership import STACK_TAG, legacy_owner
from eks_ddp.infra.addon_version import addon_version
from eks_ddp.infra.addons import GPU_TOLERATION, gpu_daemonset_values
from eks_ddp.infra.iam import irsa_trust_policy

CLOUDWATCH_NAMESPACE = "amazon-cloudwatch"
CLOUDWATCH_SERVICE_ACCOUNT = "cloudwatch-agent"
"""The add-on's agents (the CloudWatch agent and Fluent Bit) both run as this service account (the chart's
``cloudwatch-agent.serviceAccountName``), which the add-on annotates with ``service_account_role_arn``."""
LOG_GROUP_KINDS = ("application", "dataplane", "host", "performance")
"""Container Insights' log groups: containers' output, kubelet/containerd, the node's kernel and system log
(Fluent Bit), and the CloudWatch agent's performance events."""
TOLERATE_EVERY_TAINT = {"operator": "Exists"}

DCGM_EXPORTER_CHART = "dcgm-exporter"
DCGM_EXPORTER_REPO = "https://nvidia.github.io/dcgm-exporter/helm-charts"
DCGM_EXPORTER_VERSION = "4.8.2"
"""Chart version as NVIDIA's index lists it (helm-charts/index.yaml, digest 1c5535c0...b623803, appVersion 4.8.2)."""
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter"
DCGM_EXPORTER_TAG = ("4.5.3-4.8.2-distroless"
                     "@sha256:60d3b00ac80b4ae77f94dae2f943685605585ad9e92fdccda3154d009ae317cc")
"""The chart's own image tag, pinned by digest. Read from: not from nvcr.io by this project (no registry access where
it is built), but the digest public pins of this tag agree on (several projects pin
``dcgm-exporter:4.5.3-4.8.2-distroless@sha256:60d3b00a...``); preflight resolves it against nvcr.io before every
``up`` and fails naming this constant if it does not (tooling/preflight/pins.py). Check it with
``crane digest nvcr.io/nvidia/k8s/dcgm-exporter:<tag>`` when bumping."""
DCGM_EXPORTER_NAMESPACE = "kube-system"
DCGM_EXPORTER_RELEASE = "dcgm-exporter"
DCGM_EXPORTER_PORT = 9400
DCGM_EXPORTER_UID = 1000
"""NVIDIA's documented non-root user for the exporter (the chart's values.yaml ``securityContext`` note)."""
SCRAPER_LABEL = "eks-ddp/gpu-metrics-scraper"
"""A pod may scrape the exporter when it and its namespace both carry this label with value ``true``."""
HELM_TIMEOUT_S = 900
"""As for the device plugins: room for a GPU node joining while Helm waits on the DaemonSet."""

DCGM_COUNTERS = """\
# DCGM field, Prometheus type, help (dcgm-exporter's counters CSV). The chart's default list (its
# metrics-configmap.yaml) without the DCGM_FI_PROF_* profiling fields, which need CAP_SYS_ADMIN, plus the error
# counters the default leaves commented out: ECC, retired pages, NVLink errors, throttling.
DCGM_FI_DEV_SM_CLOCK, gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).
DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.
DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.
DCGM_FI_DEV_POWER_VIOLATION, counter, Throttling duration due to power constraints (in ns).
DCGM_FI_DEV_THERMAL_VIOLATION, counter, Throttling duration due to thermal constraints (in ns).
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, counter, Total number of single-bit persistent ECC errors.
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL, counter, Total number of double-bit persistent ECC errors.
DCGM_FI_DEV_RETIRED_SBE, counter, Total number of retired pages due to single-bit errors.
DCGM_FI_DEV_RETIRED_DBE, counter, Total number of retired pages due to double-bit errors.
DCGM_FI_DEV_RETIRED_PENDING, counter, Total number of pages pending retirement.
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors.
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for correctable errors.
DCGM_FI_DEV_ROW_REMAP_FAILURE, gauge, Whether remapping of rows has failed.
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total number of NVLink flow-control CRC errors.
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, Total number of NVLink data CRC errors.
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, counter, Total number of NVLink retries.
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, counter, Total number of NVLink recovery errors.
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, counter, Total number of NVLink bandwidth counters for all lanes.
"""
"""The exporter's counters (the chart's ``customMetrics``: the whole list, not added to the default)."""


def log_group_names(cluster_name: str) -> dict[str, str]:
    """Container Insights' log group of each kind for a cluster (the names the add-on's Fluent Bit and CloudWatch
    agent write to)."""
    return {kind: f"/aws/containerinsights/{cluster_name}/{kind}" for kind in LOG_GROUP_KINDS}


def agent_policy(cluster_name: str, region: str, account: str, partition: str = "aws") -> dict:
    """What Fluent Bit and the CloudWatch agent may do: write to (and, were one deleted, re-create) this cluster's
    Container Insights log groups, list log groups, and read the EC2 tags and volumes the agent labels metrics with
    (Describe calls take no resource ARN: held to the cluster's region instead). No retention changes, no other group,
    no metrics API (Container Insights sends its metrics as log events), no X-Ray, no SSM."""
    groups = f"arn:{partition}:logs:{region}:{account}:log-group:/aws/containerinsights/{cluster_name}/*"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "WriteOwnLogGroups", "Effect": "Allow",
         "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"],
         "Resource": [groups, f"{groups}:log-stream:*"]},
        {"Sid": "ListLogGroups", "Effect": "Allow", "Action": ["logs:DescribeLogGroups"],
         "Resource": f"arn:{partition}:logs:{region}:{account}:log-group:*"},
        {"Sid": "DescribeInstances", "Effect": "Allow", "Action": ["ec2:DescribeTags", "ec2:DescribeVolumes"],
         "Resource": "*", "Condition": {"StringEquals": {"aws:RequestedRegion": region}}},
    ]}


AGENT_CPU_REQUEST = "100m"
"""The CloudWatch agent DaemonSet's CPU request (the chart asks 250m, limit 500m): with the chart's request the
add-on's pods no longer fit beside the stack's own on the dev stack's one t3.medium system node
(``scheduling.SYSTEM_ADDON_PODS`` counts them; tests/infra/test_autoscaler.py). The limit stays 500m."""


def cloudwatch_configuration() -> dict:
    """The ``amazon-cloudwatch-observability`` add-on's configuration values (the chart's values.yaml keys)."""
    return {
        # Every taint: the GPU nodes' nvidia.com/gpu, and a NoExecute taint on a node being repaired or drained,
        # which would otherwise evict Fluent Bit before it flushes the node's last lines.
        "tolerations": [dict(TOLERATE_EVERY_TAINT)],
        "agent": {"resources": {"requests": {"cpu": AGENT_CPU_REQUEST}}},
        "containerLogs": {"enabled": True},
        "dcgmExporter": {"enabled": False},
        "neuronMonitor": {"enabled": False},
        "manager": {"applicationSignals": {"autoMonitor": {"monitorAllServices": False}}},
    }


def node_monitoring_configuration() -> dict:
    """The ``eks-node-monitoring-agent`` add-on's configuration values (its configuration.schema.json keys). The
    agent's own DaemonSet already tolerates every taint (``nodeAgent.tolerations: [{operator: Exists}]``)."""
    return {"dcgmAgent": {"tolerations": [dict(GPU_TOLERATION)]}}


def dcgm_exporter_values() -> dict:
    """The dcgm-exporter chart's values (names from its values.yaml, chart 4.8.2).

    Privileges: the exporter reads every GPU of its node through NVML (the image sets ``NVIDIA_VISIBLE_DEVICES=all``,
    so the NVIDIA container runtime hands it the device files, which the driver creates world-readable). That needs
    no capability and no root. Running as uid 1000 with every capability dropped costs two things, both left out on
    purpose:

    * the ``DCGM_FI_PROF_*`` (DCP) fields, which need ``CAP_SYS_ADMIN`` (and root: the chart's own default runs uid 0
      with SYS_ADMIN for them) and take the driver's profiling lock, which a user's Nsight profile would then contend
      for; :data:`DCGM_COUNTERS` does not ask for them;
    * pod and namespace labels on the metrics: the exporter would read them from the kubelet's pod-resources socket,
      which is root's and not writable by other users (the kubelet creates it under its umask; connecting to a Unix
      socket needs write permission), so the mapping is turned off rather than failing on every scrape
      (``--kubernetes=false``: a command-line flag wins over the ``DCGM_EXPORTER_KUBERNETES=true`` the chart sets,
      urfave/cli's order). A node runs one training pod: ``kubectl get pods -o wide`` maps a node to its pod.

    Its pod gets no API token (the chart mounts one only for pod labels or DRA) and does not use the host network,
    so its NetworkPolicy applies to it.
    """
    values = gpu_daemonset_values()
    return {
        "image": {"repository": DCGM_EXPORTER_IMAGE, "tag": DCGM_EXPORTER_TAG},
        "arguments": ["-f", "/etc/dcgm-exporter/default-counters.csv", "--kubernetes=false"],
        "customMetrics": DCGM_COUNTERS,
        "hostNetwork": False,
        "hostPID": False,
        "podSecurityContext": {"runAsNonRoot": True, "runAsUser": DCGM_EXPORTER_UID, "runAsGroup": DCGM_EXPORTER_UID,
                               "seccompProfile": {"type": "RuntimeDefault"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": DCGM_EXPORTER_UID, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
        # No Prometheus Operator here: the chart's default ServiceMonitor would fail the release (no such kind).
        "serviceMonitor": {"enabled": False},
        "service": {"enable": True, "type": "ClusterIP", "port": DCGM_EXPORTER_PORT,
                    "address": f":{DCGM_EXPORTER_PORT}"},
        "kubernetes": {"enablePodLabels": False, "enablePodUID": False},
        **values,
    }


def dcgm_selector() -> dict[str, str]:
    """The exporter pods' labels (the chart's ``dcgm-exporter.selectorLabels`` for release :data:`DCGM_EXPORTER_RELEASE`)."""
    return {"app.kubernetes.io/name": DCGM_EXPORTER_CHART, "app.kubernetes.io/instance": DCGM_EXPORTER_RELEASE,
            "app.kubernetes.io/component": DCGM_EXPORTER_CHART}


def dcgm_policy() -> k8s.networking.v1.NetworkPolicySpecArgs:
    """Isolate the exporter both ways; admit only labelled scrapers in labelled namespaces, on its metrics port."""
    net, meta = k8s.networking.v1, k8s.meta.v1
    scraper = {SCRAPER_LABEL: "true"}
    return net.NetworkPolicySpecArgs(
        pod_selector=meta.LabelSelectorArgs(match_labels=dcgm_selector()),
        policy_types=["Ingress", "Egress"],
        ingress=[net.NetworkPolicyIngressRuleArgs(
            from_=[net.NetworkPolicyPeerArgs(namespace_selector=meta.LabelSelectorArgs(match_labels=dict(scraper)),
                                             pod_selector=meta.LabelSelectorArgs(match_labels=dict(scraper)))],
            ports=[net.NetworkPolicyPortArgs(port=DCGM_EXPORTER_PORT, protocol="TCP")])],
        egress=[])


@dataclass(frozen=True, kw_only=True)
class ObservabilityArgs:
    """Inputs of :class:`Observability`."""

    cluster_name: str
    """EKS cluster name: it names the log groups and scopes the agents' IAM policy."""
    region: str
    """AWS region of the cluster (the IAM policy names its log groups' ARNs)."""
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    kubernetes_version: str = k8s_versions.DEFAULT_VERSION
    """The cluster's Kubernetes version: picks the EKS add-on builds made for it."""
    cloudwatch: bool = True
    """Ship container, kubelet and kernel logs to CloudWatch Logs (the amazon-cloudwatch-observability add-on)."""
    log_retention_days: int = 30
    """Retention of the Container Insights log groups (one of CloudWatch's allowed values)."""
    gpu_metrics: bool = True
    """NVIDIA's dcgm-exporter on the GPU nodes."""
    node_monitoring: bool = True
    """The eks-node-monitoring-agent add-on (node conditions that node auto repair acts on)."""
    gpu_node_groups: Sequence[pulumi.Resource] = ()
    """GPU node groups the exporter's Helm release waits for (see ``addons.ClusterAddonsArgs``)."""
    stack_id: str | None = None
    """The stack's owner id (``eks_ddp.core.ownership.owner_id``), tagged on the log groups; a group tagged with
    another stack's is never adopted."""
    tags: dict[str, str] | None = None
    """Extra tags for the AWS resources."""


def validate(args: ObservabilityArgs) -> None:
    """Raise ValueError naming the bad field."""
    need = "known when the program runs"
    rules.require(
        rules.known("cluster_name", args.cluster_name, "a string", "it names the log groups")
        or rules.cluster_name("cluster_name", args.cluster_name),
        rules.known("region", args.region, "a region name", "the IAM policy names it") or rules.region("region", args.region),
        *[rules.known(f, getattr(args, f), "a plain value", need) for f in (
            "kubernetes_version", "cloudwatch", "gpu_metrics", "node_monitoring")],
        rules.known("log_retention_days", args.log_retention_days, "a number of days", need)
        or rules.retention_days("log_retention_days", args.log_retention_days))


class Observability(pulumi.ComponentResource):
    """Container logs in CloudWatch with a retention, NVIDIA's DCGM exporter on the GPU nodes, the node monitoring
    agent."""

    log_groups: dict[str, str]
    """Kind -> Container Insights log group name (empty with ``cloudwatch`` off)."""

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:observability:Observability", name, None, opts)
        validate(args)
        self._name, self._args = name, args
        self._tags = {"eks-ddp/cluster": args.cluster_name, **(args.tags or {})}
        self.log_groups = {}
        if args.cloudwatch:
            self._create_cloudwatch()
        if args.node_monitoring:
            self._addon("node-monitoring", k8s_versions.NODE_MONITORING_AGENT, node_monitoring_configuration())
        if args.gpu_metrics:
            self._create_dcgm_exporter()
        self.register_outputs({"log_groups": self.log_groups})

    def _addon(self, suffix: str, addon: str, configuration: dict, role_arn: pulumi.Input[str] | None = None,
               depends_on: Sequence[pulumi.Resource] = ()) -> aws.eks.Addon:
        return aws.eks.Addon(
            f"{self._name}-{suffix}",
            cluster_name=self._args.cluster_name,
            addon_name=addon,
            addon_version=addon_version(addon, self._args.kubernetes_version, opts=pulumi.InvokeOptions(parent=self)),
            service_account_role_arn=role_arn,
            configuration_values=json.dumps(configuration, sort_keys=True),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            tags=self._tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)))

    def _create_cloudwatch(self) -> None:
        args, name = self._args, self._name
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOptions(parent=self)
        self.log_groups = log_group_names(args.cluster_name)
        groups = [self._log_group(kind, log_name, invoke) for kind, log_name in self.log_groups.items()]
        partition = aws.get_partition(opts=invoke).partition
        account = aws.get_caller_identity(opts=invoke).account_id
        role = aws.iam.Role(
            f"{name}-cloudwatch-agent",
            description="CloudWatch agent and Fluent Bit (IRSA): write this cluster's Container Insights log groups",
            assume_role_policy=pulumi.Output.all(args.oidc_provider_arn, args.oidc_provider_url).apply(
                lambda a: irsa_trust_policy(a[0], a[1], CLOUDWATCH_NAMESPACE, CLOUDWATCH_SERVICE_ACCOUNT)),
            tags=self._tags, opts=child)
        policy = aws.iam.RolePolicy(
            f"{name}-cloudwatch-agent", role=role.id,
            policy=json.dumps(agent_policy(args.cluster_name, args.region, account, partition)), opts=child)
        self.cloudwatch_addon = self._addon("cloudwatch", k8s_versions.CLOUDWATCH_OBSERVABILITY,
                                            cloudwatch_configuration(), role.arn, [*groups, policy])
        self.agent_role_arn = role.arn

    def _log_group(self, kind: str, log_name: str, invoke: pulumi.InvokeOptions) -> aws.cloudwatch.LogGroup:
        stack_id = self._args.stack_id
        found = aws.cloudwatch.get_log_groups(log_group_name_prefix=log_name, opts=invoke)
        existing = log_name in (found.log_group_names or [])
        if existing and stack_id is not None:
            owner = (aws.cloudwatch.get_log_group(name=log_name, opts=invoke).tags or {}).get(STACK_TAG)
            if owner is not None and owner not in (stack_id, legacy_owner(stack_id)):
                raise ValueError(f"cluster_name: the log group {log_name} belongs to stack {owner!r}, not to this "
                                 f"stack ({stack_id}); it is never adopted; expected a cluster name no other stack's "
                                 "cluster or log group has (stack config: cluster.name)")
        return aws.cloudwatch.LogGroup(
            f"{self._name}-{kind}", name=log_name, retention_in_days=self._args.log_retention_days, skip_destroy=True,
            tags={**self._tags, STACK_TAG: stack_id} if stack_id else self._tags,
            opts=pulumi.ResourceOptions(parent=self, import_=log_name if existing else None))

    def _create_dcgm_exporter(self) -> None:
        name = self._name
        policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-dcgm-exporter",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=DCGM_EXPORTER_RELEASE, namespace=DCGM_EXPORTER_NAMESPACE),
            spec=dcgm_policy(), opts=pulumi.ResourceOptions(parent=self))
        k8s.helm.v3.Release(
            f"{name}-dcgm-exporter", name=DCGM_EXPORTER_RELEASE, chart=DCGM_EXPORTER_CHART,
            version=DCGM_EXPORTER_VERSION, repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=DCGM_EXPORTER_REPO),
            namespace=DCGM_EXPORTER_NAMESPACE, values=dcgm_exporter_values(), atomic=True, timeout=HELM_TIMEOUT_S,
            # The policy first: the exporter never runs unisolated.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy, *self._args.gpu_node_groups]))
