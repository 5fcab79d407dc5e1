"""Every stack-file mistake is caught by the config layer, before any resource is registered.

Each case runs the real program (``__main__.py``) under mocks through the offline plan's CLI, as a
user would: it must exit 2, name the YAML key, and leave nothing registered (``pulumi up`` would
otherwise create and bill a VPC, NAT gateway and EKS cluster before failing).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pulumi
import pytest
import yaml

from eks_ddp.config import load_stack_config
from eks_ddp.tooling import mocks as mocks_mod
from eks_ddp.tooling import plan as plan_mod
from eks_ddp.tooling.mocks import run_program
from tests.support.util import ROOT, run, set_path, stack_config

# (case id, config path, value, YAML key the message must name)
REJECTED = [
    # raised a Python traceback after resources were registered
    ("group-zone-outside-cluster-zones", "eks-ddp:network",
     {"azCount": 2, "availabilityZones": ["us-west-2a", "us-west-2b"]}, None),
    ("duplicate-zones", "eks-ddp:network", {"azCount": 2, "availabilityZones": ["us-west-2a", "us-west-2a"]},
     "network.availabilityZones[1]"),
    ("vpc-cidr-host-bits", "eks-ddp:network.vpcCidr", "10.0.0.1/16", "network.vpcCidr"),
    ("public-cidr-host-bits", "eks-ddp:cluster.publicAccessCidrs", ["1.2.3.4/24"], "cluster.publicAccessCidrs[0]"),
    ("log-retention-8", "eks-ddp:cluster.logRetentionDays", 8, "cluster.logRetentionDays"),
    # accepted, then rejected by AWS or Kubernetes (or a cluster nobody can reach)
    ("region-mars", "aws:region", "mars-west-9", "aws:region"),
    ("internet-in-two-halves", "eks-ddp:cluster.publicAccessCidrs", ["0.0.0.0/1", "128.0.0.0/1"],
     "cluster.publicAccessCidrs[0]"),
    ("internet-in-many-slash-8s", "eks-ddp:cluster.publicAccessCidrs", [f"{n}.0.0.0/8" for n in (3, 4, 5)],
     "cluster.publicAccessCidrs"),
    ("private-range-for-public-endpoint", "eks-ddp:cluster.publicAccessCidrs", ["10.0.0.0/8"],
     "cluster.publicAccessCidrs[0]"),
    ("address-without-prefix", "eks-ddp:cluster.publicAccessCidrs", ["203.0.113.10"], "cluster.publicAccessCidrs[0]"),
    ("dev-placeholder", "eks-ddp:cluster.publicAccessCidrs", ["203.0.113.10/32"], "cluster.publicAccessCidrs[0]"),
    ("p4de-placeholder", "eks-ddp:cluster.publicAccessCidrs", ["198.51.100.0/24"], "cluster.publicAccessCidrs[0]"),
    ("vpc-loopback", "eks-ddp:network.vpcCidr", "127.0.0.0/16", "network.vpcCidr"),
    ("vpc-multicast", "eks-ddp:network.vpcCidr", "224.0.0.0/16", "network.vpcCidr"),
    ("vpc-zero", "eks-ddp:network.vpcCidr", "0.0.0.0/16", "network.vpcCidr"),
    ("namespace-default", "eks-ddp:job.namespace", "default", "job.namespace"),
    ("namespace-kube-system", "eks-ddp:job.namespace", "kube-system", "job.namespace"),
    ("namespace-too-long", "eks-ddp:job.namespace", "n" * 64, "job.namespace"),
    ("absurd-batch", "eks-ddp:job.globalBatchSize", 1_000_000_000, "job.globalBatchSize"),
    ("root-volume-over-gp3-max", "eks-ddp:nodeGroups[0].rootVolumeGiB", 20000, "nodeGroups[0].rootVolumeGiB"),
    ("preflight-yes", "eks-ddp:preflight", "yes", "preflight"),
    ("vpc-cidr-ignored-with-vpc-id", "eks-ddp:network",
     {"vpcId": "vpc-0123456789abcdef0", "vpcCidr": "10.1.0.0/16", "privateSubnetIds": ["subnet-a", "subnet-b"]},
     "network.vpcCidr"),
    ("etcd-settings-ignored-with-c10d", "eks-ddp:job.rdzvBackend", "c10d", "etcd"),
    ("learning-rate-nan", "eks-ddp:job.learningRate", "nan", "job.learningRate"),
    # named the key, but not the fix: an unquoted version is a YAML number
    ("kubernetes-version-unquoted", "eks-ddp:cluster.kubernetesVersion", 1.35, "cluster.kubernetesVersion"),
]
IDS = [c[0] for c in REJECTED]


def _case_config(case_id: str, path: str, value) -> tuple[dict, str]:
    config = set_path(stack_config("dev"), path, value)
    if case_id == "group-zone-outside-cluster-zones":  # a reservation in a third zone
        config = set_path(config, "eks-ddp:nodeGroups[0].capacityReservationId", "cr-0123456789abcdef0")
        config = set_path(config, "eks-ddp:nodeGroups[0].availabilityZone", "us-west-2c")
        return config, "nodeGroups[0].availabilityZone"
    return config, ""


def _write_project(tmp_path: Path, config: dict, stack: str = "case") -> Path:
    """A project folder as a user has it: the program and one stack file holding ``config``."""
    shutil.copy(ROOT / "__main__.py", tmp_path / "__main__.py")
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return tmp_path


@pytest.fixture
def monitors(monkeypatch):
    """Every mock monitor a program run makes, to see what it registered."""
    made: list = []
    original = mocks_mod._RecordingMonitor.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(mocks_mod._RecordingMonitor, "__init__", init)
    return made


@pytest.mark.parametrize("case_id,path,value,key", REJECTED, ids=IDS)
def test_bad_stack_config_fails_naming_the_key_before_any_resource(tmp_path, capsys, monitors,
                                                                   case_id, path, value, key):
    config, derived_key = _case_config(case_id, path, value)
    key = key or derived_key
    # `pulumi up`: the program stops with the config error alone, having registered nothing.
    recorded: list = []
    with pytest.raises(pulumi.RunError) as info:
        run_program(config, region=config.get("aws:region", "us-west-2"), recorded=recorded)
    assert key in str(info.value), str(info.value)
    assert recorded == [], [r.type for r in recorded]
    if case_id.endswith("placeholder"):
        return  # the offline plan notes placeholders instead (test_plan_of_the_example_stack_notes_its_placeholder)
    # The offline plan: exit 2, the key, no traceback, nothing registered.
    project = _write_project(tmp_path, config)
    assert plan_mod.main(["--stack", "case", "--project-dir", str(project)]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err, err
    assert monitors and all(m.recorded == [] for m in monitors), [r.type for m in monitors for r in m.recorded]


def test_yaml_syntax_error_exits_2_with_file_and_line(tmp_path, capsys):
    shutil.copy(ROOT / "__main__.py", tmp_path / "__main__.py")
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    (tmp_path / "Pulumi.case.yaml").write_text("config:\n  aws:region: us-west-2\n  eks-ddp:job: {epochs: 3\n")
    assert plan_mod.main(["--stack", "case", "--project-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Pulumi.case.yaml:" in err and "not valid YAML" in err and "Traceback" not in err


def test_yaml_yes_is_a_string_as_pulumi_reads_it(tmp_path, capsys):
    """Pulumi reads stack files as YAML 1.2, where `yes` is not a boolean: the plan must agree."""
    config = stack_config("dev")
    project = _write_project(tmp_path, config)
    text = (project / "Pulumi.case.yaml").read_text().replace("eks-ddp:preflight: false", "eks-ddp:preflight: yes")
    (project / "Pulumi.case.yaml").write_text(text)
    assert plan_mod.main(["--stack", "case", "--project-dir", str(project)]) == 2
    assert "preflight: got 'yes'" in capsys.readouterr().err


def test_stack_name_must_make_a_valid_cluster_name():
    config = stack_config("dev")
    with pytest.raises(Exception) as info:
        run(config, stack="team.dev")
    assert "stack name" in str(info.value) and "pulumi stack rename" in str(info.value)


def test_reservation_zone_gets_a_subnet_when_zones_are_not_listed():
    """A group pinned to a third zone: the VPC's zones include it, so nothing fails mid-deploy."""
    config = set_path(stack_config("dev"), "eks-ddp:nodeGroups[0].capacityReservationId", "cr-0123456789abcdef0")
    config = set_path(config, "eks-ddp:nodeGroups[0].availabilityZone", "us-west-2c")
    result = run(config)
    zones = sorted(r.inputs.get("availabilityZone") for r in result.resources if r.type == "aws:ec2/subnet:Subnet")
    assert "us-west-2c" in zones and len(set(zones)) == 2


def _load(config: dict):
    config = dict(config)
    return load_stack_config({k: v for k, v in config.items() if k.startswith("eks-ddp:")},
                             region=config.get("aws:region"))


@pytest.mark.parametrize("path,text,attr,expected", [
    ("eks-ddp:job.learningRate", "0.1", "learning_rate", 0.1),
    ("eks-ddp:job.epochs", "20", "epochs", 20),
    ("eks-ddp:nodeGroups[0].rootVolumeGiB", "300", "root_volume_gib", 300),
])
def test_numbers_stored_as_strings_by_config_set_path_are_accepted(path, text, attr, expected):
    cfg = _load(set_path(stack_config("dev"), path, text))
    obj = cfg.node_groups[0] if "nodeGroups" in path else cfg.job
    assert getattr(obj, attr) == expected


def test_digit_only_run_id_stored_as_an_int_is_accepted():
    assert _load(set_path(stack_config("dev"), "eks-ddp:job.runId", 2024)).job.run_id == "2024"


def test_plan_of_the_example_stack_notes_its_placeholder(capsys):
    assert plan_mod.main(["--stack", "dev"]) == 0
    out = capsys.readouterr().out
    assert "note: `pulumi up` rejects cluster.publicAccessCidrs[0]: got '203.0.113.10/32'" in out
    assert "checkip.amazonaws.com" in out


def test_infinite_learning_rate_is_rejected():
    from eks_ddp.config import ConfigError

    with pytest.raises(ConfigError, match="job.learningRate"):
        _load(set_path(stack_config("dev"), "eks-ddp:job.learningRate", json.dumps(math.inf)))


# --- component Args: the same rules under Python field names ------------------------------------

@pytest.mark.parametrize("field,value", [
    ("epochs", 0), ("global_batch_size", -5), ("model", "resnet50"), ("learning_rate", math.nan),
    ("namespace", "Bad_NS"), ("image", "repo@sha256:..."), ("nodes", "4"), ("namespace", "kube-system"),
])
def test_elastic_job_args_reject_what_the_stack_config_rejects(field, value):
    from eks_ddp.core.workload import cifar10_workload
    from tests.workloads.test_elastic_job import run_job

    trainer = field in ("epochs", "global_batch_size", "model", "learning_rate")  # the bundled trainer's own
    with pytest.raises(ValueError, match=rf"^(.*; )?(size\.)?{field}: got "):
        run_job(workload=cifar10_workload(**{field: value})) if trainer else run_job(**{field: value})


@pytest.mark.parametrize("component,field,value", [
    ("gpu", "root_volume_gib", 20000),
    ("cluster", "log_retention_days", 8),
    ("cluster", "public_access_cidrs", ["0.0.0.0/1", "128.0.0.0/1"]),
    ("cluster", "public_access_cidrs", ["10.0.0.0/8"]),
])
def test_infrastructure_args_reject_what_the_stack_config_rejects(component, field, value):
    import dataclasses

    if component == "gpu":
        from tests.infra.test_gpu_nodegroup import BASE, _run
    else:
        from tests.infra.test_cluster import ARGS as BASE
        from tests.infra.test_cluster import _run
    with pytest.raises(ValueError, match=field):
        _run(dataclasses.replace(BASE, **{field: value}))


def test_brought_vpc_group_zone_without_a_subnet_fails_before_the_cluster():
    """A group pinned to a zone where none of the brought private subnets is: one line naming the key,
    raised after the subnets are looked up and before anything billable is registered."""
    import pulumi

    from eks_ddp.tooling.mocks import run_program

    config = set_path(stack_config("dev"), "eks-ddp:network",
                      {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-a", "subnet-b"],
                       "publicSubnetIds": ["subnet-c", "subnet-d"]})
    config = set_path(config, "eks-ddp:nodeGroups[0].capacityReservationId", "cr-0123456789abcdef0")
    config = set_path(config, "eks-ddp:nodeGroups[0].availabilityZone", "us-west-2f")
    recorded: list = []
    with pytest.raises(pulumi.RunError, match=r"nodeGroups\[0\].availabilityZone: got 'us-west-2f'"):
        run_program(config, recorded=recorded)
    assert [r.type for r in recorded if r.custom] == [], "nothing billable before the error"
