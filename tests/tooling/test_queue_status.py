"""``eks-ddp status RUN`` for a queued run: queued / waiting for capacity / admitted / preempted / evicted / cancelled
/ rejected, and why, from the run's Kueue Workload (components/eks_ddp/tooling/runs/status.py ``queue_state``).

The Workloads are fixtures (the workload JSON files in tests/fixtures/kueue/) built to the v1beta2 Workload CRD of Kueue v0.16.4
(its schema, spec without the pod templates and status whole, is tests/fixtures/kueue/workload-v1beta2.schema.json,
cut from config/components/crd/bases/kueue.x-k8s.io_workloads.yaml), with the condition reasons and messages of
Kueue's source (scheduler.go, workload.go, admissionchecks.go, the provisioning admission check) and the cluster
autoscaler's ProvisioningRequest message (provisioningrequest/besteffortatomic/provisioning_class.go).
The command runs against the fake kubectl of tests/tooling/test_runs_cli.py.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest

from eks_ddp.tooling.contracts.queue import workload_name
from eks_ddp.tooling.runs import cli
from eks_ddp.tooling.runs.status import JOB_UID_LABEL, QUEUE_NAME_LABEL, competition, consumed_pending, queue_state
from tests.tooling.test_runs_cli import fake  # noqa: F401  (the fake kubectl/pulumi fixture)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "kueue"
SCHEMA = json.loads((FIXTURES / "workload-v1beta2.schema.json").read_text())
STATES = ("queued", "waiting-for-capacity", "admitted", "preempted", "evicted", "rejected", "deactivated",
          "deactivated-by-kueue")
JOB_UID = "6f1c9a52-2b1e-4f7e-9d38-0c2d4e5f6a7b"


def workload(state: str) -> dict:
    return json.loads((FIXTURES / f"workload-{state}.json").read_text())


def unknown_fields(doc, schema, path="") -> list[str]:
    """Fields the structural schema does not declare (the API server would prune them: the fixture would lie)."""
    out: list[str] = []
    if isinstance(doc, dict) and "properties" in schema:
        for k, v in doc.items():
            if k not in schema["properties"]:
                out.append(f"{path}.{k}")
            else:
                out += unknown_fields(v, schema["properties"][k], f"{path}.{k}")
    elif isinstance(doc, list) and "items" in schema:
        for i, v in enumerate(doc):
            out += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return out


@pytest.mark.parametrize("state", STATES)
def test_the_fixtures_are_v1beta2_workloads_of_the_runs_job(state):
    doc = workload(state)
    jsonschema.validate(doc, SCHEMA)
    assert unknown_fields(doc, SCHEMA) == []
    assert doc["metadata"]["labels"][JOB_UID_LABEL] == JOB_UID
    assert doc["metadata"]["name"] == workload_name("training-run-1", JOB_UID)


def test_the_schema_check_refuses_a_misspelt_or_mistyped_field():
    """Negative control of the fixture check."""
    bad = workload("waiting-for-capacity")
    bad["status"]["admissionCheck"] = bad["status"].pop("admissionChecks")
    assert unknown_fields(bad, SCHEMA) == [".status.admissionCheck"]
    bad = workload("waiting-for-capacity")
    bad["status"]["admissionChecks"][0]["state"] = "Waiting"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


@pytest.mark.parametrize(("state", "expected", "says"), [
    ("queued", "queued", "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
                         "flavor gpu-gpu, 1 more needed"),
    ("waiting-for-capacity", "waiting for capacity", "Quota reserved in ClusterQueue eks-ddp; admission check "
                                                     "gpu-capacity Pending: Capacity is not found, CA will try to "
                                                     "find it later."),
    ("admitted", "admitted", "admitted by ClusterQueue eks-ddp: 2 pod(s) on gpu-gpu"),
    ("preempted", "preempted", "preempted (Preempted: Preempted to accommodate a workload (UID: 0d9e, JobUID: 5c2a) "
                               "due to prioritization in the ClusterQueue"),
    ("evicted", "evicted", "evicted (PodsReadyTimeout: Exceeded the PodsReady timeout"),
    ("rejected", "rejected", "admission check gpu-capacity Rejected: Capacity is not found"),
    ("deactivated", "deactivated", "deactivated by hand (spec.active set to false, not by Kueue and not by eks-ddp "
                                   "cancel, which deletes a queued run's Job) (Deactivated: The workload is "
                                   "deactivated); its Job stays suspended until it is reactivated: kubectl -n training "
                                   "patch workloads.kueue.x-k8s.io job-training-run-1-dff5c --type=merge -p "
                                   "'{\"spec\":{\"active\":true}}'"),
    ("deactivated-by-kueue", "deactivated", "deactivated by Kueue: its admission check (gpu-capacity, the "
                                            "ProvisioningRequest for the whole run) was Rejected: the retry budget "
                                            "(ProvisioningRequestConfig retryStrategy.backoffLimitCount) was spent, or "
                                            "the autoscaler revoked the capacity (DeactivatedDueToAdmissionCheck: The "
                                            "workload is deactivated due to Admission check(s): gpu-capacity, were "
                                            "rejected)"),
])
def test_each_workload_state_is_said_with_kueues_reason(state, expected, says):
    got, why = queue_state(workload(state), "training-run-1")
    assert got == expected and says in why, why


def test_the_state_follows_the_conditions_not_the_fixture_name():
    """Negative controls: a reservation with the check still pending is not admitted; a reservation withdrawn is
    queued again; an eviction for another reason is not a preemption; the requeue is said."""
    wl = workload("admitted")
    wl["status"]["conditions"] = [c for c in wl["status"]["conditions"] if c["type"] != "Admitted"]
    wl["status"]["admissionChecks"][0]["state"] = "Pending"
    assert queue_state(wl, "j")[0] == "waiting for capacity"
    wl = workload("waiting-for-capacity")
    wl["status"]["conditions"][0].update(status="False", reason="Pending", message="no quota")
    assert queue_state(wl, "j") == ("queued", f"Workload {wl['metadata']['name']} waits in its queue (Pending: no quota)")
    wl = workload("preempted")
    for c in wl["status"]["conditions"]:
        if c["type"] == "Evicted":
            c["reason"] = "ClusterQueueStopped"
    wl["status"]["conditions"] = [c for c in wl["status"]["conditions"] if c["type"] != "Preempted"]
    state, why = queue_state(wl, "j")
    assert state == "evicted" and "requeued: it waits in the queue again" in why
    assert queue_state(workload("evicted"), "j")[1].endswith(
        "not requeued yet (PodsReadyTimeout: Exceeded the PodsReady timeout training/job-training-run-1-dff5c)")
    assert queue_state(None, "training-run-1")[0] == "queued"


def test_a_run_kueue_deactivated_is_never_reported_as_cancelled():
    """The bug: any ``spec.active: false`` was ``cancelled``. Each of Kueue's deactivation causes is said with its
    meaning, also in the moment before ``spec.active`` flips (the DeactivationTarget condition), and an unknown
    cause is passed on as Kueue wrote it."""
    for cause, says in (("RequeuingLimitExceeded", "its pods were not all Ready within waitForPodsReady's timeout"),
                        ("MaximumExecutionTimeExceeded", "it ran past its maximum execution time"),
                        ("SomethingNew", "SomethingNew")):
        wl = workload("deactivated-by-kueue")
        for c in wl["status"]["conditions"]:
            if c["type"] in ("Evicted", "Requeued"):
                c["reason"] = f"DeactivatedDueTo{cause}"
        state, why = queue_state(wl, "j")
        assert state == "deactivated" and f"deactivated by Kueue: {says}" in why, why
    wl = workload("rejected")
    wl["status"]["conditions"].append({"type": "DeactivationTarget", "status": "True", "reason": "AdmissionCheck",
                                       "message": "Admission check(s): gpu-capacity, were rejected",
                                       "lastTransitionTime": "2026-11-29T03:04:00Z"})
    state, why = queue_state(wl, "j")
    assert state == "deactivated" and "by Kueue: its admission check" in why and "(being deactivated)" in why
    jsonschema.validate(wl, SCHEMA)
    for name in ("deactivated", "deactivated-by-kueue"):
        assert queue_state(workload(name), "j")[0] != "cancelled"


def _queued_job(suspend: bool = True, active: int = 0) -> dict:
    return {"metadata": {"name": "training-run-1", "uid": JOB_UID, "labels": {QUEUE_NAME_LABEL: "training"}},
            "spec": {"suspend": suspend}, "status": {"active": active} if active else {}}


def test_status_of_a_queued_cluster_run_reads_its_workload(fake, tmp_path, capsys):  # noqa: F811
    fake.volume = tmp_path / "empty"
    fake.volume.mkdir()
    fake.scenario(job=_queued_job(), running=[], workloads=[workload("waiting-for-capacity")])
    assert cli.main(["status", "run-1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run run-1: waiting for capacity (Workload job-training-run-1-dff5c: Quota reserved in "
                          "ClusterQueue eks-ddp; admission check gpu-capacity Pending: Capacity is not found, CA "
                          "will try to find it later.)")
    assert ["kubectl", "-n", "training", "get", "workloads.kueue.x-k8s.io", "-l",
            f"{JOB_UID_LABEL}={JOB_UID}", "-o", "json"] in fake.calls()


def test_a_suspended_job_outside_the_queue_is_still_cancelled_and_a_running_one_running(fake, tmp_path, capsys):  # noqa: F811
    """Controls: without the queue label a suspended Job is a cancelled run (no Workload asked for); a queued Job
    whose pods run is running."""
    fake.volume = tmp_path / "empty"
    fake.volume.mkdir()
    job = _queued_job()
    job["metadata"]["labels"] = {}
    fake.scenario(job=job, running=[], workloads=[workload("queued")])
    cli.main(["status", "run-1"])
    assert capsys.readouterr().out.startswith("run run-1: cancelled (Job training-run-1 is suspended")
    assert not [c for c in fake.calls() if "workloads.kueue.x-k8s.io" in c]
    fake.scenario(job=_queued_job(suspend=False, active=2), running=[], workloads=[workload("admitted")])
    cli.main(["status", "run-1"])
    assert capsys.readouterr().out.startswith("run run-1: running (Job training-run-1: 2 pod(s) active")


def test_the_newest_workload_of_the_job_is_read(fake, tmp_path, capsys):  # noqa: F811
    fake.volume = tmp_path / "empty"
    fake.volume.mkdir()
    old, new = workload("preempted"), copy.deepcopy(workload("admitted"))
    new["metadata"]["creationTimestamp"] = "2026-11-29T03:10:00Z"
    fake.scenario(job=_queued_job(), running=[], workloads=[new, old])
    cli.main(["status", "run-1"])
    assert capsys.readouterr().out.startswith("run run-1: admitted")


def _pod(name: str, phase: str, consumed: bool, node: str | None = None) -> dict:
    """A training pod; ``node``: bound to it (the scheduler set spec.nodeName and PodScheduled True)."""
    annotations = {"autoscaling.x-k8s.io/consume-provisioning-request": "job-training-run-1-dff5c-gpu-capacity-1",
                   "autoscaling.x-k8s.io/provisioning-class-name": "best-effort-atomic-scale-up.autoscaling.x-k8s.io"}
    scheduled = {"type": "PodScheduled", "status": "True" if node else "False",
                 **({} if node else {"reason": "Unschedulable"})}
    return {"metadata": {"name": name, "annotations": annotations if consumed else {}},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase, "conditions": [scheduled]}}


def test_pods_pending_on_a_consumed_request_are_named_with_the_fix(fake, tmp_path, capsys):  # noqa: F811
    """An admitted run one of whose pods waits for a node that will never come (the autoscaler's pods filter):
    'partially delivered', naming the pod, the request and the commands that requeue it now: deactivate, wait for
    Kueue's eviction, reactivate."""
    fake.volume = tmp_path / "empty"
    fake.volume.mkdir()
    job = _queued_job(suspend=False, active=2)
    job["spec"]["parallelism"] = 2
    job["status"]["ready"] = 1
    running = _pod("training-run-1-0-abc", "Running", True, node="ip-10-0-1-5.ec2.internal")
    fake.scenario(job=job, running=["training-run-1-0-abc"], workloads=[workload("admitted")],
                  pods=[running, _pod("training-run-1-1-def", "Pending", True)])
    assert cli.main(["status", "run-1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run run-1: partially delivered (1 pod(s) pending on a consumed ProvisioningRequest, on no "
                          "node yet (training-run-1-1-def: autoscaling.x-k8s.io/consume-provisioning-request="
                          "job-training-run-1-dff5c-gpu-capacity-1); 1 of 2 pod(s) ready."), out
    assert ("kubectl -n training patch workloads.kueue.x-k8s.io job-training-run-1-dff5c --type=merge -p "
            "'{\"spec\":{\"active\":false}}' && kubectl -n training wait --for=condition=Evicted --timeout=5m "
            "workloads.kueue.x-k8s.io/job-training-run-1-dff5c && kubectl -n training patch workloads.kueue.x-k8s.io "
            "job-training-run-1-dff5c --type=merge -p '{\"spec\":{\"active\":true}}'") in out
    # Control: a Pending pod without the annotation (unqueued scale-up still to come) is just a running run.
    fake.scenario(job=job, running=["training-run-1-0-abc"], workloads=[workload("admitted")],
                  pods=[running, _pod("training-run-1-1-def", "Pending", False)])
    cli.main(["status", "run-1"])
    assert capsys.readouterr().out.startswith("run run-1: running (Job training-run-1: 2 pod(s) active, 1 ready")
    # Control: a Pending pod already on its node (pulling its image, running the fabric-check init container) is
    # starting, not stuck: no fix that would discard a healthy start.
    fake.scenario(job=job, running=["training-run-1-0-abc"], workloads=[workload("admitted")],
                  pods=[running, _pod("training-run-1-1-def", "Pending", True, node="ip-10-0-1-6.ec2.internal")])
    cli.main(["status", "run-1"])
    out = capsys.readouterr().out
    assert out.startswith("run run-1: running (Job training-run-1: 2 pod(s) active, 1 ready") and "active" in out
    assert "--for=condition=Evicted" not in out
    # Control: admitted within the autoscaler's max node provisioning time, the nodes may still be booting.
    from eks_ddp.infra.autoscaler import MAX_NODE_PROVISION_TIME

    assert MAX_NODE_PROVISION_TIME == "25m"
    young = workload("admitted")
    recent = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for c in young["status"]["conditions"]:
        c["lastTransitionTime"] = recent
    fake.scenario(job=job, running=["training-run-1-0-abc"], workloads=[young],
                  pods=[running, _pod("training-run-1-1-def", "Pending", True)])
    cli.main(["status", "run-1"])
    out = capsys.readouterr().out
    assert out.startswith("run run-1: nodes provisioned, booting (1 pod(s) pending on a consumed ProvisioningRequest"), out
    assert "within the autoscaler's max node provisioning time (25 min)" in out and "--for=condition" not in out
    # ... and at 26 minutes they are partially delivered.
    assert consumed_pending([_pod("p", "Pending", True)], job, young,
                            now=datetime.now(UTC) + timedelta(minutes=21))[0] == "partially delivered"


def pending_summary() -> dict:
    """A LocalQueue's PendingWorkloadsSummary (kueue v0.16.4 apis/visibility/v1beta2/types.go): another run first,
    ours second."""
    item = {"metadata": {"name": "job-training-run-0-aaaaa", "namespace": "training"}, "priority": 10000,
            "localQueueName": "training", "positionInClusterQueue": 0, "positionInLocalQueue": 0}
    ours = {**item, "metadata": {"name": "job-training-run-1-dff5c", "namespace": "training"}, "priority": 1000,
            "positionInClusterQueue": 1, "positionInLocalQueue": 1}
    return {"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta2",
            "metadata": {}, "items": [item, ours]}


def test_a_queued_run_says_its_position_from_kueues_visibility_api(fake, tmp_path, capsys):  # noqa: F811
    fake.volume = tmp_path / "empty"
    fake.volume.mkdir()
    fake.scenario(job=_queued_job(), running=[], workloads=[workload("queued")], pending=pending_summary())
    cli.main(["status", "run-1"])
    out = capsys.readouterr().out
    assert "; position 2 in its ClusterQueue (1 workload(s) ahead), 2 in LocalQueue training, priority 1000)" in out
    assert out.startswith("run run-1: queued (Workload job-training-run-1-dff5c waits in its queue (Pending: "
                          "couldn't assign flavors"), out
    assert ["kubectl", "get", "--raw", "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/training/localqueues/"
            "training/pendingworkloads"] in fake.calls()
    # The visibility API away: the state is still said, and why the position is not.
    fake.scenario(job=_queued_job(), running=[], workloads=[workload("queued")])
    assert cli.main(["status", "run-1"]) == 0
    assert "queue position unknown (kubectl get --raw /apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/training/" \
           "localqueues/training/pendingworkloads: Error from server (ServiceUnavailable)" in capsys.readouterr().out
    # Not in the list (e.g. in its backoff), and a waiting-for-capacity run is not asked about (quota reserved).
    summary = pending_summary()
    summary["items"] = summary["items"][:1]
    fake.scenario(job=_queued_job(), running=[], workloads=[workload("queued")], pending=summary)
    cli.main(["status", "run-1"])
    assert "not in the LocalQueue's pending list" in capsys.readouterr().out
    before = len(fake.calls())
    fake.scenario(job=_queued_job(), running=[], workloads=[workload("waiting-for-capacity")], pending=summary)
    cli.main(["status", "run-1"])
    assert not [c for c in fake.calls()[before:] if "--raw" in c]
    capsys.readouterr()
    # A preempted run Kueue requeued waits in the queue again: it has a position too.
    fake.scenario(job=_queued_job(), running=[], workloads=[workload("preempted")], pending=pending_summary())
    cli.main(["status", "run-1"])
    out = capsys.readouterr().out
    assert out.startswith("run run-1: preempted (") and "requeued: it waits in the queue again; position 2 in its " \
        "ClusterQueue (1 workload(s) ahead)" in out, out
    # Control: an evicted run not requeued yet (Requeued False) is not asked about.
    before = len(fake.calls())
    fake.scenario(job=_queued_job(), running=[], workloads=[workload("evicted")], pending=pending_summary())
    cli.main(["status", "run-1"])
    assert capsys.readouterr().out.startswith("run run-1: evicted (")
    assert not [c for c in fake.calls()[before:] if "--raw" in c]


def _other_run(state: str, priority: int, name: str = "training-run-2", uid: str = "0b7e0000-0000-4000-8000-0000000000b2"
               ) -> dict:
    """A Workload of another run's Job in the same LocalQueue."""
    wl = copy.deepcopy(workload(state))
    wl["metadata"].update(name=f"job-{name}-a1b2c", labels={JOB_UID_LABEL: uid})
    wl["metadata"]["ownerReferences"][0].update(name=name, uid=uid)
    wl["spec"]["priority"] = priority
    return wl


def test_the_runs_a_run_competes_with_and_who_would_preempt_whom():
    """Two runs over one group's quota: each status names the other, its state, its admitted size and priority, and
    under LowerPriority who would preempt whom; under Never, that nobody is preempted. A second Workload of the same
    Job (a requeue) is no other run; a run alone in its queue gets no line (the controls)."""
    mine = workload("admitted")  # priority 1000, admitted with 2 pods
    urgent = _other_run("queued", 2000)
    said = competition(mine, [mine, urgent], "LowerPriority")
    assert said == ("competes in LocalQueue training with: training-run-2 queued, priority 2000; this run would be "
                    "preempted by training-run-2 (higher priority; ClusterQueue preemption LowerPriority)")
    said = competition(mine, [mine, urgent], "Never")
    assert said is not None and said.endswith("no run is preempted (ClusterQueue preemption Never): a waiting run "
                                              "waits for an admitted one to end")
    waiting = copy.deepcopy(workload("queued"))
    waiting["spec"]["priority"] = 2000
    running = _other_run("admitted", 1000)
    said = competition(waiting, [waiting, running], "LowerPriority")
    assert said == ("competes in LocalQueue training with: training-run-2 admitted with 2 pod(s), priority 1000; this "
                    "run would preempt training-run-2 (lower priority; ClusterQueue preemption LowerPriority)")
    assert competition(mine, [mine, workload("preempted")], "LowerPriority") is None  # the same Job's older Workload
    assert competition(mine, [mine], "LowerPriority") is None


def test_status_of_a_running_queued_run_names_the_run_that_would_preempt_it(fake, tmp_path, capsys):  # noqa: F811
    fake.volume = tmp_path / "empty"
    fake.volume.mkdir()
    fake.scenario(job=_queued_job(suspend=False, active=2), running=[],
                  workloads=[workload("admitted"), _other_run("queued", 2000)],
                  clusterqueue={"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}})
    cli.main(["status", "run-1"])
    out = capsys.readouterr().out
    assert out.startswith("run run-1: running (Job training-run-1: 2 pod(s) active"), out
    assert ("competes in LocalQueue training with: training-run-2 queued, priority 2000; this run would be preempted "
            "by training-run-2") in out, out
    assert ["kubectl", "get", "clusterqueues.kueue.x-k8s.io", "eks-ddp", "-o", "json"] in fake.calls()
