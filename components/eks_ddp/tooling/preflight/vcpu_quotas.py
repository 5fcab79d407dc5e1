"""Preflight's EC2 vCPU quotas: every group at ``maxSize``, plus what already runs and what capacity reservations
hold unused, within the on-demand or spot quota of the instance type's class (G and VT, P, Standard).

A mixin of :class:`eks_ddp.tooling.preflight.checker._Checker` (``cfg``, ``ec2``, ``quotas``, ``cluster_name``,
``_reservations``, ``attempt``, ``fail``). IAM actions (read-only): ec2:DescribeInstances,
ec2:DescribeCapacityReservations, ec2:DescribeInstanceTypes, servicequotas:GetServiceQuota,
servicequotas:GetAWSDefaultServiceQuota.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from eks_ddp.core import catalog
from eks_ddp.tooling.preflight import live as preflight_live

if TYPE_CHECKING:
    from eks_ddp.config import StackConfig

# EC2 vCPU quotas (Service Quotas, service code "ec2") per (quota class, market).
# Codes as listed by `aws service-quotas list-service-quotas --service-code ec2`.
QUOTAS: dict[tuple[str, str], tuple[str, str]] = {
    ("G", "onDemand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", "onDemand"): ("L-417A185B", "Running On-Demand P instances"),
    ("G", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("P", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("Standard", "onDemand"): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("Standard", "spot"): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}

# Families whose first letter looks Standard/G/P but that have quotas of their own.
_OWN_QUOTA_PREFIXES = ("inf", "trn", "dl", "hpc", "mac", "u-", "u7", "x", "f")


def quota_class(instance_type: str) -> str | None:
    """EC2 vCPU quota class of any instance type ('G', 'P', 'Standard'), None for classes we do not track."""
    family = instance_type.split(".", 1)[0].lower()
    if family.startswith("vt") or family.startswith("g"):
        return "G"
    if family.startswith(_OWN_QUOTA_PREFIXES):
        return None
    if family.startswith("p"):
        return "P"
    if family[:1] in "acdhimrtz":
        return "Standard"
    return None


def _market(capacity_type: str) -> str | None:
    """Quota market of a node group; Capacity Blocks draw on no vCPU quota."""
    return {"onDemand": "onDemand", "spot": "spot"}.get(capacity_type)


class VcpuQuotaChecks:
    """The vCPU quota check (a mixin: see the module docstring)."""

    if TYPE_CHECKING:
        cfg: StackConfig
        ec2: Any
        quotas: Any
        cluster_name: str | None
        _reservations: dict[int, dict[str, Any]]

        def attempt(self, service: str, action: str, what: str, fn: Callable[[], Any]) -> Any: ...
        def fail(self, message: str) -> None: ...

    def check_quotas(self) -> None:
        demand: dict[tuple[str, str], list[tuple[str, str, int, int]]] = {}
        for i, g in enumerate(self.cfg.node_groups):
            market, it = _market(g.capacity_type), catalog.CATALOG.get(g.instance_type)
            if market is None or it is None:
                continue
            nodes = g.max_size
            # Free slots of an on-demand reservation already count against the quota (AWS charges a
            # reservation's vCPUs to it from creation), so only nodes beyond them are new demand.
            reserved = self._reservations.get(i)
            if reserved is not None:
                nodes = max(0, nodes - int(reserved.get("AvailableInstanceCount", 0)))
            if nodes:
                demand.setdefault((it.quota_class, market), []).append(
                    (f"nodeGroups[{i}].maxSize", g.instance_type, nodes, it.vcpus))
        system = catalog.CATALOG.get(self.cfg.cluster.system_instance_type)
        if system is not None:
            demand.setdefault((system.quota_class, "onDemand"), []).append(
                ("cluster.systemNodeCount", system.name, self.cfg.cluster.system_node_count, system.vcpus))
        if not demand:
            return
        running = self.attempt("ec2", "DescribeInstances", "the vCPUs of running instances", self._running_vcpus)
        # A reservation's unused slots count against the On-Demand quota from its creation, whosever it is.
        reserved = self.attempt("ec2", "DescribeCapacityReservations",
                                "the unused capacity of the account's capacity reservations", self._reserved_free_vcpus)
        for (qclass, market), parts in demand.items():
            if (qclass, market) not in QUOTAS:
                continue
            code, name = QUOTAS[(qclass, market)]
            limit = self.attempt("servicequotas", "GetServiceQuota", f"the '{name}' quota ({code})",
                                 functools.partial(self._quota_value, code))
            if limit is None:
                continue
            requested = sum(n * v for _, _, n, v in parts)
            running_now = (running or {}).get((qclass, market), 0)
            held = (reserved or {}).get((qclass, market), 0)
            in_use = running_now + held
            if in_use + requested <= limit:
                continue
            keys = " and ".join(k for k, _, _, _ in parts)
            breakdown = " + ".join(f"{n} x {t} ({v} vCPUs)" for _, t, n, v in parts)
            also = (f" on top of {running_now} vCPUs already running" if running_now else "") + (
                f"{' and' if running_now else ' on top of'} {held} vCPUs reserved but unused (capacity "
                "reservations count against the quota from their creation)" if held else "")
            self.fail(f"{keys}: {requested} vCPUs of '{name}' ({code}) needed for {breakdown}{also}, but the quota "
                      f"in {self.cfg.region} is {limit:g}; lower {keys}, or request an increase: aws service-quotas "
                      f"request-service-quota-increase --region {self.cfg.region} --service-code ec2 "
                      f"--quota-code {code} --desired-value {in_use + requested}")

    def _quota_value(self, code: str) -> float:
        try:
            return float(self.quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        except ClientError as err:
            # Quotas never raised in this account may only have their AWS default.
            if err.response.get("Error", {}).get("Code") != "NoSuchResourceException":
                raise
            return float(self.quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)
                         ["Quota"]["Value"])

    def _running_vcpus(self) -> dict[tuple[str, str], int]:
        """vCPUs of running/pending instances per (quota class, market)."""
        totals: dict[tuple[str, str], int] = {}
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
        for page in pages:
            for res in page["Reservations"]:
                for inst in res["Instances"]:
                    qclass = quota_class(inst["InstanceType"])
                    lifecycle = inst.get("InstanceLifecycle")
                    # This cluster's own nodes are already in the demand (every group at maxSize).
                    if qclass is None or lifecycle == "capacity-block" or preflight_live.is_own(inst,
                                                                                               self.cluster_name):
                        continue
                    market = "spot" if lifecycle == "spot" else "onDemand"
                    totals[(qclass, market)] = totals.get((qclass, market), 0) + self._vcpus_of(inst)
        return totals

    def _reserved_free_vcpus(self) -> dict[tuple[str, str], int]:
        """vCPUs of the unused slots of every active On-Demand Capacity Reservation in the region, per (quota class,
        "onDemand"). EC2 user guide, "On-Demand Capacity Reservations": reserved capacity counts against the
        On-Demand Instance quota even while unused; running instances are counted by :meth:`_running_vcpus`, so only
        the free slots (``AvailableInstanceCount``) are added here. Capacity Blocks are left out, as in
        :func:`_market` (they draw on no On-Demand quota)."""
        totals: dict[tuple[str, str], int] = {}
        pages = self.ec2.get_paginator("describe_capacity_reservations").paginate(
            Filters=[{"Name": "state", "Values": ["active"]}])
        for page in pages:
            for r in page.get("CapacityReservations", []):
                qclass = quota_class(r["InstanceType"])
                free = int(r.get("AvailableInstanceCount", 0))
                if (qclass is None or r.get("State") != "active" or r.get("ReservationType") == "capacity-block"
                        or not free):
                    continue
                vcpus = self._vcpus_of({"InstanceType": r["InstanceType"]})
                totals[(qclass, "onDemand")] = totals.get((qclass, "onDemand"), 0) + free * vcpus
        return totals

    def _vcpus_of(self, inst: dict[str, Any]) -> int:
        cpu = inst.get("CpuOptions") or {}
        if cpu.get("CoreCount") and cpu.get("ThreadsPerCore"):
            return int(cpu["CoreCount"]) * int(cpu["ThreadsPerCore"])
        known = catalog.CATALOG.get(inst["InstanceType"])
        if known is not None:
            return known.vcpus
        info = self.ec2.describe_instance_types(InstanceTypes=[inst["InstanceType"]])["InstanceTypes"]
        return int(info[0]["VCpuInfo"]["DefaultVCpus"]) if info else 0
