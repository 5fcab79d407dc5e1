"""EksCluster under mocks: control-plane settings, node role, security groups, system node group."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pytest

from components import cluster as cluster_mod
from components.cluster import EksCluster, EksClusterArgs
from components.mocks import run_program

ARGS = EksClusterArgs(
    cluster_name="eks-ddp-test",
    vpc_id="vpc-123",
    public_subnet_ids=["subnet-p1", "subnet-p2"],
    private_subnet_ids=["subnet-a", "subnet-b"],
    public_access_cidrs=["203.0.113.10/32"],
    kubernetes_version="1.33",
    system_instance_type="t3.large",
    system_node_count=2,
    log_retention_days=30,
)
PARENT = "eks-ddp:cluster:EksCluster"


def _run(args: EksClusterArgs = ARGS, region: str = "us-west-2"):
    holder = {}

    def program():
        c = EksCluster("cluster", args)
        holder["c"] = c
        pulumi.export("kubeconfig", c.kubeconfig)
        pulumi.export("clusterName", c.cluster_name)
        pulumi.export("nodeRoleName", c.node_role_name)
        pulumi.export("nodeSg", c.node_security_group_id)
        pulumi.export("clusterSg", c.cluster_security_group_id)
        pulumi.export("oidcArn", c.oidc_provider_arn)

    return run_program({}, program=program, region=region), holder["c"]


@pytest.fixture(scope="module")
def result():
    return _run()[0]


def test_control_plane_is_private_encrypted_logged_and_pinned(result):
    eks = result.one("eks:index:Cluster").inputs
    assert eks["skipDefaultNodeGroup"] is True
    assert eks["skipDefaultSecurityGroups"] is True
    assert eks["authenticationMode"] == "API"
    assert eks["createOidcProvider"] is True
    assert eks["version"] == "1.33"
    assert eks["name"] == "eks-ddp-test"
    assert eks["endpointPrivateAccess"] is True
    assert eks["publicAccessCidrs"] == ["203.0.113.10/32"]
    assert sorted(eks["enabledClusterLogTypes"]) == sorted(cluster_mod.LOG_TYPES)
    assert eks["privateSubnetIds"] == ["subnet-a", "subnet-b"]
    key = result.one("aws:kms/key:Key")
    assert key.inputs["enableKeyRotation"] is True
    assert eks["encryptionConfigKeyArn"] == key.outputs["arn"]


def test_vpc_cni_enforces_network_policies(result):
    # NetworkPolicies (etcd, trainers) are only enforced when the VPC CNI's policy agent is on.
    assert result.one("eks:index:Cluster").inputs["vpcCniOptions"]["enableNetworkPolicy"] is True


def test_log_group_sets_retention_before_eks_creates_it(result):
    lg = result.one("aws:cloudwatch/logGroup:LogGroup").inputs
    assert lg["name"] == "/aws/eks/eks-ddp-test/cluster"
    assert lg["retentionInDays"] == 30


def test_node_role_has_worker_and_cni_policies_but_not_registry_wide_read(result):
    arns = sorted(a.inputs["policyArn"] for a in result.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment"))
    assert arns == ["arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy", "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy"]
    assert not any("AmazonEC2ContainerRegistryReadOnly" in a for a in arns)
    assert not any("AmazonSSMManagedInstanceCore" in a for a in arns)
    trust = json.loads(result.one("aws:iam/role:Role").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}


def test_inline_pull_policy_only_covers_the_eks_addon_registry(result):
    doc = json.loads(result.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    by_sid = {s["Sid"]: s for s in doc["Statement"]}
    assert by_sid["EcrLogin"]["Action"] == ["ecr:GetAuthorizationToken"]
    assert by_sid["EcrLogin"]["Resource"] == "*"
    pull = by_sid["PullEksAddonImages"]
    assert sorted(pull["Action"]) == ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage",
                                      "ecr:GetDownloadUrlForLayer"]
    assert "arn:aws:ecr:us-west-2:602401143452:repository/*" in pull["Resource"]
    for arn in pull["Resource"]:
        assert arn.startswith("arn:aws:ecr:") and ":602401143452:repository/" in arn
    for stmt in doc["Statement"]:
        assert stmt["Effect"] == "Allow"
        assert all(a.startswith("ecr:") for a in stmt["Action"])


def test_registry_account_follows_the_region():
    assert cluster_mod.addon_registry_account("us-east-1") == "602401143452"
    assert cluster_mod.addon_registry_account("af-south-1") == "877085696533"
    doc = cluster_mod.node_image_pull_policy("eu-south-1")
    assert "arn:aws:ecr:eu-south-1:590381155156:repository/*" in doc["Statement"][1]["Resource"]


def test_node_role_gets_an_ec2_linux_access_entry(result):
    entry = result.one("aws:eks/accessEntry:AccessEntry").inputs
    assert entry["type"] == "EC2_LINUX"
    role = result.one("aws:iam/role:Role")
    assert entry["principalArn"] == role.outputs["arn"]
    assert entry["clusterName"] == "eks-ddp-test"


def test_node_security_group_admits_only_itself(result):
    sg = result.one("aws:ec2/securityGroup:SecurityGroup")
    assert not sg.inputs.get("ingress")
    ingress = result.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert len(ingress) == 1
    assert ingress[0].inputs["referencedSecurityGroupId"] == sg.outputs["id"]
    assert "cidrIpv4" not in ingress[0].inputs and "cidrIpv6" not in ingress[0].inputs


def test_system_node_group_is_private_imdsv2_and_labelled(result):
    ng = result.one("aws:eks/nodeGroup:NodeGroup").inputs
    assert ng["amiType"] == "AL2023_x86_64_STANDARD"
    assert ng["subnetIds"] == ["subnet-a", "subnet-b"]
    assert ng["instanceTypes"] == ["t3.large"]
    assert ng["labels"] == {"eks-ddp/pool": "system"}
    assert int(ng["scalingConfig"]["desiredSize"]) == 2
    lt = result.one("aws:ec2/launchTemplate:LaunchTemplate").inputs
    assert lt["metadataOptions"]["httpTokens"] == "required"
    assert int(lt["metadataOptions"]["httpPutResponseHopLimit"]) == 1
    ebs = lt["blockDeviceMappings"][0]["ebs"]
    assert ebs["encrypted"] == "true" and ebs["volumeType"] == "gp3"
    sg = result.one("aws:ec2/securityGroup:SecurityGroup").outputs["id"]
    eks = result.one("eks:index:Cluster").outputs
    assert sorted(lt["vpcSecurityGroupIds"]) == sorted([sg, eks["clusterSecurityGroupId"]])


def test_outputs_kubeconfig_secret_and_ids_exposed(result):
    assert "kubeconfig" in result.secret_outputs
    assert json.loads(result.outputs["kubeconfig"])["kind"] == "Config"
    assert result.outputs["clusterName"] == "eks-ddp-test"
    assert result.outputs["nodeSg"].startswith("sg-")
    assert result.outputs["clusterSg"].startswith("sg-")
    assert result.outputs["oidcArn"].startswith("arn:aws:iam::")


def test_system_node_labels_is_a_plain_dict():
    _, c = _run()
    assert c.system_node_labels == {"eks-ddp/pool": "system"}


def test_every_child_has_the_cluster_as_parent(result):
    for r in result.resources:
        if r.type != PARENT:
            assert r.parent_type == PARENT, r.urn


@pytest.mark.parametrize("change,field", [
    ({"public_access_cidrs": []}, "public_access_cidrs"),
    ({"public_access_cidrs": ["nope"]}, r"public_access_cidrs\[0\]"),
    ({"private_subnet_ids": ["subnet-a"]}, "private_subnet_ids"),
    ({"system_node_count": 0}, "system_node_count"),
    ({"log_retention_days": 31}, "log_retention_days"),
    ({"cluster_name": ""}, "cluster_name"),
])
def test_validation_names_the_field(change, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        _run(dataclasses.replace(ARGS, **change))
