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
