"""The replacements contract (components/eks_ddp/tooling/contracts/replacements.py): Kueue's pod-template update and the
cluster autoscaler's ProvisioningRequest pods filter, and the plan's way back to capacity for an admitted run.

Negative controls: the plan as it was before waitForPodsReady was on (no ``waitForPodsReady``), the library's old
``recoveryTimeout: "0s"`` and a timeout below the autoscaler's ``max-node-provision-time`` are each reported for
every queued GPU Job and CronJob template; a plan without the ProvisioningRequest check needs none of it."""

from __future__ import annotations

import copy

import pytest

from eks_ddp.tooling.contracts import PlanView, check
from eks_ddp.tooling.contracts import replacements as r


@pytest.fixture(scope="module")
def dev_view(dev_result) -> PlanView:
    return PlanView.of(dev_result)


def test_the_pods_filter_drops_a_pod_once_kueue_updated_its_template():
    template = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}
    assert r.triggers_scale_up(template)
    admitted = r.admitted_template(template, "job-x-1a2b3-gpu-capacity-1",
                                   "best-effort-atomic-scale-up.autoscaling.x-k8s.io")
    assert admitted["metadata"]["annotations"] == {
        "autoscaling.x-k8s.io/consume-provisioning-request": "job-x-1a2b3-gpu-capacity-1",
        "autoscaling.x-k8s.io/provisioning-class-name": "best-effort-atomic-scale-up.autoscaling.x-k8s.io"}
    assert not r.triggers_scale_up(admitted)
    assert template["metadata"] == {"labels": {"a": "b"}}  # the plan's own template is left alone
    assert not r.triggers_scale_up({"metadata": {"annotations": {r.DEPRECATED_CONSUME: "x"}}})


def test_the_stacks_plans_give_an_admitted_run_its_nodes_back(dev_result, p4de_result):
    for result in (dev_result, p4de_result):
        assert [str(v) for v in check(result, only=(r.NAME,))] == []
    config = r.kueue_config(PlanView.of(dev_result))
    assert config is not None and config["waitForPodsReady"]["recoveryTimeout"] == "45m"
    assert r.max_node_provision_time(PlanView.of(dev_result)) == "25m"


@pytest.mark.parametrize(("change", "says"), [
    (lambda c: c.pop("waitForPodsReady"), "Kueue's waitForPodsReady is off"),
    (lambda c: c["waitForPodsReady"].update(recoveryTimeout="0s"),
     "waitForPodsReady.recoveryTimeout is '0s': a lost node is never asked for again"),
    (lambda c: c["waitForPodsReady"].update(timeout="20m", recoveryTimeout="20m"),
     "timeout 20m is not above the autoscaler's max-node-provision-time 25m"),
])
def test_a_plan_without_a_way_back_is_reported_for_every_queued_gpu_job(dev_view, change, says):
    config = copy.deepcopy(r.kueue_config(dev_view))
    change(config)
    found = r.findings(dev_view.manifests, config, "25m")
    subjects = sorted(v.subject for v in found)
    assert subjects == ["CronJob/training-evaluate", "Job/training-run-1"], subjects
    assert all(says in v.message and "consume-provisioning-request" in v.message for v in found)


def test_without_the_provisioning_check_no_pod_is_filtered(dev_view):
    manifests = [m for m in dev_view.manifests if m.get("kind") != "AdmissionCheck"]
    assert r.findings(manifests, {}, "25m") == []
    assert r.findings(dev_view.manifests, None, "25m") == []  # no Kueue in the plan
