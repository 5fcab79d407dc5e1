"""``eks-ddp destroy-check`` (components/eks_ddp/tooling/destroy_check.py) on moto's EC2 and ELBv2: what in the stack's
VPC the state does not hold is listed, what blocks the delete is said and how to clear it (issue 52, item 5), with the
three known cases: a leaked VPC CNI interface (pulumi/pulumi-eks#1226), GuardDuty's endpoint and security group
(terraform-provider-aws#46747), a load balancer a Service made. Negative controls: the same VPC with everything in the
state reports nothing, and an interface on an instance (a node) goes with it."""

from __future__ import annotations

import json

import boto3
import pytest

from eks_ddp.tooling import destroy_check
from eks_ddp.tooling.runs import main
from tests.support.moto_account import fake_account

REGION = "us-west-2"


@pytest.fixture
def aws(monkeypatch):
    with fake_account(monkeypatch):
        yield boto3.client("ec2", region_name=REGION), boto3.client("elbv2", region_name=REGION)


def stack(ec2) -> tuple[dict, dict]:
    """A VPC with what the stack made (in the state) and what others left there; (state, the others' ids)."""
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{REGION}{z}")["Subnet"]
               ["SubnetId"] for i, z in enumerate("ab")]
    node_sg = ec2.create_security_group(GroupName="nodes", Description="eks-ddp nodes", VpcId=vpc)["GroupId"]
    state = {"deployment": {"resources": [
        {"type": "pulumi:providers:aws", "urn": "p", "id": "prov", "inputs": {"region": REGION}, "outputs": {}},
        {"type": "aws:ec2/vpc:Vpc", "urn": "v", "id": vpc, "outputs": {"id": vpc}},
        *({"type": "aws:ec2/subnet:Subnet", "urn": f"s{i}", "id": s, "outputs": {"id": s}}
          for i, s in enumerate(subnets)),
        {"type": "aws:ec2/securityGroup:SecurityGroup", "urn": "g", "id": node_sg, "outputs": {"id": node_sg}},
    ]}}
    leaked = ec2.create_network_interface(SubnetId=subnets[0], Groups=[node_sg],
                                          Description="aws-K8S-i-0123456789abcdef0")["NetworkInterface"]
    gd_sg = ec2.create_security_group(GroupName=f"GuardDutyManagedSecurityGroup-{vpc}",
                                      Description="Managed by GuardDuty", VpcId=vpc)["GroupId"]
    endpoint = ec2.create_vpc_endpoint(VpcId=vpc, ServiceName=f"com.amazonaws.{REGION}.guardduty-data",
                                       VpcEndpointType="Interface", SubnetIds=subnets[:1],
                                       SecurityGroupIds=[gd_sg])["VpcEndpoint"]["VpcEndpointId"]
    return state, {"vpc": vpc, "subnets": subnets, "node_sg": node_sg, "leaked": leaked["NetworkInterfaceId"],
                   "gd_sg": gd_sg, "endpoint": endpoint}


def test_what_the_state_does_not_hold_is_listed_with_how_to_clear_it(aws):
    ec2, elbv2 = aws
    state, ids = stack(ec2)
    lb = elbv2.create_load_balancer(Name="k8s-training-svc", Subnets=ids["subnets"], Scheme="internal",
                                    Type="application")["LoadBalancers"][0]["LoadBalancerArn"]
    found = destroy_check.find(ec2, elbv2, ids["vpc"], destroy_check.held_ids(state), REGION)
    blocking = {f.id: f for f in found if f.blocks}
    assert ids["leaked"] in blocking and "pulumi/pulumi-eks#1226" in blocking[ids["leaked"]].fix
    assert f"delete-network-interface --network-interface-id {ids['leaked']} --region {REGION}" in (
        blocking[ids["leaked"]].fix)
    assert "GuardDuty" in blocking[ids["endpoint"]].what
    assert f"delete-vpc-endpoints --vpc-endpoint-ids {ids['endpoint']}" in blocking[ids["endpoint"]].fix
    assert "GuardDutyManaged=false" in blocking[ids["endpoint"]].fix
    assert ids["gd_sg"] in blocking and blocking[ids["gd_sg"]].kind == "security group"
    assert lb in blocking and "type LoadBalancer" in blocking[lb].fix
    held = {ids["vpc"], ids["node_sg"], *ids["subnets"]}
    assert not held & set(blocking)  # the stack's own resources are the destroy's to delete
    text = destroy_check.report(found)
    assert text.startswith("BLOCKS ") and "would stop pulumi destroy (DependencyViolation)" in text


def test_nothing_blocks_when_the_state_holds_everything(aws):
    """Negative control: the same VPC, every id in the state: nothing listed (the default group is never one)."""
    ec2, elbv2 = aws
    state, ids = stack(ec2)
    everything = destroy_check.held_ids(state) | {ids["leaked"], ids["gd_sg"], ids["endpoint"]}
    found = destroy_check.find(ec2, elbv2, ids["vpc"], everything, REGION)
    assert [f for f in found if f.blocks] == []
    assert destroy_check.report(found) == "nothing in the VPC outside the state blocks the destroy"


def test_an_interface_on_a_node_goes_with_it(aws):
    ec2, elbv2 = aws
    state, ids = stack(ec2)
    node = ec2.run_instances(ImageId="ami-12345678", InstanceType="t3.large", MinCount=1, MaxCount=1,
                             SubnetId=ids["subnets"][1])["Instances"][0]
    eni = node["NetworkInterfaces"][0]["NetworkInterfaceId"]
    found = {f.id: f for f in destroy_check.find(ec2, elbv2, ids["vpc"], destroy_check.held_ids(state), REGION)}
    assert found[eni].blocks is False and "goes with its instance" in found[eni].fix
    assert eni not in destroy_check.report(found.values()) and eni in destroy_check.report(found.values(),
                                                                                            show_all=True)


def test_the_command_reads_a_saved_state_and_exits_1_when_something_blocks(aws, tmp_path, capsys):
    ec2, _ = aws
    state, ids = stack(ec2)
    saved = tmp_path / "state.json"
    saved.write_text(json.dumps(state))
    assert main(["destroy-check", "--state", str(saved)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"VPC {ids['vpc']} ({REGION}):") and ids["leaked"] in out
    assert main(["destroy-check", "--state", str(saved), "--json"]) == 1
    assert {f["id"] for f in json.loads(capsys.readouterr().out) if f["blocks"]} >= {ids["leaked"], ids["endpoint"]}
    # a state that names no VPC (a destroyed stack) is a usage error naming the flags
    saved.write_text(json.dumps({"deployment": {"resources": []}}))
    assert main(["destroy-check", "--state", str(saved)]) == 2
    assert "give --vpc-id and --region" in capsys.readouterr().err


def test_without_a_saved_state_the_command_asks_pulumi_stack_export(aws, tmp_path, monkeypatch, capsys):
    """The default path: ``pulumi stack export [--stack S]`` (a stand-in pulumi on PATH prints the state)."""
    import os

    ec2, _ = aws
    state, ids = stack(ec2)
    (tmp_path / "state.json").write_text(json.dumps(state))
    fake = tmp_path / "pulumi"
    fake.write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/argv\ncat {tmp_path}/state.json\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert main(["destroy-check", "--stack", "org/dev"]) == 1
    assert (tmp_path / "argv").read_text().split() == ["stack", "export", "--stack", "org/dev"]
    assert ids["leaked"] in capsys.readouterr().out
