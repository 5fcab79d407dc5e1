"""Contract "s3" (components/eks_ddp/tooling/contracts/s3.py) and its IAM evaluator (components/eks_ddp/tooling/contracts/iam_policy.py).

Positive: the dev and p4de plans, and a stack whose run stages a data set from another account's bucket, pass.
Negative controls: the endpoint policy today's main writes (this account's buckets only) with that data set (B4);
the uploader without its KMS grant, and a re-attached SSE-KMS results bucket whose key the stack was not given
(B5); a foreign KMS key refused by the bucket policy; a ServiceAccount without a role; a role trusting another
ServiceAccount (U10)."""

from __future__ import annotations

import copy
import json

import pytest

from eks_ddp.infra.network import s3_endpoint_policy
from eks_ddp.tooling.contracts import PlanView, check
from eks_ddp.tooling.contracts import s3 as contract
from eks_ddp.tooling.contracts.iam_policy import ALLOW, DENY, IMPLICIT_DENY, UNKNOWN, Request, evaluate, evaluate_all
from tests.config.test_runs import DIGEST, with_runs
from tests.support.util import run, set_path

ACCOUNT = "123456789012"
OTHER = "999999999999"
LAKE = "open-data-lake"
WIKI = f"s3://{LAKE}/corpora/wiki/"
KEPT = "results-kept-1234"
KEPT_KEY = "arn:aws:kms:us-west-2:123456789012:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"


def cross_account_config() -> dict:
    """Two runs (the bundled trainer; an image of its own staging a data set from another account's bucket), an
    extra bucket, and a re-attached results bucket with its key."""
    raw = with_runs({"runId": "a", "nodes": 1}, {"runId": "b", "nodes": 1, "workload": {
        "image": DIGEST, "module": "bert.train", "data": {"s3": WIKI}}})
    raw = set_path(raw, "eks-ddp:network.s3EndpointExtraBuckets", ["weights-lake"])
    raw = set_path(raw, "eks-ddp:storage.resultsBucket", KEPT)
    return set_path(raw, "eks-ddp:storage.resultsKmsKeyArn", KEPT_KEY)


@pytest.fixture(scope="module")
def cross_result():
    return run(cross_account_config())


FACTS = contract.Facts(bucket_owners={LAKE: OTHER, KEPT: ACCOUNT}, bucket_keys={KEPT: KEPT_KEY})


def messages(result, facts: contract.Facts | None = None) -> list[str]:
    return [str(v) for v in contract.violations(PlanView.of(result), facts)]


def with_endpoint_policy_of_today(result):
    """The plan as today's main writes it: the endpoint admits this account's buckets and AWS-owned reads only."""
    today = copy.deepcopy(result)
    [ep] = today.of_type(ENDPOINT)
    ep.inputs["policy"] = s3_endpoint_policy("us-west-2", ACCOUNT)
    return today


# --- positive ----------------------------------------------------------------------------------------------
def test_dev_and_p4de_plans_pass_with_every_request_checked(dev_result, p4de_result):
    for result in (dev_result, p4de_result):
        view = PlanView.of(result)
        used = contract.uses(view)
        assert {u.action for u in used} == {"s3:PutObject"} and all(u.kms_key for u in used if u.headers.get(
            "s3:x-amz-server-side-encryption"))
        assert contract.violations(view) == []
        assert [v for v in check(result, only=("s3",))] == []


def test_a_data_set_in_another_accounts_bucket_passes_through_the_stacks_endpoint(cross_result):
    used = contract.uses(PlanView.of(cross_result))
    assert {(u.action, u.bucket) for u in used} >= {("s3:ListBucket", LAKE), ("s3:GetObject", LAKE),
                                                     ("s3:PutObject", KEPT)}
    assert messages(cross_result, FACTS) == []
    # Without the facts preflight establishes, the data set still passes (the endpoint names it, whoever owns
    # it), while the adopted results bucket cannot be shown to be this account's: said, not guessed.
    unknown = messages(cross_result)
    assert unknown and all(f"s3://{KEPT}/" in m and "cannot evaluate: aws:ResourceAccount" in m for m in unknown)


def test_result_files_mirror_the_uploader():
    from eks_ddp_trainer.upload import FILES

    assert contract.RESULT_FILES == FILES


# --- negative controls -----------------------------------------------------------------------------------
def test_todays_endpoint_policy_refuses_the_other_accounts_data_set(cross_result):
    """B4: with the endpoint policy of today's main, the stage's reads are refused at the endpoint while the role
    allows them; with the owner unknown the contract says it cannot show the read allowed."""
    today = with_endpoint_policy_of_today(cross_result)
    found = messages(today, FACTS)
    assert len(found) == 2, found
    for action in ("s3:ListBucket on s3://open-data-lake/corpora/wiki/", "s3:GetObject on s3://open-data-lake/"):
        [m] = [m for m in found if action in m]
        assert m.startswith("[s3] Job training/training-b-stage-data:")
        assert "the S3 gateway endpoint network-s3" in m and "implicit-deny" in m
    unknown = [m for m in messages(today) if f"s3://{LAKE}/" in m]
    assert len(unknown) == 2 and all("cannot evaluate: aws:ResourceAccount" in m for m in unknown), unknown


def test_an_uploader_without_the_kms_grant_fails(dev_result):
    """B5 (the grant): the results key encrypts every upload; without kms:GenerateDataKey S3 refuses each one."""
    broken = copy.deepcopy(dev_result)
    [policy] = [p for p in broken.of_type(ROLE_POLICY) if "WriteOwnRunOnly" in p.inputs["policy"]]
    doc = json.loads(policy.inputs["policy"])
    doc["Statement"] = [s for s in doc["Statement"] if s["Sid"] != "EncryptWithTheResultsKeyThroughS3"]
    policy.inputs["policy"] = json.dumps(doc)
    found = messages(broken)
    assert any("kms:GenerateDataKey on KMS key arn:aws:kms:us-west-2:123456789012:key/results-kms" in m
               and "implicit-deny" in m for m in found), found
    assert any("kms:Decrypt" in m for m in found)


def test_a_reattached_sse_kms_bucket_without_its_key_in_the_stack_fails():
    """B5 (today's path): `storage.resultsBucket` without `storage.resultsKmsKeyArn`; the bucket encrypts under its
    old key (what preflight's GetBucketEncryption reads), which the uploader may not use."""
    raw = set_path(with_runs({"runId": "a", "nodes": 1}), "eks-ddp:storage.resultsBucket", KEPT)
    found = messages(run(raw), contract.Facts(bucket_owners={KEPT: ACCOUNT}, bucket_keys={KEPT: KEPT_KEY}))
    assert found and all(f"kms:GenerateDataKey on KMS key {KEPT_KEY}" in m or f"kms:Decrypt on KMS key {KEPT_KEY}"
                         in m for m in found), found
    assert any("storage.resultsKmsKeyArn" in m for m in found)


def test_a_foreign_kms_key_is_refused_by_the_bucket_policy(dev_result):
    broken = copy.deepcopy(dev_result)
    foreign = f"arn:aws:kms:us-west-2:{OTHER}:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    for job in broken.of_type("kubernetes:batch/v1:Job"):
        for c in job.inputs["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env", []):
                if e["name"] == contract.RESULTS_KMS_ENV:
                    e["value"] = foreign
    found = messages(broken)
    assert any("refused by the bucket policy" in m and "DenyOtherKmsKey" in m for m in found), found


def test_a_pod_without_a_role_or_with_a_role_trusting_another_service_account_fails(dev_result):
    no_role = copy.deepcopy(dev_result)
    [sa] = [r for r in no_role.of_type("kubernetes:core/v1:ServiceAccount") if r.name == "training-sa"]
    sa.inputs["metadata"]["annotations"] = {}
    assert any("has no eks.amazonaws.com/role-arn annotation" in m for m in messages(no_role))

    other_sa = copy.deepcopy(dev_result)
    role = other_sa.one("aws:iam/role:Role", "results-uploader")
    role.inputs["assumeRolePolicy"] = role.inputs["assumeRolePolicy"].replace("training-trainer", "mlp-trainer")
    found = messages(other_sa)
    assert found and all("does not let ServiceAccount training/training-trainer assume it" in m for m in found), found


# --- the evaluator against AWS's documented rules ---------------------------------------------------------
def req(action="s3:GetObject", resource="arn:aws:s3:::b/k", **ctx) -> Request:
    return Request(f"arn:aws:iam::{ACCOUNT}:role/r", action, resource, ctx)


def doc(*statements) -> dict:
    return {"Statement": list(statements)}


ALLOW_GET = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}


def test_explicit_deny_wins_and_no_allow_is_an_implicit_deny():
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": "*"}
    assert evaluate(doc(ALLOW_GET, deny), req()).effect == DENY
    assert evaluate(doc(ALLOW_GET), req(action="s3:PutObject")).effect == IMPLICIT_DENY
    assert evaluate(doc(ALLOW_GET), req()).effect == ALLOW
    assert evaluate_all([doc(ALLOW_GET), doc(deny)], req()).effect == DENY


def test_actions_fold_case_resources_do_not_and_not_action_inverts():
    assert evaluate(doc({**ALLOW_GET, "Action": "S3:get*"}), req()).effect == ALLOW
    assert evaluate(doc({**ALLOW_GET, "Resource": "arn:aws:s3:::B/*"}), req()).effect == IMPLICIT_DENY
    assert evaluate(doc({"Effect": "Allow", "NotAction": "s3:Put*", "Resource": "*"}), req()).effect == ALLOW
    assert evaluate(doc({**ALLOW_GET, "Resource": "arn:aws:s3:::b/?"}), req()).effect == ALLOW


def test_conditions_follow_the_condition_operator_rules():
    def on(op, key, value, **ctx):
        return evaluate(doc({**ALLOW_GET, "Condition": {op: {key: value}}}), req(**ctx)).effect

    assert on("StringEquals", "s3:prefix", "a/", **{"s3:prefix": "a/"}) == ALLOW
    assert on("StringEquals", "s3:prefix", ["x/", "a/"], **{"s3:prefix": "a/"}) == ALLOW  # values OR
    assert on("StringEquals", "s3:prefix", "a/", **{"s3:prefix": None}) == IMPLICIT_DENY  # absent: false
    assert on("StringNotEquals", "s3:prefix", "a/", **{"s3:prefix": None}) == ALLOW  # absent, negated: true
    assert on("StringNotEquals", "s3:prefix", ["a/", "b/"], **{"s3:prefix": "b/"}) == IMPLICIT_DENY  # NOR
    assert on("StringEqualsIfExists", "s3:prefix", "a/", **{"s3:prefix": None}) == ALLOW
    assert on("Null", "s3:prefix", "true", **{"s3:prefix": None}) == ALLOW
    assert on("Null", "s3:prefix", "false", **{"s3:prefix": None}) == IMPLICIT_DENY
    assert on("StringLike", "kms:ViaService", "s3.*.amazonaws.com", **{"kms:ViaService": "s3.us-west-2.amazonaws.com"}) \
        == ALLOW
    assert on("ArnLike", "aws:SourceArn", "arn:aws:ec2:*:1:vpc-flow-log/*",
              **{"aws:SourceArn": "arn:aws:ec2:us-west-2:1:vpc-flow-log/fl-1"}) == ALLOW
    # ArnLike matches each colon-delimited part on its own: a '*' does not span the colons.
    assert on("ArnLike", "aws:SourceArn", "arn:aws:ec2:*/fl-1", **{"aws:SourceArn": "arn:aws:ec2:r:1:x/fl-1"}) \
        == IMPLICIT_DENY
    assert on("Bool", "aws:SecureTransport", False, **{"aws:SecureTransport": "false"}) == ALLOW


def test_what_cannot_be_evaluated_is_unknown_and_named():
    d = evaluate(doc({**ALLOW_GET, "Condition": {"StringEquals": {"aws:ResourceAccount": ACCOUNT}}}), req())
    assert d.effect == UNKNOWN and d.unknown == ("aws:ResourceAccount",)
    d = evaluate(doc({**ALLOW_GET, "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}),
                 req(**{"aws:SourceIp": "10.1.2.3"}))
    assert d.effect == UNKNOWN and d.unknown == ("operator IpAddress",)
    # A Deny that may apply leaves an Allow unknown; with no Allow at all the request is refused either way.
    maybe_deny = {"Effect": "Deny", "Action": "*", "Resource": "*",
                  "Condition": {"StringNotEquals": {"aws:SourceVpce": "vpce-1"}}}
    assert evaluate(doc(ALLOW_GET, maybe_deny), req()).effect == UNKNOWN
    assert evaluate(doc(maybe_deny), req()).effect == IMPLICIT_DENY


def test_resource_policies_match_the_principal_and_mark_account_delegation():
    root = {"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"}, "Action": "kms:*", "Resource": "*"}
    d = evaluate(doc(root), req("kms:Decrypt", "arn:aws:kms:us-west-2:1:key/k"), resource_policy=True)
    assert d.effect == ALLOW and d.via_account
    other = {**root, "Principal": {"AWS": f"arn:aws:iam::{OTHER}:root"}}
    assert evaluate(doc(other), req("kms:Decrypt", "k"), resource_policy=True).effect == IMPLICIT_DENY
    anyone = {**ALLOW_GET, "Principal": "*"}
    d = evaluate(doc(anyone), req(), resource_policy=True)
    assert d.effect == ALLOW and not d.via_account
