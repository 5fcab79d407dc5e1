"""Cost estimate of a stack: $/hour while training, $/hour while idle, and $ per training run.

    from eks_ddp.tooling import cost
    print(cost.estimate(cfg).render())

Instance prices come from the catalog (``catalog.PRICE_DATE``, ``catalog.PRICE_SOURCE``);
everything else from :data:`PRICES` below, dated :data:`PRICE_DATE`. All are us-east-1
list prices in USD; other regions differ, usually by a few percent, and the estimate
says so. "Training" counts the job's node group at ``job.nodes`` nodes and other GPU
groups at ``desiredSize``; "idle" counts GPU groups at ``minSize`` (0: the autoscaler removed them).
The system nodes, control plane, NAT gateways and storage cost the same either way.

The per-run figure rests on an *estimated* training throughput per GPU model
(:data:`IMAGES_PER_SECOND`): ``epochs x 50,000`` CIFAR-10 images at that rate times
the job's GPUs. A run is billed for its GPU nodes from launch to termination (:func:`timeline`):
node start-up, image pull, training, evaluation and the scale-down tail (``cluster.scaleDownUnneededTime``
plus draining). The control plane is priced by support type and phase (``k8s_versions``).
Pure module: no Pulumi, no AWS calls.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eks_ddp.config import StackConfig
from eks_ddp.config.run_rules import stack_image_used
from eks_ddp.core import catalog, k8s_versions, rules, scheduling

PRICE_DATE = "2025-10-01"
PRICE_REGION = "us-east-1"
HOURS_PER_MONTH = 730  # AWS's own monthly convention for $/month -> $/hour

# Non-instance prices, us-east-1, from each service's pricing page on PRICE_DATE.
PRICES: dict[str, tuple[float, str]] = {
    "eks_cluster_hour": (k8s_versions.STANDARD_SUPPORT_USD_PER_HOUR,
                         "EKS control plane, standard support (aws.amazon.com/eks/pricing)"),
    "eks_cluster_extended_hour": (k8s_versions.EXTENDED_SUPPORT_USD_PER_HOUR,
                                  "EKS control plane, extended support (aws.amazon.com/eks/pricing)"),
    "nat_gateway_hour": (0.045, "NAT gateway hour (aws.amazon.com/vpc/pricing)"),
    "nat_gateway_gb": (0.045, "NAT gateway data processed, per GB (aws.amazon.com/vpc/pricing)"),
    "public_ipv4_hour": (0.005, "public IPv4 address hour, here the NAT gateways' EIPs (aws.amazon.com/vpc/pricing)"),
    "efs_standard_gb_month": (0.30, "EFS Standard storage, per GB-month (aws.amazon.com/efs/pricing)"),
    "efs_ia_gb_month": (0.016, "EFS Infrequent Access storage, per GB-month (aws.amazon.com/efs/pricing)"),
    "fsx_p2_125_gb_month": (0.145, "FSx for Lustre PERSISTENT_2 SSD, 125 MB/s/TiB, per GB-month "
                                   "(aws.amazon.com/fsx/lustre/pricing)"),
    "fsx_p2_250_gb_month": (0.210, "FSx for Lustre PERSISTENT_2 SSD, 250 MB/s/TiB, per GB-month "
                                   "(aws.amazon.com/fsx/lustre/pricing)"),
    "fsx_p2_500_gb_month": (0.340, "FSx for Lustre PERSISTENT_2 SSD, 500 MB/s/TiB, per GB-month "
                                   "(aws.amazon.com/fsx/lustre/pricing)"),
    "fsx_p2_1000_gb_month": (0.600, "FSx for Lustre PERSISTENT_2 SSD, 1000 MB/s/TiB, per GB-month "
                                    "(aws.amazon.com/fsx/lustre/pricing)"),
    "s3_standard_gb_month": (0.023, "S3 Standard storage, first 50 TB, per GB-month (aws.amazon.com/s3/pricing)"),
    "efs_elastic_read_gb": (0.03, "EFS Elastic Throughput reads, per GB (aws.amazon.com/efs/pricing)"),
    "efs_elastic_write_gb": (0.06, "EFS Elastic Throughput writes, per GB (aws.amazon.com/efs/pricing)"),
    "ebs_gp3_gb_month": (0.08, "EBS gp3 storage, per GB-month, baseline IOPS/throughput (aws.amazon.com/ebs/pricing)"),
    "fsx_backup_gb_month": (0.05, "FSx for Lustre backup storage, per GB-month (aws.amazon.com/fsx/lustre/pricing)"),
    "kms_key_month": (1.00, "KMS customer managed key, per month (aws.amazon.com/kms/pricing)"),
    "ecr_gb_month": (0.10, "ECR private repository storage, per GB-month (aws.amazon.com/ecr/pricing)"),
    "logs_ingest_gb": (0.50, "CloudWatch Logs ingestion, per GB (aws.amazon.com/cloudwatch/pricing)"),
}

# Sizes the stack does not fix; each appears in the estimate's assumptions.
EFS_ASSUMED_GB = 10  # CIFAR-10 (~0.2 GB) plus checkpoints and models of a few dozen runs
ECR_ASSUMED_GB = 5  # the CUDA PyTorch trainer image, compressed; tags share most layers
LOGS_ASSUMED_GB_PER_DAY = 1.0  # control-plane logs, all five types; audit logs dominate
# observability.cloudwatch: every pod's output plus the nodes' kubelet/containerd and kernel logs (Fluent Bit). The
# trainer logs compact one-line records; the system pods (autoscaler, add-ons) log most of it while idle.
CONTAINER_LOGS_ASSUMED_GB_PER_DAY = 0.5
RESULTS_ASSUMED_GB = 1  # the results bucket: models and metrics of a few dozen runs (kept after destroy)
SYSTEM_ROOT_VOLUME_GIB = 50  # eks_ddp.infra.cluster.SYSTEM_ROOT_VOLUME_GIB (a test keeps them equal)

# Estimated training throughput of the default model (resnet-small, the ResNet-9 of the
# DAWNBench line) per GPU, images/s, mixed precision, batch 512, data already in GPU memory.
# Anchor: Myrtle.ai's published ResNet-9 run, 24 epochs of CIFAR-10 in 79 s on one V100
# (fp16), i.e. ~15,000 images/s. The others scale it by typical fp16 convnet training
# ratios: T4 ~0.3x V100 (70 W, a quarter of the bandwidth), A10G ~0.8x, L4 ~1.7x T4,
# A100 ~1.8x, H100 ~1.8x A100. Estimates, not measurements: bench/ records measured runs.
IMAGES_PER_SECOND: dict[str, float] = {
    "T4": 4_500,
    "A10G": 12_000,
    "L4": 7_500,
    "A100": 27_000,
    "H100": 48_000,
    # L40S (Ada): ~0.8x A100 for fp16 convnets (more tensor FLOPs, half the memory bandwidth); H200: H100's
    # compute with more memory bandwidth, which this small model barely uses: the H100 figure.
    "L40S": 22_000,
    "H200": 48_000,
}
#: A GPU model the table does not know (a registered type): the slowest rate, so the estimate errs high.
UNKNOWN_GPU_IMAGES_PER_SECOND = min(IMAGES_PER_SECOND.values())
# resnet18 with a 32x32 stem does ~1.5x the FLOPs of resnet-small per image, with more layers at full resolution.
# airnet (the trainer's default) does 0.236 GFLOPs per image forward against resnet-small's 0.759
# (measured with torch's FlopCounter, bench/RESULTS.md): credited 3x, below the FLOPs ratio, since small
# convs use a GPU less well. The workshop CNN is far smaller still; it is capped at the same 3x.
MODEL_SPEED = {"airnet": 3.0, "resnet-small": 1.0, "resnet18": 0.6, "workshop-cnn": 3.0}
# Data-parallel efficiency: gradient all-reduce over TCP between nodes without EFA costs ~15 %
# for this small model (a 26 MB fp32 all-reduce per step); NVLink within a node or EFA ~5 %.
SCALING_TCP = 0.85
SCALING_FAST = 0.95
CIFAR10_TRAIN_IMAGES = 50_000
# A run's timeline on GPU nodes, beyond the epochs (estimates; each is named in the assumptions):
# the autoscaler sees the Pending pods within its 10 s scan and asks the Auto Scaling group for nodes;
# EC2 launch, boot and kubelet join take ~4 min for a single-GPU node and longer for 8-GPU EFA types
# (more devices and interfaces to bring up, the NVIDIA and EFA device plugins to register).
NODE_START_MINUTES = 4
NODE_START_MINUTES_8GPU = 8
# Pulling the CUDA PyTorch trainer image (~ECR_ASSUMED_GB compressed, about twice that unpacked) onto
# a fresh gp3 root volume (125 MB/s baseline): a few minutes. Data prep ran beforehand on the system nodes.
IMAGE_PULL_MINUTES = 3
# Rendezvous, CUDA start-up, the final evaluation and the model save.
RUN_OVERHEAD_MINUTES = 3
# After the last pod ends: the node sits unneeded for cluster.scaleDownUnneededTime, then the autoscaler
# drains it and EC2 terminates it (shutting-down is still billed): about a minute more.
SCALE_DOWN_TERMINATE_MINUTES = 1


def kueue_controller_requests() -> dict[str, str]:
    """The Kueue controller's requests as the stack sets them (infra/kueue.py ``RESOURCES``), one replica
    (``controllerManager.replicas: 1``); KueueViz is off."""
    from eks_ddp.infra import kueue

    return dict(kueue.RESOURCES["requests"])


def queue_controller_share(cfg: StackConfig) -> float:
    """The controller's requests as a share of one system node's allocatable CPU or memory, whichever is larger."""
    room = scheduling.eks_allocatable(cfg.cluster.system_instance_type)
    return max(scheduling.quantity(kueue_controller_requests()[k]) / room[k] for k in ("cpu", "memory"))


def system_nodes_needed(cfg: StackConfig, system_pods: Mapping[str, Mapping[str, float]]) -> int:
    """System nodes that hold the add-ons, the cluster autoscaler, ``system_pods`` (the stack's own pods there, name
    -> requests in cores/bytes, from the rendered plan) and, with the queue on, the Kueue controller: the largest of
    CPU, memory and pods over one node's allocatable (scheduling.eks_allocatable), at least systemNodeCount."""
    from eks_ddp.infra import autoscaler

    pods = {**system_pods, "cluster-autoscaler": {k: scheduling.quantity(v)
                                                  for k, v in autoscaler.RESOURCES["requests"].items()}}
    if cfg.queue.enabled:
        pods["kueue-controller-manager"] = {k: scheduling.quantity(v) for k, v in kueue_controller_requests().items()}
    room = scheduling.eks_allocatable(cfg.cluster.system_instance_type)
    n = cfg.cluster.system_node_count
    while n < 64:
        load = scheduling.system_load(pods, n)  # DaemonSets count once per node
        if all(load[k] <= room[k] * n for k in ("cpu", "memory", "pods")):
            return n
        n += 1
    return n


def queue_item(cfg: StackConfig, system_pods: Mapping[str, Mapping[str, float]] | None = None) -> LineItem | None:
    """The queue's controller on the system nodes. With ``system_pods`` (the plan's own system pods) its cost is
    computed: $0 when the system nodes hold it beside everything else, else the system nodes it adds; without, the
    share of one system node it takes, which the plan check settles (tests/tooling/test_cost.py)."""
    if not cfg.queue.enabled:
        return None
    system = catalog.lookup(cfg.cluster.system_instance_type)
    share = queue_controller_share(cfg)
    r = kueue_controller_requests()
    name = f"Kueue controller ({r['cpu']} CPU, {r['memory']} requested, on the system nodes)"
    what = f"{share:.0%} of one {system.name}'s allocatable (${share * system.price_per_hour:.4f}/h as a share)"
    if system_pods is None:
        return LineItem(name, "node", system.price_per_hour, 0, 0, note=what + "; whether the system nodes hold it "
                        "is checked over the plan")
    without = system_nodes_needed(dataclasses.replace(cfg, queue=dataclasses.replace(cfg.queue, enabled=False)),
                                  system_pods)
    extra = system_nodes_needed(cfg, system_pods) - without
    if extra == 0:
        return LineItem(name, "node", system.price_per_hour, 0, 0,
                        note=what + "; the system nodes priced above hold it: no extra node")
    return LineItem(name, "node", system.price_per_hour, extra, extra,
                    note=what + f"; {cfg.cluster.system_node_count} system node(s) cannot hold it beside the rest: "
                         f"{extra} more {system.name} (cluster.systemNodeCount or systemInstanceType)")


def price(key: str) -> float:
    return PRICES[key][0]


@dataclass(frozen=True)
class LineItem:
    """One priced component of the stack."""

    name: str
    unit: str
    unit_price: float  # $ per unit-hour
    training_units: float
    idle_units: float
    note: str = ""

    @property
    def training_per_hour(self) -> float:
        return self.unit_price * self.training_units

    @property
    def idle_per_hour(self) -> float:
        return self.unit_price * self.idle_units


@dataclass(frozen=True)
class Estimate:
    """The stack's estimated cost; ``as_dict()`` is the ``costEstimate`` stack output."""

    region: str
    items: tuple[LineItem, ...]
    run_images: int
    images_per_second: float
    timeline: tuple[tuple[str, float], ...]
    """(phase, minutes) the job's GPU nodes are billed for one run: start-up, image pull, training,
    evaluation, scale-down tail. Data preparation runs on the system nodes before them."""
    back_to_idle_minutes: float
    """Minutes from the end of a run until its GPU nodes are gone (the scale-down tail)."""
    assumptions: tuple[str, ...] = field(default=())
    not_included: tuple[str, ...] = field(default=())
    per_run_known: bool = True
    """False for a run of your own workload: its duration (and so its cost) is not the bundled trainer's."""
    after_destroy: tuple[LineItem, ...] = field(default=())
    """What keeps billing after ``pulumi destroy`` (kept file system and keys, results, reservations), $/hour in
    ``idle_units``; each item's note says how to stop it."""

    @property
    def training_per_hour(self) -> float:
        return sum(i.training_per_hour for i in self.items)

    @property
    def idle_per_hour(self) -> float:
        return sum(i.idle_per_hour for i in self.items)

    @property
    def after_destroy_per_hour(self) -> float:
        return sum(i.idle_per_hour for i in self.after_destroy)

    @property
    def train_hours(self) -> float:
        """Pure training time of a run at the estimated throughput."""
        return self.run_images / self.images_per_second / 3600

    @property
    def run_hours(self) -> float:
        """How long a run keeps GPU nodes billed: from the scale-up to their termination."""
        return sum(m for _, m in self.timeline) / 60

    @property
    def per_run(self) -> float:
        """What a run adds to the idle stack: the GPU nodes (and their volumes) for :attr:`run_hours`."""
        return (self.training_per_hour - self.idle_per_hour) * self.run_hours

    def as_dict(self) -> dict[str, Any]:
        r = lambda x: round(x, 4)  # noqa: E731
        return {
            "currency": "USD",
            "region": self.region,
            "price_region": PRICE_REGION,
            "price_date": PRICE_DATE,
            "instance_price_date": catalog.PRICE_DATE,
            "instance_price_source": catalog.PRICE_SOURCE,
            "training_per_hour": r(self.training_per_hour),
            "idle_per_hour": r(self.idle_per_hour),
            "idle_per_month": round(self.idle_per_hour * HOURS_PER_MONTH, 2),
            "per_run": r(self.per_run),
            "per_run_known": self.per_run_known,
            "run_hours": r(self.run_hours),
            "run_timeline_minutes": {k: round(m, 1) for k, m in self.timeline},
            "back_to_idle_minutes": round(self.back_to_idle_minutes, 1),
            "run_images": self.run_images,
            "images_per_second": round(self.images_per_second, 1),
            "line_items": [{"name": i.name, "unit": i.unit, "unit_price_per_hour": round(i.unit_price, 6),
                            "training_units": i.training_units, "idle_units": i.idle_units,
                            "training_per_hour": r(i.training_per_hour), "idle_per_hour": r(i.idle_per_hour),
                            **({"note": i.note} if i.note else {})} for i in self.items],
            "after_destroy_per_hour": r(self.after_destroy_per_hour),
            "after_destroy_per_month": round(self.after_destroy_per_hour * HOURS_PER_MONTH, 2),
            "after_destroy": [{"name": i.name, "per_hour": r(i.idle_per_hour), **({"note": i.note} if i.note else {})}
                              for i in self.after_destroy],
            "assumptions": list(self.assumptions),
            "not_included": list(self.not_included),
        }

    def render(self) -> str:
        return render(self.as_dict())


def _gb_month(key: str) -> float:
    """A $/GB-month price as $/GB-hour."""
    return price(key) / HOURS_PER_MONTH


def control_plane(cfg: StackConfig, day: dt.date) -> LineItem:
    """The control plane at the rate of its support phase on ``day``: extended support ($0.60/h) only with
    ``upgradePolicy: EXTENDED`` once the version is past standard support; a STANDARD cluster is upgraded by
    EKS at that point instead and stays at the standard rate."""
    version = cfg.cluster.kubernetes_version
    phase = k8s_versions.support_on(version, day) if version in k8s_versions.CALENDAR else "standard"
    if cfg.cluster.upgrade_policy == "EXTENDED" and phase in ("extended", "ended"):
        return LineItem("EKS control plane (extended support)", "cluster", price("eks_cluster_extended_hour"), 1, 1,
                        note=f"Kubernetes {version} is past standard support on {day}")
    note = ""
    if cfg.cluster.upgrade_policy == "EXTENDED":
        end = k8s_versions.CALENDAR[version].end_of_standard
        note = f"${price('eks_cluster_extended_hour'):.2f}/h from {end}, when {version} leaves standard support"
    return LineItem("EKS control plane (standard support)", "cluster", price("eks_cluster_hour"), 1, 1, note=note)


def _items(cfg: StackConfig, day: dt.date, system_pods: Mapping[str, Mapping[str, float]] | None = None
           ) -> list[LineItem]:
    items = [control_plane(cfg, day)]
    net = cfg.network
    zones = len(net.availability_zones) or net.az_count
    nats = 0 if net.bring_your_own else (zones if net.nat_gateways == "perAz" else 1)
    if nats:
        items.append(LineItem(f"NAT gateway ({net.nat_gateways})", "gateway", price("nat_gateway_hour"), nats, nats,
                              note=f"plus ${price('nat_gateway_gb')}/GB processed (image pulls use it; S3 does not)"))
        items.append(LineItem("Public IPv4 (NAT gateway EIPs)", "address", price("public_ipv4_hour"), nats, nats))
    system = catalog.lookup(cfg.cluster.system_instance_type)
    n_sys = cfg.cluster.system_node_count
    items.append(LineItem(f"System nodes ({system.name})", "node", system.price_per_hour, n_sys, n_sys))
    items.append(LineItem(f"EBS gp3 root volumes, system ({SYSTEM_ROOT_VOLUME_GIB} GiB each)", "GiB",
                          _gb_month("ebs_gp3_gb_month"), n_sys * SYSTEM_ROOT_VOLUME_GIB,
                          n_sys * SYSTEM_ROOT_VOLUME_GIB))
    job_group = cfg.job_group
    for g in cfg.node_groups:
        it = catalog.lookup(g.instance_type)
        busy = cfg.job.nodes if g.name == job_group.name else g.desired_size
        note = {"spot": "priced at on-demand: spot is usually far cheaper, but varies",
                "capacityBlock": "priced at on-demand: capacity blocks are billed at purchase"}.get(g.capacity_type, "")
        items.append(LineItem(f"GPU nodes '{g.name}' ({it.name}, {it.gpus} x {it.gpu_model})", "node",
                              it.price_per_hour, busy, g.min_size, note=note))
        if g.capacity_reservation_id:
            # The reservation bills every reserved instance whether a node runs in it or not: the ones the nodes
            # above do not use, training or idle (EC2 "Capacity Reservation pricing").
            items.append(reservation_item(g, busy))
        items.append(LineItem(f"EBS gp3 root volumes, '{g.name}' ({g.root_volume_gib} GiB each)", "GiB",
                              _gb_month("ebs_gp3_gb_month"), busy * g.root_volume_gib, g.min_size * g.root_volume_gib))
    items.append(storage_item(cfg))
    if builds_image(cfg):
        items.append(LineItem(f"ECR image storage (assumed {ECR_ASSUMED_GB} GB)", "GB", _gb_month("ecr_gb_month"),
                              ECR_ASSUMED_GB, ECR_ASSUMED_GB))
    keys = kms_keys(cfg)
    items.append(LineItem(f"KMS keys ({', '.join(keys)})", "key", price("kms_key_month") / HOURS_PER_MONTH,
                          len(keys), len(keys)))
    logs_per_hour = LOGS_ASSUMED_GB_PER_DAY * price("logs_ingest_gb") / 24
    items.append(LineItem(f"CloudWatch Logs ingestion (assumed {LOGS_ASSUMED_GB_PER_DAY:g} GB/day)", "GB/day",
                          logs_per_hour / LOGS_ASSUMED_GB_PER_DAY, LOGS_ASSUMED_GB_PER_DAY, LOGS_ASSUMED_GB_PER_DAY))
    items += _observability_items(cfg)
    queue = queue_item(cfg, system_pods)
    if queue is not None:
        items.append(queue)
    return items


def _observability_items(cfg: StackConfig) -> list[LineItem]:
    """Container logs in CloudWatch (observability.cloudwatch), ingested at the same per-GB price."""
    if not cfg.observability.cloudwatch:
        return []
    gb = CONTAINER_LOGS_ASSUMED_GB_PER_DAY
    return [LineItem(f"CloudWatch Logs ingestion, container logs (assumed {gb:g} GB/day)", "GB/day",
                     price("logs_ingest_gb") / 24, gb, gb,
                     note=f"kept {cfg.observability.log_retention_days} days (observability.logRetentionDays)")]


def fsx(cfg: StackConfig) -> bool:
    return cfg.storage.backend == "fsxLustre"


def _ia_note(st: Any) -> str:
    """What EFS lifecycle management does to the price, when it is on."""
    ia = st.efs_transitions["transition_to_ia"]
    if ia is None:
        return ""
    return (f"; files unread for {ia.lower().removeprefix('after_').replace('_', ' ')} move to IA "
            f"(${price('efs_ia_gb_month')}/GB-month)")


def storage_item(cfg: StackConfig) -> LineItem:
    """The shared file system: FSx for Lustre bills its provisioned capacity; EFS what it stores (assumed)."""
    st = cfg.storage
    if fsx(cfg):
        return LineItem(f"FSx for Lustre PERSISTENT_2 ({st.fsx_storage_capacity_gib} GiB at "
                        f"{st.fsx_throughput_per_tib} MB/s/TiB)", "GB",
                        _gb_month(f"fsx_p2_{st.fsx_throughput_per_tib}_gb_month"), st.fsx_storage_capacity_gib,
                        st.fsx_storage_capacity_gib, note="provisioned capacity, billed whether used or not; "
                                                          "no charge per GB read or written")
    return LineItem(f"EFS Standard storage (assumed {EFS_ASSUMED_GB} GB)", "GB", _gb_month("efs_standard_gb_month"),
                    EFS_ASSUMED_GB, EFS_ASSUMED_GB,
                    note=f"plus Elastic Throughput ${price('efs_elastic_read_gb')}/GB read, "
                         f"${price('efs_elastic_write_gb')}/GB written" + _ia_note(st))


def reservation_item(g: Any, busy: int) -> LineItem:
    """A capacity reservation or block of ``g``: its instances the group's nodes do not use, billed anyway. Its size
    is not in the stack: taken as ``maxSize`` (preflight reads the real ``TotalInstanceCount``)."""
    it = catalog.lookup(g.instance_type)
    kind = "capacity block" if g.capacity_type == "capacityBlock" else "capacity reservation"
    return LineItem(f"{kind} {g.capacity_reservation_id}, unused (of {g.max_size})", "instance",
                    it.price_per_hour, max(0, g.max_size - busy), max(0, g.max_size - g.min_size),
                    note=("paid at purchase, whether used or not; priced at on-demand" if kind == "capacity block"
                          else "billed whether nodes run or not, until cancelled: aws ec2 cancel-capacity-reservation "
                               f"--capacity-reservation-id {g.capacity_reservation_id}"))


def kms_keys(cfg: StackConfig) -> list[str]:
    """The KMS keys the stack creates: EKS secrets, the shared file system's (none for an adopted EFS file system),
    the results bucket's (none with ``storage.resultsBucket``)."""
    st = cfg.storage
    return ["EKS secrets", *(["FSx"] if fsx(cfg) else [] if st.file_system_id else ["EFS"]),
            *([] if st.results_bucket else ["results"])]


def after_destroy(cfg: StackConfig) -> list[LineItem]:
    """What ``pulumi destroy`` leaves billing: the kept file system and its key, the results bucket and its key, a kept
    image repository, every reservation (until cancelled) or block (until it ends)."""
    out: list[LineItem] = []
    st = cfg.storage
    if st.retain_on_destroy and fsx(cfg):
        # Destroy deletes the file system (its interfaces sit in the stack's subnet) after a final backup.
        out.append(LineItem(f"kept FSx for Lustre final backup (at most {st.fsx_storage_capacity_gib} GB)", "GB",
                            _gb_month("fsx_backup_gb_month"), 0, st.fsx_storage_capacity_gib,
                            note="billed for the data stored, at most the capacity; restore with storage.fsxBackupId, "
                                 "or aws fsx delete-backup --backup-id <backup-...> (aws fsx describe-backups "
                                 "--filters Name=backup-type,Values=USER_INITIATED)"))
    elif st.retain_on_destroy and st.file_system_id is None:
        out.append(LineItem(f"kept EFS file system (assumed {EFS_ASSUMED_GB} GB, Standard)", "GB",
                            _gb_month("efs_standard_gb_month"), 0, EFS_ASSUMED_GB,
                            note="aws efs delete-file-system --file-system-id <efsId>" + _ia_note(st)))
    kept_keys = (["file system"] if st.retain_on_destroy and st.file_system_id is None else []) + \
        ([] if st.results_bucket else ["results"])
    if kept_keys:
        out.append(LineItem(f"kept KMS keys ({', '.join(kept_keys)})", "key", price("kms_key_month") / HOURS_PER_MONTH,
                            0, len(kept_keys), note="aws kms schedule-key-deletion --key-id <key> (after deleting what "
                                                    "it encrypts)"))
    if not st.results_bucket:
        out.append(LineItem(f"kept results bucket (assumed {RESULTS_ASSUMED_GB} GB)", "GB",
                            _gb_month("s3_standard_gb_month"), 0, RESULTS_ASSUMED_GB,
                            note="aws s3 rb s3://<bucket> --force (pulumi stack output results, before the destroy)"))
    if cfg.image.retain_repository and builds_image(cfg):
        out.append(LineItem(f"kept ECR repository (assumed {ECR_ASSUMED_GB} GB)", "GB", _gb_month("ecr_gb_month"), 0,
                            ECR_ASSUMED_GB, note="aws ecr delete-repository --force --repository-name <name>"))
    for g in cfg.node_groups:
        if g.capacity_reservation_id:
            r = reservation_item(g, 0)
            out.append(dataclasses.replace(r, name=r.name.replace(", unused (of", " (all"), training_units=0,
                                           idle_units=g.max_size))
    return out


def throughput(cfg: StackConfig) -> tuple[float, str]:
    """Estimated images/s of the whole job, and how it was derived."""
    it = catalog.lookup(cfg.job_group.instance_type)
    per_gpu = IMAGES_PER_SECOND.get(it.gpu_model, UNKNOWN_GPU_IMAGES_PER_SECOND) * MODEL_SPEED[cfg.job.model]
    gpus = cfg.job.nodes * it.gpus
    if gpus == 1:
        efficiency = 1.0
    elif cfg.job.nodes == 1 or cfg.job_group.efa:
        efficiency = SCALING_FAST
    else:
        efficiency = SCALING_TCP
    how = (f"{per_gpu:,.0f} images/s per {it.gpu_model} for {cfg.job.model} (estimate"
           + ("" if it.gpu_model in IMAGES_PER_SECOND else f"; {it.gpu_model} unknown: the slowest GPU's rate")
           + f") x {gpus} GPUs x {efficiency:g} data-parallel efficiency")
    return per_gpu * gpus * efficiency, how


def scale_down_minutes(cfg: StackConfig) -> float:
    """Minutes a GPU node sits empty before the autoscaler removes it (``cluster.scaleDownUnneededTime``)."""
    return rules.duration_minutes(cfg.cluster.scale_down_unneeded_time)


_ANY_WORKLOAD = ("node start-up", "image pull", "scale-down tail")
"""The phases of :func:`timeline` that are not the bundled trainer's own (a run of your workload has them too)."""


def builds_image(cfg: StackConfig) -> bool:
    """The stack makes (and bills) an ECR repository: a run uses the stack's image and none is prebuilt; a stack
    whose runs all name their own image makes none (``__main__.py``)."""
    return cfg.image.prebuilt is None and stack_image_used(cfg)


def timeline(cfg: StackConfig, rate: float) -> tuple[tuple[str, float], ...]:
    """(phase, minutes) the job's GPU nodes are billed for one run."""
    it = catalog.lookup(cfg.job_group.instance_type)
    images = cfg.job.epochs * CIFAR10_TRAIN_IMAGES
    return (
        ("node start-up", float(NODE_START_MINUTES_8GPU if it.gpus >= 8 else NODE_START_MINUTES)),
        ("image pull", float(IMAGE_PULL_MINUTES)),
        ("training", images / rate / 60),
        ("start-up and evaluation", float(RUN_OVERHEAD_MINUTES)),
        ("scale-down tail", scale_down_minutes(cfg) + SCALE_DOWN_TERMINATE_MINUTES),
    )


def estimate(cfg: StackConfig, *, day: dt.date | None = None,
             system_pods: Mapping[str, Mapping[str, float]] | None = None) -> Estimate:
    """The stack's cost estimate from the catalog and :data:`PRICES`, with the control plane priced for its
    support phase on ``day`` (default: today); with ``system_pods`` (the plan's own pods on the system nodes, name
    -> requests) the queue controller's share is settled: no extra node, or the system nodes it adds."""
    day = day or dt.date.today()
    rate, how = throughput(cfg)
    images = cfg.job.epochs * CIFAR10_TRAIN_IMAGES
    phases = timeline(cfg, rate)
    assumptions = [
        f"prices are {PRICE_REGION} list prices (instances: {catalog.PRICE_SOURCE}, {catalog.PRICE_DATE}; "
        f"other services: {PRICE_DATE})"
        + ("" if cfg.region == PRICE_REGION else f"; {cfg.region} prices may differ by a few percent"),
        f"training: group '{cfg.job_group.name}' at job.nodes ({cfg.job.nodes}), other GPU groups at desiredSize; "
        "idle: GPU groups at minSize (the cluster autoscaler removes the rest)",
        f"a run: {cfg.job.epochs} epochs x {CIFAR10_TRAIN_IMAGES:,} images = {images:,} images at ~{rate:,.0f} "
        f"images/s ({how})" if not cfg.job.workload.custom else
        "a run of your own workload: its duration is yours to know, so no per-run figure (the bundled trainer's "
        "throughput says nothing of it): multiply the $/hour while training by its hours",
        "a run's GPU-node time: " + ", ".join(f"{k} {m:.1f} min" for k, m in phases
                                               if not cfg.job.workload.custom or k in _ANY_WORKLOAD)
        + (", plus your workload's own time" if cfg.job.workload.custom else "")
        + f" (the tail: cluster.scaleDownUnneededTime {cfg.cluster.scale_down_unneeded_time} plus ~"
        f"{SCALE_DOWN_TERMINATE_MINUTES} min to drain and terminate); data preparation runs on the system nodes",
        f"sizes not fixed by the stack: {'' if fsx(cfg) else f'EFS {EFS_ASSUMED_GB} GB, '}"
        + (f"ECR {ECR_ASSUMED_GB} GB, " if builds_image(cfg) else "") +
        f"results {RESULTS_ASSUMED_GB} GB, control-plane logs {LOGS_ASSUMED_GB_PER_DAY:g} GB/day"
        + (f", container logs {CONTAINER_LOGS_ASSUMED_GB_PER_DAY:g} GB/day" if cfg.observability.cloudwatch else "")
        + f"; {HOURS_PER_MONTH} hours per month",
    ]
    if cfg.queue.enabled:
        assumptions.append("a queued run costs nothing until Kueue admits it: its Job stays suspended, so it has no "
                           "pod and brings up no GPU node; a run's time above starts at its admission")
    used = [cfg.cluster.system_instance_type] + [g.instance_type for g in cfg.node_groups]
    for name in dict.fromkeys(used):
        it = catalog.lookup(name)
        if (it.price_source, it.price_date) != (catalog.PRICE_SOURCE, catalog.PRICE_DATE):
            assumptions.append(f"{name}: ${it.price_per_hour:g}/h from {it.price_source} ({it.price_date})")
    for g in cfg.node_groups:
        if g.capacity_reservation_id:
            assumptions.append(f"group '{g.name}' launches into {g.capacity_reservation_id}, taken to reserve maxSize "
                               f"({g.max_size}) instances: the reservation bills its instances whether a run uses them "
                               "or not, so they are in the idle and after-destroy figures and a run adds only its "
                               "volumes")
    not_included = [
        f"NAT gateway data processing (${price('nat_gateway_gb')}/GB)",
        *([] if fsx(cfg) else [f"EFS Elastic Throughput (${price('efs_elastic_read_gb')}/GB read, "
                                f"${price('efs_elastic_write_gb')}/GB write)"]),
        "CloudWatch Logs storage beyond ingestion, data transfer out, burstable (t3) CPU credits",
    ]
    if cfg.observability.cloudwatch:
        not_included.append("Container Insights metrics (billed per observation, aws.amazon.com/cloudwatch/pricing)")
    return Estimate(region=cfg.region, items=tuple(_items(cfg, day, system_pods)), run_images=images, images_per_second=rate,
                    timeline=phases, back_to_idle_minutes=phases[-1][1], assumptions=tuple(assumptions),
                    not_included=tuple(not_included), after_destroy=tuple(after_destroy(cfg)),
                    per_run_known=not cfg.job.workload.custom)


def render(data: dict[str, Any]) -> str:
    """Human-readable form of ``Estimate.as_dict()`` (also of the ``costEstimate`` stack output)."""
    lines = [
        f"Estimated cost ({data['currency']}, {data['price_region']} list prices"
        + ("" if data["region"] == data["price_region"] else f"; stack region {data['region']} may differ") + ")",
        f"  while training: ${data['training_per_hour']:.2f}/hour",
        f"  while idle:     ${data['idle_per_hour']:.2f}/hour (~${data['idle_per_month']:,.0f}/month)",
        f"  after a run:    back to idle in ~{data['back_to_idle_minutes']:.0f} min (the autoscaler removes the GPU nodes)",
        f"  after destroy:  ${data.get('after_destroy_per_hour', 0):.2f}/hour "
        f"(~${data.get('after_destroy_per_month', 0):,.0f}/month) until you delete what is kept:",
        *(f"    - {i['name']}: ${i['per_hour']:.4f}/h" + (f"; {i['note']}" if i.get("note") else "")
          for i in data.get("after_destroy", [])),
        f"  per run:        ${data['per_run']:.2f} on top of idle (GPU nodes for {data['run_hours'] * 60:.0f} min: "
        + ", ".join(f"{k} {m:.1f}" for k, m in data["run_timeline_minutes"].items())
        + f"; {int(data['run_images']):,} images at ~{data['images_per_second']:,.0f} images/s, estimated)"
        if data.get("per_run_known", True) else
        "  per run:        unknown: your workload's duration (the $/hour while training times its hours)",
        "",
        f"  {'item':<58} {'$/h training':>12} {'$/h idle':>9}",
    ]
    for item in data["line_items"]:
        lines.append(f"  {item['name']:<58} {item['training_per_hour']:>12.4f} {item['idle_per_hour']:>9.4f}")
    lines.append(f"  {'total':<58} {data['training_per_hour']:>12.4f} {data['idle_per_hour']:>9.4f}")
    lines.append("  assumptions:")
    lines += [f"    - {a}" for a in data["assumptions"]]
    lines.append("  not included:")
    lines += [f"    - {n}" for n in data["not_included"]]
    return "\n".join(lines)
