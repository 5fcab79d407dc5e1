"""The destroy contract's own negative controls on the dev plan: a kept subnet in the VPC destroy deletes, a kept rule
naming a security group destroy deletes, and a kept resource naming one deep in its inputs. The FSx case (today's
plan keeping the file system in its subnet and security group) is in tests/infra/test_fsx.py."""

from __future__ import annotations

import dataclasses

from eks_ddp.tooling.contracts import PlanView
from eks_ddp.tooling.contracts.destroy import nothing_kept_inside_what_destroy_deletes as contract

SUBNET = "aws:ec2/subnet:Subnet"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"


def kept(view: PlanView, pick) -> PlanView:
    resources = [dataclasses.replace(r, retain_on_delete=True) if pick(r) else r for r in view.result.resources]
    return PlanView(result=dataclasses.replace(view.result, resources=resources), manifests=view.manifests)


def test_the_dev_plan_keeps_something_and_nothing_inside_what_destroy_deletes(dev_result):
    view = PlanView.of(dev_result)
    assert [r for r in view.result.resources if r.retain_on_delete]  # the file system, keys, results bucket
    assert contract(view) == []


def test_a_kept_subnet_in_the_vpc_destroy_deletes_is_reported(dev_result):
    view = PlanView.of(dev_result)
    subnet = next(r for r in view.aws(SUBNET) if "private" in r.name)
    found = [str(v) for v in contract(kept(view, lambda r: r is subnet))]
    assert len(found) == 1 and f"Subnet {subnet.name} (kept on destroy)" in found[0], found
    assert "sits in VPC" in found[0] and "EC2 DeleteVpc answers DependencyViolation" in found[0]
    # Kept with its VPC, and everything in that VPC it names kept too, it is no longer reported.
    assert contract(kept(view, lambda r: r is subnet or r.type == "aws:ec2/vpc:Vpc")) == []


def test_a_kept_rule_naming_a_deleted_group_or_a_deep_reference_is_reported(dev_result):
    view = PlanView.of(dev_result)
    rule = next(r for r in view.aws(INGRESS) if r.inputs.get("referencedSecurityGroupId"))
    found = [str(v) for v in contract(kept(view, lambda r: r is rule))]
    assert any("sits in security group" in m and "DeleteSecurityGroup" in m for m in found), found
    key = next(r for r in view.result.resources if r.retain_on_delete)
    subnet_id = next(r for r in view.aws(SUBNET)).outputs["id"]
    deep = dataclasses.replace(key, inputs={**key.inputs, "vpcConfig": [{"subnetIds": [subnet_id]}]})
    edited = PlanView(result=dataclasses.replace(view.result, resources=[
        deep if r is key else r for r in view.result.resources]), manifests=view.manifests)
    assert any(f"({subnet_id})" in str(v) for v in contract(edited))
