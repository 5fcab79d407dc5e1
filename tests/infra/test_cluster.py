"""EksCluster under mocks: control-plane settings, node role, security groups, system node group."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pytest

from eks_ddp.infra import cluster as cluster_mod
from eks_ddp.infra.cluster import EksCluster, EksClusterArgs, validate
from eks_ddp.tooling.mocks import RecordingMocks, run_program

ARGS = EksClusterArgs(
    cluster_name="eks-ddp-test",
    vpc_id="vpc-123",
    public_subnet_ids=["subnet-p1", "subnet-p2"],
    private_subnet_ids=["subnet-a", "subnet-b"],
    public_access_cidrs=["1.2.3.4/32"],
    kubernetes_version="1.35",
    system_instance_type="t3.large",
    system_node_count=2,
    log_retention_days=30,
)
PARENT = "eks-ddp:cluster:EksCluster"


def _run(args: EksClusterArgs = ARGS, region: str = "us-west-2", mocks: RecordingMocks | None = None):
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

    return run_program({}, program=program, region=region, mocks=mocks), holder["c"]


@pytest.fixture(scope="module")
def result():
    return _run()[0]


def test_control_plane_is_private_encrypted_logged_and_pinned(result):
    eks = result.one("eks:index:Cluster").inputs
    assert eks["skipDefaultNodeGroup"] is True
    assert eks["skipDefaultSecurityGroups"] is True
    assert eks["authenticationMode"] == "API"
    assert eks["createOidcProvider"] is True
    assert eks["version"] == "1.35"
    assert eks["name"] == "eks-ddp-test"
    assert eks["endpointPrivateAccess"] is True
    assert eks["publicAccessCidrs"] == ["1.2.3.4/32"]
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


def test_log_group_survives_destroy_and_is_adopted_on_the_next_up(result):
    # EKS re-creates the group while a deleted control plane flushes logs; a re-up that creates it again
    # fails with ResourceAlreadyExists (review M5). So: never deleted, and adopted when it exists.
    lg = result.one("aws:cloudwatch/logGroup:LogGroup")
    assert lg.inputs["skipDestroy"] is True
    assert lg.import_id == "", "a fresh account has no group to adopt"
    mocks = RecordingMocks()
    mocks.log_groups = ["/aws/eks/eks-ddp-test/cluster", "/aws/eks/eks-ddp-test/cluster-other"]
    again, _ = _run(mocks=mocks)
    lg = again.one("aws:cloudwatch/logGroup:LogGroup")
    assert lg.import_id == "/aws/eks/eks-ddp-test/cluster"
    assert lg.inputs["skipDestroy"] is True
    (call,) = [a for t, a in again.calls if t == "aws:cloudwatch/getLogGroups:getLogGroups"]
    assert call["logGroupNamePrefix"] == "/aws/eks/eks-ddp-test/cluster"
    # Only an exact name match is adopted, not another group sharing the prefix.
    mocks = RecordingMocks()
    mocks.log_groups = ["/aws/eks/eks-ddp-test/cluster-other"]
    assert _run(mocks=mocks)[0].one("aws:cloudwatch/logGroup:LogGroup").import_id == ""


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


def test_registries_of_the_newer_regions():
    """Review m4: without these, add-on image pulls are AccessDenied and nodes never become Ready."""
    assert cluster_mod.addon_registry_account("ap-east-2") == "533267051163"
    assert cluster_mod.addon_registry_account("ap-southeast-6") == "333609536671"


def test_no_hand_made_access_entry_for_managed_node_groups(result):
    """Review m5: EKS creates the node role's EC2_LINUX entry for every managed node group and owns it."""
    assert result.of_type("aws:eks/accessEntry:AccessEntry") == []
    ng = result.one("aws:eks/nodeGroup:NodeGroup")
    assert ng.inputs["nodeRoleArn"] == result.one("aws:iam/role:Role").outputs["arn"]


def test_coredns_is_a_managed_addon_created_after_the_system_nodes(result):
    """Review m7: pulumi_eks leaves CoreDNS unmanaged without a default node group."""
    [addon] = [a for a in result.of_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "coredns"]
    assert addon.inputs["resolveConflictsOnCreate"] == "OVERWRITE"
    assert addon.inputs["addonVersion"] == f"v0.0.0-eksbuild.default-{ARGS.kubernetes_version}"
    assert result.one("aws:eks/nodeGroup:NodeGroup").urn in addon.dependencies


def test_admin_principals_get_cluster_admin_access_entries():
    """Review m8: besides the creator, named roles (a teammate, CI) can use the cluster."""
    arn = "arn:aws:iam::123456789012:role/ci-deployer"
    result, _ = _run(dataclasses.replace(ARGS, admin_principal_arns=[arn]))
    entries = result.one("eks:index:Cluster").inputs["accessEntries"]
    assert entries == {"admin-0": {"principalArn": arn, "accessPolicies": {"cluster-admin": {
        "policyArn": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy",
        "accessScope": {"type": "cluster"}}}}}


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


def _provider_kubeconfig(result) -> dict:
    kubeconfig = result.one("pulumi:providers:kubernetes", "k8s").inputs["kubeconfig"]
    if isinstance(kubeconfig, dict) and "value" in kubeconfig and "users" not in kubeconfig:
        kubeconfig = kubeconfig["value"]  # the secret envelope
    return json.loads(kubeconfig) if isinstance(kubeconfig, str) else kubeconfig


def test_kubernetes_provider_authenticates_with_the_stacks_aws_profile():
    # Review M8: pulumi-eks's kubeconfig output has no profile, so `aws eks get-token` used the default
    # credential chain instead of the stack's aws:profile: Unauthorized on every Kubernetes resource.
    from tests.support.util import stack_config

    raw = {**stack_config("dev"), "aws:profile": "training-admin"}
    result = run_program(raw)
    user = _provider_kubeconfig(result)["users"][0]["user"]["exec"]
    assert {"name": "AWS_PROFILE", "value": "training-admin"} in user.get("env", [])
    assert "kubeconfig" in result.secret_outputs


def test_without_a_profile_the_default_credential_chain_is_used(dev_result):
    user = _provider_kubeconfig(dev_result)["users"][0]["user"]["exec"]
    assert not any(e["name"] == "AWS_PROFILE" for e in user.get("env") or [])


def test_system_group_desired_size_not_ignored(result):
    """min == max == desired and nothing else resizes the system group: a resize (systemNodeCount 1 -> 2) must send
    the new desired size, not the one in state, which EKS refuses ("Minimum capacity 2 can't be greater than desired
    size 1"). Review 2026-11-24, A2."""
    ng = result.one("aws:eks/nodeGroup:NodeGroup")
    assert not any("desiredSize" in path for path in ng.ignore_changes), ng.ignore_changes
    s = ng.inputs["scalingConfig"]
    assert int(s["minSize"]) == int(s["desiredSize"]) == int(s["maxSize"]) == 2


def test_system_group_follows_the_cluster_version_and_its_update_is_not_blocked_by_the_etcd_pdb(result):
    """A3/A4: the nodes move with the control plane; the drain may evict the single etcd member (soft state)."""
    ng = result.one("aws:eks/nodeGroup:NodeGroup").inputs
    assert ng["version"] == ARGS.kubernetes_version
    assert ng["forceUpdateVersion"] is True


# --- B6: an owner unique per stack; never adopt another stack's log group -------------------------------------

LOG = "/aws/eks/eks-ddp-test/cluster"
ME = "organization/eks-ddp/dev/0123456789abcdef"


def _with_log_group(tags: dict[str, str]) -> RecordingMocks:
    mocks = RecordingMocks()
    mocks.log_groups = [LOG]
    mocks.log_group_tags = {LOG: tags}
    return mocks


def test_a_log_group_another_stack_tagged_is_never_adopted():
    """B6: two teams' `dev` stacks on self-managed backends: the second must not import (and retag) the first's
    log group. Its owner tag names the other stack: construction fails naming both owners and the key."""
    args = dataclasses.replace(ARGS, stack_id=ME)
    other = "organization/eks-ddp/dev/fedcba9876543210"
    with pytest.raises(ValueError, match=f"^cluster_name: the log group {LOG} belongs to stack '{other}', not to "
                                         f"this stack \\({ME}\\).*cluster.name"):
        _run(args, mocks=_with_log_group({"eks-ddp/stack": other}))
    # Its own group, one tagged before cluster.ownerId, and an untagged one (EKS re-creates it without tags
    # while a deleted control plane flushes) are adopted; the group carries the owner tag from now on.
    for tags in ({"eks-ddp/stack": ME}, {"eks-ddp/stack": "organization/eks-ddp/dev"}, {}):
        lg = _run(args, mocks=_with_log_group(tags))[0].one("aws:cloudwatch/logGroup:LogGroup")
        assert lg.import_id == LOG, tags
        assert lg.inputs["tags"]["eks-ddp/stack"] == ME


def test_viewer_principals_get_view_only_access_entries():
    admin, viewer = "arn:aws:iam::123456789012:role/ci-deployer", "arn:aws:iam::123456789012:role/ml-team"
    result, _ = _run(dataclasses.replace(ARGS, admin_principal_arns=[admin], viewer_principal_arns=[viewer]))
    entries = result.one("eks:index:Cluster").inputs["accessEntries"]
    assert entries["viewer-0"] == {"principalArn": viewer, "accessPolicies": {"view": {
        "policyArn": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy", "accessScope": {"type": "cluster"}}}}
    assert entries["admin-0"]["principalArn"] == admin
    # EKS takes one access entry per principal: the same ARN in both lists is refused before any call.
    with pytest.raises(ValueError, match=r"viewer_principal_arns\[0\]: got .*ci-deployer' a second time"):
        validate(dataclasses.replace(ARGS, admin_principal_arns=[admin], viewer_principal_arns=[admin]))
    with pytest.raises(ValueError, match=r"viewer_principal_arns\[0\]: got 'bob'; expected an IAM role or user ARN"):
        validate(dataclasses.replace(ARGS, viewer_principal_arns=["bob"]))
