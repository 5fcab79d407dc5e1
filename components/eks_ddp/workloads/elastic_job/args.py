"""The inputs of :class:`~eks_ddp.workloads.elastic_job.ElasticJob`: a few typed parts, each checking itself where
it is built (a bad value fails on your line, naming ``<part>.<field>``, the value and what is allowed).

- :class:`Placement`: where the agents run (the GPU type, EFA, the node groups' labels, the group's max size);
  :meth:`Placement.on` derives it from a node group, so the type is stated once.
- :class:`Size`: how many agents, and how many failures and hours the run may spend.
- the storage: :class:`PerRunClaims` (the dataset and this run's directory, what the stack uses) or
  :class:`WholeVolume` (one claim of the whole shared volume).
- the rendezvous: :class:`EtcdStore` (an ``EtcdRendezvous`` or a store of your own) or :class:`C10d` (the agent of
  index 0 hosts the store).
- :class:`Results` or None: where rank 0 uploads the run's results, and the role it does so with.
- :class:`Queued` or None: the Kueue queue the run's GPU Jobs wait in (``RunQueue.queued(priority)``).

Images, roles and policies are infra's (``eks_ddp.infra``): the job takes their references and builds only
Kubernetes objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import pulumi

from eks_ddp.core import catalog, rules
from eks_ddp.core.types import RdzvBackend, RunState
from eks_ddp.core.workload import Cifar10Data, Workload, cifar10_workload
from eks_ddp_runtime.launch_command import DEFAULT_MAX_RESTARTS

DEFAULT_FAULT_BUDGET = 20
"""Pod failures a run absorbs by default: spot capacity can take a node many times in one run."""
INSTANCE_TYPE_LABEL = "eks-ddp/instance-type"
"""The label every node of a :class:`~eks_ddp.infra.gpu_nodegroup.GpuNodeGroup` carries with its instance type."""


class NodeGroupLike(Protocol):
    """What :meth:`Placement.on` reads of a node group (:class:`eks_ddp.GpuNodeGroup` has it)."""

    group_name: str
    instance_type: str
    efa: bool
    max_size: int
    node_labels: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where the agents run: one pod per node of a GPU node group."""

    instance_type: str | None = None
    """The group's GPU instance type: drives --nproc-per-node and the GPU/EFA/CPU/memory requests. None: read
    from ``node_selector``'s ``eks-ddp/instance-type`` label (a GpuNodeGroup's ``node_labels`` carry it)."""
    efa: bool = False
    """The node group attaches EFA interfaces: request them and configure NCCL for libfabric."""
    node_selector: pulumi.Input[Mapping[str, str]] | None = None
    """Labels of the job's GPU node group (``GpuNodeGroup.node_labels``)."""
    system_node_selector: pulumi.Input[Mapping[str, str]] | None = None
    """Labels of the CPU system nodes. Data preparation runs there: it needs no GPU, and a GPU group scaled
    to zero would leave it Pending (and ``pulumi up``, which awaits it, hanging). None: no nodeSelector; the
    pod still never lands on a GPU node, since it does not tolerate their taint."""
    max_nodes: int | None = None
    """The group's ``max_size``: ``size.nodes`` may not exceed it (the autoscaler never grows the group past it,
    and the extra pods would stay Pending). None: not checked."""
    group: str | None = None
    """The group's name, for messages."""

    @classmethod
    def on(cls, group: NodeGroupLike, *, system_node_selector: pulumi.Input[Mapping[str, str]] | None = None
           ) -> Placement:
        """The placement on ``group``: its instance type, EFA, labels and max size, stated once."""
        return cls(instance_type=group.instance_type, efa=group.efa, node_selector=group.node_labels,
                   system_node_selector=system_node_selector, max_nodes=group.max_size, group=group.group_name)

    def __post_init__(self) -> None:
        labelled = self.node_selector.get(INSTANCE_TYPE_LABEL) if isinstance(self.node_selector, Mapping) else None
        if self.instance_type is None:
            if labelled is None:
                raise ValueError("placement.instance_type: got None and node_selector carries no "
                                 f"{INSTANCE_TYPE_LABEL!r} label; expected the node group's GPU instance type, "
                                 "e.g. Placement.on(gpu_group)")
            object.__setattr__(self, "instance_type", labelled)
        elif labelled is not None and labelled != self.instance_type:
            raise ValueError(
                f"placement.instance_type: got {self.instance_type!r}, but placement.node_selector selects nodes "
                f"of {labelled!r} (label {INSTANCE_TYPE_LABEL}); expected the group's own type: the pods would ask "
                f"for {self.instance_type}'s GPUs and never schedule. Use Placement.on(<the group>), or leave "
                "instance_type out")
        try:
            it = catalog.lookup(str(self.instance_type))
        except KeyError as err:
            raise ValueError(f"placement.instance_type: {err.args[0]}") from None
        rules.require(
            None if it.gpus >= 1 else
            f"placement.instance_type: got {self.instance_type!r}, which has no GPU; expected a GPU type",
            f"placement.efa: got True for {self.instance_type!r}, which has no EFA interfaces; expected False"
            if self.efa and not it.has_efa else None,
            None if self.max_nodes is None else rules.whole("placement.max_nodes", self.max_nodes))

    @property
    def instance(self) -> catalog.InstanceType:
        """The catalog's entry of ``instance_type``."""
        return catalog.lookup(str(self.instance_type))


@dataclass(frozen=True, kw_only=True)
class Size:
    """How many agents, and what the run may spend on failures and time."""

    nodes: int = 2
    """torchrun agents (one pod per node): the max of --nnodes."""
    min_nodes: int = 1
    """Fewest agents training continues with: the min of --nnodes."""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """torchrun --max-restarts: the fault budget per agent (each crash or lost node costs one restart)."""
    fault_budget: int = DEFAULT_FAULT_BUDGET
    """Pod failures the whole run may have before the Job fails (the Job's backoffLimit). Pods lost with
    their node, drained, evicted or preempted never count; the workload's ``bug_exit_codes`` fail at once."""
    active_deadline_hours: float | None = 48
    """Hours the training Job may stay active, Pending time included, before Kubernetes stops it
    (DeadlineExceeded); None: no limit. Bounds a job whose pods wait for GPU capacity that never comes."""
    ttl_seconds_after_finished: int | None = None
    """Seconds a finished training Job (and its pod logs) is kept; None (the default): kept until the run is removed.
    A Complete Job holds no pods. Once a Job is gone, ``pulumi up --refresh`` (every ``up`` of this project's
    ``Pulumi.yaml``) creates it again, and the new Job resumes the run; its launcher ends at once in a run
    directory that holds the final marker of the same command (eks_ddp_runtime/launch.py)."""

    def __post_init__(self) -> None:
        rules.require(
            rules.whole("size.nodes", self.nodes), rules.whole("size.min_nodes", self.min_nodes),
            rules.whole("size.max_restarts", self.max_restarts, 0),
            rules.whole("size.fault_budget", self.fault_budget, 0),
            None if self.ttl_seconds_after_finished is None else
            rules.whole("size.ttl_seconds_after_finished", self.ttl_seconds_after_finished, 0))
        if isinstance(self.nodes, int) and isinstance(self.min_nodes, int) and not 1 <= self.min_nodes <= self.nodes:
            raise ValueError(f"size.min_nodes: got {self.min_nodes}; expected 1 <= min_nodes <= nodes ({self.nodes})")
        hours = self.active_deadline_hours
        if hours is not None and not (isinstance(hours, (int, float)) and hours * 3600 >= 1):
            raise ValueError(f"size.active_deadline_hours: got {hours!r}; expected None or at least 1 second")


@dataclass(frozen=True, kw_only=True)
class PerRunClaims:
    """The shared volume per workload: no pod sees another run's directory (what the stack uses)."""

    data: pulumi.Input[str]
    """The dataset's claim (EfsStore.data_claim_name), mounted at /shared/data: read-write in the data stage,
    read-only in every other pod."""
    run: pulumi.Input[str]
    """This run's claim (EfsStore.run_claim_names[run_id]), mounted at /shared/runs/<run_id> in the training,
    fabric-check and evaluation pods; the data stage does not mount it."""
    data_read_only: pulumi.Input[str] | None = None
    """The dataset's read-only claim (EfsStore.data_read_only_claim_name): every pod but the data stage mounts it
    instead of ``data``, so the file system itself refuses their writes to the dataset."""


@dataclass(frozen=True, kw_only=True)
class WholeVolume:
    """A ReadWriteMany claim of the whole shared volume, mounted at /shared in every pod."""

    claim: pulumi.Input[str]


Storage = PerRunClaims | WholeVolume


def _selector_problem(labels: Any) -> str | None:
    if labels is None or (isinstance(labels, Mapping) and labels and all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
        return None
    return (f"rendezvous.server_labels: got {labels!r}; expected None (the EtcdRendezvous of endpoint) or the "
            "store Service's selector, a non-empty mapping of strings")


@dataclass(frozen=True, kw_only=True)
class EtcdStore:
    """An etcd v3 store every agent of the run reaches over TLS (:class:`~eks_ddp.workloads.etcd.EtcdRendezvous`)."""

    backend: ClassVar[RdzvBackend] = "etcd"
    endpoint: pulumi.Input[str]
    """Client endpoint host:port (EtcdRendezvous.endpoint)."""
    tls_secret: pulumi.Input[str]
    """Secret with the client certificate (tls.crt, tls.key, ca.crt; EtcdRendezvous.client_tls_secret), mounted
    read-only into the agents' pods: the store accepts only clients with its certificate."""
    server_labels: Mapping[str, str] | None = None
    """The store Service's selector (same namespace): the training and fabric-check pods' egress rule to the client
    port selects exactly these labels, which admits the Service's ClusterIP on EKS (``etcd_client_egress``). None:
    the selector of the EtcdRendezvous whose ``endpoint`` this is (``EtcdRendezvous.server_selector``); set it for
    a store of your own."""

    @classmethod
    def of(cls, store: Any) -> EtcdStore:
        """The rendezvous through ``store`` (an :class:`~eks_ddp.workloads.etcd.EtcdRendezvous`)."""
        return cls(endpoint=store.endpoint, tls_secret=store.client_tls_secret, server_labels=store.server_selector)

    def __post_init__(self) -> None:
        rules.require(_selector_problem(self.server_labels),
                      None if self.endpoint is not None else "rendezvous.endpoint: got None; expected host:port",
                      None if self.tls_secret is not None else
                      "rendezvous.tls_secret: got None; expected the store's client certificate Secret")


@dataclass(frozen=True, kw_only=True)
class C10d:
    """torch's c10d rendezvous: the agent of index 0 hosts the store (no store to deploy; a lost index 0 ends it)."""

    backend: ClassVar[RdzvBackend] = "c10d"


Rendezvous = EtcdStore | C10d


@dataclass(frozen=True, kw_only=True)
class Results:
    """Where rank 0 uploads the run's results at the end, and the role its pods assume to do so."""

    url: pulumi.Input[str]
    """``s3://<bucket>/runs/<run_id>/`` (HTTPS egress opened)."""
    role_arn: pulumi.Input[str]
    """IAM role (IRSA) the training pods' ServiceAccount ``<name>-trainer`` assumes (ResultsBucket.role_arn or
    ``uploader_role(...)``; with ``workload.iam_statements``, the ARN ``eks_ddp.infra.iam.workload_policy``
    returns)."""
    kms_key_arn: pulumi.Input[str] | None = None
    """The results bucket's KMS key (ResultsBucket.kms_key_arn): the uploader writes every object under it."""


@dataclass(frozen=True, kw_only=True)
class Queued:
    """The run's GPU Jobs (training, its fabric check included; the evaluation CronJob's) wait in a Kueue LocalQueue (:class:`~eks_ddp.workloads.queue.
    RunQueue`): created suspended, started by Kueue once the ClusterQueue's quota (and its capacity check) admits them."""

    local_queue: str
    """The LocalQueue (``RunQueue.local_queue``): the Jobs' ``kueue.x-k8s.io/queue-name`` label."""
    priority_class: str
    """The WorkloadPriorityClass (``eks-ddp-<priority>``): the Jobs' ``kueue.x-k8s.io/priority-class`` label."""

    def __post_init__(self) -> None:
        rules.require(rules.dns_label("queue.local_queue", self.local_queue),
                      rules.dns_label("queue.priority_class", self.priority_class))


@dataclass(frozen=True, kw_only=True)
class ElasticJobArgs:
    """Inputs of :class:`ElasticJob`."""

    namespace: pulumi.Input[str]
    """Namespace of every object (Pod Security 'restricted')."""
    placement: Placement
    """Where the agents run: ``Placement.on(gpu_group, system_node_selector=cluster.system_node_labels)``."""
    storage: Storage
    """The shared volume: ``PerRunClaims(data=..., run=...)`` or ``WholeVolume(claim=...)``."""
    rendezvous: Rendezvous
    """``EtcdStore.of(EtcdRendezvous(...))``, or ``C10d()``."""
    workload: Workload = field(default_factory=cifar10_workload)
    """What the agents run (components/eks_ddp/core/workload.py): a module or script, its args, env, image and
    data; default: the bundled CIFAR-10 trainer (``cifar10_workload()``)."""
    image: pulumi.Input[str] | None = None
    """The bundled trainer's image by digest (``TrainerImage.image_ref``): its data preparation and evaluation
    pods run it, and so do the agents unless ``workload.image`` is set. None: ``workload.image`` (required then)."""
    size: Size = field(default_factory=Size)
    """Agents, restarts, fault budget, deadline."""
    results: Results | None = None
    """The results upload; None: nothing uploads (and the training pods get no AWS role)."""
    run_id: str = "run-1"
    """Run name: the run directory is /shared/runs/<run_id>; part of the Job's name."""
    state: RunState = "run"
    """'run', or 'cancelled': no training Job (nor fabric check) is rendered, so a cancelled run stays cancelled
    whatever later ``up``s refresh or replace; checkpoints stay, and 'run' again resumes from them."""
    data_role_arn: pulumi.Input[str] | None = None
    """With ``S3Data``: the IAM role (IRSA) the S3 data stage's ServiceAccount ``<name>-stage`` assumes
    (``eks_ddp.infra.iam.data_stage_role``: list and read that prefix only); required then."""
    fabric_check: bool = False
    """Run ``eks_ddp_runtime.fabric_check`` on every node of the job first, as the training pods' init container
    (fabric_gate.py): EFA transport when ``placement.efa``, the catalog's bandwidth floor; a failed check fails the
    training Job before training starts. Nothing of it is awaited by ``pulumi up``."""
    data_prep_timeout: str = "40m"
    """How long ``pulumi up`` waits for data preparation (fresh nodes pull a multi-GB image first); longer
    than the Job's own 30-minute deadline, so a stuck download surfaces as the Job's failure."""
    queue: Queued | None = None
    """``RunQueue.queued(priority)``: the training Job (its fabric check included) goes through Kueue; None: it starts
    at once."""

    def __post_init__(self) -> None:
        check_rules(self)  # a bad value fails where the Args are built, naming the field

    @property
    def agent_image(self) -> pulumi.Input[str]:
        """What the training, fabric-check and S3-stage pods run: ``workload.image``, else ``image``."""
        image = self.image if self.workload.image is None else self.workload.image
        assert image is not None  # check_rules refuses Args with neither
        return image


def _typed(key: str, value: Any, kinds: tuple[type, ...], expected: str) -> str | None:
    return None if isinstance(value, kinds) else f"{key}: got {value!r}; expected {expected}"


def check_rules(a: ElasticJobArgs) -> None:
    """Each field's own rules and the rules across parts (components/eks_ddp/core/rules.py holds each rule once)."""
    rules.require(
        _typed("workload", a.workload, (Workload,),
               "a Workload (components/eks_ddp/core/workload.py), e.g. cifar10_workload()"),
        _typed("placement", a.placement, (Placement,), "Placement.on(gpu_group) or Placement(instance_type=...)"),
        _typed("size", a.size, (Size,), "Size(nodes=..., min_nodes=...)"),
        _typed("storage", a.storage, (PerRunClaims, WholeVolume), "PerRunClaims(data=..., run=...) or "
               "WholeVolume(claim=...)"),
        _typed("rendezvous", a.rendezvous, (EtcdStore, C10d), "EtcdStore.of(EtcdRendezvous(...)) or C10d()"),
        None if a.results is None else _typed("results", a.results, (Results,), "Results(url=..., role_arn=...) "
                                              "or None"),
        None if a.queue is None else _typed("queue", a.queue, (Queued,), "RunQueue.queued(priority) or None"),
        rules.namespace("namespace", a.namespace) if isinstance(a.namespace, str) else None,
        rules.image_by_digest("image", a.image) if isinstance(a.image, str) else None,
        None if a.state in ("run", "cancelled") else f"state: got {a.state!r}; expected 'run' or 'cancelled'",
        rules.run_id("run_id", a.run_id),
    )
    if a.image is None and (a.workload.image is None or a.workload.evaluate or isinstance(a.workload.data, Cifar10Data)):
        why = "the bundled trainer's data preparation and evaluation run it" if a.workload.image is not None else \
            "the workload has no image of its own"
        raise ValueError(f"image: got None; expected the image by digest ({why}): the bundled trainer's "
                         "(TrainerImage.image_ref), or set workload.image")
    if a.placement.max_nodes is not None and a.size.nodes > a.placement.max_nodes:
        group = f"node group {a.placement.group!r}" if a.placement.group else "the node group"
        raise ValueError(f"size.nodes: got {a.size.nodes}; expected at most {a.placement.max_nodes}, the max_size of "
                         f"{group} the job runs on (one agent per node: the autoscaler never grows the group past "
                         "max_size, and the extra pods would stay Pending)")
