"""The rendezvous contract: a store accepts one run's client certificates and admits no other pod.

Positive: the dev, p4de and byo plans and a stack of two runs. Negative controls: the wiring before T2 (every run's pods
mount the one store's client Secret, and its NetworkPolicy admits every trainer pod), each half on its own.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

from eks_ddp.tooling.contracts import PlanView, check
from eks_ddp.tooling.contracts import rendezvous as contract
from tests.config.test_runs import DIGEST, with_runs
from tests.support.util import run


@pytest.fixture(scope="module")
def two_runs_view():
    return PlanView.of(run(with_runs({"runId": "a", "nodes": 1, "fabricCheck": True},
                                     {"runId": "b", "nodes": 1, "workload": {"image": DIGEST, "module": "bert.train"}})))


def _edited(view: PlanView, edit) -> PlanView:
    manifests = copy.deepcopy(view.manifests)
    for m in manifests:
        edit(m)
    return PlanView(result=dataclasses.replace(view.result), manifests=manifests)


def test_the_plans_give_each_run_a_store_of_its_own(dev_result, p4de_result, byo_result, two_runs_view):
    for result in (dev_result, p4de_result, byo_result):
        assert check(result, only=("rendezvous",)) == []
    assert contract.one_run_per_store(two_runs_view) == []
    stores = [s for s, _, t in contract.pod_templates(two_runs_view) if contract._is_store(t)]
    assert sorted(stores) == ["StatefulSet/rendezvous-b-etcd", "StatefulSet/rendezvous-etcd"]


def test_one_client_certificate_for_every_run_is_reported(two_runs_view):
    """T2's negative control, as the program wired it before: run b's pods mount the first store's client Secret."""
    def share(m):
        for v in (((m.get("spec") or {}).get("template") or {}).get("spec") or {}).get("volumes") or []:
            if v.get("secret", {}).get("secretName") == "rendezvous-b-etcd-tls-client-tls":
                v["secret"]["secretName"] = "rendezvous-etcd-tls-client-tls"
    found = contract.one_run_per_store(_edited(two_runs_view, share))
    [v] = [v for v in found if "accepts" in v.message]
    assert v.subject == "StatefulSet/rendezvous-etcd" and "accepts the client certificates of runs a, b" in v.message
    assert "Job/training-b-b" in v.message


def test_a_store_admitting_every_trainer_pod_is_reported(two_runs_view):
    """The store NetworkPolicy before T2 admitted every pod labelled eks-ddp-trainer (every run's)."""
    def admit_all(m):
        if m["kind"] == "NetworkPolicy" and m["metadata"]["name"] == "rendezvous-etcd":
            m["spec"]["ingress"][0]["from"] = [{"podSelector": {"matchLabels": {
                "app.kubernetes.io/name": "eks-ddp-trainer"}}}]
    [v] = contract.one_run_per_store(_edited(two_runs_view, admit_all))
    assert v.subject == "StatefulSet/rendezvous-etcd" and "admits Job/training-b-b on the client port" in v.message


def test_label_selectors_as_kubernetes_evaluates_them():
    labels = {"app": "x", "tier": "a"}
    assert contract.selects({}, labels) and contract.selects(None, labels)
    assert contract.selects({"matchLabels": {"app": "x"}, "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["a", "b"]}]}, labels)
    assert not contract.selects({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}, labels)
    assert not contract.selects({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, labels)
    assert not contract.selects({"matchLabels": {"app": "x", "run": "b"}}, labels)


def test_a_store_that_can_exist_twice_is_reported(two_runs_view):
    """E3's negative control: the store as the old plan ran it, a one-replica Deployment (an evicted member keeps
    serving beside its replacement), and a StatefulSet of two replicas (two single-member stores)."""
    def as_deployment(m):
        if m["kind"] == "StatefulSet" and m["metadata"]["name"] == "rendezvous-etcd":
            m["kind"] = "Deployment"
            m["spec"].pop("serviceName", None)
            m["spec"]["strategy"] = {"type": "Recreate"}

    [v] = contract.one_run_per_store(_edited(two_runs_view, as_deployment))
    assert v.subject == "Deployment/rendezvous-etcd" and "can run two members at once (Deployment, 1" in v.message

    def two_replicas(m):
        if m["kind"] == "StatefulSet" and m["metadata"]["name"] == "rendezvous-b-etcd":
            m["spec"]["replicas"] = 2

    [v] = contract.one_run_per_store(_edited(two_runs_view, two_replicas))
    assert v.subject == "StatefulSet/rendezvous-b-etcd" and "(StatefulSet, 2 replica(s))" in v.message
