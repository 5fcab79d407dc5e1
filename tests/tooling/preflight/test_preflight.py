"""Preflight against moto's EC2 (zones, offerings, instance types, instances) and the stubs in stub_quotas.

moto's offering data used here: us-west-2 offers g4dn.xlarge in a, b, c (not d);
us-east-1 offers p4de.24xlarge in b and c only.
"""

from __future__ import annotations

import dataclasses

import boto3
import pulumi
import pytest
from botocore.exceptions import EndpointConnectionError, NoCredentialsError
from moto import mock_aws

from eks_ddp.config import StackConfig, load_stack_config
from eks_ddp.tooling import preflight
from tests.support.stub_quotas import (
    StubQuotas,
    add_placement_groups,
    add_reservations,
    client_error,
    deny,
    reservation,
)
from tests.support.util import drop_path, set_path, stack_config

CR = "cr-0123456789abcdef0"


def config(raw: dict) -> StackConfig:
    """The validated StackConfig for a test's raw stack config, as __main__.py builds it."""
    return load_stack_config({k: v for k, v in raw.items() if k.startswith("eks-ddp:")},
                             region=raw["aws:region"])


def p4de_raw(zone: str = "us-east-1b") -> dict:
    """The p4de example stack moved to a zone where moto offers p4de.24xlarge."""
    return set_path(stack_config("p4de"), "eks-ddp:nodeGroups[0].availabilityZone", zone)


@pytest.fixture
def aws(monkeypatch):
    """Fake credentials and a moto account; yields a factory of EC2 clients for a region."""
    for var, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield lambda cfg: boto3.client("ec2", region_name=cfg.region)


def launch(ec2, instance_type: str, count: int, *, spot: bool = False) -> None:
    """Instances already running in the account (they count against the quotas)."""
    extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    ec2.run_instances(ImageId="ami-12345678", InstanceType=instance_type, MinCount=count, MaxCount=count, **extra)


def only(report: preflight.Report) -> str:
    assert len(report.failures) == 1, report.failures
    return report.failures[0]


# --- passing cases ----------------------------------------------------------------------------------

def test_dev_stack_passes(aws):
    cfg = config(stack_config("dev"))
    quotas = StubQuotas()
    report = preflight.check(cfg, ec2=aws(cfg), quotas=quotas)
    assert report.ok and report.failures == [] and report.warnings == []
    # G on-demand for the GPU group, Standard on-demand for the t3.large system group; the new VPC and its NAT EIP.
    assert set(quotas.asked) == {"L-DB2E81BA", "L-1216C47A", "L-F678F1CE", "L-0263D0A3"}


def test_p4de_stack_with_matching_reservation_passes(aws):
    cfg = config(set_path(p4de_raw(), "eks-ddp:nodeGroups[0].capacityReservationId", CR))
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", total=2)])
    report = preflight.check(cfg, ec2=ec2, quotas=StubQuotas())
    assert report.failures == [] and report.warnings == []


def test_quota_never_raised_falls_back_to_the_aws_default(aws):
    cfg = config(stack_config("dev"))
    report = preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas({"L-DB2E81BA": 4}, default_only=True))
    assert "L-DB2E81BA" in only(report)


# --- zone offerings ------------------------------------------------------------------------------------

def test_type_not_offered_in_a_cluster_zone(aws):
    cfg = config(set_path(stack_config("dev"), "eks-ddp:network.availabilityZones", ["us-west-2c", "us-west-2d"]))
    msg = only(preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas()))
    assert msg == ("nodeGroups[0].instanceType: g4dn.xlarge is not offered in us-west-2d; offered in: "
                   "us-west-2a, us-west-2b, us-west-2c. Set nodeGroups[0].availabilityZone or network.availabilityZones")


def test_type_not_offered_in_the_groups_zone(aws):
    cfg = config(p4de_raw("us-east-1a"))  # the example stack's zone: moto has no p4de there
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1a")])
    msg = only(preflight.check(cfg, ec2=ec2, quotas=StubQuotas()))
    assert msg.startswith("nodeGroups[0].instanceType: p4de.24xlarge is not offered in us-east-1a; "
                          "offered in: us-east-1b, us-east-1c. Set nodeGroups[0].availabilityZone")


def test_default_zones_are_the_regions_first_az_count(aws, monkeypatch):
    # 4 zones in us-west-2 (a-d); g4dn.xlarge lacks d, so only azCount 4 reaches it.
    raw = set_path(stack_config("dev"), "eks-ddp:network.azCount", 4)
    cfg = config(raw)
    assert "us-west-2d" in only(preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas()))
    cfg3 = config(set_path(raw, "eks-ddp:network.azCount", 3))
    assert preflight.check(cfg3, ec2=aws(cfg3), quotas=StubQuotas()).ok


def test_zone_that_does_not_exist(aws):
    cfg = config(set_path(stack_config("dev"), "eks-ddp:network.availabilityZones", ["us-west-2a", "us-west-2z"]))
    failures = preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas()).failures
    assert any(f.startswith("network.availabilityZones[1]: us-west-2z is not an available zone") for f in failures)


# --- EFA -------------------------------------------------------------------------------------------------

def test_efa_not_supported(aws):
    cfg = config(stack_config("dev"))
    # Config validation rejects this from the catalog; preflight re-checks against AWS itself.
    cfg = dataclasses.replace(cfg, node_groups=(dataclasses.replace(cfg.node_groups[0], efa=True),))
    msg = only(preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas()))
    assert msg.startswith("nodeGroups[0].efa: g4dn.xlarge does not support EFA; set nodeGroups[0].efa false")


def test_efa_supported_passes(aws):
    cfg = config(p4de_raw())
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b")])
    assert cfg.node_groups[0].efa
    assert preflight.check(cfg, ec2=ec2, quotas=StubQuotas()).ok


# --- vCPU quotas --------------------------------------------------------------------------------------------

def test_on_demand_g_quota_exceeded(aws):
    cfg = config(stack_config("dev"))
    msg = only(preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas({"L-DB2E81BA": 4})))
    assert msg.startswith("nodeGroups[0].maxSize: 8 vCPUs of 'Running On-Demand G and VT instances' (L-DB2E81BA)")
    assert "quota in us-west-2 is 4" in msg and "--quota-code L-DB2E81BA --desired-value 8" in msg


def test_on_demand_g_quota_counts_running_instances_but_not_spot_ones(aws):
    cfg = config(stack_config("dev"))
    ec2 = aws(cfg)
    launch(ec2, "g5.xlarge", 3, spot=True)  # spot: a different quota
    quotas = StubQuotas({"L-DB2E81BA": 12})
    assert preflight.check(cfg, ec2=ec2, quotas=quotas).ok  # 8 requested, 0 on-demand running
    launch(ec2, "g4dn.xlarge", 2)  # 8 vCPUs of on-demand G in use
    msg = only(preflight.check(cfg, ec2=ec2, quotas=quotas))
    assert "on top of 8 vCPUs already running" in msg and "--desired-value 16" in msg


def test_on_demand_p_quota_exceeded(aws):
    raw = drop_path(p4de_raw(), "eks-ddp:nodeGroups.0.capacityReservationId")
    cfg = config(raw)
    msg = only(preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas({"L-417A185B": 96})))
    assert msg.startswith("nodeGroups[0].maxSize: 192 vCPUs of 'Running On-Demand P instances' (L-417A185B) "
                          "needed for 2 x p4de.24xlarge (96 vCPUs)")


def test_reservation_slots_do_not_count_again(aws):
    # The reservation's vCPUs are charged to the quota when it is created; launching into it adds none.
    cfg = config(set_path(p4de_raw(), "eks-ddp:nodeGroups[0].maxSize", 3))
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", total=2)])
    # The quota already holds the reservation's 2 unused slots (192 vCPUs, since its creation), so the stack adds only
    # the 1 node beyond it (96): 288 in all, not 192 + 288.
    report = preflight.check(cfg, ec2=ec2, quotas=StubQuotas({"L-417A185B": 288}))
    assert report.failures == []
    assert any(w.startswith("nodeGroups[0].maxSize: 3 nodes") for w in report.warnings)


def test_unused_reserved_capacity_counts_against_the_quota_whosever_it_is(aws):
    """Reserved capacity counts against the On-Demand quota even while unused (EC2 user guide, "On-Demand Capacity
    Reservations"): this stack's reservation's free slots and another reservation's are added to what runs. The
    case that passed before: 96 vCPUs asked beyond the reservation, 288 allowed, 192 + 96 reserved and unused."""
    cfg = config(set_path(p4de_raw(), "eks-ddp:nodeGroups[0].maxSize", 3))
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", total=2),
                           reservation("cr-0fedcba9876543210", "p4d.24xlarge", "us-east-1a", total=1),
                           reservation("cr-0aaaaaaaaaaaaaaaa", "p4d.24xlarge", "us-east-1a", total=4, state="expired"),
                           reservation("cr-0bbbbbbbbbbbbbbbb", "p5.48xlarge", "us-east-1a", total=1,
                                       reservation_type="capacity-block")])
    msg = only(preflight.check(cfg, ec2=ec2, quotas=StubQuotas({"L-417A185B": 288})))
    assert msg.startswith("nodeGroups[0].maxSize: 96 vCPUs of 'Running On-Demand P instances' (L-417A185B)")
    assert "on top of 288 vCPUs reserved but unused" in msg and "--desired-value 384" in msg
    # negative control: without the other reservation the same stack fits (expired ones and blocks never count)
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", total=2)])
    assert preflight.check(cfg, ec2=ec2, quotas=StubQuotas({"L-417A185B": 288})).failures == []


@pytest.mark.parametrize(("path_value", "code", "name"), [
    ({}, "L-3819A6DF", "All G and VT Spot Instance Requests"),
    ({"instanceType": "p4d.24xlarge"}, "L-7212CCBC", "All P Spot Instance Requests"),
])
def test_spot_quota_exceeded(aws, path_value, code, name):
    raw = set_path(stack_config("dev"), "eks-ddp:nodeGroups[0].capacityType", "spot")
    for key, value in path_value.items():
        raw = set_path(raw, f"eks-ddp:nodeGroups[0].{key}", value)
    cfg = config(raw)
    # The on-demand quotas are 0 and do not matter for a spot group.
    quotas = StubQuotas({code: 4, "L-DB2E81BA": 0, "L-417A185B": 0})
    msg = only(preflight.check(cfg, ec2=aws(cfg), quotas=quotas))
    assert msg.startswith("nodeGroups[0].maxSize: ") and f"'{name}' ({code})" in msg


def test_system_group_counts_against_the_standard_quota(aws):
    cfg = config(stack_config("dev"))
    msg = only(preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas({"L-1216C47A": 1})))
    assert msg.startswith("cluster.systemNodeCount: 2 vCPUs of 'Running On-Demand Standard")


# --- capacity reservations -------------------------------------------------------------------------------

def check_with(aws, found: list[dict], **group) -> preflight.Report:
    raw = p4de_raw()
    for key, value in group.items():
        raw = set_path(raw, f"eks-ddp:nodeGroups[0].{key}", value)
    cfg = config(raw)
    ec2 = aws(cfg)
    add_reservations(ec2, found)
    return preflight.check(cfg, ec2=ec2, quotas=StubQuotas())


def test_reservation_missing(aws):
    msg = only(check_with(aws, [reservation("cr-0aaaaaaaaaaaaaaaa", "p4de.24xlarge", "us-east-1b")]))
    assert msg.startswith(f"nodeGroups[0].capacityReservationId: {CR} was not found in us-east-1")


def test_reservation_not_active(aws):
    msg = only(check_with(aws, [reservation(CR, "p4de.24xlarge", "us-east-1b", state="expired", available=0)],
                          desiredSize=0))
    assert msg.startswith(f"nodeGroups[0].capacityReservationId: {CR} is expired, not active")


def test_reservation_wrong_type(aws):
    msg = only(check_with(aws, [reservation(CR, "p4d.24xlarge", "us-east-1b")]))
    assert msg.startswith(f"nodeGroups[0].instanceType: p4de.24xlarge, but capacity reservation {CR} "
                          "reserves p4d.24xlarge")


def test_reservation_wrong_zone(aws):
    msg = only(check_with(aws, [reservation(CR, "p4de.24xlarge", "us-east-1c")]))
    assert msg == (f"nodeGroups[0].availabilityZone: us-east-1b, but capacity reservation {CR} is in us-east-1c; "
                   "set nodeGroups[0].availabilityZone to us-east-1c")


def test_reservation_too_few_free_instances(aws):
    msg = only(check_with(aws, [reservation(CR, "p4de.24xlarge", "us-east-1b", total=4, available=1)]))
    assert msg.startswith(f"job.nodes: 2 nodes, but capacity reservation {CR} has only "
                          "1 of 4 instances free")


def test_reservation_too_few_free_instances_names_the_largest_run(aws):
    raw = p4de_raw()
    job = raw.pop("eks-ddp:job")
    raw["eks-ddp:runs"] = [{**job, "runId": "small", "nodes": 1, "minNodes": 1}, {**job, "runId": "big", "nodes": 2}]
    cfg = config(raw)
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", total=4, available=1)])
    msg = only(preflight.check(cfg, ec2=ec2, quotas=StubQuotas()))
    assert msg.startswith(f"runs[1].nodes: 2 nodes, but capacity reservation {CR} has only 1 of 4 instances free")


def test_reservation_kind_must_match_capacity_type(aws):
    block = reservation(CR, "p4de.24xlarge", "us-east-1b", reservation_type="capacity-block")
    msg = only(check_with(aws, [block]))
    assert msg.startswith("nodeGroups[0].capacityType: onDemand, but") and "set nodeGroups[0].capacityType to capacityBlock" in msg
    assert check_with(aws, [block], capacityType="capacityBlock").ok


def test_all_failures_are_reported_together(aws):
    raw = set_path(p4de_raw("us-east-1a"), "eks-ddp:nodeGroups[0].capacityType", "onDemand")
    cfg = config(raw)
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4d.24xlarge", "us-east-1c", total=2, available=0, state="pending")])
    failures = preflight.check(cfg, ec2=ec2, quotas=StubQuotas({"L-1216C47A": 1})).failures
    keys = sorted(f.split(":", 1)[0] for f in failures)
    assert keys == ["cluster.systemNodeCount", "nodeGroups[0].availabilityZone",
                    "nodeGroups[0].capacityReservationId", "nodeGroups[0].instanceType", "nodeGroups[0].instanceType"]


# --- API errors become warnings -----------------------------------------------------------------------------

def test_access_denied_on_quotas_is_a_warning(aws):
    cfg = config(stack_config("dev"))
    denied = StubQuotas(error=client_error("AccessDeniedException", "GetServiceQuota", "not authorized"))
    report = preflight.check(cfg, ec2=aws(cfg), quotas=denied)
    assert report.failures == []
    assert len(report.warnings) == 4  # the G and the Standard quota, VPCs and Elastic IPs
    assert all("could not check the '" in w and "allow servicequotas:GetServiceQuota" in w for w in report.warnings)


def test_unauthorized_ec2_operation_is_a_warning_and_other_checks_still_run(aws):
    cfg = config(stack_config("dev"))
    ec2 = aws(cfg)
    deny(ec2, "DescribeInstanceTypeOfferings")
    report = preflight.check(cfg, ec2=ec2, quotas=StubQuotas({"L-DB2E81BA": 4}))
    assert any("where g4dn.xlarge is offered" in w and "ec2:DescribeInstanceTypeOfferings: UnauthorizedOperation"
               in w for w in report.warnings)
    assert "L-DB2E81BA" in only(report)  # the quota check still ran


class _Unreachable:
    """An EC2 client whose every call fails before reaching AWS."""

    def __init__(self, error: Exception):
        self.error = error
        self.calls = 0

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls += 1
            raise self.error
        return call


def test_no_network_is_one_warning_per_service_not_a_crash(aws):
    cfg = config(stack_config("dev"))
    ec2 = _Unreachable(EndpointConnectionError(endpoint_url="https://ec2.us-west-2.amazonaws.com"))
    report = preflight.check(cfg, ec2=ec2, quotas=StubQuotas())
    assert report.failures == []
    assert len([w for w in report.warnings if "could not reach the ec2 API" in w]) == 1
    assert ec2.calls == 1


def test_no_credentials_is_one_warning(aws):
    cfg = config(stack_config("dev"))
    report = preflight.check(cfg, ec2=_Unreachable(NoCredentialsError()), quotas=StubQuotas())
    assert report.failures == [] and len(report.warnings) == 1
    assert report.warnings[0].startswith("preflight: no AWS credentials found")


# --- run_or_raise ---------------------------------------------------------------------------------------------

def test_run_or_raise_raises_one_run_error_with_every_failure(aws, monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warned.append(msg))
    cfg = config(set_path(stack_config("dev"), "eks-ddp:network.availabilityZones", ["us-west-2c", "us-west-2d"]))
    with pytest.raises(pulumi.RunError) as err:
        preflight.run_or_raise(cfg, ec2=aws(cfg), quotas=StubQuotas({"L-DB2E81BA": 4}))
    text = str(err.value)
    assert "preflight found 2 problem(s)" in text
    assert "nodeGroups[0].instanceType: g4dn.xlarge is not offered in us-west-2d" in text and "L-DB2E81BA" in text
    assert warned == []


def test_run_or_raise_logs_warnings_and_returns_when_nothing_failed(aws, monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warned.append(msg))
    cfg = config(stack_config("dev"))
    denied = StubQuotas(error=client_error("AccessDeniedException", "GetServiceQuota"))
    report = preflight.run_or_raise(cfg, ec2=aws(cfg), quotas=denied)
    assert report.ok and warned == report.warnings and len(warned) == 4  # G, Standard, VPCs, Elastic IPs


def test_unknown_aws_profile_is_a_warning(aws, monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warned.append(msg))
    report = preflight.run_or_raise(config(stack_config("dev")), profile="no-such-profile-here")
    assert report.ok and len(warned) == 1 and "no-such-profile-here" in warned[0]


def test_quota_class_of_arbitrary_types():
    assert [preflight.quota_class(t) for t in ("g6e.xlarge", "vt1.3xlarge", "p5.48xlarge", "m7i.large",
                                               "inf2.xlarge", "trn1.32xlarge", "x2idn.16xlarge")] == \
        ["G", "G", "P", "Standard", None, None, None]


# --- placement groups (review A-M2) -------------------------------------------------------------------

def _p4de_in(placement_group: str | None) -> dict:
    raw = set_path(p4de_raw(), "eks-ddp:nodeGroups[0].capacityReservationId", CR)
    return set_path(raw, "eks-ddp:nodeGroups[0].placementGroupName", placement_group) if placement_group else raw


def test_reservation_in_a_placement_group_needs_that_group_named(aws):
    cfg = config(_p4de_in(None))
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", placement_group="a100-cpg")])
    msg = only(preflight.check(cfg, ec2=ec2, quotas=StubQuotas()))
    assert msg.startswith("nodeGroups[0].placementGroupName: not set") and "'a100-cpg'" in msg
    assert "set nodeGroups[0].placementGroupName to a100-cpg" in msg


def test_reservation_in_another_placement_group_fails(aws):
    cfg = config(_p4de_in("other-cpg"))
    ec2 = aws(cfg)
    add_placement_groups(ec2, {"other-cpg": "cluster", "a100-cpg": "cluster"})
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", placement_group="a100-cpg")])
    msg = only(preflight.check(cfg, ec2=ec2, quotas=StubQuotas()))
    assert "'other-cpg'" in msg and "'a100-cpg'" in msg


def test_reservation_in_the_named_placement_group_passes(aws):
    cfg = config(_p4de_in("a100-cpg"))
    ec2 = aws(cfg)
    add_placement_groups(ec2, {"a100-cpg": "cluster"})
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", placement_group="a100-cpg")])
    report = preflight.check(cfg, ec2=ec2, quotas=StubQuotas())
    assert report.failures == [] and report.warnings == []


def test_placement_group_with_a_reservation_outside_any_group_is_a_warning(aws):
    cfg = config(_p4de_in("a100-cpg"))
    ec2 = aws(cfg)
    add_placement_groups(ec2, {"a100-cpg": "cluster"})
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b")])
    report = preflight.check(cfg, ec2=ec2, quotas=StubQuotas())
    assert report.failures == []
    assert len(report.warnings) == 1 and "not in a placement group" in report.warnings[0]


def test_named_placement_group_must_exist_and_be_cluster_for_efa(aws):
    raw = set_path(p4de_raw(), "eks-ddp:nodeGroups[0].placementGroupName", "missing-pg")
    raw = drop_path(raw, "eks-ddp:nodeGroups.0.capacityReservationId")
    cfg = config(raw)
    ec2 = aws(cfg)
    add_placement_groups(ec2, {})
    msg = only(preflight.check(cfg, ec2=ec2, quotas=StubQuotas()))
    assert msg.startswith("nodeGroups[0].placementGroupName: placement group 'missing-pg' was not found")
    cfg = config(set_path(raw, "eks-ddp:nodeGroups[0].placementGroupName", "spread-pg"))
    ec2 = aws(cfg)
    add_placement_groups(ec2, {"spread-pg": "spread"})
    msg = only(preflight.check(cfg, ec2=ec2, quotas=StubQuotas()))
    assert "strategy 'spread'" in msg and "'cluster'" in msg


def test_placement_group_name_of_an_arn():
    assert preflight.placement_group_of("arn:aws:ec2:us-east-1:123456789012:placement-group/a100-cpg") == "a100-cpg"
    assert preflight.placement_group_of(None) is None


# --- zones EKS refuses (review M6) ------------------------------------------------------------------------

def test_explicit_zone_with_an_unsupported_zone_id_fails(aws):
    # moto's us-east-1e is use1-az3, one of the zone IDs where EKS refuses cluster subnets.
    raw = set_path(set_path(stack_config("dev"), "aws:region", "us-east-1"),
                   "eks-ddp:network.availabilityZones", ["us-east-1a", "us-east-1e"])
    cfg = config(raw)
    failures = preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas()).failures
    assert any(f.startswith("network.availabilityZones[1]: us-east-1e is zone ID use1-az3") for f in failures), failures


def test_default_zones_skip_unsupported_zone_ids(aws):
    raw = set_path(set_path(stack_config("dev"), "aws:region", "us-east-1"), "eks-ddp:network.azCount", 6)
    cfg = config(raw)
    msg = only(preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas()))
    # Six zones asked, five usable: us-east-1e (use1-az3) is not counted.
    assert msg.startswith("network.azCount: 6 zones asked, but us-east-1 has only 5 available"), msg
    assert "us-east-1e" not in msg


# --- Kubernetes support phase (review M1) -----------------------------------------------------------------

def test_version_in_extended_support_warns_with_its_price(aws):
    import datetime as dt

    cfg = config(set_path(set_path(stack_config("dev"), "eks-ddp:cluster.kubernetesVersion", "1.33"),
                          "eks-ddp:cluster.upgradePolicy", "EXTENDED"))
    report = preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas(), today=dt.date(2026, 11, 22))
    assert report.ok
    assert [w for w in report.warnings if "left EKS standard support on 2026-07-29" in w and "$0.60/h" in w]
    default = config(stack_config("dev"))
    assert preflight.check(default, ec2=aws(default), quotas=StubQuotas(), today=dt.date(2026, 11, 22)).warnings == []
