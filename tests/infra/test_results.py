"""ResultsBucket under mocks (encryption, versioning, privacy, TLS, retention, access logs, the upload role's
scope), and the trainer's upload + the fetch command round trip against moto's in-process S3."""

from __future__ import annotations

import dataclasses
import json

import pulumi
import pytest

from eks_ddp.infra.results import ResultsBucket, ResultsBucketArgs, bucket_policy, upload_policy
from eks_ddp.tooling.mocks import run_program

ISSUER = "oidc.eks.us-west-2.amazonaws.com/id/ABCDEF"
ARGS = ResultsBucketArgs(
    oidc_provider_arn=f"arn:aws:iam::123456789012:oidc-provider/{ISSUER}",
    oidc_provider_url=f"https://{ISSUER}", namespace="training", service_account="training-trainer",
    run_id="run-7")


def _run(args: ResultsBucketArgs = ARGS):
    def program():
        r = ResultsBucket("results", args)
        pulumi.export("bucket", r.bucket_name)
        pulumi.export("role", r.role_arn)

    return run_program({}, program=program)


@pytest.fixture(scope="module")
def result():
    return _run()


S3 = "aws:s3/bucket:Bucket"
SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
POLICY = "aws:s3/bucketPolicy:BucketPolicy"


def _of_bucket(result, typ: str, bucket: str):
    """The ``typ`` resource of bucket ``bucket`` ("results" or "results-logs")."""
    bucket_id = result.one(S3, f"{bucket}-bucket").outputs["id"]
    [r] = [r for r in result.of_type(typ) if r.inputs.get("bucket") == bucket_id]
    return r


def test_bucket_encrypted_versioned_private_and_retained(result):
    for name in ("results", "results-logs"):
        bucket = result.one(S3, f"{name}-bucket")
        assert bucket.retain_on_delete and bucket.parent_type == "eks-ddp:results:ResultsBucket"
        assert bucket.inputs.get("forceDestroy") is not True
        assert _of_bucket(result, "aws:s3/bucketVersioning:BucketVersioning", name).inputs[
            "versioningConfiguration"]["status"] == "Enabled"
        pab = _of_bucket(result, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", name).inputs
        assert all(pab[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                            "restrictPublicBuckets")), name
        rule = _of_bucket(result, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
                          name).inputs["rules"][0]
        assert rule["status"] == "Enabled" and rule["noncurrentVersionExpiration"]["noncurrentDays"] == 90
    assert int(_of_bucket(result, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
                          "results-logs").inputs["rules"][0]["expiration"]["days"]) == 365
    for r in result.resources:
        if r.type.startswith(("aws:s3/", "aws:kms/")):
            assert r.retain_on_delete, r.type  # destroying the stack keeps the results, their key and their logs


def test_bucket_policy_denies_plain_http(result):
    for name in ("results", "results-logs"):
        doc = json.loads(_of_bucket(result, POLICY, name).inputs["policy"])
        deny = doc["Statement"][0]
        assert deny["Effect"] == "Deny" and deny["Principal"] == "*"
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        arn = result.one(S3, f"{name}-bucket").outputs["arn"]
        assert set(deny["Resource"]) == {arn, f"{arn}/*"}


def test_role_may_only_write_its_runs_prefix(result):
    arn = result.one(S3, "results-bucket").outputs["arn"]
    doc = json.loads(result.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    stmt = doc["Statement"][0]
    assert stmt["Effect"] == "Allow"
    assert stmt["Resource"] == f"{arn}/runs/run-7/*"
    assert set(stmt["Action"]) == {"s3:PutObject", "s3:AbortMultipartUpload"}
    assert not any("*" in a for a in stmt["Action"])
    trust = json.loads(result.one("aws:iam/role:Role").inputs["assumeRolePolicy"])
    cond = trust["Statement"][0]["Condition"]["StringEquals"]
    assert cond[f"{ISSUER}:sub"] == "system:serviceaccount:training:training-trainer"


def test_upload_policy_never_grants_bucket_wide_write():
    doc = json.loads(upload_policy("arn:aws:s3:::b", "r1"))
    resources = [s["Resource"] for s in doc["Statement"]]
    assert resources == ["arn:aws:s3:::b/runs/r1/*"]
    assert "arn:aws:s3:::b/*" not in resources


def test_existing_bucket_is_adopted_not_created():
    result = _run(dataclasses.replace(ARGS, existing_bucket="team-results"))
    assert not [r for r in result.resources if r.type.startswith("aws:s3/")]
    assert result.outputs["bucket"] == "team-results"
    doc = json.loads(result.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    assert doc["Statement"][0]["Resource"] == "arn:aws:s3:::team-results/runs/run-7/*"


@pytest.mark.parametrize("field,value", [("run_id", "Run_1"), ("existing_bucket", "Bad_Bucket"),
                                         ("noncurrent_version_days", 0), ("access_log_days", 0),
                                         ("existing_kms_key_arn", "alias/aws/s3")])
def test_args_rejected_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        _run(dataclasses.replace(ARGS, **{field: value}))


# --- security review S13: SSE-KMS under the stack's key, foreign keys refused, access logged ------------------

def test_results_are_encrypted_with_a_stack_key_and_a_bucket_key(result):
    key = result.one("aws:kms/key:Key", "results-kms")
    assert key.inputs["enableKeyRotation"] is True and key.retain_on_delete
    rule = _of_bucket(result, SSE, "results").inputs["rules"][0]
    assert rule["applyServerSideEncryptionByDefault"] == {"sseAlgorithm": "aws:kms", "kmsMasterKeyId": key.outputs["arn"]}
    assert rule["bucketKeyEnabled"] is True
    # S3 log delivery accepts SSE-S3 only on its destination.
    logs = _of_bucket(result, SSE, "results-logs").inputs["rules"][0]
    assert logs["applyServerSideEncryptionByDefault"] == {"sseAlgorithm": "AES256"}


def _denied(policy: dict, action: str, resource: str, context: dict[str, str]) -> bool:
    """Whether a Deny statement of ``policy`` matches the request (the operators the bucket policy uses)."""
    import fnmatch

    def holds(op: str, key: str, want) -> bool:
        want = want if isinstance(want, list) else [want]
        have = context.get(key)
        if op == "Null":
            return (have is None) == (want[0] == "true")
        if op.endswith("IfExists") and have is None:
            return True
        base = op.removesuffix("IfExists")
        if base == "StringEquals" or base == "Bool":
            return have in want
        if base == "StringNotEquals":
            return have not in want
        raise AssertionError(f"operator {op} not modelled")

    for st in policy["Statement"]:
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        if st["Effect"] != "Deny" or not any(fnmatch.fnmatchcase(action, a) for a in actions) \
                or not any(fnmatch.fnmatchcase(resource, r) for r in resources):
            continue
        if all(holds(op, k, v) for op, kv in st.get("Condition", {}).items() for k, v in kv.items()):
            return True
    return False


KEY = "arn:aws:kms:us-west-2:123456789012:key/11111111-2222-3333-4444-555555555555"
FOREIGN = "arn:aws:kms:us-west-2:999999999999:key/66666666-7777-8888-9999-000000000000"
SSE_H, KEY_H = "s3:x-amz-server-side-encryption", "s3:x-amz-server-side-encryption-aws-kms-key-id"


@pytest.mark.parametrize("context,refused", [
    ({}, False),  # no header (and every UploadPart): the bucket default, i.e. the stack key
    ({SSE_H: "aws:kms", KEY_H: KEY}, False),  # what the uploader sends
    ({SSE_H: "aws:kms", KEY_H: FOREIGN}, True),  # a foreign account's key (ransomware)
    ({SSE_H: "aws:kms"}, True),  # no key named: S3 would use the account's aws/s3 key
    ({SSE_H: "AES256"}, True),
    ({SSE_H: "aws:kms:dsse", KEY_H: KEY}, True),
    ({"s3:x-amz-server-side-encryption-customer-algorithm": "AES256"}, True),  # a key only the writer holds
    ({SSE_H: "aws:kms", KEY_H: KEY, "aws:SecureTransport": "false"}, True),
])
def test_bucket_policy_refuses_writes_under_any_other_encryption(result, context, refused):
    arn = result.one(S3, "results-bucket").outputs["arn"]
    key = result.one("aws:kms/key:Key", "results-kms").outputs["arn"]
    doc = json.loads(_of_bucket(result, POLICY, "results").inputs["policy"])
    ctx = {"aws:SecureTransport": "true", **{k: (key if v == KEY else v) for k, v in context.items()}}
    assert _denied(doc, "s3:PutObject", f"{arn}/runs/run-7/model.pt", ctx) is refused
    # Negative control: the TLS-only policy alone (before this change) refuses none of the encryption cases.
    if "aws:SecureTransport" not in context:
        from eks_ddp.infra.results import tls_only_policy

        assert _denied(json.loads(tls_only_policy(arn)), "s3:PutObject", f"{arn}/runs/run-7/model.pt", ctx) is False


def test_bucket_policy_names_the_key_as_its_arn():
    # The key-id header is compared literally: the uploader sends the ARN, and so does the policy.
    doc = json.loads(bucket_policy("arn:aws:s3:::b", KEY))
    [st] = [s for s in doc["Statement"] if s["Sid"] == "DenyOtherKmsKey"]
    assert st["Condition"] == {"StringNotEquals": {KEY_H: KEY}, "Null": {KEY_H: "false"}}


def test_access_logs_go_to_the_stacks_private_log_bucket(result):
    logging = result.one("aws:s3/bucketLogging:BucketLogging")
    results_bucket, logs = result.one(S3, "results-bucket"), result.one(S3, "results-logs-bucket")
    assert logging.inputs["bucket"] == results_bucket.outputs["id"]
    assert logging.inputs["targetBucket"] == logs.outputs["id"] and logging.retain_on_delete
    doc = json.loads(_of_bucket(result, POLICY, "results-logs").inputs["policy"])
    [allow] = [s for s in doc["Statement"] if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "logging.s3.amazonaws.com"} and allow["Action"] == "s3:PutObject"
    assert allow["Resource"] == f"{logs.outputs['arn']}/{logging.inputs['targetPrefix']}*"
    assert allow["Condition"] == {"ArnLike": {"aws:SourceArn": results_bucket.outputs["arn"]},
                                  "StringEquals": {"aws:SourceAccount": "123456789012"}}


def test_uploader_may_use_the_key_only_through_s3(result):
    key = result.one("aws:kms/key:Key", "results-kms").outputs["arn"]
    doc = json.loads(result.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    [kms] = [s for s in doc["Statement"] if s["Sid"] == "EncryptWithTheResultsKeyThroughS3"]
    assert kms["Resource"] == key and set(kms["Action"]) == {"kms:GenerateDataKey", "kms:Decrypt"}
    assert kms["Condition"] == {"StringLike": {"kms:ViaService": "s3.*.amazonaws.com"}}


# --- the trainer's upload and the fetch command, against moto's in-process S3 -----------------------
def _finished_run(run_dir):
    """A run directory as the trainer leaves it (history, metrics, model)."""
    run_dir.mkdir(parents=True)
    with open(run_dir / "history.jsonl", "w") as f:
        for step in range(0, 30, 5):
            f.write(json.dumps({"kind": "step", "step": step, "epoch": step // 10, "loss": 2.0 - step / 20,
                                "acc": step / 40, "img_s": 500, "world": 2}) + "\n")
    metrics = {"accuracy": 0.75, "correct": 75, "total": 100, "per_class": {c: 0.75 for c in "abcde"},
               "per_class_total": {c: 20 for c in "abcde"}}
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    (run_dir / "model.pt").write_bytes(b"\0model" * 1000)
    return run_dir


@pytest.fixture
def s3(monkeypatch):
    moto = pytest.importorskip("moto")
    import boto3

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-west-2"}.items():
        monkeypatch.setenv(k, v)
    with moto.mock_aws():
        client = boto3.client("s3", region_name="us-west-2")
        client.create_bucket(Bucket="results-b", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        yield client


def test_upload_then_fetch_draws_the_same_curve_and_table(tmp_path, s3, monkeypatch, capsys):
    from eks_ddp_local import fetch_results
    from eks_ddp_trainer import upload
    from eks_ddp_trainer.plot import metrics_table

    run = _finished_run(tmp_path / "runs" / "run-7")
    monkeypatch.setenv(upload.RESULTS_ENV, "s3://results-b/runs/run-7/")
    written = upload.upload_from_env(run)
    assert {k.rsplit("/", 1)[1] for k in written} >= {"metrics.json", "history.jsonl", "model.pt"}
    assert all(k.startswith("runs/run-7/") for k in written)

    out = tmp_path / "fetched"
    assert fetch_results.main(["s3://results-b/runs/run-7/", "--out", str(out), "--region", "us-west-2"]) == 0
    assert (out / "model.pt").read_bytes() == (run / "model.pt").read_bytes()
    assert (out / "training-curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = metrics_table(json.loads((run / "metrics.json").read_text()))
    assert table in capsys.readouterr().out


def test_uploader_writes_every_object_under_the_jobs_kms_key(tmp_path, s3, monkeypatch):
    """Not the bucket default: the bucket here has none, so only the uploader's own request can name the key."""
    import boto3

    from eks_ddp_trainer import upload

    key = boto3.client("kms", region_name="us-west-2").create_key()["KeyMetadata"]["Arn"]
    run = _finished_run(tmp_path / "runs" / "run-7")
    monkeypatch.setenv(upload.RESULTS_ENV, "s3://results-b/runs/run-7/")
    monkeypatch.setenv(upload.KMS_KEY_ENV, key)
    written = upload.upload_from_env(run)
    assert len(written) >= 3
    for k in written:
        head = s3.head_object(Bucket="results-b", Key=k)
        assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == ("aws:kms", key), k


def test_failed_upload_is_loud_but_does_not_raise(tmp_path, s3, capsys):
    from eks_ddp_trainer import upload

    run = _finished_run(tmp_path / "run")
    assert upload.upload_results(run, "s3://no-such-bucket/runs/r/", client=s3) == []
    err = capsys.readouterr().err
    assert err.count("UPLOAD FAILED") >= 3 and "NoSuchBucket" in err


def test_program_wires_the_role_into_the_trainer_service_account_and_env():
    from tests.support.util import run, stack_config

    result = run(stack_config())
    role = result.one("aws:iam/role:Role", "results-uploader")
    sa = result.one("kubernetes:core/v1:ServiceAccount", "training-sa").inputs["metadata"]
    assert sa["annotations"] == {"eks.amazonaws.com/role-arn": role.outputs["arn"]}
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Condition"]["StringEquals"]
    assert f"system:serviceaccount:{sa['namespace']}:{sa['name']}" in trust.values()
    job = next(r for r in result.of_type("kubernetes:batch/v1:Job") if "prepare" not in r.name)
    env = {e["name"]: e.get("value") for e in job.inputs["spec"]["template"]["spec"]["containers"][0]["env"]}
    bucket = result.one(S3, "results-bucket").outputs["bucket"]
    assert env["EKS_DDP_RESULTS_KMS_KEY"] == result.one("aws:kms/key:Key", "results-kms").outputs["arn"]
    run_id = stack_config()["eks-ddp:job"]["runId"] if "runId" in stack_config()["eks-ddp:job"] else "run-1"
    assert env["EKS_DDP_RESULTS_URL"] == f"s3://{bucket}/runs/{run_id}/"
    assert result.outputs["results"]["url"] == env["EKS_DDP_RESULTS_URL"]
    assert result.outputs["fetchResults"].startswith(f"eks-ddp-fetch-results s3://{bucket}/runs/{run_id}/")
    netpol = result.one("kubernetes:networking.k8s.io/v1:NetworkPolicy", "training-train-netpol").inputs
    assert any(p.get("port") == 443 for rule in netpol["spec"]["egress"] for p in rule.get("ports", []))


def test_the_trainer_uploads_its_results_when_the_job_asks(tmp_path, s3, monkeypatch, in_process_trainer):
    """The real trainer, run to the end with the Job's EKS_DDP_RESULTS_URL: its files land under the prefix."""
    from eks_ddp_trainer import train, upload
    from eks_ddp_trainer.data import write_synthetic_cifar

    write_synthetic_cifar(tmp_path / "data", n_train=64, n_test=20, seed=0)
    monkeypatch.setenv(upload.RESULTS_ENV, "s3://results-b/runs/run-9/")
    monkeypatch.setenv("EKS_DDP_SNAPSHOT_DIR", "off")
    assert train.main([f"--data-dir={tmp_path / 'data'}", f"--run-dir={tmp_path / 'run'}", "--epochs=1",
                       "--global-batch-size=16", "--bn-group=4", "--min-steps=0", "--width=4"]) == 0
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="results-b", Prefix="runs/run-9/")["Contents"]}
    assert {"runs/run-9/metrics.json", "runs/run-9/history.jsonl", "runs/run-9/model.pt",
            "runs/run-9/training-curve.png"} <= keys
    uploaded = json.loads(s3.get_object(Bucket="results-b", Key="runs/run-9/metrics.json")["Body"].read())
    assert uploaded == json.loads((tmp_path / "run" / "metrics.json").read_text())


def test_stack_config_adopts_retained_bucket():
    """A9: `storage.resultsBucket` re-attaches the bucket an earlier destroy kept: no new bucket, the upload role
    scoped to that bucket's run prefix, the results output naming it; a bad name is refused naming the key."""
    from tests.support.util import run, set_path, stack_config

    raw = set_path(stack_config("dev"), "eks-ddp:storage.resultsBucket", "results-kept-1234")
    result = run(raw)
    assert result.of_type("aws:s3/bucket:Bucket") == [] and result.of_type("aws:s3/bucketV2:BucketV2") == []
    run_id = raw["eks-ddp:job"]["runId"]
    policies = [json.loads(p.inputs["policy"]) for p in result.of_type("aws:iam/rolePolicy:RolePolicy")
                if "WriteOwnRunOnly" in p.inputs["policy"]]
    assert [s["Resource"] for p in policies for s in p["Statement"] if s["Sid"] == "WriteOwnRunOnly"] == [
        f"arn:aws:s3:::results-kept-1234/runs/{run_id}/*"]
    assert result.outputs["results"]["bucket"] == "results-kept-1234"
    with pytest.raises(pulumi.RunError, match=r"storage.resultsBucket: got 'Bad_Bucket'"):
        run(set_path(raw, "eks-ddp:storage.resultsBucket", "Bad_Bucket"))


KEPT_KEY = "arn:aws:kms:us-west-2:123456789012:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def test_stack_config_gives_the_uploaders_the_reattached_buckets_key():
    """`storage.resultsKmsKeyArn`: the re-attached bucket's SSE-KMS key reaches every uploader's grant and the
    trainer's environment (without it the bucket's default key refuses every PutObject)."""
    from tests.config.test_runs import with_runs
    from tests.support.util import run, set_path

    raw = set_path(with_runs({"runId": "a", "nodes": 1}, {"runId": "b", "nodes": 1}),
                   "eks-ddp:storage.resultsBucket", "results-kept-1234")
    result = run(set_path(raw, "eks-ddp:storage.resultsKmsKeyArn", KEPT_KEY))
    grants = [s for p in result.of_type("aws:iam/rolePolicy:RolePolicy") if "WriteOwnRunOnly" in p.inputs["policy"]
              for s in json.loads(p.inputs["policy"])["Statement"] if s["Sid"] == "EncryptWithTheResultsKeyThroughS3"]
    assert len(grants) == 2 and {g["Resource"] for g in grants} == {KEPT_KEY}
    assert all("kms:GenerateDataKey" in g["Action"] for g in grants)
    for job in ("training-train", "training-b-train"):
        [c] = result.one("kubernetes:batch/v1:Job", job).inputs["spec"]["template"]["spec"]["containers"]
        assert {e["name"]: e.get("value") for e in c["env"]}["EKS_DDP_RESULTS_KMS_KEY"] == KEPT_KEY


def test_a_failed_upload_leaves_a_marker_in_the_run_directory_and_a_good_one_removes_it(tmp_path, s3, monkeypatch):
    from eks_ddp_trainer import upload

    run = _finished_run(tmp_path / "run")
    assert upload.upload_results(run, "s3://no-such-bucket/runs/r/", client=s3) == []
    marker = (run / upload.FAILED_MARKER).read_text()
    assert "s3://no-such-bucket/runs/r/" in marker and "NoSuchBucket" in marker and "metrics.json" in marker
    assert "storage.resultsKmsKeyArn" in marker
    monkeypatch.setenv(upload.RESULTS_ENV, "s3://results-b/runs/r/")
    assert upload.main([str(run)]) == 0  # the upload step, again: everything written, the marker gone
    assert not (run / upload.FAILED_MARKER).exists()


def test_the_upload_step_exits_1_on_a_real_process_when_the_upload_fails(tmp_path):
    """``python -m eks_ddp_trainer.upload``: a real process with no AWS credentials (the shape of a role that cannot
    write) exits 1 and leaves the marker; with nothing to upload to it is a usage error (2)."""
    import os
    import subprocess
    import sys

    from eks_ddp_trainer import upload
    from tests.support.util import ROOT

    run = _finished_run(tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-west-2",
               EKS_DDP_RESULTS_URL="s3://results-b/runs/r/")
    cmd = [sys.executable, "-m", "eks_ddp_trainer.upload", str(run)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "UPLOAD FAILED" in done.stderr and "NoCredentialsError" in (run / upload.FAILED_MARKER).read_text()
    env.pop("EKS_DDP_RESULTS_URL")
    assert subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=120).returncode == 2


def test_the_results_key_is_used_only_through_s3_and_the_account_keeps_administering_it(result):
    """The key's own policy, evaluated as KMS would: no direct decrypt even for a principal allowed kms:* on every
    key (IAM's grant is necessary, the key policy decides where); S3 of this account may; the account can still
    change the policy (no lock-out)."""
    from eks_ddp.tooling.contracts.iam_policy import ALLOW, IMPLICIT_DENY, Request, evaluate

    key = result.one("aws:kms/key:Key", "results-kms")
    policy, arn = key.inputs.get("policy") or "{}", key.outputs["arn"]
    admin = "arn:aws:iam::123456789012:role/admin"

    def ask(action: str, principal: str = admin, **ctx) -> tuple[str, bool]:
        d = evaluate(policy, Request(principal, action, arn, ctx), resource_policy=True)
        return d.effect, d.via_account

    via_s3 = {"kms:ViaService": "s3.us-west-2.amazonaws.com", "kms:CallerAccount": "123456789012"}
    assert ask("kms:Decrypt", **{"kms:ViaService": None, "kms:CallerAccount": "123456789012"})[0] == IMPLICIT_DENY
    assert ask("kms:Decrypt", **via_s3) == (ALLOW, True)  # and the caller's IAM policy must allow it too
    assert ask("kms:GenerateDataKey", **{**via_s3, "kms:ViaService": "s3.eu-west-1.amazonaws.com"})[0] == IMPLICIT_DENY
    assert ask("kms:Decrypt", "arn:aws:iam::999999999999:role/x", **via_s3)[0] == IMPLICIT_DENY
    assert ask("kms:PutKeyPolicy") == (ALLOW, True) and ask("kms:ScheduleKeyDeletion") == (ALLOW, True)
