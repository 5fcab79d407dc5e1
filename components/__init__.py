"""eks-ddp: Pulumi components for elastic PyTorch DDP training on AWS EKS.

Import the components from here::

    from components import Network, EksCluster, GpuNodeGroup, EfsStore, ClusterAddons
    from components import TrainerImage, EtcdRendezvous, ElasticJob

Imports are lazy so that the pure modules (config, catalog, torchrun) load
without pulling in the Pulumi providers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Network": "network", "NetworkArgs": "network",
    "EksCluster": "cluster", "EksClusterArgs": "cluster",
    "GpuNodeGroup": "gpu_nodegroup", "GpuNodeGroupArgs": "gpu_nodegroup",
    "EfsStore": "efs", "EfsStoreArgs": "efs",
    "ClusterAddons": "addons", "ClusterAddonsArgs": "addons",
    "ClusterAutoscaler": "autoscaler", "ClusterAutoscalerArgs": "autoscaler",
    "TrainerImage": "image", "TrainerImageArgs": "image",
    "EtcdRendezvous": "etcd", "EtcdRendezvousArgs": "etcd",
    "ElasticJob": "elastic_job", "ElasticJobArgs": "elastic_job",
    "ResultsBucket": "results", "ResultsBucketArgs": "results",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'components' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
