"""The one IAM evaluator of the contracts (components/eks_ddp/tooling/contracts/iam_policy.py) as its three callers use it: how an
unknown weighs per caller (kept for s3, against the request for image-pull, reported by storage), and the
condition rules the storage and image-pull contracts now take from it. Negative controls: each mode on a policy
built to tell them apart; a context key named in another case, a negated operator outside the subset on an absent
key, a numeric operator on a value that is no number (each mis-evaluated before)."""

from __future__ import annotations

import pytest

from eks_ddp.tooling.contracts import identity, storage
from eks_ddp.tooling.contracts.iam_policy import (
    ALLOW,
    DENY,
    IMPLICIT_DENY,
    UNKNOWN,
    UNKNOWNS_AGAINST,
    Request,
    covers,
    evaluate,
    evaluate_condition,
    glob_match,
)

ROLE = "arn:aws:iam::123456789012:role/r"
BUCKET = "arn:aws:s3:::b/k"
ALLOW_GET = {"Sid": "Get", "Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}
MAYBE = {"StringEquals": {"aws:SourceVpce": "vpce-1"}}  # a key the request below does not know


def doc(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def req(**ctx) -> Request:
    return Request(ROLE, "s3:GetObject", BUCKET, ctx)


def test_an_unknown_weighs_as_the_caller_asks():
    maybe_allow = {**ALLOW_GET, "Sid": "MaybeGet", "Condition": MAYBE}
    maybe_deny = {"Sid": "MaybeDeny", "Effect": "Deny", "Action": "s3:*", "Resource": "*", "Condition": MAYBE}
    # kept (the default, the s3 contract): unknown only where it could change the outcome
    assert evaluate(doc(maybe_allow), req()).effect == UNKNOWN
    assert evaluate(doc(ALLOW_GET, maybe_allow), req()).effect == ALLOW
    # against (the image-pull contract): a conditional Allow grants nothing, a conditional Deny denies
    assert evaluate(doc(maybe_allow), req(), unknowns=UNKNOWNS_AGAINST).effect == IMPLICIT_DENY
    d = evaluate(doc(ALLOW_GET, maybe_deny), req(), unknowns=UNKNOWNS_AGAINST)
    assert d.effect == DENY and d.statements == ("MaybeDeny",)
    with pytest.raises(ValueError, match=r"unknowns: got 'guess'; expected one of"):
        evaluate(doc(ALLOW_GET), req(), unknowns="guess")


def test_decisions_name_statements_in_policy_order_with_the_callers_label():
    first = {**ALLOW_GET, "_from": "inline policy 'a'"}
    second = {**ALLOW_GET, "Action": "s3:*", "_from": "managed policy 'b'"}
    d = evaluate(doc(first, second), req(), label=lambda _, s: s["_from"])
    assert d.statements == ("inline policy 'a'", "managed policy 'b'")
    assert evaluate(doc({**ALLOW_GET, "Sid": None}), req()).statements == ("Statement[0]",)


def test_a_statement_whose_effect_is_neither_allow_nor_deny_grants_nothing():
    """As the image-pull contract had it (an Effect other than Allow never granted there)."""
    assert evaluate(doc({**ALLOW_GET, "Effect": "allow"}), req()).effect == IMPLICIT_DENY
    assert evaluate(doc({k: v for k, v in ALLOW_GET.items() if k != "Effect"}), req()).effect == IMPLICIT_DENY
    assert identity.decide([{"Action": "ecr:*", "Resource": "*", "_from": "p"}], "ecr:BatchGetImage", "*")[0] is False


def test_context_key_names_are_not_case_sensitive():
    """IAM user guide, "IAM JSON policy elements: Condition": aws:SourceIP is the same key as AWS:SourceIp."""
    secure = {**ALLOW_GET, "Condition": {"Bool": {"AWS:SECURETRANSPORT": "true"}}}
    assert evaluate(doc(secure), req(**{"aws:SecureTransport": "true"})).effect == ALLOW
    assert evaluate(doc(secure), req(**{"aws:SecureTransport": "false"})).effect == IMPLICIT_DENY


def test_an_operator_outside_the_subset_is_unknown_even_on_an_absent_key():
    """A negated operator is true on an absent key ("Condition operators"), so answering False for NotIpAddress
    (which is not evaluated here) would be wrong: it stays unknown, as the module promises."""
    not_ip = {**ALLOW_GET, "Condition": {"NotIpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}
    d = evaluate(doc(not_ip), req(**{"aws:SourceIp": None}))
    assert d.effect == UNKNOWN and d.unknown == ("operator NotIpAddress",)


def test_a_numeric_operator_on_a_value_that_is_no_number_is_unknown():
    assert evaluate_condition({"NumericLessThan": {"s3:max-keys": "10"}}, {"s3:max-keys": "many"}) == (
        None, ["s3:max-keys (not a number under NumericLessThan)"])
    assert evaluate_condition({"NumericLessThan": {"s3:max-keys": "10"}}, {"s3:max-keys": "9"}) == (True, [])


def test_covers_and_glob_follow_the_action_and_resource_rules():
    assert covers({"Action": "S3:get*", "Resource": "arn:aws:s3:::b/*"}, "s3:GetObject", BUCKET)
    assert not covers({"Action": "s3:GetObject", "Resource": "arn:aws:s3:::B/*"}, "s3:GetObject", BUCKET)
    assert not covers({"Action": "s3:GetObject"}, "s3:GetObject", BUCKET)  # an identity policy names its resources
    assert covers({"Action": "s3:GetObject"}, "s3:GetObject", BUCKET, resource_policy=True)
    assert glob_match("ECR:batch*", "ecr:BatchGetImage", fold=True)
    assert not glob_match("ECR:batch*", "ecr:BatchGetImage")


# --- the callers' own rules, on top of it ---------------------------------------------------------

def test_image_pull_takes_a_conditional_deny_as_a_deny():
    allow = {"Effect": "Allow", "Action": "ecr:*", "Resource": "*", "_from": "inline policy 'pull'"}
    deny = {"Effect": "Deny", "Action": "ecr:BatchGetImage", "Resource": "*", "_from": "inline policy 'vpce'",
            "Condition": {"StringNotEquals": {"aws:SourceVpce": "vpce-1"}}}
    assert identity.decide([allow], "ecr:BatchGetImage", "*") == (True, "allowed by inline policy 'pull'")
    assert identity.decide([allow, deny], "ecr:BatchGetImage", "*") == (
        False, "explicitly denied by inline policy 'vpce'")


FS = "arn:aws:elasticfilesystem:us-west-2:123456789012:file-system/fs-1"
EFS_CTX = {"aws:SecureTransport": "true", "elasticfilesystem:AccessedViaMountTarget": "true"}


def test_storage_reports_an_unknown_allow_even_where_the_identity_policy_allows():
    """EFS: an Allow in either policy grants, but an Allow the check cannot evaluate is reported, not passed over."""
    who = storage.Identity(ROLE, [{"Effect": "Allow", "Action": storage.MOUNT, "Resource": "*"}])
    fs = [{"Sid": "Ip", "Effect": "Allow", "Principal": {"AWS": ROLE}, "Action": storage.MOUNT,
           "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}}]
    with pytest.raises(storage.Unsupported, match="condition operator IpAddress"):
        storage.decide(storage.MOUNT, FS, EFS_CTX, fs, who)
    fs[0].pop("Condition")
    assert storage.decide(storage.MOUNT, FS, EFS_CTX, fs, who) == (
        True, "allowed by the file-system policy statement Ip")
    assert storage.decide(storage.MOUNT, FS, EFS_CTX, None, storage.Identity(None)) == (
        True, "no file-system policy: EFS's default grants every client full access")
    deny = {"Effect": "Deny", "Action": storage.MOUNT, "Resource": "*"}
    assert storage.decide(storage.MOUNT, FS, EFS_CTX, fs, storage.Identity(ROLE, [deny])) == (
        False, "denied by the identity policy statement (no Sid)")


def test_storage_reports_what_it_cannot_evaluate_whoever_the_statement_names():
    """A statement that covers the action but names another principal still makes the decision unknown, before
    any Deny: the check reports what it cannot evaluate instead of resting on the statements' order."""
    other = {"Sid": "Other", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:role/other"},
             "Action": storage.MOUNT, "Condition": {"ForAnyValue:StringEquals": {"aws:SourceIp": "10.0.0.1"}}}
    deny = {"Sid": "No", "Effect": "Deny", "Principal": "*", "Action": storage.MOUNT}
    with pytest.raises(storage.Unsupported, match="ForAnyValue:StringEquals on aws:SourceIp"):
        storage.decide(storage.MOUNT, FS, EFS_CTX, [deny, other], storage.Identity(ROLE))
    assert storage.decide(storage.MOUNT, FS, EFS_CTX, [deny], storage.Identity(ROLE)) == (
        False, "denied by the file-system policy statement No")
