"""Stack configuration: the front door of every stack file.

``__main__.py`` hands the stack's raw ``eks-ddp:*`` values (as Pulumi stores them: strings, with objects and lists as
JSON) to :func:`load_stack_config`, which returns a frozen, validated :class:`StackConfig` or raises
:class:`ConfigError` naming every bad key, its value and what is allowed. Nothing here touches Pulumi, so it is
importable and testable on its own.

Keys are camelCase in YAML (``nodeGroups[0].instanceType``) and snake_case in Python. The reference table in
``docs/configuration.md`` documents every key, and ``docs/stack-config.schema.json`` is the stack file's JSON Schema
for editors (``python -m eks_ddp.config`` prints the table, ``--write`` rewrites it there, ``--schema`` prints the
schema).

The pieces: ``schema.py`` (the pydantic models), ``reader.py`` (what each key accepts, and the messages),
``checks.py`` (checks across keys), ``stack_file.py`` (the whole file), ``reference.py`` (the table).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from eks_ddp.config.checks import duration_minutes, validate
from eks_ddp.config.reader import decode, problems
from eks_ddp.config.reference import reference_rows, reference_table
from eks_ddp.config.schema import (
    DEFAULT_KUBERNETES_VERSION,
    OFFLINE_PLAN_ENV,
    PROJECT,
    SUPPORTED_KUBERNETES_VERSIONS,
    TOP_LEVEL_KEYS,
    CatalogEntryConfig,
    ClusterConfig,
    ConfigError,
    DataConfig,
    EtcdConfig,
    ImageConfig,
    JobConfig,
    NetworkConfig,
    NodeGroupConfig,
    ObservabilityConfig,
    RunConfig,
    StackConfig,
    StorageConfig,
    WorkloadConfig,
    cluster_name_for,
)
from eks_ddp.config.stack_file import STACK_FILE, StackFile, stack_file_schema, unknown_top_level_key

__all__ = [
    "DEFAULT_KUBERNETES_VERSION", "OFFLINE_PLAN_ENV", "PROJECT", "SUPPORTED_KUBERNETES_VERSIONS", "TOP_LEVEL_KEYS",
    "CatalogEntryConfig", "ClusterConfig", "ConfigError", "DataConfig", "EtcdConfig", "ImageConfig", "JobConfig",
    "NetworkConfig", "NodeGroupConfig", "ObservabilityConfig", "RunConfig", "StackConfig", "StackFile", "StorageConfig",
    "WorkloadConfig", "choose_zones", "cluster_name_for", "duration_minutes", "group_zone_problems", "load_stack_config",
    "reference_rows", "reference_table", "stack_file_schema", "validate",
]


def load_stack_config(raw: dict[str, Any], *, region: str | None, stack: str | None = None,
                      placeholders_ok: bool = False, today: dt.date | None = None) -> StackConfig:
    """Parse and validate the stack's ``eks-ddp:*`` config; raise ConfigError on any problem.

    ``stack`` (the Pulumi stack name) is checked too: it becomes part of the EKS cluster's name.
    ``placeholders_ok`` accepts the example stacks' documentation-range CIDRs (offline plan only).
    ``today`` (default: the real date) decides which Kubernetes versions EKS still takes with the upgrade policy.
    """
    data = {"aws:region": region, **decode(raw, TOP_LEVEL_KEYS)}
    try:
        file = STACK_FILE.validate_python(data, by_name=False, context={
            "stack": stack, "placeholders_ok": placeholders_ok, "today": today})
    except ValidationError as err:
        raise ConfigError(problems(err, StackFile, unknown_top_level_key)) from None
    return file.stack_config()


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
