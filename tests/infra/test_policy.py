"""Security and layout policy over the whole program, for the dev stack and the p4de example stack.

Each test reads the resources the full program registers under mocks (``dev_result``,
``p4de_result``) and fails if a policy is broken anywhere, by any component.
"""

from __future__ import annotations

import json

import pytest

from eks_ddp.infra import kueue
from eks_ddp.tooling.mocks import ProgramResult
from tests.support.util import parent_chain

OPEN = {"0.0.0.0/0", "::/0"}
SG = "aws:ec2/securityGroup:SecurityGroup"
SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
NG = "aws:eks/nodeGroup:NodeGroup"
SUBNET = "aws:ec2/subnet:Subnet"
PG = "aws:ec2/placementGroup:PlacementGroup"
STACKS = ["dev_result", "p4de_result"]


@pytest.fixture(params=STACKS)
def result(request) -> ProgramResult:
    return request.getfixturevalue(request.param)


def _open_ingress(result: ProgramResult) -> list[str]:
    found = []
    for sg in result.of_type(SG):
        for rule in sg.inputs.get("ingress") or []:
            if OPEN & set(rule.get("cidrBlocks") or []) | OPEN & set(rule.get("ipv6CidrBlocks") or []):
                found.append(sg.name)
    for rule in result.of_type(SG_INGRESS):
        if rule.inputs.get("cidrIpv4") in OPEN or rule.inputs.get("cidrIpv6") in OPEN:
            found.append(rule.name)
    for rule in result.of_type(SG_RULE):
        cidrs = set(rule.inputs.get("cidrBlocks") or []) | set(rule.inputs.get("ipv6CidrBlocks") or [])
        if rule.inputs.get("type") == "ingress" and OPEN & cidrs:
            found.append(rule.name)
    return found


def test_no_security_group_admits_the_internet(result):
    assert result.of_type(SG), "expected security groups to check"
    assert _open_ingress(result) == []


def test_open_ingress_detector_catches_each_form():
    from eks_ddp.tooling.mocks import Recorded

    def rec(typ, inputs):
        return Recorded(urn=f"urn:pulumi:s::p::{typ}::x", type=typ, name=typ, custom=True, parent_urn="",
                        inputs=inputs, outputs={})

    for r in (rec(SG, {"ingress": [{"cidrBlocks": ["0.0.0.0/0"]}]}), rec(SG_INGRESS, {"cidrIpv6": "::/0"}),
              rec(SG_RULE, {"type": "ingress", "cidrBlocks": ["0.0.0.0/0"]})):
        assert _open_ingress(ProgramResult(resources=[r], outputs={}, secret_outputs=set())) == [r.name]


def test_api_endpoint_not_public_to_everyone(result):
    eks = result.one("eks:index:Cluster").inputs
    assert eks["publicAccessCidrs"] and not OPEN & set(eks["publicAccessCidrs"])
    assert eks["endpointPrivateAccess"] is True


def test_every_launch_template_requires_imdsv2(result):
    lts = result.of_type(LT)
    assert len(lts) == len(result.of_type(NG)) >= 2  # system group + at least one GPU group, each with its own
    for lt in lts:
        md = lt.inputs["metadataOptions"]
        assert md["httpTokens"] == "required", lt.name
        assert 1 <= int(md["httpPutResponseHopLimit"]) <= 2, lt.name
        for bdm in lt.inputs.get("blockDeviceMappings", []):
            assert bdm["ebs"]["encrypted"] == "true", lt.name


def test_every_node_group_uses_only_private_subnets_and_its_own_template(result):
    subnets = result.of_type(SUBNET)
    private = {s.outputs["id"] for s in subnets if "kubernetes.io/role/internal-elb" in s.inputs["tags"]}
    public = {s.outputs["id"] for s in subnets if "kubernetes.io/role/elb" in s.inputs["tags"]}
    assert private and public and not private & public
    lt_ids = {lt.outputs["id"] for lt in result.of_type(LT)}
    for ng in result.of_type(NG):
        ids = set(ng.inputs["subnetIds"])
        assert ids and ids <= private, ng.name
        assert ng.inputs["launchTemplate"]["id"] in lt_ids, ng.name


def test_gpu_groups_tainted_and_desired_size_left_alone(result):
    gpu = [ng for ng in result.of_type(NG) if ng.inputs["labels"].get("eks-ddp/pool") == "gpu"]
    assert gpu
    for ng in gpu:
        assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"} in ng.inputs["taints"]
        assert ng.inputs["amiType"] == "AL2023_x86_64_NVIDIA"
        assert "scalingConfig.desiredSize" in ng.ignore_changes


def test_efs_and_kubernetes_secrets_encrypted(result):
    fs = result.one("aws:efs/fileSystem:FileSystem").inputs
    assert fs["encrypted"] is True and fs["kmsKeyId"]
    keys = {k.outputs["arn"]: k for k in result.of_type("aws:kms/key:Key")}
    eks_key = keys[result.one("eks:index:Cluster").inputs["encryptionConfigKeyArn"]]
    assert eks_key.inputs["enableKeyRotation"] is True
    assert keys[fs["kmsKeyId"]].inputs["enableKeyRotation"] is True


def test_node_role_cannot_pull_from_every_repository(result):
    role_arn = next(r.outputs["arn"] for r in result.of_type("aws:iam/role:Role")
                    if "ec2.amazonaws.com" in r.inputs["assumeRolePolicy"])
    role_name = next(r.outputs["name"] for r in result.of_type("aws:iam/role:Role") if r.outputs["arn"] == role_arn)
    attached = [a.inputs["policyArn"] for a in result.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if a.inputs["role"] == role_name]
    assert "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy" in attached
    assert not any(a.endswith("/AmazonEC2ContainerRegistryReadOnly") for a in attached)
    for pol in result.of_type("aws:iam/rolePolicy:RolePolicy"):
        for stmt in json.loads(pol.inputs["policy"])["Statement"]:
            if "ecr:BatchGetImage" in stmt["Action"]:
                assert stmt["Resource"] != "*" and "*" not in stmt["Resource"], pol.name


def test_kubeconfig_output_is_secret(result):
    assert "kubeconfig" in result.secret_outputs
    for key in ("clusterName", "nodeGroupNames", "efsId", "pvcName", "kubectl"):
        assert result.outputs.get(key), key
    others = json.dumps({k: v for k, v in result.outputs.items() if k != "kubeconfig"})
    assert "certificate-authority-data" not in others and "get-token" not in others


def test_every_resource_sits_under_a_component(result):
    top_level = []
    for r in result.resources:
        if r.type.startswith("pulumi:providers:") or r.type.startswith("eks-ddp:"):
            continue
        # The namespace is shared by every workload and created by the program itself, as are the Pod Security
        # labels it patches onto the namespaces the cluster creates.
        if r.type in ("kubernetes:core/v1:Namespace", "kubernetes:core/v1:NamespacePatch"):
            continue
        chain = parent_chain(result, r.urn)
        if not chain or not chain[0].startswith(("eks-ddp:", "eks:index:")):
            top_level.append(r.urn)
        assert r.parent_type == (chain[0] if chain else ""), r.urn
    assert top_level == []


def test_infrastructure_children_name_their_component(result):
    expect = {
        SUBNET: "eks-ddp:network:Network",
        "aws:ec2/natGateway:NatGateway": "eks-ddp:network:Network",
        "eks:index:Cluster": "eks-ddp:cluster:EksCluster",
        "aws:efs/fileSystem:FileSystem": "eks-ddp:efs:EfsStore",
        "aws:efs/mountTarget:MountTarget": "eks-ddp:efs:EfsStore",
    }
    for typ, parent in expect.items():
        found = result.of_type(typ)
        assert found, typ
        assert all(r.parent_type == parent for r in found), typ
    releases = result.of_type("kubernetes:helm.sh/v3:Release")
    owner = {"cluster-autoscaler": "eks-ddp:autoscaler:ClusterAutoscaler",
             "dcgm-exporter": "eks-ddp:observability:Observability", kueue.CHART: "eks-ddp:kueue:Kueue"}
    assert releases and all(r.parent_type == owner.get(r.inputs["chart"], "eks-ddp:addons:ClusterAddons")
                            for r in releases)
    for ng in result.of_type(NG):
        assert ng.parent_type in ("eks-ddp:cluster:EksCluster", "eks-ddp:gpu_nodegroup:GpuNodeGroup")


# --- stack specifics -------------------------------------------------------------------------------

def _gpu_template(result: ProgramResult, group: str):
    ng = next(n for n in result.of_type(NG) if n.inputs["labels"].get("eks-ddp/node-group") == group)
    lt = next(t for t in result.of_type(LT) if t.outputs["id"] == ng.inputs["launchTemplate"]["id"])
    return ng, lt


def test_p4de_group_has_4_efa_interfaces_the_reservations_placement_and_one_zone(p4de_result):
    ng, lt = _gpu_template(p4de_result, "a100")
    nics = lt.inputs["networkInterfaces"]
    assert len(nics) == 4 and all(n["interfaceType"] == "efa" for n in nics)
    assert [int(n["networkCardIndex"]) for n in nics] == [0, 1, 2, 3]
    # The group launches into its reservation: no new placement group (it could never be the reservation's).
    assert not p4de_result.of_type(PG)
    assert "groupName" not in lt.inputs["placement"]
    assert ng.inputs["updateConfig"]["updateStrategy"] == "MINIMAL"
    assert lt.inputs["placement"]["availabilityZone"] == "us-east-1a"
    assert len(ng.inputs["subnetIds"]) == 1
    zone = next(s.inputs["availabilityZone"] for s in p4de_result.of_type(SUBNET)
                if s.outputs["id"] == ng.inputs["subnetIds"][0])
    assert zone == "us-east-1a"
    assert lt.inputs["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"] \
        == "cr-0123456789abcdef0"
    releases = {r.inputs["chart"] for r in p4de_result.of_type("kubernetes:helm.sh/v3:Release")}
    assert releases == {"nvidia-device-plugin", "aws-efa-k8s-device-plugin", "cluster-autoscaler", "dcgm-exporter",
                        kueue.CHART}


def test_dev_g4dn_group_has_no_efa_and_spans_zones(dev_result):
    ng, lt = _gpu_template(dev_result, "gpu")
    assert ng.inputs["instanceTypes"] == ["g4dn.xlarge"]
    assert "networkInterfaces" not in lt.inputs
    assert not dev_result.of_type(PG)
    assert len(ng.inputs["subnetIds"]) == 2
    releases = {r.inputs["chart"] for r in dev_result.of_type("kubernetes:helm.sh/v3:Release")}
    assert "aws-efa-k8s-device-plugin" not in releases


@pytest.mark.parametrize("region,part", [("us-gov-west-1", "aws-us-gov"), ("cn-north-1", "aws-cn")])
def test_arns_follow_partition(region, part):
    """A7: in aws-cn and aws-us-gov, every AWS-managed policy ARN, access policy ARN and the S3 endpoint's service
    name are the region's partition's (arn:aws: there fails, and the node role would get no worker policy)."""
    from tests.support.util import run, set_path, stack_config

    raw = set_path(stack_config("dev"), "aws:region", region)
    raw = set_path(raw, "eks-ddp:cluster.adminPrincipalArns", [f"arn:{part}:iam::123456789012:role/ci"])
    result = run(raw)
    arns = [a.inputs["policyArn"] for a in result.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")]
    assert arns and all(a.startswith(f"arn:{part}:iam::aws:policy/") for a in arns), arns
    entries = json.dumps(result.one("eks:index:Cluster").inputs.get("accessEntries", {}))
    assert f"arn:{part}:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy" in entries
    assert '"arn:aws:' not in entries
    [endpoint] = result.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    prefix = "cn.com.amazonaws" if part == "aws-cn" else "com.amazonaws"
    assert endpoint.inputs["serviceName"] == f"{prefix}.{region}.s3"
    # Policies whose ARNs the program builds (others carry ARNs of resources, which AWS returns in the partition).
    built = [p for p in result.of_type("aws:iam/rolePolicy:RolePolicy")
             if p.name.endswith(("node-addon-images", "autoscaler-policy", "efs-csi"))]
    assert len(built) == 3
    for p in built:
        assert "arn:aws:" not in p.inputs["policy"] and f"arn:{part}:" in p.inputs["policy"], (p.name, p.inputs)
    # B11: S3 calls KMS as s3.<region>.<the partition's DNS suffix>; EKS wants ec2.amazonaws.com.cn in China.
    from eks_ddp.tooling.contracts import check

    assert [str(v) for v in check(result, only=("s3",))] == []
    principal = "ec2.amazonaws.com.cn" if part == "aws-cn" else "ec2.amazonaws.com"
    assert json.loads(result.one("aws:iam/role:Role", "cluster-node").inputs["assumeRolePolicy"])[
        "Statement"][0]["Principal"] == {"Service": principal}
