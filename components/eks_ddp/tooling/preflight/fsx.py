"""Preflight of the FSx for Lustre backend (``storage.backend: fsxLustre``): the backup a restore names, and what this
``up`` would do to the stack's live file system.

**The backup** (``storage.fsxBackupId``): ``fsx:DescribeBackups`` must find it ``AVAILABLE``, taken from a
``PERSISTENT_2`` file system of the stack's Lustre version, capacity and throughput. The provider creates a restored
file system without a capacity (hashicorp/terraform-provider-aws ``internal/service/fsx/lustre_file_system.go``,
``resourceLustreFileSystemCreate``: ``CreateFileSystemFromBackupInput`` has no ``StorageCapacity``), so it gets the
backup's; a configured capacity below it makes the next ``up`` replace the restored file system (the capacity-decrease
rule below), one above it starts an hours-long, billed resize. Each mismatch is refused naming both values.

**The live file system**: one ``up`` must never swap the file system that holds the runs' data for an empty one. The
provider replaces a Lustre file system when any of these changes (same file: ``ForceNew`` on ``subnet_ids``,
``security_group_ids``, ``kms_key_id``, ``file_system_type_version``, ``deployment_type``, ``storage_type`` and
``backup_id``; ``resourceLustreFileSystemStorageCapacityCustomizeDiff`` forces a new one when ``storage_capacity``
decreases); and the security group is replaced (so its id changes) when its description or VPC changes (``ForceNew``
on ``aws_security_group``). Preflight finds the stack's file system (the ``eks-ddp/storage`` tag, in the live
cluster's VPC) and compares what this ``up`` sends: the subnet's zone (the job group's), the capacity, the Lustre
version, deployment and storage type, and the security group's description and VPC. A change is refused, naming the
key, the live value and the new one, unless ``storage.fsxReplace`` names that file system's id: then preflight first
takes a backup of it (``fsx:CreateBackup``, tagged ``eks-ddp/pre-replace``) and refuses until that backup is
``AVAILABLE``; the ``up`` after that replaces it, with a warning naming the backup and how it comes back. The KMS key is the stack's own resource and no stack key changes it. ``storage.fsxBackupId`` set on a stack whose
file system exists is refused unless it is the backup that file system was created from (the ``eks-ddp/restored-from``
tag): the provider ignores it there (``ignore_changes``), so it would restore nothing.

With preflight off (``eks-ddp:preflight false``), or when the FSx or EKS API cannot be asked (a warning says so),
nothing refuses these changes: ``pulumi preview`` then shows ``replace`` on ``aws:fsx/lustreFileSystem``.

IAM actions: fsx:DescribeBackups, fsx:DescribeFileSystems, ec2:DescribeSubnets, ec2:DescribeSecurityGroups (read-only);
with ``storage.fsxReplace`` set, also fsx:CreateBackup and fsx:TagResource (the backup taken before a replacement).
"""

from __future__ import annotations

from typing import Any

from eks_ddp.core.storage import LUSTRE_VERSION
from eks_ddp.infra.fsx import (
    DEPLOYMENT_TYPE,
    LUSTRE_SG_DESCRIPTION,
    RESTORED_FROM_TAG,
    STORAGE_TYPE,
)

STORAGE_TAG = "eks-ddp/storage"
"""Tag of the stack's file system (``FsxLustreStore``: its value, the component's name)."""


def needed(cfg: Any) -> bool:
    return cfg.storage.backend == "fsxLustre"


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags") or []}


def check_backup(c: Any, fsx: Any) -> None:
    """``storage.fsxBackupId`` against the stack: AVAILABLE, and the file system it restores as configured."""
    st = c.cfg.storage
    backup_id = st.fsx_backup_id
    if backup_id is None:
        return
    found = c.attempt("fsx", "DescribeBackups", f"backup {backup_id}", lambda: _describe_backup(fsx, backup_id))
    if found is None:
        return
    if not found:
        c.fail(f"storage.fsxBackupId: {backup_id} does not exist in {c.cfg.region}; list the backups with "
               f"aws fsx describe-backups --region {c.cfg.region} --filters Name=file-system-type,Values=LUSTRE")
        return
    lifecycle = found.get("Lifecycle")
    if lifecycle != "AVAILABLE":
        c.fail(f"storage.fsxBackupId: {backup_id} is {lifecycle}; expected AVAILABLE (a backup being taken can be "
               "restored once it is; a FAILED or DELETED one never)")
    source = found.get("FileSystem") or {}
    lustre = source.get("LustreConfiguration") or {}
    pairs = (
        ("storage.fsxStorageCapacityGiB", st.fsx_storage_capacity_gib, source.get("StorageCapacity"),
         "FSx restores a backup at its own capacity"),
        ("storage.fsxThroughputPerTiB", st.fsx_throughput_per_tib, lustre.get("PerUnitStorageThroughput"),
         "a different value starts a throughput change on the next up"),
        ("storage.backend", DEPLOYMENT_TYPE, lustre.get("DeploymentType"),
         "the stack's file systems are PERSISTENT_2; another deployment type is replaced on the next up"),
        ("storage.backend", LUSTRE_VERSION, source.get("FileSystemTypeVersion"),
         "the stack's Lustre version; another one is replaced on the next up"),
    )
    for key, want, got, why in pairs:
        if got is not None and got != want:
            c.fail(f"{key}: {want!r} does not match backup {backup_id}, whose file system has {got!r} ({why}); set "
                   f"{key} to {got!r}, or name another backup in storage.fsxBackupId")


def _describe_backup(fsx: Any, backup_id: str) -> dict[str, Any]:
    from botocore.exceptions import ClientError

    try:
        backups = fsx.describe_backups(BackupIds=[backup_id])["Backups"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") == "BackupNotFound":
            return {}
        raise
    return backups[0] if backups else {}


def stack_file_systems(fsx: Any, vpc_id: str) -> list[dict[str, Any]]:
    """The Lustre file systems in ``vpc_id`` that carry the stack's storage tag."""
    out = []
    for page in fsx.get_paginator("describe_file_systems").paginate():
        for fs in page["FileSystems"]:
            if (fs.get("FileSystemType") == "LUSTRE" and fs.get("VpcId") == vpc_id and STORAGE_TAG in _tags(fs)
                    and fs.get("Lifecycle") not in ("DELETING", "FAILED")):
                out.append(fs)
    return out


def planned_zone(c: Any, zones: tuple[list[str], str] | None) -> str | None:
    """The zone this ``up`` puts the file system in, as ``__main__.py`` picks it: the job group's zone, else the
    first of the new VPC's zones (unknown for a brought VPC's subnets: None)."""
    group = c.cfg.job_group
    if group.availability_zone is not None:
        return str(group.availability_zone)
    if zones is None or zones[1] == "network.privateSubnetIds" or not zones[0]:
        return None
    return zones[0][0]


def check_live_file_system(c: Any, fsx: Any, ec2: Any, vpc_id: str, zones: tuple[list[str], str] | None) -> None:
    """What this ``up`` would do to the stack's live file system (see the module docstring)."""
    st = c.cfg.storage
    found = c.attempt("fsx", "DescribeFileSystems", f"the stack's FSx file system in {vpc_id}",
                      lambda: stack_file_systems(fsx, vpc_id))
    if not found:
        if found is not None and st.fsx_replace is not None:
            c.warn(f"storage.fsxReplace: {st.fsx_replace} is not a file system of this stack (there is none in "
                   f"{vpc_id}); it has no effect: remove it")
        return
    if len(found) > 1:
        c.warn(f"preflight: {len(found)} FSx for Lustre file systems tagged {STORAGE_TAG} in {vpc_id} "
               f"({', '.join(f['FileSystemId'] for f in found)}); which one is this stack's was not checked")
        return
    fs = found[0]
    fs_id, lustre = fs["FileSystemId"], fs.get("LustreConfiguration") or {}
    restored_from = _tags(fs).get(RESTORED_FROM_TAG)
    if st.fsx_backup_id is not None and st.fsx_backup_id != restored_from:
        c.fail(f"storage.fsxBackupId: got {st.fsx_backup_id}, but the stack's file system {fs_id} already exists ("
               + (f"created from {restored_from}" if restored_from else "not created from it")
               + "); a backup is restored only when the file system is created, so it would restore nothing. Remove "
               "storage.fsxBackupId (pulumi config rm --path storage.fsxBackupId), or restore it as docs/storage.md "
               "says (\"Replacing the file system\")")
    changes = list(_replacing_changes(c, ec2, fs, lustre, zones))
    if not changes:
        if st.fsx_replace is not None and st.fsx_replace != fs_id:
            c.warn(f"storage.fsxReplace: {st.fsx_replace} is not the stack's file system ({fs_id}); it has no "
                   "effect: remove it")
        return
    if st.fsx_replace == fs_id:
        backup = _backup_before_replacing(c, fsx, fs_id)
        if backup is None:
            return
        c.warn(f"storage.fsxReplace: this up replaces file system {fs_id} with a new, empty one ("
               + "; ".join(changes) + f"). Its data is in backup {backup['BackupId']} (taken before this up, tagged "
               f"{PRE_REPLACE_TAG}); restore it with storage.fsxBackupId: {backup['BackupId']} as docs/storage.md, "
               "\"Replacing the file system\", says. Remove storage.fsxReplace after this up")
        return
    for change in changes:
        c.fail(f"{change}: this up would replace the stack's FSx file system {fs_id} with a new, EMPTY one (the "
               "runs' data and checkpoints stay behind in a backup nothing restores). Keep the live value, or, to "
               f"replace it on purpose, pulumi config set --path storage.fsxReplace {fs_id} (docs/storage.md, "
               "\"Replacing the file system\")")


PRE_REPLACE_TAG = "eks-ddp/pre-replace"
"""Tag of the backup preflight takes of a file system before an ``up`` replaces it (its value: that file system's id)."""
BACKUP_IN_PROGRESS = ("CREATING", "TRANSFERRING", "PENDING", "COPYING")
"""A backup's ``Lifecycle`` values on its way to ``AVAILABLE`` (FSx API reference, ``Backup.Lifecycle``)."""


def _backup_before_replacing(c: Any, fsx: Any, fs_id: str) -> dict[str, Any] | None:
    """The AVAILABLE backup preflight took of ``fs_id`` for its replacement, or None after a failure that says why:
    none yet (one is started now: ``fsx:CreateBackup``, tagged :data:`PRE_REPLACE_TAG`), or one still in progress.
    The replacement goes ahead only once its data is in a backup, whatever ``retainOnDestroy`` says: the provider
    deletes the old file system with the settings of the last ``up`` (its final backup may be off), and a final
    backup is taken when the old one goes, after the new, empty one is in use."""
    mine = [b for b in fsx.describe_backups(Filters=[{"Name": "file-system-id", "Values": [fs_id]}])["Backups"]
            if _tags(b).get(PRE_REPLACE_TAG) == fs_id]
    ready = [b for b in mine if b.get("Lifecycle") == "AVAILABLE"]
    if ready:
        return max(ready, key=lambda b: str(b.get("CreationTime")))
    busy = [b for b in mine if b.get("Lifecycle") in BACKUP_IN_PROGRESS]
    if busy:
        b = busy[0]
        c.fail(f"storage.fsxReplace: backup {b['BackupId']} of {fs_id}, taken before the replacement, is "
               f"{b.get('Lifecycle')}; run pulumi up again once it is AVAILABLE (aws fsx describe-backups --backup-ids "
               f"{b['BackupId']}): a file system of terabytes takes hours")
        return None
    started = fsx.create_backup(FileSystemId=fs_id, Tags=[{"Key": PRE_REPLACE_TAG, "Value": fs_id}])["Backup"]
    c.fail(f"storage.fsxReplace: started backup {started['BackupId']} of {fs_id} before replacing it (nothing is "
           "replaced before its data is in a backup); run pulumi up again once it is AVAILABLE (aws fsx "
           f"describe-backups --backup-ids {started['BackupId']}): a file system of terabytes takes hours")
    return None


def _replacing_changes(c: Any, ec2: Any, fs: dict[str, Any], lustre: dict[str, Any],
                       zones: tuple[list[str], str] | None):
    """'<key>: live <old>, this up <new>' for each replace-forcing difference."""
    st = c.cfg.storage
    live_capacity = fs.get("StorageCapacity")
    if live_capacity is not None and st.fsx_storage_capacity_gib < live_capacity:
        yield (f"storage.fsxStorageCapacityGiB: got {st.fsx_storage_capacity_gib}, below the live {live_capacity} "
               "(FSx cannot shrink a file system; the provider replaces it)")
    for what, live, new in (("Lustre version", fs.get("FileSystemTypeVersion"), LUSTRE_VERSION),
                            ("deployment type", lustre.get("DeploymentType"), DEPLOYMENT_TYPE),
                            ("storage type", fs.get("StorageType"), STORAGE_TYPE)):
        if live is not None and live != new:
            yield f"storage.backend: the {what} is {live!r} live and {new!r} in this version of eks-ddp"
    zone = planned_zone(c, zones)
    subnets = fs.get("SubnetIds") or []
    if zone is not None and subnets:
        live_zone = c.attempt("ec2", "DescribeSubnets", f"the zone of {fs['FileSystemId']}'s subnet",
                              lambda: ec2.describe_subnets(SubnetIds=subnets[:1])["Subnets"][0]["AvailabilityZone"])
        if live_zone is not None and live_zone != zone:
            group = c.cfg.job_group
            yield (f"job.nodeGroup: the file system sits in {live_zone}, and this up puts it in {zone}, the zone of "
                   f"node group {group.name!r} (set that group's availabilityZone to {live_zone} to keep it)")
    groups = fs.get("SecurityGroupIds") or []
    if groups:
        live_groups = c.attempt("ec2", "DescribeSecurityGroups", f"the security group of {fs['FileSystemId']}",
                                lambda: ec2.describe_security_groups(GroupIds=groups)["SecurityGroups"])
        for g in live_groups or []:
            if g.get("Description") != LUSTRE_SG_DESCRIPTION:
                yield (f"storage.backend: the file system's security group {g['GroupId']} is described "
                       f"{g.get('Description')!r} live and {LUSTRE_SG_DESCRIPTION!r} in this version of eks-ddp "
                       "(a new description replaces the group, and a new group replaces the file system)")
