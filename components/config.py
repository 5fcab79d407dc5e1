"""Stack configuration schema.

``__main__.py`` hands the stack's raw ``eks-ddp:*`` values (as Pulumi stores
them: strings, with objects and lists as JSON) to :func:`load_stack_config`,
which returns a frozen, validated :class:`StackConfig` or raises
:class:`ConfigError` naming every bad key, its value and what is allowed.
Nothing here touches Pulumi, so it is importable and testable on its own.

Keys are camelCase in YAML (``nodeGroups[0].instanceType``) and snake_case
in Python. The README's "Config reference" table documents every key.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, get_args

from . import catalog, k8s_versions, rules

PROJECT = "eks-ddp"

#: Set while the offline plan (``components/plan.py``) runs the program: nothing is created then, so
#: the example stacks' placeholder CIDRs are reported as a note instead of stopping the plan.
OFFLINE_PLAN_ENV = "EKS_DDP_OFFLINE_PLAN"

CapacityType = Literal["onDemand", "spot", "capacityBlock"]
NatMode = Literal["single", "perAz"]
ModelName = Literal["airnet", "resnet-small", "resnet18", "workshop-cnn"]
RdzvBackend = Literal["etcd-v2", "c10d"]
ScanSeverity = Literal["CRITICAL", "HIGH", "MEDIUM", "LOW", "INFORMATIONAL", "disabled"]

DEFAULT_KUBERNETES_VERSION = k8s_versions.DEFAULT_VERSION
SUPPORTED_KUBERNETES_VERSIONS = k8s_versions.SUPPORTED_VERSIONS
UpgradePolicy = Literal["STANDARD", "EXTENDED"]

DNS_LABEL = rules.DNS_LABEL
_INT_TEXT = re.compile(r"^-?\d+$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_ODCR = re.compile(r"^cr-[0-9a-f]{8,17}$")
_IAM_PRINCIPAL = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
_EFS_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
_PLACEMENT_GROUP = re.compile(r"^[\x21-\x7e]{1,255}$")
_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$(?<!^)")


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
    scale_down_unneeded_time: str = _doc(
        "How long a GPU node must sit unneeded before the cluster autoscaler removes it (e.g. 10m, 1h): "
        "the idle tail after a run; longer keeps nodes warm between runs.", default="10m")
    name: str | None = _doc(
        "EKS cluster name (and its log group /aws/eks/<name>/cluster); unset: eks-ddp-<stack>. Preflight refuses "
        "a name another stack's cluster has in the account and region: set one unique there.", default=None)


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
        "severity; 'disabled' runs it unchecked. Images outside ECR are not gated.", default="CRITICAL")
    registry_cache: bool = _doc(
        "Share the BuildKit layer cache through a second, mutable ECR repository (faster builds in CI); the "
        "build trusts its layers, so anyone who can push to it can plant code in the image. Default: local "
        "cache only.", default=False)


@dataclass(frozen=True, kw_only=True)
class EtcdConfig:
    """``eks-ddp:etcd``: the rendezvous server."""

    replicas: int = _doc("etcd members: 1 (the rendezvous store is one member; README 'Rendezvous store').",
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
    rdzv_backend: RdzvBackend = _doc("'etcd-v2' (EtcdRendezvous) or 'c10d' (no etcd).", default="etcd-v2")
    namespace: str = _doc("Kubernetes namespace of the training workloads.", default="training")
    compile: bool = _doc("Use torch.compile in the trainer.", default=False)
    fabric_check: bool | None = _doc(
        "Run the fabric check (all-reduce sweep, EFA transport, bandwidth floor; writes fabric.json) on every "
        "node before training starts; default: true when the job's group has efa.", default=None)


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
    job: JobConfig
    preflight: bool = True

    def node_group(self, name: str) -> NodeGroupConfig:
        return next(g for g in self.node_groups if g.name == name)

    @property
    def job_group(self) -> NodeGroupConfig:
        return self.node_group(self.job.node_group or self.node_groups[0].name)

    @property
    def fabric_check(self) -> bool:
        """``job.fabricCheck``, defaulting to the job group's ``efa``."""
        return self.job.fabric_check if self.job.fabric_check is not None else self.job_group.efa

    @property
    def uses_efa(self) -> bool:
        return any(g.efa for g in self.node_groups)


# Top-level keys: YAML key (without the "eks-ddp:" prefix) -> description.
TOP_LEVEL_KEYS = {
    "network": NetworkConfig,
    "cluster": ClusterConfig,
    "nodeGroups": NodeGroupConfig,
    "storage": StorageConfig,
    "image": ImageConfig,
    "etcd": EtcdConfig,
    "job": JobConfig,
    "preflight": bool,
}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def yaml_key(f: Any) -> str:
    """The YAML key of a config dataclass field."""
    return f.metadata.get("key") or camel(f.name)


class _Reader:
    """Turns one raw object into a dataclass, collecting problems instead of stopping."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def bad(self, key: str, value: Any, allowed: str) -> None:
        self.problems.append(f"{key}: got {value!r}; expected {allowed}")

    def obj(self, cls: type, raw: Any, prefix: str) -> Any:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.bad(prefix, raw, "an object with keys " + ", ".join(yaml_key(f) for f in fields(cls)))
            raw = {}
        known = {yaml_key(f): f for f in fields(cls)}
        for key in raw:
            if key not in known:
                self.bad(f"{prefix}.{key}", raw[key], "one of the known keys: " + ", ".join(known)
                         + _suggest(key, known))
        values: dict[str, Any] = {}
        for ykey, f in known.items():
            full = f"{prefix}.{ykey}"
            if ykey not in raw:
                if f.default is MISSING and f.default_factory is MISSING:
                    self.problems.append(f"{full}: required; {f.metadata['doc']}")
                continue
            values[f.name] = self.value(full, raw[ykey], f.type)
        if any(p.startswith(prefix) for p in self.problems):
            return None
        return cls(**values)

    def value(self, key: str, value: Any, typ: Any) -> Any:
        typ = _resolve(typ)
        if typ == "bool":
            if isinstance(value, bool):
                return value
            self.bad(key, value, "true or false")
        elif typ == "int":
            # `pulumi config set --path` stores what it cannot read as an int as a string: accept "20".
            if isinstance(value, str) and _INT_TEXT.match(value.strip()):
                return int(value)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            self.bad(key, value, "a whole number")
        elif typ == "float":
            # ... and every non-integer number too: `--path job.learningRate 0.1` arrives as "0.1".
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    pass
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return float(value)
            self.bad(key, value, "a number (finite)")
        elif typ == "str":
            # ... while a digit-only value (runId 2024) arrives as an int.
            if isinstance(value, int) and not isinstance(value, bool):
                return str(value)
            if isinstance(value, str) and value:
                return value
            self.bad(key, value, "a non-empty string")
        elif typ == "tuple":
            if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
                return tuple(value)
            self.bad(key, value, "a list of strings")
        elif isinstance(typ, tuple):  # Literal choices
            if value in typ:
                return value
            self.bad(key, value, "one of " + ", ".join(repr(c) for c in typ))
        return None


def _resolve(annotation: Any) -> Any:
    """Map a field annotation (a string under ``from __future__``) to a check kind."""
    text = str(annotation).replace(" | None", "")
    literals = {"CapacityType": CapacityType, "NatMode": NatMode, "ModelName": ModelName,
                "RdzvBackend": RdzvBackend, "UpgradePolicy": UpgradePolicy, "ScanSeverity": ScanSeverity}
    if text in literals:
        return get_args(literals[text])
    if text.startswith("tuple"):
        return "tuple"
    return text


def _suggest(key: str, known: dict[str, Any]) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _parse_raw(raw: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Decode Pulumi's string values (JSON for objects, lists, numbers and booleans)."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for full_key, text in raw.items():
        key = full_key.split(":", 1)[1] if ":" in full_key else full_key
        if key not in TOP_LEVEL_KEYS:
            problems.append(f"{PROJECT}:{key}: unknown key; known keys: "
                            + ", ".join(TOP_LEVEL_KEYS) + _suggest(key, TOP_LEVEL_KEYS))
            continue
        if isinstance(text, str):
            try:
                out[key] = json.loads(text)
            except json.JSONDecodeError:
                out[key] = text
        else:
            out[key] = text
    return out, problems


def load_stack_config(raw: dict[str, Any], *, region: str | None, stack: str | None = None,
                      placeholders_ok: bool = False, today: dt.date | None = None) -> StackConfig:
    """Parse and validate the stack's ``eks-ddp:*`` config; raise ConfigError on any problem.

    ``stack`` (the Pulumi stack name) is checked too: it becomes part of the EKS cluster's name.
    ``placeholders_ok`` accepts the example stacks' documentation-range CIDRs (offline plan only).
    """
    data, problems = _parse_raw(raw)
    r = _Reader()
    r.problems.extend(problems)
    if not region:
        r.problems.append("aws:region: required; set it with 'pulumi config set aws:region us-west-2'")
    elif bad := rules.region("aws:region", region):
        r.problems.append(bad)
    network = r.obj(NetworkConfig, data.get("network"), "network")
    cluster = r.obj(ClusterConfig, data.get("cluster"), "cluster")
    named = getattr(cluster, "name", None)
    if named is not None and (bad := rules.cluster_name("cluster.name", named)):
        r.problems.append(bad)
    elif named is None and stack is not None and (bad := rules.cluster_name("stack name", cluster_name_for(stack))):
        r.problems.append(f"{bad} (the cluster is named eks-ddp-<stack>: rename the stack with "
                          "'pulumi stack rename', or set eks-ddp:cluster.name)")
    groups_raw = data.get("nodeGroups")
    groups: list[NodeGroupConfig] = []
    if not isinstance(groups_raw, list) or not groups_raw:
        r.bad("nodeGroups", groups_raw, "a non-empty list of GPU node groups")
    else:
        for i, g in enumerate(groups_raw):
            groups.append(r.obj(NodeGroupConfig, g, f"nodeGroups[{i}]"))
    storage = r.obj(StorageConfig, data.get("storage"), "storage")
    image = r.obj(ImageConfig, data.get("image"), "image")
    etcd = r.obj(EtcdConfig, data.get("etcd"), "etcd")
    job = r.obj(JobConfig, data.get("job"), "job")
    preflight = True
    if "preflight" in data:
        preflight = r.value("preflight", data["preflight"], "bool")

    if r.problems:
        raise ConfigError(r.problems)
    cfg = StackConfig(region=region or "", network=network, cluster=cluster, node_groups=tuple(groups),
                      storage=storage, image=image, etcd=etcd, job=job, preflight=bool(preflight))
    problems = validate(cfg, placeholders_ok=placeholders_ok, today=today) + _ignored_settings(cfg, data)
    if problems:
        raise ConfigError(problems)
    return cfg


def cluster_name_for(stack: str, cfg: StackConfig | None = None) -> str:
    """The EKS cluster's name for a stack: ``cluster.name`` when set, else ``eks-ddp-<stack>``."""
    if cfg is not None and cfg.cluster.name:
        return cfg.cluster.name
    return f"{PROJECT}-{stack}"


def _ignored_settings(cfg: StackConfig, data: dict[str, Any]) -> list[str]:
    """Keys that are set but would have no effect: say so instead of ignoring them silently."""
    p: list[str] = []
    net = data.get("network") if isinstance(data.get("network"), dict) else {}
    if cfg.network.bring_your_own:
        for key in ("vpcCidr", "azCount", "availabilityZones", "natGateways"):
            if key in net:
                p.append(f"network.{key}: set together with network.vpcId, which uses your VPC as it is; "
                         f"expected no network.{key} (it only shapes a new VPC)")
    if cfg.job.rdzv_backend == "c10d" and data.get("etcd"):
        p.append(f"etcd: got {data['etcd']!r} with job.rdzvBackend 'c10d', which deploys no etcd; "
                 "expected no eks-ddp:etcd, or job.rdzvBackend 'etcd-v2'")
    return p


def group_zone_problems(cfg: StackConfig, subnet_zones: Iterable[str]) -> list[str]:
    """Groups pinned to a zone where the (brought) VPC has no private subnet: the node group could never launch.

    Only a brought VPC can get here (a new VPC gets a subnet in every pinned zone, see choose_zones); its
    subnets' zones are known once they are looked up, before the cluster is registered."""
    zones = sorted(set(subnet_zones))
    return [f"nodeGroups[{i}].availabilityZone: got {g.availability_zone!r}; expected a zone where "
            f"network.privateSubnetIds has a subnet ({', '.join(zones)})"
            for i, g in enumerate(cfg.node_groups) if g.availability_zone and g.availability_zone not in zones]


def choose_zones(cfg: StackConfig, available: list[str]) -> list[str]:
    """The new VPC's zones: the explicit list, else the zones groups are pinned to, then the first available.

    Zones a group pins (a reservation's zone) always get subnets, so a reservation in a third zone
    works without listing every zone by hand.
    """
    if cfg.network.availability_zones:
        return list(cfg.network.availability_zones)
    zones: list[str] = []
    for g in cfg.node_groups:
        if g.availability_zone and g.availability_zone not in zones:
            zones.append(g.availability_zone)
    for z in available:
        if len(zones) >= cfg.network.az_count:
            break
        if z not in zones:
            zones.append(z)
    return zones


# --- semantic checks: pure functions over the typed config -------------------------------

def validate(cfg: StackConfig, *, placeholders_ok: bool = False, today: dt.date | None = None) -> list[str]:
    """Cross-field checks; one message per problem, each naming its key. ``today`` (default: the real date)
    decides which Kubernetes versions EKS still takes with the upgrade policy."""
    p: list[str] = []
    p += _check_network(cfg.network, cfg.region)
    p += _check_cluster(cfg.cluster, placeholders_ok)
    if cfg.cluster.kubernetes_version in SUPPORTED_KUBERNETES_VERSIONS and (bad := k8s_versions.policy_problem(
            cfg.cluster.kubernetes_version, cfg.cluster.upgrade_policy, today or dt.date.today())):
        p.append(bad)
    names: set[str] = set()
    for i, g in enumerate(cfg.node_groups):
        p += _check_group(g, f"nodeGroups[{i}]", cfg.region)
        if g.name in names:
            p.append(f"nodeGroups[{i}].name: got {g.name!r}; expected a name not used by another group")
        names.add(g.name)
    p += _check_job(cfg)
    if cfg.image.prebuilt is not None and (bad := rules.image_by_digest("image.prebuilt", cfg.image.prebuilt)):
        p.append(bad)
    bucket = cfg.storage.results_bucket
    if bucket is not None and not re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket):
        p.append(f"storage.resultsBucket: got {bucket!r}; expected an S3 bucket name (3-63 lowercase letters, "
                 "digits, '.' and '-')")
    fs_id = cfg.storage.file_system_id
    if fs_id is not None and not _EFS_ID.match(fs_id):
        p.append(f"storage.fileSystemId: got {fs_id!r}; expected an EFS file system id like fs-0123456789abcdef0")
    pinned = {g.availability_zone for g in cfg.node_groups if g.availability_zone}
    if not cfg.network.availability_zones and len(pinned) > cfg.network.az_count:
        p.append(f"network.azCount: got {cfg.network.az_count}; expected at least the {len(pinned)} zones node "
                 f"groups are pinned to ({', '.join(sorted(pinned))})")
    for i, g in enumerate(cfg.node_groups):
        if cfg.network.availability_zones and g.availability_zone \
                and g.availability_zone not in cfg.network.availability_zones:
            p.append(f"nodeGroups[{i}].availabilityZone: got {g.availability_zone!r}; expected one of "
                     f"network.availabilityZones ({', '.join(cfg.network.availability_zones)}): the group's "
                     "nodes need a subnet there")
    if cfg.image.keep_images < 1:
        p.append(f"image.keepImages: got {cfg.image.keep_images!r}; expected a whole number >= 1")
    if cfg.etcd.replicas != 1:
        p.append(f"etcd.replicas: got {cfg.etcd.replicas!r}; expected 1 (a quorum of etcd members on emptyDir "
                 "cannot take back a rescheduled member; the launcher rides out a restart of the one member)")
    return p


def _positive(key: str, value: int, minimum: int = 1) -> list[str]:
    return [] if value >= minimum else [f"{key}: got {value!r}; expected a whole number >= {minimum}"]


def _check_network(n: NetworkConfig, region: str) -> list[str]:
    p: list[str] = []
    if bad := rules.vpc_cidr("network.vpcCidr", n.vpc_cidr):
        p.append(bad)
    if not 2 <= n.az_count <= 6:
        p.append(f"network.azCount: got {n.az_count!r}; expected 2 to 6 (EKS needs subnets in 2 zones)")
    for i, az in enumerate(n.availability_zones):
        if not _AZ.match(az) or (region and not az.startswith(region)):
            p.append(f"network.availabilityZones[{i}]: got {az!r}; expected a zone of region {region!r}")
    seen: set[str] = set()
    for i, az in enumerate(n.availability_zones):
        if az in seen:
            p.append(f"network.availabilityZones[{i}]: got {az!r} twice; expected distinct zones")
        seen.add(az)
    if n.availability_zones and len(n.availability_zones) != n.az_count:
        p.append(f"network.availabilityZones: got {len(n.availability_zones)} zones; "
                 f"expected exactly azCount ({n.az_count})")
    if n.bring_your_own:
        if len(n.private_subnet_ids) < 2:
            p.append(f"network.privateSubnetIds: got {list(n.private_subnet_ids)!r}; expected at least "
                     "2 private subnets (in 2 zones) with network.vpcId")
    elif n.public_subnet_ids or n.private_subnet_ids:
        p.append("network.privateSubnetIds: subnet ids given without network.vpcId; "
                 "expected both (bring your own VPC) or neither (a new VPC)")
    return p


def _check_cluster(c: ClusterConfig, placeholders_ok: bool = False) -> list[str]:
    p: list[str] = []
    if not c.endpoint_public_access:
        if c.public_access_cidrs:
            p.append(f"cluster.publicAccessCidrs: got {list(c.public_access_cidrs)!r}; expected none with "
                     "cluster.endpointPublicAccess false (the API endpoint is private only)")
    elif not c.public_access_cidrs:
        p.append("cluster.publicAccessCidrs: required while cluster.endpointPublicAccess is true; CIDRs allowed "
                 f"to reach the Kubernetes API endpoint, e.g. your IP as a /32 ({rules.MY_IP}); or set "
                 "cluster.endpointPublicAccess false for a private-only endpoint")
    else:
        p += rules.public_access_cidrs("cluster.publicAccessCidrs", c.public_access_cidrs,
                                       placeholders_ok=placeholders_ok)
    for i, arn in enumerate(c.admin_principal_arns):
        if not _IAM_PRINCIPAL.match(arn):
            p.append(f"cluster.adminPrincipalArns[{i}]: got {arn!r}; expected an IAM role or user ARN such as "
                     "arn:aws:iam::123456789012:role/ci-deployer")
    if c.kubernetes_version not in SUPPORTED_KUBERNETES_VERSIONS:
        p.append(f"cluster.kubernetesVersion: got {c.kubernetes_version!r}; expected one of "
                 + ", ".join(SUPPORTED_KUBERNETES_VERSIONS))
    if c.system_instance_type not in catalog.cpu_types():
        p.append(f"cluster.systemInstanceType: got {c.system_instance_type!r}; expected one of "
                 + ", ".join(catalog.cpu_types()))
    p += _positive("cluster.systemNodeCount", c.system_node_count)
    if bad := rules.retention_days("cluster.logRetentionDays", c.log_retention_days):
        p.append(bad)
    scale_down = c.scale_down_unneeded_time
    if not _DURATION.match(scale_down) or not 0 < duration_minutes(scale_down) <= 24 * 60:
        p.append(f"cluster.scaleDownUnneededTime: got {c.scale_down_unneeded_time!r}; expected a duration of at "
                 "most 24h such as 10m, 90s, 1h or 1h30m")
    return p


def duration_minutes(text: str) -> float:
    """Minutes in a duration such as ``10m``, ``90s`` or ``1h30m`` (the autoscaler's Go duration subset)."""
    units = {"h": 60.0, "m": 1.0, "s": 1 / 60}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text))


def _check_group(g: NodeGroupConfig, key: str, region: str) -> list[str]:
    p: list[str] = []
    if not DNS_LABEL.match(g.name) or len(g.name) > 40:
        p.append(f"{key}.name: got {g.name!r}; expected lowercase letters, digits and '-' (max 40)")
    it = catalog.CATALOG.get(g.instance_type)
    for i, other in enumerate(g.spot_instance_types):
        alt = catalog.CATALOG.get(other)
        if g.capacity_type != "spot":
            p.append(f"{key}.spotInstanceTypes: got {list(g.spot_instance_types)!r} with capacityType "
                     f"{g.capacity_type!r}; expected capacityType 'spot', or no spotInstanceTypes")
            break
        if it is not None and (alt is None or (alt.gpus, alt.gpu_model) != (it.gpus, it.gpu_model)
                               or other == g.instance_type):
            p.append(f"{key}.spotInstanceTypes[{i}]: got {other!r}; expected another catalog type with "
                     f"{it.gpus} x {it.gpu_model} GPU like {g.instance_type}")
        elif it is not None and (alt.vcpus < it.vcpus or alt.memory_gib < it.memory_gib):
            # The training pod is sized from instanceType, and the autoscaler simulates the first type only:
            # a smaller alternate is launched for a pod it cannot hold (Pending, idle node, repeat).
            p.append(f"{key}.spotInstanceTypes[{i}]: got {other!r} ({alt.vcpus} vCPUs, {alt.memory_gib} GiB); "
                     f"expected at least the {it.vcpus} vCPUs and {it.memory_gib} GiB of instanceType "
                     f"{g.instance_type} (the pods are sized for it), e.g. a larger size of the same GPU")
    if it is None or it.gpus == 0:
        p.append(f"{key}.instanceType: got {g.instance_type!r}; expected a GPU type from the catalog: "
                 + ", ".join(catalog.gpu_types()))
    p += _positive(f"{key}.minSize", g.min_size, 0)
    p += _positive(f"{key}.maxSize", g.max_size, 1)
    if bad := rules.root_volume_gib(f"{key}.rootVolumeGiB", g.root_volume_gib):
        p.append(bad)
    if g.min_size > g.max_size:
        p.append(f"{key}.minSize: got {g.min_size}; expected <= maxSize ({g.max_size})")
    if not g.min_size <= g.desired_size <= g.max_size:
        p.append(f"{key}.desiredSize: got {g.desired_size}; expected between minSize ({g.min_size}) "
                 f"and maxSize ({g.max_size})")
    if g.efa and it is not None and not it.has_efa:
        efa_types = ", ".join(n for n in catalog.gpu_types() if catalog.CATALOG[n].has_efa)
        p.append(f"{key}.efa: got true for {g.instance_type!r}, which has no EFA; "
                 f"expected false, or an EFA type: {efa_types}")
    if g.capacity_reservation_id is not None:
        if not _ODCR.match(g.capacity_reservation_id):
            p.append(f"{key}.capacityReservationId: got {g.capacity_reservation_id!r}; "
                     "expected an id like cr-0123456789abcdef0")
        if g.availability_zone is None:
            p.append(f"{key}.availabilityZone: required with capacityReservationId "
                     f"({g.capacity_reservation_id}); expected the reservation's zone, e.g. {region or 'us-west-2'}a")
        if g.capacity_type == "spot":
            p.append(f"{key}.capacityType: got 'spot' with capacityReservationId; "
                     "expected 'onDemand' or 'capacityBlock'")
        if g.placement_group_name is not None and g.capacity_type == "capacityBlock":
            p.append(f"{key}.placementGroupName: got {g.placement_group_name!r} with capacityType 'capacityBlock'; "
                     "expected no placementGroupName (a capacity block is already co-located in an UltraCluster)")
    elif g.capacity_type == "capacityBlock":
        p.append(f"{key}.capacityReservationId: required with capacityType 'capacityBlock'; "
                 "expected the capacity block's reservation id (cr-...)")
    if g.placement_group_name is not None and not _PLACEMENT_GROUP.match(g.placement_group_name):
        p.append(f"{key}.placementGroupName: got {g.placement_group_name!r}; expected a placement group name "
                 "(1-255 printable ASCII characters, no spaces)")
    if g.availability_zone is not None and (not _AZ.match(g.availability_zone)
                                            or (region and not g.availability_zone.startswith(region))):
        p.append(f"{key}.availabilityZone: got {g.availability_zone!r}; expected a zone of region {region!r}")
    return p


def _check_job(cfg: StackConfig) -> list[str]:
    j = cfg.job
    p: list[str] = []
    names = [g.name for g in cfg.node_groups]
    if j.node_group is not None and j.node_group not in names:
        p.append(f"job.nodeGroup: got {j.node_group!r}; expected one of {', '.join(names)}")
    p += _positive("job.nodes", j.nodes)
    p += _positive("job.minNodes", j.min_nodes)
    p += _positive("job.maxRestarts", j.max_restarts, 0)
    p += _positive("job.faultBudget", j.fault_budget, 0)
    if not 0 < j.active_deadline_hours <= 24 * 365:
        p.append(f"job.activeDeadlineHours: got {j.active_deadline_hours!r}; expected a number of hours in (0, 8760]")
    p += _positive("job.epochs", j.epochs)
    if bad := rules.global_batch("job.globalBatchSize", j.global_batch_size):
        p.append(bad)
    if j.min_nodes > j.nodes:
        p.append(f"job.minNodes: got {j.min_nodes}; expected <= job.nodes ({j.nodes})")
    if bad := rules.learning_rate("job.learningRate", j.learning_rate):
        p.append(bad)
    if bad := rules.run_id("job.runId", j.run_id):
        p.append(bad)
    if bad := rules.namespace("job.namespace", j.namespace):
        p.append(bad)
    if j.node_group is None or j.node_group in names:
        g = cfg.node_group(j.node_group or names[0])
        if j.nodes > g.max_size:
            p.append(f"job.nodes: got {j.nodes}; expected <= nodeGroups maxSize of group {g.name!r} "
                     f"({g.max_size}): one pod per node")
    return p


# --- documentation ---------------------------------------------------------------------------

def _type_name(annotation: Any) -> str:
    kind = _resolve(annotation)
    if isinstance(kind, tuple):
        return " \\| ".join(f"`{c}`" for c in kind)
    return {"tuple": "list of string", "str": "string", "int": "integer", "float": "number",
            "bool": "boolean"}.get(kind, str(kind))


def reference_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every stack config key, in README order."""
    rows: list[tuple[str, str, str, str]] = [
        ("aws:region", "string", "(required)", "AWS region of the stack.")]
    for top, cls in TOP_LEVEL_KEYS.items():
        if cls is bool:
            rows.append((f"{PROJECT}:{top}", "boolean", "`true`",
                         "Check zone offerings, EFA, vCPU quotas and reservations before creating anything."))
            continue
        prefix = f"{PROJECT}:{top}[i]" if top == "nodeGroups" else f"{PROJECT}:{top}"
        for f in fields(cls):
            if f.default is MISSING and f.default_factory is MISSING:
                default = "(required)"
            elif f.default is None:
                default = "—"
            elif isinstance(f.default, bool):
                default = f"`{str(f.default).lower()}`"
            elif f.default == ():
                default = "`[]`"
            else:
                default = f"`{f.default}`"
            rows.append((f"{prefix}.{yaml_key(f)}", _type_name(f.type), default, f.metadata["doc"]))
    return rows


def reference_table() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | {d} | {m} |" for k, t, d, m in reference_rows()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_table())
