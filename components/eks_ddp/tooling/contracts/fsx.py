"""FSx for Lustre contract: every Lustre volume of the plan mounts a file system its nodes can reach, and the CSI
driver's role may do what static volumes need and nothing else.

The rules implemented, each from its source:

* **What a volume mounts** (kubernetes-sigs/aws-fsx-csi-driver ``pkg/driver/node.go``, ``NodePublishVolume``): the
  volume attributes ``dnsname`` (required: "dnsname is not provided" otherwise) and ``mountname`` (default ``fsx``)
  make the source ``<dnsname>@tcp:/<mountname>``; ``pkg/driver/controller.go`` names them ``dnsname`` and
  ``mountname``. So a PersistentVolume of ``fsx.csi.aws.com`` must name a file system of the plan by its
  ``volumeHandle``, carry that file system's DNS name, and a ``mountname`` that is its mount name or a directory
  below it (a Lustre fileset mount).
* **Who reaches it** (FSx for Lustre user guide, "File system access control with Amazon VPC": Lustre uses TCP 988 and
  1018-1023; the file system's security group must admit them from its clients and from itself;
  https://github.com/kubernetes-sigs/aws-fsx-csi-driver/blob/master/docs/troubleshooting.md: "FSx for Lustre rejects packets where the source port is neither
  988 nor in the range 1018–1023"): a security group rule admits a node when it references a security group the
  node's launch template gives it (its interfaces' groups with EFA). Every node launch template of the plan (the
  pods that mount run on the GPU and the system nodes) must reach every Lustre port, and the file servers each other.
* **Both halves of the table, both directions** (the same page, "Amazon VPC security group rules" for the file
  system and "Lustre client VPC security group rules" for the clients: "Add the following inbound rules to the
  security groups applied to your Lustre clients", TCP 988 and 1018-1023 from "the security groups associated with
  your FSx for Lustre file systems" and from the clients' own groups, and the matching outbound rules for both): the
  file servers open connections to the clients too (reconnects, failover, lock callbacks), so every node's groups
  must admit every Lustre port from the file system's groups and from the nodes, and the outbound rules of both
  sides must let the connections leave (an open egress rule, ``0.0.0.0/0`` on all protocols, does).
* **Nothing else**: no ingress rule of the file system's groups admits an address range, another group, another
  protocol or another port.
* **The driver's role** (``pkg/driver/controller.go``: only CreateVolume, DeleteVolume and ControllerExpandVolume
  create, delete or update file systems, and the stack's volumes are static and retained; ValidateVolumeCapabilities
  describes one): the ``aws-fsx-csi-driver`` add-on's role is assumable only by ``kube-system:fsx-csi-controller-sa``
  (IRSA) and its identity policies allow ``fsx:DescribeFileSystems`` and nothing more (statements evaluated with
  :mod:`.iam_policy`); no managed policy is attached.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from . import PlanView, Violation, contract
from .iam_policy import Request, evaluate
from .storage import identity_policies

NAME = "fsx"
DRIVER = "fsx.csi.aws.com"
ADDON = "aws-fsx-csi-driver"
CONTROLLER_SA = "system:serviceaccount:kube-system:fsx-csi-controller-sa"
NEEDED = ("fsx:DescribeFileSystems",)
LUSTRE_PORTS = (988, *range(1018, 1024))
"""Every port Lustre uses (FSx for Lustre user guide; the driver's troubleshooting page)."""
FS = "aws:fsx/lustreFileSystem:LustreFileSystem"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [] if value is None else [value]


def node_groups_of(view: PlanView) -> dict[str, set[str]]:
    """Launch template name -> the security groups its nodes carry (the template's, or its interfaces' with EFA)."""
    out = {}
    for lt in view.aws(LAUNCH_TEMPLATE):
        groups = set(map(str, _listed(lt.inputs.get("vpcSecurityGroupIds"))))
        for nic in _listed(lt.inputs.get("networkInterfaces")):
            groups |= set(map(str, _listed((nic or {}).get("securityGroups"))))
        out[lt.name] = groups
    return out


def _admits(rule: dict[str, Any], port: int, groups: set[str]) -> bool:
    proto = str(rule.get("ipProtocol", "")).lower()
    if proto not in ("tcp", "6", "-1"):
        return False
    if proto != "-1" and not int(float(rule.get("fromPort", -1))) <= port <= int(float(rule.get("toPort", -1))):
        return False
    return str(rule.get("referencedSecurityGroupId")) in groups


def check_network(view: PlanView, fs: Any) -> Iterable[Violation]:
    subject = f"LustreFileSystem {fs.name}"
    fs_groups = set(map(str, _listed(fs.inputs.get("securityGroupIds"))))
    rules = [r.inputs for r in view.aws(INGRESS) if str(r.inputs.get("securityGroupId")) in fs_groups]
    nodes = node_groups_of(view)
    for lt, groups in sorted(nodes.items()):
        closed = [p for p in LUSTRE_PORTS if not any(_admits(r, p, groups) for r in rules)]
        if closed:
            yield Violation(NAME, subject, f"the nodes of launch template {lt} (groups {sorted(groups)}) cannot reach "
                                           f"it on TCP {closed}: Lustre needs 988 and 1018-1023")
    closed = [p for p in LUSTRE_PORTS if not any(_admits(r, p, fs_groups) for r in rules)]
    if closed:
        yield Violation(NAME, subject, f"its file servers cannot reach each other on TCP {closed}: the file system's "
                                       "security group must admit itself")
    yield from _client_half(view, subject, fs_groups, nodes)
    allowed = fs_groups.union(*nodes.values()) if nodes else fs_groups
    for r in rules:
        ports = set(range(int(float(r.get("fromPort", 0))), int(float(r.get("toPort", 65535))) + 1))
        extra = [k for k in ("cidrIpv4", "cidrIpv6", "prefixListId") if r.get(k)]
        if extra or str(r.get("ipProtocol", "")).lower() not in ("tcp", "6") or not ports <= set(LUSTRE_PORTS) \
                or str(r.get("referencedSecurityGroupId")) not in allowed:
            yield Violation(NAME, subject, f"ingress rule {json.dumps(r, sort_keys=True, default=str)} admits more "
                                           "than the cluster's nodes and the file servers on Lustre's ports")


def _egress_admits(rule: dict[str, Any], port: int, groups: set[str]) -> bool:
    proto = str(rule.get("ipProtocol", "")).lower()
    if proto not in ("tcp", "6", "-1"):
        return False
    if proto != "-1" and not int(float(rule.get("fromPort", -1))) <= port <= int(float(rule.get("toPort", -1))):
        return False
    return rule.get("cidrIpv4") == "0.0.0.0/0" or str(rule.get("referencedSecurityGroupId")) in groups


def _client_half(view: PlanView, subject: str, fs_groups: set[str],
                 nodes: dict[str, set[str]]) -> Iterable[Violation]:
    """The clients' inbound rules, and both sides' outbound rules (see the module docstring)."""
    ingress = [r.inputs for r in view.aws(INGRESS)]
    egress = [r.inputs for r in view.aws(EGRESS)]

    def on(rules: list[dict[str, Any]], groups: set[str]) -> list[dict[str, Any]]:
        return [r for r in rules if str(r.get("securityGroupId")) in groups]

    for lt, groups in sorted(nodes.items()):
        for source, label in ((fs_groups, "the file system's security group"), (groups, "the other nodes")):
            closed = [p for p in LUSTRE_PORTS if not any(_admits(r, p, source) for r in on(ingress, groups))]
            if closed:
                yield Violation(NAME, subject, (
                    f"the nodes of launch template {lt} (groups {sorted(groups)}) do not admit TCP {closed} from "
                    f"{label}: connections the file servers open to a client are dropped (evictions, hung I/O); "
                    "the user guide's Lustre client rules need 988 and 1018-1023"))
        closed = [p for p in LUSTRE_PORTS if not any(_egress_admits(r, p, fs_groups) for r in on(egress, groups))]
        if closed:
            yield Violation(NAME, subject, f"the nodes of launch template {lt} may not send to the file system's "
                                           f"security group on TCP {closed}")
        closed = [p for p in LUSTRE_PORTS if not any(_egress_admits(r, p, groups) for r in on(egress, fs_groups))]
        if closed:
            yield Violation(NAME, subject, f"its file servers may not send to the nodes of launch template {lt} on "
                                           f"TCP {closed}")
    closed = [p for p in LUSTRE_PORTS if not any(_egress_admits(r, p, fs_groups) for r in on(egress, fs_groups))]
    if closed:
        yield Violation(NAME, subject, f"its file servers may not send to each other on TCP {closed}")


def check_volume(view: PlanView, pv: dict[str, Any]) -> Iterable[Violation]:
    csi = pv["spec"]["csi"]
    subject = f"PersistentVolume {(pv.get('metadata') or {}).get('name', '?')}"
    fs = next((f for f in view.aws(FS) if f.outputs.get("id") == csi.get("volumeHandle")), None)
    if fs is None:
        yield Violation(NAME, subject, f"volumeHandle {csi.get('volumeHandle')!r} is no FSx for Lustre file system "
                                       "of the plan")
        return
    attrs = csi.get("volumeAttributes") or {}
    if attrs.get("dnsname") != fs.outputs.get("dnsName"):
        yield Violation(NAME, subject, f"dnsname {attrs.get('dnsname')!r} is not {fs.name}'s DNS name "
                                       f"{fs.outputs.get('dnsName')!r}: the node plugin mounts <dnsname>@tcp:/...")
    mount, own = str(attrs.get("mountname") or "fsx"), str(fs.outputs.get("mountName"))
    if mount != own and not mount.startswith(own + "/"):
        yield Violation(NAME, subject, f"mountname {mount!r} is neither {fs.name}'s mount name {own!r} nor a "
                                       "directory below it")


def _trust_subjects(trust: Any) -> list[tuple[str, str]]:
    doc = json.loads(trust) if isinstance(trust, str) else (trust or {})
    out = []
    for s in _listed(doc.get("Statement")):
        if s.get("Effect") == "Allow" and "sts:AssumeRoleWithWebIdentity" in _listed(s.get("Action")):
            for op, block in (s.get("Condition") or {}).items():
                out += [(op, str(v)) for k, vs in block.items() if k.endswith(":sub") for v in _listed(vs)]
    return out


def check_driver_role(view: PlanView) -> Iterable[Violation]:
    addons = [a for a in view.aws("aws:eks/addon:Addon") if a.inputs.get("addonName") == ADDON]
    if not addons:
        yield Violation(NAME, "aws-fsx-csi-driver", "no add-on installs the driver: no Lustre volume can mount")
        return
    for addon in addons:
        arn = str(addon.inputs.get("serviceAccountRoleArn"))
        role = next((r for r in view.aws("aws:iam/role:Role") if r.outputs.get("arn") == arn), None)
        subject = f"add-on {addon.name} role {arn}"
        if role is None:
            yield Violation(NAME, subject, "the add-on's role is not in the plan")
            continue
        subjects = _trust_subjects(role.inputs.get("assumeRolePolicy"))
        strangers = [v for _, v in subjects if v != CONTROLLER_SA]  # a pattern (StringLike) admits more than one
        if strangers or not subjects:
            yield Violation(NAME, subject, f"its trust admits {strangers or 'no service account'}; expected exactly "
                                           f"{CONTROLLER_SA} (the controller; the node plugin makes no AWS call)")
        statements = identity_policies(view, arn)
        granted = set()
        for s in statements:
            if s.get("Effect") != "Allow":
                continue
            for action in _listed(s.get("Action")) or ["<NotAction>"]:
                if str(action).lower() not in {a.lower() for a in NEEDED}:
                    granted.add(str(action))
        for name in sorted(granted):
            yield Violation(NAME, subject, f"allows {name}: static, retained volumes need only {list(NEEDED)}")
        for need in NEEDED:
            req = Request(arn, need, "*", {})
            if not evaluate({"Statement": statements}, req).allowed:
                yield Violation(NAME, subject, f"does not allow {need}, which ValidateVolumeCapabilities calls")
        for a in view.aws("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
            if a.inputs.get("role") in {role.outputs.get("id"), role.outputs.get("name"), role.name}:
                yield Violation(NAME, subject, f"has managed policy {a.inputs.get('policyArn')} attached: more than "
                                               "static volumes need")


@contract(NAME)
def fsx_volumes_reachable_driver_least_privilege(view: PlanView) -> list[Violation]:
    """Every Lustre volume mounts a plan file system its nodes reach on Lustre's ports, and nothing else reaches it;
    the driver's role can describe file systems and nothing more."""
    pvs = [pv for pv in view.kind("PersistentVolume")
           if ((pv.get("spec") or {}).get("csi") or {}).get("driver") == DRIVER]
    filesystems = view.aws(FS)
    if not pvs and not filesystems:
        return []
    out: list[Violation] = []
    for pv in pvs:
        out += check_volume(view, pv)
    for fs in filesystems:
        out += check_network(view, fs)
    out += check_driver_role(view)
    return out
