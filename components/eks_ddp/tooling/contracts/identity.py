"""Identity contract, images: every image a pod references is pullable by the role that pulls it, and pinned.

**Who pulls.** On EKS nodes the kubelet pulls ECR images with the node IAM role: "Permissions for the kubelet to
use container images from Amazon Elastic Container Registry (Amazon ECR), such as provided by the
AmazonEC2ContainerRegistryPullOnly policy" (EKS user guide, "Amazon EKS node IAM role", create-node-role.html);
"The Amazon EKS worker node IAM role (NodeInstanceRole) is required" with ``ecr:BatchGetImage``,
``ecr:GetDownloadUrlForLayer`` and ``ecr:GetAuthorizationToken`` (ECR user guide, "Using Amazon ECR Images with
Amazon EKS", ECR_on_EKS.html). A pod lands on a managed node group whose labels satisfy its ``nodeSelector``
(``aws:eks/nodeGroup`` ``labels``), and is pulled with that group's ``nodeRoleArn``: every such group's role must
be allowed.

**What a pull needs.** ``ecr:GetAuthorizationToken`` on ``*`` (it has no resource-level permission) and
``ecr:BatchGetImage`` + ``ecr:GetDownloadUrlForLayer`` on the repository's ARN
(``arn:<partition>:ecr:<region>:<account>:repository/<name>``, from the image's registry host).

**How IAM decides** (IAM user guide, "Policy evaluation logic", reference_policies_evaluation-logic.html, and "The
difference between explicit and implicit denies"): a request is allowed only if an applicable statement allows
it and no applicable statement denies it; an explicit Deny wins over any Allow; nothing applicable is an implicit
deny. A statement applies when its ``Action`` (or everything but its ``NotAction``) matches the action, case
insensitively, and its ``Resource`` (or everything but its ``NotResource``) matches the ARN, case sensitively;
both take the wildcards ``*`` (any run of characters) and ``?`` (one character) (IAM JSON policy element
reference, "Action", "Resource"); :mod:`.iam_policy` evaluates them. The role's policies are its inline policies (``aws:iam/rolePolicy``, the role's
``inlinePolicies``) and its managed ones (``aws:iam/rolePolicyAttachment``, ``managedPolicyArns``): customer
managed documents from ``aws:iam/policy`` in the plan, AWS managed ECR policies from their published documents
(``AWS_MANAGED``; the AWS managed policy reference). What cannot be evaluated here is taken against the pull: an
Allow with a ``Condition`` grants nothing (the request context is unknown), a Deny with one denies, a managed
policy neither in the plan nor in ``AWS_MANAGED`` grants nothing.

Not checked (outside the plan): permission boundaries and SCPs (none in this project), and the repository policy
of another account's repository, which a cross-account pull also needs (IAM user guide, "Cross-account policy
evaluation logic"; preflight's ``ecr:DescribeImages`` and the docs cover it). Within one account the identity
policy alone suffices ("Policy evaluation for requests within a single account").

**Pinned.** Every pod image names a digest (``@sha256:<64 hex>``): a tag can move to other content under a Job that
the cluster re-creates, a digest cannot (Kubernetes "Images": "the image digest ... always the same").

Images outside ECR (quay.io, nvcr.io, public.ecr.aws ...) need no IAM grant: the kubelet does not use the node
role for them; they are checked for the digest only. Pods that Helm releases create (device plugins, the
autoscaler) are not rendered manifests and so not checked here; the node role's add-on registry grant
(``eks_ddp.infra.cluster.node_image_pull_policy``) covers their ECR images.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from eks_ddp.infra.image import ecr_repository_arn
from eks_ddp.tooling.mocks import Recorded

from . import PlanView, Violation, contract
from .iam_policy import DENY, UNKNOWNS_AGAINST, Request, evaluate, glob_match

PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")
"""What a pull asks of the repository (the token comes first, from ``ecr:GetAuthorizationToken`` on ``*``)."""
TOKEN_ACTION = "ecr:GetAuthorizationToken"

_READ_ONLY = ["ecr:GetAuthorizationToken", "ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer",
              "ecr:GetRepositoryPolicy", "ecr:DescribeRepositories", "ecr:ListImages", "ecr:DescribeImages",
              "ecr:BatchGetImage", "ecr:GetLifecyclePolicy", "ecr:GetLifecyclePolicyPreview",
              "ecr:ListTagsForResource", "ecr:DescribeImageScanFindings"]
AWS_MANAGED: dict[str, list[dict[str, Any]]] = {
    # The AWS managed policy reference's JSON documents (the ECR statements; the EKS node policies have none).
    "AmazonEC2ContainerRegistryReadOnly": [{"Effect": "Allow", "Action": _READ_ONLY, "Resource": "*"}],
    "AmazonEC2ContainerRegistryPullOnly": [{"Effect": "Allow", "Resource": "*", "Action": [
        "ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]}],
    "AmazonEC2ContainerRegistryPowerUser": [{"Effect": "Allow", "Resource": "*", "Action": [
        *_READ_ONLY, "ecr:InitiateLayerUpload", "ecr:UploadLayerPart", "ecr:CompleteLayerUpload", "ecr:PutImage"]}],
    "AmazonEC2ContainerRegistryFullAccess": [{"Effect": "Allow", "Action": ["ecr:*"], "Resource": "*"}],
    "AmazonEKSWorkerNodePolicy": [],
    "AmazonEKS_CNI_Policy": [],
}
_AWS_MANAGED_ARN = re.compile(r"^arn:aws[a-z-]*:iam::aws:policy/(?:.*/)?(?P<name>[^/]+)$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
POD_KINDS = ("Pod", "Job", "CronJob", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")


# --- IAM evaluation (components/eks_ddp/tooling/contracts/iam_policy.py; here the pull's own rules) -------------------

def wildcard(pattern: str, value: str, *, case_sensitive: bool) -> bool:
    """IAM's ``*``/``?`` matching of one Action or Resource entry (:func:`.iam_policy.glob_match`)."""
    return glob_match(pattern, value, fold=not case_sensitive)


def decide(statements: list[dict[str, Any]], action: str, resource: str) -> tuple[bool, str]:
    """IAM's decision for one request over an identity's statements: (allowed, why).

    The request context is unknown here, so what cannot be evaluated is taken against the pull
    (:data:`.iam_policy.UNKNOWNS_AGAINST`): a possible deny is taken as one, a conditional Allow grants nothing.
    """
    d = evaluate({"Statement": statements}, Request("", action, resource), unknowns=UNKNOWNS_AGAINST,
                 label=lambda _, st: str(st.get("_from", "a policy")))
    if d.effect == DENY:
        return False, f"explicitly denied by {d.statements[0]}"
    if d.allowed:
        return True, f"allowed by {d.statements[0]}"
    return False, "implicitly denied: no statement without a Condition allows it"


def _statements(document: Any, source: str) -> list[dict[str, Any]]:
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except json.JSONDecodeError:
            return []
    if not isinstance(document, dict):
        return []
    return [{**st, "_from": source} for st in _listed_dicts(document.get("Statement"))]


def _listed_dicts(value: Any) -> list[dict[str, Any]]:
    return [value] if isinstance(value, dict) else [v for v in value or [] if isinstance(v, dict)]


def role_statements(view: PlanView, role: Recorded) -> list[dict[str, Any]]:
    """Every statement of the role's inline and managed policies in the plan."""
    names = {role.outputs.get("name"), role.outputs.get("id"), role.name}
    out: list[dict[str, Any]] = []
    for inline in role.inputs.get("inlinePolicies") or []:
        out += _statements(inline.get("policy"), f"inline policy {inline.get('name')!r}")
    for p in view.aws("aws:iam/rolePolicy:RolePolicy"):
        if p.inputs.get("role") in names:
            out += _statements(p.inputs.get("policy"), f"inline policy {p.name!r}")
    arns = list(role.inputs.get("managedPolicyArns") or [])
    arns += [a.inputs.get("policyArn") for a in view.aws("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
             if a.inputs.get("role") in names]
    customer = {p.outputs.get("arn"): p for p in view.aws("aws:iam/policy:Policy")}
    for arn in arns:
        if arn in customer:
            out += _statements(customer[arn].inputs.get("policy"), f"managed policy {customer[arn].name!r}")
        elif (m := _AWS_MANAGED_ARN.match(arn or "")) and m["name"] in AWS_MANAGED:
            out += [{**st, "_from": f"AWS managed {m['name']}"} for st in AWS_MANAGED[m["name"]]]
    return out


# --- pods and the roles that pull for them --------------------------------------------------------

def pod_specs(view: PlanView) -> Iterator[tuple[str, dict[str, Any]]]:
    """(``Kind/name``, pod spec) of every rendered object that makes pods."""
    for m in view.manifests:
        kind = m.get("kind")
        if kind not in POD_KINDS:
            continue
        spec = m.get("spec") or {}
        if kind == "CronJob":
            spec = ((spec.get("jobTemplate") or {}).get("spec") or {})
        if kind != "Pod":
            spec = ((spec.get("template") or {}).get("spec") or {})
        yield f"{kind}/{(m.get('metadata') or {}).get('name')}", spec


def containers(spec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for field in ("initContainers", "containers"):
        for c in spec.get(field) or []:
            yield f"{field}[{c.get('name')}]", str(c.get("image") or "")


def node_roles(view: PlanView, node_selector: dict[str, str]) -> list[tuple[str, Recorded | None, str]]:
    """(node group, its role or None, role ARN) for every managed node group a pod with ``node_selector`` may use."""
    roles = {r.outputs.get("arn"): r for r in view.aws("aws:iam/role:Role")}
    out = []
    for g in view.aws("aws:eks/nodeGroup:NodeGroup"):
        labels = g.inputs.get("labels") or {}
        if all(labels.get(k) == v for k, v in (node_selector or {}).items()):
            arn = g.inputs.get("nodeRoleArn", "")
            out.append((g.name, roles.get(arn), arn))
    return out


def can_pull(statements: list[dict[str, Any]], repository_arn: str) -> tuple[bool, str]:
    ok, why = decide(statements, TOKEN_ACTION, "*")
    if not ok:
        return False, f"{TOKEN_ACTION} on *: {why}"
    for action in PULL_ACTIONS:
        ok, why = decide(statements, action, repository_arn)
        if not ok:
            return False, f"{action} on {repository_arn}: {why}"
    return True, ""


@contract("image-pull")
def every_pod_image_is_pullable(view: PlanView) -> list[Violation]:
    """Each ECR image of each pod is pullable by the node role of every node group the pod may land on."""
    out: list[Violation] = []
    cache: dict[str, list[dict[str, Any]]] = {}
    for subject, spec in pod_specs(view):
        groups = node_roles(view, spec.get("nodeSelector") or {})
        for where, image in containers(spec):
            repo = ecr_repository_arn(image)
            if repo is None:
                continue
            if not groups:
                out.append(Violation("image-pull", f"{subject} {where}", f"{image}: no managed node group's labels "
                                     f"satisfy nodeSelector {spec.get('nodeSelector')}; nothing can pull it"))
            for group, role, arn in groups:
                if role is None:
                    out.append(Violation("image-pull", f"{subject} {where}",
                                         f"{image}: node group {group}'s role {arn!r} is not in the plan"))
                    continue
                statements = cache.setdefault(role.urn, role_statements(view, role))
                ok, why = can_pull(statements, repo)
                if not ok:
                    out.append(Violation("image-pull", f"{subject} {where}", (
                        f"{image}: node role {role.outputs.get('name', role.name)!r} (node group {group}) may not "
                        f"pull it ({why}); the pod would stay in ImagePullBackOff")))
    return out


@contract("image-digest")
def every_pod_image_is_pinned(view: PlanView) -> list[Violation]:
    """Each image of each pod names a digest."""
    return [Violation("image-digest", f"{subject} {where}",
                      f"{image!r} is not pinned by digest; expected <repository>@sha256:<64 hex>")
            for subject, spec in pod_specs(view) for where, image in containers(spec) if not DIGEST.search(image)]
