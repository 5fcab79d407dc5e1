"""EfsStore under mocks: encryption, NFS access, mount targets, IRSA, StorageClass and claim, retention."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pulumi_kubernetes as k8s
import pytest

from components import efs as efs_mod
from components.efs import EfsStore, EfsStoreArgs
from components.mocks import run_program

ISSUER = "oidc.eks.us-west-2.amazonaws.com/id/ABCDEF"
ARGS = EfsStoreArgs(
    cluster_name="eks-ddp-test",
    vpc_id="vpc-123",
    subnet_ids=["subnet-a", "subnet-b", "subnet-c"],
    node_security_group_id="sg-node",
    oidc_provider_arn=f"arn:aws:iam::123456789012:oidc-provider/{ISSUER}",
    oidc_provider_url=f"https://{ISSUER}",
    namespace="training",
)
PARENT = "eks-ddp:efs:EfsStore"


def _run(args: EfsStoreArgs = ARGS):
    def program():
        provider = k8s.Provider("k8s", kubeconfig="{}")
        s = EfsStore("storage", args, opts=pulumi.ResourceOptions(providers={"kubernetes": provider}))
        pulumi.export("fs", s.file_system_id)
        pulumi.export("pvc", s.pvc_name)
        pulumi.export("sc", s.storage_class_name)

    return run_program({}, program=program)


@pytest.fixture(scope="module")
def result():
    return _run()


def test_file_system_encrypted_with_own_rotating_key_elastic_throughput(result):
    fs = result.one("aws:efs/fileSystem:FileSystem").inputs
    key = result.one("aws:kms/key:Key")
    assert fs["encrypted"] is True
    assert fs["kmsKeyId"] == key.outputs["arn"]
    assert key.inputs["enableKeyRotation"] is True
    assert fs["throughputMode"] == "elastic"


def test_one_mount_target_per_private_subnet_behind_the_nfs_group(result):
    mts = result.of_type("aws:efs/mountTarget:MountTarget")
    assert sorted(m.inputs["subnetId"] for m in mts) == ["subnet-a", "subnet-b", "subnet-c"]
    sg = result.one("aws:ec2/securityGroup:SecurityGroup").outputs["id"]
    assert all(m.inputs["securityGroups"] == [sg] for m in mts)


def test_nfs_open_only_to_the_node_security_group(result):
    rule = result.one("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule").inputs
    assert rule["referencedSecurityGroupId"] == "sg-node"
    assert (rule["ipProtocol"], int(rule["fromPort"]), int(rule["toPort"])) == ("tcp", 2049, 2049)
    assert "cidrIpv4" not in rule and "cidrIpv6" not in rule
    assert not result.one("aws:ec2/securityGroup:SecurityGroup").inputs.get("ingress")


def test_csi_driver_addon_pinned_with_irsa_role_for_the_controller_only(result):
    addon = result.one("aws:eks/addon:Addon").inputs
    assert addon["addonName"] == "aws-efs-csi-driver"
    # The default version 1.35 has no confirmed pin: EKS's default build for 1.35 (M12).
    assert addon["addonVersion"] == "v0.0.0-eksbuild.default-1.35"
    role = result.one("aws:iam/role:Role")
    assert addon["serviceAccountRoleArn"] == role.outputs["arn"]
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert len(trust) == 1
    assert trust[0]["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert trust[0]["Principal"] == {"Federated": ARGS.oidc_provider_arn}
    assert trust[0]["Condition"] == {"StringEquals": {
        f"{ISSUER}:sub": "system:serviceaccount:kube-system:efs-csi-controller-sa",
        f"{ISSUER}:aud": "sts.amazonaws.com"}}
    assert result.one("aws:iam/rolePolicy:RolePolicy").inputs["role"] == role.outputs["id"]


def test_storage_class_access_points_for_the_non_root_trainer_retained(result):
    sc = result.one("kubernetes:storage.k8s.io/v1:StorageClass").inputs
    fs_id = result.one("aws:efs/fileSystem:FileSystem").outputs["id"]
    assert sc["provisioner"] == "efs.csi.aws.com"
    assert sc["reclaimPolicy"] == "Retain"
    params = sc["parameters"]
    assert params["provisioningMode"] == "efs-ap"
    assert params["fileSystemId"] == fs_id
    assert (params["directoryPerms"], params["uid"], params["gid"]) == ("700", "1000", "1000")


def test_claim_is_read_write_many_in_the_training_namespace(result):
    pvc = result.one("kubernetes:core/v1:PersistentVolumeClaim").inputs
    assert pvc["metadata"] == {"name": "shared", "namespace": "training", "labels": {"app.kubernetes.io/part-of": "eks-ddp"}}
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == efs_mod.STORAGE_CLASS_NAME
    assert result.outputs == {"fs": result.one("aws:efs/fileSystem:FileSystem").outputs["id"], "pvc": "shared",
                              "sc": efs_mod.STORAGE_CLASS_NAME}


def test_file_system_and_key_retained_on_destroy_by_default(result):
    assert result.one("aws:efs/fileSystem:FileSystem").retain_on_delete is True
    assert result.one("aws:kms/key:Key").retain_on_delete is True
    assert all(not m.retain_on_delete for m in result.of_type("aws:efs/mountTarget:MountTarget"))


def test_retain_can_be_turned_off():
    result = _run(dataclasses.replace(ARGS, retain_on_destroy=False))
    assert result.one("aws:efs/fileSystem:FileSystem").retain_on_delete is False


def test_every_child_has_the_store_as_parent(result):
    for r in result.resources:
        if r.type not in (PARENT, "pulumi:providers:kubernetes"):
            assert r.parent_type == PARENT, r.urn


@pytest.mark.parametrize("change,field", [({"subnet_ids": []}, "subnet_ids"), ({"claim_name": ""}, "claim_name"),
                                          ({"file_system_id": "vol-1"}, "file_system_id")])
def test_validation_names_the_field(change, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        _run(dataclasses.replace(ARGS, **change))


# --- review M7: one mount target per zone, also for a brought VPC ----------------------------------------

def test_brought_vpc_with_two_private_subnets_in_one_zone_gets_one_mount_target_per_zone():
    from components.mocks import RecordingMocks
    from tests.util import set_path, stack_config

    mocks = RecordingMocks(zones=2)  # the mock hands out zones in turn: subnet-c shares subnet-a's zone
    config = set_path(stack_config("dev"), "eks-ddp:network", {
        "vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-a", "subnet-b", "subnet-c"]})
    result = run_program(config, mocks=mocks)
    mts = result.of_type("aws:efs/mountTarget:MountTarget")
    # EFS refuses a second mount target in a zone (MountTargetConflict).
    assert sorted(m.inputs["subnetId"] for m in mts) == ["subnet-a", "subnet-b"]


# --- review M11 + B12: a kept file system is re-attached at stable paths -----------------------------------

def test_existing_file_system_is_used_and_never_created_or_owned():
    result = _run(dataclasses.replace(ARGS, file_system_id="fs-0123456789abcdef0"))
    assert result.of_type("aws:efs/fileSystem:FileSystem") == [] and result.of_type("aws:kms/key:Key") == []
    assert {m.inputs["fileSystemId"] for m in result.of_type("aws:efs/mountTarget:MountTarget")} == {
        "fs-0123456789abcdef0"}
    sc = result.one("kubernetes:storage.k8s.io/v1:StorageClass").inputs
    assert sc["parameters"]["fileSystemId"] == "fs-0123456789abcdef0"
    assert result.outputs["fs"] == "fs-0123456789abcdef0"


def test_access_point_directory_is_stable_per_claim():
    params = _run().one("kubernetes:storage.k8s.io/v1:StorageClass").inputs["parameters"]
    # /eks-ddp/<namespace>/<claim>: the same directory for a re-created claim or a new stack on a kept file
    # system, instead of the driver's default <pv-name>-<unique id>.
    assert params["subPathPattern"] == "${.PVC.namespace}/${.PVC.name}"
    assert params["ensureUniqueDirectory"] == "false"


def test_file_system_id_is_a_config_key():
    from tests.util import run, set_path, stack_config

    result = run(set_path(stack_config("dev"), "eks-ddp:storage.fileSystemId", "fs-0123456789abcdef0"))
    assert result.of_type("aws:efs/fileSystem:FileSystem") == []
    assert result.outputs["efsId"] == "fs-0123456789abcdef0"


def test_csi_role_scoped_to_file_system(result):
    """A13 (in part): no AWS-managed AmazonEFSCSIDriverPolicy, which may create access points on every file system
    in the account; an inline policy creates them only on this file system. Delete keeps the managed policy's
    driver-tag condition (the add-on cannot set a cluster tag, see components/efs.py); the add-on configuration
    stays within its schema (no controller.tags)."""
    assert result.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") == []
    fs_id = result.one("aws:efs/fileSystem:FileSystem").outputs["id"]
    policy = json.loads(result.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    by_action = {a: s for s in policy["Statement"] for a in s["Action"]}
    assert by_action["elasticfilesystem:CreateAccessPoint"]["Resource"] == \
        f"arn:aws:elasticfilesystem:us-west-2:123456789012:file-system/{fs_id}"
    for s in policy["Statement"]:  # every write is conditioned
        if s["Sid"] != "Describe":
            assert s["Condition"], s
    assert not any(a.startswith("elasticfilesystem:") and a.split(":")[1].startswith(("Create", "Delete", "Put"))
                   and s["Resource"] == "*" and not s.get("Condition") for a, s in by_action.items())
    config = json.loads(result.one("aws:eks/addon:Addon").inputs["configurationValues"])
    assert config == {"node": {"tolerations": [{"operator": "Exists"}]}}
