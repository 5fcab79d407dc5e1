"""Stack configuration schema: the frozen models a stack file becomes, and the model of the stack file itself.

One model per top-level ``eks-ddp:*`` key: pydantic dataclasses whose fields are snake_case in Python and camelCase
in YAML (:func:`yaml_key`), refuse unknown keys, and hold each key's type, default and constraints; each key's
meaning is written in ``docs/configuration.md``, whose table and the stack file's JSON Schema are generated from these
models (``eks_ddp.tooling.config_docs``). pydantic reads the values in its lax mode: ``pulumi config set --path`` stores 20 as "20"
and 0.1 as "0.1", and those read as numbers. Three rules are the stack file's own: a boolean is not a number, an
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

from eks_ddp.core import catalog, k8s_versions
from eks_ddp.core import types as choices

PROJECT = "eks-ddp"

#: Set while the offline plan (``components/eks_ddp/tooling/plan.py``) runs the program: nothing is created then, so
#: the example stacks' placeholder CIDRs are reported as a note instead of stopping the plan.
OFFLINE_PLAN_ENV = "EKS_DDP_OFFLINE_PLAN"

DEFAULT_KUBERNETES_VERSION = k8s_versions.DEFAULT_VERSION
SUPPORTED_KUBERNETES_VERSIONS = k8s_versions.SUPPORTED_VERSIONS



def yaml_key(name: str) -> str:
    """A field's key in the stack file: camelCase, with units and initialisms as AWS writes them (``rootVolumeGiB``,
    ``fsxThroughputPerTiB``, ``efsTransitionToIA``)."""
    return to_camel(name).replace("Gib", "GiB").replace("Tib", "TiB").replace("ToIa", "ToIA")


#: Every section: camelCase YAML keys, unknown keys refused, defaults held to the same rules; the stack file is read by
#: key only (``by_name=False``), Python builds and ``dataclasses.replace`` pass field names.
SECTION = ConfigDict(extra="forbid", alias_generator=yaml_key, validate_by_alias=True, validate_by_name=True,
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

    vpc_cidr: Str = "10.0.0.0/16"
    az_count: Int = 2
    availability_zones: Strings = ()
    nat_gateways: choices.NatMode = "single"
    vpc_id: Str | None = None
    public_subnet_ids: Strings = ()
    private_subnet_ids: Strings = ()
    s3_endpoint_extra_buckets: Strings = ()

    @property
    def bring_your_own(self) -> bool:
        return self.vpc_id is not None


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ClusterConfig:
    """``eks-ddp:cluster``: the EKS control plane and the CPU system node group."""

    public_access_cidrs: Strings = ()
    endpoint_public_access: Bool = True
    kubernetes_version: KubernetesVersion = DEFAULT_KUBERNETES_VERSION
    upgrade_policy: choices.UpgradePolicy = k8s_versions.DEFAULT_SUPPORT_TYPE
    system_instance_type: Str = "t3.large"
    system_node_count: Int = 2
    log_retention_days: Int = 30
    admin_principal_arns: Strings = ()
    viewer_principal_arns: Strings = ()
    scale_down_unneeded_time: Str = "10m"
    name: Str | None = None
    owner_id: Str | None = None

    # --- node AMI ---
    ami_release_version: Str | None = None


@dataclass(frozen=True, kw_only=True, config=SECTION)
class NodeGroupConfig:
    """One entry of ``eks-ddp:nodeGroups``: a GPU managed node group."""

    name: Str
    instance_type: Str
    min_size: Int = 0
    desired_size: Int = 0
    max_size: Int = 2
    capacity_type: choices.CapacityType = "onDemand"
    efa: Bool = False
    capacity_reservation_id: Str | None = None
    availability_zone: Str | None = None
    placement_group_name: Str | None = None
    root_volume_gib: Int = 200
    spot_instance_types: Strings = ()

    # --- node storage and capacity-block window ---
    local_storage: choices.LocalStorage = "RAID0"
    capacity_block_start: Str | None = None
    capacity_block_end: Str | None = None

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

    retain_on_destroy: Bool = True
    file_system_id: Str | None = None
    results_bucket: Str | None = None
    results_kms_key_arn: Str | None = None

    # --- backend, FSx for Lustre, EFS lifecycle ---
    backend: choices.StorageBackend = "efs"
    fsx_storage_capacity_gib: Int = 1200
    fsx_throughput_per_tib: Int = 250
    fsx_backup_id: Str | None = None
    fsx_replace: Str | None = None
    efs_transition_to_ia: Str = "AFTER_30_DAYS"
    efs_transition_to_archive: Str = "AFTER_90_DAYS"
    efs_transition_to_primary: Str = "AFTER_1_ACCESS"

    @property
    def efs_transitions(self) -> dict[str, str | None]:
        """The EFS lifecycle (``EfsLifecycle``'s fields: to IA, to Archive, back to primary), None where 'none'."""
        values = (self.efs_transition_to_ia, self.efs_transition_to_archive, self.efs_transition_to_primary)
        names = ("transition_to_ia", "transition_to_archive", "transition_to_primary_storage_class")
        return {n: None if v.lower() == "none" else v for n, v in zip(names, values, strict=True)}


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ImageConfig:
    """``eks-ddp:image``: the trainer image."""

    prebuilt: Str | None = None
    keep_images: Int = 10
    retain_repository: Bool = False
    scan_fail_severity: choices.ScanSeverity = "CRITICAL"
    registry_cache: Bool = False


@dataclass(frozen=True, kw_only=True, config=SECTION)
class EtcdConfig:
    """``eks-ddp:etcd``: the rendezvous server."""

    replicas: Int = 1


@dataclass(frozen=True, kw_only=True, config=SECTION)
class ObservabilityConfig:
    """``eks-ddp:observability``: where logs and GPU health go, and node auto repair."""

    cloudwatch: Bool = True
    log_retention_days: Int = 30
    gpu_metrics: Bool = True
    node_repair: Bool = True


@dataclass(frozen=True, kw_only=True, config=SECTION)
class QueueConfig:
    """``eks-ddp:queue``: every run through Kueue (quotas from the GPU groups, priorities, all-or-nothing nodes)."""

    enabled: Bool = True
    preemption: choices.QueuePreemption = "never"
    all_or_nothing: Bool = True

    @property
    def provisioning_requests(self) -> bool:
        """Whether GPU admission asks the cluster autoscaler for the whole run (the autoscaler serves them)."""
        return self.enabled and self.all_or_nothing


@dataclass(frozen=True, kw_only=True, config=SECTION)
class JobConfig:
    """``eks-ddp:job``: the elastic training job."""

    #: Keys that belong elsewhere, with where: said before "unknown key".
    MISPLACED: ClassVar[dict[str, str]] = {
        "workload": "eks-ddp:job runs the bundled trainer; expected a workload of your own under eks-ddp:runs instead "
                    "(a list: move the job keys into its first entry)"}

    node_group: Str | None = None
    nodes: Int = 2
    min_nodes: Int = 1
    max_restarts: Int = 20
    fault_budget: Int = 20
    active_deadline_hours: Float = 48
    run_id: Str = "run-1"
    epochs: Int = 10
    global_batch_size: Int = 1024
    model: choices.ModelName = "airnet"
    learning_rate: Float | None = None
    rdzv_backend: RdzvChoice = "etcd"
    namespace: Str = "training"
    compile: Bool = False
    fabric_check: Bool | None = None
    state: choices.RunState = "run"
    priority: choices.Priority = "normal"


@dataclass(frozen=True, kw_only=True, config=SECTION)
class CatalogEntryConfig:
    """One entry of ``eks-ddp:catalog``: an instance type the built-in catalog does not list."""

    name: Str
    gpus: Int = 0
    gpu_model: Str | None = None
    gpu_memory_gib: Int = 0
    vcpus: Int
    memory_gib: Int
    efa_interfaces: Int = 0
    efa_only_secondary: Bool = False
    network_gbps: Int | None = None
    price_usd_per_hour: Float
    price_source: Str = "eks-ddp:catalog"

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

    s3: Str
    sha256: Str | None = None


@dataclass(frozen=True, kw_only=True, config=SECTION)
class WorkloadConfig:
    """``runs[i].workload``: what a run trains. Plain data; the program turns it into a ``Workload``.

    In YAML either the string ``cifar10`` (the bundled trainer, the default) or an object with the keys
    below (your own entrypoint), so ``kind`` has no key of its own."""

    #: What a refusal of this section's value says besides its keys (a string is a form of it too).
    SHORT_FORM: ClassVar[str] = "'cifar10' (the bundled trainer)"

    kind: SkipJsonSchema[choices.WorkloadKind] = Field("cifar10", alias="(form)")
    image: Str | None = None
    module: Str | None = None
    script: Str | None = None
    args: tuple[str, ...] = ()
    env: Annotated[Env, Field(default_factory=lambda: MappingProxyType({}))]
    data: DataConfig | None = None
    egress: Strings = ()
    iam_statements: tuple[Mapping[str, Any], ...] = ()

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


@dataclass(frozen=True, kw_only=True, config=SECTION)
class RunConfig(JobConfig):
    """One run: the ``eks-ddp:job`` keys plus what it trains. ``job:`` is the one-run form (the CIFAR-10
    trainer); each entry of ``runs:`` is one of these."""

    workload: Annotated[WorkloadConfig, Field(default_factory=WorkloadConfig)]


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

    def group_of(self, run: JobConfig) -> NodeGroupConfig:
        """The GPU node group a run runs on (its nodeGroup, default the first)."""
        return next(g for g in self.node_groups if g.name == (run.node_group or self.node_groups[0].name))

    @property
    def job_group(self) -> NodeGroupConfig:
        return self.group_of(self.job)

    def fabric_check_of(self, run: JobConfig) -> bool:
        """A run's ``fabricCheck``, defaulting to its group's ``efa``."""
        return run.fabric_check if run.fabric_check is not None else self.group_of(run).efa

    @property
    def uses_efa(self) -> bool:
        return any(g.efa for g in self.node_groups)

    @property
    def uses_etcd(self) -> bool:
        """Whether any run rendezvouses through etcd (then the stack deploys EtcdRendezvous)."""
        return any(r.rdzv_backend == "etcd" for r in self.runs)


def cluster_name_for(stack: str, cfg: StackConfig | None = None) -> str:
    """The EKS cluster's name for a stack: ``cluster.name`` when set, else ``eks-ddp-<stack>``."""
    if cfg is not None and cfg.cluster.name:
        return cfg.cluster.name
    return f"{PROJECT}-{stack}"


@dataclass(frozen=True, kw_only=True, config=SECTION)
class StackFile:
    """The ``config:`` of ``Pulumi.<stack>.yaml``: the stack's region and its ``eks-ddp:*`` keys (here without
    the ``eks-ddp:`` namespace)."""

    region: _NonEmpty = Field(alias="aws:region")
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    node_groups: tuple[NodeGroupConfig, ...] = Field(min_length=1)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    image: ImageConfig = Field(default_factory=ImageConfig)
    etcd: EtcdConfig = Field(default_factory=EtcdConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig)
    job: JobConfig | None = None
    runs: Annotated[tuple[RunConfig, ...], Field(min_length=1)] | None = None
    catalog: tuple[CatalogEntryConfig, ...] = ()
    preflight: Bool = True

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
#: The ``eks-ddp:*`` keys (without the namespace), in the stack file's order; ``job`` and ``runs`` are alternatives.
TOP_LEVEL_KEYS = tuple(f.alias for f in StackFile.__pydantic_fields__.values() if f.alias != "aws:region")
