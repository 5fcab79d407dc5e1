"""Stack configuration: the front door of every stack file.

``__main__.py`` hands the stack's raw ``eks-ddp:*`` values (as Pulumi stores
them: strings, with objects and lists as JSON) to :func:`load_stack_config`,
which returns a frozen, validated :class:`StackConfig` or raises
:class:`ConfigError` naming every bad key, its value and what is allowed.
Nothing here touches Pulumi, so it is importable and testable on its own.

Keys are camelCase in YAML (``nodeGroups[0].instanceType``) and snake_case
in Python. The reference table in ``docs/configuration.md`` documents every key
(``python -m eks_ddp.config`` prints it, ``--write`` rewrites it there).

The pieces: ``schema.py`` (the dataclasses), ``reader.py`` (raw values to
dataclasses), ``checks.py`` (cross-field checks), ``reference.py`` (the table).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

from eks_ddp.config.checks import duration_minutes, validate
from eks_ddp.config.reader import Reader, parse_raw
from eks_ddp.config.reference import reference_rows, reference_table
from eks_ddp.config.schema import (
    DEFAULT_KUBERNETES_VERSION,
    OFFLINE_PLAN_ENV,
    PROJECT,
    SUPPORTED_KUBERNETES_VERSIONS,
    TOP_LEVEL_KEYS,
    TRAINER_ONLY_KEYS,
    CatalogEntryConfig,
    ClusterConfig,
    ConfigError,
    EtcdConfig,
    ImageConfig,
    JobConfig,
    NetworkConfig,
    NodeGroupConfig,
    RunConfig,
    StackConfig,
    StorageConfig,
    WorkloadConfig,
)
from eks_ddp.core import catalog, rules

__all__ = [
    "DEFAULT_KUBERNETES_VERSION", "OFFLINE_PLAN_ENV", "PROJECT", "SUPPORTED_KUBERNETES_VERSIONS", "TOP_LEVEL_KEYS",
    "ClusterConfig", "ConfigError", "EtcdConfig", "ImageConfig", "JobConfig", "NetworkConfig", "NodeGroupConfig",
    "RunConfig", "StackConfig", "StorageConfig", "WorkloadConfig", "choose_zones", "cluster_name_for",
    "duration_minutes", "group_zone_problems", "load_stack_config", "reference_rows", "reference_table", "validate",
]


def load_stack_config(raw: dict[str, Any], *, region: str | None, stack: str | None = None,
                      placeholders_ok: bool = False, today: dt.date | None = None) -> StackConfig:
    """Parse and validate the stack's ``eks-ddp:*`` config; raise ConfigError on any problem.

    ``stack`` (the Pulumi stack name) is checked too: it becomes part of the EKS cluster's name.
    ``placeholders_ok`` accepts the example stacks' documentation-range CIDRs (offline plan only).
    """
    data, problems = parse_raw(raw)
    r = Reader()
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
    owner = getattr(cluster, "owner_id", None)
    if owner is not None and not re.fullmatch(r"[A-Za-z0-9._-]{8,64}", str(owner)):
        r.problems.append(f"cluster.ownerId: got {owner!r}; expected 8-64 letters, digits, '.', '_' or '-', unique "
                          "to this stack (e.g. a uuid4 hex)")
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
    runs = _read_runs(r, data)
    types = _read_catalog(r, data.get("catalog"))
    preflight = True
    if "preflight" in data:
        preflight = r.value("preflight", data["preflight"], "bool")

    if r.problems:
        raise ConfigError(r.problems)
    cfg = StackConfig(region=region or "", network=network, cluster=cluster, node_groups=tuple(groups),
                      storage=storage, image=image, etcd=etcd, runs=runs, runs_listed="runs" in data,
                      catalog=types, preflight=bool(preflight))
    # The stack's own types are registered before the checks (which look types up in the catalog) and
    # taken back if the config is refused, so a bad stack leaves the catalog as it found it.
    added = [t.name for t in types if t.name not in catalog.CATALOG]
    for t in types:
        catalog.register(t)
    problems = validate(cfg, placeholders_ok=placeholders_ok, today=today) + _ignored_settings(cfg, data)
    if problems:
        for name in added:
            catalog.unregister(name)
        raise ConfigError(problems)
    return cfg


#: The stack key of each InstanceType field, for messages.
_CATALOG_KEYS = {"gpu_model": "gpuModel", "gpu_memory_gib": "gpuMemoryGiB", "memory_gib": "memoryGiB",
                 "efa_interfaces": "efaInterfaces", "price_per_hour": "priceUsdPerHour", "network_gbps": "networkGbps"}


def _read_catalog(r: Reader, raw: Any) -> tuple[catalog.InstanceType, ...]:
    """``eks-ddp:catalog``: each entry checked like a built-in row, named ``catalog[i].<key>``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.bad("catalog", raw, "a list of instance types, each an object with name, gpus, gpuModel, vcpus, "
                              "memoryGiB, priceUsdPerHour, ...")
        return ()
    types: list[catalog.InstanceType] = []
    for i, entry in enumerate(raw):
        key = f"catalog[{i}]"
        e = r.obj(CatalogEntryConfig, entry, key)
        if e is None:
            continue
        fields_ = dict(name=e.name, gpus=e.gpus, gpu_model=e.gpu_model or "", gpu_memory_gib=e.gpu_memory_gib,
                       vcpus=e.vcpus, memory_gib=e.memory_gib, efa_interfaces=e.efa_interfaces,
                       price_per_hour=e.price_usd_per_hour, efa_only_secondary=e.efa_only_secondary,
                       network_gbps=e.network_gbps, price_source=e.price_source, price_date="(stack config)")
        bad = catalog.instance_type_problems(SimpleNamespace(**fields_), key, names=_CATALOG_KEYS)
        if e.name in catalog.BUILTIN:
            bad.append(f"{key}.name: got {e.name!r}, which the built-in catalog lists; expected a type it does not "
                       "list (python: catalog.register(..., replace=True) corrects a built-in row)")
        elif (known := catalog.CATALOG.get(e.name)) is not None and not bad \
                and known != catalog.InstanceType(**fields_):
            bad.append(f"{key}.name: got {e.name!r}, already registered with other values ({known}); expected "
                       "one description per type")
        if e.name in [t.name for t in types]:
            bad.append(f"{key}.name: got {e.name!r} twice; expected each type once")
        if e.efa_interfaces and e.gpus and e.network_gbps is None:
            bad.append(f"{key}.networkGbps: required with efaInterfaces ({e.efa_interfaces}); expected the type's "
                       "network bandwidth in Gbps (the fabric check's floor is a quarter of it)")
        r.problems += bad
        if not bad:
            types.append(catalog.InstanceType(**fields_))
    return tuple(types)


def _read_runs(r: Reader, data: dict[str, Any]) -> tuple[RunConfig, ...]:
    """``job:`` (one run of the bundled trainer; also when neither is set) or ``runs:`` (a list)."""
    if "runs" not in data:
        if isinstance(data.get("job"), dict) and "workload" in data["job"]:
            r.problems.append("job.workload: eks-ddp:job runs the bundled trainer; expected a workload of your own "
                              "under eks-ddp:runs instead (a list: move the job keys into its first entry)")
        job = r.obj(JobConfig, data.get("job"), "job")
        if job is None:
            return ()
        return (RunConfig(**{f.name: getattr(job, f.name) for f in fields(JobConfig)}),)
    if "job" in data:
        r.problems.append("eks-ddp:job and eks-ddp:runs: both set; expected one of them: job (one run of the "
                          "bundled trainer) or runs (a list of runs, each with the job keys plus workload)")
    raw = data["runs"]
    if not isinstance(raw, list) or not raw:
        r.bad("runs", raw, "a non-empty list of runs, each an object with the job keys plus workload")
        return ()
    runs = [r.obj(RunConfig, entry, f"runs[{i}]") for i, entry in enumerate(raw)]
    return tuple(runs) if all(runs) else ()


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
        for key in ("vpcCidr", "azCount", "availabilityZones", "natGateways", "s3EndpointExtraBuckets"):
            if key in net:
                p.append(f"network.{key}: set together with network.vpcId, which uses your VPC as it is; "
                         f"expected no network.{key} (it only shapes a new VPC)")
    if not cfg.uses_etcd and data.get("etcd"):
        which = "every run's rdzvBackend" if cfg.runs_listed else "job.rdzvBackend"
        p.append(f"etcd: got {data['etcd']!r} with {which} 'c10d', which deploys no etcd; "
                 f"expected no eks-ddp:etcd, or {which} 'etcd-v2'")
    if cfg.runs_listed:
        for i, (run, raw) in enumerate(zip(cfg.runs, data["runs"], strict=True)):
            if run.workload.custom:
                p += [f"runs[{i}].{key}: set with a workload of your own, which never reads it (only the bundled "
                      f"cifar10 trainer does); expected no runs[{i}].{key}: pass your own flags in "
                      f"runs[{i}].workload.args" for key in TRAINER_ONLY_KEYS if key in raw]
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

