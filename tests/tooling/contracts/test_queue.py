"""Kueue's admission arithmetic (components/eks_ddp/tooling/contracts/queue.py) over plain Kubernetes dicts built
as the stack renders its queue (docs: QUEUE objects: ResourceFlavor ``gpu-<group>``, ClusterQueue ``eks-ddp``,
LocalQueue ``training``, WorkloadPriorityClasses ``eks-ddp-low|normal|high``, the queued training Job).

The stack here is the byo one's GPU group (``gpu``, g4dn.xlarge: 1 GPU, a training pod of 3 CPUs and 12 GiB), with
``maxSize`` chosen per test. Expected messages are Kueue v0.16.4's own (its scheduler_test.go / flavorassigner
formats). Negative controls: the quota one GPU short, a nodeSelector no flavor matches, a missing toleration, an
uncovered resource, the priority order swapped, partial admission at and below its minimum, preemption off/on.
These tests need nothing but the contract module; tests/tooling/contracts/test_queue_plan.py reads the real plan.
"""

from __future__ import annotations

from typing import Any

import pytest

from eks_ddp.tooling.contracts import queue as q

NS = "training"
CPU, MEM_GI, GPUS = 3, 12, 1
"""What one training pod on a g4dn.xlarge requests (pods.pod_resources: 4 vCPUs - 1, 16 GiB x 3/4)."""
PRIORITY = {"low": 100, "normal": 1000, "high": 10000}


def flavor(group: str = "gpu") -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": f"gpu-{group}"},
            "spec": {"nodeLabels": {"eks-ddp/node-group": group},
                     "nodeTaints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]}}


def cluster_queue(max_size: int = 3, *, gpu_quota: int | None = None, preemption: str = "Never",
                  strategy: str = "BestEffortFIFO", group: str = "gpu") -> dict[str, Any]:
    gpus = max_size * GPUS if gpu_quota is None else gpu_quota
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "eks-ddp"}, "spec": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
        "queueingStrategy": strategy, "preemption": {"withinClusterQueue": preemption},
        "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [{
            "name": f"gpu-{group}", "resources": [
                {"name": "cpu", "nominalQuota": str(max_size * CPU)},
                {"name": "memory", "nominalQuota": f"{max_size * MEM_GI}Gi"},
                {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}],
        "admissionChecksStrategy": {"admissionChecks": [{"name": "gpu-capacity", "onFlavors": [f"gpu-{group}"]}]}}}


def job(name: str, nodes: int, *, min_nodes: int | None = None, priority: str = "normal", group: str = "gpu",
        tolerate: bool = True, extra: dict[str, str] | None = None, queued: bool = True) -> dict[str, Any]:
    amounts = {"cpu": str(CPU), "memory": f"{MEM_GI}Gi", "nvidia.com/gpu": str(GPUS), **(extra or {})}
    labels = {"app.kubernetes.io/instance": name}
    annotations: dict[str, str] = {}
    if queued:
        labels.update({q.QUEUE_NAME_LABEL: "training", q.PRIORITY_CLASS_LABEL: f"eks-ddp-{priority}"})
        if min_nodes is not None:
            annotations[q.MIN_PARALLELISM] = str(min_nodes)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations},
            "spec": {"suspend": queued, "parallelism": nodes, "completions": nodes, "completionMode": "Indexed",
                     "template": {"spec": {
                         "nodeSelector": {"eks-ddp/pool": "gpu", "eks-ddp/node-group": group,
                                          "eks-ddp/instance-type": "g4dn.xlarge"},
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
                         if tolerate else [],
                         "containers": [{"name": "trainer", "resources": {"requests": amounts, "limits": amounts}}]}}}}


def plan(*jobs: dict[str, Any], cq: dict[str, Any] | None = None, flavors: tuple[str, ...] = ("gpu",)) -> list[dict]:
    # As rendered: the API server adds kubernetes.io/metadata.name itself, so the plan's Namespace does not carry it.
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {}}},
            *(flavor(g) for g in flavors), cq or cluster_queue(),
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
             "metadata": {"name": "training", "namespace": NS}, "spec": {"clusterQueue": "eks-ddp"}},
            *({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
               "metadata": {"name": f"eks-ddp-{k}"}, "value": v} for k, v in PRIORITY.items()),
            *jobs]


def need(resource_amounts: str) -> str:
    return f"couldn't assign flavors to pod set main: {resource_amounts}"


# --- two runs over the quota --------------------------------------------------------------------------------
def test_two_runs_over_quota_one_admitted_one_queued_with_kueues_reason():
    """maxSize 3, two runs of 2 nodes: the first takes 2 GPUs, the second waits for 1 more (cpu and memory run out
    with it: their quotas are sized from the same pod), reported in Kueue's words and not a plan error."""
    manifests = plan(job("run-a", 2), job("run-b", 2))
    out = q.admission(manifests)
    assert (out["run-a"].state, out["run-a"].count, out["run-a"].flavor) == ("admitted", 2, "gpu-gpu")
    assert out["run-a"].checks == ("gpu-capacity",)
    assert out["run-b"].state == "pending"
    assert out["run-b"].message == need(
        "insufficient unused quota for cpu in flavor gpu-gpu, 3 more needed, "
        "insufficient unused quota for memory in flavor gpu-gpu, 12Gi more needed, "
        "insufficient unused quota for nvidia.com/gpu in flavor gpu-gpu, 1 more needed")
    assert q.never_admitted(manifests) == []
    assert "run-b: pending: couldn't assign" in q.render(out)
    assert q.report(manifests) == q.render(out)
    assert "run-a: admitted, 2 pod(s) on gpu-gpu; then waits for admission check(s) gpu-capacity" in q.render(out)
    assert q.report([m for m in manifests if m["kind"] != "ClusterQueue"]) is None
    assert q.report(plan(job("run-a", 5))).splitlines()[-1].startswith("ERROR [queue] Job/run-a: can never be")


def test_quota_one_gpu_short_is_caught_and_exact_quota_admits_both():
    """Negative control on the boundary: with GPU quota 4 both 2-node runs fit; one GPU less (cpu and memory
    still ample) the second must wait for exactly 1 nvidia.com/gpu, not be admitted."""
    both = q.admission(plan(job("run-a", 2), job("run-b", 2), cq=cluster_queue(4, gpu_quota=4)))
    assert [both[r].state for r in ("run-a", "run-b")] == ["admitted", "admitted"]
    short = q.admission(plan(job("run-a", 2), job("run-b", 2), cq=cluster_queue(4, gpu_quota=3)))
    assert short["run-a"].state == "admitted"
    assert short["run-b"].state == "pending"
    assert short["run-b"].message == need("insufficient unused quota for nvidia.com/gpu in flavor gpu-gpu, "
                                          "1 more needed")


# --- plan errors: never admissible -------------------------------------------------------------------------------
def test_a_run_whose_node_selector_matches_no_flavor_is_a_plan_error():
    [v] = q.never_admitted(plan(job("run-a", 1, group="other")))
    assert v.subject == "Job/run-a" and "can never be admitted" in v.message
    assert v.message.endswith(need("flavor gpu-gpu doesn't match node affinity"))
    assert q.never_admitted(plan(job("run-a", 1))) == []  # control: the group's own selector matches


def test_a_run_without_the_gpu_toleration_is_a_plan_error():
    [v] = q.never_admitted(plan(job("run-a", 1, tolerate=False)))
    assert v.message.endswith(need("untolerated taint {nvidia.com/gpu true NoSchedule <nil>} in flavor gpu-gpu"))


def test_a_resource_the_queue_does_not_cover_and_a_run_larger_than_the_quota_are_plan_errors():
    [v] = q.never_admitted(plan(job("run-a", 1, extra={"vpc.amazonaws.com/efa": "1"})))
    assert v.message.endswith(need("resource vpc.amazonaws.com/efa unavailable in ClusterQueue"))
    [v] = q.never_admitted(plan(job("run-a", 4)))  # 4 nodes, maxSize 3
    # the first resource over its quota stops the flavor (Kueue meets them in Go's map order; here sorted: cpu)
    assert v.message.endswith("insufficient quota for cpu in flavor gpu-gpu, previously considered podsets requests "
                              "(0) + current podset request (12) > maximum capacity (9)")
    assert q.never_admitted(plan(job("run-a", 4, min_nodes=3))) == []  # admissible at its minimum


def test_queue_wiring_errors_are_reported():
    no_lq = [m for m in plan(job("run-a", 1)) if m["kind"] != "LocalQueue"]
    [v] = q.never_admitted(no_lq)
    assert v.message.endswith("LocalQueue training doesn't exist")
    bad_min = q.never_admitted(plan(job("run-a", 2, min_nodes=2)))
    assert [v.message.split(":")[0] for v in bad_min] == [f"annotation {q.MIN_PARALLELISM}"]
    assert "\"should be between 0 and 1\"" in bad_min[0].message
    bypass = q.never_admitted(plan(job("run-a", 1, queued=False)))
    assert [v.subject for v in bypass] == ["Job/run-a"] and "without the label" in bypass[0].message
    running = job("run-a", 1)
    running["spec"]["suspend"] = False
    assert ["not created with spec.suspend: true" in v.message for v in q.never_admitted(plan(running))] == [True]
    other_ns = plan(job("run-a", 1))
    next(m for m in other_ns if m["kind"] == "ClusterQueue")["spec"]["namespaceSelector"] = {
        "matchLabels": {"kubernetes.io/metadata.name": "elsewhere"}}
    [v] = q.never_admitted(other_ns)
    assert v.message.endswith("Workload namespace doesn't match ClusterQueue selector")


def cronjob(name: str, *, queued: bool) -> dict[str, Any]:
    """A suspended CronJob whose jobTemplate is a one-GPU Job (the evaluation CronJob's shape)."""
    j = job(name, 1, queued=queued)
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": NS},
            "spec": {"suspend": True, "schedule": "0 0 1 1 *", "jobTemplate": {
                "metadata": {"labels": j["metadata"]["labels"]}, "spec": j["spec"]}}}


def test_a_gpu_cronjob_template_without_the_queue_name_bypasses_the_queue():
    """The contract used to read kind Job only: an evaluation CronJob asking for a GPU without the label passed."""
    [v] = q.never_admitted(plan(job("run-a", 1), cronjob("run-a-evaluate", queued=False)))
    assert v.subject == "CronJob/run-a-evaluate"
    assert v.message.startswith("requests nvidia.com/gpu without the label kueue.x-k8s.io/queue-name in its "
                                "jobTemplate (every Job made from it)")
    # Control: queued and suspended in the template, it passes, and it takes no part in the admission simulation.
    queued = plan(job("run-a", 1), cronjob("run-a-evaluate", queued=True))
    assert q.never_admitted(queued) == []
    assert set(q.admission(queued)) == {"run-a"}
    # The template is held to the queue's other rules too: one that fits no flavor is a plan error.
    bad = cronjob("run-a-evaluate", queued=True)
    bad["spec"]["jobTemplate"]["spec"]["template"]["spec"]["tolerations"] = []
    [v] = q.never_admitted(plan(job("run-a", 1), bad))
    assert v.subject == "CronJob/run-a-evaluate" and "untolerated taint" in v.message


# --- order ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("first", "second", "admitted"), [("low", "high", "run-b"), ("high", "low", "run-a")])
def test_the_higher_priority_is_admitted_first_whatever_the_creation_order(first, second, admitted):
    """run-a is created first; the swap of priorities swaps who is admitted (the negative control of each other)."""
    out = q.admission(plan(job("run-a", 2, priority=first), job("run-b", 2, priority=second)))
    assert [r for r in ("run-a", "run-b") if out[r].state == "admitted"] == [admitted]


def test_equal_priorities_are_first_in_first_out_and_best_effort_lets_a_smaller_run_pass():
    out = q.admission(plan(job("run-a", 2), job("run-b", 2), job("run-c", 1)))
    assert [out[r].state for r in ("run-a", "run-b", "run-c")] == ["admitted", "pending", "admitted"]
    strict = q.admission(plan(job("run-a", 2), job("run-b", 2), job("run-c", 1),
                              cq=cluster_queue(strategy="StrictFIFO")))
    assert [strict[r].state for r in ("run-a", "run-b", "run-c")] == ["admitted", "pending", "pending"]
    assert "behind run-b" in strict["run-c"].message


# --- partial admission ------------------------------------------------------------------------------------------
def test_partial_admission_takes_the_largest_count_the_quota_allows_down_to_min_nodes():
    out = q.admission(plan(job("run-a", 2), job("run-b", 4, min_nodes=1), cq=cluster_queue(5)))
    assert (out["run-b"].state, out["run-b"].count) == ("admitted", 3)
    out = q.admission(plan(job("run-a", 2), job("run-b", 3, min_nodes=1)))
    assert (out["run-b"].state, out["run-b"].count) == ("admitted", 1)


def test_partial_admission_never_goes_below_min_nodes():
    """Negative control: one node free, minNodes 2: it waits, with the message of its full size."""
    out = q.admission(plan(job("run-a", 2), job("run-b", 3, min_nodes=2)))
    assert out["run-b"].state == "pending"
    assert "insufficient unused quota for nvidia.com/gpu in flavor gpu-gpu, 2 more needed" in out["run-b"].message


# --- preemption -------------------------------------------------------------------------------------------------
def test_lower_priority_preemption_only_where_the_queue_allows_it():
    """A low run holds 2 of 3 GPUs; a high run of 2 arrives. Never: it waits. LowerPriority: the low run is
    preempted (Kueue's message) and the high one admitted whole."""
    jobs = (job("low-run", 2, priority="low"), job("high-run", 2, priority="high"))
    never = q.admission(plan(*jobs), running=["low-run"])
    assert never["low-run"].state == "admitted" and never["high-run"].state == "pending"
    out = q.admission(plan(*jobs, cq=cluster_queue(preemption="LowerPriority")), running=["low-run"])
    assert (out["high-run"].state, out["high-run"].count, out["high-run"].preempts) == ("admitted", 2, ("low-run",))
    assert out["high-run"].message.endswith(". Pending the preemption of 1 workload(s)")
    assert out["low-run"].state == "preempted" and out["low-run"].preempted_by == "high-run"
    assert out["low-run"].message.startswith(
        "Preempted to accommodate a workload (UID: UNKNOWN, JobUID: UNKNOWN) due to prioritization in the "
        "ClusterQueue; preemptor path: /eks-ddp; preemptee path: /eks-ddp; requeued: couldn't assign")


def test_an_equal_priority_run_is_never_preempted_and_preemption_beats_partial_admission():
    jobs = (job("old", 2), job("new", 2))
    out = q.admission(plan(*jobs, cq=cluster_queue(preemption="LowerPriority")), running=["old"])
    assert out["old"].state == "admitted" and out["new"].state == "pending"
    # an elastic high run: whole by preempting (LowerPriority) rather than partial (Never)
    jobs = (job("low-run", 2, priority="low"), job("high-run", 2, min_nodes=1, priority="high"))
    never = q.admission(plan(*jobs), running=["low-run"])
    assert (never["high-run"].state, never["high-run"].count) == ("admitted", 1)
    lower = q.admission(plan(*jobs, cq=cluster_queue(preemption="LowerPriority")), running=["low-run"])
    assert (lower["high-run"].count, lower["low-run"].state) == (2, "preempted")


def test_the_fewest_lowest_most_recent_runs_are_preempted():
    """CandidatesOrdering then fillBackWorkloads: of two low runs (1 GPU each) and a normal one, a high run of 2 on a
    full queue of 4 takes the two low ones; of 1 GPU, the most recently admitted low one only."""
    low1, low2, normal = job("low-1", 1, priority="low"), job("low-2", 1, priority="low"), job("norm", 2)
    cq = cluster_queue(4, preemption="LowerPriority")
    out = q.admission(plan(low1, low2, normal, job("high", 2, priority="high"), cq=cq),
                      running=["low-1", "low-2", "norm"])
    assert out["high"].preempts == ("low-1", "low-2") and out["norm"].state == "admitted"
    out = q.admission(plan(low1, low2, normal, job("high", 1, priority="high"), cq=cq),
                      running=["low-1", "low-2", "norm"])
    assert out["high"].preempts == ("low-2",) and out["low-1"].state == "admitted"


# --- quantities and names ----------------------------------------------------------------------------------------
def test_quantities_read_and_print_as_kubernetes_does():
    assert q.resource_value("cpu", "3500m") == 3500 and q.resource_value("cpu", 3) == 3000
    assert q.resource_value("memory", "12Gi") == 12 * 2**30 and q.resource_value("nvidia.com/gpu", "8") == 8
    assert q.resource_value("memory", "1e3") == 1000 and q.resource_value("memory", "1.5k") == 1500
    assert [q.quantity_string("cpu", v) for v in (3000, 3500, 0)] == ["3", "3500m", "0"]
    assert [q.quantity_string("memory", v) for v in (12 * 2**30, 1536 * 2**20, 100000, 1000)] == \
        ["12Gi", "1536Mi", "100k", "1k"]
    with pytest.raises(ValueError, match="quantity: got '12 GB'"):
        q.parse_quantity("12 GB")


def test_the_workload_name_is_kueues():
    """pkg/controller/jobframework/reconciler_test.go: Job test-job with UID test-job -> job-test-job-ce737."""
    assert q.workload_name("test-job", "test-job") == "job-test-job-ce737"


# --- what the plan says -----------------------------------------------------------------------------------------
def test_the_plan_says_who_is_admitted_who_waits_and_who_would_be_preempted():
    """Two runs over one group's quota (4 GPUs): a low one of 4 nodes (minNodes 1) and a high one of 3. Arriving
    together the high one is admitted whole and the low one at 1 of 4, where it stays; if the low one already runs
    whole, the high one waits for it (preemption Never) or preempts it (LowerPriority)."""
    jobs = (job("training-low", 4, min_nodes=1, priority="low"), job("training-high", 3, priority="high"))
    never = q.explain(plan(*jobs, cq=cluster_queue(4))).splitlines()
    together = never[:3]
    assert together == [
        "all runs arriving together (as one `pulumi up` creates them):",
        "  training-high: admitted, 3 pod(s) on gpu-gpu; then waits for admission check(s) gpu-capacity",
        "  training-low: admitted, 1 of 4 pod(s) on gpu-gpu; then waits for admission check(s) gpu-capacity; elastic "
        "(minimum 1): it stays at 1 pod(s), Kueue does not grow an admitted Job"]
    assert never[3:] == [
        "if training-low is already running, whole, when the others arrive:",
        "  training-high: waits: " + need("insufficient unused quota for cpu in flavor gpu-gpu, 9 more needed, "
                                          "insufficient unused quota for memory in flavor gpu-gpu, 36Gi more needed, "
                                          "insufficient unused quota for nvidia.com/gpu in flavor gpu-gpu, 3 more "
                                          "needed"),
        "  training-low: admitted, 4 pod(s) on gpu-gpu; then waits for admission check(s) gpu-capacity"]
    lower = q.explain(plan(*jobs, cq=cluster_queue(4, preemption="LowerPriority"))).splitlines()
    assert lower[:3] == together
    assert lower[3:] == [
        "if training-low is already running, whole, when the others arrive:",
        "  training-high: admitted, 3 pod(s) on gpu-gpu; preempts training-low; then waits for admission check(s) "
        "gpu-capacity",
        "  training-low: preempted by training-high, then admitted again, 1 of 4 pod(s) on gpu-gpu; then waits for "
        "admission check(s) gpu-capacity; elastic (minimum 1): it stays at 1 pod(s), Kueue does not grow an admitted "
        "Job"]
    # a fixed-size low run waits, named with Kueue's reason; no queue, no report
    fixed = q.explain(plan(job("training-low", 4, priority="low"), job("training-high", 3, priority="high"),
                           cq=cluster_queue(4))).splitlines()
    assert fixed[2].startswith("  training-low: waits: couldn't assign flavors to pod set main: "), fixed
    assert q.explain([m for m in plan(*jobs) if m["kind"] != "ClusterQueue"]) is None


def test_queue_wiring_a_run_would_wait_for_in_vain_is_warned():
    """Review L4/L5 (a library program): Kueue's managed_namespaces without the job's namespace, and a queue without
    a cluster autoscaler, planned silently. Each is a warning in the plan's Queue section now; the controls (the
    namespace managed, an autoscaler there, no Kueue seen) say nothing."""
    manifests = plan(job("run-a", 2))
    only = lambda *names: [{"matchExpressions": [  # noqa: E731  (Kueue's managedJobsNamespaceSelector)
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(names)}]}]
    [ns] = q.wiring(manifests, only("ml"), autoscaler=True)
    assert ns == ("Job/run-a: in namespace 'training', which Kueue does not manage (its managedJobsNamespaceSelector): "
                  "Kueue never admits it and its Job stays suspended; expected 'training' in "
                  "KueueArgs.managed_namespaces")
    assert q.wiring(manifests, only("ml", NS), autoscaler=True) == []
    assert q.wiring(manifests, None, autoscaler=True) == []
    [ca] = q.wiring(manifests, only(NS), autoscaler=False)
    assert ca.startswith("ClusterQueue: its admission check gpu-capacity asks the cluster autoscaler for the GPU nodes "
                         "(ProvisioningRequest), and the program has no ClusterAutoscaler"), ca
    assert "provisioning_requests=True" in ca
    assert q.wiring([m for m in manifests if m["kind"] != "ClusterQueue"], only("ml"), autoscaler=False) == []
