"""The pods every Job of a run is built from: one hardened container of the image, the shared volume, sizing.

Shared by :class:`~.elastic_job.ElasticJob` and its fabric-check gate (fabric_gate.py), so neither imports the
other: every pod runs the image by digest as uid 1000 on a read-only root filesystem with writable ``emptyDir``
volumes for ``/tmp`` and ``/dev/shm``, the shared volume (per workload: the dataset read-only except in the data
stage, and the run's directory; or the whole claim), no service-account token, and Guaranteed QoS sizing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from eks_ddp.core import catalog
from eks_ddp.core.workload import INTERNET_EXCEPT
from eks_ddp.workloads.elastic_job.args import EtcdStore, Placement, Queued, Rendezvous, Storage, WholeVolume
from eks_ddp.workloads.etcd import DEFAULT_CLIENT_LABELS
from eks_ddp.workloads.namespace import restricted_container_security, restricted_pod_security
from eks_ddp_runtime.launch_command import DATA_SUBDIR, RDZV_TLS_DIR, SHARED_ROOT

TRAINER_UID = 1000
"""The trainer image's user and group."""
C10D_PORT = 29400
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPUDIRECT_RDMA_FAMILIES = ("p4d", "p4de", "p5")
"""Instance families whose EFA supports GPUDirect RDMA (FI_EFA_USE_DEVICE_RDMA=1)."""
DATA_DIR = f"{SHARED_ROOT}/{DATA_SUBDIR}"
EGRESS_EXCEPT = INTERNET_EXCEPT
"""Never reached through the HTTPS egress rule: link-local (instance metadata, the node's credentials) and every
private range a VPC or its pods can use (the API server's private endpoint, other pods, EFS, anything peered).
The project's in-cluster peers are admitted by their own rules; S3 (gateway endpoint) and STS are public ranges."""
PART_OF = {"app.kubernetes.io/part-of": "eks-ddp"}
TRAINER_LABELS: Mapping[str, str] = {**DEFAULT_CLIENT_LABELS, **PART_OF}
"""Every training pod carries these; EtcdRendezvous admits exactly them on its client port."""
JOB_IMMUTABLE_FIELDS = ("spec.completionMode", "spec.podFailurePolicy", "spec.successPolicy",
                        "spec.backoffLimitPerIndex", "spec.managedBy")
"""Job fields Kubernetes refuses to change (ValidateJobSpecUpdate, 422 "field is immutable") that the provider does
not already replace the Job for: a change to one of them replaces the Job instead of failing `pulumi up`."""
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
MIN_PARALLELISM_ANNOTATION = "kueue.x-k8s.io/job-min-parallelism"
"""Kueue v0.16.4's names (pkg/controller/constants, pkg/controller/jobs/job/job_controller.go)."""
QUEUE_REPLACE = f'metadata.labels["{QUEUE_NAME_LABEL}"]'
"""Joining or leaving a queue replaces a Job: Kueue's webhook refuses a queue-name change on a running Job and the
removal of a priority class at any time (pkg/controller/jobframework/validation.go: validateUpdateForQueueName,
ValidateUpdateForWorkloadPriorityClassName)."""


@dataclass(frozen=True)
class InitContainer:
    """An init container of a pod :meth:`PodFactory.pod` builds: its name, command, and downward-API variables besides
    the container's."""

    name: str
    command: pulumi.Input[list[str]]
    field_env: Mapping[str, str] = field(default_factory=dict)


def queued_job(queue: Queued | None, nodes: int, min_nodes: int) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(labels, annotations, ignore_changes) of a GPU Job of ``nodes`` pods through ``queue`` (None: nothing).

    Kueue (pkg/controller/jobframework/reconciler.go) unsuspends the Job when its Workload is admitted and suspends
    it again on eviction or preemption: ``spec.suspend`` is Kueue's once created. With ``min_nodes < nodes`` the
    Job takes partial admission (``job-min-parallelism``; the webhook, job_webhook.go validatePartialAdmissionCreate,
    wants 0 < min < pods): Kueue sets ``spec.parallelism`` to the count it admits (job_controller.go
    RunWithPodSetsInfo) and its webhook refuses any other change of it while the Job runs
    (validatePartialAdmissionUpdate), so an ``up`` must leave it too. The price: Pulumi's engine gives an ignored
    property its old input on a replacement too (pkg/resource/deploy/step_generator.go, processIgnoreChanges), so a
    ``nodes`` change of a queued elastic run keeps the old parallelism; cancel the run and run it again instead (a
    cancelled run's Job leaves the state, and the next one is created afresh)."""
    if queue is None:
        return {}, {}, []
    partial = min_nodes < nodes
    labels = {QUEUE_NAME_LABEL: queue.local_queue, PRIORITY_CLASS_LABEL: queue.priority_class}
    return labels, {MIN_PARALLELISM_ANNOTATION: str(min_nodes)} if partial else {}, \
        ["spec.suspend", *(["spec.parallelism"] if partial else [])]


# Writable paths on the read-only root filesystem; the image sets the same.
CACHE_ENV = {"HOME": "/tmp", "XDG_CACHE_HOME": "/tmp/.cache", "TORCH_HOME": "/tmp/torch",
             "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor", "TRITON_CACHE_DIR": "/tmp/triton",
             "MPLCONFIGDIR": "/tmp/matplotlib", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


def pod_resources(it: catalog.InstanceType) -> tuple[int, int, int]:
    """(CPU cores, memory GiB, /dev/shm GiB) for one training pod on a whole node of type ``it``.

    Leaves a tenth of the vCPUs (at least 1) and a quarter of the memory to the kubelet, the OS and the
    node daemons (VPC CNI, kube-proxy, EFS CSI, device plugins). /dev/shm is memory-backed and counts against the
    pod's memory request and limit (the same number): it holds NCCL's intra-node buffers (small) and the node's
    one snapshot of the training state (training/eks_ddp_trainer/snapshot.py), which needs twice the state while it
    is replaced. So it is sized from the instance's memory, SHM_SHARE of the pod's (p4de.24xlarge: 216 of 864 GiB),
    the rest left to the processes; a state over half of it is not snapshotted, and the run's log says so.
    """
    cpu = it.vcpus - max(1, it.vcpus // 10)
    memory = it.memory_gib * 3 // 4
    return cpu, memory, max(1, int(memory * SHM_SHARE))


SHM_SHARE = 0.25
"""The share of the training pod's memory request that /dev/shm may fill (pod_resources)."""


NCCL_NET_PLUGIN = "ofi"
"""NCCL loads ``libnccl-net-<name>.so``: the aws-ofi-nccl plugin the trainer image installs."""


def nccl_env(it: catalog.InstanceType, efa: bool) -> dict[str, str]:
    """NCCL/libfabric environment: NCCL over the EFA libfabric provider (aws-ofi-nccl) when ``efa``."""
    env = {"NCCL_DEBUG": "WARN"}
    if efa:
        env.update({
            "FI_PROVIDER": "efa",
            # The trainer forks (torchrun workers); keeps registered memory safe across fork.
            "FI_EFA_FORK_SAFE": "1",
            # NCCL's bootstrap and out-of-band sockets use the pod's VPC interface; EFA carries the data.
            "NCCL_SOCKET_IFNAME": "^lo",
            # Load aws-ofi-nccl by name (libnccl-net-ofi.so, which the image's build checks is in the linker's
            # path) instead of relying on a libnccl-net.so alias.
            "NCCL_NET_PLUGIN": NCCL_NET_PLUGIN,
        })
        if it.family in GPUDIRECT_RDMA_FAMILIES:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env


def resources(cpu: str, memory: str, extra: Mapping[str, int] | None = None) -> k8s.core.v1.ResourceRequirementsArgs:
    # Limits equal requests: Guaranteed QoS, so the kubelet evicts these pods last under node pressure.
    amounts = {"cpu": cpu, "memory": memory, **{k: str(v) for k, v in (extra or {}).items()}}
    return k8s.core.v1.ResourceRequirementsArgs(requests=dict(amounts), limits=dict(amounts))



def meta(name: str, namespace: pulumi.Input[str], labels: Mapping[str, str],
         annotations: Mapping[str, pulumi.Input[str]] | None = None) -> k8s.meta.v1.ObjectMetaArgs:
    return k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=dict(labels),
                                      annotations=dict(annotations) if annotations else None)


def one_per_node(instance: str) -> k8s.core.v1.AffinityArgs:
    """Anti-affinity on the hostname: one agent per node (GPU limits alone would allow two agents on an 8-GPU
    node asking for 4)."""
    return k8s.core.v1.AffinityArgs(pod_anti_affinity=k8s.core.v1.PodAntiAffinityArgs(
        required_during_scheduling_ignored_during_execution=[k8s.core.v1.PodAffinityTermArgs(
            topology_key="kubernetes.io/hostname",
            label_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={"app.kubernetes.io/instance": instance}))]))


@dataclass(frozen=True, kw_only=True)
class PodFactory:
    """What every pod of one run shares: namespace, image, node placement, the shared volume, service accounts."""

    namespace: pulumi.Input[str]
    image: pulumi.Input[str]
    """The stack's image (a pod may run another: ``pod(image=...)``)."""
    placement: Placement
    storage: Storage
    run_dir: str
    rendezvous: Rendezvous
    trainer_sa: pulumi.Input[str]
    """The ServiceAccount with the uploader role (training pods only)."""
    worker_sa: pulumi.Input[str]
    """The ServiceAccount without any IAM role (every other pod)."""

    def meta(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, pulumi.Input[str]] | None = None
             ) -> k8s.meta.v1.ObjectMetaArgs:
        return meta(name, self.namespace, labels, annotations)


    def pod(self, labels: Mapping[str, str], name: str, command: pulumi.Input[list[str]],
             resources: k8s.core.v1.ResourceRequirementsArgs, *, env: Mapping[str, str] | None = None,
             field_env: Mapping[str, str] | None = None, shm_gib: int = 1, restart_policy: str = "Never",
             grace_seconds: int = 30, ports: list[k8s.core.v1.ContainerPortArgs] | None = None,
             affinity: k8s.core.v1.AffinityArgs | None = None, subdomain: pulumi.Input[str] | None = None,
             on_gpu_nodes: bool = True, uploads: bool = False, writes_data: bool = False,
             rdzv_tls: bool = False, image: pulumi.Input[str] | None = None,
             service_account: pulumi.Input[str] | None = None,
             init: InitContainer | None = None) -> k8s.core.v1.PodTemplateSpecArgs:
        """A hardened single-container pod of the trainer image with /shared, /tmp and /dev/shm; on the job's
        GPU nodes (their selector, tolerating their taints), or with ``on_gpu_nodes=False`` on the system nodes.
        ``uploads``: run as the ServiceAccount with the uploader role (the training pods only).
        ``writes_data``: the data stage (the dataset read-write, no run directory). ``image``: default the stack's. ``service_account``: another than those two (the S3 data stage's).
        ``init``: an init container run first, as the container is (image, env, mounts, resources, security) with its
        own name and command and more downward-API variables (the fabric check, fabric_gate.py)."""
        v1 = k8s.core.v1
        shared_mounts, shared_volumes = self.shared_volumes(writes_data)
        env_vars = [v1.EnvVarArgs(name=k, value=v) for k, v in {**CACHE_ENV, **(env or {})}.items()]
        env_vars += [v1.EnvVarArgs(name=k, value_from=v1.EnvVarSourceArgs(
            field_ref=v1.ObjectFieldSelectorArgs(field_path=path))) for k, path in (field_env or {}).items()]
        container = v1.ContainerArgs(
            name=name, image=self.image if image is None else image, image_pull_policy="IfNotPresent", command=command,
            working_dir="/app", env=env_vars, resources=resources, ports=ports,
            volume_mounts=[*shared_mounts,
                           v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
                           v1.VolumeMountArgs(name="dshm", mount_path="/dev/shm"),
                           *self.rdzv_tls_mounts(rdzv_tls)],
            security_context=restricted_container_security(TRAINER_UID))
        init_containers = None
        if init is not None:
            init_containers = [v1.ContainerArgs(
                name=init.name, image=container.image, image_pull_policy="IfNotPresent", command=init.command,
                working_dir="/app", env=[*env_vars, *(v1.EnvVarArgs(name=k, value_from=v1.EnvVarSourceArgs(
                    field_ref=v1.ObjectFieldSelectorArgs(field_path=path))) for k, path in init.field_env.items())],
                resources=resources, volume_mounts=container.volume_mounts,
                security_context=restricted_container_security(TRAINER_UID))]
        place = self.placement
        tolerations = [v1.TolerationArgs(key=key, operator="Exists", effect="NoSchedule")
                       for key in (GPU_RESOURCE, *([EFA_RESOURCE] if place.efa else []))] if on_gpu_nodes else None
        node_selector = place.node_selector if on_gpu_nodes else place.system_node_selector
        return v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=dict(labels)),
            spec=v1.PodSpecArgs(
                restart_policy=restart_policy,
                service_account_name=service_account or (self.trainer_sa if uploads else self.worker_sa),
                automount_service_account_token=False, enable_service_links=False,
                node_selector=node_selector, tolerations=tolerations, affinity=affinity,
                subdomain=subdomain, termination_grace_period_seconds=grace_seconds,
                # fsGroup is a no-op on the EFS volume (the CSI driver declares no fsGroupPolicy, so kubelet never
                # chowns an RWX volume without fsType): every NFS call runs as the access point's PosixUser
                # 1000:1000, which is why uid 1000 can write there. It still owns the emptyDirs.
                security_context=restricted_pod_security(TRAINER_UID, fs_group_change_policy="OnRootMismatch"),
                init_containers=init_containers, containers=[container],
                volumes=[
                    *shared_volumes,
                    v1.VolumeArgs(name="tmp", empty_dir=v1.EmptyDirVolumeSourceArgs(size_limit="20Gi")),
                    v1.VolumeArgs(name="dshm", empty_dir=v1.EmptyDirVolumeSourceArgs(
                        medium="Memory", size_limit=f"{shm_gib}Gi")),
                    *self.rdzv_tls_volumes(rdzv_tls),
                ]))

    def shared_volumes(self, writes_data: bool) -> tuple[list, list]:
        """The shared volume's mounts and volumes: per workload (``PerRunClaims``: the dataset
        read-only unless ``writes_data``, this run's directory unless ``writes_data``) or the whole claim."""
        v1, st = k8s.core.v1, self.storage
        if isinstance(st, WholeVolume):
            return ([v1.VolumeMountArgs(name="shared", mount_path=SHARED_ROOT)],
                    [v1.VolumeArgs(name="shared", persistent_volume_claim=v1.PersistentVolumeClaimVolumeSourceArgs(
                        claim_name=st.claim))])
        # readOnly on the claim too: the EFS CSI driver then mounts the access point "ro".
        data = st.data if writes_data or st.data_read_only is None else st.data_read_only
        mounts = [v1.VolumeMountArgs(name="data", mount_path=DATA_DIR, read_only=not writes_data)]
        volumes = [v1.VolumeArgs(name="data", persistent_volume_claim=v1.PersistentVolumeClaimVolumeSourceArgs(
            claim_name=data, read_only=not writes_data))]
        if not writes_data:
            mounts.append(v1.VolumeMountArgs(name="run", mount_path=self.run_dir))
            volumes.append(v1.VolumeArgs(name="run", persistent_volume_claim=v1.PersistentVolumeClaimVolumeSourceArgs(
                claim_name=st.run)))
        return mounts, volumes

    def rdzv_tls_mounts(self, wanted: bool) -> list[k8s.core.v1.VolumeMountArgs]:
        if not wanted or not isinstance(self.rendezvous, EtcdStore):
            return []
        return [k8s.core.v1.VolumeMountArgs(name="rdzv-tls", mount_path=RDZV_TLS_DIR, read_only=True)]

    def rdzv_tls_volumes(self, wanted: bool) -> list[k8s.core.v1.VolumeArgs]:
        if not wanted or not isinstance(self.rendezvous, EtcdStore):
            return []
        # 0440 with fsGroup = the trainer's uid: readable by the agent only.
        return [k8s.core.v1.VolumeArgs(name="rdzv-tls", secret=k8s.core.v1.SecretVolumeSourceArgs(
            secret_name=self.rendezvous.tls_secret, default_mode=0o440))]

