"""EtcdRendezvous: an etcd 3.5 member serving the v2 API that torchrun's ``etcd-v2`` rendezvous speaks.

One member, on the system nodes, non-root on a read-only root filesystem. A NetworkPolicy admits only
the training pods (by label) on the client port; it is the only access control: etcd serves plain HTTP
without authentication (the trainer's python-etcd client has no TLS settings wired).

Why one member and not a 3-member quorum: the store holds only the rendezvous of running jobs (a few
KiB; checkpoints live on the shared volume), and the training launcher rides out a store restart. A quorum would need, to be correct, a data volume per
member (an EBS CSI driver), required anti-affinity over at least 3 system nodes, and an init step that
removes and re-adds a member that lost its data (``member remove``/``member add``,
``--initial-cluster-state=existing``): etcd refuses a bootstrapped member that comes back empty, so on
``emptyDir`` every rescheduled member crash-loops. One member has no such failure mode: its data dir
(``emptyDir``) survives container restarts, and a rescheduled pod bootstraps a fresh single-member
cluster in seconds. A PodDisruptionBudget keeps drains and evictions from taking it while it is the
only member, and a PriorityClass keeps node-pressure eviction and preemption from choosing it first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from . import rules
from .namespace import dns_egress, priority_class_guard, restricted_container_security, restricted_pod_security

ETCD_IMAGE = ("quay.io/coreos/etcd:v3.5.18"
              "@sha256:d0a641d5fbcc89678c931a61b7de7b8a1cf097149f135c9c73bc81d076a1494b")
"""etcd 3.5 (3.6 removed the v2 API torch's etcd-v2 backend needs), pinned by tag and digest. The image
is distroless (no shell): probes use HTTP, not exec."""

CLIENT_PORT = 2379
PEER_PORT = 2380
ETCD_UID = 65532
"""The distroless 'nonroot' user; the image itself would run as root."""
DATA_DIR = "/var/run/etcd"

DEFAULT_CLIENT_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "eks-ddp-trainer"}
"""Labels of the pods allowed to reach the client port: the ElasticJob's training pods carry them."""
SERVER_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/component": "rendezvous",
                                    "app.kubernetes.io/part-of": "eks-ddp"}
"""Labels every member carries: the training pods' egress rule to the client port selects them."""
PRIORITY = 1_000_000
"""Above every workload pod (0), below the system-*-critical classes (2,000,000,000+)."""

_RESOURCES = k8s.core.v1.ResourceRequirementsArgs(
    requests={"cpu": "100m", "memory": "128Mi"},
    limits={"cpu": "1", "memory": "512Mi"},
)
_QUOTA_BYTES = 256 * 1024 * 1024
"""Quota of the v3 backend (bbolt) only. torch's rendezvous uses the v2 store, which lives in memory and is
bounded by the container's memory limit (512Mi) alone; it holds a few KiB per run."""


@dataclass(frozen=True, kw_only=True)
class EtcdRendezvousArgs:
    """Inputs of :class:`EtcdRendezvous`."""

    namespace: pulumi.Input[str]
    """Namespace of the StatefulSet, Services and NetworkPolicy (the training namespace)."""
    replicas: int = 1
    """etcd members: 1 (see the module docstring for why not a quorum)."""
    node_selector: pulumi.Input[Mapping[str, str]] | None = None
    """Node labels the members must run on (the system node group)."""
    client_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CLIENT_LABELS))
    """Labels of the pods (in the same namespace) the NetworkPolicy admits on the client port."""
    image: str = ETCD_IMAGE
    """etcd 3.5 image, pinned by digest."""

    def __post_init__(self) -> None:
        _validate("EtcdRendezvousArgs", self)  # a bad value fails where the Args are built, naming the field


class EtcdRendezvous(pulumi.ComponentResource):
    """etcd with ``--enable-v2=true`` as a StatefulSet, its Services and a NetworkPolicy."""

    endpoint: pulumi.Output[str]
    """``<service>.<namespace>.svc.cluster.local:2379``, resolved once the members are ready."""
    service_name: str
    pod_labels: dict[str, str]

    def __init__(self, name: str, args: EtcdRendezvousArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:etcd:EtcdRendezvous", name, None, opts)
        _validate(name, args)
        self._args = args
        self.service_name = f"{name}-etcd"
        self._peer_service = f"{name}-etcd-peers"
        self.pod_labels = {**SERVER_LABELS, "app.kubernetes.io/instance": self.service_name}
        self._selector = {k: self.pod_labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
        child = pulumi.ResourceOptions(parent=self)

        sa = k8s.core.v1.ServiceAccount(
            f"{name}-etcd-sa", metadata=self._meta(self.service_name),
            automount_service_account_token=False, opts=child)
        peers = self._create_peer_service(name, child)
        client = k8s.core.v1.Service(
            f"{name}-etcd-client",
            metadata=self._meta(self.service_name),
            spec=k8s.core.v1.ServiceSpecArgs(
                type="ClusterIP", selector=self._selector,
                ports=[k8s.core.v1.ServicePortArgs(name="client", port=CLIENT_PORT, target_port="client")]),
            opts=child)
        self._create_network_policy(name, child)
        priority = k8s.scheduling.v1.PriorityClass(
            f"{name}-etcd-priority",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"eks-ddp-{self.service_name}", labels=self.pod_labels),
            value=PRIORITY, global_default=False, preemption_policy="PreemptLowerPriority",
            description="eks-ddp rendezvous store: every agent of a running job depends on it.", opts=child)
        # Only this namespace's members may use the class (it preempts): a quota here, an admission policy elsewhere.
        priority_class_guard(f"{name}-etcd", priority.metadata.name, args.namespace, args.replicas, child)
        sts = self._create_statefulset(name, sa, peers, priority, child)
        # minAvailable 1: a drain or eviction waits while the only member serves (delete the pod by hand, or
        # drain with --disable-eviction, between runs). A StatefulSet update is not an eviction: it still
        # restarts the member, which the launcher rides out.
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-etcd-pdb",
            metadata=self._meta(self.service_name),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                min_available=args.replicas, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self._selector)),
            opts=child)

        # Built from the Service and the StatefulSet so that consumers wait for ready members.
        self.endpoint = pulumi.Output.all(client.metadata.name, sts.metadata.name, args.namespace).apply(
            lambda v: f"{v[0]}.{v[2]}.svc.cluster.local:{CLIENT_PORT}")
        self.register_outputs({"endpoint": self.endpoint, "service_name": self.service_name})

    def _meta(self, name: str, labels: Mapping[str, str] | None = None) -> k8s.meta.v1.ObjectMetaArgs:
        return k8s.meta.v1.ObjectMetaArgs(name=name, namespace=self._args.namespace,
                                          labels=dict(labels or self.pod_labels))

    def _create_peer_service(self, name: str, child: pulumi.ResourceOptions) -> k8s.core.v1.Service:
        # Headless: gives every member a stable DNS name (<pod>.<svc>.<ns>.svc.cluster.local). Not-ready
        # members must be published too, or no member could resolve its peers before quorum (chicken and egg).
        return k8s.core.v1.Service(
            f"{name}-etcd-peers",
            metadata=self._meta(self._peer_service),
            spec=k8s.core.v1.ServiceSpecArgs(
                cluster_ip="None", publish_not_ready_addresses=True, selector=self._selector,
                ports=[k8s.core.v1.ServicePortArgs(name="client", port=CLIENT_PORT, target_port="client"),
                       k8s.core.v1.ServicePortArgs(name="peer", port=PEER_PORT, target_port="peer")]),
            opts=child)

    def _create_network_policy(self, name: str, child: pulumi.ResourceOptions) -> None:
        tcp = "TCP"
        members = k8s.networking.v1.NetworkPolicyPeerArgs(
            pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self._selector))
        k8s.networking.v1.NetworkPolicy(
            f"{name}-etcd-netpol",
            metadata=self._meta(self.service_name),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self._selector),
                policy_types=["Ingress", "Egress"],
                ingress=[
                    k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                        from_=[k8s.networking.v1.NetworkPolicyPeerArgs(
                            pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(self._args.client_labels)))],
                        ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=CLIENT_PORT, protocol=tcp)]),
                    k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                        from_=[members], ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=PEER_PORT, protocol=tcp)]),
                ],
                egress=[
                    k8s.networking.v1.NetworkPolicyEgressRuleArgs(
                        to=[members], ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=PEER_PORT, protocol=tcp)]),
                    # DNS: the member resolves its own advertised name.
                    dns_egress(),
                ]),
            opts=child)

    def _create_statefulset(self, name: str, sa: k8s.core.v1.ServiceAccount, peers: k8s.core.v1.Service,
                            priority: k8s.scheduling.v1.PriorityClass, child: pulumi.ResourceOptions
                            ) -> k8s.apps.v1.StatefulSet:
        a = self._args
        probe = dict(port="client", scheme="HTTP")
        container = k8s.core.v1.ContainerArgs(
            name="etcd",
            image=a.image,
            image_pull_policy="IfNotPresent",
            command=["/usr/local/bin/etcd"],
            args=pulumi.Output.from_input(a.namespace).apply(
                lambda ns: etcd_args(self.service_name, self._peer_service, ns, a.replicas)),
            env=[k8s.core.v1.EnvVarArgs(name="POD_NAME", value_from=k8s.core.v1.EnvVarSourceArgs(
                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="metadata.name")))],
            ports=[k8s.core.v1.ContainerPortArgs(name="client", container_port=CLIENT_PORT),
                   k8s.core.v1.ContainerPortArgs(name="peer", container_port=PEER_PORT)],
            # Ready = this member serves linearizable reads (has quorum): the client Service routes only to it.
            readiness_probe=k8s.core.v1.ProbeArgs(
                http_get=k8s.core.v1.HTTPGetActionArgs(path="/health", **probe),
                period_seconds=5, timeout_seconds=3, failure_threshold=3),
            # Alive = this member answers locally (serializable): a lost quorum must not restart every member.
            liveness_probe=k8s.core.v1.ProbeArgs(
                http_get=k8s.core.v1.HTTPGetActionArgs(path="/health?serializable=true", **probe),
                initial_delay_seconds=15, period_seconds=10, timeout_seconds=5, failure_threshold=6),
            resources=_RESOURCES,
            security_context=restricted_container_security(ETCD_UID),
            volume_mounts=[k8s.core.v1.VolumeMountArgs(name="data", mount_path=DATA_DIR)],
        )
        spec = k8s.core.v1.PodSpecArgs(
            service_account_name=sa.metadata.name,
            automount_service_account_token=False,
            enable_service_links=False,
            node_selector=a.node_selector,
            # System pools are commonly tainted CriticalAddonsOnly; the rendezvous is such an add-on.
            tolerations=[k8s.core.v1.TolerationArgs(key="CriticalAddonsOnly", operator="Exists")],
            priority_class_name=priority.metadata.name,
            security_context=restricted_pod_security(ETCD_UID),
            termination_grace_period_seconds=30,
            containers=[container],
            volumes=[k8s.core.v1.VolumeArgs(
                name="data", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="1Gi"))],
        )
        return k8s.apps.v1.StatefulSet(
            f"{name}-etcd",
            metadata=self._meta(self.service_name),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                replicas=a.replicas,
                service_name=peers.metadata.name,
                # Parallel: with OrderedReady member 1 would wait for member 0 to be ready, which needs quorum,
                # which needs member 1.
                pod_management_policy="Parallel",
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self._selector),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels=self.pod_labels), spec=spec)),
            opts=child)


def member_url(peer_service: str, namespace: str, member: str, port: int) -> str:
    """A member's stable URL through the headless Service."""
    return f"http://{member}.{peer_service}.{namespace}.svc.cluster.local:{port}"


def etcd_args(statefulset: str, peer_service: str, namespace: str, replicas: int) -> list[str]:
    """etcd's flags; ``$(POD_NAME)`` is expanded by the kubelet from the downward API."""
    me = "$(POD_NAME)"
    members = [f"{statefulset}-{i}" for i in range(replicas)]
    cluster = ",".join(f"{m}={member_url(peer_service, namespace, m, PEER_PORT)}" for m in members)
    return [
        f"--name={me}",
        f"--data-dir={DATA_DIR}/data",
        f"--listen-client-urls=http://0.0.0.0:{CLIENT_PORT}",
        f"--advertise-client-urls={member_url(peer_service, namespace, me, CLIENT_PORT)}",
        f"--listen-peer-urls=http://0.0.0.0:{PEER_PORT}",
        f"--initial-advertise-peer-urls={member_url(peer_service, namespace, me, PEER_PORT)}",
        f"--initial-cluster={cluster}",
        # 'new' is right for every start of a single member: with data it is ignored (etcd restarts from its
        # WAL), and an empty data dir bootstraps a fresh one-member cluster.
        "--initial-cluster-state=new",
        f"--initial-cluster-token={statefulset}.{namespace}",
        # torch's etcd-v2 rendezvous speaks only the v2 API, off by default since 3.4.
        "--enable-v2=true",
        f"--quota-backend-bytes={_QUOTA_BYTES}",
        # Fewer entries between snapshots keeps memory and the WAL in the emptyDir small for a tiny key space.
        "--snapshot-count=10000",
        "--log-level=warn",
    ]


def _validate(name: str, a: EtcdRendezvousArgs) -> None:
    rules.require(rules.namespace("namespace", a.namespace) if isinstance(a.namespace, str) else None)
    if a.replicas != 1:
        raise ValueError(f"replicas: got {a.replicas!r}; expected 1 (a quorum of members on emptyDir cannot "
                         "take back a rescheduled member; see the EtcdRendezvous docstring)")
    if not a.client_labels:
        raise ValueError("client_labels: got {}; expected the training pods' labels (an empty selector "
                         "would admit every pod in the namespace)")
    if "@sha256:" not in a.image:
        raise ValueError(f"image: got {a.image!r}; expected an image pinned by digest (repo:tag@sha256:...)")
    if len(f"{name}-etcd-peers") > 63 or len(f"{name}-etcd-{a.replicas - 1}") > 63:
        raise ValueError(f"name: got {name!r}; expected at most 51 characters (names become DNS labels)")


def etcd_client_egress(server_labels: Mapping[str, str]) -> k8s.networking.v1.NetworkPolicyEgressRuleArgs:
    """The clients' egress rule: the client port of the pods with ``server_labels`` (same namespace), never
    2379 anywhere else. The Service's ClusterIP resolves to the same pods, and python-etcd then talks to the
    member's advertised per-pod URL."""
    net = k8s.networking.v1
    return net.NetworkPolicyEgressRuleArgs(
        to=[net.NetworkPolicyPeerArgs(pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(server_labels)))],
        ports=[net.NetworkPolicyPortArgs(port=CLIENT_PORT, protocol="TCP")])
