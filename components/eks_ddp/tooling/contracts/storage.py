"""Storage contract: every EFS mount in the plan is permitted by the file-system policy, as the CSI driver mounts it.

For each PersistentVolume of the EFS CSI driver (``efs.csi.aws.com``) the contract rebuilds the mount the node
plugin makes and evaluates EFS's authorisation of it:

* **How the driver mounts** (kubernetes-sigs/aws-efs-csi-driver ``pkg/driver/node.go``, ``NodePublishVolume``
  and ``parseVolumeId``): the volume handle is ``<fs-id>:<subpath>:<access-point-id>``; an access point adds
  ``accesspoint=<id>`` and ``tls``; ``encryptInTransit`` (volume attribute, default true) adds ``tls``; an
  unknown volume attribute fails the mount (InvalidArgument); the PersistentVolume's ``mountOptions`` pass
  through, so ``iam`` there makes the mount IAM-authenticated; ``awscredsuri`` is dropped.
  efs-utils refuses ``iam`` without ``tls`` (aws/efs-utils ``src/efs_utils_common/mount_options.py``,
  ``check_options_validity``: 'The "tls" option is required when mounting via "iam"').
* **Who mounts** (aws/efs-utils ``src/efs_utils_common/aws_credentials.py``, ``get_aws_security_credentials``):
  without ``iam`` the client is anonymous. With ``iam`` the node plugin's credentials are, in order, an EKS Pod
  Identity association of ``kube-system:efs-csi-node-sa``, the IRSA web identity of that service account (the
  EKS add-on's ``serviceAccountRoleArn`` annotates both of its service accounts; the role's trust must admit
  the node's), and else the instance profile (the node group's role): the node plugin runs on the host network.
* **What EFS decides** (EFS user guide, "Using IAM to control file system data access"): without a file-system
  policy every client gets full access; with one, an explicit Deny in it (or in the identity's policies)
  refuses, and an Allow in *either* the file-system policy or an IAM identity policy grants; an anonymous
  client has no identity policy. ``Principal: {"AWS": "*"}`` covers anonymous clients ("Creating file system
  policies": "Prevent anonymous access" removes ClientMount from such an allow). Only four condition keys
  are enforced for NFS clients: ``aws:SecureTransport``, ``aws:SourceIp``,
  ``elasticfilesystem:AccessPointArn`` and ``elasticfilesystem:AccessedViaMountTarget``. ``AccessPointArn``
  is documented only for IAM clients ("Using access points in IAM policies"), so an anonymous mount is
  evaluated without it, and a negated condition on an absent key (``StringNotEquals``) is true (IAM user
  guide, "IAM JSON policy elements: Condition operators"), which makes such a Deny match. Statements and
  conditions are evaluated by :mod:`.iam_policy`; only these EFS rules are here.

A mount needs ``ClientMount``; it needs ``ClientWrite`` too unless every pod that mounts its claim mounts it
read-only. ``ClientRootAccess`` is never asked for (the access points fix the uid).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import PlanView, Violation, contract
from .iam_policy import DENY, Request, covers, evaluate, evaluate_condition, glob_match

NAME = "storage"
DRIVER = "efs.csi.aws.com"
ADDON = "aws-efs-csi-driver"
NODE_SA = "system:serviceaccount:kube-system:efs-csi-node-sa"
VOLUME_ATTRIBUTES = {"encryptintransit", "mounttargetip", "mounttargetipmap", "crossaccount", "path",
                     "storage.kubernetes.io/csiprovisioneridentity"}
"""Volume attributes NodePublishVolume accepts (lower-cased as it compares them); ``path`` in older releases."""
EFS_CONDITION_KEYS = {"aws:securetransport", "aws:sourceip", "elasticfilesystem:accesspointarn",
                      "elasticfilesystem:accessedviamounttarget"}
MOUNT, WRITE, ROOT = ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite",
                      "elasticfilesystem:ClientRootAccess")
MANAGED_CLIENT_POLICIES = {
    # AWS managed policies for Amazon EFS (EFS user guide, "AWS managed policies for Amazon EFS").
    "AmazonElasticFileSystemClientReadOnlyAccess": [MOUNT],
    "AmazonElasticFileSystemClientReadWriteAccess": [MOUNT, WRITE],
    "AmazonElasticFileSystemClientFullAccess": [MOUNT, WRITE, ROOT],
}


class Unsupported(Exception):
    """A policy element this evaluator does not implement: reported, never guessed."""


@dataclass(frozen=True)
class Mount:
    """One mount the node plugin makes for a PersistentVolume."""

    pv: str
    file_system_id: str
    access_point_id: str
    options: tuple[str, ...]
    problems: tuple[str, ...] = ()

    @property
    def iam(self) -> bool:
        return "iam" in self.options

    @property
    def tls(self) -> bool:
        return "tls" in self.options


@dataclass
class Identity:
    """Who a mount runs as: None for anonymous, else an IAM role and its identity-policy statements."""

    role_arn: str | None
    statements: list[dict[str, Any]] = field(default_factory=list)
    how: str = "anonymous"


def mount_of(pv: dict[str, Any]) -> Mount | None:
    """The mount NodePublishVolume builds for ``pv`` (None when the PV is not the EFS driver's)."""
    csi = (pv.get("spec") or {}).get("csi") or {}
    if csi.get("driver") != DRIVER:
        return None
    name = (pv.get("metadata") or {}).get("name", "?")
    problems: list[str] = []
    handle = str(csi.get("volumeHandle", ""))
    parts = handle.split(":")
    if parts and parts[0] in ("efs", "s3files"):  # the driver's new format: <type>:<fs>:<path>:<ap>
        parts = parts[1:]
    fs_id = parts[0] if parts else ""
    ap_id = parts[2] if len(parts) > 2 else ""
    if not fs_id.startswith("fs-"):
        problems.append(f"volumeHandle: got {handle!r}; expected <fs-id>:<subpath>:<access-point-id>")
    options: list[str] = []
    if ap_id:
        options += [f"accesspoint={ap_id}", "tls"]
    encrypt = True
    for key, value in (csi.get("volumeAttributes") or {}).items():
        if key.lower() not in VOLUME_ATTRIBUTES:
            problems.append(f"volumeAttributes.{key}: the driver refuses an unknown attribute (InvalidArgument); "
                            f"expected one of {sorted(VOLUME_ATTRIBUTES)}")
        elif key.lower() == "encryptintransit":
            encrypt = str(value).lower() == "true"
    if encrypt and "tls" not in options:
        options.append("tls")
    if csi.get("readOnly"):
        options.append("ro")
    for flag in (pv.get("spec") or {}).get("mountOptions") or []:
        flag = str(flag).lower()
        if flag.startswith("awscredsuri"):
            continue
        if flag not in options:
            options.append(flag)
    if "iam" in options and "tls" not in options:
        problems.append("mountOptions: iam without tls; efs-utils refuses the mount ('The \"tls\" option is "
                        "required when mounting via \"iam\"')")
    return Mount(pv=name, file_system_id=fs_id, access_point_id=ap_id, options=tuple(options),
                 problems=tuple(problems))


# --- IAM policy evaluation (components/eks_ddp/tooling/contracts/iam_policy.py; here EFS's own rules) ---------------------------

def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _unenforced(condition: dict[str, Any] | None) -> list[str]:
    """The condition keys of a block that EFS does not enforce for NFS clients: reported, never guessed."""
    return [key for block in (condition or {}).values() for key in block if key.lower() not in EFS_CONDITION_KEYS]


def _efs_context(context: dict[str, str]) -> dict[str, str | None]:
    """An NFS client's request context: the keys EFS enforces, absent (None) unless ``context`` has them."""
    return {**dict.fromkeys(EFS_CONDITION_KEYS), **{k.lower(): v for k, v in context.items()}}


def _sid(_: int, statement: Mapping[str, Any]) -> str:
    return str(statement.get("Sid") or "(no Sid)")


def _unsupported(unenforced: Iterable[str], unknown: Iterable[str] = ()) -> Unsupported:
    """What the evaluation could not decide: the keys EFS does not enforce, then what else was unknown."""
    keys = list(dict.fromkeys(unenforced))
    what = [f"condition key {k}: EFS enforces only {sorted(EFS_CONDITION_KEYS)} for NFS clients" for k in keys]
    what += [f"condition {w}" if w.startswith("operator ") else w for w in dict.fromkeys(unknown) if w not in keys]
    return Unsupported(", ".join(what))


def _unevaluable(statement: dict[str, Any], context: dict[str, str | None]) -> Unsupported | None:
    """What of a statement this check cannot evaluate, whoever it names and whatever else its condition says: a
    key EFS does not enforce, an operator outside :mod:`.iam_policy`'s subset, ``NotPrincipal``."""
    unenforced = _unenforced(statement.get("Condition"))
    unknown = ["NotPrincipal"] if "NotPrincipal" in statement else []
    unknown += evaluate_condition(statement.get("Condition") or {}, context)[1]
    return _unsupported(unenforced, unknown) if unenforced or unknown else None


def condition_holds(condition: dict[str, Any] | None, context: dict[str, str]) -> bool:
    """IAM's condition block (:func:`.iam_policy.evaluate_condition`) over an NFS client's request context: a key
    EFS enforces but ``context`` lacks is absent, so a positive operator is false, a negated one
    (``StringNotEquals``...) true, ``...IfExists`` true, ``Null: true`` true."""
    if problem := _unevaluable({"Condition": condition}, _efs_context(context)):
        raise problem
    return bool(evaluate_condition(condition or {}, _efs_context(context))[0])


def decide(action: str, resource: str, context: dict[str, str], fs_policy: list[dict[str, Any]] | None,
           who: Identity) -> tuple[bool, str]:
    """EFS's decision for one client action: (allowed, why). Statement matching and conditions are
    :func:`.iam_policy.evaluate`'s; EFS's rules are here: no file-system policy grants everything; what cannot be
    evaluated in a statement that covers the action is reported (:class:`Unsupported`), never guessed; an
    explicit Deny in either policy refuses; an Allow in either grants."""
    if fs_policy is None:
        return True, "no file-system policy: EFS's default grants every client full access"
    ctx = _efs_context(context)
    policies = [("file-system policy", fs_policy, True)]
    if who.role_arn is not None:  # an anonymous client has no identity policy
        policies.append(("identity policy", who.statements, False))
    for _, statements, resource_policy in policies:
        for s in statements:
            if covers(s, action, resource, resource_policy=resource_policy) and (problem := _unevaluable(s, ctx)):
                raise problem
    req = Request(who.role_arn or "", action, resource, ctx)
    decided = [(where, evaluate({"Statement": statements}, req, resource_policy=resource_policy, label=_sid))
               for where, statements, resource_policy in policies]
    for where, d in decided:
        if d.effect == DENY:
            return False, f"denied by the {where} statement {d.statements[0]}"
    allowed = next((f"allowed by the {where} statement {d.statements[0]}" for where, d in decided if d.allowed), "")
    return (True, allowed) if allowed else (False, "no statement allows it (implicit deny)")


# --- the plan -------------------------------------------------------------------------------------------------

def _statements(document: Any) -> list[dict[str, Any]]:
    doc = json.loads(document) if isinstance(document, str) else (document or {})
    return [dict(s) for s in _listed(doc.get("Statement", []))]


def _trust_admits(trust: Any, subject: str) -> bool:
    """Whether a role's trust lets ``subject`` (a service account) assume it with its web identity."""
    for s in _statements(trust):
        if s.get("Effect") != "Allow" or "sts:AssumeRoleWithWebIdentity" not in _listed(s.get("Action")):
            continue
        for operator, block in (s.get("Condition") or {}).items():
            for key, wanted in block.items():
                if key.endswith(":sub"):
                    like = operator.startswith("StringLike")
                    if any((glob_match(w, subject) if like else w == subject) for w in map(str, _listed(wanted))):
                        return True
    return False


def _role(view: PlanView, arn: str):
    return next((r for r in view.aws("aws:iam/role:Role") if r.outputs.get("arn") == arn), None)


def identity_policies(view: PlanView, role_arn: str) -> list[dict[str, Any]]:
    """The statements of every identity policy the plan gives ``role_arn`` (inline, managed EFS client, own)."""
    role = _role(view, role_arn)
    names = {role_arn.rsplit("/", 1)[-1]} | ({role.outputs.get("id"), role.outputs.get("name"), role.name}
                                             if role else set())
    out: list[dict[str, Any]] = []
    for p in view.aws("aws:iam/rolePolicy:RolePolicy"):
        if p.inputs.get("role") in names:
            out += _statements(p.inputs.get("policy"))
    own = {p.outputs.get("arn"): p.inputs.get("policy") for p in view.aws("aws:iam/policy:Policy")}
    for a in view.aws("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
        if a.inputs.get("role") not in names:
            continue
        arn = str(a.inputs.get("policyArn", ""))
        if arn in own:
            out += _statements(own[arn])
        elif arn.rsplit("/", 1)[-1] in MANAGED_CLIENT_POLICIES:
            out.append({"Effect": "Allow", "Action": MANAGED_CLIENT_POLICIES[arn.rsplit("/", 1)[-1]],
                        "Resource": "*"})
    return out


def node_identities(view: PlanView) -> list[Identity]:
    """Whom the node plugin's ``iam`` mounts run as, per efs-utils' credential order."""
    for addon in view.aws("aws:eks/addon:Addon"):
        if addon.inputs.get("addonName") != ADDON:
            continue
        for assoc in addon.inputs.get("podIdentityAssociations") or []:
            if assoc.get("serviceAccount") == NODE_SA.rsplit(":", 1)[-1]:
                arn = assoc["roleArn"]
                return [Identity(arn, identity_policies(view, arn), "Pod Identity of efs-csi-node-sa")]
        arn = addon.inputs.get("serviceAccountRoleArn")
        role = _role(view, arn) if arn else None
        if arn and role is not None and _trust_admits(role.inputs.get("assumeRolePolicy"), NODE_SA):
            return [Identity(arn, identity_policies(view, arn), "IRSA of efs-csi-node-sa (add-on role)")]
    roles = sorted({str(g.inputs.get("nodeRoleArn")) for g in view.aws("aws:eks/nodeGroup:NodeGroup")
                    if g.inputs.get("nodeRoleArn")})
    return [Identity(arn, identity_policies(view, arn), "instance profile of the node (no usable IRSA role)")
            for arn in roles] or [Identity(None, [], "no IAM identity found")]


def _claim_needs_write(view: PlanView, pv: dict[str, Any]) -> bool:
    """Whether some pod mounts the PV's claim read-write (or none is known to mount it read-only)."""
    ref = (pv.get("spec") or {}).get("claimRef") or {}
    read_only_uses = 0
    for m in view.manifests:
        spec = ((m.get("spec") or {}).get("template") or {}).get("spec") or (m.get("spec") if m.get("kind") == "Pod"
                                                                          else None)
        if not spec or (m.get("metadata") or {}).get("namespace", ref.get("namespace")) != ref.get("namespace"):
            continue
        for vol in spec.get("volumes") or []:
            claim = vol.get("persistentVolumeClaim") or {}
            if claim.get("claimName") == ref.get("name"):
                if not claim.get("readOnly"):
                    return True
                read_only_uses += 1
    return read_only_uses == 0


def _fs_arn(fs_id: str, ap_arn: str | None) -> str:
    """The file system's ARN in EFS's form, in the access point's partition, region and account (an adopted file
    system has no resource in the plan)."""
    p = (ap_arn or "arn:aws:elasticfilesystem:*:*:").split(":")
    return f"arn:{p[1]}:elasticfilesystem:{p[3]}:{p[4]}:file-system/{fs_id}"


def check_mount(view: PlanView, pv: dict[str, Any], mount: Mount) -> Iterable[Violation]:
    subject = f"PersistentVolume {mount.pv}"
    for problem in mount.problems:
        yield Violation(NAME, subject, problem)
    policies = [p for p in view.aws("aws:efs/fileSystemPolicy:FileSystemPolicy")
                if p.inputs.get("fileSystemId") == mount.file_system_id]
    fs_policy = _statements(policies[0].inputs.get("policy")) if policies else None
    ap_arn = next((str(ap.outputs.get("arn")) for ap in view.aws("aws:efs/accessPoint:AccessPoint")
                   if ap.outputs.get("id") == mount.access_point_id), None) if mount.access_point_id else None
    if mount.access_point_id and ap_arn is None:
        yield Violation(NAME, subject, f"access point {mount.access_point_id} is not in the plan: its ARN, which "
                                       "the file-system policy is checked against, is unknown")
        return
    context = {"aws:SecureTransport": "true" if mount.tls else "false",
               "elasticfilesystem:AccessedViaMountTarget": "true"}
    identities = node_identities(view) if mount.iam else [Identity(None)]
    actions = [MOUNT, WRITE] if _claim_needs_write(view, pv) else [MOUNT]
    for who in identities:
        ctx = dict(context)
        if who.role_arn is not None and ap_arn:
            ctx["elasticfilesystem:AccessPointArn"] = ap_arn
        for action in actions:
            try:
                ok, why = decide(action, _fs_arn(mount.file_system_id, ap_arn), ctx, fs_policy, who)
            except Unsupported as e:
                yield Violation(NAME, subject, f"the file-system or identity policy uses {e}, which this check "
                                               "does not evaluate; EFS's decision is unknown")
                break
            if not ok:
                how = "without iam (anonymous)" if who.role_arn is None and not mount.iam else \
                    f"with iam as {who.role_arn} ({who.how})"
                yield Violation(NAME, subject, f"{action} on {mount.file_system_id} through "
                                               f"{mount.access_point_id or 'no access point'} {how}: {why}; "
                                               "the pod would stay in ContainerCreating ('access denied by "
                                               "server')")


@contract(NAME)
def efs_mounts_permitted(view: PlanView) -> list[Violation]:
    """Every EFS mount of the plan is permitted by its file-system policy as the CSI node plugin makes it."""
    out: list[Violation] = []
    for pv in view.kind("PersistentVolume"):
        mount = mount_of(pv)
        if mount is not None:
            out.extend(check_mount(view, pv, mount))
    return out
