"""The cluster autoscaler's ProvisioningRequest support (``ClusterAutoscalerArgs.provisioning_requests``): the flag,
the vendored CRD, and the release waiting for both the CRD and its grant (RBAC coverage: test_autoscaler_rbac.py)."""

from __future__ import annotations

import hashlib

import pytest

from eks_ddp.infra import autoscaler
from eks_ddp.tooling.mocks import ProgramResult, run_program

UPSTREAM_BLOB = "fa6978b0ce335df65375cba640689f0647eacc6b"
"""git blob of cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml at
kubernetes/autoscaler tag cluster-autoscaler-1.36.1."""


def args(**kw) -> autoscaler.ClusterAutoscalerArgs:
    return autoscaler.ClusterAutoscalerArgs(**{
        "cluster_name": "c", "region": "us-west-2", "oidc_provider_arn": "a", "oidc_provider_url": "u",
        "node_selector": {"eks-ddp/pool": "system"}, **kw})


def build(**kw) -> ProgramResult:
    return run_program({}, program=lambda: autoscaler.ClusterAutoscaler("autoscaler", args(**kw)))


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's object name


def test_the_crd_is_the_upstream_file_unchanged():
    text = autoscaler.PROVREQ_CRD_FILE.read_bytes()
    body = text[text.index(b"---\n"):]
    assert git_blob(body) == UPSTREAM_BLOB
    crd = autoscaler.provisioning_request_crd()
    assert crd["spec"]["group"] == "autoscaling.x-k8s.io" and crd["spec"]["names"]["kind"] == "ProvisioningRequest"
    assert {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]} == {
        "v1": (True, True), "v1beta1": (True, False)}  # Kueue v0.16.4 uses v1
    # Negative control: one changed byte is a different blob.
    assert git_blob(body.replace(b"ProvisioningRequest", b"ProvisioningRequesT", 1)) != UPSTREAM_BLOB


@pytest.mark.parametrize("version", sorted(autoscaler.PINS))
def test_the_flag_is_set_only_when_asked(version):
    on = autoscaler.helm_values(args(kubernetes_version=version, provisioning_requests=True), "arn")["extraArgs"]
    off = autoscaler.helm_values(args(kubernetes_version=version), "arn")["extraArgs"]
    assert on[autoscaler.PROVREQ_FLAG] == "true" and autoscaler.PROVREQ_FLAG == "enable-provisioning-requests"
    assert autoscaler.PROVREQ_FLAG not in off


def test_the_release_waits_for_the_crd_and_the_grant():
    result = build(provisioning_requests=True)
    release = result.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    crd = result.one("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    binding = result.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    assert {crd.urn, binding.urn} <= set(release.dependencies)
    assert crd.inputs["metadata"]["name"] == autoscaler.PROVREQ_CRD_NAME
    assert crd.inputs["spec"] == autoscaler.provisioning_request_crd()["spec"]
    # Negative control: off (the default), none of them exists.
    bare = build()
    assert not bare.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    assert not bare.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")


def test_a_non_boolean_is_named():
    with pytest.raises(ValueError, match="provisioning_requests: got 'yes'; expected true or false"):
        autoscaler.validate(args(provisioning_requests="yes"))
