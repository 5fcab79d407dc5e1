"""The FSx for Lustre backend on the p4de stack (one program run, shared): the CSI driver add-on and its role, the
file system's security group and the nodes' Lustre client rules, the volumes' mount paths, the S3 data repository,
the layout Job, what destroy deletes and keeps, the second ``up`` restoring an earlier destroy's final backup, and
the fsx and destroy contracts with their negative controls (today's plan: the file system kept inside the subnet and
security group destroy deletes; no client rules on the nodes)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from eks_ddp.core import k8s_versions
from eks_ddp.core import storage as storage_rules
from eks_ddp.infra.fsx import DRIVER_ACTIONS, FsxLustreStoreArgs
from eks_ddp.infra.fsx import validate as validate_fsx
from eks_ddp.tooling import contracts
from eks_ddp.tooling.contracts import PlanView
from eks_ddp.tooling.contracts import fsx as contract
from tests.support.util import run, set_path, stack_config

DATA = "s3://my-datasets-123456789012/corpora/wiki/"
BERT = "123456789012.dkr.ecr.us-east-1.amazonaws.com/nlp/bert@sha256:" + "b1" * 32
FS = "aws:fsx/lustreFileSystem:LustreFileSystem"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
BACKUP = "backup-0a1b2c3d4e5f60718"
"""The final backup the first ``pulumi destroy`` took: this stack is the ``pulumi up`` after it."""


def fsx_p4de_config() -> dict:
    """The p4de example with storage.backend fsxLustre, and a second run of another image with an S3 data set; the
    ``up`` after a destroy (docs/storage.md), restoring that destroy's final backup (``fsxBackupId``)."""
    raw = set_path(stack_config("p4de"), "eks-ddp:storage", {"backend": "fsxLustre", "fsxStorageCapacityGiB": 2400,
                                                              "fsxThroughputPerTiB": 500, "fsxBackupId": BACKUP})
    job = raw.pop("eks-ddp:job")
    raw["eks-ddp:runs"] = [job, {"runId": "bert-1", "nodes": 2, "workload": {
        "image": BERT, "module": "bert.train", "data": {"s3": DATA}}}]
    return raw


@pytest.fixture(scope="module")
def fsx_result():
    return run(fsx_p4de_config(), stack="p4de")


@pytest.fixture(scope="module")
def view(fsx_result):
    return PlanView.of(fsx_result)


def test_the_file_system_is_persistent_2_encrypted_with_its_own_key_in_the_gpu_zone(fsx_result):
    fs = fsx_result.one(FS)
    key = fsx_result.one("aws:kms/key:Key", "storage-fsx")
    assert (fs.inputs["deploymentType"], int(fs.inputs["storageCapacity"]),
            int(fs.inputs["perUnitStorageThroughput"])) == ("PERSISTENT_2", 2400, 500)
    assert fs.inputs["kmsKeyId"] == key.outputs["arn"] and key.inputs["enableKeyRotation"] is True
    subnet = next(s for s in fsx_result.of_type("aws:ec2/subnet:Subnet") if s.name.endswith("private-us-east-1a"))
    assert fs.inputs["subnetIds"] == subnet.outputs["id"]  # the reservation's zone, where the GPU nodes are
    assert not fsx_result.of_type("aws:efs/fileSystem:FileSystem")
    assert "fsxId" in fsx_result.outputs and "efsId" not in fsx_result.outputs


def test_destroy_deletes_the_file_system_after_a_final_backup_and_keeps_the_backups_key(fsx_result):
    """W1: its interfaces sit in the stack's subnet and security group, so destroy must delete it; the data stays in
    a final backup, encrypted with the key that stays."""
    fs = fsx_result.one(FS)
    key = fsx_result.one("aws:kms/key:Key", "storage-fsx")
    assert not fs.retain_on_delete and key.retain_on_delete
    assert fs.inputs["skipFinalBackup"] is False
    assert fs.inputs["finalBackupTags"]["eks-ddp/final-backup"] == "storage"
    lustre = fsx_result.one("aws:ec2/securityGroup:SecurityGroup", "storage-lustre")
    assert not lustre.retain_on_delete and fs.inputs["securityGroupIds"] == [lustre.outputs["id"]]


def test_the_up_after_a_destroy_restores_the_final_backup_into_the_new_network(fsx_result, view):
    """The second ``up`` (docs/storage.md, "Destroy and up again"): the new file system is created from the backup
    named by storage.fsxBackupId, in the new stack's subnet and security group, and the claims mount it."""
    fs = fsx_result.one(FS)
    assert fs.inputs["backupId"] == BACKUP
    assert "backupId" in fs.ignore_changes  # read at creation only: dropping the key later replaces nothing
    subnet = next(s for s in fsx_result.of_type("aws:ec2/subnet:Subnet") if s.name.endswith("private-us-east-1a"))
    assert fs.inputs["subnetIds"] == subnet.outputs["id"]
    assert {pv["spec"]["csi"]["volumeHandle"] for pv in view.kind("PersistentVolume")} == {fs.outputs["id"]}
    assert fsx_result.outputs["fsxId"] == fs.outputs["id"]
    assert contracts.check(fsx_result, only=("destroy",)) == []


def test_csi_driver_add_on_with_an_irsa_role_that_may_only_describe(fsx_result):
    addon = fsx_result.one("aws:eks/addon:Addon", "storage-fsx-csi-driver").inputs
    role = fsx_result.one("aws:iam/role:Role", "storage-fsx-csi")
    assert addon["addonName"] == "aws-fsx-csi-driver" and addon["serviceAccountRoleArn"] == role.outputs["arn"]
    assert addon["addonVersion"] == "v0.0.0-eksbuild.default-1.35"  # EKS's default build for the cluster's version
    assert all(k8s_versions.ADDON_VERSIONS[v].keys() >= {"aws-fsx-csi-driver"} for v in k8s_versions.SUPPORTED_VERSIONS)
    [trust] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert list(trust["Condition"]["StringEquals"].values())[0] == "system:serviceaccount:kube-system:fsx-csi-controller-sa"
    [statement] = json.loads(fsx_result.one("aws:iam/rolePolicy:RolePolicy", "storage-fsx-csi").inputs["policy"])[
        "Statement"]
    assert statement["Action"] == list(DRIVER_ACTIONS) == ["fsx:DescribeFileSystems"]


def test_the_security_group_admits_only_the_nodes_and_itself_on_lustres_ports(fsx_result):
    fs = fsx_result.one(FS)
    [sg_id] = fs.inputs["securityGroupIds"]
    node_sg = fsx_result.one("aws:ec2/securityGroup:SecurityGroup", "cluster-node").outputs["id"]
    rules = [r.inputs for r in fsx_result.of_type(INGRESS) if r.inputs["securityGroupId"] == sg_id]
    got = sorted((r["referencedSecurityGroupId"], r["ipProtocol"], int(r["fromPort"]), int(r["toPort"])) for r in rules)
    assert got == sorted([(node_sg, "tcp", 988, 988), (node_sg, "tcp", 1018, 1023),
                          (sg_id, "tcp", 988, 988), (sg_id, "tcp", 1018, 1023)])
    assert not any(r.get("cidrIpv4") or r.get("cidrIpv6") for r in rules)



def test_the_nodes_admit_lustre_from_the_file_servers(fsx_result):
    """W2: the client half of the user guide's table, on the node security group."""
    [sg_id] = fsx_result.one(FS).inputs["securityGroupIds"]
    node_sg = fsx_result.one("aws:ec2/securityGroup:SecurityGroup", "cluster-node").outputs["id"]
    got = sorted((r.inputs["ipProtocol"], int(r.inputs["fromPort"]), int(r.inputs["toPort"]))
                 for r in fsx_result.of_type(INGRESS)
                 if r.inputs["securityGroupId"] == node_sg and r.inputs.get("referencedSecurityGroupId") == sg_id)
    assert got == [("tcp", 988, 988), ("tcp", 1018, 1023)]


def test_the_workloads_see_the_same_claims_and_paths_as_on_efs(view, fsx_result):
    fs = fsx_result.one(FS)
    pvs = {pv["metadata"]["name"]: pv for pv in view.kind("PersistentVolume")}
    mount = fs.outputs["mountName"]
    expected = {"training-shared-data": "eks-ddp/training/shared/data",
                "training-shared-data-ro": "eks-ddp/training/shared/data",
                "training-shared-run-p4de-run-1": "eks-ddp/training/shared/runs/p4de-run-1",
                "training-shared-run-bert-1": "eks-ddp/training/shared/runs/bert-1"}
    for name, path in expected.items():
        csi = pvs[name]["spec"]["csi"]
        assert csi["driver"] == "fsx.csi.aws.com" and csi["volumeHandle"] == fs.outputs["id"]
        assert csi["volumeAttributes"] == {"dnsname": fs.outputs["dnsName"], "mountname": f"{mount}/{path}"}
        assert pvs[name]["spec"]["claimRef"] == {"namespace": "training", "name": name.removeprefix("training-")}
    assert pvs["training-shared-data-ro"]["spec"]["accessModes"] == ["ReadOnlyMany"]
    # The training Jobs mount their run's claim at /shared/runs/<runId> and the dataset at /shared/data.
    for job, run_id in (("training-p4de-run-1", "p4de-run-1"), ("training-bert-1-bert-1", "bert-1")):
        spec = next(j for j in view.kind("Job") if j["metadata"]["name"] == job)["spec"]["template"]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]
                  if "persistentVolumeClaim" in v}
        mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert claims == {"data": "shared-data-ro", "run": f"shared-run-{run_id}"}
        assert (mounts["data"], mounts["run"]) == ("/shared/data", f"/shared/runs/{run_id}")


def test_the_s3_data_set_is_linked_where_its_stage_puts_it_import_only(fsx_result, view):
    dra = fsx_result.one("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation").inputs
    assert (dra["dataRepositoryPath"], dra["fileSystemPath"]) == (DATA, "/eks-ddp/training/shared/data/wiki")
    assert dra["s3"] == {"autoImportPolicy": {"events": ["NEW", "CHANGED", "DELETED"]}} and not dra[
        "deleteDataInFilesystem"]
    stage = next(j for j in view.kind("Job") if j["metadata"]["name"] == "training-bert-1-stage-data")
    assert stage["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "/shared/data/wiki"


def test_the_layout_job_makes_the_directories_the_trainers_with_no_network(view):
    job = next(j for j in view.kind("Job") if j["metadata"]["name"] == "eks-ddp-training-shared-layout")
    assert job["metadata"]["namespace"] == "kube-system"
    spec = job["spec"]["template"]["spec"]
    [c] = spec["containers"]
    assert c["command"][-4:] == ["eks-ddp/training/shared/data", "eks-ddp/training/shared/data/wiki",
                                 "eks-ddp/training/shared/runs/p4de-run-1", "eks-ddp/training/shared/runs/bert-1"]
    assert c["command"][3:7] == ["/fsx", "700", "1000", "1000"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}
    assert spec["automountServiceAccountToken"] is False and spec["nodeSelector"] == {"eks-ddp/pool": "system"}
    labels = job["spec"]["template"]["metadata"]["labels"]
    [policy] = [p for p in view.kind("NetworkPolicy") if p["metadata"]["namespace"] == "kube-system"
                and all(labels.get(k) == v for k, v in p["spec"]["podSelector"].get("matchLabels", {}).items())
                and p["spec"]["podSelector"].get("matchLabels")]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy["spec"]
    claim = spec["volumes"][0]["persistentVolumeClaim"]["claimName"]
    root = next(pv for pv in view.kind("PersistentVolume") if pv["metadata"]["name"] == claim)
    assert root["spec"]["claimRef"]["namespace"] == "kube-system"  # no training pod can name it


def test_the_plan_meets_every_contract(fsx_result):
    assert [str(v) for v in contracts.check(fsx_result)] == []


# --- the fsx contract's negative controls ------------------------------------------------------------------------

def _edited(view: PlanView, *, ingress=None, policy=None, trust=None, pv=None, each=None) -> PlanView:
    resources = []
    for r in view.result.resources:
        if each is not None:
            r = each(r)
            if r is None:
                continue
        if ingress is not None and r.type == INGRESS and r.name.startswith("storage-lustre"):
            r = dataclasses.replace(r, inputs=ingress(dict(r.inputs), r.name))
            if r.inputs is None:
                continue
        if policy is not None and r.type == "aws:iam/rolePolicy:RolePolicy" and r.name == "storage-fsx-csi":
            r = dataclasses.replace(r, inputs={**r.inputs, "policy": json.dumps(policy)})
        if trust is not None and r.type == "aws:iam/role:Role" and r.name == "storage-fsx-csi":
            doc = json.loads(r.inputs["assumeRolePolicy"])
            trust(doc)
            r = dataclasses.replace(r, inputs={**r.inputs, "assumeRolePolicy": json.dumps(doc)})
        resources.append(r)
    manifests = copy.deepcopy(view.manifests)
    if pv is not None:
        for m in manifests:
            if m.get("kind") == "PersistentVolume":
                pv(m)
    return PlanView(result=dataclasses.replace(view.result, resources=resources), manifests=manifests)


def test_the_contract_holds_on_the_plan_and_is_silent_without_fsx(view, dev_result):
    assert contract.fsx_volumes_reachable_driver_least_privilege(view) == []
    assert contracts.check(dev_result, only=("fsx",)) == []


def test_an_open_port_range_or_address_is_reported(view):
    def widen(inputs, name):
        if name.endswith("988-from-nodes"):
            return {**inputs, "cidrIpv4": "0.0.0.0/0", "referencedSecurityGroupId": None, "toPort": 2049}
        return inputs
    found = [v.message for v in contract.fsx_volumes_reachable_driver_least_privilege(_edited(view, ingress=widen))]
    assert any("admits more than the cluster's nodes" in m and "0.0.0.0/0" in m for m in found), found
    assert any("cannot reach it on TCP [988]" in m for m in found), found


def test_nodes_without_the_high_ports_cannot_reach_it(view):
    dropped = _edited(view, ingress=lambda inputs, name: None if name.endswith("1018-from-nodes") else inputs)
    found = [v.message for v in contract.fsx_volumes_reachable_driver_least_privilege(dropped)]
    assert found and all("cannot reach it on TCP [1018, 1019, 1020, 1021, 1022, 1023]" in m for m in found), found
    no_self = _edited(view, ingress=lambda inputs, name: None if name.endswith("-from-self") else inputs)
    assert any("file servers cannot reach each other" in v.message
               for v in contract.fsx_volumes_reachable_driver_least_privilege(no_self))


def test_todays_plan_without_the_client_rules_is_reported(view):
    """W2's negative control: the plan before the fix (no rule on the nodes from the file system's group)."""
    today = _edited(view, each=lambda r: None if r.name.startswith("storage-lustre-client-") else r)
    found = [v.message for v in contract.fsx_volumes_reachable_driver_least_privilege(today)]
    ports = "[988, 1018, 1019, 1020, 1021, 1022, 1023]"
    assert found and all(f"do not admit TCP {ports} from the file system's security group" in m for m in found), found
    assert {m.split(" (groups")[0] for m in found} == {f"the nodes of launch template {lt}" for lt in
                                                       contract.node_groups_of(view)}


def test_closed_outbound_rules_on_either_side_are_reported(view):
    shut = _edited(view, each=lambda r: None if r.name in ("storage-lustre-egress", "cluster-node-egress") else r)
    found = [v.message for v in contract.fsx_volumes_reachable_driver_least_privilege(shut)]
    assert any("may not send to the file system's security group on TCP [988," in m for m in found), found
    assert any("its file servers may not send to the nodes of launch template" in m for m in found), found
    assert any("its file servers may not send to each other" in m for m in found), found


def test_todays_plan_keeping_the_file_system_is_reported_by_the_destroy_contract(view, fsx_result):
    """W1's negative control: the file system kept on destroy (the plan before the fix) sits in the subnet and the
    security group destroy deletes."""
    from eks_ddp.tooling.contracts import destroy

    today = _edited(view, each=lambda r: dataclasses.replace(r, retain_on_delete=True) if r.type == FS else r)
    found = [str(v) for v in destroy.nothing_kept_inside_what_destroy_deletes(today)]
    subnet = next(s for s in fsx_result.of_type("aws:ec2/subnet:Subnet") if s.name.endswith("private-us-east-1a"))
    assert len(found) == 2, found
    assert any(f"sits in subnet {subnet.name} ({subnet.outputs['id']}), which destroy deletes: EC2 DeleteSubnet "
               "answers DependencyViolation" in m for m in found), found
    assert any("sits in security group storage-lustre" in m and "DeleteSecurityGroup" in m for m in found), found
    assert destroy.nothing_kept_inside_what_destroy_deletes(view) == []


def test_a_driver_role_with_more_than_describe_or_a_wider_trust_is_reported(view):
    full = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["fsx:*", "s3:ListBucket"],
                                                    "Resource": "*"}]}
    found = [v.message for v in contract.fsx_volumes_reachable_driver_least_privilege(_edited(view, policy=full))]
    assert any("allows fsx:*" in m for m in found) and any("allows s3:ListBucket" in m for m in found), found

    def widen(doc):
        cond = doc["Statement"][0]["Condition"]
        sub = next(k for k in cond["StringEquals"] if k.endswith(":sub"))
        cond["StringLike"] = {sub: "system:serviceaccount:kube-system:fsx-csi-*"}
        del cond["StringEquals"][sub]
    found = [v.message for v in contract.fsx_volumes_reachable_driver_least_privilege(_edited(view, trust=widen))]
    assert any("its trust admits ['system:serviceaccount:kube-system:fsx-csi-*']" in m for m in found), found


def test_a_volume_with_another_dns_name_or_mount_name_is_reported(view):
    def wrong(m):
        m["spec"]["csi"]["volumeAttributes"] = {"dnsname": "fs-x.fsx.us-east-1.amazonaws.com", "mountname": "other/x"}
    found = [v.message for v in contract.fsx_volumes_reachable_driver_least_privilege(_edited(view, pv=wrong))]
    assert any("dnsname 'fs-x.fsx.us-east-1.amazonaws.com' is not" in m for m in found)
    assert any("mountname 'other/x' is neither" in m for m in found)


def test_the_component_refuses_sizes_fsx_refuses():
    args = FsxLustreStoreArgs(cluster_name="c", vpc_id="v", subnet_id="s", node_security_group_id="sg",
                              oidc_provider_arn="a", oidc_provider_url="u", namespace="training", run_id="r1",
                              layout_image="i", system_node_selector={})
    validate_fsx(args)
    with pytest.raises(ValueError, match=r"storage_capacity_gib: got 2000; expected 1200, or a multiple of 2400"):
        validate_fsx(dataclasses.replace(args, storage_capacity_gib=2000))
    with pytest.raises(ValueError, match=r"throughput_per_tib: got 200; expected one of 125, 250, 500, 1000"):
        validate_fsx(dataclasses.replace(args, throughput_per_tib=200))


def test_the_storage_manifests_pass_the_strict_schema(view):
    from kubernetes_validate import validate

    mine = [m for m in view.manifests if m["kind"] in ("PersistentVolume", "PersistentVolumeClaim", "NetworkPolicy", "Job")
            and (m["kind"] != "Job" or m["metadata"]["namespace"] == "kube-system")]
    assert len(mine) >= 12
    for doc in mine:
        validate(doc, "1.35", strict=True)


def test_the_exported_cost_estimate_shows_the_backend_and_the_reservation(fsx_result):
    est = fsx_result.outputs["costEstimate"]
    names = [i["name"] for i in est["line_items"]]
    assert "FSx for Lustre PERSISTENT_2 (2400 GiB at 500 MB/s/TiB)" in names
    assert not any(n.startswith("EFS") for n in names)
    [res] = [i for i in est["line_items"] if "cr-0123456789abcdef0" in i["name"]]
    assert res["idle_per_hour"] > 50 and est["idle_per_hour"] > 55  # the reservation, whether nodes run or not
    assert any(i["name"].startswith("kept FSx for Lustre") for i in est["after_destroy"])


def test_the_file_system_waits_as_long_as_a_backup_of_its_capacity_takes(fsx_result):
    """M1: the provider's default is 30 minutes for each of create, update and delete; the final backup on destroy
    (and the restore on the up after it) of 2400 GiB gets 7 hours, so destroy does not give up with the network
    half-deleted. Negative control: the provider's default is below every budget."""
    fs = fsx_result.one(FS)
    assert fs.custom_timeouts == {"create": "7h", "update": "7h", "delete": "7h"}  # restoring BACKUP
    assert storage_rules.fsx_timeouts(2400, restoring=False) == {"create": "1h", "update": "7h", "delete": "7h"}
    assert storage_rules.fsx_timeouts(1200, restoring=False)["delete"] == "5h"
    assert storage_rules.fsx_backup_hours(48000) == 95
    assert all(storage_rules.fsx_backup_hours(gib) > storage_rules.PROVIDER_DEFAULT_TIMEOUT_HOURS
               for gib in (1200, 2400, 4800))
    other = fsx_result.one("aws:ec2/securityGroup:SecurityGroup", "storage-lustre")
    assert other.custom_timeouts == {}  # the mocks record only what a resource sets


def test_a_restored_file_system_names_its_backup_in_a_tag(fsx_result, dev_result):
    """Preflight tells fsxBackupId left in place after a restore from one set on a file system that already exists by
    this tag (FSx does not report a file system's source backup); a file system not restored carries none."""
    from eks_ddp.infra.fsx import RESTORED_FROM_TAG

    assert fsx_result.one(FS).inputs["tags"][RESTORED_FROM_TAG] == BACKUP
    fresh = run(set_path(stack_config("dev"), "eks-ddp:storage", {"backend": "fsxLustre"}))
    assert RESTORED_FROM_TAG not in fresh.one(FS).inputs["tags"]


def test_the_s3_data_repository_waits_longer_than_the_providers_ten_minutes(fsx_result):
    """Its creation imports the prefix's metadata, its deletion precedes the file system's on destroy."""
    dra = fsx_result.one("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    assert dra.custom_timeouts == {"create": "2h", "update": "1h", "delete": "1h"}
