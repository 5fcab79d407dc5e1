"""eks_ddp: Pulumi components for elastic PyTorch DDP training on AWS EKS.

Installed as ``eks_ddp`` (``pip install eks-ddp``; the repository's ``components/`` folder). Import the
components from here::

    from eks_ddp import Network, EksCluster, GpuNodeGroup, EfsStore, ClusterAddons, ClusterAutoscaler
    from eks_ddp import TrainerImage, EtcdRendezvous, ElasticJob, ResultsBucket
    from eks_ddp import Workload, S3Data, Cifar10Data, Egress, cifar10_workload   # what an ElasticJob trains
    from eks_ddp import WorkloadImage   # your image: the nodes' pull grant and the ECR scan gate

The names are plain imports (type checkers and IDEs see every class; the package ships ``py.typed``).
Importing ``eks_ddp`` loads Pulumi and its AWS/EKS/Kubernetes SDKs, never torch: the trainer is the
separate ``eks_ddp_trainer`` package.
"""

from __future__ import annotations

from .addons import ClusterAddons, ClusterAddonsArgs
from .autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from .cluster import EksCluster, EksClusterArgs
from .efs import EfsStore, EfsStoreArgs
from .elastic_job import ElasticJob, ElasticJobArgs
from .etcd import EtcdRendezvous, EtcdRendezvousArgs
from .gpu_nodegroup import GpuNodeGroup, GpuNodeGroupArgs
from .image import TrainerImage, TrainerImageArgs
from .network import Network, NetworkArgs
from .results import ResultsBucket, ResultsBucketArgs
from .workload import Cifar10Data, Egress, S3Data, Workload, cifar10_workload
from .workload_image import WorkloadImage, WorkloadImageArgs

__all__ = [
    "ClusterAddons", "ClusterAddonsArgs", "ClusterAutoscaler", "ClusterAutoscalerArgs", "EfsStore", "EfsStoreArgs",
    "EksCluster", "EksClusterArgs", "ElasticJob", "ElasticJobArgs", "EtcdRendezvous", "EtcdRendezvousArgs",
    "GpuNodeGroup", "GpuNodeGroupArgs", "Network", "NetworkArgs", "ResultsBucket", "ResultsBucketArgs",
    "TrainerImage", "TrainerImageArgs", "Workload", "S3Data", "Cifar10Data", "cifar10_workload", "Egress",
    "WorkloadImage", "WorkloadImageArgs",
]
