"""IAM pieces every infra room and the per-run Jobs share: the IRSA trust policy, the pods' uid, the S3 stage's role.

IRSA ("IAM roles for service accounts", EKS user guide, associate-service-account-role.html): a role trusts the
cluster's OIDC provider for ``sts:AssumeRoleWithWebIdentity`` under the conditions ``<issuer>:sub`` =
``system:serviceaccount:<namespace>:<name>`` and ``<issuer>:aud`` = ``sts.amazonaws.com``; the pod-identity webhook
gives a pod of that ServiceAccount the token and ``AWS_ROLE_ARN``. Every role of the stack that a pod assumes
(the CSI drivers', the autoscaler's, CloudWatch's, the results uploaders', the S3 data stage's) is trusted
through :func:`irsa_trust_policy`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from eks_ddp.core.workload import S3Data

TRAINER_UID = 1000
"""The uid every pod of a run runs as (the trainer image's user): EFS access points and the FSx layout own
the shared directories as it."""
TRAINER_GID = 1000


def irsa_trust_policy(oidc_provider_arn: str, issuer_url: str, namespace: str,
                      service_account: str | Sequence[str]) -> str:
    """Trust policy letting exactly the named Kubernetes service account(s) assume a role through the OIDC provider."""
    issuer = issuer_url.removeprefix("https://")
    names = [service_account] if isinstance(service_account, str) else list(service_account)
    subjects = [f"system:serviceaccount:{namespace}:{n}" for n in names]
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow",
        "Principal": {"Federated": oidc_provider_arn},
        "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {"StringEquals": {
            f"{issuer}:sub": subjects[0] if len(subjects) == 1 else subjects,
            f"{issuer}:aud": "sts.amazonaws.com",
        }},
    }]})




def read_prefix_policy(data: S3Data, partition: str = "aws") -> str:
    """List exactly the prefix, read objects under it: the stage's only permissions."""
    bucket_arn = f"arn:{partition}:s3:::{data.bucket}"
    listing: dict = {"Sid": "ListThePrefixOnly", "Effect": "Allow", "Action": "s3:ListBucket",
                     "Resource": bucket_arn}
    if data.prefix:
        listing["Condition"] = {"StringEquals": {"s3:prefix": data.prefix}}
    return json.dumps({"Version": "2012-10-17", "Statement": [
        listing,
        {"Sid": "ReadUnderThePrefixOnly", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": f"{bucket_arn}/{data.prefix}*"},
        decrypt_through_s3(bucket_arn, data.prefix),
    ]})


def decrypt_through_s3(bucket_arn: str, prefix: str) -> dict:
    """``kms:Decrypt`` for objects under ``prefix`` that S3 encrypted with a customer-managed KMS key (SSE-KMS), and
    for nothing else: only when S3 asks on the role's behalf (``kms:ViaService`` ``s3.*``: AWS KMS developer guide,
    "kms:ViaService") and only for this bucket's objects under the prefix, or the bucket itself when it uses an S3
    Bucket Key (``kms:EncryptionContext:aws:s3:arn``: S3 user guide, "Using server-side encryption with AWS KMS
    keys", "Encryption context": the object's ARN, or the bucket's ARN with a Bucket Key). The key's ARN is not
    known (a data set's bucket may be another account's), hence ``Resource: *`` under those conditions; the key's own
    policy must still allow this account (a cross-account key's owner grants that). Without it a GetObject of an
    SSE-KMS object is refused (S3 user guide: "you need kms:Decrypt permission" to read it). SSE-S3 objects need
    no KMS permission; this statement then grants nothing used."""
    return {"Sid": "DecryptTheseObjectsThroughS3Only", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*",
            "Condition": {"StringLike": {"kms:ViaService": "s3.*",
                                         "kms:EncryptionContext:aws:s3:arn": [bucket_arn, f"{bucket_arn}/{prefix}*"]}}}


def stage_service_account(job_component_name: str) -> str:
    """The stage pods' ServiceAccount: the only one the data role trusts."""
    return f"{job_component_name}-stage"


_TRUSTS = "_eks_ddp_stage_trust"
"""Attribute of the role ARN Output :func:`data_stage_role` returns: the (namespace, ServiceAccount) it trusts."""


def data_stage_role(name: str, data: S3Data, *, oidc_provider_arn: pulumi.Input[str],
                    oidc_provider_url: pulumi.Input[str], namespace: pulumi.Input[str], job_name: str | None = None,
                    service_account: str | None = None, partition: str = "aws",
                    opts: pulumi.ResourceOptions | None = None) -> pulumi.Output[str]:
    """An IRSA role (its ARN) that may only list and read ``data``'s prefix: pass it as
    ``ElasticJobArgs.data_role_arn`` of the ElasticJob named ``job_name`` (the component name), whose stage pods
    run as ``stage_service_account(job_name)``, the one ServiceAccount the role trusts. (``service_account``
    instead names that ServiceAccount itself; the ElasticJob refuses a role that trusts another one.)"""
    if (job_name is None) == (service_account is None):
        raise ValueError(f"job_name/service_account: got job_name={job_name!r}, service_account={service_account!r}; "
                         "expected exactly one: the ElasticJob's name (preferred), or its stage ServiceAccount "
                         "(stage_service_account(<ElasticJob name>))")
    trusted = service_account if service_account is not None else stage_service_account(str(job_name))
    role = aws.iam.Role(
        name, description=f"S3 data stage (IRSA): reads {data.uri} only",
        assume_role_policy=pulumi.Output.all(oidc_provider_arn, oidc_provider_url, namespace).apply(
            lambda a: irsa_trust_policy(a[0], a[1], a[2], trusted)),
        opts=opts)
    aws.iam.RolePolicy(name, role=role.id, policy=read_prefix_policy(data, partition), opts=opts)
    arn = role.arn
    setattr(arn, _TRUSTS, (namespace, trusted))
    return arn


def trust_problem(job_component_name: str, namespace: pulumi.Input[str], role_arn: object) -> str | None:
    """Why ``role_arn`` (from :func:`data_stage_role`) cannot be assumed by ElasticJob ``job_component_name``'s stage
    pods, or None (also for a role from elsewhere, whose trust the program cannot see)."""
    trust = vars(role_arn).get(_TRUSTS) if hasattr(role_arn, "__dict__") else None
    if trust is None:
        return None
    role_ns, trusted = trust
    expected = stage_service_account(job_component_name)
    if trusted != expected:
        return (f"data_role_arn: the role trusts ServiceAccount {trusted!r}, but ElasticJob {job_component_name!r} "
                f"runs its S3 stage as {expected!r} (IRSA would refuse AssumeRoleWithWebIdentity); expected "
                f"data_stage_role(..., job_name={job_component_name!r})")
    if isinstance(role_ns, str) and isinstance(namespace, str) and role_ns != namespace:
        return (f"data_role_arn: the role trusts namespace {role_ns!r}, but the job runs in {namespace!r}; expected "
                "data_stage_role(..., namespace=<the job's namespace>)")
    return None


def role_name_of(arn: str) -> str:
    """``arn:<partition>:iam::<account>:role[/path]/<name>`` → ``<name>`` (what ``aws.iam.RolePolicy`` takes)."""
    return arn.rsplit("/", 1)[-1]


_GRANTS = "_eks_ddp_workload_statements"
"""Attribute of the role ARN Output :func:`workload_policy` returns: the statements it attached."""


def workload_policy(name: str, role_arn: pulumi.Input[str], statements: Sequence[Mapping[str, Any]],
                    opts: pulumi.ResourceOptions | None = None) -> pulumi.Output[str]:
    """Attach a workload's ``iam_statements`` to the training pods' IRSA role (``role_arn``: the results uploader's,
    the one role their ServiceAccount can carry) as an inline policy named ``name``; returns the role's ARN once
    the policy exists: pass it as ``Results.role_arn`` of the ElasticJob (which refuses statements no policy
    grants)."""
    policy = aws.iam.RolePolicy(
        name, name=name, role=pulumi.Output.from_input(role_arn).apply(lambda arn: role_name_of(str(arn))),
        policy=json.dumps({"Version": "2012-10-17", "Statement": [dict(st) for st in statements]}), opts=opts)
    arn = pulumi.Output.all(role_arn, policy.id).apply(lambda v: str(v[0]))
    setattr(arn, _GRANTS, tuple(dict(st) for st in statements))
    return arn


def granted_statements(role_arn: object) -> tuple[dict, ...] | None:
    """The statements :func:`workload_policy` attached to ``role_arn``, or None for any other ARN."""
    return vars(role_arn).get(_GRANTS) if hasattr(role_arn, "__dict__") else None
