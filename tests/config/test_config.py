"""Stack config schema: every rejection names the key, the bad value and what is allowed."""

from __future__ import annotations

import pytest

from eks_ddp.config import ConfigError, load_stack_config
from eks_ddp.core import catalog
from tests.support.util import drop_path, set_path, stack_config


def load(cfg: dict):
    cfg = dict(cfg)
    region = cfg.pop("aws:region", None)
    return load_stack_config(cfg, region=region)


def rejects(cfg: dict, *fragments: str) -> str:
    """Assert ``cfg`` is rejected with one message containing every fragment; return it."""
    with pytest.raises(ConfigError) as info:
        load(cfg)
    matching = [p for p in info.value.problems if all(f in p for f in fragments)]
    assert matching, f"no problem mentions {fragments}: {info.value.problems}"
    return matching[0]


@pytest.fixture
def dev():
    return stack_config("dev")


def test_example_stacks_are_valid():
    dev = load(stack_config("dev"))
    assert [g.instance_type for g in dev.node_groups] == ["g4dn.xlarge"]
    assert dev.job.nodes == 2 and dev.job_group.max_size == 2 and dev.job_group.desired_size == 0
    p4de = load(stack_config("p4de"))
    assert p4de.job_group.efa and p4de.job_group.capacity_reservation_id


def test_defaults_fill_missing_keys(dev):
    cfg = load(drop_path(dev, "eks-ddp:job.epochs"))
    assert cfg.job.epochs == 10
    assert load({"aws:region": "us-west-2", "eks-ddp:cluster": {"publicAccessCidrs": ["1.2.3.4/32"]},
                 "eks-ddp:nodeGroups": [{"name": "gpu", "instanceType": "g5.xlarge"}]}).job.nodes == 2


@pytest.mark.parametrize("path,key", [
    ("eks-ddp:job.nodes", "job.nodes"),
    ("eks-ddp:job.epochs", "job.epochs"),
    ("eks-ddp:job.globalBatchSize", "job.globalBatchSize"),
    ("eks-ddp:nodeGroups[0].maxSize", "nodeGroups[0].maxSize"),
    ("eks-ddp:cluster.systemNodeCount", "cluster.systemNodeCount"),
])
@pytest.mark.parametrize("bad", [0, -1])
def test_zero_or_negative_counts(dev, path, key, bad):
    rejects(set_path(dev, path, bad), key, f"got {bad}", ">= 1")


def test_negative_min_size(dev):
    rejects(set_path(dev, "eks-ddp:nodeGroups[0].minSize", -1), "nodeGroups[0].minSize", "got -1", ">= 0")


def test_group_min_greater_than_max(dev):
    cfg = set_path(set_path(dev, "eks-ddp:nodeGroups[0].minSize", 3), "eks-ddp:nodeGroups[0].maxSize", 2)
    cfg = set_path(cfg, "eks-ddp:job.nodes", 1)
    rejects(cfg, "nodeGroups[0].minSize", "got 3", "<= maxSize (2)")


def test_job_min_nodes_greater_than_nodes(dev):
    rejects(set_path(dev, "eks-ddp:job.minNodes", 3), "job.minNodes", "got 3", "<= job.nodes (2)")


@pytest.mark.parametrize("desired", [3, -1])
def test_desired_outside_min_max(dev, desired):
    cfg = set_path(dev, "eks-ddp:nodeGroups[0].minSize", 0)
    rejects(set_path(cfg, "eks-ddp:nodeGroups[0].desiredSize", desired), "nodeGroups[0].desiredSize",
            f"got {desired}", "between minSize (0) and maxSize (2)")


def test_more_job_nodes_than_group_can_hold(dev):
    rejects(set_path(dev, "eks-ddp:job.nodes", 3), "job.nodes", "got 3", "maxSize", "'gpu' (2)")


def test_unknown_instance_type(dev):
    msg = rejects(set_path(dev, "eks-ddp:nodeGroups[0].instanceType", "g4dn.huge"),
                  "nodeGroups[0].instanceType", "'g4dn.huge'")
    assert "g4dn.xlarge" in msg and "p4de.24xlarge" in msg  # lists what is allowed


def test_cpu_type_is_not_a_gpu_group(dev):
    rejects(set_path(dev, "eks-ddp:nodeGroups[0].instanceType", "m6i.large"), "nodeGroups[0].instanceType",
            "'m6i.large'", "GPU type")


def test_efa_on_type_without_efa(dev):
    msg = rejects(set_path(dev, "eks-ddp:nodeGroups[0].efa", True), "nodeGroups[0].efa", "'g4dn.xlarge'",
                  "no EFA")
    assert "p4de.24xlarge" in msg


def test_capacity_reservation_without_zone(dev):
    cfg = set_path(dev, "eks-ddp:nodeGroups[0].capacityReservationId", "cr-0123456789abcdef0")
    rejects(cfg, "nodeGroups[0].availabilityZone", "required with capacityReservationId", "cr-0123456789abcdef0")


def test_capacity_block_needs_reservation(dev):
    rejects(set_path(dev, "eks-ddp:nodeGroups[0].capacityType", "capacityBlock"),
            "nodeGroups[0].capacityReservationId", "required with capacityType 'capacityBlock'")


def test_placement_group_with_capacity_block(dev):
    cfg = set_path(dev, "eks-ddp:nodeGroups[0].capacityType", "capacityBlock")
    cfg = set_path(cfg, "eks-ddp:nodeGroups[0].capacityReservationId", "cr-0123456789abcdef0")
    cfg = set_path(cfg, "eks-ddp:nodeGroups[0].availabilityZone", "us-west-2a")
    rejects(set_path(cfg, "eks-ddp:nodeGroups[0].placementGroupName", "a100-cpg"),
            "nodeGroups[0].placementGroupName", "'a100-cpg'", "capacity block is already co-located")


def test_placement_group_name_shape(dev):
    rejects(set_path(dev, "eks-ddp:nodeGroups[0].placementGroupName", "my group"),
            "nodeGroups[0].placementGroupName", "'my group'", "no spaces")


def test_spot_with_reservation(dev):
    cfg = set_path(dev, "eks-ddp:nodeGroups[0].capacityReservationId", "cr-0123456789abcdef0")
    cfg = set_path(cfg, "eks-ddp:nodeGroups[0].availabilityZone", "us-west-2a")
    rejects(set_path(cfg, "eks-ddp:nodeGroups[0].capacityType", "spot"), "nodeGroups[0].capacityType", "'spot'")


def test_zone_of_another_region(dev):
    cfg = set_path(dev, "eks-ddp:nodeGroups[0].availabilityZone", "eu-west-1a")
    rejects(cfg, "nodeGroups[0].availabilityZone", "'eu-west-1a'", "'us-west-2'")


def test_missing_required_public_access_cidrs(dev):
    rejects(drop_path(dev, "eks-ddp:cluster.publicAccessCidrs"), "cluster.publicAccessCidrs", "required")


def test_bad_cidr(dev):
    rejects(set_path(dev, "eks-ddp:cluster.publicAccessCidrs", ["300.1.1.1/32"]), "cluster.publicAccessCidrs[0]",
            "'300.1.1.1/32'")


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0"])
def test_world_open_api_endpoint(dev, cidr):
    rejects(set_path(dev, "eks-ddp:cluster.publicAccessCidrs", [cidr]), "cluster.publicAccessCidrs[0]",
            repr(cidr), "whole internet")


@pytest.mark.parametrize("cidrs, key", [(["18.0.0.0/12"], "cluster.publicAccessCidrs[0]"),
                                         ([f"18.{n}.0.0/17" for n in range(0, 256, 128)] + ["19.0.0.0/24"],
                                          "cluster.publicAccessCidrs")])
def test_an_api_endpoint_open_wider_than_a_slash_16_is_refused(dev, cidrs, key):
    rejects(set_path(dev, "eks-ddp:cluster.publicAccessCidrs", cidrs), key, "/16")
    load(set_path(dev, "eks-ddp:cluster.publicAccessCidrs", ["18.0.0.0/16"]))  # control: a /16 is accepted


def test_viewer_principals_are_checked_and_one_principal_has_one_entry(dev):
    arn = "arn:aws:iam::123456789012:role/ml-team"
    rejects(set_path(dev, "eks-ddp:cluster.viewerPrincipalArns", ["bob"]), "cluster.viewerPrincipalArns[0]: got 'bob'",
            "an IAM role or user ARN")
    both = set_path(set_path(dev, "eks-ddp:cluster.adminPrincipalArns", [arn]), "eks-ddp:cluster.viewerPrincipalArns",
                    [arn])
    rejects(both, "cluster.viewerPrincipalArns[0]", "a second time", "one EKS access entry each")
    assert load(set_path(dev, "eks-ddp:cluster.viewerPrincipalArns", [arn])).cluster.viewer_principal_arns == (arn,)


def test_missing_region(dev):
    cfg = dict(dev)
    del cfg["aws:region"]
    rejects(cfg, "aws:region", "required")


def test_duplicate_group_names(dev):
    groups = dev["eks-ddp:nodeGroups"] * 2
    rejects(set_path(dev, "eks-ddp:nodeGroups", groups), "nodeGroups[1].name", "'gpu'", "not used by another")


def test_job_on_unknown_group(dev):
    rejects(set_path(dev, "eks-ddp:job.nodeGroup", "a100"), "job.nodeGroup", "'a100'", "gpu")


def test_prebuilt_image_must_be_pinned_by_digest(dev):
    rejects(set_path(dev, "eks-ddp:image", {"prebuilt": "trainer:latest"}), "image.prebuilt", "'trainer:latest'",
            "digest")


def test_etcd_replicas(dev):
    rejects(set_path(dev, "eks-ddp:etcd.replicas", 2), "etcd.replicas", "got 2", "expected 1")
    rejects(set_path(dev, "eks-ddp:etcd.replicas", 3), "etcd.replicas", "got 3", "expected 1")


def test_fault_budget_and_deadline_of_the_training_job(dev):
    cfg = load(dev)
    assert cfg.job.fault_budget >= 20 and cfg.job.active_deadline_hours > 0
    assert load(set_path(dev, "eks-ddp:job.faultBudget", 50)).job.fault_budget == 50
    assert load(set_path(dev, "eks-ddp:job.activeDeadlineHours", 1.5)).job.active_deadline_hours == 1.5
    rejects(set_path(dev, "eks-ddp:job.faultBudget", -1), "job.faultBudget", "got -1")
    rejects(set_path(dev, "eks-ddp:job.activeDeadlineHours", 0), "job.activeDeadlineHours", "got 0")


def test_unsupported_kubernetes_version(dev):
    rejects(set_path(dev, "eks-ddp:cluster.kubernetesVersion", "1.20"), "cluster.kubernetesVersion", "'1.20'")


def test_all_problems_reported_together(dev):
    cfg = set_path(set_path(dev, "eks-ddp:job.epochs", 0), "eks-ddp:nodeGroups[0].instanceType", "x1.huge")
    with pytest.raises(ConfigError) as info:
        load(cfg)
    text = str(info.value)
    assert "job.epochs" in text and "nodeGroups[0].instanceType" in text


def test_catalog_drives_efa_and_gpus():
    assert catalog.lookup("p4de.24xlarge").efa_interfaces == 4
    assert catalog.lookup("p5.48xlarge").efa_interfaces == 32
    assert catalog.lookup("g4dn.xlarge").efa_interfaces == 0
    assert catalog.lookup("g4dn.metal").gpus == 8
    assert catalog.lookup("g4dn.12xlarge").quota_class == "G"
    assert catalog.lookup("p4d.24xlarge").quota_class == "P"
    with pytest.raises(KeyError, match="g4dn.xlarge"):
        catalog.lookup("nope.large")


@pytest.mark.parametrize("value", ["10m", "90s", "1h30m", "24h"])
def test_scale_down_time_accepts_durations(value):
    cfg = load(set_path(stack_config("dev"), "eks-ddp:cluster.scaleDownUnneededTime", value))
    assert cfg.cluster.scale_down_unneeded_time == value


@pytest.mark.parametrize("value", ["", "10", "ten minutes", "0m", "25h", "-5m"])
def test_scale_down_time_rejects_non_durations(value):
    with pytest.raises(ConfigError, match=r"cluster\.scaleDownUnneededTime: got"):
        load(set_path(stack_config("dev"), "eks-ddp:cluster.scaleDownUnneededTime", value))


def test_standard_rejected_past_standard_support():
    """EKS takes upgradePolicy STANDARD only for a version in standard support (day 2026-11-24: 1.33 left it
    on 2026-07-29); the message names both keys, the date and what is allowed. EXTENDED, or a version in standard
    support, loads; a version past extended support is refused whatever the policy."""
    import datetime as dt

    day = dt.date(2026, 11, 24)

    def load(version, policy=None, today=day):
        raw = set_path(stack_config("dev"), "eks-ddp:cluster.kubernetesVersion", version)
        if policy:
            raw = set_path(raw, "eks-ddp:cluster.upgradePolicy", policy)
        return load_stack_config({k: v for k, v in raw.items() if k.startswith("eks-ddp:")},
                                 region=raw["aws:region"], today=today)

    with pytest.raises(ConfigError) as e:
        load("1.33")
    text = str(e.value)
    assert "cluster.upgradePolicy: got 'STANDARD'" in text and "'1.33'" in text and "2026-07-29" in text
    assert "1.35" in text and "1.36" in text and "EXTENDED" in text
    assert load("1.33", "EXTENDED").cluster.upgrade_policy == "EXTENDED"
    for version in ("1.34", "1.35", "1.36"):  # in standard support on that day
        assert load(version).cluster.kubernetes_version == version
    with pytest.raises(ConfigError, match="1.34.*left EKS standard support on 2026-12-02"):
        load("1.34", today=dt.date(2026, 12, 3))
    with pytest.raises(ConfigError, match="extended support for it ended on 2027-03-23"):
        load("1.32", "EXTENDED", today=dt.date(2027, 3, 24))


def test_spot_alternates_not_smaller():
    """The pod is sized from instanceType and the autoscaler simulates the first type; an alternate with fewer
    vCPUs or less memory would be launched for a pod it cannot hold. Larger alternates stay allowed."""
    dev = stack_config("dev")
    raw = set_path(dev, "eks-ddp:nodeGroups[0].capacityType", "spot")
    raw = set_path(raw, "eks-ddp:nodeGroups[0].instanceType", "g4dn.2xlarge")
    smaller = set_path(raw, "eks-ddp:nodeGroups[0].spotInstanceTypes", ["g4dn.4xlarge", "g4dn.xlarge"])
    msg = rejects(smaller, "nodeGroups[0].spotInstanceTypes[1]", "'g4dn.xlarge'")
    assert "4 vCPUs, 16 GiB" in msg and "8 vCPUs and 32 GiB" in msg and "g4dn.2xlarge" in msg
    assert not [p for p in _problems(smaller) if "spotInstanceTypes[0]" in p]
    load(set_path(raw, "eks-ddp:nodeGroups[0].spotInstanceTypes", ["g4dn.4xlarge", "g4dn.8xlarge"]))


def _problems(cfg: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(cfg)
    return info.value.problems


def test_results_kms_key_arn_needs_the_bucket_and_an_arn(dev):
    key = "arn:aws:kms:us-west-2:123456789012:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    rejects(set_path(dev, "eks-ddp:storage.resultsKmsKeyArn", key), "storage.resultsKmsKeyArn",
            "only with storage.resultsBucket")
    with_bucket = set_path(dev, "eks-ddp:storage.resultsBucket", "results-kept-1234")
    rejects(set_path(with_bucket, "eks-ddp:storage.resultsKmsKeyArn", "alias/results"), "storage.resultsKmsKeyArn",
            "'alias/results'", "the ARN of a KMS key")
    assert load(set_path(with_bucket, "eks-ddp:storage.resultsKmsKeyArn", key)).storage.results_kms_key_arn == key


def test_s3_endpoint_extra_buckets_are_bucket_names(dev):
    bad = ["data-lake", "s3://data-lake/x/", "Bad_Name"]
    for i in (1, 2):
        rejects(set_path(dev, "eks-ddp:network.s3EndpointExtraBuckets", bad), f"network.s3EndpointExtraBuckets[{i}]",
                repr(bad[i]), "an S3 bucket name")
    assert load(set_path(dev, "eks-ddp:network.s3EndpointExtraBuckets", bad[:1])).network.s3_endpoint_extra_buckets \
        == ("data-lake",)
    byo = {"vpcId": "vpc-1", "privateSubnetIds": ["subnet-a", "subnet-b"], "s3EndpointExtraBuckets": ["data-lake"]}
    rejects(set_path(dev, "eks-ddp:network", byo), "network.s3EndpointExtraBuckets", "network.vpcId")


def test_rdzv_backend_etcd_v2_reads_as_etcd_with_a_warning_naming_the_key(dev):
    """The store speaks etcd's v3 API, so the value is ``etcd``; ``etcd-v2``, its old name, still reads for one
    release, with a warning naming the key, the value and what to write instead. ``etcd`` reads without one."""
    plain = load(set_path(dev, "eks-ddp:job.rdzvBackend", "etcd"))
    assert plain.job.rdzv_backend == "etcd" and plain.uses_etcd and plain.warnings == ()
    old = load(set_path(dev, "eks-ddp:job.rdzvBackend", "etcd-v2"))
    assert old.job.rdzv_backend == "etcd" and old.uses_etcd
    assert len(old.warnings) == 1 and old.warnings[0].startswith("job.rdzvBackend: got 'etcd-v2'")
    assert "expected 'etcd'" in old.warnings[0]
    runs = {k: v for k, v in dev.items() if k != "eks-ddp:job"}
    runs["eks-ddp:runs"] = [{"runId": "a", "rdzvBackend": "c10d"}, {"runId": "b", "rdzvBackend": "etcd-v2"}]
    cfg = load(runs)
    assert [r.rdzv_backend for r in cfg.runs] == ["c10d", "etcd"]
    assert [w.split(":")[0] for w in cfg.warnings] == ["runs[1].rdzvBackend"]
    rejects(set_path(dev, "eks-ddp:job.rdzvBackend", "etcd-v3"), "job.rdzvBackend: got 'etcd-v3'",
            "one of 'etcd', 'c10d'")


def test_the_program_logs_the_etcd_v2_warning_and_builds_the_same_stack(monkeypatch):
    """The program says the deprecation as a Pulumi warning; the value changes no resource (the URN snapshot's
    dev stack now writes etcd)."""
    import pulumi

    from tests.support.util import run

    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: said.append(message))
    new = run(stack_config("dev"))
    assert not [m for m in said if "rdzvBackend" in m]
    old = run(set_path(stack_config("dev"), "eks-ddp:job.rdzvBackend", "etcd-v2"))
    assert [m for m in said if m.startswith("job.rdzvBackend: got 'etcd-v2'")]
    assert len(new.resources) > 10 and sorted(r.urn for r in old.resources) == sorted(r.urn for r in new.resources)


def test_min_above_max_is_one_error_not_also_one_about_a_desired_size_never_set(dev):
    """Review mistake 16: minSize 3, maxSize 2 also said 'desiredSize: got 0; expected between minSize (3) and maxSize
    (2)' about a key the user never set; the minSize error is the one to fix. A desiredSize outside a valid range
    is still refused (test_desired_outside_min_max)."""
    cfg = set_path(set_path(dev, "eks-ddp:nodeGroups[0].minSize", 3), "eks-ddp:nodeGroups[0].maxSize", 2)
    with pytest.raises(ConfigError) as info:
        load(set_path(cfg, "eks-ddp:job.nodes", 1))
    assert [p for p in info.value.problems if "nodeGroups[0]." in p] == [
        "nodeGroups[0].minSize: got 3; expected <= maxSize (2)"], info.value.problems


def test_a_graviton_system_type_says_why_it_is_refused(dev):
    """Review mistake 28: m7g.large was refused without the reason (arm64); an unknown x86_64 type keeps the list."""
    msg = rejects(set_path(dev, "eks-ddp:cluster.systemInstanceType", "m7g.large"), "cluster.systemInstanceType",
                  "got 'm7g.large', a Graviton (arm64) type; expected an x86_64 type")
    assert "AL2023_x86_64_STANDARD" in msg
    other = rejects(set_path(dev, "eks-ddp:cluster.systemInstanceType", "m9.large"), "cluster.systemInstanceType")
    assert "Graviton" not in other and "describe it under eks-ddp:catalog" in other
