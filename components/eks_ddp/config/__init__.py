"""Stack configuration: the front door of every stack file.

``__main__.py`` hands the stack's raw ``eks-ddp:*`` values (as Pulumi stores them: strings, with objects and lists as
JSON) to :func:`load_stack_config`, which returns a frozen, validated :class:`StackConfig` or raises
:class:`ConfigError` naming every bad key, its value and what is allowed. Nothing here touches Pulumi, so it is
importable and testable on its own.

Reading runs in two steps: pydantic reads every key into the models of ``schema.py`` (every problem at once, worded
by ``messages.py`` as ``key: got X; expected Y``), then the checks across keys (``checks.py``, ``run_rules.py``) run
on the assembled :class:`StackConfig`. ``eks_ddp.tooling.config_docs`` generates the table of ``docs/configuration.md`` and
the stack file's JSON Schema (``python -m eks_ddp.tooling.config_docs --write``, ``--schema``).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from eks_ddp.config.checks import advice, catalog_problems, ignored_settings, validate
from eks_ddp.config.messages import decode, null_problems, problems
from eks_ddp.config.schema import (
    DEFAULT_KUBERNETES_VERSION,
    OFFLINE_PLAN_ENV,
    PROJECT,
    STACK_FILE,
    SUPPORTED_KUBERNETES_VERSIONS,
    TOP_LEVEL_KEYS,
    ConfigError,
    NodeGroupConfig,
    RunConfig,
    StackConfig,
    WorkloadConfig,
    cluster_name_for,
)
from eks_ddp.core import catalog

__all__ = ["DEFAULT_KUBERNETES_VERSION", "OFFLINE_PLAN_ENV", "PROJECT", "SUPPORTED_KUBERNETES_VERSIONS", "TOP_LEVEL_KEYS",
           "ConfigError", "NodeGroupConfig", "RunConfig", "StackConfig", "WorkloadConfig", "choose_zones",
           "cluster_name_for", "group_zone_problems", "load_stack_config"]


def load_stack_config(raw: dict[str, Any], *, region: str | None, stack: str | None = None,
                      placeholders_ok: bool = False, today: dt.date | None = None) -> StackConfig:
    """Parse and validate the stack's ``eks-ddp:*`` config; raise ConfigError on any problem.

    ``stack`` (the Pulumi stack name) is checked too: it becomes part of the EKS cluster's name.
    ``placeholders_ok`` accepts the example stacks' documentation-range CIDRs (offline plan only).
    ``today`` (default: the real date) decides which Kubernetes versions EKS still takes with the upgrade policy.
    The stack's own instance types are registered in the catalog (taken back if the config is refused).
    """
    data = copy.deepcopy(decode(raw, TOP_LEVEL_KEYS))
    if region:
        data["aws:region"] = region
    bad = null_problems(data)
    try:
        file = STACK_FILE.validate_python(data, by_name=False)
    except ValidationError as err:
        raise ConfigError(bad + problems(err)) from None
    if bad or (bad := catalog_problems(file.catalog)):
        raise ConfigError(bad)
    cfg = file.stack_config()
    added = [t.name for t in cfg.catalog if t.name not in catalog.CATALOG]
    for t in cfg.catalog:
        catalog.register(t)
    bad = validate(cfg, stack=stack, placeholders_ok=placeholders_ok, today=today) + ignored_settings(cfg, data)
    if bad:
        for name in added:
            catalog.unregister(name)
        raise ConfigError(bad)
    return dataclasses.replace(cfg, warnings=(*cfg.warnings, *advice(cfg)))


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
