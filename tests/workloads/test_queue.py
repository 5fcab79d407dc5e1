"""Runs through Kueue (issue 38): the RunQueue's objects, valid for the pinned v0.16.4 CRDs (tests/support/
kueue_schema.py, with negative controls), and the queued training Jobs (the fabric check their first phase).

Kueue's rules these tests hold the program to (v0.16.4 source):

- pkg/controller/jobs/job/job_webhook.go validatePartialAdmissionCreate: ``job-min-parallelism`` must be between 0
  and the pod count exclusive, so a run with ``minNodes == nodes`` carries no annotation (admitted whole).
- job_controller.go RunWithPodSetsInfo: with the annotation, admission sets ``spec.parallelism`` to the admitted
  count, and validatePartialAdmissionUpdate refuses another change while the Job runs: the Job ignores it.
- jobframework/reconciler.go: an admitted Workload's suspended Job is unsuspended again ("Job admitted,
  unsuspending"), so a queued run is cancelled by deleting its Job (its Workload, controller-owned by the Job:
  ``ctrl.SetControllerReference``, goes with it; the reconciler drops the Workload's finalizer once the Job is gone).
"""

from __future__ import annotations

import copy
import json

import pulumi
import pytest

from eks_ddp.core import catalog
from eks_ddp.workloads.elastic_job.pods import pod_resources
from tests.config.test_runs import with_runs
from tests.support import kueue_schema
from tests.support.util import run, stack_config

KUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:"
JOB = "kubernetes:batch/v1:Job"
KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "AdmissionCheck", "ProvisioningRequestConfig",
         "WorkloadPriorityClass")


def two_groups_two_runs(**queue) -> dict:
    """Two GPU groups (one with EFA) and a run on each, both elastic (minNodes < nodes)."""
    cfg = with_runs({"runId": "a", "nodes": 2, "minNodes": 1, "nodeGroup": "gpu", "priority": "high"},
                    {"runId": "b", "nodes": 3, "minNodes": 2, "nodeGroup": "big", "priority": "low"})
    cfg["eks-ddp:nodeGroups"] = [*cfg["eks-ddp:nodeGroups"], {
        "name": "big", "instanceType": "g5.12xlarge", "maxSize": 3, "efa": True}]
    if queue:
        cfg["eks-ddp:queue"] = queue
    return cfg


@pytest.fixture(scope="module")
def two_runs():
    return run(two_groups_two_runs())


def kueue_objects(result) -> list:
    return [r for r in result.resources if r.type.startswith(KUEUE)]


def body(r) -> dict:
    return json.loads(json.dumps(r.inputs))  # plain data, as the provider sends it


def the(result, kind: str) -> list[dict]:
    return [body(r) for r in result.resources if r.type == KUEUE + kind]


def trains(result) -> list:
    return [j for j in result.of_type(JOB) if j.name.endswith("-train")]


# --- the CRD schemas of the pinned release ---------------------------------------------------------------------

def test_every_rendered_kueue_object_is_valid_for_the_v0_16_4_crds(dev_result, p4de_result, two_runs):
    for result in (dev_result, p4de_result, two_runs):
        objects = kueue_objects(result)
        assert {r.type.rsplit(":", 1)[1] for r in objects} == set(KINDS)
        for r in objects:
            assert kueue_schema.problems(body(r)) == [], r.name


def test_the_api_version_is_served_and_stored_by_every_crd():
    for kind in KINDS:
        versions = {v["name"]: v for v in kueue_schema.crd(kind)["spec"]["versions"]}
        assert versions["v1beta2"]["served"] and versions["v1beta2"]["storage"], kind


def test_the_validator_refuses_an_unknown_field(two_runs):
    cq = the(two_runs, "ClusterQueue")[0]
    cq["spec"]["cohort"] = "x"  # v1beta1's name; v1beta2 has cohortName
    assert any("'cohort' was unexpected" in p for p in kueue_schema.problems(cq))
    wpc = the(two_runs, "WorkloadPriorityClass")[0]
    wpc["spec"] = {"value": 1}
    assert any("'spec' was unexpected" in p for p in kueue_schema.problems(wpc))


def test_the_retry_strategy_is_the_crds_and_outlasts_the_pods_ready_requeues(two_runs):
    """The retry budget is set (the CRD's default of 3 deactivates a run after 3 returns to the queue) with the
    CRD's own field names, and is larger than what waitForPodsReady's requeues alone spend (one attempt each)."""
    from eks_ddp.infra.kueue import PODS_READY_REQUEUES
    [config] = [body(r) for r in kueue_objects(two_runs) if r.type.endswith(":ProvisioningRequestConfig")]
    assert kueue_schema.problems(config) == []
    assert config["spec"]["retryStrategy"]["backoffLimitCount"] > PODS_READY_REQUEUES + 3
    bad = copy.deepcopy(config)
    bad["spec"]["retryStrategy"]["backoffLimit"] = bad["spec"]["retryStrategy"].pop("backoffLimitCount")
    assert any("'backoffLimit' was unexpected" in p for p in kueue_schema.problems(bad))
    bad = copy.deepcopy(config)
    bad["spec"]["retryStrategy"]["backoffMaxSeconds"] = "10m"
    assert kueue_schema.problems(bad) != []


def test_the_validator_refuses_a_quota_for_an_uncovered_resource(two_runs):
    cq = the(two_runs, "ClusterQueue")[0]
    extra = copy.deepcopy(cq)  # one quota more than covered: the CRD's CEL rule
    extra["spec"]["resourceGroups"][0]["flavors"][0]["resources"].append({"name": "ephemeral-storage",
                                                                         "nominalQuota": "1Ti"})
    assert any("size(x.resources) == size(self.coveredResources)" in p for p in kueue_schema.problems(extra))
    swapped = copy.deepcopy(cq)  # as many, but not the covered one: Kueue's webhook
    swapped["spec"]["resourceGroups"][0]["flavors"][1]["resources"][1]["name"] = "ephemeral-storage"
    assert any("must match the name in coveredResources ('memory')" in p for p in kueue_schema.problems(swapped))


def test_the_validator_refuses_a_version_the_crd_does_not_serve(two_runs):
    for kind in ("ClusterQueue", "LocalQueue"):
        obj = the(two_runs, kind)[0]
        obj["apiVersion"] = "kueue.x-k8s.io/v1alpha1"
        assert kueue_schema.problems(obj) == [
            "apiVersion: got 'kueue.x-k8s.io/v1alpha1'; expected kueue.x-k8s.io/<one of ['v1beta1', 'v1beta2']>"]


def test_the_validator_applies_the_crd_cel_rules(two_runs):
    flavor = the(two_runs, "ResourceFlavor")[0]
    flavor["spec"]["nodeTaints"][0]["effect"] = "NoRun"  # an enum too: the CEL rule speaks as well
    assert any("NoSchedule', 'PreferNoSchedule', 'NoExecute'" in p for p in kueue_schema.problems(flavor))
    cq = the(two_runs, "ClusterQueue")[0]
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = "1"
    assert any("borrowingLimit must be nil when cohort is empty" in p for p in kueue_schema.problems(cq))


def test_every_create_time_cel_rule_of_the_crds_is_implemented():
    """The rules the validator skips are transition rules (``oldSelf``: update only); no other is left out."""
    skipped = {kind: [r for r in kueue_schema.all_rules(kind) if r not in kueue_schema.CEL] for kind in KINDS}
    assert all("oldSelf" in r for rules in skipped.values() for r in rules), skipped
    assert kueue_schema.NOT_EXPRESSED == {}
    # Control: a rule the table lacks is reported, not passed.
    obj = the(run(stack_config("dev")), "ResourceFlavor")[0]
    saved = kueue_schema.CEL.pop("self.all(x, x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])")
    try:
        assert any(p.startswith("unexpressed rule: self.all(x, x.effect") for p in kueue_schema.problems(obj))
    finally:
        kueue_schema.CEL["self.all(x, x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])"] = saved


# --- the queue from the stack ----------------------------------------------------------------------------------

def test_two_runs_are_queued_and_the_quotas_equal_what_the_groups_hold(two_runs):
    jobs = {j.inputs["metadata"]["name"]: j for j in trains(two_runs)}
    assert set(jobs) == {"training-a", "training-b-b"}
    priority = {"training-a": "eks-ddp-high", "training-b-b": "eks-ddp-low"}
    for name, j in jobs.items():
        assert j.inputs["spec"]["suspend"] is True
        assert j.inputs["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
        assert j.inputs["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == priority[name]
    assert jobs["training-a"].inputs["metadata"]["annotations"]["kueue.x-k8s.io/job-min-parallelism"] == "1"
    assert jobs["training-b-b"].inputs["metadata"]["annotations"]["kueue.x-k8s.io/job-min-parallelism"] == "2"
    [cq] = the(two_runs, "ClusterQueue")
    [rg] = cq["spec"]["resourceGroups"]
    assert rg["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu", "vpc.amazonaws.com/efa"]
    quota = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in rg["flavors"]}
    g4, g5 = catalog.lookup("g4dn.xlarge"), catalog.lookup("g5.12xlarge")
    assert quota["gpu-gpu"]["nvidia.com/gpu"] == str(2 * g4.gpus)  # maxSize 2 x 1 GPU
    assert quota["gpu-big"]["nvidia.com/gpu"] == str(3 * g5.gpus)  # maxSize 3 x 4 GPUs
    assert quota["gpu-big"]["vpc.amazonaws.com/efa"] == str(3 * g5.efa_interfaces)
    assert quota["gpu-gpu"]["vpc.amazonaws.com/efa"] == "0"  # covered, so listed: none on a group without EFA
    cpu, memory, _ = pod_resources(g5)
    assert (quota["gpu-big"]["cpu"], quota["gpu-big"]["memory"]) == (str(3 * cpu), f"{3 * memory}Gi")
    # GPU capacity binds: cpu and memory fit exactly as many pods as GPUs fit whole nodes.
    assert int(quota["gpu-big"]["cpu"]) // cpu == int(quota["gpu-big"]["nvidia.com/gpu"]) // g5.gpus
    assert cq["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "training"}}
    assert cq["spec"]["queueingStrategy"] == "BestEffortFIFO"
    assert cq["spec"]["preemption"] == {"withinClusterQueue": "Never"}
    flavors = {f["metadata"]["name"]: f["spec"] for f in the(two_runs, "ResourceFlavor")}
    assert flavors["gpu-big"] == {"nodeLabels": {"eks-ddp/node-group": "big"},
                                  "nodeTaints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]}


def test_gpu_admission_goes_through_the_provisioning_request_check_on_every_flavor(dev_result, p4de_result, two_runs):
    for result in (dev_result, p4de_result, two_runs):
        [cq] = the(result, "ClusterQueue")
        flavors = [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]]
        assert cq["spec"]["admissionChecksStrategy"] == {"admissionChecks": [
            {"name": "gpu-capacity", "onFlavors": flavors}]}
        [check] = the(result, "AdmissionCheck")
        assert check["metadata"]["name"] == "gpu-capacity"
        assert check["spec"] == {"controllerName": "kueue.x-k8s.io/provisioning-request", "parameters": {
            "apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "gpu-atomic"}}
        [config] = the(result, "ProvisioningRequestConfig")
        assert config["metadata"]["name"] == "gpu-atomic"
        assert config["spec"] == {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
                                  "managedResources": ["nvidia.com/gpu"], "retryStrategy": {
                                      "backoffLimitCount": 10, "backoffBaseSeconds": 60, "backoffMaxSeconds": 600}}
        [lq] = the(result, "LocalQueue")
        assert (lq["metadata"]["name"], lq["metadata"]["namespace"], lq["spec"]) == \
            ("training", "training", {"clusterQueue": "eks-ddp"})
        assert {p["metadata"]["name"]: p["value"] for p in the(result, "WorkloadPriorityClass")} == {
            "eks-ddp-low": 100, "eks-ddp-normal": 1000, "eks-ddp-high": 10000}


def test_without_all_or_nothing_there_is_no_check_and_preemption_follows_the_key():
    result = run(two_groups_two_runs(allOrNothing=False, preemption="lowerPriority"))
    [cq] = the(result, "ClusterQueue")
    assert "admissionChecksStrategy" not in cq["spec"]
    assert cq["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    assert not the(result, "AdmissionCheck") and not the(result, "ProvisioningRequestConfig")
    assert all(kueue_schema.problems(body(r)) == [] for r in kueue_objects(result))


def test_queue_disabled_renders_no_kueue_object_and_jobs_start_at_once(two_runs):
    result = run(two_groups_two_runs(enabled=False))
    assert kueue_objects(result) == [] and not result.of_type("eks-ddp:queue:RunQueue")
    for j in trains(result):
        assert "suspend" not in j.inputs["spec"]
        assert not any(k.startswith("kueue.x-k8s.io/") for k in j.inputs["metadata"]["labels"])
        assert not any(k.startswith("kueue.x-k8s.io/") for k in j.inputs["metadata"].get("annotations") or {})
        assert j.ignore_changes == []
    # Control: the same stack with the queue on (the default) has them.
    assert kueue_objects(two_runs) and all(j.inputs["spec"]["suspend"] is True for j in trains(two_runs))


def test_the_jobs_wait_for_the_queue_and_the_queue_for_the_addons(dev_result):
    [queue] = dev_result.of_type("eks-ddp:queue:RunQueue")
    [job] = dev_result.of_type("eks-ddp:elastic_job:ElasticJob")
    # Destroy removes the Jobs (and so their Workloads) before the queue (a component's dependency is its children).
    assert any("eks-ddp:queue:RunQueue$kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue::" in u for u in job.dependencies)
    assert any("eks-ddp:addons:ClusterAddons$" in u for u in queue.dependencies)
    [cq] = dev_result.of_type(KUEUE + "ClusterQueue")
    assert {u.rsplit("::", 1)[1] for u in cq.dependencies} >= {"queue-flavor-gpu", "queue-admission-check"}


# --- the queued Jobs -------------------------------------------------------------------------------------------

def test_kueue_owns_suspend_and_under_partial_admission_parallelism(two_runs):
    for j in trains(two_runs):
        assert j.ignore_changes == ["spec.suspend", "spec.parallelism"]
        assert 'metadata.labels["kueue.x-k8s.io/queue-name"]' in j.replace_on_changes
        assert j.inputs["spec"]["parallelism"] == j.inputs["spec"]["completions"]


def test_a_run_with_min_nodes_equal_to_nodes_is_admitted_whole():
    """Kueue's webhook refuses job-min-parallelism >= the pod count: no annotation, and parallelism stays ours."""
    result = run(with_runs({"runId": "a", "nodes": 2, "minNodes": 2}))
    [j] = trains(result)
    assert "kueue.x-k8s.io/job-min-parallelism" not in (j.inputs["metadata"].get("annotations") or {})
    assert j.ignore_changes == ["spec.suspend"]
    assert j.inputs["spec"]["suspend"] is True  # queued all the same


def test_two_p4de_runs_over_quota_both_created_one_admitted_the_other_waits_and_nothing_is_awaited():
    """Two p4de runs of 2 nodes on a group of maxSize 2, the fabric check on (EFA's default): both training Jobs are
    created, queued and suspended, each running its fabric check as its own first phase; no queued Job is awaited by
    `pulumi up` (a queued, awaited check made `up` wait in the queue, fail at its timeout, and lose its place); Kueue
    admits one and the other waits with its reason."""
    from eks_ddp.tooling.contracts.queue import admission, never_admitted
    from eks_ddp.tooling.plan import render_manifests

    p4de = stack_config("p4de")
    first = dict(p4de["eks-ddp:job"], runId="p4de-a")
    second = dict(p4de["eks-ddp:job"], runId="p4de-b", minNodes=2)  # fixed size: it cannot be admitted smaller
    cfg = {k: v for k, v in p4de.items() if k != "eks-ddp:job"}
    cfg["eks-ddp:runs"] = [first, second]
    result = run(cfg, stack="p4de")
    jobs = result.of_type(JOB)
    queued = [j for j in jobs if "kueue.x-k8s.io/queue-name" in j.inputs["metadata"]["labels"]]
    assert sorted(j.inputs["metadata"]["name"] for j in queued) == ["training-p4de-a", "training-p4de-b-p4de-b"]
    for j in queued:
        assert j.inputs["spec"]["suspend"] is True
        assert j.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
        [init] = j.inputs["spec"]["template"]["spec"]["initContainers"]
        assert init["name"] == "fabric-check"
    assert not [j for j in jobs if "fabric" in j.name]
    manifests = render_manifests(result)
    outcomes = admission(manifests)
    states = sorted(o.state for o in outcomes.values())
    assert states == ["admitted", "pending"], outcomes
    [waiting] = [o for o in outcomes.values() if o.state == "pending"]
    assert "insufficient unused quota for nvidia.com/gpu in flavor gpu-a100" in waiting.message
    assert never_admitted(manifests) == []


def test_cancel_deletes_a_queued_job_and_suspends_an_unqueued_one(two_runs):
    assert two_runs.outputs["runs"]["b"]["cancel"] == (
        "kubectl -n training delete job training-b-b --ignore-not-found && "
        "pulumi config set --path 'runs[1].state' cancelled")
    plain = run(two_groups_two_runs(enabled=False))
    assert plain.outputs["runs"]["b"]["cancel"] == (
        "kubectl -n training patch job training-b-b --type=merge -p '{\"spec\":{\"suspend\":true}}' && "
        "pulumi config set --path 'runs[1].state' cancelled")


# --- the component's own rules ---------------------------------------------------------------------------------

class _Group:
    def __init__(self, name: str, instance_type: str = "g4dn.xlarge", efa: bool = False, max_size: int = 2):
        self.group_name, self.instance_type, self.efa, self.max_size = name, instance_type, efa, max_size
        self.node_labels = {"eks-ddp/node-group": name}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"groups": []}, "groups: got []; expected at least one GPU node group"),
    ({"groups": [_Group("a"), _Group("a")]}, "groups: got the names ['a', 'a']; expected each group once"),
    ({"groups": [_Group("a")], "preemption": "always"},
     "preemption: got 'always'; expected one of 'never', 'lowerPriority'"),
    ({"groups": [_Group("a", "t3.large")]}, "groups[0].instance_type: got 't3.large'; expected a GPU type"),
])
def test_run_queue_args_name_the_bad_field(kwargs, message):
    from eks_ddp import RunQueueArgs
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        RunQueueArgs(namespace="training", **kwargs)


def test_queued_names_must_be_kueue_object_names():
    from eks_ddp import Queued
    with pytest.raises(ValueError, match="queue.local_queue: got 'Training'"):
        Queued(local_queue="Training", priority_class="eks-ddp-high")
    assert Queued(local_queue="training", priority_class="eks-ddp-high").local_queue == "training"


def test_run_queue_is_usable_as_a_library_component():
    from eks_ddp import RunQueue, RunQueueArgs
    from eks_ddp.tooling.mocks import run_program

    def program() -> None:
        q = RunQueue("q", RunQueueArgs(namespace="ml", groups=[_Group("a"), _Group("b", "p4d.24xlarge", True, 4)]))
        pulumi.export("quotas", q.quotas)
        pulumi.export("queued", q.queued("high").priority_class)

    result = run_program({}, program=program)
    assert result.outputs["queued"] == "eks-ddp-high"
    assert result.outputs["quotas"]["gpu-b"]["nvidia.com/gpu"] == "32"
    assert all(kueue_schema.problems(body(r)) == [] for r in kueue_objects(result))


def test_every_queued_pod_asks_only_for_covered_resources_and_a_full_group_fits_the_quota(two_runs, p4de_result):
    """Kueue admits nothing that requests a resource the ClusterQueue does not cover; a run of maxSize pods fits
    its flavor's quota exactly in GPUs (and within it in everything else)."""
    for result in (two_runs, p4de_result):
        [cq] = the(result, "ClusterQueue")
        [rg] = cq["spec"]["resourceGroups"]
        quota = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in rg["flavors"]}
        queued = [j for j in result.of_type(JOB) if "kueue.x-k8s.io/queue-name" in j.inputs["metadata"]["labels"]]
        # two_runs: two trainings (b's runs the fabric check first: its group has EFA); p4de: its training
        assert len(queued) == (2 if result is two_runs else 1)
        for j in queued:
            pod = j.inputs["spec"]["template"]["spec"]
            flavor = f"gpu-{pod['nodeSelector']['eks-ddp/node-group']}"
            requests = pod["containers"][0]["resources"]["requests"]
            assert set(requests) <= set(rg["coveredResources"]), (j.name, requests)
            gpus = int(requests["nvidia.com/gpu"])
            full = int(quota[flavor]["nvidia.com/gpu"]) // gpus  # the group's maxSize
            assert int(quota[flavor]["cpu"]) >= full * int(requests["cpu"])
            assert int(quota[flavor]["memory"].removesuffix("Gi")) >= full * int(requests["memory"].removesuffix("Gi"))
            assert j.inputs["spec"]["parallelism"] <= full


@pytest.mark.parametrize("stack", ["dev", "p4de", "two-runs"])
def test_every_training_job_is_queued_and_every_groups_gpus_are_its_flavors_quota(stack, request):
    """The Done-when of the queues on the three stacks: each training Job suspended with the queue's name, and each
    GPU group's flavor quota = maxSize x its GPUs per node (from the stack's own config, not the renderer's)."""
    result = request.getfixturevalue({"dev": "dev_result", "p4de": "p4de_result", "two-runs": "two_runs"}[stack])
    cfg = {"dev": lambda: stack_config("dev"), "p4de": lambda: stack_config("p4de"),
           "two-runs": two_groups_two_runs}[stack]()
    jobs = trains(result)
    assert jobs and all(j.inputs["spec"]["suspend"] is True
                        and j.inputs["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training" for j in jobs)
    [cq] = the(result, "ClusterQueue")
    quota = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]}
             for f in cq["spec"]["resourceGroups"][0]["flavors"]}
    groups = cfg["eks-ddp:nodeGroups"]
    assert set(quota) == {f"gpu-{g['name']}" for g in groups}
    for g in groups:
        gpus = catalog.lookup(g["instanceType"]).gpus
        assert quota[f"gpu-{g['name']}"]["nvidia.com/gpu"] == str(int(g["maxSize"]) * gpus), g["name"]


def test_every_gpu_job_and_cronjob_template_carries_the_queue_name(dev_result, p4de_result, two_runs):
    """The evaluation CronJob asks for a GPU: its jobTemplate is queued at its run's priority and suspended, so a Job
    made from it goes through Kueue; the queue contract passes the plans (it reads CronJob templates)."""
    from eks_ddp.tooling.contracts import PlanView
    from eks_ddp.tooling.contracts.queue import never_admitted
    seen = 0
    for result in (dev_result, p4de_result, two_runs):
        view = PlanView.of(result)
        for m in view.kind("Job") + view.kind("CronJob"):
            spec = m["spec"]["jobTemplate"] if m["kind"] == "CronJob" else m
            pod = spec["spec"]["template"]["spec"]
            if any("nvidia.com/gpu" in (c.get("resources") or {}).get("requests", {}) for c in pod["containers"]):
                seen += m["kind"] == "CronJob"
                assert spec["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == "training", m["metadata"]
                assert spec["metadata"]["labels"].get("kueue.x-k8s.io/priority-class", "").startswith("eks-ddp-")
                assert spec["spec"]["suspend"] is True
        assert never_admitted(view.manifests) == []
    assert seen >= 2  # dev's and p4de's evaluation CronJobs


def test_unqueued_the_evaluation_cronjob_is_not_suspended_in_its_template():
    result = run(two_groups_two_runs(enabled=False))
    from eks_ddp.tooling.plan import render_manifests
    cronjobs = [m for m in render_manifests(result) if m["kind"] == "CronJob"]
    assert cronjobs
    for m in cronjobs:
        if m["kind"] == "CronJob":
            assert "suspend" not in m["spec"]["jobTemplate"]["spec"]
            assert "kueue.x-k8s.io/queue-name" not in m["spec"]["jobTemplate"]["metadata"]["labels"]


def test_the_pinned_pulumi_kubernetes_previews_kinds_a_helm_release_brings():
    """The queue's kinds come from Kueue's Helm release in the same `up`: the pin (constraints.txt, pyproject.toml)
    and what is installed are at least the release that reads a release's CRDs at preview."""
    import re
    from importlib.metadata import version

    from eks_ddp.workloads.queue import MIN_PULUMI_KUBERNETES
    from tests.support.util import ROOT

    def parse(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split(".")[:3])

    pins = re.findall(r"pulumi[-_]kubernetes==([\d.]+)", (ROOT / "constraints.txt").read_text()
                      + (ROOT / "pyproject.toml").read_text())
    assert pins and all(parse(p) >= MIN_PULUMI_KUBERNETES for p in pins), pins
    assert parse(version("pulumi_kubernetes")) >= MIN_PULUMI_KUBERNETES
    assert parse("4.31.9") < MIN_PULUMI_KUBERNETES  # control: the release before the fix is refused
