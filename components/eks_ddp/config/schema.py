"""Stack configuration schema: the frozen models a stack file becomes, and the model of the stack file itself.

One model per top-level ``eks-ddp:*`` key: pydantic dataclasses whose fields are snake_case in Python and camelCase
in YAML (``rootVolumeGiB`` where not plain camelCase), refuse unknown keys, and carry their documentation (the
reference table of ``docs/configuration.md`` and the stack file's JSON Schema are generated from them:
``reference.py``). pydantic reads the values in its lax mode: ``pulumi config set --path`` stores 20 as "20" and
0.1 as "0.1", and those read as numbers. Three rules are the stack file's own: a boolean is not a number, an
unquoted number is not a string (YAML reads 1.30 as 1.3) except a digit-only id (``runId: 2024``), and a key set
to ``null`` is refused (``messages.null_problems``; absent is not null). The checks across keys are ``checks.py``;
``messages.py`` words pydantic's errors."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass as std_dataclass
from dataclasses import field as std_field
from dataclasses import replace
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, StringConstraints, TypeAdapter, model_validator
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass
from pydantic.json_schema import SkipJsonSchema
from pydantic.types import AllowInfNan
from pydantic_core import PydanticCustomError

from eks_ddp.core import catalog, k8s_versions, rules
from eks_ddp.core import types as choices
from eks_ddp.core.types import CapacityType, ModelName, NatMode, RunState, ScanSeverity, UpgradePolicy, WorkloadKind

PROJECT = "eks-ddp"

#: Set while the offline plan (``components/eks_ddp/tooling/plan.py``) runs the program: nothing is created then, so
#: the example stacks' placeholder CIDRs are reported as a note instead of stopping the plan.
OFFLINE_PLAN_ENV = "EKS_DDP_OFFLINE_PLAN"

DEFAULT_KUBERNETES_VERSION = k8s_versions.DEFAULT_VERSION
SUPPORTED_KUBERNETES_VERSIONS = k8s_versions.SUPPORTED_VERSIONS

DNS_LABEL = rules.DNS_LABEL

#: Every section: camelCase YAML keys, unknown keys refused, defaults held to the same rules; the stack file is read by
#: key only (``by_name=False``), Python builds and ``dataclasses.replace`` pass field names.
SECTION = ConfigDict(extra="forbid", alias_generator=to_camel, validate_by_alias=True, validate_by_name=True,
                     validate_default=True)


class ConfigError(ValueError):
    """Bad stack config; ``problems`` holds one line per bad key."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack config:\n" + "\n".join(f"  - {p}" for p in problems))


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):  # lax mode reads True as 1
        raise PydanticCustomError("bool_is_not_a_number", "a boolean is not a number")
    return value


def _digits_as_text(value: Any) -> Any:
    return str(value) if type(value) is int else value  # `runId: 2024` arrives as an int


def _number_as_text(value: Any) -> Any:
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value  # env: {N: 4}


_NonEmpty = Annotated[str, StringConstraints(min_length=1)]
_NUMBER_TEXT = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"

Int = Annotated[int, BeforeValidator(_not_a_bool, json_schema_input_type=int | Annotated[str, StringConstraints(
    pattern=r"^\s*-?\d+\s*$")])]
Float = Annotated[float, AllowInfNan(False), BeforeValidator(_not_a_bool, json_schema_input_type=float | Annotated[
    str, StringConstraints(pattern=_NUMBER_TEXT)])]
Bool = Annotated[bool, Field(strict=True)]
Str = Annotated[_NonEmpty, BeforeValidator(_digits_as_text, json_schema_input_type=_NonEmpty | int)]
Strings = tuple[_NonEmpty, ...]
Env = Annotated[Mapping[str, Annotated[str, BeforeValidator(_number_as_text, json_schema_input_type=str | float)]],
                AfterValidator(MappingProxyType)]
KubernetesVersion = Literal[SUPPORTED_KUBERNETES_VERSIONS]  # type: ignore[valid-type]
RdzvChoice = Literal["etcd", "c10d", "etcd-v2"]
"""``etcd-v2``: the old name of ``etcd``, read as ``etcd`` with a warning for one release (the store speaks v3)."""


@dataclass(frozen=True, kw_only=True, config=SECTION)
class NetworkConfig:
    """``eks-ddp:network``: a new VPC, or an existing one."""

    vpc_cidr: Str = Field("10.0.0.0/16", description="CIDR of the new VPC (/16 to /24).")
    az_count: Int = Field(2, description="Availability zones the new VPC spans (2-6).")
    availability_zones: Strings = Field((), description=("Explicit zones; default: the region's first azCount regular "
        "zones EKS accepts."))
    nat_gateways: NatMode = Field("single", description="'single' (cheaper) or 'perAz' (zone-failure tolerant).")
    vpc_id: Str | None = Field(None, description="Existing VPC to use instead of creating one.")
    public_subnet_ids: Strings = Field((), description="Existing public subnets (with vpcId).")
    private_subnet_ids: Strings = Field((), description="Existing private subnets for nodes (with vpcId).")
    s3_endpoint_extra_buckets: Strings = Field((), description=("Other accounts' S3 buckets (names) your workloads "
        "read themselves (a data lake, AWS Open Data): the new VPC's S3 endpoint admits only this account's buckets, "
        "the runs' data.s3 prefixes and these (list, get); preflight checks each exists."))

    @property
    def bring_your_own(self) -> bool:
        return self.vpc_id is not None


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ClusterConfig:
    """``eks-ddp:cluster``: the EKS control plane and the CPU system node group."""

    public_access_cidrs: Strings = Field((), description=("CIDRs allowed to reach the Kubernetes API endpoint "
        "(required while endpointPublicAccess is true), e.g. your IP as a /32."))
    endpoint_public_access: Bool = Field(True, description=("Serve the Kubernetes API on a public endpoint too, "
        "reachable only from publicAccessCidrs. false: the private endpoint only (CIS EKS 5.4.2); then pulumi, kubectl "
        "and the Kubernetes provider must run from the VPC or a network joined to it (VPN, Direct Connect, a "
        "bastion)."))
    kubernetes_version: KubernetesVersion = Field(DEFAULT_KUBERNETES_VERSION, description="EKS Kubernetes version.")
    upgrade_policy: UpgradePolicy = Field(k8s_versions.DEFAULT_SUPPORT_TYPE, description=("'STANDARD': EKS upgrades "
        "the cluster when standard support ends ($0.10/h); 'EXTENDED': keeps the version and bills extended support "
        "($0.60/h)."))
    system_instance_type: Str = Field("t3.large", description="CPU instance type of the system node group.")
    system_node_count: Int = Field(2, description="Nodes in the system node group (etcd, CoreDNS, add-ons).")
    log_retention_days: Int = Field(30, description="CloudWatch retention of control-plane logs.")
    admin_principal_arns: Strings = Field((), description=("IAM role/user ARNs given cluster-admin besides the creator "
        "of the cluster (a teammate, a CI role)."))
    viewer_principal_arns: Strings = Field((), description=("IAM role/user ARNs that may only look "
        "(AmazonEKSViewPolicy: objects and pod logs, no Secrets, no changes); each principal in one list only."))
    scale_down_unneeded_time: Str = Field("10m", description=("How long a GPU node must sit unneeded before the "
        "cluster autoscaler removes it (e.g. 10m, 1h): the idle tail after a run; longer keeps nodes warm between "
        "runs."))
    name: Str | None = Field(None, description=("EKS cluster name (and its log group /aws/eks/<name>/cluster); unset: "
        "eks-ddp-<stack>. Preflight refuses a name another stack's cluster has in the account and region: set one "
        "unique there."))
    owner_id: Str | None = Field(None, description=("A value unique to this stack (8-64 letters, digits, '.', '_', "
        "'-'), set once and kept: it makes the owner tag (eks-ddp/stack) of the cluster and its log group unique on a "
        "self-managed backend (S3, GCS, Azure, --local), where every organization is 'organization'. Required there "
        "(preflight says); e.g. pulumi config set --path cluster.ownerId $(python3 -c 'import uuid; "
        "print(uuid.uuid4().hex)')."))

    # --- node AMI ---
    ami_release_version: Str | None = Field(None, description=("EKS AMI release of every node group (e.g. "
        "1.35.6-20260714): nodes launched later boot this release, not a newer one. Default: the release pinned for "
        "kubernetesVersion (docs/capacity-and-cost.md says how to bump it)."))


@dataclass(frozen=True, kw_only=True, config=SECTION)
class NodeGroupConfig:
    """One entry of ``eks-ddp:nodeGroups``: a GPU managed node group."""

    name: Str = Field(description="Node group name (DNS label, unique).")
    instance_type: Str = Field(description="GPU instance type from the catalog.")
    min_size: Int = Field(0, description="Minimum nodes; 0 lets the group scale to zero when idle.")
    desired_size: Int = Field(0, description="Nodes at creation; ignored afterwards (the autoscaler or you own it).")
    max_size: Int = Field(2, description="Maximum nodes.")
    capacity_type: CapacityType = Field("onDemand", description="'onDemand', 'spot' or 'capacityBlock'.")
    efa: Bool = Field(False, description=("Attach the type's EFA interfaces, keep one AZ; a new cluster placement "
        "group unless placementGroupName or a reservation is given."))
    capacity_reservation_id: Str | None = Field(None, description=("On-demand capacity reservation or capacity block "
        "(cr-...) to launch into."))
    availability_zone: Str | None = Field(None, description=("Pin the group to one zone (required with "
        "capacityReservationId)."))
    placement_group_name: Str | None = Field(None, description=("Existing placement group to launch into: the "
        "reservation's, if it was created in one (preflight checks); not with capacityBlock."))
    root_volume_gib: Int = Field(200, alias="rootVolumeGiB", description=("gp3 root volume size in GiB (images are "
        "multi-GB)."))
    spot_instance_types: Strings = Field((), description=("More types a spot group may launch (fewer interruptions): "
        "catalog types with the same GPU count and model as instanceType."))

    # --- node storage and capacity-block window ---
    local_storage: Str = Field("RAID0", description=("'RAID0': the type's NVMe instance store (where it has one) as "
        "one RAID0 array under the kubelet and containerd (images, emptyDir scratch); 'none': everything on the root "
        "volume."))
    capacity_block_start: Str | None = Field(None, description=("With capacityType 'capacityBlock': the block's start, "
        "UTC (e.g. 2026-12-01T11:30:00Z). Until then no run may ask for the group's nodes; preflight compares it with "
        "the block."))
    capacity_block_end: Str | None = Field(None, description=("With capacityType 'capacityBlock': the block's end, "
        "UTC. A scheduled action scales the group to zero an hour before it (EC2 reclaims the instances 30 minutes "
        "before the end)."))

    @property
    def instance(self) -> catalog.InstanceType:
        return catalog.lookup(self.instance_type)

    @property
    def capacity_block_window(self) -> tuple[dt.datetime, dt.datetime] | None:
        """(start, end) of the capacity block, UTC, when both are set (checked in config/checks.py)."""
        if self.capacity_block_start is None or self.capacity_block_end is None:
            return None
        utc = lambda t: dt.datetime.fromisoformat(t.replace("Z", "+00:00"))  # noqa: E731
        return utc(self.capacity_block_start), utc(self.capacity_block_end)


@dataclass(frozen=True, kw_only=True, config=SECTION)
class StorageConfig:
    """``eks-ddp:storage``: the shared EFS volume."""

    retain_on_destroy: Bool = Field(True, description=("Keep the data on 'pulumi destroy': efs keeps the file system; "
        "fsxLustre deletes it after a final backup (restored by storage.fsxBackupId) and keeps its KMS key."))
    file_system_id: Str | None = Field(None, description=("Existing EFS file system to use (e.g. one kept by an "
        "earlier 'pulumi destroy'): its checkpoints are seen again; none is created."))
    results_bucket: Str | None = Field(None, description=("Existing S3 bucket for run results (e.g. the one an earlier "
        "'pulumi destroy' kept, as 'pulumi stack output results' named it): uploads go there; none is created."))
    results_kms_key_arn: Str | None = Field(None, description=("With resultsBucket: the KMS key (ARN) the bucket "
        "encrypts with by default (the earlier stack's results kmsKeyArn output); the uploaders may use it. Preflight "
        "refuses an SSE-KMS bucket whose key differs."))

    # --- backend, FSx for Lustre, EFS lifecycle ---
    backend: Str = Field("efs", description=("'efs' (elastic, pay per GB written; small stacks) or 'fsxLustre' (FSx "
        "for Lustre PERSISTENT_2 in the nodes' zone, provisioned throughput; p4de-scale checkpoints). Pods see "
        "/shared/data and /shared/runs/<runId> either way."))
    fsx_storage_capacity_gib: Int = Field(1200, alias="fsxStorageCapacityGiB", description=("fsxLustre: capacity in "
        "GiB (1200, or a multiple of 2400); billed whether used or not."))
    fsx_throughput_per_tib: Int = Field(250, alias="fsxThroughputPerTiB", description=("fsxLustre: MB/s per TiB of "
        "capacity (125, 250, 500 or 1000): 1200 GiB at 250 gives ~290 MB/s."))
    fsx_backup_id: Str | None = Field(None, alias="fsxBackupId", description=("fsxLustre: create the file system from "
        "this backup (backup-...), e.g. the final backup an earlier 'pulumi destroy' took with retainOnDestroy: its "
        "checkpoints and data come back. Read only at creation."))
    efs_transition_to_ia: Str = Field("AFTER_30_DAYS", alias="efsTransitionToIA", description=("efs: files not read "
        "for this long move to Infrequent Access (AFTER_1_DAY ... AFTER_365_DAYS, or none)."))
    efs_transition_to_archive: Str = Field("AFTER_90_DAYS", description=("efs: ... and to Archive (later than "
        "efsTransitionToIA, or none)."))
    efs_transition_to_primary: Str = Field("AFTER_1_ACCESS", description=("efs: a file read from IA or Archive moves "
        "back to Standard: AFTER_1_ACCESS, or none."))

    @property
    def efs_transitions(self) -> dict[str, str | None]:
        """The EFS lifecycle (``EfsLifecycle``'s fields: to IA, to Archive, back to primary), None where 'none'."""
        values = (self.efs_transition_to_ia, self.efs_transition_to_archive, self.efs_transition_to_primary)
        names = ("transition_to_ia", "transition_to_archive", "transition_to_primary_storage_class")
        return {n: None if v.lower() == "none" else v for n, v in zip(names, values, strict=True)}


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ImageConfig:
    """``eks-ddp:image``: the trainer image."""

    prebuilt: Str | None = Field(None, description="Use this image (repo@sha256:digest) instead of building one.")
    keep_images: Int = Field(10, description="Images the ECR lifecycle policy keeps.")
    retain_repository: Bool = Field(False, description=("Keep the ECR repository and its images on 'pulumi destroy' "
        "(then delete it by hand); default: destroy deletes them."))
    scan_fail_severity: ScanSeverity = Field("CRITICAL", description=("Fail 'pulumi up' before any job runs the image "
        "if ECR's scan on push finds anything at or above this severity; 'disabled' runs it unchecked. Gates every "
        "runs[i].workload.image in ECR too; images outside ECR are not gated."))
    registry_cache: Bool = Field(False, description=("Share the BuildKit layer cache through a second, mutable ECR "
        "repository (faster builds in CI); the build trusts its layers, so anyone who can push to it can plant code in "
        "the image. Default: local cache only."))


@dataclass(frozen=True, kw_only=True, config=SECTION)
class EtcdConfig:
    """``eks-ddp:etcd``: the rendezvous server."""

    replicas: Int = Field(1, description="etcd members: 1 (the rendezvous store is one member; docs/rendezvous.md).")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ObservabilityConfig:
    """``eks-ddp:observability``: where logs and GPU health go, and node auto repair."""

    cloudwatch: Bool = Field(True, description=("Ship every container's output and the nodes' kubelet and kernel logs "
        "to CloudWatch Logs (/aws/containerinsights/<cluster>/...) with the amazon-cloudwatch-observability add-on "
        "(Fluent Bit, Container Insights): a run's logs outlive its pods and nodes. false: no add-on."))
    log_retention_days: Int = Field(30, description=("CloudWatch retention of those log groups (kept on destroy until "
        "it expires)."))
    gpu_metrics: Bool = Field(True, description=("NVIDIA's dcgm-exporter on the GPU nodes (utilization, memory, XID "
        "and ECC errors); docs/day-two.md says how to read it."))
    node_repair: Bool = Field(True, description=("EKS node auto repair on the GPU groups, with the "
        "eks-node-monitoring-agent add-on reporting GPU faults: a node with a failing GPU is replaced (one at a time "
        "in a reservation or capacity block)."))


@dataclass(frozen=True, kw_only=True, config=SECTION)
class QueueConfig:
    """``eks-ddp:queue``: every run through Kueue (quotas from the GPU groups, priorities, all-or-nothing nodes)."""

    enabled: Bool = Field(True, description=("Install Kueue and queue every run: a run's Jobs are created suspended and "
        "start when the GPU groups' quota admits them. false: no Kueue; Jobs start at once."))
    preemption: choices.QueuePreemption = Field("never", description=("'never', or 'lowerPriority': a queued run may evict "
        "a running run of lower priority (it resumes from its checkpoint when admitted again)."))
    all_or_nothing: Bool = Field(True, description=("GPU admission waits until the cluster autoscaler has every node "
        "of the run (a ProvisioningRequest, best-effort-atomic-scale-up): a run whose nodes cannot all be had holds "
        "none."))


@dataclass(frozen=True, kw_only=True, config=SECTION)
class JobConfig:
    """``eks-ddp:job``: the elastic training job."""

    #: Keys that belong elsewhere, with where: said before "unknown key".
    MISPLACED: ClassVar[dict[str, str]] = {
        "workload": "eks-ddp:job runs the bundled trainer; expected a workload of your own under eks-ddp:runs instead "
                    "(a list: move the job keys into its first entry)"}

    node_group: Str | None = Field(None, description="GPU node group the job runs on; default: the first.")
    nodes: Int = Field(2, description="Pods (torchrun agents, one per node) the job runs: the max of --nnodes.")
    min_nodes: Int = Field(1, description="Fewest nodes training continues with: the min of --nnodes.")
    max_restarts: Int = Field(20, description=("Fault budget per agent (--max-restarts): each crash or lost node costs "
        "one restart, a joining node none; a FATAL trainer exit code fails at once."))
    fault_budget: Int = Field(20, description=("Pod failures the run absorbs before the Job fails (its backoffLimit); "
        "lost nodes, drains and preemptions never count, trainer exit codes 2-5 fail at once."))
    active_deadline_hours: Float = Field(48, description=("Hours the training Job may stay active, waiting for nodes "
        "included, before Kubernetes stops it."))
    run_id: Str = Field("run-1", description="Run name: checkpoints under /shared/runs/<runId>; a new id starts fresh.")
    epochs: Int = Field(10, description="Training epochs.")
    global_batch_size: Int = Field(1024, description=("Images per optimizer step over all GPUs (the trainer caps it on "
        "small data sets); a resize keeps it."))
    model: ModelName = Field("airnet", description=("'airnet' (airbench94-class CIFAR net), 'resnet-small', 'resnet18' "
        "or 'workshop-cnn'."))
    learning_rate: Float | None = Field(None, description=("Peak learning rate per 1,024 images; default: the model's "
        "recipe."))
    rdzv_backend: RdzvChoice = Field("etcd", description=("'etcd' (EtcdRendezvous: an etcd v3 store, client "
        "certificates) or 'c10d' (no etcd; an unauthenticated store whose state every agent unpickles: trusted "
        "clusters only, docs/rendezvous.md). 'etcd-v2', its old name, still reads as 'etcd' with a warning, for one "
        "release."))
    namespace: Str = Field("training", description="Kubernetes namespace of the training workloads.")
    compile: Bool = Field(False, description="Use torch.compile in the trainer.")
    fabric_check: Bool | None = Field(None, description=("Run the fabric check (all-reduce sweep, EFA transport, "
        "bandwidth floor; writes fabric.json) on every node before training starts; default: true when the job's group "
        "has efa."))
    state: RunState = Field("run", description=("'run', or 'cancelled': the training Job is removed and never created "
        "again by a later pulumi up (checkpoints stay; 'run' resumes from them). The cancel output sets it."))
    priority: choices.Priority = Field("normal", description=("With the queue: 'low', 'normal' or 'high' (Kueue's "
        "WorkloadPriorityClass eks-ddp-<priority>): the higher is admitted first, and may evict a lower one with "
        "queue.preemption 'lowerPriority'."))


@dataclass(frozen=True, kw_only=True, config=SECTION)
class CatalogEntryConfig:
    """One entry of ``eks-ddp:catalog``: an instance type the built-in catalog does not list."""

    name: Str = Field(description=("EC2 instance type (x86_64), e.g. g7e.12xlarge; then usable as instanceType, "
        "spotInstanceTypes or systemInstanceType."))
    gpus: Int = Field(0, description="NVIDIA GPUs per instance (0: a CPU type, for the system group).")
    gpu_model: Str | None = Field(None, description=("GPU model, e.g. L40S (the node label nvidia-<model>); required "
        "with gpus."))
    gpu_memory_gib: Int = Field(0, alias="gpuMemoryGiB", description="Memory per GPU in GiB; required with gpus.")
    vcpus: Int = Field(description="vCPUs per instance (pod sizing, vCPU quotas).")
    memory_gib: Int = Field(alias="memoryGiB", description="Instance memory in GiB (pod sizing).")
    efa_interfaces: Int = Field(0, description="EFA-capable network cards; 0: no EFA.")
    efa_only_secondary: Bool = Field(False, description=("Make the EFA interfaces on cards > 0 EFA-only (no IP "
        "address), as AWS recommends for p5-class types."))
    network_gbps: Int | None = Field(None, description=("Per-node network bandwidth in Gbps (the fabric check's "
        "floor); required with efaInterfaces."))
    price_usd_per_hour: Float = Field(alias="priceUsdPerHour", description="On-demand $/hour, for the cost estimate.")
    price_source: Str = Field("eks-ddp:catalog", description="Where the price comes from (shown with the estimate).")

    def _fields(self) -> dict[str, Any]:
        return dict(name=self.name, gpus=self.gpus, gpu_model=self.gpu_model or "", gpu_memory_gib=self.gpu_memory_gib,
                    vcpus=self.vcpus, memory_gib=self.memory_gib, efa_interfaces=self.efa_interfaces,
                    price_per_hour=self.price_usd_per_hour, efa_only_secondary=self.efa_only_secondary,
                    network_gbps=self.network_gbps, price_source=self.price_source, price_date="(stack config)")

    def instance_type(self) -> catalog.InstanceType:
        return catalog.InstanceType(**self._fields())


#: Keys of a run that only the bundled CIFAR-10 trainer reads: with your own workload they would do nothing.
TRAINER_ONLY_KEYS = ("epochs", "globalBatchSize", "model", "learningRate", "compile")


@dataclass(frozen=True, kw_only=True, config=SECTION)
class DataConfig:
    """``runs[i].workload.data``: the run's data set, staged from S3."""

    s3: Str = Field(description=("S3 prefix (s3://bucket/prefix/) staged once onto the shared volume, read-only, as "
        "$EKS_DDP_DATA_DIR; default: no data stage."))
    sha256: Str | None = Field(None, description=("The data set's pin: the sha256 of the manifest the S3 stage writes "
        "and logs; the stage and every training pod then refuse other content (exit 5). Default: checked against the "
        "manifest alone."))


@dataclass(frozen=True, kw_only=True, config=SECTION)
class WorkloadConfig:
    """``runs[i].workload``: what a run trains. Plain data; the program turns it into a ``Workload``.

    In YAML either the string ``cifar10`` (the bundled trainer, the default) or an object with the keys
    below (your own entrypoint), so ``kind`` has no key of its own."""

    #: What a refusal of this section's value says besides its keys (a string is a form of it too).
    SHORT_FORM: ClassVar[str] = "'cifar10' (the bundled trainer)"

    kind: SkipJsonSchema[WorkloadKind] = Field("cifar10", alias="(form)", description=("'cifar10' (the bundled "
        "trainer) or 'custom' (an object): the value's form, never a key."))
    image: Str | None = Field(None, description=("Image the run's pods run (repo@sha256:digest); default: the stack's "
        "image. In ECR the nodes get pull rights on its repository, and it is scan-gated (image.scanFailSeverity)."))
    module: Str | None = Field(None, description=("Python module the launcher runs (like python -m), e.g. mypkg.train; "
        "exactly one of module and script."))
    script: Str | None = Field(None, description=("Script in the image the launcher runs, e.g. /app/train.py; exactly "
        "one of module and script."))
    args: tuple[str, ...] = Field((), description="Arguments after the module or script (quote numbers: '0.1').")
    env: Env = Field(default_factory=lambda: MappingProxyType({}), description=("Environment variables of every worker "
        "(names like MY_VAR; not EKS_DDP_*, which the job sets)."))
    data: DataConfig | None = Field(None, description="The run's data set, staged from S3; default: none.")
    egress: Strings = Field((), description=("Where the training pods connect outside the cluster, each opened in "
            "their NetworkPolicy (nothing else is): 'https' (public addresses on 443), 'internet:PORTS', or "
            "'CIDR:PORTS' (e.g. '10.20.0.0/16:5432'; '/udp' after the ports for UDP)."))
    iam_statements: tuple[Mapping[str, Any], ...] = Field((), description=("IAM policy statements ({Effect, Action, "
            "Resource, Condition}) the training pods need, added to the run's IRSA role (the results uploader's)."))

    @model_validator(mode="before")
    @classmethod
    def _form(cls, data: Any) -> Any:
        if data == "cifar10":
            return {}
        return {**data, "(form)": "custom"} if isinstance(data, dict) else data

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        return {"anyOf": [{"const": "cifar10", "description": "The bundled CIFAR-10 trainer."}, handler(core_schema)]}

    @property
    def custom(self) -> bool:
        return self.kind == "custom"

    @property
    def s3_uri(self) -> str | None:
        """``data.s3``: the S3 prefix staged as the run's data set, or None."""
        return self.data.s3 if self.data else None

    @property
    def s3_sha256(self) -> str | None:
        """``data.sha256``: the data set's pin, or None."""
        return self.data.sha256 if self.data else None


@dataclass(frozen=True, kw_only=True, config=SECTION)
class RunConfig(JobConfig):
    """One run: the ``eks-ddp:job`` keys plus what it trains. ``job:`` is the one-run form (the CIFAR-10
    trainer); each entry of ``runs:`` is one of these."""

    workload: WorkloadConfig = Field(default_factory=WorkloadConfig, description=("'cifar10' (the bundled trainer) or "
        "your own: an object with the workload keys below."))


@std_dataclass(frozen=True, kw_only=True)
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
    observability: ObservabilityConfig = std_field(default_factory=ObservabilityConfig)
    queue: QueueConfig = std_field(default_factory=QueueConfig)
    warnings: tuple[str, ...] = ()
    """What still reads but is deprecated (``etcd-v2``): one line each, for the program to log."""

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
        return any(r.rdzv_backend == "etcd" for r in self.runs)


# Top-level keys: YAML key (without the "eks-ddp:" prefix) -> its model. "job" and "runs" are alternatives.
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
    "observability": ObservabilityConfig,
    "queue": QueueConfig,
    "preflight": bool,
}


def cluster_name_for(stack: str, cfg: StackConfig | None = None) -> str:
    """The EKS cluster's name for a stack: ``cluster.name`` when set, else ``eks-ddp-<stack>``."""
    if cfg is not None and cfg.cluster.name:
        return cfg.cluster.name
    return f"{PROJECT}-{stack}"


@dataclass(frozen=True, kw_only=True, config=SECTION)
class StackFile:
    """The ``config:`` of ``Pulumi.<stack>.yaml``: the stack's region and its ``eks-ddp:*`` keys (here without
    the ``eks-ddp:`` namespace)."""

    region: _NonEmpty = Field(alias="aws:region", description=("AWS region of the stack: pulumi config set aws:region "
        "us-west-2."))
    network: NetworkConfig = Field(default_factory=NetworkConfig, description=NetworkConfig.__doc__)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description=ClusterConfig.__doc__)
    node_groups: tuple[NodeGroupConfig, ...] = Field(min_length=1, description=("GPU managed node groups, each an "
        "object with the keys below."))
    storage: StorageConfig = Field(default_factory=StorageConfig, description=StorageConfig.__doc__)
    image: ImageConfig = Field(default_factory=ImageConfig, description=ImageConfig.__doc__)
    etcd: EtcdConfig = Field(default_factory=EtcdConfig, description=EtcdConfig.__doc__)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig,
                                               description=ObservabilityConfig.__doc__)
    queue: QueueConfig = Field(default_factory=QueueConfig, description=QueueConfig.__doc__)
    job: JobConfig | None = Field(None, description=JobConfig.__doc__)
    runs: Annotated[tuple[RunConfig, ...], Field(min_length=1)] | None = Field(None, description=(
        f"Several runs side by side instead of {PROJECT}:job (not both): each entry takes every job key (its own "
        "runId) plus workload."))
    catalog: tuple[CatalogEntryConfig, ...] = Field((), description=("Instance types the built-in catalog does not "
        "list, each an object with the keys below."))
    preflight: Bool = Field(True, description=("Check zone offerings, EFA, vCPU quotas and reservations before "
        "creating anything."))

    @model_validator(mode="before")
    @classmethod
    def _job_or_runs(cls, data: Any) -> Any:
        """``job`` and ``runs`` together are refused (checks.py says so): ``job`` is not read."""
        return {k: v for k, v in data.items() if k != "job"} if isinstance(data, dict) and "runs" in data else data

    def stack_config(self) -> StackConfig:
        """The typed config: ``job:`` (or neither key) is one run, ``runs:`` one per entry; ``etcd-v2`` read as
        ``etcd``, with a warning."""
        if self.runs is not None:
            runs = self.runs
        else:
            job = self.job or JobConfig()
            runs = (RunConfig(**{name: getattr(job, name) for name in JobConfig.__pydantic_fields__}),)
        keys = [f"runs[{i}]" if self.runs is not None else "job" for i in range(len(runs))]
        warnings = tuple(f"{key}.rdzvBackend: got 'etcd-v2', the old name of 'etcd' (the store speaks etcd's v3 API); "
                         f"expected 'etcd': read as 'etcd' until the next release"
                         for key, run in zip(keys, runs, strict=True) if run.rdzv_backend == "etcd-v2")
        runs = tuple(replace(r, rdzv_backend="etcd") if r.rdzv_backend == "etcd-v2" else r for r in runs)
        return StackConfig(region=self.region, network=self.network, cluster=self.cluster,
                           node_groups=self.node_groups, storage=self.storage, image=self.image, etcd=self.etcd,
                           runs=runs, runs_listed=self.runs is not None,
                           catalog=tuple(e.instance_type() for e in self.catalog), preflight=self.preflight,
                           observability=self.observability, queue=self.queue, warnings=warnings)


STACK_FILE = TypeAdapter(StackFile)
