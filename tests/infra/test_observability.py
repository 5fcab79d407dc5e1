"""Logs in CloudWatch with a retention, NVIDIA's DCGM exporter on the GPU nodes, the node monitoring agent and node
auto repair, read from the dev and p4de plans (the session fixtures) as ``pulumi up`` would send them."""

from __future__ import annotations

import json

import pulumi
import pytest

from eks_ddp.core import k8s_versions, scheduling
from eks_ddp.infra import observability as obs
from eks_ddp.infra.gpu_nodegroup import GPU_TAINT_KEY
from eks_ddp.tooling.contracts.iam_policy import ALLOW, Request, evaluate
from eks_ddp.tooling.mocks import RecordingMocks, run_program
from eks_ddp.tooling.plan import render_manifests
from tests.support.util import run, set_path, stack_config

ADDON = "aws:eks/addon:Addon"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
RELEASE = "kubernetes:helm.sh/v3:Release"
NG = "aws:eks/nodeGroup:NodeGroup"
PARENT = "eks-ddp:observability:Observability"
GPU_TAINT = (GPU_TAINT_KEY, "true", "NoSchedule")
STACKS = ["dev_result", "p4de_result"]


def addon(result, name: str):
    [a] = [a for a in result.of_type(ADDON) if a.inputs["addonName"] == name]
    return a


def config_of(result, name: str) -> dict:
    return json.loads(addon(result, name).inputs["configurationValues"])


def dcgm(result):
    [r] = [r for r in result.of_type(RELEASE) if r.inputs["chart"] == obs.DCGM_EXPORTER_CHART]
    return r


def cluster_name(result) -> str:
    return result.one("eks:index:Cluster").inputs["name"]


# --- logs that outlive the nodes -------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_container_logs_ship_from_every_node_gpu_nodes_included(stack, request):
    result = request.getfixturevalue(stack)
    cw = addon(result, k8s_versions.CLOUDWATCH_OBSERVABILITY)
    version = stack_config(stack.removesuffix("_result"))["eks-ddp:cluster"]["kubernetesVersion"]
    assert cw.inputs["addonVersion"] == f"v0.0.0-eksbuild.default-{version}"  # EKS's build for this version
    conf = config_of(result, k8s_versions.CLOUDWATCH_OBSERVABILITY)
    assert conf["containerLogs"] == {"enabled": True}
    # Fluent Bit and the agent take the root tolerations (the chart's common.tolerations helper): the GPU taint, and a
    # NoExecute one on a node being drained or repaired, are both tolerated.
    assert scheduling.tolerates(conf["tolerations"], GPU_TAINT)
    assert scheduling.tolerates(conf["tolerations"], ("node.kubernetes.io/unreachable", "", "NoExecute"))
    # One DCGM host engine per GPU (NVIDIA's exporter), nothing injected into the stack's workloads.
    assert conf["dcgmExporter"] == {"enabled": False} and conf["neuronMonitor"] == {"enabled": False}
    assert conf["manager"]["applicationSignals"]["autoMonitor"]["monitorAllServices"] is False
    assert cw.parent_type == PARENT


def test_the_toleration_check_catches_a_config_without_the_gpu_taint():
    """Negative control: the add-on's chart default is tolerations [{operator: Exists}]; a config that narrowed it to
    the system nodes' (none) leaves the GPU nodes without Fluent Bit, and the check says so."""
    narrowed = {**obs.cloudwatch_configuration(), "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]}
    assert not scheduling.tolerates(narrowed["tolerations"], GPU_TAINT)


@pytest.mark.parametrize("stack", STACKS)
def test_log_groups_exist_first_with_the_retention_and_outlive_the_stack(stack, request):
    result = request.getfixturevalue(stack)
    name = cluster_name(result)
    groups = {g.inputs["name"]: g for g in result.of_type(LOG_GROUP) if g.parent_type == PARENT}
    assert set(groups) == {f"/aws/containerinsights/{name}/{k}" for k in ("application", "dataplane", "host",
                                                                        "performance")}
    for g in groups.values():
        assert g.inputs["retentionInDays"] == 30  # observability.logRetentionDays' default
        assert g.inputs["skipDestroy"] is True
        assert g.inputs["tags"]["eks-ddp/stack"].endswith(f"/eks-ddp/{stack.removesuffix('_result')}")
    # The add-on (whose Fluent Bit would create a missing group with no expiry) waits for the groups.
    assert {g.urn for g in groups.values()} <= set(addon(result, k8s_versions.CLOUDWATCH_OBSERVABILITY).dependencies)
    tail = result.outputs["containerLogs"]
    assert tail.startswith(f"aws logs tail /aws/containerinsights/{name}/application ") and '"training"' in tail


def test_the_agents_role_writes_only_this_clusters_log_groups(dev_result):
    cw = addon(dev_result, k8s_versions.CLOUDWATCH_OBSERVABILITY)
    [role] = [r for r in dev_result.of_type("aws:iam/role:Role") if r.parent_type == PARENT]
    assert cw.inputs["serviceAccountRoleArn"] == role.outputs["arn"]
    [trust] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    subjects = [v for k, v in trust["Condition"]["StringEquals"].items() if k.endswith(":sub")]
    assert subjects == ["system:serviceaccount:amazon-cloudwatch:cloudwatch-agent"]
    [policy] = [p for p in dev_result.of_type("aws:iam/rolePolicy:RolePolicy") if p.parent_type == PARENT]
    doc = json.loads(policy.inputs["policy"])
    name, arn = cluster_name(dev_result), role.outputs["arn"]
    logs = "arn:aws:logs:us-west-2:123456789012:log-group:"

    def decide(action: str, resource: str, **context) -> str:
        return evaluate(doc, Request(arn, action, resource, context)).effect

    own = f"{logs}/aws/containerinsights/{name}/application"
    assert decide("logs:PutLogEvents", f"{own}:log-stream:ip-10-0-1-1-application.var.log.containers.x") == ALLOW
    assert decide("logs:CreateLogStream", f"{own}:log-stream:x") == ALLOW
    assert decide("logs:PutLogEvents", f"{logs}/aws/containerinsights/other-cluster/application:log-stream:x") != ALLOW
    assert decide("logs:PutLogEvents", f"{logs}/aws/eks/{name}/cluster:log-stream:x") != ALLOW
    assert decide("logs:PutRetentionPolicy", own) != ALLOW  # retention is the stack's, not the agent's
    assert decide("logs:DeleteLogGroup", own) != ALLOW
    assert decide("ec2:DescribeTags", "*", **{"aws:RequestedRegion": "us-west-2"}) == ALLOW
    assert decide("ec2:DescribeTags", "*", **{"aws:RequestedRegion": "eu-west-1"}) != ALLOW
    assert decide("cloudwatch:PutMetricData", "*") != ALLOW


def test_the_policy_check_catches_the_quick_starts_policy():
    """Negative control: AWS's quick start gives the agents CloudWatchAgentServerPolicy, whose log statement has
    Resource '*'; the same evaluation then allows writing any log group, which the test above refuses."""
    quick = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Resource": "*", "Action": [
        "logs:PutLogEvents", "logs:CreateLogStream", "logs:CreateLogGroup", "logs:PutRetentionPolicy"]}]}
    other = "arn:aws:logs:us-west-2:123456789012:log-group:/aws/containerinsights/other-cluster/application"
    assert evaluate(quick, Request("arn:aws:iam::123456789012:role/x", "logs:PutLogEvents", other)).effect == ALLOW


# --- adoption of kept log groups -------------------------------------------------------------------------------

def _component(mocks: RecordingMocks | None = None, **changes):
    args = dict(cluster_name="eks-ddp-test", region="us-west-2", oidc_provider_arn="arn:aws:iam::1:oidc-provider/x",
                oidc_provider_url="https://oidc.eks.us-west-2.amazonaws.com/id/X", stack_id="org/eks-ddp/test",
                gpu_metrics=False, node_monitoring=False)
    args.update(changes)

    def program():
        obs.Observability("observability", obs.ObservabilityArgs(**args))

    return run_program({}, program=program, mocks=mocks)


def test_a_kept_log_group_is_adopted_and_another_stacks_is_refused():
    mocks = RecordingMocks()
    kept = "/aws/containerinsights/eks-ddp-test/application"
    mocks.log_groups = [kept]
    mocks.log_group_tags = {kept: {"eks-ddp/stack": "org/eks-ddp/test"}}
    result = _component(mocks, log_retention_days=7)
    imported = {g.inputs["name"]: g.import_id for g in result.of_type(LOG_GROUP)}
    assert imported[kept] == kept and imported["/aws/containerinsights/eks-ddp-test/host"] == ""
    assert {g.inputs["retentionInDays"] for g in result.of_type(LOG_GROUP)} == {7}

    theirs = RecordingMocks()
    theirs.log_groups = [kept]
    theirs.log_group_tags = {kept: {"eks-ddp/stack": "org/eks-ddp/someone-else"}}
    with pytest.raises(Exception, match="belongs to stack 'org/eks-ddp/someone-else'"):
        _component(theirs)


@pytest.mark.parametrize("field,value,message", [
    ("log_retention_days", 31, "log_retention_days: got 31; expected one of CloudWatch's retention values"),
    ("region", "mars-1", "region"),
    ("cloudwatch", pulumi.Output.from_input(True), "cloudwatch: got a pulumi Output"),
])
def test_bad_args_name_the_field(field, value, message):
    args = obs.ObservabilityArgs(cluster_name="c1", region="us-west-2", oidc_provider_arn="a", oidc_provider_url="u")
    with pytest.raises(ValueError, match=message):
        obs.validate(obs.ObservabilityArgs(**{**args.__dict__, field: value}))


# --- GPU health: the DCGM exporter ------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_dcgm_exporter_is_pinned_runs_on_gpu_nodes_only_and_non_root(stack, request):
    result = request.getfixturevalue(stack)
    rel = dcgm(result)
    inputs, values = rel.inputs, rel.inputs["values"]
    assert (inputs["version"], inputs["repositoryOpts"]["repo"]) == ("4.8.2", obs.DCGM_EXPORTER_REPO)
    assert inputs["namespace"] == "kube-system" and inputs["name"] == obs.DCGM_EXPORTER_RELEASE
    repo, tag = values["image"]["repository"], values["image"]["tag"]
    assert repo == "nvcr.io/nvidia/k8s/dcgm-exporter" and tag.startswith("4.5.3-4.8.2-distroless@sha256:")
    assert len(tag.rsplit(":", 1)[1]) == 64  # the chart renders repository:tag, so the digest pins the image
    # GPU nodes only: the pool label, its required affinity, and the GPU taint tolerated.
    assert values["nodeSelector"] == {"eks-ddp/pool": "gpu"}
    assert scheduling.tolerates(values["tolerations"], GPU_TAINT)
    system = scheduling.TemplateNode(labels={"eks-ddp/pool": "system"}, taints=(), allocatable={"cpu": 2})
    gpu = scheduling.TemplateNode(labels={"eks-ddp/pool": "gpu"}, taints=(GPU_TAINT,), allocatable={"cpu": 2})
    pod = {k: values[k] for k in ("nodeSelector", "tolerations", "affinity")}
    assert scheduling.would_scale_up(pod, gpu) and not scheduling.would_scale_up(pod, system)
    # Least privilege: non-root, no capability, no host namespaces, no API token, no Prometheus Operator kinds.
    sc = values["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0 and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and "add" not in sc["capabilities"]
    assert values["podSecurityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert values["hostNetwork"] is False and values["hostPID"] is False
    assert values["kubernetes"] == {"enablePodLabels": False, "enablePodUID": False}
    assert values["serviceMonitor"] == {"enabled": False}
    assert "--kubernetes=false" in values["arguments"]
    # It waits for the GPU groups (a node joining during Helm's wait) and for its NetworkPolicy.
    gpu_groups = {r.urn for r in result.of_type(NG) if r.parent_type == "eks-ddp:gpu_nodegroup:GpuNodeGroup"}
    policy = next(r.urn for r in result.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
                  if r.parent_type == PARENT)
    assert gpu_groups and gpu_groups | {policy} <= set(rel.dependencies)
    assert inputs["atomic"] is True and inputs["timeout"] >= 600


def counters(values: dict) -> set[str]:
    return {line.split(",")[0].strip() for line in values["customMetrics"].splitlines()
            if line.strip() and not line.startswith("#")}


def test_xid_and_ecc_faults_are_among_the_exported_counters(dev_result):
    fields = counters(dcgm(dev_result).inputs["values"])
    assert {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"} <= fields
    # Profiling (DCP) fields need CAP_SYS_ADMIN, which the exporter does not have.
    assert not {f for f in fields if f.startswith("DCGM_FI_PROF_")}


def test_the_counter_check_catches_the_charts_default_list():
    """Negative control: the chart's own default counters (its metrics-configmap.yaml, 4.8.2) have XID but leave
    every ECC counter commented out; the check above would fail on them."""
    default = "\n".join([
        "# ECC", "# DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.",
        "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE, gauge, Ratio of time the graphics engine is active."])
    fields = counters({"customMetrics": default})
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in fields and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in fields


def test_only_labelled_scrapers_reach_the_exporter_and_it_sends_nothing(dev_result):
    [policy] = [m for m in render_manifests(dev_result) if m["kind"] == "NetworkPolicy"
                and m["metadata"]["name"] == obs.DCGM_EXPORTER_RELEASE]
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "kube-system"
    assert spec["podSelector"]["matchLabels"] == obs.dcgm_selector()
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"] and not spec.get("egress")
    [rule] = spec["ingress"]
    assert rule["ports"] == [{"port": 9400, "protocol": "TCP"}]
    [peer] = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {obs.SCRAPER_LABEL: "true"}}
    assert peer["podSelector"] == {"matchLabels": {obs.SCRAPER_LABEL: "true"}}


# --- node health: the monitoring agent and node auto repair ----------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_node_monitoring_agent_reaches_the_gpu_nodes_and_gpu_groups_repair(stack, request):
    result = request.getfixturevalue(stack)
    conf = config_of(result, k8s_versions.NODE_MONITORING_AGENT)
    # Its DCGM host engine tolerates no taint by default: without this the agent on a GPU node has no DCGM.
    assert scheduling.tolerates(conf["dcgmAgent"]["tolerations"], GPU_TAINT)
    groups = [r for r in result.of_type(NG) if r.parent_type == "eks-ddp:gpu_nodegroup:GpuNodeGroup"]
    for g in groups:
        assert g.inputs["nodeRepairConfig"]["enabled"] is True


def test_the_agent_check_catches_the_charts_default_dcgm_tolerations():
    """Negative control: eks-node-monitoring-agent's own default (values.yaml 1.7.0, dcgmAgent.tolerations: []) leaves
    the DCGM host engine off the GPU nodes; the check above refuses it."""
    default = {"dcgmAgent": {"tolerations": []}}
    assert not scheduling.tolerates(default["dcgmAgent"]["tolerations"], GPU_TAINT)
    assert scheduling.tolerates(obs.node_monitoring_configuration()["dcgmAgent"]["tolerations"], GPU_TAINT)


def test_reserved_capacity_repairs_one_node_at_a_time(dev_result, p4de_result):
    [dev] = [r for r in dev_result.of_type(NG) if r.parent_type == "eks-ddp:gpu_nodegroup:GpuNodeGroup"]
    [p4de] = [r for r in p4de_result.of_type(NG) if r.parent_type == "eks-ddp:gpu_nodegroup:GpuNodeGroup"]
    assert p4de.inputs["nodeRepairConfig"] == {"enabled": True, "maxParallelNodesRepairedCount": 1}
    assert dev.inputs["nodeRepairConfig"] == {"enabled": True}  # EKS's default parallelism without a reservation


def test_the_gpu_node_daemons_fit_beside_a_training_pod():
    """What the stack puts on every GPU node (the EKS add-ons' DaemonSets, the exporter) fits in what the training pod
    leaves of the smallest GPU type's allocatable CPU and memory."""
    from eks_ddp.core import catalog
    from eks_ddp.workloads.elastic_job.pods import pod_resources

    it = catalog.lookup("g4dn.xlarge")
    cpu, memory_gib, _ = pod_resources(it)
    room = scheduling.eks_allocatable(it.name)
    daemons = {**{k: v for k, v in scheduling.SYSTEM_ADDON_PODS.items() if "DaemonSet" in k},
               "dcgm-exporter (DaemonSet)": (1, {"cpu": "100m", "memory": "128Mi"})}  # the chart's requests
    used = {k: sum(scheduling.quantity(r.get(k, "0")) for _, r in daemons.values()) for k in ("cpu", "memory")}
    assert cpu + used["cpu"] <= room["cpu"], (cpu, used, room)
    assert memory_gib * 2**30 + used["memory"] <= room["memory"]


def test_the_agents_cpu_request_is_the_one_the_fit_checks_count():
    assert obs.cloudwatch_configuration()["agent"]["resources"]["requests"]["cpu"] == obs.AGENT_CPU_REQUEST
    assert scheduling.SYSTEM_ADDON_PODS["cloudwatch-agent (DaemonSet)"][1]["cpu"] == obs.AGENT_CPU_REQUEST


# --- the stack keys ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def all_off():
    """The dev stack with every observability key off (one program run)."""
    raw = set_path(stack_config("dev"), "eks-ddp:observability",
                   {"cloudwatch": False, "gpuMetrics": False, "nodeRepair": False})
    return run(raw)


def test_each_key_turns_its_part_off(all_off):
    assert [a.inputs["addonName"] for a in all_off.of_type(ADDON)
            if a.inputs["addonName"] in (k8s_versions.CLOUDWATCH_OBSERVABILITY, k8s_versions.NODE_MONITORING_AGENT)] == []
    assert [g for g in all_off.of_type(LOG_GROUP) if g.parent_type == PARENT] == []
    assert [r for r in all_off.of_type(RELEASE) if r.inputs["chart"] == obs.DCGM_EXPORTER_CHART] == []
    assert "containerLogs" not in all_off.outputs
    [gpu] = [r for r in all_off.of_type(NG) if r.parent_type == "eks-ddp:gpu_nodegroup:GpuNodeGroup"]
    assert gpu.inputs["nodeRepairConfig"] == {"enabled": False}  # sent, so turning it off reaches EKS
