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

import ipaddress
import json
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, get_args

from components import catalog

PROJECT = "eks-ddp"

CapacityType = Literal["onDemand", "spot", "capacityBlock"]
NatMode = Literal["single", "perAz"]
ModelName = Literal["resnet-small", "resnet18"]
RdzvBackend = Literal["etcd-v2", "c10d"]

DEFAULT_KUBERNETES_VERSION = "1.33"
SUPPORTED_KUBERNETES_VERSIONS = ("1.31", "1.32", "1.33", "1.34")

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_ODCR = re.compile(r"^cr-[0-9a-f]{8,17}$")
_IMAGE_BY_DIGEST = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")


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
        "Explicit zones; default: the region's first azCount zones.", default=())
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
        "CIDRs allowed to reach the Kubernetes API endpoint (required), e.g. your IP as a /32.")
    kubernetes_version: str = _doc("EKS Kubernetes version.", default=DEFAULT_KUBERNETES_VERSION)
    system_instance_type: str = _doc("CPU instance type of the system node group.", default="t3.large")
    system_node_count: int = _doc("Nodes in the system node group (etcd, CoreDNS, add-ons).", default=2)
    log_retention_days: int = _doc("CloudWatch retention of control-plane logs.", default=30)


@dataclass(frozen=True, kw_only=True)
class NodeGroupConfig:
    """One entry of ``eks-ddp:nodeGroups``: a GPU managed node group."""

    name: str = _doc("Node group name (DNS label, unique).")
    instance_type: str = _doc("GPU instance type from the catalog.")
    min_size: int = _doc("Minimum nodes; 0 lets the group scale to zero when idle.", default=0)
    desired_size: int = _doc("Nodes at creation; ignored afterwards (the autoscaler or you own it).", default=0)
    max_size: int = _doc("Maximum nodes.", default=2)
    capacity_type: CapacityType = _doc("'onDemand', 'spot' or 'capacityBlock'.", default="onDemand")
    efa: bool = _doc("Attach the type's EFA interfaces, a cluster placement group, one AZ.", default=False)
    capacity_reservation_id: str | None = _doc(
        "On-demand capacity reservation or capacity block (cr-...) to launch into.", default=None)
    availability_zone: str | None = _doc(
        "Pin the group to one zone (required with capacityReservationId).", default=None)
    root_volume_gib: int = _doc("gp3 root volume size in GiB (images are multi-GB).", default=200,
                                key="rootVolumeGiB")

    @property
    def instance(self) -> catalog.InstanceType:
        return catalog.lookup(self.instance_type)


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    """``eks-ddp:storage``: the shared EFS volume."""

    retain_on_destroy: bool = _doc(
        "Keep the EFS file system (checkpoints, data) on 'pulumi destroy'.", default=True)


@dataclass(frozen=True, kw_only=True)
class ImageConfig:
    """``eks-ddp:image``: the trainer image."""

    prebuilt: str | None = _doc("Use this image (repo@sha256:digest) instead of building one.", default=None)
    keep_images: int = _doc("Images the ECR lifecycle policy keeps.", default=10)
    force_delete: bool = _doc("Let 'pulumi destroy' delete the ECR repository with its images.", default=False)


@dataclass(frozen=True, kw_only=True)
class EtcdConfig:
    """``eks-ddp:etcd``: the rendezvous server."""

    replicas: int = _doc("etcd members: 1, or 3 for a fault-tolerant quorum.", default=1)


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """``eks-ddp:job``: the elastic training job."""

    node_group: str | None = _doc("GPU node group the job runs on; default: the first.", default=None)
    nodes: int = _doc("Pods (torchrun agents, one per node) the job runs: the max of --nnodes.", default=2)
    min_nodes: int = _doc("Fewest nodes training continues with: the min of --nnodes.", default=1)
    max_restarts: int = _doc("torchrun --max-restarts: worker-group restarts before the job fails.", default=3)
    run_id: str = _doc("Run name: checkpoints under /shared/runs/<runId>; a new id starts fresh.", default="run-1")
    epochs: int = _doc("Training epochs.", default=10)
    batch_size: int = _doc("Batch size per GPU process.", default=512)
    model: ModelName = _doc("'resnet-small' (fast CIFAR ResNet) or 'resnet18'.", default="resnet-small")
    learning_rate: float | None = _doc("Peak learning rate; default: the model's tuned value.", default=None)
    rdzv_backend: RdzvBackend = _doc("'etcd-v2' (EtcdRendezvous) or 'c10d' (no etcd).", default="etcd-v2")
    namespace: str = _doc("Kubernetes namespace of the training workloads.", default="training")
    compile: bool = _doc("Use torch.compile in the trainer.", default=False)


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
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            self.bad(key, value, "a whole number")
        elif typ == "float":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            self.bad(key, value, "a number")
        elif typ == "str":
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
                "RdzvBackend": RdzvBackend}
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


def load_stack_config(raw: dict[str, Any], *, region: str | None) -> StackConfig:
    """Parse and validate the stack's ``eks-ddp:*`` config; raise ConfigError on any problem."""
    data, problems = _parse_raw(raw)
    r = _Reader()
    r.problems.extend(problems)
    if not region:
        r.problems.append("aws:region: required; set it with 'pulumi config set aws:region us-west-2'")
    network = r.obj(NetworkConfig, data.get("network"), "network")
    cluster = r.obj(ClusterConfig, data.get("cluster"), "cluster")
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
    problems = validate(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


# --- semantic checks: pure functions over the typed config -------------------------------

def validate(cfg: StackConfig) -> list[str]:
    """Cross-field checks; one message per problem, each naming its key."""
    p: list[str] = []
    p += _check_network(cfg.network, cfg.region)
    p += _check_cluster(cfg.cluster)
    names: set[str] = set()
    for i, g in enumerate(cfg.node_groups):
        p += _check_group(g, f"nodeGroups[{i}]", cfg.region)
        if g.name in names:
            p.append(f"nodeGroups[{i}].name: got {g.name!r}; expected a name not used by another group")
        names.add(g.name)
    p += _check_job(cfg)
    if cfg.image.prebuilt is not None and not _IMAGE_BY_DIGEST.match(cfg.image.prebuilt):
        p.append(f"image.prebuilt: got {cfg.image.prebuilt!r}; expected an image pinned by digest, "
                 "e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:<64 hex>")
    if cfg.image.keep_images < 1:
        p.append(f"image.keepImages: got {cfg.image.keep_images!r}; expected a whole number >= 1")
    if cfg.etcd.replicas not in (1, 3):
        p.append(f"etcd.replicas: got {cfg.etcd.replicas!r}; expected 1 or 3")
    return p


def _positive(key: str, value: int, minimum: int = 1) -> list[str]:
    return [] if value >= minimum else [f"{key}: got {value!r}; expected a whole number >= {minimum}"]


def _check_network(n: NetworkConfig, region: str) -> list[str]:
    p: list[str] = []
    try:
        net = ipaddress.ip_network(n.vpc_cidr)
        if net.version != 4 or not 16 <= net.prefixlen <= 24:
            p.append(f"network.vpcCidr: got {n.vpc_cidr!r}; expected an IPv4 CIDR from /16 to /24")
    except ValueError:
        p.append(f"network.vpcCidr: got {n.vpc_cidr!r}; expected an IPv4 CIDR such as 10.0.0.0/16")
    if not 2 <= n.az_count <= 6:
        p.append(f"network.azCount: got {n.az_count!r}; expected 2 to 6 (EKS needs subnets in 2 zones)")
    for i, az in enumerate(n.availability_zones):
        if not _AZ.match(az) or (region and not az.startswith(region)):
            p.append(f"network.availabilityZones[{i}]: got {az!r}; expected a zone of region {region!r}")
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


def _check_cluster(c: ClusterConfig) -> list[str]:
    p: list[str] = []
    if not c.public_access_cidrs:
        p.append("cluster.publicAccessCidrs: got []; expected at least one CIDR such as 198.51.100.7/32")
    for i, cidr in enumerate(c.public_access_cidrs):
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            p.append(f"cluster.publicAccessCidrs[{i}]: got {cidr!r}; expected a CIDR such as 198.51.100.7/32")
            continue
        if net.prefixlen == 0:
            p.append(f"cluster.publicAccessCidrs[{i}]: got {cidr!r}, which opens the Kubernetes API endpoint to "
                     "the whole internet; expected your network's CIDR, e.g. your IP as 198.51.100.7/32")
    if c.kubernetes_version not in SUPPORTED_KUBERNETES_VERSIONS:
        p.append(f"cluster.kubernetesVersion: got {c.kubernetes_version!r}; expected one of "
                 + ", ".join(SUPPORTED_KUBERNETES_VERSIONS))
    if c.system_instance_type not in catalog.cpu_types():
        p.append(f"cluster.systemInstanceType: got {c.system_instance_type!r}; expected one of "
                 + ", ".join(catalog.cpu_types()))
    p += _positive("cluster.systemNodeCount", c.system_node_count)
    p += _positive("cluster.logRetentionDays", c.log_retention_days)
    return p


def _check_group(g: NodeGroupConfig, key: str, region: str) -> list[str]:
    p: list[str] = []
    if not DNS_LABEL.match(g.name) or len(g.name) > 40:
        p.append(f"{key}.name: got {g.name!r}; expected lowercase letters, digits and '-' (max 40)")
    it = catalog.CATALOG.get(g.instance_type)
    if it is None or it.gpus == 0:
        p.append(f"{key}.instanceType: got {g.instance_type!r}; expected a GPU type from the catalog: "
                 + ", ".join(catalog.gpu_types()))
    p += _positive(f"{key}.minSize", g.min_size, 0)
    p += _positive(f"{key}.maxSize", g.max_size, 1)
    p += _positive(f"{key}.rootVolumeGiB", g.root_volume_gib, 50)
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
    elif g.capacity_type == "capacityBlock":
        p.append(f"{key}.capacityReservationId: required with capacityType 'capacityBlock'; "
                 "expected the capacity block's reservation id (cr-...)")
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
    p += _positive("job.epochs", j.epochs)
    p += _positive("job.batchSize", j.batch_size)
    if j.min_nodes > j.nodes:
        p.append(f"job.minNodes: got {j.min_nodes}; expected <= job.nodes ({j.nodes})")
    if j.learning_rate is not None and not 0 < j.learning_rate < 10:
        p.append(f"job.learningRate: got {j.learning_rate!r}; expected a number in (0, 10)")
    if not DNS_LABEL.match(j.run_id) or len(j.run_id) > 40:
        p.append(f"job.runId: got {j.run_id!r}; expected lowercase letters, digits and '-' (max 40)")
    if not DNS_LABEL.match(j.namespace):
        p.append(f"job.namespace: got {j.namespace!r}; expected a DNS label")
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
