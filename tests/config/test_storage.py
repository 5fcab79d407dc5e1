"""The stack keys for storage, node storage, AMI releases and capacity-block windows: defaults, and one test per
refusal naming its key."""

from __future__ import annotations

import datetime as dt

import pytest

from eks_ddp.config import ConfigError, load_stack_config
from eks_ddp.core import k8s_versions
from tests.support.util import set_path, stack_config

TODAY = dt.date(2026, 11, 25)
CB = "cr-0123456789abcdef0"


def load(raw: dict, today: dt.date = TODAY):
    raw = dict(raw)
    region = raw.pop("aws:region")
    return load_stack_config(raw, region=region, today=today)


def problems(raw: dict, today: dt.date = TODAY) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(raw, today)
    return info.value.problems


def edit(raw: dict, **paths) -> dict:
    for path, value in paths.items():
        raw = set_path(raw, f"eks-ddp:{path}", value)
    return raw


def block(start: str = "2026-12-01T11:30:00Z", end: str = "2026-12-08T11:30:00Z", **more) -> dict:
    """The p4de example turned into a capacity-block group with a window."""
    raw = edit(stack_config("p4de"), **{"nodeGroups[0].capacityType": "capacityBlock",
                                        "nodeGroups[0].capacityBlockStart": start,
                                        "nodeGroups[0].capacityBlockEnd": end})
    return edit(raw, **more)


def test_defaults():
    cfg = load(stack_config("dev"))
    assert cfg.storage.backend == "efs"
    assert cfg.storage.efs_transitions == {"transition_to_ia": "AFTER_30_DAYS", "transition_to_archive": "AFTER_90_DAYS",
                                           "transition_to_primary_storage_class": "AFTER_1_ACCESS"}
    assert cfg.node_groups[0].local_storage == "RAID0" and cfg.node_groups[0].capacity_block_window is None
    assert cfg.cluster.ami_release_version is None


def test_fsx_backend_and_its_sizes():
    cfg = load(edit(stack_config("p4de"), **{"storage.backend": "fsxLustre", "storage.fsxStorageCapacityGiB": 4800,
                                             "storage.fsxThroughputPerTiB": 500}))
    assert (cfg.storage.backend, cfg.storage.fsx_storage_capacity_gib, cfg.storage.fsx_throughput_per_tib) == \
        ("fsxLustre", 4800, 500)
    found = problems(edit(stack_config("p4de"), **{"storage.backend": "fsxLustre", "storage.fsxStorageCapacityGiB": 2000,
                                                   "storage.fsxThroughputPerTiB": 200,
                                                   "storage.fileSystemId": "fs-0123456789abcdef0"}))
    assert any(p.startswith("storage.fsxStorageCapacityGiB: got 2000; expected 1200, or a multiple of 2400")
               for p in found), found
    assert any(p.startswith("storage.fsxThroughputPerTiB: got 200; expected one of 125, 250, 500, 1000")
               for p in found), found
    assert any(p.startswith("storage.fileSystemId: got 'fs-0123456789abcdef0' with storage.backend 'fsxLustre'")
               for p in found), found
    assert problems(edit(stack_config("dev"), **{"storage.backend": "lustre"})) == [
        "storage.backend: got 'lustre'; expected one of 'efs', 'fsxLustre'"]


def test_fsx_backup_id_restores_a_final_backup_and_is_refused_malformed_or_on_efs():
    fsx = {"storage.backend": "fsxLustre", "storage.fsxStorageCapacityGiB": 2400}
    cfg = load(edit(stack_config("p4de"), **fsx, **{"storage.fsxBackupId": "backup-0123456789abcdef0"}))
    assert cfg.storage.fsx_backup_id == "backup-0123456789abcdef0" and cfg.storage.retain_on_destroy
    assert load(edit(stack_config("p4de"), **fsx)).storage.fsx_backup_id is None
    assert problems(edit(stack_config("p4de"), **fsx, **{"storage.fsxBackupId": "fs-0123456789abcdef0"})) == [
        "storage.fsxBackupId: got 'fs-0123456789abcdef0'; expected an FSx backup id like backup-0123456789abcdef0 "
        "(aws fsx describe-backups)"]
    found = problems(edit(stack_config("dev"), **{"storage.fsxBackupId": "backup-0123456789abcdef0"}))
    assert found == ["storage.fsxBackupId: got 'backup-0123456789abcdef0' with storage.backend 'efs'; expected none "
                     "(it restores an FSx for Lustre backup; an EFS file system is adopted with storage.fileSystemId)"]


def test_efs_lifecycle_keys():
    cfg = load(edit(stack_config("dev"), **{"storage.efsTransitionToIA": "AFTER_7_DAYS",
                                            "storage.efsTransitionToArchive": "none"}))
    assert cfg.storage.efs_transitions["transition_to_ia"] == "AFTER_7_DAYS"
    assert cfg.storage.efs_transitions["transition_to_archive"] is None
    found = problems(edit(stack_config("dev"), **{"storage.efsTransitionToIA": "none"}))
    assert found == ["storage.efsTransitionToArchive: got 'AFTER_90_DAYS' with storage.efsTransitionToIA None; "
                     "expected a transition to IA that comes first (EFS moves files to Archive only after IA)"]
    assert problems(edit(stack_config("dev"), **{"storage.efsTransitionToPrimary": "AFTER_2_ACCESS"}))[0].startswith(
        "storage.efsTransitionToPrimary: got 'AFTER_2_ACCESS'; expected one of AFTER_1_ACCESS, or none")


def test_local_storage_key():
    assert load(edit(stack_config("dev"), **{"nodeGroups[0].localStorage": "none"})).node_groups[0].local_storage == \
        "none"
    assert problems(edit(stack_config("dev"), **{"nodeGroups[0].localStorage": "RAID10"})) == [
        "nodeGroups[0].localStorage: got 'RAID10'; expected one of 'RAID0', 'none'"]


def test_ami_release_version_pins_every_group_and_is_checked_against_the_kubernetes_version():
    assert load(edit(stack_config("dev"), **{"cluster.amiReleaseVersion": "1.35.6-20260714"})).cluster \
        .ami_release_version == "1.35.6-20260714"
    found = problems(edit(stack_config("dev"), **{"cluster.amiReleaseVersion": "1.34.9-20260714"}))
    assert found == ["cluster.amiReleaseVersion: got '1.34.9-20260714'; expected an EKS AMI release version of "
                     "Kubernetes 1.35, <1.35.patch>-<yyyymmdd>, e.g. " + k8s_versions.AMI_RELEASE_VERSIONS["1.35"]]


def test_every_supported_version_has_a_dated_ami_pin():
    assert set(k8s_versions.AMI_RELEASE_VERSIONS) == set(k8s_versions.SUPPORTED_VERSIONS)
    date = k8s_versions.AMI_RELEASE_DATE.replace("-", "")
    for version, release in k8s_versions.AMI_RELEASE_VERSIONS.items():
        assert k8s_versions.ami_release_problem("x", release, version) is None
        assert release.endswith(date), (version, release)
    assert k8s_versions.ami_release_problem("x", "1.35.6", "1.35")  # negative control: no build date


def test_a_capacity_block_window_is_read_and_checked():
    cfg = load(block(**{"job.state": "cancelled"}))
    start, end = cfg.node_groups[0].capacity_block_window
    assert start == dt.datetime(2026, 12, 1, 11, 30, tzinfo=dt.UTC) and end - start == dt.timedelta(days=7)
    assert "nodeGroups[0].capacityBlockEnd: got '2026-12-01T11:30:00Z'; expected a time after capacityBlockStart" \
        in problems(block(end="2026-12-01T11:30:00Z"))[0]
    assert problems(block(start="tomorrow", **{"job.state": "cancelled"})) == [
        "nodeGroups[0].capacityBlockStart: got 'tomorrow'; expected a UTC time such as 2026-12-01T11:30:00Z"]
    assert problems(block(start="2026-12-01T11:30:00+02:00", **{"job.state": "cancelled"}))[0].startswith(
        "nodeGroups[0].capacityBlockStart: got '2026-12-01T11:30:00+02:00'; expected a UTC time")
    onDemand = edit(block(), **{"nodeGroups[0].capacityType": "onDemand"})
    assert problems(onDemand)[0].startswith("nodeGroups[0].capacityBlockStart: set with capacityType 'onDemand'")


def test_no_run_asks_for_a_blocks_nodes_before_it_starts_and_none_after_it_ends():
    found = problems(block(**{"nodeGroups[0].desiredSize": 1}))
    assert "nodeGroups[0].desiredSize: got 1 before the block starts (2026-12-01T11:30:00Z); expected 0: no node " \
           "can launch before then" in found
    assert any(p.startswith("job.state: 'run' on group 'a100', whose capacity block starts at 2026-12-01T11:30:00Z; "
                            "expected 'cancelled' until then") for p in found), found
    # Inside the window the run may go; after it, the window is refused.
    assert load(block(), today=dt.date(2026, 12, 3)).job.state == "run"
    assert problems(block(), today=dt.date(2026, 12, 9)) == [
        "nodeGroups[0].capacityBlockEnd: the block ended at 2026-12-08T11:30:00Z; expected the window of a block "
        "that has not ended (set the new block's capacityReservationId, start and end)"]


def test_a_multi_node_run_on_an_efa_type_with_efa_off_is_warned():
    """Review mistake 30: 16 x p4de with efa false planned without a word. Valid (a user may want TCP), so a warning
    (pulumi up and the plan print the config's warnings), naming the key, the type and the run."""
    raw = edit(stack_config("p4de"), **{"nodeGroups[0].efa": False})
    [warning] = [w for w in load(raw).warnings if ".efa:" in w]
    assert warning.startswith("nodeGroups[0].efa: false on p4de.24xlarge, which has 4 EFA interface(s), while job "
                              "trains on 2 nodes"), warning
    assert "expected efa: true for a multi-node run" in warning
    assert not [w for w in load(stack_config("p4de")).warnings if ".efa:" in w]  # efa on: nothing to say
    one = edit(raw, **{"job.nodes": 1, "job.minNodes": 1})
    assert not [w for w in load(one).warnings if ".efa:" in w]  # one node: no traffic between nodes


def test_fsx_with_a_runs_group_pinned_to_another_zone_is_warned():
    """Review mistake 5: FSx for Lustre is made in one subnet (the first run's group's zone); a run whose group is
    pinned to another zone mounts it across zones."""
    raw = edit(stack_config("p4de"), **{"storage.backend": "fsxLustre", "storage.fsxStorageCapacityGiB": 2400})
    raw["eks-ddp:nodeGroups"] = [*raw["eks-ddp:nodeGroups"], {"name": "b", "instanceType": "g5.12xlarge", "minSize": 0,
                                                            "maxSize": 2, "availabilityZone": "us-east-1b"}]
    job = {k: v for k, v in raw.pop("eks-ddp:job").items()}
    runs = [job, {"runId": "second", "nodeGroup": "b", "nodes": 2}]
    cfg = load({**raw, "eks-ddp:runs": runs})
    [warning] = [w for w in cfg.warnings if w.startswith("storage.backend")]
    assert warning.startswith("storage.backend: fsxLustre lives in one subnet, in us-east-1a (the group of runs[0]); "
                              "runs[1]'s group 'b' is pinned to us-east-1b"), warning
    same = set_path({**raw, "eks-ddp:runs": runs}, "eks-ddp:nodeGroups[1].availabilityZone", "us-east-1a")
    assert not [w for w in load(same).warnings if w.startswith("storage.backend")]
    efs = {**edit(raw, **{"storage.backend": "efs"}), "eks-ddp:runs": runs}
    efs.pop("eks-ddp:storage", None)
    assert not [w for w in load(efs).warnings if w.startswith("storage.backend")]
