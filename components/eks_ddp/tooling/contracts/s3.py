"""Contract "s3": every S3 request and KMS key use a pod makes is allowed by every policy AWS consults for it.

The requests are derived from the rendered Jobs and CronJobs, as the pods would make them:

- the S3 data stage (``python -m eks_ddp_runtime.stage_s3 s3://bucket/prefix/ DEST``): ``s3:ListBucket`` on the
  bucket with ``s3:prefix`` = the prefix (``ListObjectsV2``), ``s3:GetObject`` under the prefix (``HeadObject``
  and ``GetObject`` are both authorised as ``s3:GetObject``), checked at one representative key under it;
- the results upload (``EKS_DDP_RESULTS_URL`` = ``s3://bucket/runs/<id>/``, ``training/eks_ddp_trainer/upload.py``):
  ``s3:PutObject`` of each result file, naming SSE-KMS and ``EKS_DDP_RESULTS_KMS_KEY`` when the Job sets it, and the
  multipart parts of the model, which carry no encryption header (``UploadPart`` is authorised as ``s3:PutObject``);
  under SSE-KMS, ``kms:GenerateDataKey`` and ``kms:Decrypt`` (completing a multipart upload) on the key, which S3
  calls with the pod's credentials (S3 user guide "Specifying server-side encryption with AWS KMS (SSE-KMS)":
  "you need kms:GenerateDataKey ... kms:Decrypt for multipart uploads").

Each request is checked against, in the way AWS combines them (IAM user guide "Policy evaluation logic" and
"Cross-account policy evaluation logic"; the evaluator is :mod:`eks_ddp.tooling.contracts.iam_policy`):

(a) the pod's role: the ServiceAccount's ``eks.amazonaws.com/role-arn`` annotation (EKS user guide "IAM roles for
    service accounts"), that role's trust policy admitting ``system:serviceaccount:<namespace>:<name>`` through
    ``sts:AssumeRoleWithWebIdentity``, and the role's inline and attached policies in the plan;
(b) the bucket policy, where the plan has the bucket: an explicit Deny refuses; in the bucket owner's account an
    Allow in the role's policies or in the bucket policy suffices, across accounts both must allow;
(c) the VPC endpoint policy of the S3 *gateway* endpoint: it sees every request from the subnets whose route
    tables it is attached to, for buckets in its own Region (AWS PrivateLink guide, "Gateway endpoints for Amazon
    S3": "A gateway endpoint is available only in the Region where you created it"; endpoint policies "control
    access ... through the endpoint"). The stack's nodes, so its pods, are in those private subnets; a bucket
    outside the plan is taken to be in the stack's Region (the case where the endpoint applies);
(d) for a KMS key, its key policy (the default key policy when the plan sets none: AWS KMS developer guide
    "Default key policy": the account root, so IAM policies decide) and the role's policies, with
    ``kms:ViaService`` = ``s3.<region>.<DNS suffix of the partition>`` and ``kms:CallerAccount``.

What the plan cannot say stays unknown and is reported as such, never guessed: the owner account, the default
encryption and the policy of a bucket the plan does not create (an adopted results bucket, a data set), condition
keys no request sets. A required request that cannot be shown to be allowed is a violation whose message names
the unknown. :class:`Facts` supplies what preflight reads from AWS (owner, default key), for tests and callers
that know it. Not covered: what a custom workload reads from S3 by itself (no plan object names it), and the KMS
keys of data-set objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eks_ddp.core import rules
from eks_ddp.workloads.elastic_job.data_stage import STAGE_MODULE
from eks_ddp_runtime.contract import RESULTS_KMS_KEY_ENV as RESULTS_KMS_ENV
from eks_ddp_runtime.contract import RESULTS_URL_ENV as RESULTS_ENV

from . import PlanView, Violation, contract
from .iam_policy import ALLOW, DENY, UNKNOWN, Decision, Request, evaluate, evaluate_all

NAME = "s3"
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
RESULT_FILES = ("metrics.json", "history.jsonl", "training-curve.png", "model.pt")
"""eks_ddp_trainer.upload.FILES (the library never imports the trainer; tests/tooling/contracts/test_s3.py keeps them equal)."""
MULTIPART_FILES = ("model.pt",)
"""Results large enough for boto3's multipart upload (8 MiB threshold): their parts carry no SSE header."""
SAMPLE_KEY = "eks-ddp-contract-sample"
"""The representative object name under a data set's prefix."""
_SSE = "s3:x-amz-server-side-encryption"
_SSE_KEY = "s3:x-amz-server-side-encryption-aws-kms-key-id"
_SSE_C = "s3:x-amz-server-side-encryption-customer-algorithm"


@dataclass(frozen=True)
class Facts:
    """What the plan cannot know about buckets it does not create (preflight reads these from AWS)."""

    bucket_owners: Mapping[str, str] = field(default_factory=dict)
    """Bucket name -> owner account id."""
    bucket_keys: Mapping[str, str] = field(default_factory=dict)
    """Bucket name -> the KMS key ARN of its default SSE-KMS encryption."""
    bucket_regions: Mapping[str, str] = field(default_factory=dict)
    """Bucket name -> Region (default: the stack's)."""


@dataclass(frozen=True)
class Use:
    """One S3 request a pod makes, with the KMS calls S3 makes for it on the pod's credentials."""

    subject: str
    namespace: str
    service_account: str
    action: str
    bucket: str
    key: str | None = None
    prefix: str | None = None
    headers: Mapping[str, str | None] = field(default_factory=dict)
    kms_key: str | None = None
    kms_actions: tuple[str, ...] = ()
    why: str = ""

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key if self.key is not None else self.prefix or ''}"


# --- the requests pods make ------------------------------------------------------------------------------
def _pod_specs(view: PlanView) -> Iterable[tuple[str, str, dict[str, Any]]]:
    for kind in ("Job", "CronJob"):
        for m in view.kind(kind):
            spec = m.get("spec") or {}
            if kind == "CronJob":
                spec = (spec.get("jobTemplate") or {}).get("spec") or {}
            pod = ((spec.get("template") or {}).get("spec")) or {}
            meta = m.get("metadata") or {}
            yield f"{kind} {meta.get('namespace', 'default')}/{meta.get('name')}", meta.get("namespace", "default"), pod


def _split(uri: str) -> tuple[str, str]:
    bucket, _, rest = uri.removeprefix("s3://").partition("/")
    return bucket, rest


def uses(view: PlanView, facts: Facts | None = None) -> list[Use]:
    """Every S3 request the plan's pods make (see the module docstring)."""
    facts = facts or Facts()
    plan = _Plan(view)
    out: list[Use] = []
    for subject, ns, pod in _pod_specs(view):
        sa = pod.get("serviceAccountName") or "default"
        for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            argv = [str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
            if STAGE_MODULE in argv:
                i = argv.index(STAGE_MODULE)
                if i + 1 < len(argv) and argv[i + 1].startswith("s3://"):
                    bucket, prefix = _split(argv[i + 1])
                    why = f"the data stage reads {argv[i + 1]}"
                    out.append(Use(subject, ns, sa, "s3:ListBucket", bucket, prefix=prefix, why=why))
                    out.append(Use(subject, ns, sa, "s3:GetObject", bucket, key=prefix + SAMPLE_KEY, why=why,
                                   kms_key=facts.bucket_keys.get(bucket),
                                   kms_actions=("kms:Decrypt",) if bucket in facts.bucket_keys else ()))
            env = {e.get("name"): e.get("value") for e in c.get("env") or [] if isinstance(e.get("value"), str)}
            url = env.get(RESULTS_ENV)
            if url and url.startswith("s3://"):
                bucket, prefix = _split(url)
                key_arn = env.get(RESULTS_KMS_ENV)
                default_key = _default_key(plan, bucket, facts)
                named = {_SSE: "aws:kms", _SSE_KEY: key_arn} if key_arn else {_SSE: None, _SSE_KEY: None}
                kms = key_arn or default_key
                why = f"rank 0 uploads the results to {url}"
                for name in RESULT_FILES:
                    out.append(Use(subject, ns, sa, "s3:PutObject", bucket, key=prefix + name, headers=named, why=why,
                                   kms_key=kms, kms_actions=("kms:GenerateDataKey", "kms:Decrypt") if kms else ()))
                for name in MULTIPART_FILES:
                    out.append(Use(subject, ns, sa, "s3:PutObject", bucket, key=prefix + name, why=why + " (a part)",
                                   headers={_SSE: None, _SSE_KEY: None}))
    return out


# --- the plan's AWS side ---------------------------------------------------------------------------------
class _Plan:
    """The AWS resources the contract reads, indexed."""

    def __init__(self, view: PlanView):
        self.roles = {r.outputs.get("arn"): r for r in view.aws("aws:iam/role:Role") if r.outputs.get("arn")}
        self.role_policies: dict[str, list[str]] = {}
        for p in view.aws("aws:iam/rolePolicy:RolePolicy"):
            self.role_policies.setdefault(str(p.inputs.get("role")), []).append(p.inputs.get("policy") or "{}")
        managed = {p.outputs.get("arn"): p.inputs.get("policy") for p in view.aws("aws:iam/policy:Policy")}
        self.attached: dict[str, list[tuple[str, str | None]]] = {}
        for a in view.aws("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
            arn = str(a.inputs.get("policyArn"))
            self.attached.setdefault(str(a.inputs.get("role")), []).append((arn, managed.get(arn)))
        self.buckets = {}
        for typ in ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2"):
            for b in view.aws(typ):
                self.buckets[b.outputs.get("bucket") or b.outputs.get("id")] = b
        self.bucket_policies = {p.inputs.get("bucket"): p.inputs.get("policy")
                                for p in view.aws("aws:s3/bucketPolicy:BucketPolicy")}
        self.encryption: dict[str | None, dict[str, Any]] = {}
        typ = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
        for e in view.aws(typ):
            rules = e.inputs.get("rules") or [{}]
            self.encryption[e.inputs.get("bucket")] = dict(rules[0].get("applyServerSideEncryptionByDefault") or {})
        self.keys = {k.outputs["arn"]: k for k in view.aws("aws:kms/key:Key") if k.outputs.get("arn")}
        self.endpoints = [e for e in view.aws("aws:ec2/vpcEndpoint:VpcEndpoint")
                          if (e.inputs.get("vpcEndpointType") or "Gateway") == "Gateway"
                          and str(e.inputs.get("serviceName", "")).endswith(".s3")]

    def policies_of(self, role: Any) -> tuple[list[str], list[str]]:
        """(evaluable identity policies, names of attached policies the plan does not hold)."""
        ids = {str(role.outputs.get("id")), str(role.outputs.get("name")), str(role.inputs.get("name")), role.name}
        docs = [d for i in ids for d in self.role_policies.get(i, [])]
        docs += [p["policy"] for p in role.inputs.get("inlinePolicies") or [] if p.get("policy")]
        opaque = []
        for i in ids:
            for arn, doc in self.attached.get(i, []):
                (docs.append(doc) if doc else opaque.append(arn))
        return list(dict.fromkeys(docs)), sorted(set(opaque))


def _default_key(plan: _Plan, bucket: str, facts: Facts) -> str | None:
    """The bucket's default SSE-KMS key: from the plan's encryption configuration, else from ``facts``."""
    enc = plan.encryption.get(bucket) if bucket not in facts.bucket_keys else None
    if enc and str(enc.get("sseAlgorithm", "")).startswith("aws:kms"):
        return enc.get("kmsMasterKeyId")
    return facts.bucket_keys.get(bucket)


def _region_of_endpoint(endpoint: Any) -> str:
    return str(endpoint.inputs.get("serviceName", "")).removeprefix("cn.").split(".")[2]


def _account(arn: str) -> str:
    parts = arn.split(":")
    return parts[4] if len(parts) > 4 else ""


def _partition(arn: str) -> str:
    parts = arn.split(":")
    return parts[1] if len(parts) > 1 else "aws"


def _stack_region(plan: _Plan) -> str | None:
    if plan.endpoints:
        return _region_of_endpoint(plan.endpoints[0])
    for arn in plan.keys:
        if len(arn.split(":")) > 3:
            return arn.split(":")[3]
    return None


def _default_key_policy(account: str, partition: str) -> str:
    """AWS KMS "Default key policy": the account (root) may do everything, so IAM policies decide."""
    return json.dumps({"Statement": [{"Sid": "Enable IAM User Permissions", "Effect": "Allow",
                                      "Principal": {"AWS": f"arn:{partition}:iam::{account}:root"},
                                      "Action": "kms:*", "Resource": "*"}]})


# --- the check -------------------------------------------------------------------------------------------
def violations(view: PlanView, facts: Facts | None = None) -> list[Violation]:
    """Every request of :func:`uses` that some policy refuses, or that cannot be shown to be allowed."""
    facts = facts or Facts()
    plan = _Plan(view)
    region = _stack_region(plan)
    sas = {((m.get("metadata") or {}).get("namespace", "default"), (m.get("metadata") or {}).get("name")): m
           for m in view.kind("ServiceAccount")}
    out: list[Violation] = []
    seen: set[tuple[str, str]] = set()
    for use in uses(view, facts):
        for problem in _check(plan, sas, use, facts, region):
            if (use.subject, problem) not in seen:
                seen.add((use.subject, problem))
                out.append(Violation(NAME, use.subject, problem))
    return out


@contract(NAME)
def s3_access(view: PlanView) -> list[Violation]:
    return violations(view)


def _check(plan: _Plan, sas: Mapping[tuple[str, str | None], Any], use: Use, facts: Facts, region: str | None) -> list[str]:
    what = f"{use.action} on {use.uri} ({use.why})"
    sa = sas.get((use.namespace, use.service_account))
    role_arn = ((sa or {}).get("metadata") or {}).get("annotations", {}).get(IRSA_ANNOTATION)
    if not role_arn:
        return [f"{what}: ServiceAccount {use.namespace}/{use.service_account} has no {IRSA_ANNOTATION} "
                "annotation, so the pod has no AWS credentials and S3 refuses the request; expected a role (IRSA)"]
    role = plan.roles.get(role_arn)
    if role is None:
        return [f"{what}: role {role_arn} (ServiceAccount {use.namespace}/{use.service_account}) is not in the plan, "
                "so its policies cannot be checked (unknown)"]
    problems: list[str] = []
    trust = _trust(role, use)
    if not trust.allowed:
        problems.append(f"{what}: role {role_arn} does not let ServiceAccount {use.namespace}/{use.service_account} "
                        f"assume it (sts:AssumeRoleWithWebIdentity: {trust})")
    account, partition = _account(role_arn), _partition(role_arn)
    in_plan = use.bucket in plan.buckets
    owner = account if in_plan else facts.bucket_owners.get(use.bucket)
    bucket_region = region if in_plan else facts.bucket_regions.get(use.bucket, region)
    endpoint = next((e for e in plan.endpoints if bucket_region and _region_of_endpoint(e) == bucket_region), None)
    s3_partition = rules.partition(region) if region else partition  # S3 ARNs name the stack's partition
    resource = f"arn:{s3_partition}:s3:::{use.bucket}" + (f"/{use.key}" if use.key is not None else "")
    ctx: dict[str, Any] = {
        "aws:SecureTransport": "true", "aws:PrincipalArn": role_arn, "aws:PrincipalAccount": account,
        "aws:SourceVpce": endpoint.outputs.get("id") if endpoint else None,
        "s3:prefix": use.prefix if use.action == "s3:ListBucket" else None,
        _SSE: None, _SSE_KEY: None, _SSE_C: None, **use.headers}
    if owner:
        ctx["aws:ResourceAccount"] = owner
    req = Request(role_arn, use.action, resource, ctx)
    policies, opaque = plan.policies_of(role)
    identity = evaluate_all(policies, req)
    if opaque and identity.effect != ALLOW and identity.effect != DENY:
        identity = Decision(UNKNOWN, identity.statements, (*identity.unknown, *(f"policy {a}" for a in opaque)))
    bucket_policy = plan.bucket_policies.get(use.bucket)
    on_bucket = evaluate(bucket_policy, req, resource_policy=True) if bucket_policy else None
    if identity.effect == DENY:
        problems.append(f"{what}: refused by role {role_arn}'s policies ({identity})")
    if on_bucket is not None and on_bucket.effect == DENY:
        problems.append(f"{what}: refused by the bucket policy of {use.bucket} ({on_bucket})")
    if endpoint is not None:
        raw = endpoint.inputs.get("policy")
        through = evaluate(raw, req, resource_policy=True) if raw else Decision(ALLOW, ("default full access",))
        if not through.allowed:
            problems.append(f"{what}: the S3 gateway endpoint {endpoint.name} (every same-Region S3 request of the "
                            f"private subnets passes it) does not allow it ({through}); expected an Allow for "
                            f"{use.bucket} in its policy (network.s3EndpointExtraBuckets, or the run's data.s3)")
    same_account = owner == account if owner else None
    granted = identity.allowed or (same_account and on_bucket is not None and on_bucket.allowed
                                   and not on_bucket.via_account)
    if not granted and identity.effect != DENY:
        unknown = identity.effect == UNKNOWN or (same_account is None and on_bucket is None)
        problems.append(f"{what}: role {role_arn}'s policies do not allow it ({identity})"
                        + ("" if on_bucket is None else f", nor does the bucket policy ({on_bucket})")
                        + ("; unknown: it may still be allowed by what the plan does not hold" if unknown and
                           identity.effect == UNKNOWN else ""))
    if same_account is False and on_bucket is not None and not on_bucket.allowed and on_bucket.effect != DENY:
        problems.append(f"{what}: bucket {use.bucket} is another account's ({owner}) and its policy does not allow "
                        f"the role ({on_bucket})")
    if use.kms_key:
        problems += _check_kms(plan, use, what, role_arn, policies, opaque, region)
    return problems


def _trust(role: Any, use: Use) -> Decision:
    """IRSA: the role's trust policy for the pod's projected token (issuer's ``sub`` and ``aud``)."""
    doc = json.loads(role.inputs.get("assumeRolePolicy") or "{}")
    providers = {p for s in doc.get("Statement", []) if isinstance(s.get("Principal"), dict)
                 for p in (s["Principal"].get("Federated") if isinstance(s["Principal"].get("Federated"), list)
                           else [s["Principal"].get("Federated")]) if p and ":oidc-provider/" in p}
    if len(providers) != 1:
        return Decision(UNKNOWN, (), (f"{len(providers)} OIDC providers in the trust policy",))
    provider = providers.pop()
    issuer = provider.split(":oidc-provider/", 1)[1]
    ctx = {f"{issuer}:sub": f"system:serviceaccount:{use.namespace}:{use.service_account}",
           f"{issuer}:aud": "sts.amazonaws.com"}
    return evaluate(doc, Request(provider, "sts:AssumeRoleWithWebIdentity", str(role.outputs.get("arn")), ctx),
                    resource_policy=True)


def _check_kms(plan: _Plan, use: Use, what: str, role_arn: str, policies: list[str], opaque: list[str],
               region: str | None) -> list[str]:
    key = str(use.kms_key)
    account, partition = _account(role_arn), _partition(role_arn)
    key_region = key.split(":")[3] if len(key.split(":")) > 3 and key.split(":")[3] else region
    suffix = rules.dns_suffix(rules.partition(key_region) if key_region else partition)
    ctx = {"kms:ViaService": f"s3.{key_region}.{suffix}",
           "kms:CallerAccount": account, "aws:PrincipalArn": role_arn, "aws:PrincipalAccount": account,
           "aws:SecureTransport": "true", "aws:ResourceAccount": _account(key) or None}
    found = plan.keys.get(key)
    key_policy = (found.inputs.get("policy") or _default_key_policy(_account(key), partition)) if found else None
    problems = []
    for action in use.kms_actions:
        req = Request(role_arn, action, key, ctx)
        identity = evaluate_all(policies, req)
        on_key = evaluate(key_policy, req, resource_policy=True) if key_policy else None
        label = f"{what}: {action} on KMS key {key} (S3 calls it with the pod's credentials)"
        if identity.effect == DENY or (on_key is not None and on_key.effect == DENY):
            problems.append(f"{label}: refused ({identity if identity.effect == DENY else on_key})")
        elif on_key is not None and on_key.allowed and not on_key.via_account and _account(key) == account:
            continue  # the key policy names the role itself
        elif not identity.allowed:
            more = f"; attached policies not in the plan: {', '.join(opaque)}" if opaque else ""
            problems.append(f"{label}: role {role_arn}'s policies do not allow it ({identity}){more}; expected a "
                            "grant on the key (storage.resultsKmsKeyArn for a re-attached results bucket)")
        elif on_key is not None and not on_key.allowed:
            problems.append(f"{label}: the key policy does not allow it ({on_key})")
    return problems
