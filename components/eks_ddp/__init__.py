"""eks_ddp: Pulumi components for elastic PyTorch DDP training on AWS EKS.

Installed as ``eks_ddp`` (``pip install eks-ddp``; the repository's ``components/`` folder). Import the
components from here::

    from eks_ddp import Network, EksCluster, GpuNodeGroup, EfsStore, ClusterAddons, ClusterAutoscaler
    from eks_ddp import TrainerImage, EtcdRendezvous, ElasticJob, ResultsBucket
    from eks_ddp import Placement, Size, PerRunClaims, WholeVolume, EtcdStore, C10d, Results, Queued   # its parts
    from eks_ddp import RunQueue   # Kueue's queue for the runs: flavors and quotas from the GPU groups, priorities
    from eks_ddp import training_namespace, data_stage_role, workload_policy   # its namespace, roles, policies
    from eks_ddp import Workload, S3Data, Cifar10Data, Egress, cifar10_workload   # what an ElasticJob trains
    from eks_ddp import WorkloadImage   # your image: the nodes' pull grant and the ECR scan gate
    from eks_ddp import Observability   # container logs in CloudWatch, GPU metrics, the node monitoring agent
    from eks_ddp import Kueue   # the job queueing controller (queued runs, all-or-nothing GPU admission)

The names are plain imports (type checkers and IDEs see every class; the package ships ``py.typed``).
Importing ``eks_ddp`` loads Pulumi and its AWS/EKS/Kubernetes SDKs, never torch: the trainer is the
separate ``eks_ddp_trainer`` package.
"""

from __future__ import annotations

from eks_ddp.core.workload import Cifar10Data, Egress, S3Data, Workload, cifar10_workload
from eks_ddp.infra.addons import ClusterAddons, ClusterAddonsArgs
from eks_ddp.infra.autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from eks_ddp.infra.cluster import EksCluster, EksClusterArgs
from eks_ddp.infra.efs import EfsStore, EfsStoreArgs
from eks_ddp.infra.gpu_nodegroup import GpuNodeGroup, GpuNodeGroupArgs
from eks_ddp.infra.iam import data_stage_role, workload_policy
from eks_ddp.infra.image import TrainerImage, TrainerImageArgs
from eks_ddp.infra.kueue import Kueue, KueueArgs
from eks_ddp.infra.network import Network, NetworkArgs
from eks_ddp.infra.observability import Observability, ObservabilityArgs
from eks_ddp.infra.results import ResultsBucket, ResultsBucketArgs
from eks_ddp.infra.workload_image import WorkloadImage, WorkloadImageArgs
from eks_ddp.workloads.elastic_job import (
    C10d,
    ElasticJob,
    ElasticJobArgs,
    EtcdStore,
    PerRunClaims,
    Placement,
    Queued,
    Results,
    Size,
    WholeVolume,
)
from eks_ddp.workloads.etcd import EtcdRendezvous, EtcdRendezvousArgs
from eks_ddp.workloads.namespace import training_namespace
from eks_ddp.workloads.queue import RunQueue, RunQueueArgs

__all__ = [
    "ClusterAddons", "ClusterAddonsArgs", "ClusterAutoscaler", "ClusterAutoscalerArgs", "EfsStore", "EfsStoreArgs",
    "EksCluster", "EksClusterArgs", "ElasticJob", "ElasticJobArgs", "EtcdRendezvous", "EtcdRendezvousArgs",
    "GpuNodeGroup", "GpuNodeGroupArgs", "Network", "NetworkArgs", "ResultsBucket", "ResultsBucketArgs",
    "TrainerImage", "TrainerImageArgs", "Workload", "S3Data", "Cifar10Data", "cifar10_workload", "Egress",
    "WorkloadImage", "WorkloadImageArgs", "Observability", "ObservabilityArgs", "Kueue", "KueueArgs",
    "Placement", "Size", "PerRunClaims", "WholeVolume", "EtcdStore", "C10d", "Results", "Queued", "RunQueue",
    "RunQueueArgs",
    "data_stage_role", "workload_policy", "training_namespace",
]
