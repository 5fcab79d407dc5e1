"""ResultsBucket: where a cluster run's results leave the cluster (metrics, history, curve, model).

After training, rank 0 uploads its run's ``metrics.json``, ``history.jsonl``, ``training-curve.png``
and ``model.pt`` to ``s3://<bucket>/runs/<runId>/`` (``training/eks_ddp_trainer/upload.py``); one command
(``python -m eks_ddp_local.fetch_results``) brings them back and draws the curve and per-class table.

- Encrypted with a KMS key of the stack (SSE-KMS, rotation on, S3 bucket key on so a run's upload
  costs a handful of KMS requests): reading a result takes ``kms:Decrypt`` on that key as well as
  ``s3:GetObject``, a second, key-scoped gate; the key's own policy admits its use only through S3 of this
  account and region (and its administration by the account). The bucket policy refuses any write that asks for
  another encryption (SSE-S3, DSSE, a customer-provided key) or another KMS key: a foreign account's
  key (the S3 ransomware pattern) or the account's ``aws/s3`` key. The uploader asks for the stack
  key explicitly (``EKS_DDP_RESULTS_KMS_KEY``); a write that names no encryption gets it by default.
- Server access logs go to a log bucket of the stack (``<name>-logs-*``: SSE-S3, which is the only
  default encryption S3 log delivery accepts; versioned; public access blocked; TLS only; log
  delivery admitted only from this bucket and account; logs expire after ``access_log_days``).
- Versioned (an overwritten model is recoverable) with noncurrent versions expired after
  ``noncurrent_version_days``; incomplete multipart uploads aborted after a day.
- Public access blocked, ACLs disabled (BucketOwnerEnforced), a bucket policy that denies any
  request not over TLS.
- Retained on ``pulumi destroy`` (``retain_on_delete``), with its key and its log bucket: results
  outlive the cluster. A later stack adopts it by name (``existing_bucket``, with ``existing_kms_key_arn``
  for its key): then no bucket is created, only the role.
- The trainer's service account assumes an IAM role (IRSA) that may only ``s3:PutObject`` (and
  abort its multipart uploads) under ``runs/<runId>/``: no read, no delete, no other prefix; and use
  the bucket's key through S3 only (``kms:GenerateDataKey``, and ``kms:Decrypt``, which S3 needs to
  complete a multipart upload of an SSE-KMS object).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from eks_ddp.core import rules
from eks_ddp.infra.iam import irsa_trust_policy

RUNS_PREFIX = "runs"
ACCESS_LOG_PREFIX = "s3-access/"
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
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
    existing_kms_key_arn: str | None = None
    """With ``existing_bucket``: the KMS key (ARN) its objects are written with (the ``kms_key_arn`` output of
    the stack that made it). None: the uploader names no key and gets the bucket's default encryption."""
    partition: str = "aws"
    """AWS partition of the bucket ARN (aws, aws-cn, aws-us-gov)."""
    noncurrent_version_days: int = 90
    """Days an overwritten or deleted object version is kept before S3 expires it."""
    access_log_days: int = 365
    """Days the bucket's server access logs are kept."""
    retain_on_destroy: bool = True
    """Keep the bucket (and its results, key and access logs) on ``pulumi destroy``."""
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
    if not 1 <= args.access_log_days <= 3650:
        raise ValueError(f"access_log_days: got {args.access_log_days!r}; expected 1..3650")
    if args.existing_kms_key_arn is not None and (
            args.existing_bucket is None or not _KMS_KEY_ARN.match(args.existing_kms_key_arn)):
        raise ValueError(f"existing_kms_key_arn: got {args.existing_kms_key_arn!r}; expected the ARN of a KMS key "
                         "(arn:aws:kms:<region>:<account>:key/<id>), and only with existing_bucket")
    if not args.service_account:
        raise ValueError("service_account: got ''; expected the trainer's service account name")


def upload_policy(bucket_arn: str, run_id: str, kms_key_arn: str | None = None, partition: str = "aws") -> str:
    """The role's only permissions: write objects under the run's prefix, with the bucket's key, through S3 (of the
    partition: ``kms:ViaService`` is ``s3.<region>.<its DNS suffix>``)."""
    statements: list[dict] = [{
        "Sid": "WriteOwnRunOnly",
        "Effect": "Allow",
        "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
        "Resource": f"{bucket_arn}/{run_prefix(run_id)}*",
    }]
    if kms_key_arn is not None:
        statements.append({
            "Sid": "EncryptWithTheResultsKeyThroughS3",
            "Effect": "Allow",
            "Action": ["kms:GenerateDataKey", "kms:Decrypt"],
            "Resource": kms_key_arn,
            "Condition": {"StringLike": {"kms:ViaService": f"s3.*.{rules.dns_suffix(partition)}"}},
        })
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


KEY_ADMIN_ACTIONS = ["kms:Create*", "kms:Describe*", "kms:Enable*", "kms:List*", "kms:Put*", "kms:Update*",
                     "kms:Revoke*", "kms:Disable*", "kms:Get*", "kms:Delete*", "kms:TagResource",
                     "kms:UntagResource", "kms:ScheduleKeyDeletion", "kms:CancelKeyDeletion",
                     "kms:RotateKeyOnDemand"]
"""Key administration, as AWS KMS's default key policy lists it for key administrators ("Default key policy")."""
KEY_USE_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]


def results_key_policy(account_id: str, region: str, partition: str = "aws") -> str:
    """The results key's own policy: the account administers it (through IAM, so it can never be locked out), and
    its principals may use it only through S3 in this region for this account (``kms:ViaService``,
    ``kms:CallerAccount``): a principal allowed ``kms:Decrypt`` on every key still cannot decrypt a result outside
    S3, where the bucket policy and ``s3:GetObject`` gate it too."""
    root = {"AWS": f"arn:{partition}:iam::{account_id}:root"}
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "AccountAdministersTheKey", "Effect": "Allow", "Principal": root, "Action": KEY_ADMIN_ACTIONS,
         "Resource": "*"},
        {"Sid": "UseOnlyThroughS3OfThisAccount", "Effect": "Allow", "Principal": root, "Action": KEY_USE_ACTIONS,
         "Resource": "*", "Condition": {"StringEquals": {
             "kms:ViaService": f"s3.{region}.{rules.dns_suffix(partition)}", "kms:CallerAccount": account_id}}},
    ]})


def _deny_insecure_transport(bucket_arn: str) -> dict:
    return {"Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [bucket_arn, f"{bucket_arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}


def tls_only_policy(bucket_arn: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [_deny_insecure_transport(bucket_arn)]})


def bucket_policy(bucket_arn: str, kms_key_arn: str) -> str:
    """TLS only, and every write encrypted with ``kms_key_arn`` and nothing else.

    Each Deny applies only when the request names an encryption header (``Null: false``): UploadPart
    (authorised as ``s3:PutObject``) carries none, and a write that names none gets the bucket's default,
    the same key. (``...IfExists`` would not do: a missing key makes it *true*, denying those too.) Naming
    ``aws:kms`` without a key would select the account's ``aws/s3`` key, so that is refused, as is a
    customer-provided key.
    """
    objects = f"{bucket_arn}/*"
    put = {"Effect": "Deny", "Principal": "*", "Action": "s3:PutObject", "Resource": objects}
    sse, key_id = "s3:x-amz-server-side-encryption", "s3:x-amz-server-side-encryption-aws-kms-key-id"
    return json.dumps({"Version": "2012-10-17", "Statement": [
        _deny_insecure_transport(bucket_arn),
        {"Sid": "DenyOtherEncryption", **put, "Condition": {"StringNotEquals": {sse: "aws:kms"},
                                                             "Null": {sse: "false"}}},
        {"Sid": "DenyOtherKmsKey", **put, "Condition": {"StringNotEquals": {key_id: kms_key_arn},
                                                         "Null": {key_id: "false"}}},
        {"Sid": "DenyKmsWithoutTheKey", **put, "Condition": {"StringEquals": {sse: "aws:kms"},
                                                              "Null": {key_id: "true"}}},
        {"Sid": "DenyCustomerProvidedKeys", **put,
         "Condition": {"Null": {"s3:x-amz-server-side-encryption-customer-algorithm": "false"}}},
    ]})


def log_bucket_policy(log_bucket_arn: str, source_bucket_arn: str, account_id: str) -> str:
    """TLS only; S3 log delivery may write access logs of ``source_bucket_arn`` (this account) only."""
    return json.dumps({"Version": "2012-10-17", "Statement": [
        _deny_insecure_transport(log_bucket_arn),
        {"Sid": "S3ServerAccessLogs", "Effect": "Allow", "Principal": {"Service": "logging.s3.amazonaws.com"},
         "Action": "s3:PutObject", "Resource": f"{log_bucket_arn}/{ACCESS_LOG_PREFIX}*",
         "Condition": {"ArnLike": {"aws:SourceArn": source_bucket_arn},
                       "StringEquals": {"aws:SourceAccount": account_id}}},
    ]})


class ResultsBucket(pulumi.ComponentResource):
    """SSE-KMS, versioned, private, logged, retained S3 bucket + the trainer's prefix-scoped upload role."""

    bucket_name: pulumi.Output[str]
    prefix: str
    role_arn: pulumi.Output[str]
    kms_key_arn: pulumi.Output[str] | None
    """The key every result is encrypted with (the uploader names it); None for an adopted bucket without one."""

    def __init__(self, name: str, args: ResultsBucketArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:results:ResultsBucket", name, None, opts)
        validate(args)
        tags = {"eks-ddp/results": name, **(args.tags or {})}
        self.prefix = run_prefix(args.run_id)

        if args.existing_bucket is not None:
            self.bucket_name = pulumi.Output.from_input(args.existing_bucket)
            bucket_arn: pulumi.Output[str] = pulumi.Output.from_input(
                f"arn:{args.partition}:s3:::{args.existing_bucket}")
            self.kms_key_arn = (pulumi.Output.from_input(args.existing_kms_key_arn)
                                if args.existing_kms_key_arn is not None else None)
        else:
            keep = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy)
            # Retained with the bucket: without its key the results could not be read.
            invoke = pulumi.InvokeOptions(parent=self)
            account = aws.get_caller_identity_output(opts=invoke).account_id
            key = aws.kms.Key(f"{name}-kms", description=f"Results bucket encryption for {name}",
                              enable_key_rotation=True, deletion_window_in_days=30, tags=tags,
                              policy=pulumi.Output.all(account, aws.get_region_output(opts=invoke).region).apply(
                                  lambda v: results_key_policy(v[0], v[1], args.partition)),
                              opts=keep)
            bucket, pab = self._private_bucket(name, args, tags, key.arn)
            self._policy(f"{name}-tls-only", bucket, pab, args, pulumi.Output.all(bucket.arn, key.arn).apply(
                lambda v: bucket_policy(v[0], v[1])))
            logs, logs_pab = self._private_bucket(f"{name}-logs", args, tags, None, expire_days=args.access_log_days)
            log_policy = self._policy(f"{name}-logs-policy", logs, logs_pab, args, pulumi.Output.all(
                logs.arn, bucket.arn, account).apply(lambda v: log_bucket_policy(v[0], v[1], v[2])))
            aws.s3.BucketLogging(f"{name}-access-log", bucket=bucket.id, target_bucket=logs.id,
                                 target_prefix=ACCESS_LOG_PREFIX,
                                 opts=pulumi.ResourceOptions.merge(keep, pulumi.ResourceOptions(
                                     depends_on=[log_policy])))
            self.bucket_name = bucket.bucket
            bucket_arn = bucket.arn
            self.kms_key_arn = key.arn

        self._args, self._tags, self._bucket_arn = args, tags, bucket_arn
        self.role_arn = self.uploader_role(f"{name}-uploader", args.run_id, args.service_account)
        self.register_outputs({"bucket_name": self.bucket_name, "prefix": self.prefix, "role_arn": self.role_arn,
                               "kms_key_arn": self.kms_key_arn})

    def uploader_role(self, name: str, run_id: str, service_account: str) -> pulumi.Output[str]:
        """An IRSA role (its ARN) that ``service_account`` assumes to write under ``runs/<run_id>/`` only: one per
        run of the stack, all on this bucket."""
        rules.require(rules.run_id("run_id", run_id))
        args, prefix = self._args, run_prefix(run_id)
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(
            name,
            description=f"Trainer (IRSA): writes results under {prefix} only",
            assume_role_policy=pulumi.Output.all(args.oidc_provider_arn, args.oidc_provider_url, args.namespace).apply(
                lambda a: irsa_trust_policy(a[0], a[1], a[2], service_account)),
            tags=self._tags, opts=child)
        aws.iam.RolePolicy(name, role=role.id,
                           policy=pulumi.Output.all(self._bucket_arn, self.kms_key_arn).apply(
                               lambda v: upload_policy(v[0], run_id, v[1], args.partition)), opts=child)
        return role.arn

    def _private_bucket(self, name: str, args: ResultsBucketArgs, tags: dict[str, str],
                        kms_key_arn: pulumi.Input[str] | None, *, expire_days: int | None = None
                        ) -> tuple[aws.s3.Bucket, aws.s3.BucketPublicAccessBlock]:
        """A bucket with default encryption (SSE-KMS under ``kms_key_arn``, else SSE-S3), versioning, public
        access blocked, ACLs off and a lifecycle, all retained with it; ``expire_days``: objects expire too."""
        on_bucket = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy)
        bucket = aws.s3.Bucket(f"{name}-bucket", bucket_prefix=f"{name}-", force_destroy=False, tags=tags,
                               opts=on_bucket)
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-sse", bucket=bucket.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.
                BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms" if kms_key_arn is not None else "AES256", kms_master_key_id=kms_key_arn),
                # One data key per bucket, not per object: KMS requests (and their cost) drop by orders of magnitude.
                bucket_key_enabled=True if kms_key_arn is not None else None)],
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
                expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=expire_days)
                if expire_days is not None else None,
                noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=args.noncurrent_version_days),
                abort_incomplete_multipart_upload=aws.s3.
                BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(days_after_initiation=1))],
            # S3 rejects a lifecycle on a bucket whose versioning is still being set.
            opts=pulumi.ResourceOptions.merge(on_bucket, pulumi.ResourceOptions(depends_on=[versioning])))
        return bucket, pab

    def _policy(self, name: str, bucket: aws.s3.Bucket, pab: aws.s3.BucketPublicAccessBlock,
                args: ResultsBucketArgs, policy: pulumi.Output[str]) -> aws.s3.BucketPolicy:
        return aws.s3.BucketPolicy(
            name, bucket=bucket.id, policy=policy,
            # After the public access block: S3 evaluates a new policy against it.
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy, depends_on=[pab]))
