"""The all-or-nothing contract (components/eks_ddp/tooling/contracts/provisioning.py): a Kueue ProvisioningRequest
admission check needs the autoscaler's flag, the CRD, Kueue started after the CRD, and a class the autoscaler handles.
Negative controls: each missing piece is reported."""

from __future__ import annotations

import pulumi_kubernetes as k8s
import pytest

from eks_ddp.infra.autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from eks_ddp.infra.kueue import Kueue, KueueArgs
from eks_ddp.tooling.contracts import check
from eks_ddp.tooling.mocks import ProgramResult, run_program

SYSTEM = {"eks-ddp/pool": "system"}


def build(*, flag: bool = True, give_crd: bool = True, check_: bool = True,
          cls: str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io") -> ProgramResult:
    def program() -> None:
        scaler = ClusterAutoscaler("autoscaler", ClusterAutoscalerArgs(
            cluster_name="c", region="us-west-2", oidc_provider_arn="a", oidc_provider_url="u", node_selector=SYSTEM,
            provisioning_requests=flag))
        Kueue("kueue", KueueArgs(node_selector=SYSTEM, managed_namespaces=["training"], vpc_cidrs=["10.0.0.0/16"],
                                 provisioning_request_crd=scaler.provisioning_request_crd if give_crd else None))
        if check_:  # the shapes of QUEUE-DESIGN.md (the queue objects' own component builds them)
            k8s.apiextensions.CustomResource(
                "gpu-atomic", api_version="kueue.x-k8s.io/v1beta2", kind="ProvisioningRequestConfig",
                metadata={"name": "gpu-atomic"},
                spec={"provisioningClassName": cls, "managedResources": ["nvidia.com/gpu"]})
            k8s.apiextensions.CustomResource(
                "gpu-capacity", api_version="kueue.x-k8s.io/v1beta2", kind="AdmissionCheck",
                metadata={"name": "gpu-capacity"},
                spec={"controllerName": "kueue.x-k8s.io/provisioning-request",
                      "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
                                     "name": "gpu-atomic"}})
    return run_program({}, program=program)


def found(result: ProgramResult) -> list[str]:
    return [str(v) for v in check(result, only=("provisioning",))]


def test_a_complete_plan_passes():
    assert found(build()) == []


def test_without_an_admission_check_the_flag_is_not_required():
    assert found(build(flag=False, check_=False)) == []


@pytest.mark.parametrize(("kw", "expected"), [
    ({"flag": False}, "extraArgs.enable-provisioning-requests: got None; expected 'true'"),
    ({"flag": False, "give_crd": False}, "no CustomResourceDefinition provisioningrequests.autoscaling.x-k8s.io"),
    ({"cls": "atomic-scale-up.kubernetes.io"}, "provisioningClassName: got 'atomic-scale-up.kubernetes.io'"),
])
def test_each_missing_piece_is_reported(kw, expected):
    """Negative controls: the autoscaler without the flag while the queue asks for all-or-nothing; no CRD at all;
    a class (the pre-1.30 name) the pinned autoscalers do not handle."""
    got = found(build(**kw))
    assert any(expected in f for f in got), got


def test_kueue_not_waiting_for_the_crd_is_reported():
    got = found(build(give_crd=False))
    assert got == ["[provisioning] Release kueue-release: does not depend on the provisioningrequests.autoscaling."
                   "x-k8s.io CRD: Kueue may start before it and never run its provisioning controller"], got
