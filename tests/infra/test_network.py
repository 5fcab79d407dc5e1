"""Network: the VPC component under mocks (new VPC and bring-your-own); the CIDR layout is tests/core/test_cidr.py."""

from __future__ import annotations

import pytest

from eks_ddp.core import cidr
from eks_ddp.infra.network import Network, NetworkArgs
from eks_ddp.tooling.mocks import run_program

VPC = "aws:ec2/vpc:Vpc"
SUBNET = "aws:ec2/subnet:Subnet"
NAT = "aws:ec2/natGateway:NatGateway"
ROUTE = "aws:ec2/route:Route"
ROUTE_TABLE = "aws:ec2/routeTable:RouteTable"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
ZONES2 = ["us-west-2a", "us-west-2b"]
ZONES3 = ["us-west-2a", "us-west-2b", "us-west-2c"]


# --- component under mocks -----------------------------------------------------------------------

def _run(args: NetworkArgs):
    holder = {}

    def program():
        holder["net"] = Network("network", args)

    return run_program({}, program=program), holder["net"]


def test_new_vpc_creates_public_and_private_subnets_per_zone_with_eks_tags():
    result, _ = _run(NetworkArgs(cluster_name="demo", availability_zones=ZONES3))
    assert len(result.of_type(VPC)) == 1
    subnets = result.of_type(SUBNET)
    public = [s for s in subnets if "kubernetes.io/role/elb" in s.inputs["tags"]]
    private = [s for s in subnets if "kubernetes.io/role/internal-elb" in s.inputs["tags"]]
    assert len(public) == 3 and len(private) == 3
    assert sorted(s.inputs["availabilityZone"] for s in private) == ZONES3
    for s in subnets:
        assert s.inputs["tags"]["kubernetes.io/cluster/demo"] == "shared"
        assert s.inputs["mapPublicIpOnLaunch"] is False
    assert {s.inputs["cidrBlock"] for s in private} == {z.private for z in cidr.plan_subnets("10.0.0.0/16", 3)}


def test_single_nat_by_default_and_every_private_route_goes_through_it():
    result, _ = _run(NetworkArgs(cluster_name="demo", availability_zones=ZONES3))
    assert len(result.of_type(NAT)) == 1
    nat_routes = [r for r in result.of_type(ROUTE) if r.inputs.get("natGatewayId")]
    assert len(nat_routes) == 3
    assert len({r.inputs["natGatewayId"] for r in nat_routes}) == 1
    igw_routes = [r for r in result.of_type(ROUTE) if r.inputs.get("gatewayId")]
    assert len(igw_routes) == 1


def test_per_az_nat_puts_one_gateway_in_each_zone():
    result, _ = _run(NetworkArgs(cluster_name="demo", availability_zones=ZONES3, nat_gateways="perAz"))
    nats = result.of_type(NAT)
    assert len(nats) == 3
    nat_routes = [r for r in result.of_type(ROUTE) if r.inputs.get("natGatewayId")]
    assert len({r.inputs["natGatewayId"] for r in nat_routes}) == 3


def test_s3_gateway_endpoint_on_private_route_tables():
    result, _ = _run(NetworkArgs(cluster_name="demo", availability_zones=ZONES2))
    ep = result.one(ENDPOINT)
    assert ep.inputs["vpcEndpointType"] == "Gateway"
    assert ep.inputs["serviceName"] == "com.amazonaws.us-west-2.s3"
    private_rts = [r.outputs["id"] for r in result.of_type(ROUTE_TABLE) if "private" in r.name]
    assert sorted(ep.inputs["routeTableIds"]) == sorted(private_rts)


def test_s3_endpoint_admits_reads_of_the_data_sets_and_extra_buckets_of_any_account_and_nothing_more():
    import json

    result, _ = _run(NetworkArgs(cluster_name="demo", availability_zones=ZONES2,
                                 s3_data_uris=["s3://lake/corpora/wiki/", "s3://lake/img/", "s3://open-data/"],
                                 s3_endpoint_extra_buckets=["weights-bucket"]))
    by_sid = {s["Sid"]: s for s in json.loads(result.one(ENDPOINT).inputs["policy"])["Statement"]}
    assert by_sid["DataSetReads"]["Action"] == "s3:GetObject" and by_sid["DataSetReads"]["Resource"] == [
        "arn:aws:s3:::lake/corpora/wiki/*", "arn:aws:s3:::lake/img/*", "arn:aws:s3:::open-data/*"]
    assert by_sid["DataSetListing0"] == {
        "Sid": "DataSetListing0", "Effect": "Allow", "Principal": "*", "Action": "s3:ListBucket",
        "Resource": "arn:aws:s3:::lake",
        "Condition": {"StringLike": {"s3:prefix": ["corpora/wiki/", "corpora/wiki/*", "img/", "img/*"]}}}
    assert "Condition" not in by_sid["DataSetListing1"]  # the whole bucket is the data set
    assert by_sid["ExtraBucketReads"]["Action"] == ["s3:GetObject", "s3:ListBucket"]
    assert by_sid["ExtraBucketReads"]["Resource"] == ["arn:aws:s3:::weights-bucket", "arn:aws:s3:::weights-bucket/*"]
    others = [s for sid, s in by_sid.items() if sid not in ("ThisAccountsBuckets", "AwsOwnedReads")]
    assert all(set([s["Action"]] if isinstance(s["Action"], str) else s["Action"]) <= {"s3:GetObject", "s3:ListBucket"} for s in others)


def test_every_child_has_the_network_as_parent():
    result, _ = _run(NetworkArgs(cluster_name="demo", availability_zones=ZONES2))
    for r in result.resources:
        if r.type != "eks-ddp:network:Network":
            assert r.parent_type == "eks-ddp:network:Network", r.urn


def test_bring_your_own_vpc_creates_nothing_and_maps_subnets_to_zones():
    result, net = _run(NetworkArgs(cluster_name="demo", availability_zones=[], vpc_id="vpc-123",
                                   public_subnet_ids=["subnet-p1", "subnet-p2"],
                                   private_subnet_ids=["subnet-a", "subnet-b"]))
    assert [r.type for r in result.resources] == ["eks-ddp:network:Network"]
    assert net.private_subnet_ids == ["subnet-a", "subnet-b"]
    assert net.private_subnet_by_az == {"us-west-2a": "subnet-a", "us-west-2b": "subnet-b"}
    assert [a["id"] for t, a in result.calls if t == "aws:ec2/getSubnet:getSubnet"] == ["subnet-a", "subnet-b"]


@pytest.mark.parametrize("args,field", [
    (NetworkArgs(cluster_name="c", availability_zones=["us-west-2a"]), "availability_zones"),
    (NetworkArgs(cluster_name="c", availability_zones=["us-west-2a", "us-west-2a"]), "availability_zones"),
    (NetworkArgs(cluster_name="c", availability_zones=ZONES2, vpc_cidr="10.0.0.0/29"), "vpc_cidr"),
    (NetworkArgs(cluster_name="c", availability_zones=ZONES2, nat_gateways="two"), "nat_gateways"),  # type: ignore[arg-type]
    (NetworkArgs(cluster_name="c", availability_zones=ZONES2, private_subnet_ids=["subnet-a"]), "private_subnet_ids"),
    (NetworkArgs(cluster_name="c", availability_zones=[], vpc_id="vpc-1", private_subnet_ids=["subnet-a"]),
     "private_subnet_ids"),
    (NetworkArgs(cluster_name="c", availability_zones=ZONES2, s3_endpoint_extra_buckets=["s3://lake/"]),
     r"s3_endpoint_extra_buckets\[0\]: got 's3://lake/'"),
    (NetworkArgs(cluster_name="c", availability_zones=ZONES2, s3_endpoint_extra_buckets="lake"),
     "s3_endpoint_extra_buckets: got 'lake'"),
    (NetworkArgs(cluster_name="c", availability_zones=ZONES2, s3_data_uris=["s3://lake/wiki"]),
     r"s3_data_uris\[0\]: got 's3://lake/wiki'"),
])
def test_validation_names_the_field(args, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        _run(args)


def test_default_zones_are_regular_zones_where_eks_accepts_subnets():
    """Review M6: never a Local Zone, never use1-az3/usw1-az2/cac1-az3 (their names differ per account)."""
    from eks_ddp.tooling.mocks import RecordingMocks
    from tests.support.util import stack_config

    mocks = RecordingMocks(region="us-east-1")
    mocks.zone_ids = ["use1-az3", "use1-az1", "use1-az2", "use1-az4"]  # this account's us-east-1a is use1-az3
    config = {**stack_config("dev"), "aws:region": "us-east-1"}
    result = run_program(config, region="us-east-1", mocks=mocks)
    [args] = [a for t, a in result.calls if t == "aws:index/getAvailabilityZones:getAvailabilityZones"]
    assert args["state"] == "available"
    assert {"name": "opt-in-status", "values": ["opt-in-not-required"]} in args["filters"]
    assert set(args["excludeZoneIds"]) == {"use1-az3", "usw1-az2", "cac1-az3"}
    zones = sorted({s.inputs["availabilityZone"] for s in result.of_type("aws:ec2/subnet:Subnet")})
    assert "us-east-1a" not in zones and len(zones) == stack_config("dev")["eks-ddp:network"]["azCount"]


def test_flow_log_role_trusts_the_service_only_for_this_accounts_flow_logs():
    """Confused deputy (VPC user guide "IAM role for publishing flow logs to CloudWatch Logs"): VPC Flow Logs may
    assume the role only for a flow log of this account and region, evaluated as IAM would."""
    from eks_ddp.tooling.contracts.iam_policy import ALLOW, IMPLICIT_DENY, Request, evaluate

    result, _ = _run(NetworkArgs(cluster_name="demo", availability_zones=ZONES2))
    trust = result.one("aws:iam/role:Role", "network-flow-logs").inputs["assumeRolePolicy"]

    def assume(account: str, region: str = "us-west-2") -> str:
        ctx = {"aws:SourceAccount": account, "aws:SourceArn": f"arn:aws:ec2:{region}:{account}:vpc-flow-log/fl-0a1"}
        return evaluate(trust, Request("vpc-flow-logs.amazonaws.com", "sts:AssumeRole", "role", ctx),
                        resource_policy=True).effect

    assert assume("123456789012") == ALLOW
    assert assume("999999999999") == IMPLICIT_DENY and assume("123456789012", "eu-west-1") == IMPLICIT_DENY
