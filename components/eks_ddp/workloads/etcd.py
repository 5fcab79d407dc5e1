"""EtcdRendezvous: an etcd 3.5 member serving the v3 API that the agents' ``eks-etcd`` rendezvous speaks.

**Authenticated.** The agents unpickle the rendezvous state they read, so only the job's pods may write
it: etcd serves TLS only and requires a client certificate from the stack's own CA
(components/eks_ddp/workloads/etcd_tls.py; ``--client-cert-auth``, ``--trusted-ca-file``, ``--cert-file``, ``--key-file``).
The NetworkPolicy (trainer pods only, on the client port) is a second layer, not the control. Probes
use the plain-HTTP metrics listener (``--listen-metrics-urls``: /health and /metrics, no keys), which the
policy admits from nowhere but the node itself.

**One store that cannot exist twice.** The store holds only the rendezvous of running jobs (a few KiB;
checkpoints live on the shared volume), and the agents rebuild it after a wipe, so it needs no quorum and no
persistent volume. What it must never do is exist twice: two stores behind one Service let two groups of agents
form two worlds of one job (a replaced member that starts empty while the old one still serves). So etcd is a
**StatefulSet of one replica**: the StatefulSet controller creates a pod of a given identity only once the previous
one is gone from the API (Kubernetes "StatefulSet: Pod Management Policies" and "Force Delete StatefulSet Pods":
"StatefulSet ensures that, at any time, there is at most one Pod with a given identity running in a cluster"),
where a Deployment replaces an evicted pod at once, even while that pod still runs on a node the control plane
cannot reach. Each incarnation also has its own cluster ID (``--initial-cluster-token`` names the pod's UID), so a
client can tell a new, empty store from the old one.

What each failure costs on EKS defaults (the agents ride out up to ``store_retry_timeout``, 600 s):

* etcd's container crashes: the kubelet restarts it in place, data kept (emptyDir lives with the pod): seconds;
* etcd's pod is deleted or evicted by a drain (a system node-group update): the next pod starts once the old one
  is gone: about 10-20 s, an empty store (the agents rebuild it);
* etcd's node is terminated: the node controller marks it NotReady after 50 s (node-monitor-grace-period), the
  cloud node lifecycle controller deletes the Node object once EC2 reports the instance gone, which deletes the pod,
  and the StatefulSet starts a new one: about 1-2 minutes, an empty store;
* etcd's node loses the control plane but not its network (kubelet hang, partition): nothing is replaced and the
  store keeps serving every agent that reaches it (the Service publishes its address while not ready); if the node
  never comes back, the store is down until the node is repaired (node auto-repair) or deleted
  (``kubectl delete node``, or the out-of-service taint), then as above;
* a PodDisruptionBudget lets a drain evict it (``maxUnavailable: 1``, ``AlwaysAllow`` for an unhealthy pod): a
  budget that never allows a disruption fails a node-group update after 15 minutes;
* a PriorityClass lets its replacement preempt ordinary pods on a full system node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.core import rules
from eks_ddp.core.rendezvous_store import StoreSize, store_size
from eks_ddp.workloads.etcd_tls import VALIDITY_HOURS, RendezvousTls, RendezvousTlsArgs
from eks_ddp.workloads.namespace import priority_class_guard, restricted_container_security, restricted_pod_security

ETCD_IMAGE = ("quay.io/coreos/etcd:v3.5.18"
              "@sha256:d0a641d5fbcc89678c931a61b7de7b8a1cf097149f135c9c73bc81d076a1494b")
"""etcd 3.5 (the agents speak its v3 API, which 3.6 keeps), pinned by tag and digest. The image
is distroless (no shell): probes use HTTP, not exec. The digest is the tag's OCI image index (multi-arch). Read from:
not from quay.io by this project (no registry access where it is built), but the index digest third parties record
for ``quay.io/coreos/etcd:v3.5.18``: github.com/aceeric/ociregistry ``impl/serialize/serialize_test.go`` (a registry
cache's recorded manifest, media type ``application/vnd.oci.image.index.v1+json``, with the index's bytes), and
several projects' pins agree; preflight resolves it against quay.io
before every ``up`` and fails naming this constant if it does not (tooling/preflight/pins.py)."""

CLIENT_PORT = 2379
PEER_PORT = 2380
"""Listened on 127.0.0.1 only: one member has no peers."""
METRICS_PORT = 2381
"""Plain-HTTP /health and /metrics (no keys) for the kubelet's probes."""
TLS_DIR = "/etc/etcd/tls"
"""Where etcd's server Secret (tls.crt, tls.key, ca.crt) is mounted, read-only."""
ETCD_UID = 65532
"""The distroless 'nonroot' user; the image itself would run as root."""
DATA_DIR = "/var/run/etcd"
CERT_ANNOTATION = "eks-ddp/tls-fingerprint"
"""etcd's pod-template annotation: sha256 of its server certificate and CA (a rotation restarts it)."""

DEFAULT_CLIENT_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "eks-ddp-trainer"}
"""Labels of the pods allowed to reach the client port: the ElasticJob's training pods carry them."""
SERVER_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/component": "rendezvous",
                                    "app.kubernetes.io/part-of": "eks-ddp"}
"""Labels every member of every store carries (plus ``app.kubernetes.io/instance``: its Service's name). A client's
egress rule selects one store by :func:`store_selector`, never by these: see :func:`etcd_client_egress`."""
PRIORITY = 1_000_000
"""Above every workload pod (0), below the system-*-critical classes (2,000,000,000+)."""

DEFAULT_AGENTS = 32
"""Agents a store is sized for when its Args name none (eks_ddp.core.rendezvous_store: the smallest store serves up
to 64); the program passes the largest GPU group's ``maxSize``."""


def _cpu(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _resources(size: StoreSize) -> k8s.core.v1.ResourceRequirementsArgs:
    return k8s.core.v1.ResourceRequirementsArgs(
        requests={"cpu": _cpu(size.cpu_request_m), "memory": f"{size.memory_request_mib}Mi"},
        limits={"cpu": _cpu(size.cpu_limit_m), "memory": f"{size.memory_limit_mib}Mi"},
    )


@dataclass(frozen=True, kw_only=True)
class EtcdRendezvousArgs:
    """Inputs of :class:`EtcdRendezvous`."""

    namespace: pulumi.Input[str]
    """Namespace of the StatefulSet, Service, Secrets and NetworkPolicy (the training namespace)."""
    replicas: int = 1
    """etcd members: 1 (see the module docstring for why not a quorum)."""
    node_selector: pulumi.Input[Mapping[str, str]] | None = None
    """Node labels the members must run on (the system node group)."""
    client_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CLIENT_LABELS))
    """Labels of the pods (in the same namespace) the NetworkPolicy admits on the client port."""
    more_client_labels: Sequence[Mapping[str, str]] = ()
    """Further label sets admitted alike (one NetworkPolicy peer each), each naming a Job's pods (a store of one run
    admits that run's training pods, whose init container runs the fabric check)."""
    image: str = ETCD_IMAGE
    """etcd 3.5 image, pinned by digest."""
    tls_validity_hours: int = VALIDITY_HOURS
    """Lifetime of the store's CA and certificates (renewed on a ``pulumi up`` in their last 30 days)."""
    max_agents: int = DEFAULT_AGENTS
    """The most agents one run of this store can have (the largest GPU group's ``maxSize``): etcd's quota,
    compaction, CPU and memory follow from it (eks_ddp.core.rendezvous_store.store_size)."""

    def __post_init__(self) -> None:
        _validate("EtcdRendezvousArgs", self)  # a bad value fails where the Args are built, naming the field


class EtcdRendezvous(pulumi.ComponentResource):
    """etcd with client-certificate TLS as a one-replica StatefulSet, its Service,
    certificates, NetworkPolicy, PriorityClass and a PodDisruptionBudget that lets drains move it."""

    endpoint: pulumi.Output[str]
    """``<service>.<namespace>.svc.cluster.local:2379``, resolved once the member is ready."""
    client_tls_secret: pulumi.Output[str]
    """Name of the Secret (tls.crt, tls.key, ca.crt) the agents mount at eks_ddp_runtime.launch_command.RDZV_TLS_DIR."""
    service_name: str
    pod_labels: dict[str, str]
    server_selector: dict[str, str]

    def __init__(self, name: str, args: EtcdRendezvousArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:etcd:EtcdRendezvous", name, None, opts)
        _validate(name, args)
        self._args = args
        self.service_name = f"{name}-etcd"
        self.pod_labels = {**SERVER_LABELS, "app.kubernetes.io/instance": self.service_name}
        self._selector = store_selector(self.service_name)
        self.server_selector = dict(self._selector)
        """The client Service's selector (and the StatefulSet's): what a client's egress rule must select
        (:func:`etcd_client_egress`)."""
        child = pulumi.ResourceOptions(parent=self)

        svc = self.service_name
        names: list[pulumi.Input[str]] = [svc, *(pulumi.Output.concat(svc, ".", args.namespace, suffix)
                        for suffix in ("", ".svc", ".svc.cluster.local"))]
        certs = RendezvousTls(f"{name}-etcd-tls", RendezvousTlsArgs(
            namespace=args.namespace, server_names=names, labels=self.pod_labels,
            validity_hours=args.tls_validity_hours), opts=child)
        sa = k8s.core.v1.ServiceAccount(
            f"{name}-etcd-sa", metadata=self._meta(self.service_name),
            automount_service_account_token=False, opts=child)
        client = k8s.core.v1.Service(
            f"{name}-etcd-client",
            metadata=self._meta(self.service_name),
            spec=k8s.core.v1.ServiceSpecArgs(
                # Reachable while its node is NotReady (there is only ever one member to reach): agents that can
                # still talk to the store keep using it instead of losing it with the node's Ready condition.
                type="ClusterIP", selector=self._selector, publish_not_ready_addresses=True,
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
        member = self._create_member(name, sa, priority, certs, child)
        # A drain may always take it (the agents ride out its move, training/runtime/eks_ddp_runtime/rendezvous/handler.py); a budget of
        # zero disruptions would fail every system node-group update.
        k8s.policy.v1.PodDisruptionBudget(
            f"{name}-etcd-pdb",
            metadata=self._meta(self.service_name),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, unhealthy_pod_eviction_policy="AlwaysAllow",
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self._selector)),
            opts=child)

        # Built from the Service and the StatefulSet so that consumers wait for a ready member.
        self.endpoint = pulumi.Output.all(client.metadata.name, member.metadata.name, args.namespace).apply(
            lambda v: f"{v[0]}.{v[2]}.svc.cluster.local:{CLIENT_PORT}")
        self.client_tls_secret = certs.client_secret
        self.certificate_expiries = certs.expiries
        """The store's certificates' ends and renewal windows (preflight warns near them)."""
        self.register_outputs({"endpoint": self.endpoint, "service_name": self.service_name,
                               "client_tls_secret": self.client_tls_secret})

    def _meta(self, name: str, labels: Mapping[str, str] | None = None) -> k8s.meta.v1.ObjectMetaArgs:
        return k8s.meta.v1.ObjectMetaArgs(name=name, namespace=self._args.namespace,
                                          labels=dict(labels or self.pod_labels))

    def _create_network_policy(self, name: str, child: pulumi.ResourceOptions) -> None:
        # Ingress: the client port from the training pods only (the metrics port is reached by the node's
        # kubelet, which the VPC CNI's policy agent always admits). Egress: none; one member talks to nobody.
        k8s.networking.v1.NetworkPolicy(
            f"{name}-etcd-netpol",
            metadata=self._meta(self.service_name),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self._selector),
                policy_types=["Ingress", "Egress"],
                ingress=[
                    k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                        from_=[k8s.networking.v1.NetworkPolicyPeerArgs(
                            pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(labels)))
                            for labels in (self._args.client_labels, *self._args.more_client_labels)],
                        ports=[k8s.networking.v1.NetworkPolicyPortArgs(port=CLIENT_PORT, protocol="TCP")]),
                ],
                egress=[]),
            opts=child)

    def _create_member(self, name: str, sa: k8s.core.v1.ServiceAccount, priority: k8s.scheduling.v1.PriorityClass,
                       certs: RendezvousTls, child: pulumi.ResourceOptions) -> k8s.apps.v1.StatefulSet:
        a = self._args
        v1 = k8s.core.v1
        size = store_size(a.max_agents)
        probe = dict(port="metrics", scheme="HTTP")
        container = v1.ContainerArgs(
            name="etcd",
            image=a.image,
            image_pull_policy="IfNotPresent",
            command=["/usr/local/bin/etcd"],
            args=pulumi.Output.from_input(a.namespace).apply(lambda ns: etcd_args(self.service_name, ns, size)),
            # The pod's UID names this incarnation (etcd_args: --initial-cluster-token), so each has its own cluster ID.
            env=[v1.EnvVarArgs(name="POD_UID", value_from=v1.EnvVarSourceArgs(
                field_ref=v1.ObjectFieldSelectorArgs(field_path="metadata.uid")))],
            ports=[v1.ContainerPortArgs(name="client", container_port=CLIENT_PORT),
                   v1.ContainerPortArgs(name="metrics", container_port=METRICS_PORT)],
            readiness_probe=v1.ProbeArgs(
                http_get=v1.HTTPGetActionArgs(path="/health", **probe),
                period_seconds=5, timeout_seconds=3, failure_threshold=3),
            liveness_probe=v1.ProbeArgs(
                http_get=v1.HTTPGetActionArgs(path="/health?serializable=true", **probe),
                initial_delay_seconds=15, period_seconds=10, timeout_seconds=5, failure_threshold=6),
            resources=_resources(size),
            security_context=restricted_container_security(ETCD_UID),
            volume_mounts=[v1.VolumeMountArgs(name="data", mount_path=DATA_DIR),
                           v1.VolumeMountArgs(name="tls", mount_path=TLS_DIR, read_only=True)],
        )
        spec = v1.PodSpecArgs(
            service_account_name=sa.metadata.name,
            automount_service_account_token=False,
            enable_service_links=False,
            node_selector=a.node_selector,
            # System pools are commonly tainted CriticalAddonsOnly; the rendezvous is such an add-on.
            # No short not-ready/unreachable tolerations: evicting a StatefulSet pod from a lost node replaces nothing
            # (the next pod waits for the Node to go), it would only restart a store that still serves.
            tolerations=[v1.TolerationArgs(key="CriticalAddonsOnly", operator="Exists")],
            priority_class_name=priority.metadata.name,
            security_context=restricted_pod_security(ETCD_UID),
            termination_grace_period_seconds=10,
            containers=[container],
            volumes=[
                v1.VolumeArgs(name="data", empty_dir=v1.EmptyDirVolumeSourceArgs(
                    size_limit=f"{max(1024, size.data_dir_mib)}Mi")),
                # 0440 with fsGroup = the etcd user: readable by etcd only.
                v1.VolumeArgs(name="tls", secret=v1.SecretVolumeSourceArgs(secret_name=certs.server_secret,
                                                                           default_mode=0o440)),
            ],
        )
        return k8s.apps.v1.StatefulSet(
            f"{name}-etcd",
            metadata=self._meta(self.service_name),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                replicas=a.replicas,
                service_name=self.service_name,
                # At most one member at any time, also during an update: the old pod is gone before the new starts.
                pod_management_policy="OrderedReady",
                update_strategy=k8s.apps.v1.StatefulSetUpdateStrategyArgs(type="RollingUpdate"),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self._selector),
                template=v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        labels=self.pod_labels,
                        # A certificate rotation restarts etcd, which reads its certificates at start.
                        annotations={CERT_ANNOTATION: certs.server_fingerprint}),
                    spec=spec)),
            opts=child)


def etcd_args(service: str, namespace: str, size: StoreSize | None = None) -> list[str]:
    """etcd's flags: TLS with client certificates on the client port, peers on loopback, probes on metrics; quota,
    history compaction and snapshot count from ``size`` (default: :data:`DEFAULT_AGENTS`)."""
    size = size or store_size(DEFAULT_AGENTS)
    return [
        "--name=etcd",
        f"--data-dir={DATA_DIR}/data",
        f"--listen-client-urls=https://0.0.0.0:{CLIENT_PORT}",
        f"--advertise-client-urls=https://{service}.{namespace}.svc.cluster.local:{CLIENT_PORT}",
        f"--listen-peer-urls=http://127.0.0.1:{PEER_PORT}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{PEER_PORT}",
        f"--initial-cluster=etcd=http://127.0.0.1:{PEER_PORT}",
        f"--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}",
        # 'new' is right for every start of a single member: with data it is ignored (etcd restarts from its
        # WAL), and an empty data dir bootstraps a fresh one-member store.
        "--initial-cluster-state=new",
        # $(POD_UID): each incarnation of the store has its own cluster ID (a client can tell a new, empty store).
        f"--initial-cluster-token={service}.{namespace}.$(POD_UID)",
        # Only clients with a certificate from the stack's CA (components/eks_ddp/workloads/etcd_tls.py): the agents
        # unpickle what they read.
        "--client-cert-auth=true",
        f"--trusted-ca-file={TLS_DIR}/ca.crt",
        f"--cert-file={TLS_DIR}/tls.crt",
        f"--key-file={TLS_DIR}/tls.key",
        # The store never fills (eks_ddp.core.rendezvous_store): etcd compacts its own history every retention
        # period, and the pages compaction frees are reused by later writes (bbolt's freelist), so no defragmentation
        # is needed; the quota holds the model's worst history with room for fragmentation.
        f"--quota-backend-bytes={size.quota_bytes}",
        "--auto-compaction-mode=periodic",
        f"--auto-compaction-retention={size.compaction_retention}",
        # Entries kept in memory between snapshots: sized so the raft log stays ~64 MiB at the largest entry.
        f"--snapshot-count={size.snapshot_count}",
        "--log-level=warn",
    ]


def _validate(name: str, a: EtcdRendezvousArgs) -> None:
    rules.require(rules.namespace("namespace", a.namespace) if isinstance(a.namespace, str) else None)
    if a.replicas != 1:
        raise ValueError(f"replicas: got {a.replicas!r}; expected 1 (the rendezvous is soft state the agents "
                         "rebuild; see the EtcdRendezvous docstring)")
    if not a.client_labels:
        raise ValueError("client_labels: got {}; expected the training pods' labels (an empty selector "
                         "would admit every pod in the namespace)")
    if any(not labels for labels in a.more_client_labels):
        raise ValueError(f"more_client_labels: got {list(a.more_client_labels)!r}; expected non-empty label sets "
                         "(an empty selector would admit every pod in the namespace)")
    if type(a.max_agents) is not int or a.max_agents < 1:
        raise ValueError(f"max_agents: got {a.max_agents!r}; expected the largest GPU group's maxSize, an integer >= 1")
    if "@sha256:" not in a.image:
        raise ValueError(f"image: got {a.image!r}; expected an image pinned by digest (repo:tag@sha256:...)")
    if len(f"{name}-etcd-tls-client-tls") > 63:
        raise ValueError(f"name: got {name!r}; expected at most 44 characters (names become DNS labels)")


def store_selector(service_name: str) -> dict[str, str]:
    """The selector of store ``service_name``'s Service, StatefulSet, PodDisruptionBudget and NetworkPolicy (its
    members carry it); a client's egress rule selects exactly these labels (:func:`etcd_client_egress`)."""
    return {"app.kubernetes.io/name": SERVER_LABELS["app.kubernetes.io/name"],
            "app.kubernetes.io/instance": service_name}


def store_service_of(endpoint: str) -> str:
    """The Service name in an EtcdRendezvous endpoint (``<service>.<namespace>.svc.cluster.local:2379``)."""
    return endpoint.rsplit(":", 1)[0].split(".", 1)[0]


def etcd_client_egress(server_selector: pulumi.Input[Mapping[str, str]]
                       ) -> k8s.networking.v1.NetworkPolicyEgressRuleArgs:
    """The clients' egress rule: the client port of the store whose Service selects ``server_selector`` (same
    namespace), never 2379 anywhere else.

    ``server_selector`` must be the store Service's own selector (:func:`store_selector`, or
    ``EtcdRendezvous.server_selector``), not just labels its pods carry. The agents dial the Service's ClusterIP,
    and the EKS VPC CNI agent enforces egress on the pod's veth before kube-proxy's DNAT, so it sees the ClusterIP;
    the network policy controller admits a ClusterIP under a rule only if the rule's podSelector matches the
    Service's ``spec.selector`` as a label set (aws/amazon-network-policy-controller-k8s,
    pkg/resolvers/endpoints.go, ``getMatchingServiceClusterIPs``). With the Service's selector the rule admits
    both the ClusterIP and the member's pod IPs (components/eks_ddp/tooling/contracts/network.py checks it on the plan)."""
    net = k8s.networking.v1
    return net.NetworkPolicyEgressRuleArgs(
        to=[net.NetworkPolicyPeerArgs(pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=server_selector))],
        ports=[net.NetworkPolicyPortArgs(port=CLIENT_PORT, protocol="TCP")])
