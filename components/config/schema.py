"""Stack configuration schema: the typed, frozen dataclasses a stack file becomes.

One dataclass per top-level ``eks-ddp:*`` key; each field carries its documentation (the reference table
of ``docs/configuration.md`` is generated from it, see ``reference.py``) and, where not plain
camelCase, its YAML key. Reading raw values into these is ``reader.py``; the cross-field
checks are ``checks.py``; ``__init__.py`` ties them together (``load_stack_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from eks_ddp.core import catalog, k8s_versions, rules

PROJECT = "eks-ddp"

#: Set while the offline plan (``components/tooling/plan.py``) runs the program: nothing is created then, so
#: the example stacks' placeholder CIDRs are reported as a note instead of stopping the plan.
OFFLINE_PLAN_ENV = "EKS_DDP_OFFLINE_PLAN"

CapacityType = Literal["onDemand", "spot", "capacityBlock"]
NatMode = Literal["single", "perAz"]
ModelName = Literal["airnet", "resnet-small", "resnet18", "workshop-cnn"]
RdzvBackend = Literal["etcd-v2", "c10d"]
RunState = Literal["run", "cancelled"]
ScanSeverity = Literal["CRITICAL", "HIGH", "MEDIUM", "LOW", "INFORMATIONAL", "disabled"]

DEFAULT_KUBERNETES_VERSION = k8s_versions.DEFAULT_VERSION
SUPPORTED_KUBERNETES_VERSIONS = k8s_versions.SUPPORTED_VERSIONS
UpgradePolicy = Literal["STANDARD", "EXTENDED"]
WorkloadKind = Literal["cifar10", "custom"]

DNS_LABEL = rules.DNS_LABEL


class ConfigError(ValueError):
    """Bad stack config; ``problems`` holds one line per bad key."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack config:\n" + "\n".join(f"  - {p}" for p in problems))


def _doc(text: str, *, key: str | None = None, **kw: Any) -> Any:
    """A dataclass field carrying its documentation and, if not plain camelCase, its YAML key."""
    return field(metadata={"doc": text, "key": key}, **kw)


@dataclass(frozen=True, kw_only=True)
class NetworkConfig:
    """``eks-ddp:network``: a new VPC, or an existing one."""

    vpc_cidr: str = _doc("CIDR of the new VPC (/16 to /24).", default="10.0.0.0/16")
    az_count: int = _doc("Availability zones the new VPC spans (2-6).", default=2)
    availability_zones: tuple[str, ...] = _doc(
        "Explicit zones; default: the region's first azCount regular zones EKS accepts.", default=())
    nat_gateways: NatMode = _doc("'single' (cheaper) or 'perAz' (zone-failure tolerant).", default="single")
    vpc_id: str | None = _doc("Existing VPC to use instead of creating one.", default=None)
    public_subnet_ids: tuple[str, ...] = _doc("Existing public subnets (with vpcId).", default=())
    private_subnet_ids: tuple[str, ...] = _doc("Existing private subnets for nodes (with vpcId).", default=())
    s3_endpoint_extra_buckets: tuple[str, ...] = _doc(
        "Other accounts' S3 buckets (names) your workloads read themselves (a data lake, AWS Open Data): the new "
        "VPC's S3 endpoint admits only this account's buckets, the runs' data.s3 prefixes and these (list, get); "
        "preflight checks each exists.", default=())

    @property
    def bring_your_own(self) -> bool:
        return self.vpc_id is not None


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """``eks-ddp:cluster``: the EKS control plane and the CPU system node group."""

    public_access_cidrs: tuple[str, ...] = _doc(
        "CIDRs allowed to reach the Kubernetes API endpoint (required while endpointPublicAccess is true), "
        "e.g. your IP as a /32.", default=())
    endpoint_public_access: bool = _doc(
        "Serve the Kubernetes API on a public endpoint too, reachable only from publicAccessCidrs. false: the "
        "private endpoint only (CIS EKS 5.4.2); then pulumi, kubectl and the Kubernetes provider must run from "
        "the VPC or a network joined to it (VPN, Direct Connect, a bastion).", default=True)
    kubernetes_version: str = _doc("EKS Kubernetes version.", default=DEFAULT_KUBERNETES_VERSION)
    upgrade_policy: UpgradePolicy = _doc(
        "'STANDARD': EKS upgrades the cluster when standard support ends ($0.10/h); 'EXTENDED': keeps the "
        "version and bills extended support ($0.60/h).", default=k8s_versions.DEFAULT_SUPPORT_TYPE)
    system_instance_type: str = _doc("CPU instance type of the system node group.", default="t3.large")
    system_node_count: int = _doc("Nodes in the system node group (etcd, CoreDNS, add-ons).", default=2)
    log_retention_days: int = _doc("CloudWatch retention of control-plane logs.", default=30)
    admin_principal_arns: tuple[str, ...] = _doc(
        "IAM role/user ARNs given cluster-admin besides the creator of the cluster (a teammate, a CI role).",
        default=())
    viewer_principal_arns: tuple[str, ...] = _doc(
        "IAM role/user ARNs that may only look (AmazonEKSViewPolicy: objects and pod logs, no Secrets, no "
        "changes); each principal in one list only.", default=())
    scale_down_unneeded_time: str = _doc(
        "How long a GPU node must sit unneeded before the cluster autoscaler removes it (e.g. 10m, 1h): "
        "the idle tail after a run; longer keeps nodes warm between runs.", default="10m")
    name: str | None = _doc(
        "EKS cluster name (and its log group /aws/eks/<name>/cluster); unset: eks-ddp-<stack>. Preflight refuses "
        "a name another stack's cluster has in the account and region: set one unique there.", default=None)
    owner_id: str | None = _doc(
        "A value unique to this stack (8-64 letters, digits, '.', '_', '-'), set once and kept: it makes the owner "
        "tag (eks-ddp/stack) of the cluster and its log group unique on a self-managed backend (S3, GCS, Azure, "
        "--local), where every organization is 'organization'. Required there (preflight says); e.g. "
        "pulumi config set --path cluster.ownerId $(python3 -c 'import uuid; print(uuid.uuid4().hex)').",
        default=None)


@dataclass(frozen=True, kw_only=True)
class NodeGroupConfig:
    """One entry of ``eks-ddp:nodeGroups``: a GPU managed node group."""

    name: str = _doc("Node group name (DNS label, unique).")
    instance_type: str = _doc("GPU instance type from the catalog.")
    min_size: int = _doc("Minimum nodes; 0 lets the group scale to zero when idle.", default=0)
    desired_size: int = _doc("Nodes at creation; ignored afterwards (the autoscaler or you own it).", default=0)
    max_size: int = _doc("Maximum nodes.", default=2)
    capacity_type: CapacityType = _doc("'onDemand', 'spot' or 'capacityBlock'.", default="onDemand")
    efa: bool = _doc("Attach the type's EFA interfaces, keep one AZ; a new cluster placement group unless "
                     "placementGroupName or a reservation is given.", default=False)
    capacity_reservation_id: str | None = _doc(
        "On-demand capacity reservation or capacity block (cr-...) to launch into.", default=None)
    availability_zone: str | None = _doc(
        "Pin the group to one zone (required with capacityReservationId).", default=None)
    placement_group_name: str | None = _doc(
        "Existing placement group to launch into: the reservation's, if it was created in one (preflight "
        "checks); not with capacityBlock.", default=None)
    root_volume_gib: int = _doc("gp3 root volume size in GiB (images are multi-GB).", default=200,
                                key="rootVolumeGiB")
    spot_instance_types: tuple[str, ...] = _doc(
        "More types a spot group may launch (fewer interruptions): catalog types with the same GPU count "
        "and model as instanceType.", default=())

    @property
    def instance(self) -> catalog.InstanceType:
        return catalog.lookup(self.instance_type)


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    """``eks-ddp:storage``: the shared EFS volume."""

    retain_on_destroy: bool = _doc(
        "Keep the EFS file system (checkpoints, data) on 'pulumi destroy'.", default=True)
    file_system_id: str | None = _doc(
        "Existing EFS file system to use (e.g. one kept by an earlier 'pulumi destroy'): its checkpoints are "
        "seen again; none is created.", default=None)
    results_bucket: str | None = _doc(
        "Existing S3 bucket for run results (e.g. the one an earlier 'pulumi destroy' kept, as 'pulumi stack "
        "output results' named it): uploads go there; none is created.", default=None)
    results_kms_key_arn: str | None = _doc(
        "With resultsBucket: the KMS key (ARN) the bucket encrypts with by default (the earlier stack's results "
        "kmsKeyArn output); the uploaders may use it. Preflight refuses an SSE-KMS bucket whose key differs.",
        default=None)


@dataclass(frozen=True, kw_only=True)
class ImageConfig:
    """``eks-ddp:image``: the trainer image."""

    prebuilt: str | None = _doc("Use this image (repo@sha256:digest) instead of building one.", default=None)
    keep_images: int = _doc("Images the ECR lifecycle policy keeps.", default=10)
    retain_repository: bool = _doc(
        "Keep the ECR repository and its images on 'pulumi destroy' (then delete it by hand); default: "
        "destroy deletes them.", default=False)
    scan_fail_severity: ScanSeverity = _doc(
        "Fail 'pulumi up' before any job runs the image if ECR's scan on push finds anything at or above this "
        "severity; 'disabled' runs it unchecked. Gates every runs[i].workload.image in ECR too; images outside ECR "
        "are not gated.", default="CRITICAL")
    registry_cache: bool = _doc(
        "Share the BuildKit layer cache through a second, mutable ECR repository (faster builds in CI); the "
        "build trusts its layers, so anyone who can push to it can plant code in the image. Default: local "
        "cache only.", default=False)


@dataclass(frozen=True, kw_only=True)
class EtcdConfig:
    """``eks-ddp:etcd``: the rendezvous server."""

    replicas: int = _doc("etcd members: 1 (the rendezvous store is one member; docs/rendezvous.md).",
                         default=1)


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """``eks-ddp:job``: the elastic training job."""

    node_group: str | None = _doc("GPU node group the job runs on; default: the first.", default=None)
    nodes: int = _doc("Pods (torchrun agents, one per node) the job runs: the max of --nnodes.", default=2)
    min_nodes: int = _doc("Fewest nodes training continues with: the min of --nnodes.", default=1)
    max_restarts: int = _doc("Fault budget per agent (--max-restarts): each crash or lost node costs one restart, a "
                             "joining node none; a FATAL trainer exit code fails at once.", default=20)
    fault_budget: int = _doc("Pod failures the run absorbs before the Job fails (its backoffLimit); lost nodes, "
                             "drains and preemptions never count, trainer exit codes 2-5 fail at once.", default=20)
    active_deadline_hours: float = _doc("Hours the training Job may stay active, waiting for nodes included, "
                                        "before Kubernetes stops it.", default=48)
    run_id: str = _doc("Run name: checkpoints under /shared/runs/<runId>; a new id starts fresh.", default="run-1")
    epochs: int = _doc("Training epochs.", default=10)
    global_batch_size: int = _doc("Images per optimizer step over all GPUs (the trainer caps it on small data "
                                  "sets); a resize keeps it.", default=1024)
    model: ModelName = _doc("'airnet' (airbench94-class CIFAR net), 'resnet-small', 'resnet18' or 'workshop-cnn'.",
                            default="airnet")
    learning_rate: float | None = _doc("Peak learning rate per 1,024 images; default: the model's recipe.",
                                       default=None)
    rdzv_backend: RdzvBackend = _doc("'etcd-v2' (EtcdRendezvous, client certificates) or 'c10d' (no etcd; an "
                                     "unauthenticated store whose state every agent unpickles: trusted clusters "
                                     "only, docs/rendezvous.md).", default="etcd-v2")
    namespace: str = _doc("Kubernetes namespace of the training workloads.", default="training")
    compile: bool = _doc("Use torch.compile in the trainer.", default=False)
    fabric_check: bool | None = _doc(
        "Run the fabric check (all-reduce sweep, EFA transport, bandwidth floor; writes fabric.json) on every "
        "node before training starts; default: true when the job's group has efa.", default=None)
    state: RunState = _doc("'run', or 'cancelled': the training Job is removed and never created again by a later "
                           "pulumi up (checkpoints stay; 'run' resumes from them). The cancel output sets it.",
                           default="run")


@dataclass(frozen=True, kw_only=True)
class CatalogEntryConfig:
    """One entry of ``eks-ddp:catalog``: an instance type the built-in catalog does not list."""

    name: str = _doc("EC2 instance type (x86_64), e.g. g7e.12xlarge; then usable as instanceType, "
                     "spotInstanceTypes or systemInstanceType.")
    gpus: int = _doc("NVIDIA GPUs per instance (0: a CPU type, for the system group).", default=0)
    gpu_model: str | None = _doc("GPU model, e.g. L40S (the node label nvidia-<model>); required with gpus.",
                                 default=None)
    gpu_memory_gib: int = _doc("Memory per GPU in GiB; required with gpus.", default=0, key="gpuMemoryGiB")
    vcpus: int = _doc("vCPUs per instance (pod sizing, vCPU quotas).")
    memory_gib: int = _doc("Instance memory in GiB (pod sizing).", key="memoryGiB")
    efa_interfaces: int = _doc("EFA-capable network cards; 0: no EFA.", default=0)
    efa_only_secondary: bool = _doc("Make the EFA interfaces on cards > 0 EFA-only (no IP address), as AWS "
                                    "recommends for p5-class types.", default=False)
    network_gbps: int | None = _doc("Per-node network bandwidth in Gbps (the fabric check's floor); required with "
                                    "efaInterfaces.", default=None)
    price_usd_per_hour: float = _doc("On-demand $/hour, for the cost estimate.", key="priceUsdPerHour")
    price_source: str = _doc("Where the price comes from (shown with the estimate).", default="eks-ddp:catalog")


#: Keys of a run that only the bundled CIFAR-10 trainer reads: with your own workload they would do nothing.
TRAINER_ONLY_KEYS = ("epochs", "globalBatchSize", "model", "learningRate", "compile")


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """``runs[i].workload``: what a run trains. Plain data; the program turns it into a ``Workload``.

    In YAML either the string ``cifar10`` (the bundled trainer, the default) or an object with the keys
    below (your own entrypoint), so ``kind`` has no key of its own."""

    kind: WorkloadKind = _doc("'cifar10' (the bundled trainer) or 'custom' (an object).", default="cifar10",
                              key="-")
    image: str | None = _doc("Image the run's pods run (repo@sha256:digest); default: the stack's image. In ECR "
                             "the nodes get pull rights on its repository, and it is scan-gated (image.scanFailSeverity).",
                             default=None)
    module: str | None = _doc("Python module the launcher runs (like python -m), e.g. mypkg.train; exactly one "
                              "of module and script.", default=None)
    script: str | None = _doc("Script in the image the launcher runs, e.g. /app/train.py; exactly one of module "
                              "and script.", default=None)
    args: tuple[str, ...] = _doc("Arguments after the module or script.", default=())
    env: Mapping[str, str] = _doc(
        "Environment variables of every worker (names like MY_VAR; not EKS_DDP_*, which the job sets).",
        default_factory=lambda: MappingProxyType({}))
    s3_uri: str | None = _doc(
        "S3 prefix (s3://bucket/prefix/) staged once onto the shared volume, read-only, as $EKS_DDP_DATA_DIR; "
        "default: no data stage.", default=None, key="data.s3")
    s3_sha256: str | None = _doc(
        "The data set's pin: the sha256 of the manifest the S3 stage writes and logs; the stage and every "
        "training pod then refuse other content (exit 5). Default: checked against the manifest alone.",
        default=None, key="data.sha256")
    egress: tuple[str, ...] = _doc(
        "Where the training pods connect outside the cluster, each opened in their NetworkPolicy (nothing else is): "
        "'https' (public addresses on 443), 'internet:PORTS', or 'CIDR:PORTS' (e.g. '10.20.0.0/16:5432'; "
        "'/udp' after the ports for UDP).", default=())
    iam_statements: tuple[Mapping[str, Any], ...] = _doc(
        "IAM policy statements ({Effect, Action, Resource, Condition}) the training pods need, added to the run's "
        "IRSA role (the results uploader's).", default=())

    @property
    def custom(self) -> bool:
        return self.kind == "custom"


@dataclass(frozen=True, kw_only=True)
class RunConfig(JobConfig):
    """One run: the ``eks-ddp:job`` keys plus what it trains. ``job:`` is the one-run form (the CIFAR-10
    trainer); each entry of ``runs:`` is one of these."""

    workload: WorkloadConfig = _doc(
        "'cifar10' (the bundled trainer) or your own: an object with the workload keys below.",
        default_factory=WorkloadConfig)


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    """The whole validated stack config."""

    region: str
    network: NetworkConfig
    cluster: ClusterConfig
    node_groups: tuple[NodeGroupConfig, ...]
    storage: StorageConfig
    image: ImageConfig
    etcd: EtcdConfig
    runs: tuple[RunConfig, ...]
    """Always at least one: ``job:`` gives one, ``runs:`` one per entry."""
    runs_listed: bool = False
    """True when the runs come from ``runs:`` (keys ``runs[i].*``), false for ``job:`` (keys ``job.*``)."""
    catalog: tuple[catalog.InstanceType, ...] = ()
    """The stack's own instance types (``eks-ddp:catalog``), registered in the catalog when loaded."""
    preflight: bool = True

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("StackConfig.runs: got (); expected at least one run")

    @property
    def job(self) -> RunConfig:
        """The first run (the only one with ``job:``)."""
        return self.runs[0]

    def run_key(self, index: int) -> str:
        """The YAML key of run ``index`` for messages: ``job`` or ``runs[<index>]``."""
        return f"runs[{index}]" if self.runs_listed else "job"

    def node_group(self, name: str) -> NodeGroupConfig:
        return next(g for g in self.node_groups if g.name == name)

    def group_of(self, run: JobConfig) -> NodeGroupConfig:
        """The GPU node group a run runs on (its nodeGroup, default the first)."""
        return self.node_group(run.node_group or self.node_groups[0].name)

    @property
    def job_group(self) -> NodeGroupConfig:
        return self.group_of(self.job)

    def fabric_check_of(self, run: JobConfig) -> bool:
        """A run's ``fabricCheck``, defaulting to its group's ``efa``."""
        return run.fabric_check if run.fabric_check is not None else self.group_of(run).efa

    @property
    def fabric_check(self) -> bool:
        """``job.fabricCheck``, defaulting to the job group's ``efa``."""
        return self.fabric_check_of(self.job)

    @property
    def uses_efa(self) -> bool:
        return any(g.efa for g in self.node_groups)

    @property
    def uses_etcd(self) -> bool:
        """Whether any run rendezvouses through etcd (then the stack deploys EtcdRendezvous)."""
        return any(r.rdzv_backend == "etcd-v2" for r in self.runs)


# Top-level keys: YAML key (without the "eks-ddp:" prefix) -> description. "job" and "runs" are alternatives.
TOP_LEVEL_KEYS = {
    "network": NetworkConfig,
    "cluster": ClusterConfig,
    "nodeGroups": NodeGroupConfig,
    "storage": StorageConfig,
    "image": ImageConfig,
    "etcd": EtcdConfig,
    "job": JobConfig,
    "runs": RunConfig,
    "catalog": CatalogEntryConfig,
    "preflight": bool,
}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def yaml_key(f: Any) -> str:
    """The YAML key of a config dataclass field."""
    return f.metadata.get("key") or camel(f.name)

