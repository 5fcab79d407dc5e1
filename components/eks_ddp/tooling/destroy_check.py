"""Before ``pulumi destroy``: what in the stack's VPC the state does not hold, and so nothing the destroy runs deletes.

The destroy contract (``tooling.contracts.destroy``) checks the plan: nothing the stack keeps sits inside what it
deletes. It cannot see what others put into the VPC, and EC2 refuses to delete a subnet, security group or VPC that
something still uses (``DependencyViolation``), which stops the destroy half-way. Known cases:

* **leaked VPC CNI interfaces** (``aws-K8S-...``, detached, carrying the node security group) after nodes terminate:
  pulumi/pulumi-eks issue #1226 reports exactly this ``DependencyViolation`` on the node security group;
* **GuardDuty Runtime Monitoring** with automated agent management adds a VPC endpoint (``...guardduty-data``) and a
  ``GuardDutyManagedSecurityGroup-<vpc>`` to every VPC it covers (hashicorp/terraform-provider-aws issue #46747;
  PR #46953 adds a cleanup to the provider's subnet and VPC delete, not verified in the pulumi-aws this stack pins);
* **load balancers** a ``Service`` of type ``LoadBalancer`` (or an ingress controller) made: their interfaces sit in
  the subnets and their security groups in the VPC.

:func:`find` lists, for one VPC, the network interfaces, VPC endpoints, security groups and load balancers whose ids
the state does not hold (:func:`held_ids`: every string of every resource's id and outputs, so an EKS-made cluster
security group the state names in an output counts as held), says which will block the delete and how to clear it.
An interface attached to something the state holds, or to an instance (a node its group terminates), goes with its
owner and is only listed with ``--all``. Read-only: ec2:DescribeNetworkInterfaces, ec2:DescribeVpcEndpoints,
ec2:DescribeSecurityGroups, elasticloadbalancing:DescribeLoadBalancers. ``eks-ddp destroy-check`` runs it
(README, "Destroy").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

GUARDDUTY_EXCLUDE_TAG = ("GuardDutyManaged", "false")
"""The exclusion tag of GuardDuty's automated agent management (GuardDuty user guide, "Managing the automated security
agent": an EKS cluster or EC2 instance tagged ``GuardDutyManaged:false`` is left out); while the cluster is covered,
GuardDuty may put its endpoint back."""


@dataclass(frozen=True)
class Finding:
    """One thing in the VPC the state does not hold."""

    kind: str
    """``network interface``, ``VPC endpoint``, ``security group``, ``load balancer``."""
    id: str
    what: str
    """What it is, as AWS describes it."""
    blocks: bool
    """True: nothing the destroy runs deletes it, and it holds a subnet, security group or the VPC."""
    fix: str
    """How to clear it (a command), or why it needs nothing."""


def held_ids(state: dict[str, Any]) -> set[str]:
    """Every string of every resource's ``id`` and outputs in a ``pulumi stack export`` document."""
    out: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.add(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for r in (state.get("deployment") or {}).get("resources") or []:
        walk(r.get("id"))
        walk(r.get("outputs"))
    return out


def state_vpc_and_region(state: dict[str, Any]) -> tuple[str | None, str | None]:
    """The stack's VPC (its ``aws:ec2/vpc:Vpc``, else the EKS cluster's ``vpcConfig.vpcId``) and the AWS provider's
    region, from a ``pulumi stack export`` document."""
    vpc = region = None
    for r in (state.get("deployment") or {}).get("resources") or []:
        outputs = r.get("outputs") or {}
        if r.get("type") == "aws:ec2/vpc:Vpc":
            vpc = vpc or r.get("id")
        elif r.get("type") == "aws:eks/cluster:Cluster":
            vpc = vpc or (outputs.get("vpcConfig") or {}).get("vpcId")
        elif r.get("type") == "pulumi:providers:aws":
            region = region or outputs.get("region") or (r.get("inputs") or {}).get("region")
    return vpc, region


def _pages(client: Any, op: str, key: str, **kw: Any) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator(op).paginate(**kw):
        yield from page.get(key, [])


def find(ec2: Any, elbv2: Any, vpc_id: str, held: set[str], region: str) -> list[Finding]:
    """Everything in ``vpc_id`` whose id ``held`` lacks (see the module docstring)."""
    vpc = [{"Name": "vpc-id", "Values": [vpc_id]}]
    flag = f" --region {region}"
    out: list[Finding] = []
    endpoints = [e for e in _pages(ec2, "describe_vpc_endpoints", "VpcEndpoints", Filters=vpc)
                 if e.get("State", "").lower() not in ("deleted", "deleting")]
    endpoint_ids = {e["VpcEndpointId"] for e in endpoints}
    endpoint_of = {eni: e["VpcEndpointId"] for e in endpoints for eni in e.get("NetworkInterfaceIds") or []}
    for e in endpoints:
        if e["VpcEndpointId"] in held:
            continue
        guardduty = "guardduty" in e.get("ServiceName", "")
        fix = (f"aws ec2 delete-vpc-endpoints --vpc-endpoint-ids {e['VpcEndpointId']}{flag}")
        if guardduty:
            fix = (f"{fix}, then delete the GuardDutyManagedSecurityGroup-{vpc_id} group (listed below); if GuardDuty "
                   "puts the endpoint back while the cluster still runs, tag the EKS cluster "
                   f"{GUARDDUTY_EXCLUDE_TAG[0]}={GUARDDUTY_EXCLUDE_TAG[1]} (aws eks tag-resource) first")
        out.append(Finding("VPC endpoint", e["VpcEndpointId"], f"{e.get('VpcEndpointType', '')} endpoint for "
                           f"{e.get('ServiceName', '?')}" + (" (GuardDuty Runtime Monitoring)" if guardduty else ""),
                           True, fix))
    balancers = [b for b in _pages(elbv2, "describe_load_balancers", "LoadBalancers") if b.get("VpcId") == vpc_id]
    balancer_names = set()
    for b in balancers:
        balancer_names.add(b["LoadBalancerName"])
        if b["LoadBalancerArn"] in held:
            continue
        out.append(Finding("load balancer", b["LoadBalancerArn"], f"{b.get('Type', '')} load balancer "
                           f"{b['LoadBalancerName']} ({b.get('Scheme', '')})", True,
                           "delete the Kubernetes Service (type LoadBalancer) or Ingress that made it before the "
                           "destroy (kubectl get svc -A | grep LoadBalancer), or aws elbv2 delete-load-balancer "
                           f"--load-balancer-arn {b['LoadBalancerArn']}{flag}"))
    for eni in _pages(ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=vpc):
        finding = _interface(eni, held, endpoint_ids, balancer_names, flag, endpoint_of.get(eni["NetworkInterfaceId"]))
        if finding is not None:
            out.append(finding)
    for sg in _pages(ec2, "describe_security_groups", "SecurityGroups", Filters=vpc):
        if sg["GroupId"] in held or sg.get("GroupName") == "default":
            continue
        out.append(Finding("security group", sg["GroupId"], f"{sg.get('GroupName', '')}: {sg.get('Description', '')}",
                           True, f"aws ec2 delete-security-group --group-id {sg['GroupId']}{flag} (after what uses "
                           "it is gone; a rule in a held group that names it is removed with that group)"))
    return out


def _interface(eni: dict[str, Any], held: set[str], endpoints: set[str], balancers: set[str],
               flag: str, endpoint: str | None) -> Finding | None:
    eni_id, description = eni["NetworkInterfaceId"], eni.get("Description", "")
    attachment = eni.get("Attachment") or {}
    if eni_id in held or any(token in held for token in description.split() if "-" in token and len(token) > 5):
        return None  # named by the state (an FSx, EKS or NAT interface goes with the resource it serves)
    if endpoint is not None:  # DescribeVpcEndpoints' NetworkInterfaceIds: the endpoint's own
        return None if endpoint in held else Finding("network interface", eni_id, description or "endpoint interface",
                                                     False, f"goes with {endpoint} (listed above)")
    if eni.get("Status") == "available":
        leaked = description.startswith("aws-K8S-")
        return Finding("network interface", eni_id, description or "detached interface", True,
                       f"aws ec2 delete-network-interface --network-interface-id {eni_id}{flag}"
                       + (" (a VPC CNI interface left by a terminated node: pulumi/pulumi-eks#1226)" if leaked else ""))
    if attachment.get("InstanceId"):
        return Finding("network interface", eni_id, f"{description or 'interface'} on {attachment['InstanceId']}",
                       False, "goes with its instance (a node its node group terminates on destroy)")
    owner = next((e for e in endpoints if e in description), None) or next(
        (b for b in balancers if b in description), None)
    if owner is not None:
        return Finding("network interface", eni_id, description, False,
                       f"goes with {owner}" + (" (listed above)" if owner not in held else ""))
    return Finding("network interface", eni_id, description or "interface in use", True,
                   f"find what uses it (aws ec2 describe-network-interfaces --network-interface-ids {eni_id}{flag}) "
                   "and delete that first")


def report(findings: Iterable[Finding], *, show_all: bool = False) -> str:
    shown = [f for f in findings if f.blocks or show_all]
    if not shown:
        return "nothing in the VPC outside the state blocks the destroy"
    lines = []
    for f in shown:
        lines.append(f"{'BLOCKS' if f.blocks else 'ok    '} {f.kind} {f.id}: {f.what}\n       {f.fix}")
    blocking = sum(f.blocks for f in shown)
    lines.append(f"{blocking} thing(s) outside the state would stop pulumi destroy (DependencyViolation)"
                 if blocking else "nothing listed blocks the destroy")
    return "\n".join(lines)


def as_json(findings: Iterable[Finding]) -> str:
    return json.dumps([asdict(f) for f in findings], indent=2)
