"""The choices a stack file and the components' Args share, declared once.

The stack config (``eks_ddp.config``) validates its keys against these, and the components' Args annotate their
fields with them; ``typing.get_args(CapacityType)`` lists the allowed values.
"""

from __future__ import annotations

from typing import Literal

from eks_ddp_trainer.config import ModelName  # noqa: F401 (the bundled trainer's models, declared there once)

CapacityType = Literal["onDemand", "spot", "capacityBlock"]
"""How a GPU node group buys its instances."""
NatMode = Literal["single", "perAz"]
"""One NAT gateway for the new VPC, or one per zone."""
LocalStorage = Literal["RAID0", "none"]
"""What a GPU node does with its NVMe instance store: stripe it as RAID0 for the pods, or leave it."""
StorageBackend = Literal["efs", "fsxLustre"]
"""The shared volume: EFS (elastic), or FSx for Lustre (provisioned throughput)."""
RdzvBackend = Literal["etcd", "c10d"]
"""The rendezvous a run's agents meet through: an etcd v3 store of the run's own, or c10d (no etcd)."""
Priority = Literal["low", "normal", "high"]
"""A run's place in the queue: its Kueue WorkloadPriorityClass ``eks-ddp-<priority>``."""
QueuePreemption = Literal["never", "lowerPriority"]
"""Whether a queued run may evict a running run of lower priority (the ClusterQueue's withinClusterQueue)."""
RunState = Literal["run", "cancelled"]
"""Whether a run's training Job exists."""
ScanSeverity = Literal["CRITICAL", "HIGH", "MEDIUM", "LOW", "INFORMATIONAL", "disabled"]
"""The lowest ECR scan severity that stops an image from running; 'disabled' runs it unchecked."""
UpgradePolicy = Literal["STANDARD", "EXTENDED"]
"""The EKS upgrade policy (support type) of a cluster."""
WorkloadKind = Literal["cifar10", "custom"]
"""The bundled CIFAR-10 trainer, or an entrypoint of your own."""
