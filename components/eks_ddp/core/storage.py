"""Storage rules shared by the stack config and the components: FSx for Lustre sizes, EFS lifecycle.

Pure module: no Pulumi, no AWS. Each rule names its source.
"""

from __future__ import annotations

FSX_THROUGHPUTS = (125, 250, 500, 1000)
"""PERSISTENT_2 SSD's MB/s per TiB of capacity (pulumi-aws ``LustreFileSystem.per_unit_storage_throughput``:
"Valid values for PERSISTENT_2 deployment_type and SSD storage_type are 125, 250, 500, 1000")."""

LUSTRE_PORTS = ((988, 988), (1018, 1023))
"""TCP ports Lustre clients and the file servers use (FSx for Lustre user guide, "File system access control with
Amazon VPC": inbound 988 and 1018-1023 from the clients and from the file system's own security group)."""
LUSTRE_VERSION = "2.15"
"""Lustre version of the stack's FSx file system (``file_system_type_version``) and of the client the nodes install
(``infra.node_user_data.lustre_client_script``): declared once, so the two cannot drift."""

EFS_TRANSITION_DAYS = ("AFTER_1_DAY", "AFTER_7_DAYS", "AFTER_14_DAYS", "AFTER_30_DAYS", "AFTER_60_DAYS",
                       "AFTER_90_DAYS", "AFTER_180_DAYS", "AFTER_270_DAYS", "AFTER_365_DAYS")
"""What EFS's ``TransitionToIA`` and ``TransitionToArchive`` accept (pulumi-aws ``FileSystemLifecyclePolicyArgs``)."""
EFS_TO_PRIMARY = ("AFTER_1_ACCESS",)
"""What ``TransitionToPrimaryStorageClass`` accepts."""

PROVIDER_DEFAULT_TIMEOUT_HOURS = 0.5
"""What the provider waits for a Lustre file system when no custom timeout is set (hashicorp/terraform-provider-aws
``internal/service/fsx/lustre_file_system.go``, ``resourceLustreFileSystem``: ``Timeouts`` Create, Update and Delete
``schema.DefaultTimeout(30 * time.Minute)``)."""
FSX_BACKUP_HOURS_PER_TIB = 2
FSX_TIMEOUT_BASE_HOURS = 1


def fsx_backup_hours(capacity_gib: int) -> int:
    """Hours budgeted for FSx to copy a file system of ``capacity_gib`` into a backup, or back out of one.

    The FSx for Lustre user guide ("Working with backups") gives no rate, only that "the initial backup of a brand
    new file system taken after loading TBs of data takes hours to complete"; a destroy's final backup is such a
    first backup (the stack enables no automatic backups). The budget is 1 hour plus 2 hours per started TiB of
    capacity, i.e. a full file system copied at about 150 MB/s (an assumed rate, not a documented one: the throughput
    of the smallest file system, 1.2 TiB at 125 MB/s/TiB): 1200 GiB -> 5 h, 2400 GiB -> 7 h, 48000 GiB -> 95 h."""
    tib = -(-capacity_gib // 1024)
    return FSX_TIMEOUT_BASE_HOURS + FSX_BACKUP_HOURS_PER_TIB * tib


def fsx_timeouts(capacity_gib: int, *, restoring: bool) -> dict[str, str]:
    """The file system's ``customTimeouts`` (Go duration strings), each above the provider's 30 minutes:

    * ``delete``: the final backup FSx takes before it deletes the file system (``skip_final_backup=False``); the
      provider waits for it (``waitFileSystemDeleted(..., d.Timeout(schema.TimeoutDelete))``), and a destroy that
      gives up there stops with the subnet, security group and VPC still standing behind the file system;
    * ``update``: a capacity increase, which the provider waits out (storage optimization, hours);
    * ``create``: a restore from a backup (``backup_id``) copies the backup back, as long as taking it;
      a new, empty file system gets 1 hour."""
    budget = f"{fsx_backup_hours(capacity_gib)}h"
    return {"create": budget if restoring else f"{FSX_TIMEOUT_BASE_HOURS}h", "update": budget, "delete": budget}



DATA_REPOSITORY_TIMEOUTS = {"create": "2h", "update": "1h", "delete": "1h"}
"""An S3 data repository association's ``customTimeouts``. The provider waits 10 minutes for each by default
(terraform-provider-aws ``internal/service/fsx/data_repository_association.go``, ``Timeouts``), while creating one with
``batch_import_meta_data_on_create`` imports the metadata of every object under the prefix first (FSx for Lustre user
guide, "Linking your file system to an Amazon S3 bucket"), and deleting one on destroy, before the file system's final
backup, takes minutes of its own: a destroy that gave up there would stop with the file system and network standing."""

def fsx_capacity_problem(key: str, gib: object) -> str | None:
    """PERSISTENT_2 SSD capacity: 1.2 TiB, 2.4 TiB or a multiple of 2.4 TiB (FSx API reference, CreateFileSystem,
    StorageCapacity: "For SSD storage ... PERSISTENT_2 ... set StorageCapacity to 1200 GiB, 2400 GiB, or increments
    of 2400 GiB")."""
    if isinstance(gib, int) and not isinstance(gib, bool) and (gib == 1200 or (gib >= 2400 and gib % 2400 == 0)):
        return None
    return f"{key}: got {gib!r}; expected 1200, or a multiple of 2400 (GiB), as FSx for Lustre PERSISTENT_2 takes"


def fsx_throughput_problem(key: str, mbps: object) -> str | None:
    if mbps in FSX_THROUGHPUTS and not isinstance(mbps, bool):
        return None
    return f"{key}: got {mbps!r}; expected one of {', '.join(map(str, FSX_THROUGHPUTS))} (MB/s per TiB, PERSISTENT_2)"


def transition_days(value: str) -> int:
    """``AFTER_30_DAYS`` -> 30."""
    return int(value.split("_")[1])


def efs_lifecycle_problems(ia: str | None, archive: str | None, primary: str | None,
                           keys: tuple[str, str, str]) -> list[str]:
    """What EFS's ``PutLifecycleConfiguration`` would refuse, naming ``keys`` (IA, Archive, primary); None: off.

    Archive comes after IA ("Managing storage lifecycle": files move to Archive from IA; the transition to Archive
    must be later than the one to IA)."""
    p = []
    for value, allowed, key in ((ia, EFS_TRANSITION_DAYS, keys[0]), (archive, EFS_TRANSITION_DAYS, keys[1]),
                                (primary, EFS_TO_PRIMARY, keys[2])):
        if value is not None and value not in allowed:
            p.append(f"{key}: got {value!r}; expected one of {', '.join(allowed)}, or none")
    if not p and archive is not None and (ia is None or transition_days(archive) <= transition_days(ia)):
        p.append(f"{keys[1]}: got {archive!r} with {keys[0]} {ia!r}; expected a transition to IA that comes first "
                 "(EFS moves files to Archive only after IA)")
    return p
