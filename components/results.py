"""ResultsBucket: where a cluster run's results leave the cluster (metrics, history, curve, model).

After training, rank 0 uploads its run's ``metrics.json``, ``history.jsonl``, ``training-curve.png``
and ``model.pt`` to ``s3://<bucket>/runs/<runId>/`` (``training/results.py``); one command
(``python -m training.fetch_results``) brings them back and draws the curve and per-class table.

- Encrypted with SSE-S3 (AES-256, S3-managed keys), not a customer KMS key: access is already
  decided by the bucket policy and IAM; a KMS key would add a per-request cost, a key to retain
  with the bucket, and ``kms:Decrypt``/``kms:GenerateDataKey`` grants for the trainer and for
  every person fetching results, without narrowing who can read them.
- Versioned (an overwritten model is recoverable) with noncurrent versions expired after
  ``noncurrent_version_days``; incomplete multipart uploads aborted after a day.
- Public access blocked, ACLs disabled (BucketOwnerEnforced), a bucket policy that denies any
  request not over TLS.
- Retained on ``pulumi destroy`` (``retain_on_delete``): results outlive the cluster. A later stack
  adopts it by name (``existing_bucket``): then no bucket is created, only the role.
- The trainer's service account assumes an IAM role (IRSA) that may only ``s3:PutObject`` (and
  abort its multipart uploads) under ``runs/<runId>/``: no read, no delete, no other prefix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from . import rules
from .efs import irsa_trust_policy

RUNS_PREFIX = "runs"
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def run_prefix(run_id: str) -> str:
    """The key prefix of one run's results (with a trailing slash)."""
    return f"{RUNS_PREFIX}/{run_id}/"


@dataclass(frozen=True, kw_only=True)
class ResultsBucketArgs:
    """Inputs of :class:`ResultsBucket`."""

    oidc_provider_arn: pulumi.Input[str]
    """The cluster's IAM OIDC provider (IRSA)."""
    oidc_provider_url: pulumi.Input[str]
    """The cluster's OIDC issuer URL (with or without https://)."""
    namespace: pulumi.Input[str]
    """Namespace of the trainer's service account."""
    service_account: str
    """Name of the trainer's service account (the only one that may assume the upload role)."""
    run_id: str
    """The run whose prefix (``runs/<run_id>/``) the role may write."""
    existing_bucket: str | None = None
    """Adopt this bucket (e.g. one retained by an earlier stack) instead of creating one."""
    partition: str = "aws"
    """AWS partition of the bucket ARN (aws, aws-cn, aws-us-gov)."""
    noncurrent_version_days: int = 90
    """Days an overwritten or deleted object version is kept before S3 expires it."""
    retain_on_destroy: bool = True
    """Keep the bucket (and its results) on ``pulumi destroy``."""
    tags: dict[str, str] | None = None
    """Extra tags for the AWS resources."""


def validate(args: ResultsBucketArgs) -> None:
    """Raise ValueError naming the bad field."""
    rules.require(rules.run_id("run_id", args.run_id))
    if args.existing_bucket is not None and not BUCKET_NAME.match(args.existing_bucket):
        raise ValueError(f"existing_bucket: got {args.existing_bucket!r}; expected an S3 bucket name "
                         "(3-63 lowercase letters, digits, '.' and '-')")
    if not 1 <= args.noncurrent_version_days <= 3650:
        raise ValueError(f"noncurrent_version_days: got {args.noncurrent_version_days!r}; expected 1..3650")
    if not args.service_account:
        raise ValueError("service_account: got ''; expected the trainer's service account name")


def upload_policy(bucket_arn: str, run_id: str) -> str:
    """The role's only permissions: write objects under the run's prefix."""
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "WriteOwnRunOnly",
        "Effect": "Allow",
        "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
        "Resource": f"{bucket_arn}/{run_prefix(run_id)}*",
    }]})


def tls_only_policy(bucket_arn: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [bucket_arn, f"{bucket_arn}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }]})


class ResultsBucket(pulumi.ComponentResource):
    """Encrypted, versioned, private, retained S3 bucket + the trainer's prefix-scoped upload role."""

    bucket_name: pulumi.Output[str]
    prefix: str
    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: ResultsBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:results:ResultsBucket", name, None, opts)
        validate(args)
        tags = {"eks-ddp/results": name, **(args.tags or {})}
        child = pulumi.ResourceOptions(parent=self)
        self.prefix = run_prefix(args.run_id)

        if args.existing_bucket is not None:
            self.bucket_name = pulumi.Output.from_input(args.existing_bucket)
            bucket_arn: pulumi.Output[str] = pulumi.Output.from_input(
                f"arn:{args.partition}:s3:::{args.existing_bucket}")
        else:
            keep = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy)
            bucket = aws.s3.Bucket(f"{name}-bucket", bucket_prefix=f"{name}-", force_destroy=False, tags=tags,
                                   opts=keep)
            on_bucket = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy)
            aws.s3.BucketServerSideEncryptionConfiguration(
                f"{name}-sse", bucket=bucket.id,
                rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.
                    BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256"))],
                opts=on_bucket)
            versioning = aws.s3.BucketVersioning(
                f"{name}-versioning", bucket=bucket.id,
                versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
                opts=on_bucket)
            pab = aws.s3.BucketPublicAccessBlock(
                f"{name}-public-access", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
                ignore_public_acls=True, restrict_public_buckets=True, opts=on_bucket)
            aws.s3.BucketOwnershipControls(
                f"{name}-ownership", bucket=bucket.id,
                rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"), opts=on_bucket)
            aws.s3.BucketLifecycleConfiguration(
                f"{name}-lifecycle", bucket=bucket.id,
                rules=[aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-old-versions", status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=args.noncurrent_version_days),
                    abort_incomplete_multipart_upload=aws.s3.
                    BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(days_after_initiation=1))],
                # S3 rejects a lifecycle on a bucket whose versioning is still being set.
                opts=pulumi.ResourceOptions.merge(on_bucket, pulumi.ResourceOptions(depends_on=[versioning])))
            aws.s3.BucketPolicy(
                f"{name}-tls-only", bucket=bucket.id, policy=bucket.arn.apply(tls_only_policy),
                # After the public access block: S3 evaluates a new policy against it.
                opts=pulumi.ResourceOptions.merge(on_bucket, pulumi.ResourceOptions(depends_on=[pab])))
            self.bucket_name = bucket.bucket
            bucket_arn = bucket.arn

        role = aws.iam.Role(
            f"{name}-uploader",
            description=f"Trainer (IRSA): writes results under {self.prefix} only",
            assume_role_policy=pulumi.Output.all(args.oidc_provider_arn, args.oidc_provider_url, args.namespace).apply(
                lambda a: irsa_trust_policy(a[0], a[1], a[2], args.service_account)),
            tags=tags, opts=child)
        aws.iam.RolePolicy(f"{name}-uploader", role=role.id,
                           policy=bucket_arn.apply(lambda arn: upload_policy(arn, args.run_id)), opts=child)
        self.role_arn = role.arn
        self.register_outputs({"bucket_name": self.bucket_name, "prefix": self.prefix, "role_arn": self.role_arn})
