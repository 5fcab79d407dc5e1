"""ClusterAddons under mocks: pinned device plugin releases, EFA only on demand, metrics-server add-on."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s
import pytest

from eks_ddp.infra import addons as addons_mod
from eks_ddp.infra.addons import ClusterAddons, ClusterAddonsArgs
from eks_ddp.tooling.mocks import run_program

RELEASE = "kubernetes:helm.sh/v3:Release"
PARENT = "eks-ddp:addons:ClusterAddons"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _run(efa: bool):
    def program():
        provider = k8s.Provider("k8s", kubeconfig="{}")
        ClusterAddons("addons", ClusterAddonsArgs(cluster_name="eks-ddp-test", efa=efa),
                      opts=pulumi.ResourceOptions(providers={"kubernetes": provider}))

    return run_program({}, program=program)


@pytest.fixture(scope="module")
def plain():
    return _run(efa=False)


@pytest.fixture(scope="module")
def with_efa():
    return _run(efa=True)


def _release(result, chart):
    return next(r for r in result.of_type(RELEASE) if r.inputs["chart"] == chart)


def test_nvidia_device_plugin_pinned_tolerates_taint_and_selects_gpu_nodes(plain):
    rel = _release(plain, "nvidia-device-plugin").inputs
    assert rel["version"] == addons_mod.NVIDIA_DEVICE_PLUGIN_VERSION
    assert rel["version"][0].isdigit()  # NVIDIA's index has no leading "v"
    assert rel["repositoryOpts"]["repo"] == "https://nvidia.github.io/k8s-device-plugin"
    values = rel["values"]
    assert GPU_TOLERATION in values["tolerations"]
    assert values["nodeSelector"] == {"eks-ddp/pool": "gpu"}
    assert values["image"] == {"repository": "nvcr.io/nvidia/k8s-device-plugin", "tag": "v0.17.2"}
    term = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": "eks-ddp/pool", "operator": "In", "values": ["gpu"]}]}]


def test_no_efa_plugin_without_efa(plain):
    assert [r.inputs["chart"] for r in plain.of_type(RELEASE)] == ["nvidia-device-plugin"]


def test_efa_plugin_pinned_when_efa(with_efa):
    rel = _release(with_efa, "aws-efa-k8s-device-plugin").inputs
    assert rel["version"] == addons_mod.EFA_DEVICE_PLUGIN_VERSION
    assert rel["repositoryOpts"]["repo"] == "https://aws.github.io/eks-charts"
    assert rel["values"] == {"tolerations": [GPU_TOLERATION], "nodeSelector": {"eks-ddp/pool": "gpu"}, "image": {
        "repository": "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin", "tag": "v0.5.20"}}


def test_metrics_server_is_a_pinned_eks_addon(plain):
    addon = plain.one("aws:eks/addon:Addon").inputs
    assert addon["addonName"] == "metrics-server"
    assert addon["addonVersion"] == "v0.0.0-eksbuild.default-1.35"  # EKS's default build for 1.35 (M12)
    assert addon["clusterName"] == "eks-ddp-test"


def test_every_version_is_pinned(with_efa):
    for r in with_efa.of_type(RELEASE):
        assert r.inputs.get("version"), r.name
        assert r.inputs["version"] != "latest"


def test_every_child_has_the_addons_as_parent(with_efa):
    for r in with_efa.resources:
        if r.type not in (PARENT, "pulumi:providers:kubernetes"):
            assert r.parent_type == PARENT, r.urn


def test_device_plugins_wait_for_the_gpu_groups_with_a_long_helm_wait(p4de_result):
    # Review m6: a GPU node joining while Helm waits on the DaemonSet makes the atomic release roll back.
    gpu_groups = [r.urn for r in p4de_result.of_type("aws:eks/nodeGroup:NodeGroup") if "gpu-" in r.name]
    assert gpu_groups
    releases = p4de_result.of_type("kubernetes:helm.sh/v3:Release")
    plugins = [r for r in releases if "device-plugin" in r.name]
    assert {r.name for r in plugins} == {"addons-nvidia-device-plugin", "addons-efa-device-plugin"}
    for r in plugins:
        assert set(gpu_groups) <= set(r.dependencies), r.name
        assert r.inputs["timeout"] >= 600 and r.inputs["atomic"] is True


@pytest.mark.parametrize("region,repository", [
    ("us-gov-west-1", "013241004608.dkr.ecr.us-gov-west-1.amazonaws.com/eks/aws-efa-k8s-device-plugin"),
    ("cn-north-1", "918309763551.dkr.ecr.cn-north-1.amazonaws.com.cn/eks/aws-efa-k8s-device-plugin"),
])
def test_efa_plugin_image_comes_from_the_partitions_own_registry(region, repository):
    """The chart's default image is in commercial us-west-2, which aws-cn and aws-us-gov credentials cannot pull:
    there the region's EKS add-on registry serves it (and the node role's regional grant covers it)."""
    from eks_ddp.infra.cluster import node_image_pull_policy
    from eks_ddp.tooling.contracts.iam_policy import ALLOW, Request, evaluate
    from eks_ddp.tooling.mocks import RecordingMocks

    def program():
        provider = k8s.Provider("k8s", kubeconfig="{}")
        ClusterAddons("addons", ClusterAddonsArgs(cluster_name="eks-ddp-test", efa=True),
                      opts=pulumi.ResourceOptions(providers={"kubernetes": provider}))

    result = run_program({}, program=program, region=region, mocks=RecordingMocks(region=region))
    assert _release(result, "aws-efa-k8s-device-plugin").inputs["values"]["image"] == {"repository": repository, "tag": "v0.5.20"}
    part = "aws-cn" if region.startswith("cn-") else "aws-us-gov"
    account = repository.split(".", 1)[0]
    repo_arn = f"arn:{part}:ecr:{region}:{account}:repository/eks/aws-efa-k8s-device-plugin"
    pull = evaluate(node_image_pull_policy(region, part), Request("node", "ecr:BatchGetImage", repo_arn))
    assert pull.effect == ALLOW
