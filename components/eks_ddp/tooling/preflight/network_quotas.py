"""Preflight's network quotas: the new VPC and the NAT gateways' Elastic IPs must fit the region's quotas.

A stack that creates its VPC uses one VPC and one Elastic IP per NAT gateway (``components/eks_ddp/infra/network.py``); the
defaults are 5 VPCs and 5 Elastic IPs per region, so the sixth stack in a region, or an account that already has
VPCs, would fail minutes into ``pulumi up``. The quota codes: Service Quotas ``vpc``/``L-F678F1CE`` "VPCs per Region"
(moto's copy of the Service Quotas defaults, ``moto/servicequotas/resources/default_quotas/vpc.py``: default 5.0) and
``ec2``/``L-0263D0A3`` "EC2-VPC Elastic IPs" (brennerm/aws-quota-checker ``aws_quota/check/ec2.py``,
``ElasticIpCountCheck``, which counts ``DescribeAddresses`` entries without ``ServiceManaged``, as here). This
stack's own VPC and Elastic IPs (their ``Name`` tags, ``<cluster>-vpc`` and ``<cluster>-nat-<zone>``) are already
there on a later ``pulumi up`` and are not counted again. A brought VPC (``network.vpcId``) needs neither.

A mixin of :class:`eks_ddp.tooling.preflight.checker._Checker` (``cfg``, ``ec2``, ``quotas``, ``cluster_name``, ``attempt``,
``fail``). IAM actions (read-only): ec2:DescribeVpcs, ec2:DescribeAddresses, servicequotas:GetServiceQuota,
servicequotas:GetAWSDefaultServiceQuota.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

VPC_QUOTA = ("vpc", "L-F678F1CE", "VPCs per Region")
EIP_QUOTA = ("ec2", "L-0263D0A3", "EC2-VPC Elastic IPs")


def quota_value(quotas: Any, service: str, code: str) -> float:
    """The applied quota, else (never raised in this account) AWS's default."""
    try:
        return float(quotas.get_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"])
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") != "NoSuchResourceException":
            raise
        return float(quotas.get_aws_default_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"])


def _name(resource: dict[str, Any]) -> str:
    return next((t.get("Value", "") for t in resource.get("Tags") or [] if t.get("Key") == "Name"), "")


class NetworkQuotaChecks:
    """VPC and Elastic IP quota checks of :class:`eks_ddp.tooling.preflight.checker._Checker`."""

    cfg: Any
    ec2: Any
    quotas: Any
    cluster_name: str | None
    attempt: Callable[..., Any]
    """_Checker.attempt: one AWS call, a warning instead of a failure when it is denied."""
    fail: Callable[[str], None]

    def check_network_quotas(self) -> None:
        net = self.cfg.network
        if net.bring_your_own:
            return
        zones = len(net.availability_zones) or net.az_count
        nats = zones if net.nat_gateways == "perAz" else 1
        own = self.cluster_name or "\0"

        def vpcs() -> int:
            pages = self.ec2.get_paginator("describe_vpcs").paginate()
            return sum(1 for page in pages for v in page["Vpcs"] if _name(v) != f"{own}-vpc")

        def addresses() -> int:
            found = self.ec2.describe_addresses()["Addresses"]
            return sum(1 for a in found if a.get("ServiceManaged") is None and not _name(a).startswith(f"{own}-nat-"))

        for (service, code, name), need, count, what, fix in (
                (VPC_QUOTA, 1, vpcs, "the VPCs in the region",
                 "or bring your own VPC: network.vpcId with network.publicSubnetIds and network.privateSubnetIds"),
                (EIP_QUOTA, nats, addresses, "the Elastic IPs in the region",
                 "or set network.natGateways single (one Elastic IP), or bring your own VPC: network.vpcId")):
            used = self.attempt("ec2", "DescribeVpcs" if service == "vpc" else "DescribeAddresses", what, count)
            limit = self.attempt("servicequotas", "GetServiceQuota", f"the '{name}' quota ({code})",
                                 lambda s=service, c=code: quota_value(self.quotas, s, c))
            if used is None or limit is None or used + need <= limit:
                continue
            key = "network.vpcId" if service == "vpc" else "network.natGateways"
            self.fail(f"{key}: the new VPC needs {need} more of '{name}' ({service}/{code}), but {used:g} of "
                      f"{limit:g} are in use in {self.cfg.region}; request an increase: aws service-quotas "
                      f"request-service-quota-increase --region {self.cfg.region} --service-code {service} "
                      f"--quota-code {code} --desired-value {int(used + need)}, {fix}")
