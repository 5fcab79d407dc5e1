"""One preflight pass: the checks of the package docstring over boto3 clients (:func:`check`, pure: clients in,
:class:`Report` out), and :func:`run_or_raise`, what ``__main__.py`` calls."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from eks_ddp.config import StackConfig, choose_zones
from eks_ddp.core import catalog, k8s_versions
from eks_ddp.infra.network import EKS_UNSUPPORTED_ZONE_IDS
from eks_ddp.tooling import cli_version
from eks_ddp.tooling.preflight import fsx as preflight_fsx
from eks_ddp.tooling.preflight import images as preflight_images
from eks_ddp.tooling.preflight import live as preflight_live
from eks_ddp.tooling.preflight import pins as preflight_pins
from eks_ddp.tooling.preflight import s3 as preflight_s3
from eks_ddp.tooling.preflight.capacity import CapacityChecks
from eks_ddp.tooling.preflight.clients import clients, clients_sts, ecr_clients, fsx_client, logs_client
from eks_ddp.tooling.preflight.network_quotas import NetworkQuotaChecks
from eks_ddp.tooling.preflight.s3 import S3Checks
from eks_ddp.tooling.preflight.vcpu_quotas import QUOTAS, VcpuQuotaChecks, quota_class  # noqa: F401 (API)

# Errors after which the same service will not answer either: say so once, skip its other calls.
_UNREACHABLE = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError")


@dataclass
class Report:
    """What preflight found: failures stop the deployment, warnings do not."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What preflight resolved and the deployment will use (each image pinned by tag: the digest it resolved to)."""

    @property
    def ok(self) -> bool:
        return not self.failures


def _join(items: Sequence[str] | None) -> str:
    return ", ".join(items) if items else "none"


class _Checker(CapacityChecks, NetworkQuotaChecks, S3Checks, VcpuQuotaChecks):
    """One preflight pass: shared caches, and the guard that turns API errors into warnings."""

    def __init__(self, cfg: StackConfig, ec2: Any, quotas: Any, cluster_name: str | None = None):
        self.cfg = cfg
        self.cluster_name = cluster_name
        """This stack's cluster: its own nodes are not new demand (they are counted at maxSize)."""
        self.ec2 = ec2
        self.quotas = quotas
        self.report = Report()
        self._down: set[str] = set()
        self._no_credentials = False
        self._offered: dict[str, list[str] | None] = {}
        self._reservations: dict[int, dict[str, Any]] = {}

    # -- plumbing -------------------------------------------------------------------------------
    def fail(self, message: str) -> None:
        self.report.failures.append(message)

    def warn(self, message: str) -> None:
        self.report.warnings.append(message)

    def attempt(self, service: str, action: str, what: str, fn: Callable[[], Any]) -> Any:
        """Run one API call; on an API/network error record a warning and return None."""
        if self._no_credentials or service in self._down:
            return None
        try:
            return fn()
        except NoCredentialsError:
            self._no_credentials = True
            self.warn(f"preflight: no AWS credentials found, so nothing was checked (first: {what}). "
                      "Configure credentials (aws configure / AWS_PROFILE) or set eks-ddp:preflight false")
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "Unknown")
            text = err.response.get("Error", {}).get("Message", "")
            hint = f"; allow {service}:{action}" if "Denied" in code or "Unauthorized" in code else ""
            self.warn(f"preflight: could not check {what} ({service}:{action}: {code} {text}){hint}".rstrip())
        except BotoCoreError as err:
            if type(err).__name__ in _UNREACHABLE:
                self._down.add(service)
                self.warn(f"preflight: could not reach the {service} API in {self.cfg.region} ({err}); "
                          f"{what} and the other {service} checks were skipped")
            else:
                self.warn(f"preflight: could not check {what} ({service}:{action}: {err})")
        return None

    # -- zones ------------------------------------------------------------------------------------
    def zones(self) -> tuple[list[str], str] | None:
        """The zones the cluster's subnets span, and the stack key that sets them."""
        net = self.cfg.network
        listed = self.attempt("ec2", "DescribeAvailabilityZones", f"the zones of {self.cfg.region}",
                              lambda: self.ec2.describe_availability_zones(Filters=[
                                  {"Name": "state", "Values": ["available"]},
                                  {"Name": "zone-type", "Values": ["availability-zone"]},
                                  {"Name": "opt-in-status", "Values": ["opt-in-not-required"]}],
                              )["AvailabilityZones"])
        # Names map to IDs per account; EKS refuses subnets by ID (UnsupportedAvailabilityZoneException).
        zone_id = {z["ZoneName"]: z.get("ZoneId", "") for z in listed or []}
        available = None if listed is None else [z for z, i in zone_id.items() if i not in EKS_UNSUPPORTED_ZONE_IDS]
        if net.availability_zones:
            if listed is not None:
                for i, az in enumerate(net.availability_zones):
                    if zone_id.get(az) in EKS_UNSUPPORTED_ZONE_IDS:
                        self.fail(f"network.availabilityZones[{i}]: {az} is zone ID {zone_id[az]} in this account, "
                                  f"where EKS does not accept cluster subnets; choose from {_join(available)}")
                    elif az not in zone_id:
                        self.fail(f"network.availabilityZones[{i}]: {az} is not an available zone of "
                                  f"{self.cfg.region}; available: {_join(available)}")
            return list(net.availability_zones), "network.availabilityZones"
        if net.bring_your_own:
            subnets = self.attempt("ec2", "DescribeSubnets", "the zones of network.privateSubnetIds",
                                   lambda: self.ec2.describe_subnets(
                                       SubnetIds=list(net.private_subnet_ids))["Subnets"])
            if subnets is None:
                return None
            for s in subnets:
                if s.get("AvailabilityZoneId") in EKS_UNSUPPORTED_ZONE_IDS:
                    self.fail(f"network.privateSubnetIds: {s['SubnetId']} is in zone ID {s['AvailabilityZoneId']} "
                              f"({s['AvailabilityZone']}), where EKS does not accept cluster subnets; "
                              "use subnets in other zones")
            return sorted({s["AvailabilityZone"] for s in subnets}), "network.privateSubnetIds"
        if available is None:
            return None
        if len(available) < net.az_count:
            self.fail(f"network.azCount: {net.az_count} zones asked, but {self.cfg.region} has only "
                      f"{len(available)} available ({_join(available)}); lower network.azCount")
        # The zones the new VPC gets (pinned zones first), the same choice __main__.py makes.
        return choose_zones(self.cfg, available), "network.availabilityZones"

    def offered_in(self, instance_type: str) -> list[str] | None:
        if instance_type not in self._offered:
            def fetch() -> list[str]:
                pages = self.ec2.get_paginator("describe_instance_type_offerings").paginate(
                    LocationType="availability-zone",
                    Filters=[{"Name": "instance-type", "Values": [instance_type]}])
                return sorted(o["Location"] for page in pages for o in page["InstanceTypeOfferings"])
            self._offered[instance_type] = self.attempt(
                "ec2", "DescribeInstanceTypeOfferings", f"where {instance_type} is offered", fetch)
        return self._offered[instance_type]

    def check_offered(self, key: str, instance_type: str, zones: list[str], fix: str) -> None:
        offered = self.offered_in(instance_type)
        if offered is None:
            return
        missing = [z for z in zones if z not in offered]
        if not missing:
            return
        if not offered:
            self.fail(f"{key}: {instance_type} is not offered in any zone of {self.cfg.region}; "
                      f"choose another {key} or region")
            return
        self.fail(f"{key}: {instance_type} is not offered in {_join(missing)}; offered in: {_join(offered)}. {fix}")

    # -- checks -------------------------------------------------------------------------------------
    def check_offerings(self, zones: tuple[list[str], str] | None) -> None:
        cluster_zones, zones_key = zones if zones else (None, "network.availabilityZones")
        for i, g in enumerate(self.cfg.node_groups):
            key = f"nodeGroups[{i}]"
            if g.availability_zone is not None:
                self.check_offered(f"{key}.instanceType", g.instance_type, [g.availability_zone],
                                   f"Set {key}.availabilityZone to one of those, or choose another {key}.instanceType")
            elif cluster_zones is not None:
                self.check_offered(f"{key}.instanceType", g.instance_type, cluster_zones,
                                   f"Set {key}.availabilityZone or {zones_key}")
        if cluster_zones is not None:
            self.check_offered("cluster.systemInstanceType", self.cfg.cluster.system_instance_type, cluster_zones,
                               f"Choose another cluster.systemInstanceType or set {zones_key}")

    def check_efa(self) -> None:
        for i, g in enumerate(self.cfg.node_groups):
            if not g.efa:
                continue
            info = self.attempt("ec2", "DescribeInstanceTypes", f"EFA support of {g.instance_type}",
                                functools.partial(self._instance_types, g.instance_type))
            if not info:
                continue
            network = info[0].get("NetworkInfo", {})
            if not network.get("EfaSupported", False):
                efa_types = [n for n in catalog.gpu_types() if catalog.CATALOG[n].has_efa]
                self.fail(f"nodeGroups[{i}].efa: {g.instance_type} does not support EFA; set nodeGroups[{i}].efa "
                          f"false, or choose an EFA type for nodeGroups[{i}].instanceType: {_join(efa_types)}")
                continue
            wanted = catalog.CATALOG[g.instance_type].efa_interfaces if g.instance_type in catalog.CATALOG else 0
            most = network.get("EfaInfo", {}).get("MaximumEfaInterfaces")
            if most is not None and wanted > most:
                self.warn(f"nodeGroups[{i}].efa: the catalog gives {g.instance_type} {wanted} EFA interfaces, "
                          f"AWS reports at most {most}; the launch template may be rejected")

    def _instance_types(self, instance_type: str) -> list[dict[str, Any]]:
        return self.ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]

def check(cfg: StackConfig, *, ec2: Any, quotas: Any, today: dt.date | None = None, eks: Any = None,
          cluster_name: str | None = None, stack_id: str | None = None, logs: Any = None,
          organization: str | None = None, ecr: Callable[[str], Any] | None = None, s3: Any = None, kms: Any = None,
          sts: Any = None, caller_sts: Any = None, egress_ip: Callable[[], str | None] | None = None,
          fsx: Any = None, registry: preflight_pins.Fetch | None = None,
          registry_credentials: preflight_pins.Credentials | None = None) -> Report:
    """Run every preflight check with the given boto3 ``ec2`` and ``service-quotas`` clients; with ``eks`` and
    ``cluster_name`` also the checks against what this stack already runs (:mod:`eks_ddp.tooling.preflight.live`);
    with ``s3`` (and ``kms``, ``sts``) the buckets the stack names (:mod:`eks_ddp.tooling.preflight.s3`).
    ``stack_id`` (``<organization>/<project>/<stack>``) is the cluster's owner tag. ``ecr(region)`` gives an
    ECR client of a region: with it, every ECR image the stack names must exist (:mod:`eks_ddp.tooling.preflight.images`).
    ``caller_sts`` (who runs this update) and ``egress_ip`` (this machine's public IP) check that this machine
    reaches a live cluster's API endpoint. With ``fsx`` (an FSx client) on an FSx for Lustre stack: the backup a
    restore names, and what this ``up`` would do to the live file system (:mod:`eks_ddp.tooling.preflight.fsx`).
    ``registry`` (one HTTP exchange): every image digest the project pins must resolve in its registry, and every
    image pinned by tag only must resolve to a digest (:mod:`eks_ddp.tooling.preflight.pins`; ECR's registries
    with ``registry_credentials``)."""
    c = _Checker(cfg, ec2, quotas, cluster_name)
    # Extended support bills the control plane $0.60/h instead of $0.10/h: say so before anything is created.
    notice = k8s_versions.support_notice(cfg.cluster.kubernetes_version, cfg.cluster.upgrade_policy,
                                         today or dt.date.today())
    if notice:
        c.warn(notice)
    zones = c.zones()
    c.check_offerings(zones)
    c.check_efa()
    c.check_reservations()
    c.check_placement_groups()
    c.check_quotas()
    c.check_network_quotas()
    if eks is not None and cluster_name is not None:
        preflight_live.check_live(c, eks, cluster_name, stack_id, logs=logs, organization=organization,
                                  sts=caller_sts, egress_ip=egress_ip)
    if ecr is not None:
        preflight_images.check_images(c, ecr)
    if s3 is not None:
        c.check_s3(s3, kms, sts)
    if fsx is not None and preflight_fsx.needed(cfg):
        preflight_fsx.check_backup(c, fsx)
        vpc_id = _own_cluster_vpc(c, eks, cluster_name, stack_id) if eks is not None and cluster_name else None
        if vpc_id:
            preflight_fsx.check_live_file_system(c, fsx, ec2, vpc_id, zones)
    if registry is not None:
        c.report.notes += [f"preflight: the image pinned by tag {line}" for line in
                           preflight_pins.check_pins(c, registry, credentials=registry_credentials)]
    return c.report


def _own_cluster_vpc(c: _Checker, eks: Any, cluster_name: str, stack_id: str | None) -> str | None:
    """The VPC of this stack's live cluster (None: no cluster yet, or another stack's)."""
    found = c.attempt("eks", "DescribeCluster", f"whether cluster {cluster_name} exists",
                      lambda: preflight_live.describe_cluster(eks, cluster_name))
    if not found:
        return None
    owner = (found.get("tags") or {}).get(preflight_live.STACK_TAG)
    if owner is not None and stack_id is not None and owner not in (stack_id, preflight_live.legacy_owner(stack_id)):
        return None
    return (found.get("resourcesVpcConfig") or {}).get("vpcId")



def run_or_raise(cfg: StackConfig, *, profile: str | None = None, ec2: Any = None, quotas: Any = None,
                 eks: Any = None, cluster_name: str | None = None, stack_id: str | None = None,
                 logs: Any = None, organization: str | None = None,
                 ecr: Callable[[str], Any] | None = None) -> Report:
    """Run the checks; log warnings; raise pulumi.RunError (no traceback) listing every failure.

    ``profile`` is the stack's ``aws:profile`` (so the checks ask the account the provider deploys
    to); ``ec2``/``quotas`` replace the boto3 clients, for tests.
    """
    import pulumi

    caller_sts = egress_ip = None
    registry: preflight_pins.Fetch | None = None
    if ec2 is None or quotas is None:
        registry = preflight_pins.urllib_fetch  # the real registries, only with the real AWS clients
        try:
            made_ec2, made_quotas, made_eks = clients(cfg.region, profile)
            caller_sts = clients_sts(cfg.region, profile)
        except BotoCoreError as err:  # e.g. ProfileNotFound
            pulumi.log.warn(f"preflight: could not create AWS clients ({err}); nothing was checked")
            return Report(warnings=[str(err)])
        ec2, quotas, eks = ec2 or made_ec2, quotas or made_quotas, eks or made_eks
        ecr = ecr or ecr_clients(profile)
        logs = logs or logs_client(cfg.region, profile)
        egress_ip = preflight_live.checkip
    fsx = None
    if preflight_fsx.needed(cfg):
        try:
            fsx = fsx_client(cfg.region, profile)
        except BotoCoreError as err:
            pulumi.log.warn(f"preflight: could not create an FSx client ({err}); the file system was not checked")
    s3 = kms = sts = None
    if preflight_s3.needed(cfg):  # buckets named in the stack: data sets, extra buckets, the results bucket
        try:
            s3, kms, sts = preflight_s3.clients(cfg.region, profile)
        except BotoCoreError as err:
            pulumi.log.warn(f"preflight: could not create S3 clients ({err}); the buckets were not checked")
    report = check(cfg, ec2=ec2, quotas=quotas, eks=eks, cluster_name=cluster_name, stack_id=stack_id, logs=logs,
                   organization=organization, ecr=ecr, s3=s3, kms=kms, sts=sts, caller_sts=caller_sts,
                   egress_ip=egress_ip, fsx=fsx, registry=registry,
                   registry_credentials=preflight_pins.ecr_credentials(ecr) if registry and ecr else None)
    if too_old := cli_version.problem():
        report.failures.append(too_old)
    for message in report.warnings:
        pulumi.log.warn(message)
    for message in report.notes:
        pulumi.log.info(message)
    if report.failures:
        raise pulumi.RunError(
            f"preflight found {len(report.failures)} problem(s) in {cfg.region}; nothing was created:\n"
            + "\n".join(f"  - {f}" for f in report.failures)
            + "\n(fix the keys named above; eks-ddp:preflight false skips these checks)")
    return report
