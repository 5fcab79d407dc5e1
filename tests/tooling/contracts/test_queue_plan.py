"""NEEDS THE RUN-QUEUE MERGE: the queue contract over the real byo plan (the stack renders the Kueue objects and the
queued Jobs: the RunQueue component, eks_ddp.RunQueue, and the queued ElasticJob). Until those land, these tests fail
on purpose: the objects they read are absent, and nothing is skipped.

The byo stack: one GPU group ``gpu`` (g4dn.xlarge, 1 GPU, maxSize 2) and three runs (cifar-a of 1 node, bert-1
and vit-1 of 2, minNodes 1), 5 nodes wanted of 2: Kueue admits some and queues the others, with its reason, and
no run is a plan error. The pure-dict tests of the arithmetic are tests/tooling/contracts/test_queue.py.
"""

from __future__ import annotations

import pytest

from eks_ddp.tooling.contracts import check
from eks_ddp.tooling.contracts import queue as q
from eks_ddp.tooling.plan import render_manifests

GPU_GROUP, MAX_SIZE, GPUS_PER_NODE = "gpu", 2, 1
TRAINING_JOBS = ("training-cifar-a", "training-bert-1-bert-1", "training-vit-1-vit-1")


@pytest.fixture(scope="module")
def manifests(byo_result):
    return render_manifests(byo_result)


def _kind(manifests, kind):
    return [m for m in manifests if m.get("kind") == kind]


def test_the_byo_plan_renders_the_queue_objects_the_contract_reads(manifests):
    [cq] = _kind(manifests, "ClusterQueue")
    assert cq["metadata"]["name"] == "eks-ddp"
    assert [f["metadata"]["name"] for f in _kind(manifests, "ResourceFlavor")] == [f"gpu-{GPU_GROUP}"]
    assert [(m["metadata"]["name"], m["spec"]["clusterQueue"]) for m in _kind(manifests, "LocalQueue")] == \
        [("training", "eks-ddp")]
    assert sorted(m["metadata"]["name"] for m in _kind(manifests, "WorkloadPriorityClass")) == \
        ["eks-ddp-high", "eks-ddp-low", "eks-ddp-normal"]
    queue = q.ClusterQueue.of(cq)
    assert queue.nominal(f"gpu-{GPU_GROUP}", q.GPU) == MAX_SIZE * GPUS_PER_NODE  # the group's capacity


def test_every_training_job_of_the_byo_plan_is_queued_suspended(manifests):
    jobs = {j["metadata"]["name"]: j for j in _kind(manifests, "Job")}
    for name in TRAINING_JOBS:
        assert jobs[name]["spec"]["suspend"] is True, name
        assert jobs[name]["metadata"]["labels"][q.QUEUE_NAME_LABEL] == "training", name


def test_the_byo_plans_runs_over_quota_some_admitted_the_rest_queued_with_kueues_reason(manifests):
    out = q.admission(manifests)
    assert set(TRAINING_JOBS) <= set(out), sorted(out)
    admitted = [o for o in out.values() if o.state == "admitted"]
    waiting = [o for o in out.values() if o.state == "pending"]
    assert admitted and waiting, q.render(out)
    assert sum(o.count for o in admitted) <= MAX_SIZE  # one GPU a pod
    assert all(o.flavor == f"gpu-{GPU_GROUP}" for o in admitted)
    for o in waiting:
        assert o.message.startswith("couldn't assign flavors to pod set main: insufficient unused quota for "), o
        assert f"nvidia.com/gpu in flavor gpu-{GPU_GROUP}" in o.message, o
    assert q.never_admitted(manifests) == []
    assert "pending: couldn't assign flavors" in (q.report(manifests) or "")


def test_the_byo_plan_meets_the_queue_contract(byo_result):
    assert check(byo_result, only=("queue",)) == []


def test_the_plan_says_which_of_the_byo_runs_is_admitted_and_which_waits(byo_result):
    """What `eks-ddp-plan` prints under "## Queue" (plan.queue_report): every training run, admitted or waiting
    with Kueue's reason, and what changes when a waiting run is already running."""
    from eks_ddp.tooling.plan import queue_report

    text = queue_report(byo_result) or ""
    lines = text.splitlines()
    assert lines[0] == "all runs arriving together (as one `pulumi up` creates them):", text
    for name in TRAINING_JOBS:
        assert any(line.startswith(f"  {name}: admitted, ") or line.startswith(f"  {name}: waits: couldn't assign")
                   for line in lines), (name, text)
    assert any(": waits: couldn't assign flavors to pod set main: insufficient unused quota" in x for x in lines), text
    assert any(x.startswith("if ") and x.endswith("is already running, whole, when the others arrive:")
               for x in lines), text
    assert "ERROR" not in text


def test_the_plan_reads_kueues_managed_namespaces_from_its_release(dev_result):
    """plan.kueue_managed reads the selector the stack's Kueue release configures (the training namespace), so the
    wiring warning compares against the real configuration; the dev stack, correctly wired, gets no warning."""
    from eks_ddp.tooling.plan import kueue_managed, queue_report

    assert kueue_managed(dev_result) == [{"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["training"]}]}]
    assert "WARNING" not in (queue_report(dev_result) or "WARNING: no report")
