"""Preflight's S3 checks: the buckets the stack reads and writes exist, and the results bucket's key is known.

- Every ``runs[i].workload.data.s3`` bucket and every ``network.s3EndpointExtraBuckets`` entry exists
  (``s3:HeadBucket``): a missing one would fail the awaited S3 stage (or the workload) after the cluster bills.
- ``storage.resultsBucket`` is this account's (``HeadBucket`` with ``ExpectedBucketOwner``, which S3 answers
  with 403 when the owner differs): the stack's S3 endpoint and upload role are built for a bucket of the account.
- Its default encryption (``s3:GetBucketEncryption``): under SSE-KMS with a customer key, every upload needs
  ``kms:GenerateDataKey`` on that key (S3 user guide "Specifying server-side encryption with AWS KMS
  (SSE-KMS)"), which the uploaders get only for ``storage.resultsKmsKeyArn``; a bucket key that is not given, or
  differs, fails here naming the key. An alias or a bare key id is resolved with ``kms:DescribeKey``.

A mixin of :class:`eks_ddp.tooling.preflight.checker._Checker` (which supplies ``cfg``, ``attempt``, ``fail`` and ``warn``).
API errors other than the answers above become warnings, as everywhere in preflight.

IAM actions used (read-only): sts:GetCallerIdentity, s3:ListBucket (HeadBucket), s3:GetEncryptionConfiguration,
kms:DescribeKey.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/(?P<id>[0-9a-f-]{36})$")
KEY_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def buckets_read(cfg: Any) -> list[tuple[str, str]]:
    """(stack key, bucket) of every bucket the stack's pods read outside its own: data sets, then the extras."""
    out = [(f"{cfg.run_key(i)}.workload.data.s3", r.workload.s3_uri.removeprefix("s3://").split("/", 1)[0])
           for i, r in enumerate(cfg.runs) if r.workload.s3_uri]
    out += [(f"network.s3EndpointExtraBuckets[{i}]", b) for i, b in enumerate(cfg.network.s3_endpoint_extra_buckets)]
    return out


def needed(cfg: Any) -> bool:
    """Whether the stack names any bucket preflight should look at (else no S3 client is made)."""
    return bool(buckets_read(cfg)) or cfg.storage.results_bucket is not None


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


class S3Checks:
    """Bucket and results-key checks of :class:`eks_ddp.tooling.preflight.checker._Checker`."""

    cfg: Any

    if TYPE_CHECKING:  # supplied by the checker this is a mixin of
        def attempt(self, service: str, action: str, what: str, fn: Callable[[], Any]) -> Any: ...
        def fail(self, message: str) -> None: ...
        def warn(self, message: str) -> None: ...

    def check_s3(self, s3: Any, kms: Any, sts: Any) -> None:
        for key, bucket in buckets_read(self.cfg):
            self._check_exists(s3, key, bucket)
        if self.cfg.storage.results_bucket is not None:
            account = self.attempt("sts", "GetCallerIdentity", "the account (results bucket owner)",
                                   lambda: sts.get_caller_identity()["Account"])
            self._check_results_bucket(s3, kms, self.cfg.storage.results_bucket, account)

    def _head(self, s3: Any, bucket: str, **kw: Any) -> str | None:
        """HeadBucket: None when it answers, else the error code ('404', '403', ...); raises other errors."""
        try:
            s3.head_bucket(Bucket=bucket, **kw)
            return None
        except ClientError as err:
            code = _code(err)
            if code in ("404", "NoSuchBucket", "403", "AccessDenied", "301", "400"):
                return code
            raise

    def _check_exists(self, s3: Any, key: str, bucket: str) -> None:
        code = self.attempt("s3", "ListBucket", f"bucket {bucket} ({key})",
                            lambda: self._head(s3, bucket) or "ok")
        if code in ("404", "NoSuchBucket"):
            self.fail(f"{key}: bucket {bucket!r} does not exist (s3:HeadBucket: 404); expected an existing bucket "
                      "name (check the spelling and the account)")
        elif code in ("403", "AccessDenied"):
            self.warn(f"preflight: could not confirm bucket {bucket!r} ({key}) exists: your credentials get 403; "
                      "the pods' role and the bucket's policy must allow the read")

    def _check_results_bucket(self, s3: Any, kms: Any, bucket: str, account: str | None) -> None:
        key = "storage.resultsBucket"
        code = self.attempt("s3", "ListBucket", f"results bucket {bucket}",
                            lambda: self._head(s3, bucket) or "ok")
        if code in ("404", "NoSuchBucket"):
            self.fail(f"{key}: bucket {bucket!r} does not exist (s3:HeadBucket: 404); expected the bucket an earlier "
                      "stack kept (pulumi stack output results), or no storage.resultsBucket for a new one")
            return
        if code != "ok":
            return
        owner = {"ExpectedBucketOwner": account} if account else {}
        if account and self.attempt("s3", "ListBucket", f"results bucket {bucket}'s owner",
                                    lambda: self._head(s3, bucket, **owner) or "ok") in ("403", "AccessDenied"):
            self.fail(f"{key}: bucket {bucket!r} is not owned by this account ({account}; s3:HeadBucket with "
                      "ExpectedBucketOwner: 403); expected a bucket of this account: the VPC's S3 endpoint admits "
                      "writes to this account's buckets only")
            return
        rules = self.attempt("s3", "GetEncryptionConfiguration", f"results bucket {bucket}'s encryption",
                             lambda: self._encryption(s3, bucket, owner))
        if rules is None:
            return
        sse = rules.get("SSEAlgorithm", "")
        found = rules.get("KMSMasterKeyID")
        given = self.cfg.storage.results_kms_key_arn
        if not sse.startswith("aws:kms") or not found:
            # SSE-S3, or SSE-KMS under the account's aws/s3 key, whose key policy admits the account's principals
            # through S3: no grant needed.
            if given is not None:
                self.warn(f"preflight: storage.resultsKmsKeyArn {given} is given, but bucket {bucket!r} encrypts with "
                          f"{sse or 'no default'} ({found or 'no key'}); uploads will name the given key")
            return
        arn = self._key_arn(kms, found)
        if given is None:
            shown = arn or found
            self.fail(f"storage.resultsKmsKeyArn: not set, but bucket {bucket!r} encrypts with KMS key {shown} by "
                      "default (s3:GetBucketEncryption) and the uploaders get kms:GenerateDataKey only on the key "
                      f"given, so every upload would be denied; expected storage.resultsKmsKeyArn: {shown} "
                      f"(pulumi config set --path storage.resultsKmsKeyArn {shown})")
        elif not _same_key(given, arn or found):
            self.fail(f"storage.resultsKmsKeyArn: got {given!r}, but bucket {bucket!r} encrypts with KMS key "
                      f"{arn or found} by default (s3:GetBucketEncryption); expected that key's ARN")

    @staticmethod
    def _encryption(s3: Any, bucket: str, owner: dict[str, str]) -> dict[str, Any] | None:
        try:
            got = s3.get_bucket_encryption(Bucket=bucket, **owner)
        except ClientError as err:
            if _code(err) == "ServerSideEncryptionConfigurationNotFoundError":
                return {}
            raise
        rules = got.get("ServerSideEncryptionConfiguration", {}).get("Rules", [])
        return dict(rules[0].get("ApplyServerSideEncryptionByDefault", {})) if rules else {}

    def _key_arn(self, kms: Any, key_id: str) -> str | None:
        """The key's ARN from what the bucket names (ARN, id, alias); None when it cannot be resolved."""
        if KMS_KEY_ARN.match(key_id):
            return key_id
        if kms is None:
            return None
        return self.attempt("kms", "DescribeKey", f"KMS key {key_id}",
                            lambda: kms.describe_key(KeyId=key_id)["KeyMetadata"]["Arn"])


def _same_key(given: str, found: str) -> bool:
    """The configured key ARN and the bucket's key (an ARN, or a bare id where it could not be resolved)."""
    m = KMS_KEY_ARN.match(given)
    if found == given:
        return True
    return bool(m and KEY_ID.match(found) and m.group("id") == found)


def clients(region: str, profile: str | None = None) -> tuple[Any, Any, Any]:
    """s3, kms and sts clients with preflight's short timeouts."""
    import boto3
    from botocore.config import Config

    config = Config(region_name=region, connect_timeout=5, read_timeout=15,
                    retries={"max_attempts": 3, "mode": "standard"})
    session = boto3.Session(profile_name=profile) if profile else boto3.Session()
    return session.client("s3", config=config), session.client("kms", config=config), session.client("sts", config=config)
