"""Preflight's S3 checks against moto: the data and extra buckets exist, the results bucket is this account's, and
its default SSE-KMS key is the one the uploaders may use (storage.resultsKmsKeyArn).

moto ignores ``ExpectedBucketOwner``; :class:`Owned` answers it as S3 does (403 when the owner differs)."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from eks_ddp.tooling import preflight
from eks_ddp.tooling.preflight import s3 as preflight_s3
from tests.config.test_runs import DIGEST, with_runs
from tests.support.stub_quotas import StubQuotas
from tests.support.util import set_path, stack_config
from tests.tooling.preflight.test_preflight import config

REGION = "us-west-2"
MOTO_ACCOUNT = "123456789012"
OTHER_ACCOUNT = "999999999999"


class Owned:
    """An S3 client whose HeadBucket/GetBucketEncryption honour ExpectedBucketOwner (S3 API reference, "HeadBucket":
    "If the bucket is owned by a different account, the request fails with the HTTP status code 403")."""

    def __init__(self, client, owners: dict[str, str]):
        self._c, self._owners = client, owners

    def _check(self, kw: dict) -> dict:
        expected = kw.pop("ExpectedBucketOwner", None)
        if expected is not None and self._owners.get(kw["Bucket"], MOTO_ACCOUNT) != expected:
            raise ClientError({"Error": {"Code": "403", "Message": "Forbidden"}}, "HeadBucket")
        return kw

    def head_bucket(self, **kw):
        return self._c.head_bucket(**self._check(kw))

    def get_bucket_encryption(self, **kw):
        return self._c.get_bucket_encryption(**self._check(kw))


@pytest.fixture
def aws(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        yield s3, boto3.client("kms", region_name=REGION), boto3.client("sts", region_name=REGION)


def bucket(s3, name: str, kms_key: str | None = None) -> None:
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    if kms_key:
        s3.put_bucket_encryption(Bucket=name, ServerSideEncryptionConfiguration={"Rules": [
            {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": kms_key},
             "BucketKeyEnabled": True}]})


def check(raw: dict, clients, owners: dict[str, str] | None = None) -> preflight.Report:
    s3, kms, sts = clients
    cfg = config(raw)
    return preflight.check(cfg, ec2=boto3.client("ec2", region_name=REGION), quotas=StubQuotas(),
                           s3=Owned(s3, owners or {}), kms=kms, sts=sts)


def s3_failures(report: preflight.Report) -> list[str]:
    return [f for f in report.failures if "bucket" in f or "resultsKmsKeyArn" in f]


def s3_run(uri: str) -> dict:
    return {"runId": "b", "nodes": 1, "workload": {"image": DIGEST, "module": "m", "data": {"s3": uri}}}


def test_the_dev_stack_names_no_bucket_and_makes_no_s3_client():
    assert not preflight_s3.needed(config(stack_config("dev")))


def test_a_missing_data_set_bucket_or_extra_bucket_fails_naming_its_key(aws):
    s3 = aws[0]
    bucket(s3, "data-lake")
    raw = set_path(with_runs({"runId": "a", "nodes": 1}, s3_run("s3://no-such-data/wiki/")),
                   "eks-ddp:network.s3EndpointExtraBuckets", ["data-lake", "gone-bucket"])
    found = s3_failures(check(raw, aws))
    assert len(found) == 2, found
    assert found[0].startswith("runs[1].workload.data.s3: bucket 'no-such-data' does not exist")
    assert found[1].startswith("network.s3EndpointExtraBuckets[1]: bucket 'gone-bucket' does not exist")
    # Control: both exist (one of them another account's: the endpoint admits it now, HeadBucket has no owner).
    bucket(s3, "no-such-data")
    bucket(s3, "gone-bucket")
    assert s3_failures(check(raw, aws, {"no-such-data": OTHER_ACCOUNT})) == []


def results(raw: dict, name: str, key: str | None = None) -> dict:
    raw = set_path(raw, "eks-ddp:storage.resultsBucket", name)
    return set_path(raw, "eks-ddp:storage.resultsKmsKeyArn", key) if key else raw


def test_a_reattached_sse_kms_bucket_without_its_key_fails_naming_results_kms_key_arn(aws):
    s3, kms, _ = aws
    key = kms.create_key()["KeyMetadata"]["Arn"]
    bucket(s3, "kept-results", key)
    [found] = s3_failures(check(results(stack_config("dev"), "kept-results"), aws))
    assert found.startswith(f"storage.resultsKmsKeyArn: not set, but bucket 'kept-results' encrypts with KMS key "
                            f"{key} by default") and f"pulumi config set --path storage.resultsKmsKeyArn {key}" in found
    assert s3_failures(check(results(stack_config("dev"), "kept-results", key), aws)) == []


def test_a_results_key_that_differs_from_the_buckets_fails(aws):
    s3, kms, _ = aws
    key, other = (kms.create_key()["KeyMetadata"]["Arn"] for _ in range(2))
    bucket(s3, "kept-results", key)
    [found] = s3_failures(check(results(stack_config("dev"), "kept-results", other), aws))
    assert found == (f"storage.resultsKmsKeyArn: got {other!r}, but bucket 'kept-results' encrypts with KMS key "
                     f"{key} by default (s3:GetBucketEncryption); expected that key's ARN")


def test_a_bucket_key_named_by_alias_or_id_is_resolved(aws):
    s3, kms, _ = aws
    meta = kms.create_key()["KeyMetadata"]
    kms.create_alias(AliasName="alias/results", TargetKeyId=meta["KeyId"])
    for named in ("alias/results", meta["KeyId"]):
        s3.delete_bucket(Bucket="kept-results") if named != "alias/results" else None
        bucket(s3, "kept-results", named)
        assert s3_failures(check(results(stack_config("dev"), "kept-results", meta["Arn"]), aws)) == [], named


def test_an_sse_s3_bucket_needs_no_key(aws):
    bucket(aws[0], "kept-results")
    assert s3_failures(check(results(stack_config("dev"), "kept-results"), aws)) == []


def test_a_results_bucket_of_another_account_or_none_fails_naming_results_bucket(aws):
    bucket(aws[0], "their-results")
    [found] = s3_failures(check(results(stack_config("dev"), "their-results"), aws, {"their-results": OTHER_ACCOUNT}))
    assert found.startswith(f"storage.resultsBucket: bucket 'their-results' is not owned by this account "
                            f"({MOTO_ACCOUNT}; s3:HeadBucket with ExpectedBucketOwner: 403)")
    [found] = s3_failures(check(results(stack_config("dev"), "never-made"), aws))
    assert found.startswith("storage.resultsBucket: bucket 'never-made' does not exist")


def test_run_or_raise_checks_the_buckets_a_stack_names_with_clients_of_its_profile(aws, monkeypatch):
    """What __main__.py calls: a stack naming a bucket gets S3 clients (of its aws:profile) and a RunError naming
    the key; the dev stack asks for none."""
    import pulumi

    made: list[tuple[str, str | None]] = []

    def clients(region, profile=None):
        made.append((region, profile))
        return aws

    monkeypatch.setattr(preflight_s3, "clients", clients)
    monkeypatch.setattr(pulumi.log, "warn", lambda *a, **k: None)
    ec2 = boto3.client("ec2", region_name=REGION)
    preflight.run_or_raise(config(stack_config("dev")), ec2=ec2, quotas=StubQuotas(), profile="team")
    assert made == []
    with pytest.raises(pulumi.RunError, match=r"storage.resultsBucket: bucket 'never-made' does not exist"):
        preflight.run_or_raise(config(results(stack_config("dev"), "never-made")), ec2=ec2, quotas=StubQuotas(),
                               profile="team")
    assert made == [(REGION, "team")]
