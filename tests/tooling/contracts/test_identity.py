"""The identity contract's image part (components/eks_ddp/tooling/contracts/identity.py): every pod image is pullable by the node
role that pulls it, evaluated as IAM does, and pinned by digest. Positive over dev, p4de and the byo stack;
negative controls: today's main on the byo stack (B1: no grant on the run images' repositories), an explicit
Deny, a conditional Allow, an unpinned image."""

from __future__ import annotations

import dataclasses
import json

import pytest

from eks_ddp.tooling.contracts import PlanView, check
from eks_ddp.tooling.contracts.identity import (
    can_pull,
    decide,
    every_pod_image_is_pinned,
    every_pod_image_is_pullable,
    role_statements,
    wildcard,
)
from eks_ddp.tooling.mocks import ProgramResult, Recorded
from tests.support.util import BYO_OTHER_ACCOUNT_IMAGE, BYO_OWN_ACCOUNT_IMAGE

ONLY = ("image-pull", "image-digest")
ROLE = "arn:aws:iam::123456789012:role/nodes"
REPO = "arn:aws:ecr:us-west-2:123456789012:repository/nlp/bert"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/nlp/bert@sha256:" + "b1" * 32


def without(result: ProgramResult, drop) -> ProgramResult:
    """The plan minus the resources ``drop`` picks (what a plan without them would record)."""
    return dataclasses.replace(result, resources=[r for r in result.resources if not drop(r)])


@pytest.mark.parametrize("fixture", ["dev_result", "p4de_result", "byo_result"])
def test_every_pod_image_is_pullable_and_pinned(fixture, request):
    assert check(request.getfixturevalue(fixture), only=ONLY) == []


def test_negative_control_todays_main_leaves_the_run_images_unpullable(byo_result):
    # Today's main creates none of the run-image grants (components/eks_ddp/infra/image.py granted only the trainer's repository):
    # the same plan without them.
    old = without(byo_result, lambda r: r.name.startswith("run-image-") and r.type.startswith("aws:iam/"))
    found = every_pod_image_is_pullable(PlanView.of(old))
    subjects = {v.subject.split(" ")[0] for v in found}
    assert {"Job/training-bert-1-bert-1", "Job/training-bert-1-stage-data", "Job/training-vit-1-vit-1"} <= subjects
    bert = next(v for v in found if BYO_OWN_ACCOUNT_IMAGE in v.message)
    assert "node role 'cluster-node'" in bert.message and "ImagePullBackOff" in bert.message
    assert "ecr:BatchGetImage on arn:aws:ecr:us-west-2:123456789012:repository/nlp/bert: implicitly denied" in \
        bert.message
    assert any(BYO_OTHER_ACCOUNT_IMAGE in v.message and "repository/vision/vit" in v.message for v in found)
    assert not [v for v in found if "trainer-image-repo" in v.message]  # the stack's image keeps its grant


# --- IAM's rules, on small plans -------------------------------------------------------------------

def plan(*policies: dict, attach: tuple[str, ...] = (), image: str = IMAGE, selector=None) -> PlanView:
    role = Recorded(urn="urn:role", type="aws:iam/role:Role", name="nodes", custom=True, parent_urn="",
                    inputs={}, outputs={"arn": ROLE, "name": "nodes", "id": "nodes"})
    group = Recorded(urn="urn:ng", type="aws:eks/nodeGroup:NodeGroup", name="gpu", custom=True, parent_urn="",
                     inputs={"nodeRoleArn": ROLE, "labels": {"pool": "gpu"}}, outputs={})
    res = [role, group]
    res += [Recorded(urn=f"urn:p{i}", type="aws:iam/rolePolicy:RolePolicy", name=f"p{i}", custom=True,
                     parent_urn="", inputs={"role": "nodes", "policy": json.dumps(p)}, outputs={})
            for i, p in enumerate(policies)]
    res += [Recorded(urn=f"urn:a{i}", type="aws:iam/rolePolicyAttachment:RolePolicyAttachment", name=f"a{i}",
                     custom=True, parent_urn="", inputs={"role": "nodes", "policyArn": a}, outputs={})
            for i, a in enumerate(attach)]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"}, "spec": {"template": {"spec": {
        "nodeSelector": selector if selector is not None else {"pool": "gpu"},
        "initContainers": [{"name": "init", "image": image}], "containers": [{"name": "main", "image": image}]}}}}
    return PlanView(result=ProgramResult(resources=res, outputs={}, secret_outputs=set()), manifests=[job])


def doc(*statements: dict) -> dict:
    return {"Version": "2012-10-17", "Statement": list(statements)}


LOGIN = {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"}
PULL = {"Effect": "Allow", "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"], "Resource": REPO}


def test_a_pull_needs_the_token_and_both_repository_actions():
    assert every_pod_image_is_pullable(plan(doc(LOGIN, PULL))) == []
    [init, main] = every_pod_image_is_pullable(plan(doc(PULL)))  # no token: init and main container both
    assert "ecr:GetAuthorizationToken on *: implicitly denied" in main.message and "initContainers" in init.subject
    half = {**PULL, "Action": "ecr:BatchGetImage"}
    assert "ecr:GetDownloadUrlForLayer" in every_pod_image_is_pullable(plan(doc(LOGIN, half)))[0].message


def test_an_explicit_deny_wins_over_any_allow():
    deny = {"Effect": "Deny", "Action": "ecr:*", "Resource": "arn:aws:ecr:*:*:repository/nlp/*"}
    found = every_pod_image_is_pullable(plan(doc(LOGIN, PULL), doc(deny),
                                             attach=("arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",)))
    assert len(found) == 2 and "explicitly denied by inline policy 'p1'" in found[0].message


def test_wildcards_in_actions_and_arns_match_as_iam_does():
    assert wildcard("ecr:Batch*", "ECR:BatchGetImage", case_sensitive=False)
    assert wildcard("arn:aws:ecr:us-west-2:123456789012:repository/nlp/*", REPO, case_sensitive=True)
    assert wildcard("arn:aws:ecr:us-west-?:*:repository/*", REPO, case_sensitive=True)
    assert not wildcard("arn:aws:ecr:us-west-2:123456789012:repository/NLP/*", REPO, case_sensitive=True)
    assert not wildcard("arn:aws:ecr:us-west-2:123456789012:repository/nlp", REPO, case_sensitive=True)
    prefix = {"Effect": "Allow", "Action": "ecr:*", "Resource": "arn:aws:ecr:us-west-2:123456789012:repository/nlp/*"}
    assert every_pod_image_is_pullable(plan(doc(LOGIN, prefix))) == []
    other = {**prefix, "Resource": "arn:aws:ecr:us-west-2:123456789012:repository/vision/*"}
    assert every_pod_image_is_pullable(plan(doc(LOGIN, other)))


def test_not_action_and_not_resource_cover_everything_else():
    allow_all_but = {"Effect": "Allow", "NotAction": "ecr:PutImage", "NotResource": "arn:aws:ecr:*:*:repository/x"}
    assert every_pod_image_is_pullable(plan(doc(allow_all_but))) == []
    deny_all_but = {"Effect": "Deny", "NotAction": "s3:*", "Resource": "*"}
    assert every_pod_image_is_pullable(plan(doc(LOGIN, PULL), doc(deny_all_but)))


def test_what_cannot_be_evaluated_is_taken_against_the_pull():
    conditional = {**PULL, "Condition": {"StringEquals": {"aws:SourceVpce": "vpce-1"}}}
    assert "implicitly denied" in every_pod_image_is_pullable(plan(doc(LOGIN, conditional)))[0].message
    unknown = ("arn:aws:iam::123456789012:policy/not-in-the-plan",)
    assert every_pod_image_is_pullable(plan(doc(LOGIN), attach=unknown))


@pytest.mark.parametrize("name", ["AmazonEC2ContainerRegistryReadOnly", "AmazonEC2ContainerRegistryPullOnly"])
def test_aws_managed_pull_policies_grant_every_repository(name):
    for partition in ("aws", "aws-us-gov"):
        assert every_pod_image_is_pullable(plan(attach=(f"arn:{partition}:iam::aws:policy/{name}",))) == []
    assert every_pod_image_is_pullable(plan(attach=("arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",)))


def test_the_role_of_every_group_the_pod_may_land_on_is_checked():
    view = plan(doc(LOGIN, PULL), selector={"pool": "cpu"})  # no group carries that label
    assert "no managed node group's labels satisfy nodeSelector" in every_pod_image_is_pullable(view)[0].message


def test_images_outside_ecr_need_no_grant_but_a_digest():
    ngc = "nvcr.io/nvidia/pytorch@sha256:" + "d3" * 32
    assert every_pod_image_is_pullable(plan(image=ngc)) == [] and every_pod_image_is_pinned(plan(image=ngc)) == []
    [init, main] = every_pod_image_is_pinned(plan(image="quay.io/coreos/etcd:v3.5.18"))
    assert "'quay.io/coreos/etcd:v3.5.18' is not pinned by digest" in main.message and main.contract == "image-digest"


def test_decisions_on_the_dev_node_role(dev_result):
    view = PlanView.of(dev_result)
    role = next(r for r in view.aws("aws:iam/role:Role") if r.name == "cluster-node")
    statements = role_statements(view, role)
    trainer = "arn:aws:ecr:us-west-2:123456789012:repository/trainer-image-repo"
    assert can_pull(statements, trainer) == (True, "")
    assert decide(statements, "ecr:BatchGetImage", REPO) == (
        False, "implicitly denied: no statement without a Condition allows it")  # least privilege holds
