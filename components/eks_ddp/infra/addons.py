"""Cluster add-ons the GPU nodes and the training job need.

* **NVIDIA device plugin** (pinned Helm release): advertises ``nvidia.com/gpu``
  on the GPU nodes. It tolerates the GPU taint and is pinned by node affinity to
  ``eks-ddp/pool=gpu``: the chart's default affinity wants Node Feature
  Discovery labels that EKS nodes lack, so the default would schedule nowhere.
* **EFA device plugin** (pinned Helm release, only with ``efa``): advertises
  ``vpc.amazonaws.com/efa``; the chart itself limits it to EFA instance types.
* **metrics-server** as the EKS add-on: AWS ships it as an EKS community add-on
  (``aws eks describe-addon-versions --addon-name metrics-server``), so it is
  versioned and upgraded like the other add-ons, with no chart repository to
  trust. It runs on the system nodes.

The Kubernetes provider comes from ``opts`` (``providers={"kubernetes": ...}``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from eks_ddp.core import k8s_versions, rules
from eks_ddp.infra.addon_version import addon_version
from eks_ddp.infra.cluster import addon_registry_account

NVIDIA_DEVICE_PLUGIN_CHART = "nvidia-device-plugin"
NVIDIA_DEVICE_PLUGIN_REPO = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_DEVICE_PLUGIN_VERSION = "0.17.2"
"""Chart version (no leading 'v' in NVIDIA's index)."""
NVIDIA_DEVICE_PLUGIN_IMAGE_REPOSITORY = "nvcr.io/nvidia/k8s-device-plugin"
NVIDIA_DEVICE_PLUGIN_IMAGE_TAG = f"v{NVIDIA_DEVICE_PLUGIN_VERSION}"
"""The image the chart runs by default (NVIDIA/k8s-device-plugin ``deployments/helm/nvidia-device-plugin/values.yaml``:
``image.repository: nvcr.io/nvidia/k8s-device-plugin``, ``tag: ""`` "whose default is the chart appVersion"),
rendered explicitly. Pinned by tag only: no public record of this tag's digest could be read here, so none is
invented; preflight resolves the tag against nvcr.io before ``up``, logs the digest the nodes will pull, and fails
when the tag does not resolve (tooling/preflight/pins.py ``TAGGED``)."""

EFA_DEVICE_PLUGIN_CHART = "aws-efa-k8s-device-plugin"
EFA_DEVICE_PLUGIN_REPO = "https://aws.github.io/eks-charts"
EFA_DEVICE_PLUGIN_VERSION = "v0.5.20"
"""Chart version as eks-charts publishes it (with a leading 'v')."""

EFA_PLUGIN_REPOSITORY = "eks/aws-efa-k8s-device-plugin"
EFA_PLUGIN_DEFAULT_IMAGE_REPOSITORY = f"602401143452.dkr.ecr.us-west-2.amazonaws.com/{EFA_PLUGIN_REPOSITORY}"
"""The chart's ``image.repository`` (aws/eks-charts ``stable/aws-efa-k8s-device-plugin/values.yaml``)."""
EFA_PLUGIN_IMAGE_TAG = EFA_DEVICE_PLUGIN_VERSION
"""The image tag rendered for the pinned chart (its appVersion, which its values.yaml sets as ``image.tag``).
Pinned by tag only: the image sits in EKS's private registry, which publishes no digests this project could read;
preflight resolves the tag there with the caller's ECR credentials before ``up`` (the registry answers anonymous
requests with a Basic challenge), logs the digest, and fails when it does not resolve (tooling/preflight/pins.py)."""


def efa_plugin_image(region: str) -> str:
    """``<repository>:<tag>`` of the EFA plugin image a stack in ``region`` renders."""
    return f"{efa_plugin_image_repository(region) or EFA_PLUGIN_DEFAULT_IMAGE_REPOSITORY}:{EFA_PLUGIN_IMAGE_TAG}"


def efa_plugin_image_repository(region: str) -> str | None:
    """Where the EFA plugin image comes from: the chart's default (the us-west-2 EKS registry, ``image.repository``
    in eks-charts ``stable/aws-efa-k8s-device-plugin``) in the commercial partition; in aws-cn and aws-us-gov,
    whose credentials cannot pull from it, the region's own EKS add-on registry (its account, the partition's
    DNS suffix), which the node role may pull from."""
    part = rules.partition(region)
    if part == "aws":
        return None
    return f"{addon_registry_account(region)}.dkr.ecr.{region}.{rules.dns_suffix(part)}/{EFA_PLUGIN_REPOSITORY}"


ADDON_NAMESPACE = "kube-system"
GPU_POOL_LABEL = ("eks-ddp/pool", "gpu")
DEVICE_PLUGIN_TIMEOUT_S = 900
"""Helm wait for the device-plugin DaemonSets (default 300 s): room for a GPU node that joins late to pull
the plugin image and become ready before the atomic release gives up."""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True, kw_only=True)
class ClusterAddonsArgs:
    """Inputs of :class:`ClusterAddons`."""

    cluster_name: pulumi.Input[str]
    """EKS cluster for the EKS add-ons."""
    efa: bool = False
    """Install the EFA device plugin (any node group uses EFA)."""
    kubernetes_version: str = k8s_versions.DEFAULT_VERSION
    """The cluster's Kubernetes version: picks the EKS add-on builds made for it."""
    gpu_node_groups: Sequence[pulumi.Resource] = ()
    """GPU node groups the device-plugin releases wait for: a node joining while Helm waits on the
    DaemonSet has a not-yet-ready pod, and an atomic release then rolls back and fails ``pulumi up``."""


def gpu_daemonset_values() -> dict:
    """Scheduling values shared by the device plugin charts: GPU nodes only, tolerating their taint."""
    key, value = GPU_POOL_LABEL
    return {
        "tolerations": [dict(GPU_TOLERATION)],
        "nodeSelector": {key: value},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}}},
    }


class ClusterAddons(pulumi.ComponentResource):
    """Device plugins (NVIDIA, optionally EFA) and metrics-server."""

    release_names: list[pulumi.Output[str]]

    def __init__(self, name: str, args: ClusterAddonsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:addons:ClusterAddons", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        def release(suffix: str, release_name: str, chart: str, version: str, repo: str,
                    values: dict) -> k8s.helm.v3.Release:
            return k8s.helm.v3.Release(
                f"{name}-{suffix}", name=release_name, chart=chart, version=version,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=repo), namespace=ADDON_NAMESPACE,
                values=values, atomic=True, timeout=DEVICE_PLUGIN_TIMEOUT_S,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.gpu_node_groups)))

        nvidia = release("nvidia-device-plugin", "nvidia-device-plugin", NVIDIA_DEVICE_PLUGIN_CHART,
                         NVIDIA_DEVICE_PLUGIN_VERSION, NVIDIA_DEVICE_PLUGIN_REPO,
                         {**gpu_daemonset_values(), "image": {"repository": NVIDIA_DEVICE_PLUGIN_IMAGE_REPOSITORY,
                                                              "tag": NVIDIA_DEVICE_PLUGIN_IMAGE_TAG}})
        self.release_names = [nvidia.name]

        if args.efa:
            # The chart builds its own instance-type affinity; it reads only these two scheduling values.
            values = {k: v for k, v in gpu_daemonset_values().items() if k in ("tolerations", "nodeSelector")}
            region = aws.get_region(opts=pulumi.InvokeOptions(parent=self)).region
            repository, tag = efa_plugin_image(region).rsplit(":", 1)
            values["image"] = {"repository": repository, "tag": tag}
            efa = release("efa-device-plugin", "aws-efa-k8s-device-plugin", EFA_DEVICE_PLUGIN_CHART,
                          EFA_DEVICE_PLUGIN_VERSION, EFA_DEVICE_PLUGIN_REPO, values)
            self.release_names.append(efa.name)

        aws.eks.Addon(
            f"{name}-metrics-server",
            cluster_name=args.cluster_name,
            addon_name="metrics-server",
            addon_version=addon_version(k8s_versions.METRICS_SERVER, args.kubernetes_version,
                                                     opts=pulumi.InvokeOptions(parent=self)),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            opts=child)

        self.register_outputs({"release_names": self.release_names})
