"""Infrastructure findings of the pre-deployment review, checked on the whole program under mocks."""

from __future__ import annotations

import json

from tests.support.util import run, stack_config


def _k8s_provider_kubeconfig(result) -> dict:
    [provider] = [r for r in result.of_type("pulumi:providers:kubernetes") if r.name == "k8s"]
    kube = provider.inputs["kubeconfig"]
    if isinstance(kube, dict) and "value" in kube and "kind" not in kube:  # a secret, as the engine sends it
        kube = kube["value"]
    return json.loads(kube) if isinstance(kube, str) else kube


def test_kubernetes_provider_uses_the_stacks_aws_profile():
    """Review M8: with aws:profile the token command must use that profile, not the default chain."""
    result = run({**stack_config("dev"), "aws:profile": "training-account"})
    kube = _k8s_provider_kubeconfig(result)
    env = kube["users"][0]["user"]["exec"].get("env") or []
    assert {"name": "AWS_PROFILE", "value": "training-account"} in env
    calls = [a for t, a in result.calls if t == "eks:index:Cluster/getKubeconfig"]
    assert calls and calls[0]["profileName"] == "training-account"


def test_without_a_profile_the_default_chain_kubeconfig_is_used():
    result = run(stack_config("dev"))
    kube = _k8s_provider_kubeconfig(result)
    assert "env" not in kube["users"][0]["user"]["exec"]
    assert not [a for t, a in result.calls if t == "eks:index:Cluster/getKubeconfig"]


def test_admin_principals_come_from_config():
    """Review m8."""
    from tests.support.util import set_path

    arn = "arn:aws:iam::123456789012:role/teammate"
    result = run(set_path(stack_config("dev"), "eks-ddp:cluster.adminPrincipalArns", [arn]))
    entries = result.one("eks:index:Cluster").inputs["accessEntries"]
    assert [e["principalArn"] for e in entries.values()] == [arn]


def test_bad_admin_principal_is_refused_naming_the_key():
    import pulumi
    import pytest

    from tests.support.util import set_path

    with pytest.raises(pulumi.RunError, match=r"eks-ddp:cluster.adminPrincipalArns\[0\]|cluster.adminPrincipalArns\[0\]"):
        run(set_path(stack_config("dev"), "eks-ddp:cluster.adminPrincipalArns", ["teammate"]))



def test_mocked_resource_method_never_rehydrates_its_receiver():
    """Cluster.get_kubeconfig under mocks: rebuilding the ``__self__`` reference in the monitor's worker thread
    started a getResource task on that thread's event loop, which the program's loop then awaited ("attached
    to a different loop": a CI failure under load). The receiver must never be rebuilt."""
    result = run({**stack_config("dev"), "aws:profile": "training-account"})
    assert [a for t, a in result.calls if t == "eks:index:Cluster/getKubeconfig"]
    assert not [t for t, _ in result.calls if t == "pulumi:pulumi:getResource"]
