"""Preflight against what the stack already runs (components/eks_ddp/tooling/preflight/live.py), on moto's EKS and EC2:
the cluster name's owner (A8), the version step (A3), resizes against live desired sizes (A2), this cluster's own
nodes in the quota and reservation checks (A5), and the zones the VPC really uses (A10)."""

from __future__ import annotations

import boto3
import pytest

from eks_ddp.config import choose_zones
from eks_ddp.tooling import preflight
from eks_ddp.tooling.preflight import checker as preflight_checker
from eks_ddp.tooling.preflight import live as preflight_live
from tests.support.moto_account import fake_account
from tests.support.stub_quotas import StubQuotas, add_reservations, reservation
from tests.support.util import set_path, stack_config
from tests.tooling.preflight.test_preflight import CR, config, p4de_raw


@pytest.fixture
def aws(monkeypatch):
    """Fake credentials and a moto account (EC2 and EKS); yields a factory of EC2 clients for a config's region."""
    with fake_account(monkeypatch):
        yield lambda cfg: boto3.client("ec2", region_name=cfg.region)

NAME = "eks-ddp-dev"
ME = "org/eks-ddp/dev"


def eks_cluster(region: str, *, name: str = NAME, version: str = "1.35", owner: str | None = ME,
                groups: dict[str, int] | None = None):
    """A moto EKS cluster with node groups labelled like eks-ddp's GPU groups, at the given desired sizes."""
    eks = boto3.client("eks", region_name=region)
    eks.create_cluster(name=name, version=version, roleArn="arn:aws:iam::123456789012:role/eks",
                       resourcesVpcConfig={"subnetIds": []}, tags={"eks-ddp/stack": owner} if owner else {})
    for label, desired in (groups or {}).items():
        eks.create_nodegroup(clusterName=name, nodegroupName=f"gpu-{label}-abc", subnets=["subnet-1"],
                             nodeRole="arn:aws:iam::123456789012:role/node", labels={"eks-ddp/node-group": label},
                             scalingConfig={"minSize": 0, "maxSize": max(desired, 2), "desiredSize": desired})
    return eks


def check(cfg, ec2, eks, quotas=None, stack_id=ME, name=NAME):
    return preflight.check(cfg, ec2=ec2, quotas=quotas or StubQuotas(), eks=eks, cluster_name=name, stack_id=stack_id)


def own_nodes(ec2, instance_type: str, count: int, cluster: str = NAME) -> None:
    ec2.run_instances(ImageId="ami-12345678", InstanceType=instance_type, MinCount=count, MaxCount=count,
                      TagSpecifications=[{"ResourceType": "instance", "Tags": [
                          {"Key": "eks:cluster-name", "Value": cluster}]}])


# --- A8: one cluster name per account and region -----------------------------------------------------------

def test_existing_cluster_of_other_stack_fails(aws):
    cfg = config(stack_config("dev"))
    eks = eks_cluster(cfg.region, owner="someone/eks-ddp/dev")
    report = check(cfg, aws(cfg), eks)
    [msg] = report.failures
    assert msg.startswith("cluster.name: an EKS cluster named 'eks-ddp-dev' already exists in us-west-2")
    assert "'someone/eks-ddp/dev'" in msg and "pulumi config set --path cluster.name" in msg
    # this stack's own cluster passes; one without the tag is a warning, not a failure
    assert check(cfg, aws(cfg), eks, stack_id="someone/eks-ddp/dev").ok
    untagged = eks_cluster(cfg.region, name="eks-ddp-x", owner=None)
    report = check(cfg, aws(cfg), untagged, name="eks-ddp-x")
    assert report.ok and any("without the eks-ddp/stack tag" in w for w in report.warnings)
    # no cluster of that name yet: nothing to say
    assert check(cfg, aws(cfg), eks, name="eks-ddp-new").warnings == []


def test_cluster_name_key_names_the_cluster_and_its_log_group():
    from tests.support.util import run

    raw = set_path(stack_config("dev"), "eks-ddp:cluster.name", "team-a-dev")
    raw = set_path(raw, "eks-ddp:cluster.ownerId", "0123456789abcdef")
    result = run(raw)
    assert result.one("eks:index:Cluster").inputs["name"] == "team-a-dev"
    group = result.one("aws:cloudwatch/logGroup:LogGroup", "cluster-logs").inputs
    assert group["name"] == "/aws/eks/team-a-dev/cluster"
    # B6: the owner id takes cluster.ownerId (unique on a self-managed backend), on the cluster and its log group.
    tags = result.one("eks:index:Cluster").inputs["clusterTags"]
    assert tags["eks-ddp/stack"] == group["tags"]["eks-ddp/stack"]
    assert tags["eks-ddp/stack"].endswith("/eks-ddp/dev/0123456789abcdef")  # the mocks' organization is None


# --- A3: one minor at a time, never back ---------------------------------------------------------------------

def test_upgrade_more_than_one_minor_or_back_fails(aws):
    raw = set_path(stack_config("dev"), "eks-ddp:cluster.kubernetesVersion", "1.36")
    cfg = config(raw)
    msg = " ".join(check(cfg, aws(cfg), eks_cluster(cfg.region, version="1.34")).failures)
    assert "got '1.36', but the cluster runs Kubernetes 1.34" in msg and "set cluster.kubernetesVersion 1.35" in msg
    assert check(cfg, aws(cfg), eks_cluster(cfg.region, name="n2", version="1.35"), name="n2").ok
    back = config(set_path(stack_config("dev"), "eks-ddp:cluster.kubernetesVersion", "1.35"))
    msg = " ".join(check(back, aws(back), eks_cluster(back.region, name="n3", version="1.36"), name="n3").failures)
    assert "EKS never downgrades" in msg and "pulumi config set --path cluster.kubernetesVersion 1.36" in msg


# --- A2: a resize never fails on, or scales in, the live group ------------------------------------------------

def test_min_size_above_live_desired_fails_early(aws):
    raw = set_path(stack_config("dev"), "eks-ddp:nodeGroups[0].minSize", 2)
    raw = set_path(raw, "eks-ddp:nodeGroups[0].desiredSize", 2)  # creation size; the live group's is 0
    cfg = config(raw)
    eks = eks_cluster(cfg.region, groups={cfg.node_groups[0].name: 0})
    [msg] = check(cfg, aws(cfg), eks).failures
    assert msg.startswith("nodeGroups[0].minSize: got 2, but the group runs 0 node(s)")
    assert (f"aws eks update-nodegroup-config --region us-west-2 --cluster-name {NAME} --nodegroup-name "
            f"gpu-{cfg.node_groups[0].name}-abc --scaling-config minSize=2,maxSize=2,desiredSize=2") in msg


def test_max_size_below_running_nodes_fails_instead_of_scaling_them_in(aws):
    raw = set_path(stack_config("dev"), "eks-ddp:nodeGroups[0].maxSize", 1)
    raw = set_path(raw, "eks-ddp:job.nodes", 1)
    cfg = config(raw)
    eks = eks_cluster(cfg.region, groups={cfg.node_groups[0].name: 2})
    [msg] = check(cfg, aws(cfg), eks).failures
    assert msg.startswith("nodeGroups[0].maxSize: got 1, but the group runs 2 node(s) now")
    # at or within the live size: nothing to refuse
    same = config(stack_config("dev"))
    assert check(same, aws(same), eks_cluster(same.region, name="n4", groups={same.node_groups[0].name: 2}),
                 name="n4").ok


# --- A5: own nodes are not new demand ----------------------------------------------------------------------

def test_own_nodes_are_not_new_demand(aws):
    cfg = config(stack_config("dev"))
    ec2 = aws(cfg)
    own_nodes(ec2, "g4dn.xlarge", 2)  # the run's two GPU nodes, 8 vCPUs: already part of maxSize 2 x 4
    quotas = StubQuotas({"L-DB2E81BA": 8})  # sized as preflight advises: maxSize x vCPUs
    assert check(cfg, ec2, None, quotas=quotas).ok
    # Negative control: the same instances without this cluster's tag are someone else's load.
    own_nodes(ec2, "g4dn.xlarge", 1, cluster="another-cluster")
    msg = " ".join(check(cfg, ec2, None, quotas=quotas).failures)
    assert "on top of 4 vCPUs already running" in msg


def test_own_nodes_in_the_reservation_are_not_taken_slots(aws, monkeypatch):
    cfg = config(set_path(p4de_raw(), "eks-ddp:nodeGroups[0].capacityReservationId", CR))
    ec2 = aws(cfg)
    add_reservations(ec2, [reservation(CR, "p4de.24xlarge", "us-east-1b", total=2, available=0)])
    checker = preflight_checker._Checker  # noqa: SLF001 - moto cannot launch into a reservation: stand in its count
    monkeypatch.setattr(checker, "own_in_reservation", lambda self, cr: 2 if self.cluster_name == NAME else 0)
    report = check(cfg, ec2, None, quotas=StubQuotas({"L-417A185B": 0}))
    assert report.failures == [], report.failures
    # Negative control: another cluster's use of the reservation leaves it full.
    other = check(cfg, ec2, None, quotas=StubQuotas({"L-417A185B": 0}), name="someone-else")
    assert any("has only 0 of 2 instances free" in f for f in other.failures)


# --- A10: the zones checked are the zones the VPC gets --------------------------------------------------------

def test_checks_zones_main_uses(aws, monkeypatch):
    """A group pinned to us-west-2d (outside the first azCount=2 zones): the VPC gets d plus the first other zone,
    and the system type is checked there, not in a and b."""
    raw = set_path(stack_config("dev"), "eks-ddp:nodeGroups[0].availabilityZone", "us-west-2d")
    cfg = config(raw)
    ec2 = aws(cfg)
    zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]]
    expected = choose_zones(cfg, zones)
    assert expected[0] == "us-west-2d" and expected != zones[: cfg.network.az_count]
    asked: list[list[str]] = []
    real = preflight_checker._Checker.check_offered  # noqa: SLF001

    def spy(self, key, instance_type, zones, fix):
        if key == "cluster.systemInstanceType":
            asked.append(list(zones))
        return real(self, key, instance_type, zones, fix)
    monkeypatch.setattr(preflight_checker._Checker, "check_offered", spy)  # noqa: SLF001
    preflight.check(cfg, ec2=ec2, quotas=StubQuotas())
    assert asked == [expected]


def test_live_checks_need_the_eks_client(aws):
    """Without an EKS client (or cluster name) the live checks are skipped: the offline tests above stay offline."""
    cfg = config(stack_config("dev"))
    assert preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas()).ok


# --- the API endpoint from where pulumi runs (refresh: always must not lock the stack out) ------------------------

HERE = "81.2.69.160"
ROLE_ARN = "arn:aws:iam::123456789012:role/team/deployer"
SESSION = "arn:aws:sts::123456789012:assumed-role/deployer/alice"


class _Eks:
    """moto's EKS client plus the access entries moto does not model."""

    def __init__(self, eks, entries: list[str]):
        self._eks, self._entries = eks, entries

    def __getattr__(self, name):
        return getattr(self._eks, name)

    def get_paginator(self, op):
        if op != "list_access_entries":
            return self._eks.get_paginator(op)
        entries = self._entries

        class _P:
            def paginate(self, clusterName):  # noqa: N803 (boto3's keyword)
                return [{"accessEntries": list(entries)}]
        return _P()


class _Sts:
    def __init__(self, arn: str):
        self.arn = arn

    def get_caller_identity(self):
        return {"Arn": self.arn, "Account": "123456789012"}


def _endpoint_cluster(region: str, cidrs: list[str], public: bool = True):
    eks = boto3.client("eks", region_name=region)
    if NAME in eks.list_clusters()["clusters"]:  # one test, several cases
        eks.delete_cluster(name=NAME)
    eks.create_cluster(name=NAME, version="1.35", roleArn="arn:aws:iam::123456789012:role/eks",
                       resourcesVpcConfig={"subnetIds": [], "endpointPublicAccess": public,
                                           "endpointPrivateAccess": True, "publicAccessCidrs": cidrs},
                       tags={"eks-ddp/stack": ME})
    return eks


def _endpoint_report(aws, *, live: list[str], ip: str | None = HERE, stack_cidrs: list[str] | None = None,
                     entries: list[str] = (ROLE_ARN,), caller: str = SESSION, admins: list[str] = (), public=True):
    raw = stack_config("dev")
    if stack_cidrs is not None:
        raw = set_path(raw, "eks-ddp:cluster.publicAccessCidrs", stack_cidrs)
    if admins:
        raw = set_path(raw, "eks-ddp:cluster.adminPrincipalArns", list(admins))
    cfg = config(raw)
    eks = _Eks(_endpoint_cluster(cfg.region, live, public), list(entries))
    return preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas(), eks=eks, cluster_name=NAME, stack_id=ME,
                           caller_sts=_Sts(caller), egress_ip=lambda: ip)


def test_an_ip_outside_the_endpoints_cidrs_fails_with_the_commands_that_fix_it(aws):
    report = _endpoint_report(aws, live=["5.6.7.8/32"])
    [msg] = [f for f in report.failures if "publicAccessCidrs" in f]
    assert f"this machine's public IP {HERE} is not in the API endpoint's publicAccessCidrs (5.6.7.8/32)" in msg
    assert f"pulumi config set --path 'cluster.publicAccessCidrs[1]' {HERE}/32 && pulumi up" in msg
    assert (f"aws eks update-cluster-config --region us-west-2 --name {NAME} --resources-vpc-config "
            f'endpointPublicAccess=true,endpointPrivateAccess=true,publicAccessCidrs="5.6.7.8/32","{HERE}/32"'
            ) in msg
    # Controls: inside the live CIDRs nothing is said; in the stack's CIDRs only (this update fixes it), a warning.
    assert not [m for m in _endpoint_report(aws, live=["81.2.69.0/24"]).failures if "publicAccessCidrs" in m]
    fixing = _endpoint_report(aws, live=["5.6.7.8/32"], stack_cidrs=[f"{HERE}/32"])
    assert not [f for f in fixing.failures if "publicAccessCidrs" in f]
    assert [w for w in fixing.warnings if "this update changes them" in w and "run pulumi up again" in w]


def test_an_unknown_ip_or_a_private_endpoint_warns(aws):
    unknown = _endpoint_report(aws, live=["5.6.7.8/32"], ip=None)
    assert not unknown.failures and [w for w in unknown.warnings if "could not learn this machine's public IP" in w]
    private = _endpoint_report(aws, live=[], public=False)
    assert not private.failures and [w for w in private.warnings if "endpoint of eks-ddp-dev is private" in w]


def test_a_caller_without_an_access_entry_fails_with_the_commands_that_fix_it(aws):
    report = _endpoint_report(aws, live=["81.2.69.0/24"], entries=["arn:aws:iam::123456789012:role/other"])
    [msg] = [f for f in report.failures if "access entry" in f]
    principal = "arn:aws:iam::123456789012:role/deployer"
    assert f"the caller {SESSION} ({principal}) has no access entry on {NAME}" in msg
    assert (f"aws eks create-access-entry --region us-west-2 --cluster-name {NAME} --principal-arn {principal} && "
            f"aws eks associate-access-policy --region us-west-2 --cluster-name {NAME} --principal-arn {principal} "
            "--policy-arn arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy --access-scope "
            "type=cluster") in msg
    assert f"pulumi config set --path 'cluster.adminPrincipalArns[0]' {principal}" in msg
    # Controls: the role's entry under its path counts; a principal the stack lists is added by this update.
    assert not [f for f in _endpoint_report(aws, live=["81.2.69.0/24"]).failures if "access entry" in f]
    listed = _endpoint_report(aws, live=["81.2.69.0/24"], entries=[], admins=[ROLE_ARN])
    assert not [f for f in listed.failures if "access entry" in f]
    assert [w for w in listed.warnings if "this update adds it" in w]


def test_the_kubernetes_provider_skips_an_unreachable_cluster_instead_of_failing_the_refresh(dev_result):
    # pulumi-kubernetes provider.go Read: without it every resource's refresh fails when the endpoint is unreachable.
    [provider] = dev_result.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["skipUpdateUnreachable"] == "true"


# --- B6: an owner unique per stack on every backend ------------------------------------------------------------

DIY = "organization/eks-ddp/dev"


def test_a_self_managed_backend_needs_an_owner_id(aws):
    """B6: pulumi.get_organization() is "organization" on every DIY backend, so two teams' `dev` stacks would
    share the owner tag; preflight refuses to go on without cluster.ownerId and prints the command."""
    cfg = config(stack_config("dev"))
    eks = boto3.client("eks", region_name=cfg.region)
    report = preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas(), eks=eks, cluster_name=NAME, stack_id=DIY,
                             organization="organization")
    [msg] = report.failures
    assert msg.startswith("cluster.ownerId: required on a self-managed backend") and \
        "pulumi config set --path cluster.ownerId" in msg
    assert preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas(), eks=eks, cluster_name=NAME, stack_id="acme/eks-ddp/dev",
                           organization="acme").ok
    owned = config(set_path(stack_config("dev"), "eks-ddp:cluster.ownerId", "0123456789abcdef"))
    assert preflight.check(owned, ec2=aws(owned), quotas=StubQuotas(), eks=eks, cluster_name=NAME,
                           stack_id=f"{DIY}/0123456789abcdef", organization="organization").ok


def test_owner_id_is_unique_per_stack_only_with_its_own_id():
    assert preflight_live.owner_id("organization", "eks-ddp", "dev") == DIY
    assert preflight_live.owner_id("organization", "eks-ddp", "dev", "a1") != \
        preflight_live.owner_id("organization", "eks-ddp", "dev", "b2")


def test_a_log_group_another_stack_tagged_fails_preflight(aws):
    """B6 on moto's CloudWatch Logs: the control-plane log group of this cluster name, tagged by another stack."""
    cfg = config(stack_config("dev"))
    logs = boto3.client("logs", region_name=cfg.region)
    me, other = f"{DIY}/aaaaaaaa", f"{DIY}/bbbbbbbb"
    logs.create_log_group(logGroupName=f"/aws/eks/{NAME}/cluster", tags={"eks-ddp/stack": other})
    eks = boto3.client("eks", region_name=cfg.region)
    report = preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas(), eks=eks, cluster_name=NAME, stack_id=me,
                             logs=logs)
    [msg] = report.failures
    assert msg.startswith(f"cluster.name: the log group /aws/eks/{NAME}/cluster belongs to stack '{other}'")
    for owner in (me, DIY):  # its own, or its own from before cluster.ownerId
        logs.tag_resource(resourceArn=logs.describe_log_groups()["logGroups"][0]["arn"].removesuffix(":*"),
                          tags={"eks-ddp/stack": owner})
        assert preflight.check(cfg, ec2=aws(cfg), quotas=StubQuotas(), eks=eks, cluster_name=NAME, stack_id=me,
                               logs=logs).ok


def test_a_cluster_tagged_before_owner_ids_is_a_warning_not_another_owner(aws):
    cfg = config(stack_config("dev"))
    eks = eks_cluster(cfg.region, owner=DIY)
    report = check(cfg, aws(cfg), eks, stack_id=f"{DIY}/0123456789abcdef")
    assert report.ok and any("carries the owner tag 'organization/eks-ddp/dev'" in w for w in report.warnings)
