"""Capacity on demand: the cluster autoscaler release and its IAM role, scale-from-zero tags on every GPU
group, GPU groups created at zero, data prep on the system nodes, and the pod-to-group decision on the real
rendered pods of both stacks."""

from __future__ import annotations

import json
from functools import cache

import pytest

from eks_ddp.config import SUPPORTED_KUBERNETES_VERSIONS
from eks_ddp.core import catalog, scheduling
from eks_ddp.infra import autoscaler
from eks_ddp.tooling.mocks import ProgramResult, _node_group
from eks_ddp.tooling.plan import render_manifests
from tests.support.util import at_version, run, set_path, stack_config

STACKS = ("dev", "p4de")
TAG = "aws:autoscaling/tag:Tag"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


@cache
def program(stack: str) -> ProgramResult:
    return run(stack_config(stack), stack)


def cluster_name(stack: str) -> str:
    return f"eks-ddp-{stack}"


def release(result: ProgramResult) -> dict:
    return result.one("kubernetes:helm.sh/v3:Release", "autoscaler-release").inputs


def gpu_groups(result: ProgramResult) -> list:
    return [g for g in result.of_type(NODE_GROUP) if g.inputs.get("amiType", "").endswith("NVIDIA")]


def asg_name(group) -> str:
    """The Auto Scaling group name the mocks give this node group (EKS's eks-<group>-<uuid>)."""
    return _node_group(None, group.name, group.inputs)[1]["resources"][0]["autoscalingGroups"][0]["name"]


def asg_tags(result: ProgramResult, group) -> dict[str, str]:
    tags = {}
    for t in result.of_type(TAG):
        if t.inputs["autoscalingGroupName"] == asg_name(group):
            assert t.inputs["tag"]["propagateAtLaunch"] is False
            tags[t.inputs["tag"]["key"]] = t.inputs["tag"]["value"]
    return tags


def pods(stack: str) -> dict[str, dict]:
    """Pod specs of the rendered manifests, as `make plan` writes them."""
    out = {}
    for m in render_manifests(program(stack)):
        name = m["metadata"]["name"]
        if m["kind"] == "Job":
            out[name] = m["spec"]["template"]["spec"]
        elif m["kind"] == "CronJob":
            out[name] = m["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        elif m["kind"] in ("StatefulSet", "Deployment"):
            out[name] = m["spec"]["template"]["spec"]
    return out


def template(stack: str, group_name: str | None = None) -> scheduling.TemplateNode:
    result = program(stack)
    group = next(g for g in gpu_groups(result)
                 if group_name is None or g.inputs["labels"]["eks-ddp/node-group"] == group_name)
    return scheduling.TemplateNode.from_tags(asg_tags(result, group), group.inputs["instanceTypes"][0],
                                             name=group.name)


def named(stack: str, role: str) -> dict:
    """The rendered pod spec of one of the job's parts: train, prepare-data or evaluate."""
    job_name = "training-" + json_run_id(stack) if role == "train" else f"training-{role}"
    return pods(stack)[job_name]


def json_run_id(stack: str) -> str:
    return stack_config(stack)["eks-ddp:job"]["runId"]


# --- the release and its role ---------------------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_autoscaler_release_pinned_on_the_system_nodes_discovering_this_cluster(stack):
    r = release(program(stack))
    version = stack_config(stack)["eks-ddp:cluster"].get("kubernetesVersion", "1.35")
    assert (r["chart"], r["version"]) == ("cluster-autoscaler", autoscaler.CHART_VERSIONS[version])
    assert r["repositoryOpts"]["repo"] == "https://kubernetes.github.io/autoscaler"
    v = r["values"]
    assert v["cloudProvider"] == "aws" and v["awsRegion"] == stack_config(stack)["aws:region"]
    version = stack_config(stack)["eks-ddp:cluster"].get("kubernetesVersion", "1.35")
    assert v["image"] == {"repository": "registry.k8s.io/autoscaling/cluster-autoscaler",
                          "tag": autoscaler.PINS[version].image_reference}
    assert autoscaler.IMAGE_TAGS[version].startswith(f"v{version}.")
    assert v["image"]["tag"].startswith(f"{autoscaler.IMAGE_TAGS[version]}@sha256:") == (
        autoscaler.PINS[version].image_digest is not None)
    assert v["nodeSelector"] == {"eks-ddp/pool": "system"}
    assert v["autoDiscovery"] == {"clusterName": cluster_name(stack), "tags": [
        "k8s.io/cluster-autoscaler/enabled", f"k8s.io/cluster-autoscaler/{cluster_name(stack)}"]}
    sa = v["rbac"]["serviceAccount"]
    assert sa["name"] == "cluster-autoscaler" and sa["annotations"]["eks.amazonaws.com/role-arn"].endswith(
        ":role/autoscaler-role")
    assert v["extraArgs"]["scale-down-unneeded-time"] == "10m"
    assert v["resources"]["requests"] == {"cpu": "100m", "memory": "300Mi"}


def test_scale_down_time_comes_from_config():
    raw = set_path(stack_config("dev"), "eks-ddp:cluster.scaleDownUnneededTime", "1h")
    v = release(run(raw))["values"]
    assert v["extraArgs"]["scale-down-unneeded-time"] == "1h"
    assert v["extraArgs"]["scale-down-delay-after-add"] == "1h"


def test_image_tag_matches_every_allowed_kubernetes_version():
    for version in SUPPORTED_KUBERNETES_VERSIONS:
        tag = autoscaler.image_tag(version)
        assert tag.startswith(f"v{version}."), (version, tag)
    with pytest.raises(ValueError, match="kubernetes_version: got '1.29'"):
        autoscaler.image_tag("1.29")
    raw = at_version(stack_config("dev"), "1.32")
    assert release(run(raw))["values"]["image"]["tag"] == "v1.32.7"


@pytest.mark.parametrize("stack", STACKS)
def test_iam_policy_is_least_privilege_and_scoped_to_this_clusters_groups(stack):
    result = program(stack)
    policy = json.loads(result.one("aws:iam/rolePolicy:RolePolicy", "autoscaler-policy").inputs["policy"])
    describe, nodegroups, mutate = policy["Statement"]
    # Reads: only Describe/Get calls, which take no resource ARN.
    assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in describe["Action"])
    assert describe["Resource"] == "*" and "Condition" not in describe
    # The one read that takes an ARN: this cluster's node groups only.
    region = stack_config(stack)["aws:region"]
    assert nodegroups["Action"] == ["eks:DescribeNodegroup"] and "eks:DescribeNodegroup" not in describe["Action"]
    assert nodegroups["Resource"] == f"arn:aws:eks:{region}:*:nodegroup/{cluster_name(stack)}/*/*"
    # Writes: exactly the two the autoscaler needs, and only on ASGs tagged as this cluster's.
    assert sorted(mutate["Action"]) == ["autoscaling:SetDesiredCapacity",
                                        "autoscaling:TerminateInstanceInAutoScalingGroup"]
    assert mutate["Condition"] == {"StringEquals": {
        f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name(stack)}": "owned"}}
    assert not any("*" in a for s in policy["Statement"] for a in s["Action"])
    trust = json.loads(result.one("aws:iam/role:Role", "autoscaler-role").inputs["assumeRolePolicy"])
    condition = trust["Statement"][0]["Condition"]["StringEquals"]
    assert [v for k, v in condition.items() if k.endswith(":sub")] == [
        "system:serviceaccount:kube-system:cluster-autoscaler"]


# --- node groups: created at zero, tagged for scale from zero ---------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_gpu_groups_start_at_zero(stack):
    groups = gpu_groups(program(stack))
    assert groups
    for g in groups:
        assert g.inputs["scalingConfig"]["desiredSize"] == 0 and g.inputs["scalingConfig"]["minSize"] == 0


def test_desired_size_defaults_to_zero():
    raw = stack_config("dev")
    group = {k: v for k, v in raw["eks-ddp:nodeGroups"][0].items() if k != "desiredSize"}
    raw = set_path(raw, "eks-ddp:nodeGroups", [group])
    assert [g.inputs["scalingConfig"]["desiredSize"] for g in gpu_groups(run(raw))] == [0]


@pytest.mark.parametrize("stack", STACKS)
def test_every_gpu_group_asg_carries_its_node_template(stack):
    result = program(stack)
    for g in gpu_groups(result):
        it = catalog.lookup(g.inputs["instanceTypes"][0]) if g.inputs.get("instanceTypes") else None
        tags = asg_tags(result, g)
        for key, value in g.inputs["labels"].items():
            assert tags[f"k8s.io/cluster-autoscaler/node-template/label/{key}"] == value
        assert tags["k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"] == "true:NoSchedule"
        assert tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == str(it.gpus)
        assert tags["k8s.io/cluster-autoscaler/node-template/resources/ephemeral-storage"].endswith("Gi")
        efa = "k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"
        assert tags.get(efa) == (str(it.efa_interfaces) if stack == "p4de" else None)
    # Each tag resource is named by its key, so adding a label later leaves the others in place.
    names = {t.name for t in result.of_type(TAG)}
    assert "gpu-gpu-label-eks-ddp-pool" in names or "gpu-a100-label-eks-ddp-pool" in names


# --- the decision, on the rendered pods -----------------------------------------------------------------

@pytest.mark.parametrize("stack", STACKS)
def test_autoscaler_would_bring_up_the_job_group_for_training_and_evaluation(stack):
    node = template(stack)
    for role in ("train", "evaluate"):
        decision = scheduling.would_scale_up(named(stack, role), node)
        assert decision, (role, decision.reasons)


def test_the_training_pod_with_its_fabric_check_still_brings_up_the_efa_group():
    """The fabric check runs as the training pods' init container, sized like the trainer: the pod's requests
    (the larger of the init container's and the containers') still fit the EFA group's nodes."""
    train = named("p4de", "train")
    assert [c["name"] for c in train["initContainers"]] == ["fabric-check"]
    assert train["initContainers"][0]["resources"] == train["containers"][0]["resources"]
    decision = scheduling.would_scale_up(train, template("p4de"))
    assert decision, decision.reasons


@pytest.mark.parametrize("stack", STACKS)
def test_data_prep_never_triggers_a_gpu_node_and_fits_a_system_node(stack):
    prep = named(stack, "prepare-data")
    decision = scheduling.would_scale_up(prep, template(stack))
    assert not decision
    assert any("nvidia.com/gpu" in r for r in decision.reasons)
    system_type = stack_config(stack)["eks-ddp:cluster"]["systemInstanceType"]
    system = scheduling.TemplateNode(labels={"eks-ddp/pool": "system"}, taints=(),
                                     allocatable=scheduling.eks_allocatable(system_type))
    assert scheduling.would_scale_up(prep, system)


def test_a_pod_the_group_cannot_serve_is_refused():
    dev = template("dev")
    p4de_train = named("p4de", "train")
    decision = scheduling.would_scale_up(p4de_train, dev)
    assert not decision
    reasons = " ".join(decision.reasons)
    assert "nvidia.com/gpu=8" in reasons and "vpc.amazonaws.com/efa" in reasons and "nodeSelector" in reasons
    untolerant = {**named("dev", "train"), "tolerations": []}
    assert not scheduling.would_scale_up(untolerant, dev)
    # Without the label tags, the nodeSelector matches nothing: the group would never scale up from zero.
    bare = scheduling.TemplateNode(labels={}, taints=dev.taints, allocatable=dev.allocatable)
    assert not scheduling.would_scale_up(named("dev", "train"), bare)


# --- the system nodes: what must run there fits the dev stack's single t3.medium ------------------------

def test_dev_system_node_holds_everything_that_must_run_there():
    stack_pods = {name: scheduling.pod_requests(spec) for name, spec in pods("dev").items()
                  if spec.get("nodeSelector") == {"eks-ddp/pool": "system"}}
    assert any(n.endswith("-prepare-data") for n in stack_pods) and any("etcd" in n for n in stack_pods)
    stack_pods["cluster-autoscaler"] = {k: scheduling.quantity(v)
                                        for k, v in autoscaler.RESOURCES["requests"].items()}
    cluster = stack_config("dev")["eks-ddp:cluster"]
    count = cluster.get("systemNodeCount", 2)
    load = scheduling.system_load(stack_pods, count)
    room = {k: v * count for k, v in scheduling.eks_allocatable(cluster["systemInstanceType"]).items()}
    for k in ("cpu", "memory", "pods"):
        assert load[k] <= room[k], (k, load[k], room[k])
    # and it is a real choice: the next size down (t3.small, 2 GiB) could not hold the data prep pod alone
    assert load["memory"] > 2 * 2**30


def test_node_group_arns_name_the_regions_partition():
    for region, part in [("us-west-2", "aws"), ("cn-north-1", "aws-cn"), ("us-gov-west-1", "aws-us-gov")]:
        statement = autoscaler.iam_policy("c", region)["Statement"][1]
        assert statement["Resource"] == f"arn:{part}:eks:{region}:*:nodegroup/c/*/*"


def _group_variant(stack: str, **changes) -> dict:
    raw = stack_config(stack)
    for key, value in changes.items():
        raw = set_path(raw, f"eks-ddp:nodeGroups[0].{key}", value)
    return raw


@pytest.mark.parametrize("stack,changes", [
    # A capacity block: no instanceTypes on the node group (the launch template names the type).
    ("p4de", {"capacityType": "capacityBlock"}),
    # Spot from several types of one GPU shape.
    ("dev", {"capacityType": "spot", "instanceType": "g5.xlarge", "spotInstanceTypes": ["g5.2xlarge", "g5.4xlarge"]}),
])
def test_capacity_block_and_multi_type_spot_groups_scale_from_zero_for_training(stack, changes):
    """Every group the config can make carries its node template, and the training pod would bring it up."""
    raw = _group_variant(stack, **changes)
    result = run(raw, stack)
    (group,) = gpu_groups(result)
    instance_type = raw["eks-ddp:nodeGroups"][0]["instanceType"]
    it = catalog.lookup(instance_type)
    tags = asg_tags(result, group)
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == str(it.gpus)
    assert tags["k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"] == "true:NoSchedule"
    node = scheduling.TemplateNode.from_tags(tags, instance_type, name=group.name)
    train = next(m["spec"]["template"]["spec"] for m in render_manifests(result)
                 if m["kind"] == "Job" and m["metadata"]["name"] == "training-" + json_run_id(stack))
    decision = scheduling.would_scale_up(train, node)
    assert decision, decision.reasons
