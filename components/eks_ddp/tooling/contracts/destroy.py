"""Destroy contract: nothing kept on ``pulumi destroy`` sits inside what destroy deletes, so destroy completes.

``pulumi destroy`` drops a kept resource (``retain_on_delete``) from the state without deleting it, then deletes
everything else. EC2 refuses to delete a network container something still uses; the rules implemented, each from
its source:

* **A subnet holds its network interfaces** (EC2 API reference, ``DeleteSubnet``: "You must terminate all running
  instances in the subnet before you can delete the subnet"; an interface left in it answers ``DependencyViolation``,
  "The subnet ... has dependencies and cannot be deleted").
* **A security group holds the interfaces that carry it and the rules that name it** (EC2 API reference,
  ``DeleteSecurityGroup``: "If you attempt to delete a security group that is associated with an instance or network
  interface, is referenced by another security group in the same VPC, or has a VPC association, the operation fails
  with DependencyViolation").
* **A VPC holds its subnets and security groups** (EC2 API reference, ``DeleteVpc``: "You must detach or delete all
  gateways and resources that are associated with the VPC before you can delete it. For example, you must terminate
  all instances running in the VPC, delete all security groups associated with the VPC (except the default one),
  delete all route tables ...").
* **A kept resource keeps the interfaces it owns**: an FSx for Lustre file system is reachable only through its own
  interfaces, in the subnet and with the security groups it was created with (``subnetIds``, ``securityGroupIds``),
  which live as long as it does (FSx for Lustre user guide, "File system access control with Amazon VPC": "You must
  not modify or delete the Amazon FSx elastic network interface"); an EFS mount target, an instance, an endpoint
  likewise name theirs in their inputs.

So a kept resource whose inputs name a subnet, security group or VPC of the plan that destroy deletes makes destroy
fail (after the provider's delete timeout, about 15 minutes, with the network half-deleted), and so does a kept
subnet or security group in a VPC destroy deletes. The contract reads every input of every kept resource (nested
lists and maps included) for the ids of the plan's subnets, security groups and VPCs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from eks_ddp.tooling.mocks import Recorded

from . import PlanView, Violation, contract

NAME = "destroy"
CONTAINERS = {
    "aws:ec2/subnet:Subnet": ("subnet", "DeleteSubnet"),
    "aws:ec2/securityGroup:SecurityGroup": ("security group", "DeleteSecurityGroup"),
    "aws:ec2/vpc:Vpc": ("VPC", "DeleteVpc"),
}
"""The network containers EC2 refuses to delete while something inside them remains, with the refusing call."""


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def kept(view: PlanView) -> list[Recorded]:
    """The resources ``pulumi destroy`` leaves in place."""
    return [r for r in view.result.resources if r.retain_on_delete]


@contract(NAME)
def nothing_kept_inside_what_destroy_deletes(view: PlanView) -> list[Violation]:
    """Every kept resource names no subnet, security group or VPC that destroy deletes."""
    deleted: dict[str, Recorded] = {}
    for typ in CONTAINERS:
        for r in view.aws(typ):
            if not r.retain_on_delete and r.outputs.get("id"):
                deleted[str(r.outputs["id"])] = r
    out: list[Violation] = []
    for r in kept(view):
        for ref in sorted(set(_strings(r.inputs)) & deleted.keys()):
            holder = deleted[ref]
            what, call = CONTAINERS[holder.type]
            out.append(Violation(NAME, f"{r.type.rsplit(':', 1)[-1]} {r.name} (kept on destroy)", (
                f"sits in {what} {holder.name} ({ref}), which destroy deletes: EC2 {call} answers "
                "DependencyViolation while it remains, and destroy fails with the network half-deleted. Delete it "
                f"with the stack (with a final backup to keep its data), or keep the {what} with it")))
    return out
