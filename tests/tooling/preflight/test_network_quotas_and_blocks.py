"""Preflight's VPC and Elastic IP quotas (moto's EC2, the quota stub), a capacity block's window against the block,
and no version change of a capacity-block group that has nodes."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest

from eks_ddp.tooling import preflight
from eks_ddp.tooling.preflight import live as preflight_live
from tests.support.moto_account import fake_account
from tests.support.stub_quotas import StubQuotas, add_reservations, reservation
from tests.support.util import set_path, stack_config
from tests.tooling.preflight.test_preflight import CR, config, p4de_raw

VPCS, EIPS = "L-F678F1CE", "L-0263D0A3"


@pytest.fixture
def aws(monkeypatch):
    with fake_account(monkeypatch):
        yield lambda cfg: boto3.client("ec2", region_name=cfg.region)


def vpcs_in_use(ec2) -> int:
    return len(ec2.describe_vpcs()["Vpcs"])


def test_a_region_without_room_for_the_new_vpc_fails_naming_the_way_out(aws):
    # Review B15: the sixth stack in a region failed mid-`up`; preflight checked only vCPU quotas.
    cfg = config(stack_config("dev"))
    ec2 = aws(cfg)
    used = vpcs_in_use(ec2)  # moto's default VPC
    report = preflight.check(cfg, ec2=ec2, quotas=StubQuotas({VPCS: used}), cluster_name="eks-ddp-dev")
    [msg] = report.failures
    assert msg.startswith(f"network.vpcId: the new VPC needs 1 more of 'VPCs per Region' (vpc/{VPCS}), but {used} of "
                          f"{used} are in use in us-west-2")
    assert f"--service-code vpc --quota-code {VPCS} --desired-value {used + 1}" in msg and "network.vpcId with" in msg
    # Room for one more: passes. This stack's own VPC (a later `up`) is not counted again.
    assert preflight.check(cfg, ec2=ec2, quotas=StubQuotas({VPCS: used + 1})).ok
    ec2.create_vpc(CidrBlock="10.9.0.0/16", TagSpecifications=[{"ResourceType": "vpc", "Tags": [
        {"Key": "Name", "Value": "eks-ddp-dev-vpc"}]}])
    assert preflight.check(cfg, ec2=ec2, quotas=StubQuotas({VPCS: used + 1}), cluster_name="eks-ddp-dev").ok
    assert not preflight.check(cfg, ec2=ec2, quotas=StubQuotas({VPCS: used + 1}), cluster_name="other").ok


def test_the_nat_gateways_elastic_ips_must_fit_their_quota(aws):
    cfg = config(set_path(stack_config("dev"), "eks-ddp:network.natGateways", "perAz"))  # 2 zones: 2 EIPs
    ec2 = aws(cfg)
    for _ in range(3):
        ec2.allocate_address(Domain="vpc")
    [msg] = preflight.check(cfg, ec2=ec2, quotas=StubQuotas({EIPS: 4})).failures
    assert msg.startswith(f"network.natGateways: the new VPC needs 2 more of 'EC2-VPC Elastic IPs' (ec2/{EIPS}), but 3 "
                          "of 4 are in use") and "network.natGateways single" in msg
    assert preflight.check(cfg, ec2=ec2, quotas=StubQuotas({EIPS: 5})).ok
    single = config(stack_config("dev"))
    assert preflight.check(single, ec2=ec2, quotas=StubQuotas({EIPS: 4})).ok


def test_a_brought_vpc_needs_neither_quota(aws):
    raw = set_path(stack_config("dev"), "eks-ddp:network", {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": [
        "subnet-0123456789abcdef0", "subnet-0123456789abcdef1"], "publicSubnetIds": []})
    cfg = config(raw)
    quotas = StubQuotas({VPCS: 0, EIPS: 0})
    report = preflight.check(cfg, ec2=aws(cfg), quotas=quotas)
    assert not any("VPCs per Region" in f or "Elastic IPs" in f for f in report.failures)
    assert VPCS not in quotas.asked and EIPS not in quotas.asked


def _block_cfg(start: str, end: str):
    raw = p4de_raw()
    for path, value in {"capacityReservationId": CR, "capacityType": "capacityBlock", "capacityBlockStart": start,
                        "capacityBlockEnd": end}.items():
        raw = set_path(raw, f"eks-ddp:nodeGroups[0].{path}", value)
    return config(set_path(raw, "eks-ddp:job.state", "cancelled"))


def _block(start: dt.datetime, end: dt.datetime) -> dict:
    return reservation(CR, "p4de.24xlarge", "us-east-1b", reservation_type="capacity-block", state="scheduled") | {
        "StartDate": start, "EndDate": end}


def test_the_window_must_be_the_blocks_own(aws):
    start = dt.datetime(2030, 1, 2, 11, 30, tzinfo=dt.UTC)
    end = start + dt.timedelta(days=7)
    cfg = _block_cfg("2030-01-02T11:30:00Z", "2030-01-09T11:30:00Z")
    ec2 = aws(cfg)
    add_reservations(ec2, [_block(start, end)])
    assert preflight.check(cfg, ec2=ec2, quotas=StubQuotas()).failures == []
    shifted = _block_cfg("2030-01-02T11:30:00Z", "2030-01-10T11:30:00Z")
    assert preflight.check(shifted, ec2=ec2, quotas=StubQuotas()).failures == [
        "nodeGroups[0].capacityBlockEnd: got 2030-01-10T11:30:00Z, but capacity block cr-0123456789abcdef0 ends at "
        "2030-01-09T11:30:00Z; set nodeGroups[0].capacityBlockEnd 2030-01-09T11:30:00Z"]


class _Collect:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def fail(self, message: str) -> None:
        self.failures.append(message)


def test_no_version_or_ami_change_of_a_capacity_block_group_with_nodes():
    # Review B18: EKS updates a capacity-block group only at desired size 0.
    cfg = _block_cfg("2030-01-02T11:30:00Z", "2030-01-09T11:30:00Z")
    live = {"a100": {"nodegroupName": "gpu-a100-x", "version": "1.35", "releaseVersion": "1.35.5-20260601",
                     "scalingConfig": {"desiredSize": 2}}}
    c = _Collect()
    preflight_live.check_block_versions(c, live, cfg, "eks-ddp-p4de")
    [msg] = c.failures
    assert msg.startswith("nodeGroups[0]: capacity-block group gpu-a100-x runs 2 node(s), and this update changes its "
                          "AMI release 1.35.5-20260601 -> 1.35.6-20260714")
    assert "--scaling-config desiredSize=0,minSize=0" in msg
    # Negative controls: no nodes, or nothing changes, or an on-demand group: no failure.
    for change in ({"scalingConfig": {"desiredSize": 0}}, {"releaseVersion": "1.35.6-20260714"}):
        c = _Collect()
        preflight_live.check_block_versions(c, {"a100": {**live["a100"], **change}}, cfg, "eks-ddp-p4de")
        assert c.failures == []
    c = _Collect()
    preflight_live.check_block_versions(c, live, config(p4de_raw()), "eks-ddp-p4de")
    assert c.failures == []
