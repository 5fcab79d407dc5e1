"""Preflight of the FSx for Lustre backend (components/eks_ddp/tooling/preflight/fsx.py) on moto's EC2 and FSx: the
backup ``storage.fsxBackupId`` restores (issue 52, item 4), and each change that would make the provider replace the
live file system with an empty one (item 3), refused unless ``storage.fsxReplace`` names the file system.

moto's FSx answers without the fields the real API documents and the checks read (FSx API reference,
``FileSystem.VpcId``, ``FileSystemTypeVersion``, ``Lifecycle``, ``SecurityGroupIds``; ``Backup.FileSystem``):
:class:`Fsx` adds them, as
:class:`tests.tooling.preflight.test_s3.Owned` does for S3. Every refusal has its passing twin (the negative control):
the unchanged stack passes against the same live file system."""

from __future__ import annotations

import boto3
import pytest

from eks_ddp.core.storage import LUSTRE_VERSION
from eks_ddp.infra.fsx import LUSTRE_SG_DESCRIPTION, RESTORED_FROM_TAG
from eks_ddp.tooling import preflight
from tests.support.moto_account import fake_account
from tests.support.stub_quotas import StubQuotas
from tests.support.util import set_path, stack_config
from tests.tooling.preflight.test_preflight import config

REGION = "us-west-2"
GROUPS: dict[str, list[str]] = {}
"""The security groups each file system was created with (moto's answer leaves them out)."""
NAME, ME = "eks-ddp-dev", "org/eks-ddp/dev"


class Fsx:
    """moto's FSx client plus the documented fields moto leaves out."""

    def __init__(self, client, ec2, *, version: str = LUSTRE_VERSION, backups: dict | None = None):
        self._c, self._ec2, self.version, self.backups = client, ec2, version, backups or {}

    def get_paginator(self, name):
        assert name == "describe_file_systems"
        outer = self

        class _Pages:
            def paginate(self, **kw):
                for page in outer._c.get_paginator(name).paginate(**kw):
                    for fs in page["FileSystems"]:
                        subnet = outer._ec2.describe_subnets(SubnetIds=fs["SubnetIds"][:1])["Subnets"][0]
                        fs.update(VpcId=subnet["VpcId"], FileSystemTypeVersion=outer.version, Lifecycle="AVAILABLE",
                                  SecurityGroupIds=GROUPS[fs["FileSystemId"]])
                    yield page
        return _Pages()

    def describe_backups(self, **kw):
        answer = self._c.describe_backups(**kw)
        for b in answer["Backups"]:
            b["Tags"] = self._c.list_tags_for_resource(ResourceARN=b["ResourceARN"])["Tags"] if "ResourceARN" in b \
                else b.get("Tags", [])
            b.update(self.backups.get(b["BackupId"], {}))
        return answer

    def create_backup(self, **kw):
        return self._c.create_backup(**kw)


class Eks:
    """The live cluster as DescribeCluster shows it (its VPC and owner tag)."""

    def __init__(self, vpc_id: str | None):
        self.vpc_id = vpc_id

    def describe_cluster(self, name):
        from botocore.exceptions import ClientError

        if self.vpc_id is None:
            raise ClientError({"Error": {"Code": "ResourceNotFoundException"}}, "DescribeCluster")
        return {"cluster": {"name": name, "version": "1.35", "status": "ACTIVE", "tags": {"eks-ddp/stack": ME},
                            "resourcesVpcConfig": {"vpcId": self.vpc_id}}}

    def get_paginator(self, name):
        class _Empty:
            def paginate(self, **kw):
                yield {"nodegroups": []}
        return _Empty()


@pytest.fixture
def aws(monkeypatch):
    with fake_account(monkeypatch):
        yield boto3.client("ec2", region_name=REGION), boto3.client("fsx", region_name=REGION)


def fsx_raw(**storage) -> dict:
    return set_path(stack_config("dev"), "eks-ddp:storage", {"backend": "fsxLustre", "fsxStorageCapacityGiB": 2400,
                                                             "fsxThroughputPerTiB": 250, **storage})


def live(ec2, fsx, *, zone: str = "us-west-2a", capacity: int = 2400, description: str = LUSTRE_SG_DESCRIPTION,
         deployment: str = "PERSISTENT_2", storage_type: str = "SSD", tags: dict | None = None) -> tuple[str, str]:
    """The stack's live network and file system as an earlier ``up`` left them; (vpc id, file system id)."""
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/20", AvailabilityZone=zone)["Subnet"]["SubnetId"]
    sg = ec2.create_security_group(GroupName="storage-lustre", Description=description, VpcId=vpc)["GroupId"]
    fs = fsx.create_file_system(
        FileSystemType="LUSTRE", StorageCapacity=capacity, StorageType=storage_type, SubnetIds=[subnet],
        SecurityGroupIds=[sg], LustreConfiguration={"DeploymentType": deployment, "PerUnitStorageThroughput": 250},
        Tags=[{"Key": k, "Value": v} for k, v in {"eks-ddp/storage": "storage", **(tags or {})}.items()])
    GROUPS[fs["FileSystem"]["FileSystemId"]] = [sg]
    return vpc, fs["FileSystem"]["FileSystemId"]


def run_check(raw: dict, ec2, fsx, vpc: str | None) -> preflight.Report:
    return preflight.check(config(raw), ec2=ec2, quotas=StubQuotas(), eks=Eks(vpc), cluster_name=NAME, stack_id=ME,
                           fsx=fsx)


def fsx_failures(report: preflight.Report) -> list[str]:
    return [f for f in report.failures if "storage." in f or "job.nodeGroup" in f]


# --- item 4: the backup a restore names ------------------------------------------------------------------------------

def backup_of(ec2, fsx_raw_client, **source) -> tuple[str, dict]:
    """A backup of a file system (moto), with the FileSystem description the real API returns."""
    vpc, fs_id = live(ec2, fsx_raw_client)
    backup = fsx_raw_client.create_backup(FileSystemId=fs_id)["Backup"]["BackupId"]
    fsx_raw_client.delete_file_system(FileSystemId=fs_id)
    shape = {"StorageCapacity": 2400, "FileSystemTypeVersion": LUSTRE_VERSION, "LustreConfiguration": {
        "DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250}}
    for key, value in source.items():
        (shape["LustreConfiguration"] if key in ("DeploymentType", "PerUnitStorageThroughput") else shape)[key] = value
    return backup, {"Lifecycle": source.pop("Lifecycle", "AVAILABLE"), "FileSystem": shape}


def test_a_matching_available_backup_passes(aws):
    ec2, client = aws
    backup, answer = backup_of(ec2, client)
    report = run_check(fsx_raw(fsxBackupId=backup), ec2, Fsx(client, ec2, backups={backup: answer}), None)
    assert fsx_failures(report) == []


@pytest.mark.parametrize(("source", "key", "want", "got"), [
    ({"StorageCapacity": 4800}, "storage.fsxStorageCapacityGiB", "2400", "4800"),
    ({"StorageCapacity": 1200}, "storage.fsxStorageCapacityGiB", "2400", "1200"),
    ({"PerUnitStorageThroughput": 500}, "storage.fsxThroughputPerTiB", "250", "500"),
    ({"DeploymentType": "PERSISTENT_1"}, "storage.backend", "'PERSISTENT_2'", "'PERSISTENT_1'"),
    ({"FileSystemTypeVersion": "2.12"}, "storage.backend", f"'{LUSTRE_VERSION}'", "'2.12'"),
])
def test_a_backup_of_another_shape_is_refused_naming_both_values(aws, source, key, want, got):
    ec2, client = aws
    backup, answer = backup_of(ec2, client, **source)
    [msg] = fsx_failures(run_check(fsx_raw(fsxBackupId=backup), ec2, Fsx(client, ec2, backups={backup: answer}),
                                   None))
    assert msg.startswith(f"{key}: {want} does not match backup {backup}, whose file system has {got}")


def test_a_backup_not_available_or_missing_is_refused(aws):
    ec2, client = aws
    backup, answer = backup_of(ec2, client)
    answer["Lifecycle"] = "CREATING"
    [msg] = fsx_failures(run_check(fsx_raw(fsxBackupId=backup), ec2, Fsx(client, ec2, backups={backup: answer}),
                                   None))
    assert f"storage.fsxBackupId: {backup} is CREATING; expected AVAILABLE" in msg
    [msg] = fsx_failures(run_check(fsx_raw(fsxBackupId="backup-0123456789abcdef0"), ec2, Fsx(client, ec2), None))
    assert msg.startswith("storage.fsxBackupId: backup-0123456789abcdef0 does not exist in us-west-2")


def test_a_backup_id_on_a_stack_whose_file_system_exists_is_refused_not_ignored(aws):
    ec2, client = aws
    backup, answer = backup_of(ec2, client)
    vpc, fs_id = live(ec2, client)
    fsx = Fsx(client, ec2, backups={backup: answer})
    [msg] = fsx_failures(run_check(fsx_raw(fsxBackupId=backup), ec2, fsx, vpc))
    assert msg.startswith(f"storage.fsxBackupId: got {backup}, but the stack's file system {fs_id} already exists "
                          "(not created from it)")
    # negative control: the backup the live file system was restored from, left in the config, passes
    client.tag_resource(ResourceARN=next(f["ResourceARN"] for f in client.describe_file_systems()["FileSystems"]
                                         if f["FileSystemId"] == fs_id),
                        Tags=[{"Key": RESTORED_FROM_TAG, "Value": backup}])
    assert fsx_failures(run_check(fsx_raw(fsxBackupId=backup), ec2, fsx, vpc)) == []


# --- item 3: no up silently replaces the file system -----------------------------------------------------------------

def test_the_unchanged_stack_passes_against_its_live_file_system(aws):
    ec2, client = aws
    vpc, _ = live(ec2, client)
    report = run_check(fsx_raw(), ec2, Fsx(client, ec2), vpc)
    assert fsx_failures(report) == [] and not any("fsx" in w.lower() for w in report.warnings)
    # a capacity increase is an in-place update, not a replacement
    assert fsx_failures(run_check(fsx_raw(fsxStorageCapacityGiB=4800), ec2, Fsx(client, ec2), vpc)) == []


@pytest.mark.parametrize(("change", "expect"), [
    ("zone", "job.nodeGroup: the file system sits in us-west-2b, and this up puts it in us-west-2a"),
    ("capacity", "storage.fsxStorageCapacityGiB: got 2400, below the live 4800"),
    ("version", f"storage.backend: the Lustre version is '2.12' live and '{LUSTRE_VERSION}'"),
    ("deployment", "storage.backend: the deployment type is 'PERSISTENT_1' live and 'PERSISTENT_2'"),
    ("storage type", "storage.backend: the storage type is 'HDD' live and 'SSD'"),
    ("security group", "the file system's security group"),
])
def test_each_replace_forcing_change_is_refused_before_up(aws, change, expect):
    """One per replace-forcing field the stack can change: subnet (zone), storage_capacity decrease,
    file_system_type_version, deployment_type, storage_type, security_group_ids (through the group's description);
    backup_id is the fsxBackupId test above; kms_key_id is the stack's own key, which no stack key changes."""
    ec2, client = aws
    vpc, fs_id = live(ec2, client, zone="us-west-2b" if change == "zone" else "us-west-2a",
                      capacity=4800 if change == "capacity" else 2400,
                      deployment="PERSISTENT_1" if change == "deployment" else "PERSISTENT_2",
                      storage_type="HDD" if change == "storage type" else "SSD",
                      description="an older description" if change == "security group" else LUSTRE_SG_DESCRIPTION)
    fsx = Fsx(client, ec2, version="2.12" if change == "version" else LUSTRE_VERSION)
    [msg] = fsx_failures(run_check(fsx_raw(), ec2, fsx, vpc))
    assert msg.startswith(expect) or expect in msg
    assert f"replace the stack's FSx file system {fs_id} with a new, EMPTY one" in msg
    assert f"pulumi config set --path storage.fsxReplace {fs_id}" in msg
    # the opt-in names this file system: first a backup is taken, and nothing is replaced until it is AVAILABLE;
    # then a warning that names it, no failure
    [started] = fsx_failures(run_check(fsx_raw(fsxReplace=fs_id), ec2, fsx, vpc))
    assert started.startswith("storage.fsxReplace: started backup backup-") and f"of {fs_id}" in started
    backup = started.split("started backup ")[1].split(" ")[0]
    [busy] = fsx_failures(run_check(fsx_raw(fsxReplace=fs_id), ec2, fsx, vpc))  # moto's backup stays CREATING
    assert f"backup {backup} of {fs_id}, taken before the replacement, is CREATING" in busy
    fsx.backups[backup] = {"Lifecycle": "AVAILABLE"}
    report = run_check(fsx_raw(fsxReplace=fs_id), ec2, fsx, vpc)
    assert fsx_failures(report) == []
    [warning] = [w for w in report.warnings if w.startswith("storage.fsxReplace:")]
    assert f"replaces file system {fs_id}" in warning and f"storage.fsxBackupId: {backup}" in warning
    # an opt-in naming another file system does not let it through
    assert len(fsx_failures(run_check(fsx_raw(fsxReplace="fs-0123456789abcdef0"), ec2, fsx, vpc))) == 1


def test_an_opt_in_without_retain_on_destroy_still_takes_a_backup_first(aws):
    """Before, with retainOnDestroy false the opt-in only warned "deleted with NO backup" and let the up replace it."""
    ec2, client = aws
    vpc, fs_id = live(ec2, client, capacity=4800)
    [started] = fsx_failures(run_check(fsx_raw(fsxReplace=fs_id, retainOnDestroy=False), ec2, Fsx(client, ec2), vpc))
    assert "started backup backup-" in started
    backups = client.describe_backups(Filters=[{"Name": "file-system-id", "Values": [fs_id]}])["Backups"]
    assert len(backups) == 1
    tags = client.list_tags_for_resource(ResourceARN=backups[0]["ResourceARN"])["Tags"]
    assert {"Key": "eks-ddp/pre-replace", "Value": fs_id} in tags


def test_no_live_cluster_means_nothing_to_replace(aws):
    ec2, client = aws
    live(ec2, client, capacity=4800)  # someone else's, in a VPC this stack has no cluster in
    assert fsx_failures(run_check(fsx_raw(), ec2, Fsx(client, ec2), None)) == []


def test_fsx_replace_must_look_like_a_file_system_id_and_needs_the_fsx_backend():
    from eks_ddp.config import ConfigError

    with pytest.raises(ConfigError, match=r"storage\.fsxReplace: got 'my-fs'; expected the id of the stack's file"):
        config(fsx_raw(fsxReplace="my-fs"))
    with pytest.raises(ConfigError, match=r"storage\.fsxReplace: got 'fs-0123456789abcdef0' with storage\.backend "
                                          r"'efs'; expected none"):
        config(set_path(stack_config("dev"), "eks-ddp:storage", {"fsxReplace": "fs-0123456789abcdef0"}))


def test_run_or_raise_asks_fsx_on_an_fsx_stack_only(monkeypatch):
    """What ``__main__.py`` calls: an FSx client is made for an FSx stack and handed to the checks."""
    from eks_ddp.tooling.preflight import checker

    seen = {}
    monkeypatch.setattr(checker, "fsx_client", lambda region, profile=None: f"fsx:{region}")
    monkeypatch.setattr(checker, "check", lambda cfg, **kw: seen.update(kw) or preflight.Report())
    monkeypatch.setattr(checker.cli_version, "problem", lambda: None)
    checker.run_or_raise(config(fsx_raw()), ec2=object(), quotas=StubQuotas())
    assert seen["fsx"] == f"fsx:{REGION}"
    checker.run_or_raise(config(stack_config("dev")), ec2=object(), quotas=StubQuotas())
    assert seen["fsx"] is None
