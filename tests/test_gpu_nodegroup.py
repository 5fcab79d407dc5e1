"""GpuNodeGroup under mocks: launch template policy, EFA wiring, zones, capacity types, validation."""

from __future__ import annotations

import dataclasses

import pulumi
import pytest

from components import catalog
from components.gpu_nodegroup import GpuNodeGroup, GpuNodeGroupArgs, efa_device_index
from components.mocks import run_program

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
                                   "eks-ddp/instance-type": "g4dn.xlarge"}
    assert group.node_labels == ng.inputs["labels"]
    assert ng.inputs["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]
    scaling = ng.inputs["scalingConfig"]
    assert (int(scaling["minSize"]), int(scaling["desiredSize"]), int(scaling["maxSize"])) == (0, 2, 2)
    assert ng.ignore_changes == ["scalingConfig.desiredSize"]


def test_p4de_efa_interfaces_placement_group_single_zone():
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
        assert n["associatePublicIpAddress"] == "false"
    # Groups on the interfaces, never at the top level alongside them.
    assert "vpcSecurityGroupIds" not in lt
    pg = result.one(PG)
    assert pg.inputs["strategy"] == "cluster"
    assert lt["placement"] == {"groupName": pg.outputs["name"], "availabilityZone": "us-west-2b"}
    assert result.one(NG).inputs["subnetIds"] == ["subnet-b"]
    assert group.zone == "us-west-2b"


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


def test_every_child_has_the_group_as_parent():
    result, _ = _run(EFA)
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


def test_efa_nodes_give_containers_unlimited_memlock():
    # Non-root EFA pods cannot raise RLIMIT_MEMLOCK themselves; the node's containerd default must.
    import base64

    import yaml

    result, _ = _run(EFA)
    text = base64.b64decode(result.one(LT).inputs["userData"]).decode()
    assert "Content-Type: application/node.eks.aws" in text
    doc = yaml.safe_load(text.split("application/node.eks.aws", 1)[1].split("--EKSDDP--")[0])
    assert doc["kind"] == "NodeConfig"
    limits = {r["type"]: r for r in doc["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"]}
    assert limits["RLIMIT_MEMLOCK"]["hard"] == limits["RLIMIT_MEMLOCK"]["soft"] == 2**64 - 1
    plain, _ = _run(BASE)
    assert "userData" not in plain.one(LT).inputs
