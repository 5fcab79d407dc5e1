"""Pure CIDR math for the VPC: one public and one private subnet per availability zone.

Layout (no Pulumi, no AWS; tested on its own in ``tests/infra/test_network.py``):

* The **first half** of the VPC holds the private subnets, one per zone. Each is
  the VPC split into ``2 ** (ceil(log2(zones)) + 1)`` equal blocks, so for a /16
  over 2 zones a private subnet is a /18 (16,379 usable addresses): the VPC CNI
  gives every pod a VPC address, so node subnets need room.
* The **second half** holds the public subnets, a quarter the size of a private
  one (they carry only NAT gateways and load balancers), never smaller than /28,
  AWS's smallest subnet.

Example, 10.0.0.0/16 over 3 zones: private 10.0.0.0/19, 10.0.32.0/19,
10.0.64.0/19; public 10.0.128.0/21, 10.0.136.0/21, 10.0.144.0/21.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

AWS_SMALLEST_SUBNET_PREFIX = 28
"""AWS rejects subnets smaller than a /28."""

PUBLIC_SHRINK_BITS = 2
"""Public subnets are 2**2 = 4 times smaller than private ones."""


@dataclass(frozen=True)
class ZoneSubnets:
    """The two subnets of one availability zone."""

    public: str
    """CIDR of the zone's public subnet (NAT gateway, internet-facing load balancers)."""
    private: str
    """CIDR of the zone's private subnet (nodes, pods, EFS mount targets)."""


class CidrError(ValueError):
    """A VPC CIDR that cannot hold the requested zones."""


def plan_subnets(vpc_cidr: str, zones: int) -> list[ZoneSubnets]:
    """Split ``vpc_cidr`` into one public and one private subnet per zone.

    Raises CidrError (naming ``vpc_cidr`` or ``zones``) when the input is not an
    IPv4 network or the VPC is too small for ``zones`` zones.
    """
    try:
        vpc = ipaddress.ip_network(vpc_cidr, strict=True)
    except ValueError as err:
        raise CidrError(f"vpc_cidr: got {vpc_cidr!r}; expected an IPv4 network such as 10.0.0.0/16 ({err})") from None
    if vpc.version != 4:
        raise CidrError(f"vpc_cidr: got {vpc_cidr!r}; expected an IPv4 network")
    if zones < 1:
        raise CidrError(f"zones: got {zones!r}; expected at least 1")

    private_prefix = vpc.prefixlen + math.ceil(math.log2(zones)) + 1
    if private_prefix > AWS_SMALLEST_SUBNET_PREFIX:
        raise CidrError(f"vpc_cidr: got {vpc_cidr!r}; too small for {zones} zones "
                        f"(private subnets would be /{private_prefix}, smaller than AWS's /28 minimum)")
    public_prefix = min(private_prefix + PUBLIC_SHRINK_BITS, AWS_SMALLEST_SUBNET_PREFIX)

    first_half, second_half = vpc.subnets(prefixlen_diff=1)
    private = list(first_half.subnets(new_prefix=private_prefix))[:zones]
    public = list(second_half.subnets(new_prefix=public_prefix))[:zones]
    return [ZoneSubnets(public=str(pub), private=str(priv)) for pub, priv in zip(public, private, strict=True)]


def overlaps(cidrs: list[str]) -> bool:
    """Whether any two of ``cidrs`` overlap."""
    nets = [ipaddress.ip_network(c) for c in cidrs]
    return any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
