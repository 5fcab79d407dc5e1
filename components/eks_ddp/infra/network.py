"""The VPC the cluster lives in: a new one over N zones, or one you bring.

A new VPC gets, per zone, a public subnet (NAT gateway, internet-facing load
balancers) and a larger private subnet (nodes, pods, EFS mount targets), from
the pure layout in :mod:`eks_ddp.core.cidr`. Private subnets reach the internet
through NAT: one gateway by default (cheapest; a zone outage cuts egress of the
other zones), or one per zone (``nat_gateways="perAz"``). S3 traffic skips NAT
through a free gateway endpoint, which also saves NAT data charges on datasets
and checkpoints. Subnets carry the tags the AWS load balancer integrations look
for.

A new VPC is locked down by default: its default security group has no rule
(CIS AWS Foundations 5.4; nothing of ours uses it), every flow is logged to a
CloudWatch log group (EKS Best Practices, network "Log network traffic"), and
the S3 endpoint admits only requests for this account's buckets plus reads of
the AWS-owned buckets that ECR layers, Amazon Linux packages and the
registry.k8s.io mirror come from, so a pod cannot ship data to someone else's
bucket through it.

Bring your own VPC by setting ``vpc_id`` and the subnet ids: nothing is
created (its flow logs and default security group are yours to set), and each
private subnet's zone is looked up (``aws.ec2.get_subnet``) so single-zone GPU
groups (EFA, capacity reservations) pick the right subnet.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from eks_ddp.core import cidr, rules
from eks_ddp.core.types import NatMode

ANY_VPC_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
"""Where any VPC's IPv4 blocks lie (AWS allows RFC 1918 and 100.64.0.0/10 for VPC CIDRs, beside public ranges
that are not advised): :attr:`Network.vpc_cidrs` of a brought VPC whose id is only known later."""
FLOW_LOG_RETENTION_DAYS = 90
"""How long VPC flow logs are kept (CloudWatch Logs retention)."""
FLOW_LOG_AGGREGATION_SECONDS = 600
"""Flow log aggregation interval: 600 s (the cheaper of the two EC2 allows; 60 is the other)."""


def s3_endpoint_policy(region: str, account_id: str, *, data_uris: Sequence[str] = (),
                       extra_buckets: Sequence[str] = ()) -> str:
    """The S3 gateway endpoint's policy: anything on this account's buckets; reads of the AWS-owned buckets nodes
    need (ECR image layers, Amazon Linux 2023 packages, registry.k8s.io's mirror); reads of the data sets the runs
    stage (``data_uris``: ``s3://bucket/prefix/``, list that prefix and get objects under it) and of
    ``extra_buckets`` (list and get, whole buckets), whoever owns them; nothing else (EKS Best Practices, network
    "Use VPC endpoint policies"). The endpoint carries every same-region S3 request from the private subnets
    (AWS PrivateLink, "Gateway endpoints for Amazon S3"), so a bucket missing here is refused whatever the pod's
    role allows; nothing can be written to another account's bucket through it."""
    s3 = f"arn:{rules.partition(region)}:s3:::"
    statements: list[dict] = [
        {"Sid": "ThisAccountsBuckets", "Effect": "Allow", "Principal": "*", "Action": "s3:*",
         "Resource": [f"{s3}*", f"{s3}*/*"],
         "Condition": {"StringEquals": {"aws:ResourceAccount": account_id}}},
        {"Sid": "AwsOwnedReads", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
         "Resource": [f"{s3}prod-{region}-starport-layer-bucket/*",
                      f"{s3}al2023-repos-{region}-*/*",
                      # registry.k8s.io (the cluster autoscaler) redirects AWS clients to its regional S3 mirror.
                      f"{s3}prod-registry-k8s-io-{region}/*"]},
    ]
    data = sorted({(u.removeprefix("s3://").split("/", 1)[0], u.removeprefix("s3://").split("/", 1)[1])
                   for u in data_uris})
    if data:
        statements.append({"Sid": "DataSetReads", "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                           "Resource": [f"{s3}{b}/{p}*" for b, p in data]})
        prefixes: dict[str, set[str]] = {}
        for b, p in data:
            prefixes.setdefault(b, set()).add(p)
        for i, (bucket, ps) in enumerate(sorted(prefixes.items())):
            listing: dict[str, Any] = {"Sid": f"DataSetListing{i}", "Effect": "Allow", "Principal": "*", "Action": "s3:ListBucket",
                       "Resource": f"{s3}{bucket}"}
            if "" not in ps:  # the stage lists with Prefix=<its prefix>
                listing["Condition"] = {"StringLike": {"s3:prefix": sorted({*ps, *(f"{p}*" for p in ps)})}}
            statements.append(listing)
    if extra_buckets:
        names = sorted(set(extra_buckets))
        statements.append({"Sid": "ExtraBucketReads", "Effect": "Allow", "Principal": "*",
                           "Action": ["s3:GetObject", "s3:ListBucket"],
                           "Resource": [r for b in names for r in (f"{s3}{b}", f"{s3}{b}/*")]})
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


def flow_logs_trust_policy(region: str, account_id: str) -> str:
    """The flow-log role's trust: VPC Flow Logs, only on behalf of this account's flow logs in this region (VPC user
    guide "IAM role for publishing flow logs to CloudWatch Logs", its confused-deputy conditions)."""
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "vpc-flow-logs.amazonaws.com"}, "Action": "sts:AssumeRole",
        "Condition": {"StringEquals": {"aws:SourceAccount": account_id},
                      "ArnLike": {"aws:SourceArn": f"arn:{rules.partition(region)}:ec2:{region}:{account_id}:"
                                                   "vpc-flow-log/*"}}}]})


EKS_UNSUPPORTED_ZONE_IDS = ("use1-az3", "usw1-az2", "cac1-az3")
"""Zone IDs where EKS refuses cluster subnets (UnsupportedAvailabilityZoneException), from the EKS user guide
"VPC and subnet requirements". Zone *names* map to IDs differently in each account, so filter by ID."""
STANDARD_ZONE_FILTERS = ({"name": "opt-in-status", "values": ["opt-in-not-required"]},)
"""Regular zones only: Local and Wavelength Zones are opt-in, and an opted-in one (``us-west-2-lax-1a``)
sorts before ``us-west-2a``."""


def standard_zones(opts: pulumi.InvokeOptions | None = None) -> list[str]:
    """The region's available regular zones where EKS accepts subnets, in EC2's order."""
    found = aws.get_availability_zones(
        state="available", filters=[aws.GetAvailabilityZonesFilterArgs(**f) for f in STANDARD_ZONE_FILTERS],
        exclude_zone_ids=list(EKS_UNSUPPORTED_ZONE_IDS), opts=opts)
    return list(found.names)


@dataclass(frozen=True, kw_only=True)
class NetworkArgs:
    """Inputs of :class:`Network`."""

    cluster_name: str
    """EKS cluster name, for the ``kubernetes.io/cluster/<name>`` subnet tags."""
    availability_zones: Sequence[str] = ()
    """Zones of the new VPC, one public and one private subnet each (at least 2; not used with ``vpc_id``)."""
    vpc_cidr: str = "10.0.0.0/16"
    """CIDR of the new VPC."""
    nat_gateways: NatMode = "single"
    """'single': one NAT gateway (cheapest); 'perAz': one per zone (survives a zone outage)."""
    vpc_id: pulumi.Input[str] | None = None
    """Existing VPC to use (an Output too, e.g. from a StackReference); then nothing is created."""
    public_subnet_ids: Sequence[pulumi.Input[str]] = field(default_factory=tuple)
    """Existing public subnets (with ``vpc_id``); may be empty for a private-only cluster."""
    private_subnet_ids: Sequence[str] = field(default_factory=tuple)
    """Existing private subnets for nodes (with ``vpc_id``), in at least two zones: plain ids, because the
    program looks up each one's zone while it runs (a single-zone node group picks its subnet by zone)."""
    s3_data_uris: Sequence[str] = ()
    """S3 prefixes (``s3://bucket/prefix/``) the workloads stage (``S3Data.uri``): the new VPC's S3 endpoint lets
    pods list each prefix and read objects under it, in any account's bucket."""
    s3_endpoint_extra_buckets: Sequence[str] = ()
    """More bucket names pods may read (list, get) through the new VPC's S3 endpoint: other accounts' buckets (a
    data lake, AWS Open Data) a workload reads itself. This account's buckets need no entry."""

    @property
    def bring_your_own(self) -> bool:
        return self.vpc_id is not None


def validate(args: NetworkArgs) -> None:
    """Raise ValueError naming the bad field (the stack config's rules; Outputs where the program needs values
    get a message saying so, never a TypeError)."""
    rules.require(rules.known("cluster_name", args.cluster_name, "a string", "it names the subnets and their tags"))
    rules.require(rules.cluster_name("cluster_name", args.cluster_name))
    if args.nat_gateways not in ("single", "perAz"):
        raise ValueError(f"nat_gateways: got {args.nat_gateways!r}; expected 'single' or 'perAz'")
    for field_name in ("availability_zones", "public_subnet_ids", "private_subnet_ids"):
        rules.require(rules.known(field_name, getattr(args, field_name), "a list",
                                  "the program makes or looks up one subnet per entry"))
    for field_name, check in (("s3_data_uris", rules.s3_prefix), ("s3_endpoint_extra_buckets", rules.s3_bucket)):
        values = getattr(args, field_name)
        rules.require(rules.known(field_name, values, "a list", "they are written into the endpoint policy"))
        if isinstance(values, str):
            raise ValueError(f"{field_name}: got {values!r}; expected a list of them, not one string")
        rules.require(*[rules.known(f"{field_name}[{i}]", v, "a string", "it is written into the endpoint policy")
                        or check(f"{field_name}[{i}]", v) for i, v in enumerate(values)])
    if args.bring_your_own:
        ids = list(args.private_subnet_ids)
        rules.require(*[rules.known(f"private_subnet_ids[{i}]", v, "a subnet id string",
                                    "the program looks up its zone") for i, v in enumerate(ids)])
        if len(ids) < 2:
            raise ValueError(f"private_subnet_ids: got {ids!r}; expected at least 2 "
                             "subnets (EKS needs two zones) with vpc_id")
        return
    if args.public_subnet_ids or args.private_subnet_ids:
        raise ValueError("private_subnet_ids: subnet ids given without vpc_id; expected both or neither")
    zones = list(args.availability_zones)
    rules.require(*[rules.known(f"availability_zones[{i}]", z, "a zone name", "it names the subnets")
                    or rules.zone(f"availability_zones[{i}]", z) for i, z in enumerate(zones)])
    if len(zones) < 2:
        raise ValueError(f"availability_zones: got {zones!r}; expected at least 2 zones (EKS requires two)")
    if len(set(zones)) != len(zones):
        raise ValueError(f"availability_zones: got {zones!r}; expected distinct zones")
    rules.require(rules.known("vpc_cidr", args.vpc_cidr, "a CIDR string", "the subnets are carved from it")
                  or rules.vpc_cidr("vpc_cidr", args.vpc_cidr))  # the stack config's rule: a private range
    cidr.plan_subnets(args.vpc_cidr, len(zones))  # raises CidrError (a ValueError) naming vpc_cidr


class Network(pulumi.ComponentResource):
    """A VPC with public and private subnets over several zones (or an existing one)."""

    vpc_id: pulumi.Output[str]
    public_subnet_ids: list[pulumi.Input[str]]
    """Public subnet ids, in zone order (a plain list, so callers can loop over it)."""
    private_subnet_ids: list[pulumi.Input[str]]
    """Private subnet ids, in zone order."""
    private_subnet_by_az: dict[str, pulumi.Input[str]]
    """Zone -> the private subnet in it (the first one, when several share a zone)."""
    vpc_cidrs: list[str]
    """The VPC's IPv4 CIDR blocks, known while the program runs: the control plane's ENIs have addresses there (a
    NetworkPolicy admitting the API server's calls names them). A brought VPC's are looked up (every associated
    block); a ``vpc_id`` that is an Output gives the RFC 1918 ranges and 100.64.0.0/10, which hold any VPC's."""

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:network:Network", name, None, opts)
        validate(args)
        self._name = name
        self._args = args
        if args.vpc_id is not None:  # bring your own
            self._adopt(args.vpc_id)
        else:
            self._create()
        self.register_outputs({
            "vpc_id": self.vpc_id,
            "public_subnet_ids": self.public_subnet_ids,
            "private_subnet_ids": self.private_subnet_ids,
            "private_subnet_by_az": self.private_subnet_by_az,
        })

    # -- bring your own ------------------------------------------------------------------------
    def _adopt(self, vpc_id: pulumi.Input[str]) -> None:
        args = self._args
        self.vpc_id = pulumi.Output.from_input(vpc_id)
        self.public_subnet_ids = list(args.public_subnet_ids)
        self.private_subnet_ids = list(args.private_subnet_ids)
        by_az: dict[str, pulumi.Input[str]] = {}
        invoke_opts = pulumi.InvokeOptions(parent=self)
        for subnet_id in args.private_subnet_ids:
            # A plain invoke (not get_subnet_output): the zone is a dict key that drives which
            # subnet a single-zone node group uses, so it must be known while the program runs.
            zone = aws.ec2.get_subnet(id=subnet_id, opts=invoke_opts).availability_zone
            by_az.setdefault(zone, subnet_id)
        self.private_subnet_by_az = by_az
        if isinstance(vpc_id, str):  # a plain invoke, like the subnets': the CIDRs go into rendered policies
            vpc = aws.ec2.get_vpc(id=vpc_id, opts=invoke_opts)
            self.vpc_cidrs = [a.cidr_block for a in vpc.cidr_block_associations or []
                              if a.state in (None, "associated")] or [vpc.cidr_block]
        else:
            self.vpc_cidrs = list(ANY_VPC_CIDRS)

    # -- a new VPC -------------------------------------------------------------------------------
    def _create(self) -> None:
        args, name = self._args, self._name
        zones = list(args.availability_zones)
        layout = cidr.plan_subnets(args.vpc_cidr, len(zones))
        child = pulumi.ResourceOptions(parent=self)
        cluster_tag = {f"kubernetes.io/cluster/{args.cluster_name}": "shared"}

        self.vpc_cidrs = [args.vpc_cidr]
        vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=args.vpc_cidr, enable_dns_hostnames=True,
                          enable_dns_support=True, tags={"Name": f"{args.cluster_name}-vpc"}, opts=child)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id,
                                      tags={"Name": f"{args.cluster_name}-igw"}, opts=child)

        public_rt = aws.ec2.RouteTable(f"{name}-public-rt", vpc_id=vpc.id,
                                       tags={"Name": f"{args.cluster_name}-public"}, opts=child)
        aws.ec2.Route(f"{name}-public-default", route_table_id=public_rt.id, destination_cidr_block="0.0.0.0/0",
                      gateway_id=igw.id, opts=child)

        public_subnets: list[aws.ec2.Subnet] = []
        private_subnets: list[aws.ec2.Subnet] = []
        for zone, block in zip(zones, layout, strict=True):
            pub = aws.ec2.Subnet(
                f"{name}-public-{zone}", vpc_id=vpc.id, cidr_block=block.public, availability_zone=zone,
                # Nothing launched here needs a public IP by default: NAT gateways use Elastic IPs.
                map_public_ip_on_launch=False,
                tags={"Name": f"{args.cluster_name}-public-{zone}", "kubernetes.io/role/elb": "1", **cluster_tag},
                opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-public-{zone}", subnet_id=pub.id, route_table_id=public_rt.id,
                                          opts=child)
            priv = aws.ec2.Subnet(
                f"{name}-private-{zone}", vpc_id=vpc.id, cidr_block=block.private, availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={"Name": f"{args.cluster_name}-private-{zone}", "kubernetes.io/role/internal-elb": "1",
                      **cluster_tag},
                opts=child)
            public_subnets.append(pub)
            private_subnets.append(priv)

        nat_zones = zones if args.nat_gateways == "perAz" else zones[:1]
        nats: dict[str, aws.ec2.NatGateway] = {}
        for zone, pub in zip(zones, public_subnets, strict=True):
            if zone not in nat_zones:
                continue
            eip = aws.ec2.Eip(f"{name}-nat-{zone}", domain="vpc", tags={"Name": f"{args.cluster_name}-nat-{zone}"},
                              opts=child)
            nats[zone] = aws.ec2.NatGateway(
                f"{name}-nat-{zone}", allocation_id=eip.id, subnet_id=pub.id,
                tags={"Name": f"{args.cluster_name}-nat-{zone}"},
                opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]))

        private_rts: list[aws.ec2.RouteTable] = []
        for zone, priv in zip(zones, private_subnets, strict=True):
            rt = aws.ec2.RouteTable(f"{name}-private-rt-{zone}", vpc_id=vpc.id,
                                    tags={"Name": f"{args.cluster_name}-private-{zone}"}, opts=child)
            nat = nats.get(zone) or nats[nat_zones[0]]
            aws.ec2.Route(f"{name}-private-default-{zone}", route_table_id=rt.id, destination_cidr_block="0.0.0.0/0",
                          nat_gateway_id=nat.id, opts=child)
            aws.ec2.RouteTableAssociation(f"{name}-private-{zone}", subnet_id=priv.id, route_table_id=rt.id,
                                          opts=child)
            private_rts.append(rt)

        invoke = pulumi.InvokeOptions(parent=self)
        region = aws.get_region(opts=invoke).region
        account_id = aws.get_caller_identity(opts=invoke).account_id
        aws.ec2.VpcEndpoint(f"{name}-s3", vpc_id=vpc.id, service_name=rules.s3_gateway_service_name(region),
                            vpc_endpoint_type="Gateway", route_table_ids=[rt.id for rt in private_rts],
                            policy=s3_endpoint_policy(region, account_id, data_uris=args.s3_data_uris,
                                                      extra_buckets=args.s3_endpoint_extra_buckets),
                            tags={"Name": f"{args.cluster_name}-s3"}, opts=child)
        # Adopted with no rules: EC2's allow-all-between-members default is revoked.
        aws.ec2.DefaultSecurityGroup(f"{name}-default-sg", vpc_id=vpc.id,
                                     tags={"Name": f"{args.cluster_name}-default-closed"}, opts=child)
        self._create_flow_logs(vpc.id, region, account_id)

        self.vpc_id = vpc.id
        self.public_subnet_ids = [s.id for s in public_subnets]
        self.private_subnet_ids = [s.id for s in private_subnets]
        self.private_subnet_by_az = {zone: s.id for zone, s in zip(zones, private_subnets, strict=True)}

    def _create_flow_logs(self, vpc_id: pulumi.Input[str], region: str, account_id: str) -> None:
        name, cluster = self._name, self._args.cluster_name
        child = pulumi.ResourceOptions(parent=self)
        group = aws.cloudwatch.LogGroup(f"{name}-flow-logs", name=f"/eks-ddp/{cluster}/vpc-flow-logs",
                                        retention_in_days=FLOW_LOG_RETENTION_DAYS, opts=child)
        role = aws.iam.Role(f"{name}-flow-logs", assume_role_policy=flow_logs_trust_policy(region, account_id),
                            opts=child)
        aws.iam.RolePolicy(f"{name}-flow-logs", role=role.id, policy=group.arn.apply(lambda arn: json.dumps({
            "Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents",
                                              "logs:DescribeLogStreams"],
                "Resource": [arn, f"{arn}:*"]}]})), opts=child)
        aws.ec2.FlowLog(f"{name}-flow-log", vpc_id=vpc_id, traffic_type="ALL", log_destination_type="cloud-watch-logs",
                        log_destination=group.arn, iam_role_arn=role.arn,
                        max_aggregation_interval=FLOW_LOG_AGGREGATION_SECONDS,
                        tags={"Name": f"{cluster}-flow-log"}, opts=child)
