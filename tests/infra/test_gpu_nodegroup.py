"""GpuNodeGroup under mocks: launch template policy, EFA wiring, zones, capacity types, validation."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pytest

from eks_ddp.core import catalog
from eks_ddp.infra.gpu_nodegroup import MEMLOCK_BYTES, GpuNodeGroup, GpuNodeGroupArgs, efa_device_index
from eks_ddp.tooling.mocks import run_program
from tests.support.nodeadm_roundtrip import (
    go_decode_integer,
    merged_base_runtime_spec,
    node_configs,
    numbers,
    through_float64,
)

LT = "aws:ec2/launchTemplate:LaunchTemplate"
NG = "aws:eks/nodeGroup:NodeGroup"
SG = "aws:ec2/securityGroup:SecurityGroup"
PG = "aws:ec2/placementGroup:PlacementGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
PARENT = "eks-ddp:gpu_nodegroup:GpuNodeGroup"

BASE = GpuNodeGroupArgs(
    group_name="gpu",
    cluster_name="eks-ddp-test",
    node_role_arn="arn:aws:iam::123456789012:role/node",
    subnet_ids=["subnet-a", "subnet-b"],
    subnet_by_az={"us-west-2a": "subnet-a", "us-west-2b": "subnet-b"},
    node_security_group_id="sg-node",
    cluster_security_group_id="sg-cluster",
    vpc_id="vpc-123",
    instance_type="g4dn.xlarge",
    min_size=0,
    desired_size=2,
    max_size=2,
    root_volume_gib=200,
)
EFA = dataclasses.replace(BASE, group_name="a100", instance_type="p4de.24xlarge", efa=True,
                          capacity_reservation_id="cr-0123456789abcdef0", availability_zone="us-west-2b",
                          root_volume_gib=500)


def _run(args: GpuNodeGroupArgs):
    holder = {}

    def program():
        g = GpuNodeGroup(f"gpu-{args.group_name}", args)
        holder["g"] = g
        pulumi.export("name", g.node_group_name)

    return run_program({}, program=program), holder["g"]


def test_g4dn_group_imdsv2_gp3_encrypted_no_efa():
    result, group = _run(BASE)
    lt = result.one(LT).inputs
    assert lt["metadataOptions"]["httpTokens"] == "required"
    assert int(lt["metadataOptions"]["httpPutResponseHopLimit"]) == 1
    ebs = lt["blockDeviceMappings"][0]["ebs"]
    assert ebs == {"volumeSize": 200.0, "volumeType": "gp3", "encrypted": "true", "deleteOnTermination": "true"}
    assert "networkInterfaces" not in lt
    assert sorted(lt["vpcSecurityGroupIds"]) == ["sg-cluster", "sg-node"]
    assert not result.of_type(PG)
    assert not result.of_type(SG)
    ng = result.one(NG).inputs
    assert ng["amiType"] == "AL2023_x86_64_NVIDIA"
    assert ng["subnetIds"] == ["subnet-a", "subnet-b"]
    assert ng["instanceTypes"] == ["g4dn.xlarge"]
    assert ng["capacityType"] == "ON_DEMAND"
    assert result.outputs["name"]
    assert group.zone is None


def test_labels_taint_and_scale_to_zero():
    result, group = _run(BASE)
    ng = result.one(NG)
    assert ng.inputs["labels"] == {"eks-ddp/node-group": "gpu", "eks-ddp/pool": "gpu",
                                   "eks-ddp/instance-type": "g4dn.xlarge", "k8s.amazonaws.com/accelerator": "nvidia-t4"}
    # The job selects on the group's own labels; the accelerator label is for the cluster autoscaler.
    assert group.node_labels.items() <= ng.inputs["labels"].items()
    assert ng.inputs["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    scaling = ng.inputs["scalingConfig"]
    assert (int(scaling["minSize"]), int(scaling["desiredSize"]), int(scaling["maxSize"])) == (0, 2, 2)
    assert ng.ignore_changes == ["scalingConfig.desiredSize"]


def test_p4de_efa_interfaces_single_zone_no_public_ip_flag():
    result, group = _run(EFA)
    lt = result.one(LT).inputs
    nics = lt["networkInterfaces"]
    assert len(nics) == catalog.lookup("p4de.24xlarge").efa_interfaces == 4
    assert [int(n["networkCardIndex"]) for n in nics] == [0, 1, 2, 3]
    assert [int(n["deviceIndex"]) for n in nics] == [0, 1, 1, 1]
    assert all(n["interfaceType"] == "efa" for n in nics)
    efa_sg = result.one(SG)
    for n in nics:
        assert sorted(n["securityGroups"]) == sorted(["sg-cluster", "sg-node", efa_sg.outputs["id"]])
        # Review A-m1: EC2 rejects AssociatePublicIpAddress on multi-interface launches; leave it out.
        assert "associatePublicIpAddress" not in n
    # Groups on the interfaces, never at the top level alongside them.
    assert "vpcSecurityGroupIds" not in lt
    assert result.one(NG).inputs["subnetIds"] == ["subnet-b"]
    assert group.zone == "us-west-2b"


def test_efa_without_reservation_gets_a_new_cluster_placement_group():
    result, _ = _run(dataclasses.replace(EFA, capacity_reservation_id=None))
    pg = result.one(PG)
    assert pg.inputs["strategy"] == "cluster"
    assert result.one(LT).inputs["placement"] == {"groupName": pg.outputs["name"], "availabilityZone": "us-west-2b"}


def test_reservation_uses_its_own_placement_group_and_creates_none():
    # Review A-M2: a new group can never be the one the reservation was created in.
    result, _ = _run(EFA)
    assert not result.of_type(PG)
    assert result.one(LT).inputs["placement"] == {"availabilityZone": "us-west-2b"}
    result, _ = _run(dataclasses.replace(EFA, placement_group_name="a100-cpg"))
    assert not result.of_type(PG)
    assert result.one(LT).inputs["placement"] == {"groupName": "a100-cpg", "availabilityZone": "us-west-2b"}


def test_capacity_block_gets_no_placement_group():
    # Review A-m14: blocks are already co-located; a placement group is refused.
    result, _ = _run(dataclasses.replace(EFA, capacity_type="capacityBlock"))
    assert not result.of_type(PG)
    assert "groupName" not in result.one(LT).inputs["placement"]
    with pytest.raises(ValueError, match="^placement_group_name"):
        _run(dataclasses.replace(EFA, capacity_type="capacityBlock", placement_group_name="a100-cpg"))


@pytest.mark.parametrize("change,strategy", [
    ({}, "MINIMAL"),  # on-demand capacity reservation
    ({"capacity_type": "capacityBlock"}, "MINIMAL"),
    ({"capacity_reservation_id": None}, "DEFAULT"),
])
def test_reserved_groups_update_without_surge(change, strategy):
    # Review A-M10: a full reservation has no room for the surge nodes of the DEFAULT strategy.
    result, _ = _run(dataclasses.replace(EFA, **change))
    assert result.one(NG).inputs["updateConfig"] == {"maxUnavailable": 1, "updateStrategy": strategy}


def test_efa_security_group_admits_and_reaches_only_itself():
    result, _ = _run(EFA)
    sg_id = result.one(SG).outputs["id"]
    ingress = result.one(INGRESS).inputs
    egress = result.one(EGRESS).inputs
    for rule in (ingress, egress):
        assert rule["securityGroupId"] == sg_id
        assert rule["referencedSecurityGroupId"] == sg_id
        assert rule["ipProtocol"] == "-1"
        assert "cidrIpv4" not in rule and "cidrIpv6" not in rule


def test_efa_without_zone_uses_the_first_private_subnets_zone():
    args = dataclasses.replace(EFA, capacity_reservation_id=None, availability_zone=None)
    result, group = _run(args)
    assert group.zone == "us-west-2a"
    assert result.one(NG).inputs["subnetIds"] == ["subnet-a"]


def test_capacity_reservation_is_targeted():
    result, _ = _run(EFA)
    lt = result.one(LT).inputs
    assert lt["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0123456789abcdef0"}}
    assert "instanceMarketOptions" not in lt


def test_capacity_block_sets_market_type_and_instance_type_in_template():
    args = dataclasses.replace(EFA, capacity_type="capacityBlock")
    result, _ = _run(args)
    lt = result.one(LT).inputs
    assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert lt["instanceType"] == "p4de.24xlarge"
    assert lt["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"] \
        == "cr-0123456789abcdef0"
    ng = result.one(NG).inputs
    assert ng["capacityType"] == "CAPACITY_BLOCK"
    assert "instanceTypes" not in ng


def test_spot_capacity_type():
    result, _ = _run(dataclasses.replace(BASE, capacity_type="spot"))
    assert result.one(NG).inputs["capacityType"] == "SPOT"


def test_p5_gets_32_efa_interfaces():
    result, _ = _run(dataclasses.replace(EFA, instance_type="p5.48xlarge", capacity_reservation_id=None))
    nics = result.one(LT).inputs["networkInterfaces"]
    assert len(nics) == 32
    assert [int(n["deviceIndex"]) for n in nics] == [efa_device_index(i) for i in range(32)]
    # Review A-m11: EFA-only interfaces (no IP address) on the non-primary cards.
    assert [n["interfaceType"] for n in nics] == ["efa"] + ["efa-only"] * 31


def test_every_child_has_the_group_as_parent():
    result, _ = _run(dataclasses.replace(EFA, capacity_reservation_id=None))
    children = [r for r in result.resources if r.type != PARENT]
    assert {r.type for r in children} >= {LT, NG, SG, PG, INGRESS, EGRESS}
    for r in children:
        assert r.parent_type == PARENT, r.urn


@pytest.mark.parametrize("change,field", [
    ({"efa": True}, "efa"),  # g4dn.xlarge has no EFA
    ({"instance_type": "t3.large"}, "instance_type"),
    ({"instance_type": "x9.huge"}, "instance_type"),
    ({"min_size": 3, "desired_size": 3}, "min_size"),
    ({"desired_size": 5}, "desired_size"),
    ({"max_size": 0, "desired_size": 0}, "max_size"),
    ({"capacity_type": "capacityBlock"}, "capacity_reservation_id"),
    ({"capacity_type": "reserved"}, "capacity_type"),
    ({"capacity_reservation_id": "cr-0123456789abcdef0"}, "availability_zone"),
    ({"capacity_type": "spot", "capacity_reservation_id": "cr-0123456789abcdef0",
      "availability_zone": "us-west-2a"}, "capacity_type"),
    ({"availability_zone": "us-west-2z"}, "availability_zone"),
    ({"root_volume_gib": 20}, "root_volume_gib"),
    ({"subnet_ids": []}, "subnet_ids"),
    ({"instance_type": "p4d.24xlarge", "efa": True, "vpc_id": None}, "vpc_id"),
])
def test_validation_names_the_field(change, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        _run(dataclasses.replace(BASE, **change))


def _rlimits(spec_json: str) -> dict[str, dict[str, int]]:
    """containerd's view of the merged spec: rlimit values decoded as Go uint64."""
    out = {}
    for lit_r in json.loads(spec_json, parse_int=str, parse_float=str)["process"]["rlimits"]:
        out[lit_r["type"]] = {k: go_decode_integer(lit_r[k], unsigned=True) for k in ("hard", "soft")}
    return out


def test_efa_memlock_survives_nodeadms_float64_merge_and_containerds_uint64_decode():
    # Review A-B1: nodeadm merges the NodeConfig's baseRuntimeSpec through Go float64; containerd
    # decodes the result into uint64. 2^64-1 came out as 18446744073709552000 and no node got Ready.
    result, _ = _run(EFA)
    docs = node_configs(result.one(LT).inputs["userData"])
    assert [d["kind"] for d in docs] == ["NodeConfig"]
    merged = merged_base_runtime_spec(docs[0])
    limits = _rlimits(merged)  # raises like containerd does when a value does not decode
    assert limits["RLIMIT_MEMLOCK"] == {"hard": MEMLOCK_BYTES, "soft": MEMLOCK_BYTES}
    assert MEMLOCK_BYTES >= 2**50  # a petabyte: unlimited for any instance's memory
    assert limits["RLIMIT_NOFILE"] == {"hard": 1048576, "soft": 65536}
    plain, _ = _run(BASE)
    assert all("containerd" not in d["spec"] for d in node_configs(plain.one(LT).inputs["userData"]))


def test_instance_store_becomes_raid0_for_images_and_scratch_where_the_type_has_one(monkeypatch):
    # Review B17: p4de's 8 x 1 TB NVMe and g4dn's 125 GB sat unused; images were extracted onto gp3.
    for args in (BASE, EFA):
        result, _ = _run(args)
        docs = node_configs(result.one(LT).inputs["userData"])
        assert len(docs) == 1 and docs[0]["apiVersion"] == "node.eks.aws/v1alpha1", docs
        assert docs[0]["spec"]["instance"] == {"localStorage": {"strategy": "RAID0"}}
        assert ("containerd" in docs[0]["spec"]) is args.efa  # the EFA memlock stays EFA-only
    # Negative controls: opted out, or a type the catalog knows no instance store for: no user data at all.
    result, _ = _run(dataclasses.replace(BASE, local_storage="none"))
    assert "userData" not in result.one(LT).inputs
    monkeypatch.setitem(catalog.CATALOG, "g4dn.xlarge",
                        dataclasses.replace(catalog.CATALOG["g4dn.xlarge"], local_nvme_gb=0))
    result, _ = _run(BASE)
    assert "userData" not in result.one(LT).inputs
    with pytest.raises(ValueError, match="local_storage: got 'RAID10'; expected 'RAID0' or 'none'"):
        _run(dataclasses.replace(BASE, local_storage="RAID10"))


def test_every_number_in_the_user_data_survives_the_float64_round_trip_exactly():
    result, _ = _run(EFA)
    for doc in node_configs(result.one(LT).inputs["userData"]):
        values = numbers(doc)
        assert values, "the NodeConfig carries numbers"
        for v in values:
            literal = through_float64(v)
            assert go_decode_integer(literal, unsigned=v >= 0) == v, f"{v} becomes {literal} in nodeadm's merge"


def test_the_round_trip_model_reproduces_the_corruption_nodeadm_showed():
    # The model must be able to fail: RLIM_INFINITY turns into the literal the review saw on a node.
    assert through_float64(2**64 - 1) == "18446744073709552000"
    with pytest.raises(ValueError, match="uint64"):
        go_decode_integer(through_float64(2**64 - 1), unsigned=True)
    assert through_float64(2**63 - 1) == "9223372036854776000"  # decodes, but not to the value written
    assert through_float64(10**21) == "1e+21"
    bad = {"spec": {"containerd": {"baseRuntimeSpec": {"process": {"rlimits": [
        {"type": "RLIMIT_MEMLOCK", "hard": 2**64 - 1, "soft": 2**64 - 1}]}}}}}
    with pytest.raises(ValueError, match="18446744073709552000"):
        _rlimits(merged_base_runtime_spec(bad))
    # mergo.WithOverride replaces the whole list and keeps the default spec's other keys.
    merged = json.loads(merged_base_runtime_spec(bad))
    assert [r["type"] for r in merged["process"]["rlimits"]] == ["RLIMIT_MEMLOCK"]
    assert merged["ociVersion"] and merged["process"]["capabilities"]


def test_node_template_tag_resources_are_named_by_key_not_position():
    """A tag added to the template (here EFA's) must not rename, and so replace, the other tags' resources:
    a replaced Tag deleted after its successor set the same key would remove that key from the group."""
    def names(args):
        result, _ = _run(args)
        return {r.name: r.inputs["tag"]["key"] for r in result.of_type("aws:autoscaling/tag:Tag")}

    plain = names(dataclasses.replace(EFA, efa=False))
    with_efa = names(EFA)
    assert len(with_efa) == len(plain) + 1
    assert plain.items() <= with_efa.items()
    assert any("taint" in name for name in plain)


# --- spot: several instance types (review m12) ----------------------------------------------------------


def _spot_raw(types):
    from tests.support.util import set_path, stack_config

    raw = set_path(stack_config("dev"), "eks-ddp:nodeGroups[0].capacityType", "spot")
    raw = set_path(raw, "eks-ddp:nodeGroups[0].instanceType", "g5.xlarge")
    return set_path(raw, "eks-ddp:nodeGroups[0].spotInstanceTypes", types)


def test_spot_group_launches_from_several_instance_types():
    # EKS recommends several types for spot: one type means frequent interruptions and InsufficientCapacity.
    from eks_ddp.tooling.mocks import run_program

    result = run_program(_spot_raw(["g5.2xlarge", "g5.4xlarge"]))
    (group,) = [g for g in result.of_type("aws:eks/nodeGroup:NodeGroup") if g.inputs.get("capacityType") == "SPOT"]
    assert group.inputs["instanceTypes"] == ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"]


@pytest.mark.parametrize("types,capacity,match", [
    (["g4dn.xlarge"], "spot", r"spotInstanceTypes\[0\].*'g4dn.xlarge'.*1 x A10G"),   # another GPU model
    (["g5.12xlarge"], "spot", r"spotInstanceTypes\[0\].*'g5.12xlarge'"),            # 4 GPUs, not 1
    (["g5.2xlarge"], "onDemand", r"spotInstanceTypes.*capacityType 'onDemand'"),
])
def test_spot_types_must_match_the_gpu_shape_and_be_spot(types, capacity, match):
    from eks_ddp.config import ConfigError, load_stack_config
    from tests.support.util import set_path

    raw = set_path(_spot_raw(types), "eks-ddp:nodeGroups[0].capacityType", capacity)
    with pytest.raises(ConfigError, match=match):
        load_stack_config({k: v for k, v in raw.items() if k.startswith("eks-ddp:")}, region=raw["aws:region"])


@pytest.mark.parametrize("stack", ["dev", "p4de"])
def test_node_groups_track_cluster_version(stack):
    """Every managed node group, system and GPU, carries the cluster's version, so an upgrade moves the nodes
    with the control plane and the next one is not refused (review 2026-11-24, A3)."""
    from tests.support.util import at_version, run, stack_config

    for version in ("1.35", "1.36"):
        raw = at_version(stack_config(stack), version)
        groups = run(raw, stack).of_type(NG)
        assert len(groups) == 1 + len(raw["eks-ddp:nodeGroups"])
        assert [g.inputs.get("version") for g in groups] == [version] * len(groups)


def test_resize_reads_the_live_desired_size_first():
    """GPU groups keep ignoring desiredSize (the autoscaler owns it); the project refreshes before every operation so
    the desired size a min/max change sends is the live one (A2)."""
    import yaml

    from tests.support.util import ROOT

    assert yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["options"]["refresh"] == "always"


@pytest.mark.parametrize("changes,enabled,parallel", [
    ({}, True, None),
    ({"capacity_type": "spot"}, True, None),
    ({"capacity_reservation_id": "cr-0123456789abcdef0", "availability_zone": "us-west-2a"}, True, 1),
    ({"capacity_type": "capacityBlock", "capacity_reservation_id": "cr-0123456789abcdef0",
      "availability_zone": "us-west-2a"}, True, 1),
    ({"node_repair": False}, False, None),
])
def test_node_repair_one_at_a_time_in_reserved_capacity(changes, enabled, parallel):
    """Review B10: GPU groups get node auto repair; a reservation or capacity block repairs one node at a time."""
    from eks_ddp.infra.gpu_nodegroup import node_repair_config

    args = dataclasses.replace(BASE, **changes)
    conf = node_repair_config(args)
    assert (conf.enabled, conf.max_parallel_nodes_repaired_count) == (enabled, parallel)


def test_node_repair_reaches_the_node_group():
    result, _ = _run(dataclasses.replace(EFA, capacity_type="capacityBlock", placement_group_name=None))
    assert result.one(NG).inputs["nodeRepairConfig"] == {"enabled": True, "maxParallelNodesRepairedCount": 1}
