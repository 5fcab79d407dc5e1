"""EfsStore under mocks: encryption, NFS access, mount targets, IRSA, access points, claims, policy, retention."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pulumi_kubernetes as k8s
import pytest

from eks_ddp.infra.efs import EfsLifecycle, EfsStore, EfsStoreArgs
from eks_ddp.tooling.mocks import run_program

ISSUER = "oidc.eks.us-west-2.amazonaws.com/id/ABCDEF"
ARGS = EfsStoreArgs(
    cluster_name="eks-ddp-test",
    vpc_id="vpc-123",
    subnet_ids=["subnet-a", "subnet-b", "subnet-c"],
    node_security_group_id="sg-node",
    oidc_provider_arn=f"arn:aws:iam::123456789012:oidc-provider/{ISSUER}",
    oidc_provider_url=f"https://{ISSUER}",
    namespace="training",
    run_id="run-7",
)
PARENT = "eks-ddp:efs:EfsStore"


def _run(args: EfsStoreArgs = ARGS):
    def program():
        provider = k8s.Provider("k8s", kubeconfig="{}")
        s = EfsStore("storage", args, opts=pulumi.ResourceOptions(providers={"kubernetes": provider}))
        pulumi.export("fs", s.file_system_id)
        pulumi.export("data", s.data_claim_name)
        pulumi.export("run", s.run_claim_name)

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


def test_csi_driver_addon_pinned_with_irsa_role_for_its_two_service_accounts_only(result):
    """The add-on's role annotates the controller's and the node plugin's service accounts (the node plugin mounts
    with ``iam``): the trust names exactly those two."""
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
        f"{ISSUER}:sub": ["system:serviceaccount:kube-system:efs-csi-controller-sa",
                          "system:serviceaccount:kube-system:efs-csi-node-sa"],
        f"{ISSUER}:aud": "sts.amazonaws.com"}}
    assert {p.inputs["role"] for p in result.of_type("aws:iam/rolePolicy:RolePolicy")} == {role.outputs["id"]}


def _access_points(result) -> dict[str, dict]:
    return {r.name.rsplit("-", 1)[-1]: r for r in result.of_type("aws:efs/accessPoint:AccessPoint")}


def test_one_access_point_per_workload_for_the_non_root_trainer(result):
    aps = _access_points(result)
    fs_id = result.one("aws:efs/fileSystem:FileSystem").outputs["id"]
    # The paths the earlier dynamically provisioned claim "shared" used: data and checkpoints carry over.
    assert {k: ap.inputs["rootDirectory"]["path"] for k, ap in aps.items()} == {
        "data": "/eks-ddp/training/shared/data", "run": "/eks-ddp/training/shared/runs/run-7",
        "ro": "/eks-ddp/training/shared/data"}
    for ap in aps.values():
        assert ap.inputs["fileSystemId"] == fs_id
        assert {k: int(v) for k, v in ap.inputs["posixUser"].items()} == {"uid": 1000, "gid": 1000}
        assert ap.inputs["rootDirectory"]["creationInfo"] == {"ownerUid": 1000, "ownerGid": 1000, "permissions": "700"}


def test_claims_are_static_volumes_on_the_access_points_over_tls_with_iam(result):
    aps = _access_points(result)
    fs_id = result.one("aws:efs/fileSystem:FileSystem").outputs["id"]
    pvs = {r.inputs["spec"]["claimRef"]["name"]: r.inputs for r in result.of_type("kubernetes:core/v1:PersistentVolume")}
    pvcs = {r.inputs["metadata"]["name"]: r.inputs for r in result.of_type("kubernetes:core/v1:PersistentVolumeClaim")}
    assert sorted(pvs) == sorted(pvcs) == ["shared-data", "shared-data-ro", "shared-run-run-7"]
    for claim, kind in (("shared-data", "data"), ("shared-run-run-7", "run"), ("shared-data-ro", "ro")):
        pv, pvc = pvs[claim], pvcs[claim]
        assert pv["spec"]["csi"] == {"driver": "efs.csi.aws.com",
                                     "volumeHandle": f"{fs_id}::{aps[kind].outputs['id']}",
                                     "volumeAttributes": {"encryptInTransit": "true"}}
        assert pv["spec"]["mountOptions"] == ["iam", "lookupcache=positive"]
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        assert pv["spec"]["claimRef"] == {"namespace": "training", "name": claim}
        assert pv["metadata"]["name"] == f"training-{claim}"
        assert pvc["metadata"]["namespace"] == "training"
        assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
        modes = ["ReadOnlyMany"] if kind == "ro" else ["ReadWriteMany"]
        assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == modes
        assert pvc["spec"]["storageClassName"] == ""
    # No dynamic provisioning: a claim the stack did not make would get an access point outside the policy.
    assert result.of_type("kubernetes:storage.k8s.io/v1:StorageClass") == []
    assert result.outputs == {"fs": fs_id, "data": "shared-data", "run": "shared-run-run-7"}


# --- security review S2: a file-system policy --------------------------------------------------------------

def _policy(result) -> list[dict]:
    return json.loads(result.one("aws:efs/fileSystemPolicy:FileSystemPolicy").inputs["policy"])["Statement"]


def test_file_system_policy_requires_tls_the_stack_access_points_and_no_root(result):
    policy = result.one("aws:efs/fileSystemPolicy:FileSystemPolicy")
    assert policy.inputs["fileSystemId"] == result.one("aws:efs/fileSystem:FileSystem").outputs["id"]
    arns = sorted(ap.outputs["arn"] for ap in _access_points(result).values())
    statements = {s["Sid"]: s for s in _policy(result)}
    client = {"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite", "elasticfilesystem:ClientRootAccess"}
    tls = statements["DenyWithoutTls"]
    assert tls["Effect"] == "Deny" and set(tls["Action"]) == client
    assert tls["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    other = statements["DenyOtherThanStackAccessPoints"]
    assert other["Effect"] == "Deny" and set(other["Action"]) == client
    assert sorted(other["Condition"]["StringNotEquals"]["elasticfilesystem:AccessPointArn"]) == arns
    root = statements["DenyRootAccess"]
    assert (root["Effect"], root["Action"], root.get("Condition")) == (
        "Deny", "elasticfilesystem:ClientRootAccess", None)
    allows = [s for s in statements.values() if s["Effect"] == "Allow"]
    assert len(allows) == 1
    assert "elasticfilesystem:ClientRootAccess" not in allows[0]["Action"]
    assert sorted(allows[0]["Condition"]["StringEquals"]["elasticfilesystem:AccessPointArn"]) == arns
    # Only the CSI driver's role may mount: no anonymous client (a mount without iam) is allowed.
    assert allows[0]["Principal"] == {"AWS": result.one("aws:iam/role:Role").outputs["arn"]}
    assert all(s["Principal"] == {"AWS": "*"} for s in statements.values() if s["Effect"] == "Deny")


def test_policy_and_access_points_are_kept_with_a_kept_file_system(result):
    assert result.one("aws:efs/fileSystemPolicy:FileSystemPolicy").retain_on_delete is True
    assert all(ap.retain_on_delete for ap in result.of_type("aws:efs/accessPoint:AccessPoint"))


def test_an_adopted_file_system_gets_the_policy_too():
    result = _run(dataclasses.replace(ARGS, file_system_id="fs-0123456789abcdef0"))
    assert result.one("aws:efs/fileSystemPolicy:FileSystemPolicy").inputs["fileSystemId"] == "fs-0123456789abcdef0"
    assert {ap.inputs["fileSystemId"] for ap in result.of_type("aws:efs/accessPoint:AccessPoint")} == {
        "fs-0123456789abcdef0"}


def test_a_new_run_gets_its_own_access_point_and_claim():
    result = _run(dataclasses.replace(ARGS, run_id="run-8"))
    assert _access_points(result)["run"].inputs["rootDirectory"]["path"] == "/eks-ddp/training/shared/runs/run-8"
    assert result.outputs["run"] == "shared-run-run-8"


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
                                          ({"file_system_id": "vol-1"}, "file_system_id"),
                                          ({"run_id": "Run/1"}, "run_id")])
def test_validation_names_the_field(change, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        _run(dataclasses.replace(ARGS, **change))


# --- review M7: one mount target per zone, also for a brought VPC ----------------------------------------

def test_brought_vpc_with_two_private_subnets_in_one_zone_gets_one_mount_target_per_zone():
    from eks_ddp.tooling.mocks import RecordingMocks
    from tests.support.util import set_path, stack_config

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
    assert all(pv.inputs["spec"]["csi"]["volumeHandle"].startswith("fs-0123456789abcdef0::")
               for pv in result.of_type("kubernetes:core/v1:PersistentVolume"))
    assert result.outputs["fs"] == "fs-0123456789abcdef0"


def test_file_system_id_is_a_config_key():
    from tests.support.util import run, set_path, stack_config

    result = run(set_path(stack_config("dev"), "eks-ddp:storage.fileSystemId", "fs-0123456789abcdef0"))
    assert result.of_type("aws:efs/fileSystem:FileSystem") == []
    assert result.outputs["efsId"] == "fs-0123456789abcdef0"


def test_csi_role_scoped_to_file_system(result):
    """A13 (in part): no AWS-managed AmazonEFSCSIDriverPolicy, which may create access points on every file system
    in the account; an inline policy creates them only on this file system. Delete keeps the managed policy's
    driver-tag condition (the add-on cannot set a cluster tag, see components/eks_ddp/infra/efs.py); the add-on configuration
    stays within its schema (no controller.tags)."""
    assert result.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") == []
    fs_id = result.one("aws:efs/fileSystem:FileSystem").outputs["id"]
    policy = json.loads(next(p for p in result.of_type("aws:iam/rolePolicy:RolePolicy")
                             if p.name == "storage-efs-csi").inputs["policy"])
    by_action = {a: s for s in policy["Statement"] for a in s["Action"]}
    assert by_action["elasticfilesystem:CreateAccessPoint"]["Resource"] == \
        f"arn:aws:elasticfilesystem:us-west-2:123456789012:file-system/{fs_id}"
    for s in policy["Statement"]:  # every write is conditioned; reads name this file system (zones have no ARN)
        if s["Sid"] == "DescribeThisFileSystem":
            assert s["Resource"] == by_action["elasticfilesystem:CreateAccessPoint"]["Resource"], s
        elif s["Sid"] != "DescribeZones":
            assert s["Condition"], s
    assert not any(a.startswith("elasticfilesystem:") and a.split(":")[1].startswith(("Create", "Delete", "Put"))
                   and s["Resource"] == "*" and not s.get("Condition") for a, s in by_action.items())
    config = json.loads(result.one("aws:eks/addon:Addon").inputs["configurationValues"])
    assert config == {"node": {"tolerations": [{"operator": "Exists"}]}}


def test_the_node_plugin_mounts_only_through_the_stack_access_points_never_as_root(result):
    """B9: the node plugin's mount rights (its role's identity policy): ClientMount and ClientWrite on this file
    system through this stack's access points and a mount target; no ClientRootAccess."""
    fs_arn = f"arn:aws:elasticfilesystem:us-west-2:123456789012:file-system/{result.one('aws:efs/fileSystem:FileSystem').outputs['id']}"
    policy = json.loads(result.one("aws:iam/rolePolicy:RolePolicy", "storage-efs-csi-mount").inputs["policy"])
    (stmt,) = policy["Statement"]
    assert stmt["Effect"] == "Allow" and stmt["Resource"] == fs_arn
    assert stmt["Action"] == ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    assert stmt["Condition"] == {
        "StringEquals": {"elasticfilesystem:AccessPointArn": sorted(
            ap.outputs["arn"] for ap in result.of_type("aws:efs/accessPoint:AccessPoint"))},
        "Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}


def test_the_dataset_is_read_only_at_efs_for_every_reader(result):
    """T12: the readers' access point (same directory as the data stage's) takes no write from anyone: a pod that
    mounts its claim without readOnly still cannot write the dataset."""
    ro = _access_points(result)["ro"].outputs["arn"]
    deny = {s["Sid"]: s for s in _policy(result)}["DenyWritesThroughReadOnlyAccessPoints"]
    assert (deny["Effect"], deny["Principal"], deny["Action"]) == ("Deny", {"AWS": "*"}, "elasticfilesystem:ClientWrite")
    assert deny["Condition"] == {"StringEquals": {"elasticfilesystem:AccessPointArn": [ro]}}


def test_lifecycle_moves_cold_files_to_ia_then_archive_and_back_on_access(result):
    # Review B14: checkpoints and a file system kept after destroy stayed in Standard at $0.30/GB-month.
    fs = result.one("aws:efs/fileSystem:FileSystem").inputs
    assert fs["lifecyclePolicies"] == [{"transitionToIa": "AFTER_30_DAYS"}, {"transitionToArchive": "AFTER_90_DAYS"},
                                       {"transitionToPrimaryStorageClass": "AFTER_1_ACCESS"}]


def test_lifecycle_is_configurable_and_checked():
    r = _run(dataclasses.replace(ARGS, lifecycle=EfsLifecycle(transition_to_ia="AFTER_7_DAYS",
                                                              transition_to_archive=None)))
    assert r.one("aws:efs/fileSystem:FileSystem").inputs["lifecyclePolicies"] == [
        {"transitionToIa": "AFTER_7_DAYS"}, {"transitionToPrimaryStorageClass": "AFTER_1_ACCESS"}]
    off = EfsLifecycle(transition_to_ia=None, transition_to_archive=None, transition_to_primary_storage_class=None)
    assert "lifecyclePolicies" not in _run(dataclasses.replace(ARGS, lifecycle=off)).one(
        "aws:efs/fileSystem:FileSystem").inputs
    with pytest.raises(ValueError, match="lifecycle.transition_to_ia: got 'AFTER_2_DAYS'; expected one of"):
        _run(dataclasses.replace(ARGS, lifecycle=EfsLifecycle(transition_to_ia="AFTER_2_DAYS")))
    with pytest.raises(ValueError, match="transition_to_archive: got .AFTER_30_DAYS. with lifecycle.transition_to_ia"):
        _run(dataclasses.replace(ARGS, lifecycle=EfsLifecycle(transition_to_ia="AFTER_30_DAYS",
                                                              transition_to_archive="AFTER_30_DAYS")))


def test_lookupcache_positive_mounts_every_volume_so_a_name_another_node_made_is_seen():
    """Every run's commit check looks up the next fence file by name (docs/rendezvous.md): the NFS client must ask the
    server before saying "no such file". Turning it off (a volume no run writes to) is the control."""
    pvs = _run(ARGS).of_type("kubernetes:core/v1:PersistentVolume")
    assert len(pvs) == 3 and all(pv.inputs["spec"]["mountOptions"] == ["iam", "lookupcache=positive"] for pv in pvs)
    off = _run(dataclasses.replace(ARGS, lookupcache_positive=False)).of_type("kubernetes:core/v1:PersistentVolume")
    assert [pv.inputs["spec"]["mountOptions"] for pv in off] == [["iam"]] * 3


def test_the_stack_mounts_with_lookupcache_positive_for_etcd_and_c10d_runs():
    """c10d runs' fences are the files alone; etcd runs' commit checks read the store and the next fence file, which
    is what the worlds of two live stores share (a second store's world is seen only there). Before, an etcd stack
    mounted with ["iam"] alone and a client could miss such a fence for up to acdirmax (60 s)."""
    from tests.support.util import run, stack_config

    def options(cfg):
        return {tuple(pv.inputs["spec"]["mountOptions"]) for pv in run(cfg).of_type("kubernetes:core/v1:PersistentVolume")}

    cfg = stack_config("dev")
    c10d = {k: v for k, v in cfg.items() if k != "eks-ddp:etcd"}  # a c10d stack deploys no etcd
    c10d["eks-ddp:job"] = {**cfg["eks-ddp:job"], "rdzvBackend": "c10d"}
    assert options(c10d) == {("iam", "lookupcache=positive")}
    assert options(cfg) == {("iam", "lookupcache=positive")}
