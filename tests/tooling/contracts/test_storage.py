"""The storage contract: every EFS mount of the plan is permitted by the file-system policy as the CSI driver mounts.

Positive: the dev and p4de plans. Negative controls: the mounts and policy of the code before B9 (anonymous TLS
mounts against a policy that denies unless ``elasticfilesystem:AccessPointArn`` is set), and each way the
driver or EFS would refuse a mount the plan describes.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from eks_ddp.infra.efs import file_system_policy
from eks_ddp.infra.iam import irsa_trust_policy
from eks_ddp.tooling.contracts import PlanView, check
from eks_ddp.tooling.contracts import storage as contract


@pytest.fixture(scope="module")
def dev_view(dev_result):
    return PlanView.of(dev_result)


def _edited(view: PlanView, *, policy=None, trust=None, pv=None) -> PlanView:
    """A copy of ``view`` with the file-system policy, the CSI role's trust or every EFS PV changed."""
    resources = []
    for r in view.result.resources:
        if policy is not None and r.type == "aws:efs/fileSystemPolicy:FileSystemPolicy":
            r = dataclasses.replace(r, inputs={**r.inputs, "policy": policy(view)})
        if trust is not None and r.type == "aws:iam/role:Role" and r.name.endswith("efs-csi"):
            r = dataclasses.replace(r, inputs={**r.inputs, "assumeRolePolicy": trust})
        resources.append(r)
    manifests = copy.deepcopy(view.manifests)
    if pv is not None:
        for m in manifests:
            if m.get("kind") == "PersistentVolume" and m["spec"].get("csi", {}).get("driver") == contract.DRIVER:
                pv(m)
    return PlanView(result=dataclasses.replace(view.result, resources=resources), manifests=manifests)


def _ap_arns(view: PlanView) -> list[str]:
    return [ap.outputs["arn"] for ap in view.aws("aws:efs/accessPoint:AccessPoint")]


def _anonymous(m):
    m["spec"].pop("mountOptions", None)


def test_the_dev_and_p4de_plans_mount_every_efs_volume(dev_view, p4de_result):
    assert contract.efs_mounts_permitted(dev_view) == []
    assert check(p4de_result, only=("storage",)) == []
    mounts = [contract.mount_of(pv) for pv in dev_view.kind("PersistentVolume")]
    assert len(mounts) == 3 and all(m.iam and m.tls for m in mounts)
    assert [i.how for i in contract.node_identities(dev_view)] == ["IRSA of efs-csi-node-sa (add-on role)"]


def test_the_mounts_and_policy_before_b9_are_reported(dev_view):
    """B9's negative control: anonymous TLS mounts (no ``iam``) against the policy the stack had, which denies
    unless ``AccessPointArn`` is set and allows ``AWS: *``: EFS has no access-point ARN for an anonymous client,
    so ``StringNotEquals`` on the absent key is true and the Deny matches every mount."""
    before = _edited(dev_view, policy=lambda v: file_system_policy(_ap_arns(v)), pv=_anonymous)
    found = contract.efs_mounts_permitted(before)
    assert {v.subject for v in found} == {"PersistentVolume training-shared-data",
                                          "PersistentVolume training-shared-data-ro",
                                          "PersistentVolume training-shared-run-run-1"}
    assert all("without iam (anonymous)" in v.message and "DenyOtherThanStackAccessPoints" in v.message
               for v in found), found


def test_an_anonymous_mount_against_todays_policy_is_refused(dev_view):
    """Without ``iam`` today's policy allows no one: the only allow names the CSI role."""
    found = contract.efs_mounts_permitted(_edited(dev_view, pv=_anonymous))
    assert found and all("anonymous" in v.message for v in found)


def test_a_node_service_account_the_role_does_not_trust_falls_back_to_the_node_role(dev_view):
    """The trust the stack had (the controller's service account only): efs-utils' web identity fails, the
    instance profile (the node role) mounts, and neither policy allows the node role."""
    issuer = "oidc.eks.us-west-2.amazonaws.com/id/X"
    old = irsa_trust_policy(f"arn:aws:iam::123456789012:oidc-provider/{issuer}", issuer, "kube-system",
                            "efs-csi-controller-sa")
    view = _edited(dev_view, trust=old)
    assert [i.how for i in contract.node_identities(view)] == ["instance profile of the node (no usable IRSA role)"]
    found = contract.efs_mounts_permitted(view)
    assert found and all("cluster-node" in v.message and "implicit deny" in v.message for v in found), found


def test_a_mount_without_tls_is_refused_by_the_tls_deny(dev_view):
    def plain(m):
        m["spec"]["csi"]["volumeHandle"] = m["spec"]["csi"]["volumeHandle"].split(":")[0]
        m["spec"]["csi"]["volumeAttributes"] = {"encryptInTransit": "false"}
        m["spec"].pop("mountOptions")
    found = contract.efs_mounts_permitted(_edited(dev_view, pv=plain))
    assert found and all("DenyWithoutTls" in v.message for v in found), found


def test_iam_without_tls_and_unknown_attributes_are_refused_by_the_driver():
    pv = {"metadata": {"name": "p"}, "spec": {"mountOptions": ["iam"], "csi": {
        "driver": "efs.csi.aws.com", "volumeHandle": "fs-0123456789abcdef0",
        "volumeAttributes": {"encryptInTransit": "false", "iam": "true"}}}}
    problems = contract.mount_of(pv).problems
    assert any("volumeAttributes.iam" in p for p in problems)
    assert any("iam without tls" in p for p in problems)


def test_no_file_system_policy_is_efs_default_full_access(dev_view):
    view = _edited(dev_view, pv=_anonymous)
    view = PlanView(result=dataclasses.replace(view.result, resources=[
        r for r in view.result.resources if r.type != "aws:efs/fileSystemPolicy:FileSystemPolicy"]),
        manifests=view.manifests)
    assert contract.efs_mounts_permitted(view) == []


def test_a_condition_key_efs_does_not_enforce_is_reported(dev_view):
    def policy(v):
        doc = json.loads(file_system_policy(_ap_arns(v), "arn:aws:iam::123456789012:role/x"))
        doc["Statement"][-1]["Condition"]["ArnEquals"] = {"aws:PrincipalArn": "arn:aws:iam::123456789012:role/x"}
        return json.dumps(doc)
    found = contract.efs_mounts_permitted(_edited(dev_view, policy=policy))
    assert found and all("aws:PrincipalArn" in v.message for v in found), found


@pytest.mark.parametrize(("condition", "context", "holds"), [
    ({"StringNotEquals": {"elasticfilesystem:AccessPointArn": ["a"]}}, {}, True),   # absent key: negated is true
    ({"StringEquals": {"elasticfilesystem:AccessPointArn": ["a"]}}, {}, False),     # absent key: positive is false
    ({"StringEqualsIfExists": {"elasticfilesystem:AccessPointArn": "a"}}, {}, True),
    ({"StringNotEquals": {"elasticfilesystem:AccessPointArn": ["a", "b"]}},
     {"elasticfilesystem:AccessPointArn": "b"}, False),
    ({"Bool": {"aws:SecureTransport": "false"}}, {"aws:SecureTransport": "true"}, False),
    ({"Null": {"elasticfilesystem:AccessPointArn": "true"}}, {}, True),
])
def test_iam_condition_semantics(condition, context, holds):
    assert contract.condition_holds(condition, context) is holds


def test_a_pod_that_writes_through_the_read_only_claim_is_reported(dev_view):
    """T12's negative control: the training pods mount the dataset's read-only claim read-only; one that mounts it
    read-write would find every write refused by EFS (DenyWritesThroughReadOnlyAccessPoints)."""
    view = _edited(dev_view)
    for m in view.manifests:
        for vol in (((m.get("spec") or {}).get("template") or {}).get("spec") or {}).get("volumes") or []:
            if (vol.get("persistentVolumeClaim") or {}).get("claimName") == "shared-data-ro":
                vol["persistentVolumeClaim"]["readOnly"] = False
    found = contract.efs_mounts_permitted(view)
    assert [v.subject for v in found] == ["PersistentVolume training-shared-data-ro"]
    assert "ClientWrite" in found[0].message and "DenyWritesThroughReadOnlyAccessPoints" in found[0].message
