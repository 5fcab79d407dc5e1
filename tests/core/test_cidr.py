"""The pure CIDR layout of a new VPC (components/eks_ddp/core/cidr.py): disjoint subnets inside the VPC, one pair per zone."""

from __future__ import annotations

import ipaddress

import pytest

from eks_ddp.core import cidr


@pytest.mark.parametrize("vpc,zones", [("10.0.0.0/16", 2), ("10.0.0.0/16", 3), ("10.0.0.0/16", 6),
                                       ("172.16.0.0/20", 4), ("192.168.0.0/24", 6), ("10.1.0.0/16", 1)])
def test_layout_is_disjoint_inside_the_vpc_one_pair_per_zone(vpc, zones):
    layout = cidr.plan_subnets(vpc, zones)
    assert len(layout) == zones
    all_cidrs = [z.public for z in layout] + [z.private for z in layout]
    assert not cidr.overlaps(all_cidrs)
    net = ipaddress.ip_network(vpc)
    for c in all_cidrs:
        sub = ipaddress.ip_network(c)
        assert sub.subnet_of(net), c
        assert sub.prefixlen <= cidr.AWS_SMALLEST_SUBNET_PREFIX, c


def test_16_over_3_zones_private_larger_than_public():
    layout = cidr.plan_subnets("10.0.0.0/16", 3)
    assert [z.private for z in layout] == ["10.0.0.0/19", "10.0.32.0/19", "10.0.64.0/19"]
    assert [z.public for z in layout] == ["10.0.128.0/21", "10.0.136.0/21", "10.0.144.0/21"]
    for z in layout:
        assert ipaddress.ip_network(z.private).num_addresses > ipaddress.ip_network(z.public).num_addresses


def test_16_over_2_zones_gives_18s_for_nodes():
    layout = cidr.plan_subnets("10.0.0.0/16", 2)
    assert [z.private for z in layout] == ["10.0.0.0/18", "10.0.64.0/18"]
    assert [z.public for z in layout] == ["10.0.128.0/20", "10.0.144.0/20"]


def test_overlaps_detects_overlap():
    assert cidr.overlaps(["10.0.0.0/16", "10.0.3.0/24"])
    assert not cidr.overlaps(["10.0.0.0/24", "10.0.1.0/24"])


@pytest.mark.parametrize("vpc,zones,field", [("10.0.0.0/27", 2, "vpc_cidr"), ("not-a-cidr", 2, "vpc_cidr"),
                                             ("10.0.0.1/16", 2, "vpc_cidr"), ("fd00::/56", 2, "vpc_cidr"),
                                             ("10.0.0.0/16", 0, "zones")])
def test_layout_rejects_bad_input_naming_the_field(vpc, zones, field):
    with pytest.raises(cidr.CidrError, match=f"^{field}:"):
        cidr.plan_subnets(vpc, zones)
