"""Cost estimate of a stack: $/hour while training, $/hour while idle, and $ per training run.

    from components import cost
    print(cost.estimate(cfg).render())

Instance prices come from the catalog (``catalog.PRICE_DATE``, ``catalog.PRICE_SOURCE``);
everything else from :data:`PRICES` below, dated :data:`PRICE_DATE`. All are us-east-1
list prices in USD; other regions differ, usually by a few percent, and the estimate
says so. "Training" counts the job's node group at ``job.nodes`` nodes and other GPU
groups at ``desiredSize``; "idle" counts GPU groups at ``minSize`` (0: scaled to zero).
The system nodes, control plane, NAT gateways and storage cost the same either way.

The per-run figure rests on an *estimated* training throughput per GPU model
(:data:`IMAGES_PER_SECOND`): ``epochs x 50,000`` CIFAR-10 images at that rate times
the job's GPUs, plus a fixed start-up overhead. Pure module: no Pulumi, no AWS calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components import catalog
from components.config import StackConfig

PRICE_DATE = "2025-10-01"
PRICE_REGION = "us-east-1"
HOURS_PER_MONTH = 730  # AWS's own monthly convention for $/month -> $/hour

# Non-instance prices, us-east-1, from each service's pricing page on PRICE_DATE.
PRICES: dict[str, tuple[float, str]] = {
    "eks_cluster_hour": (0.10, "EKS control plane, standard support (aws.amazon.com/eks/pricing)"),
    "nat_gateway_hour": (0.045, "NAT gateway hour (aws.amazon.com/vpc/pricing)"),
    "nat_gateway_gb": (0.045, "NAT gateway data processed, per GB (aws.amazon.com/vpc/pricing)"),
    "public_ipv4_hour": (0.005, "public IPv4 address hour, here the NAT gateways' EIPs (aws.amazon.com/vpc/pricing)"),
    "efs_standard_gb_month": (0.30, "EFS Standard storage, per GB-month (aws.amazon.com/efs/pricing)"),
    "efs_elastic_read_gb": (0.03, "EFS Elastic Throughput reads, per GB (aws.amazon.com/efs/pricing)"),
    "efs_elastic_write_gb": (0.06, "EFS Elastic Throughput writes, per GB (aws.amazon.com/efs/pricing)"),
    "ebs_gp3_gb_month": (0.08, "EBS gp3 storage, per GB-month, baseline IOPS/throughput (aws.amazon.com/ebs/pricing)"),
    "kms_key_month": (1.00, "KMS customer managed key, per month (aws.amazon.com/kms/pricing)"),
    "ecr_gb_month": (0.10, "ECR private repository storage, per GB-month (aws.amazon.com/ecr/pricing)"),
    "logs_ingest_gb": (0.50, "CloudWatch Logs ingestion, per GB (aws.amazon.com/cloudwatch/pricing)"),
}

# Sizes the stack does not fix; each appears in the estimate's assumptions.
EFS_ASSUMED_GB = 10  # CIFAR-10 (~0.2 GB) plus checkpoints and models of a few dozen runs
ECR_ASSUMED_GB = 5  # the CUDA PyTorch trainer image, compressed; tags share most layers
LOGS_ASSUMED_GB_PER_DAY = 1.0  # control-plane logs, all five types; audit logs dominate
KMS_KEYS = 2  # EKS secrets encryption and EFS encryption
SYSTEM_ROOT_VOLUME_GIB = 50  # components.cluster.SYSTEM_ROOT_VOLUME_GIB (a test keeps them equal)

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
}
# resnet18 with a 32x32 stem does ~1.5x the FLOPs of resnet-small per image, with more layers at full resolution.
MODEL_SPEED = {"resnet-small": 1.0, "resnet18": 0.6}
# Data-parallel efficiency: gradient all-reduce over TCP between nodes without EFA costs ~15 %
# for this small model (a 26 MB fp32 all-reduce per step); NVLink within a node or EFA ~5 %.
SCALING_TCP = 0.85
SCALING_FAST = 0.95
CIFAR10_TRAIN_IMAGES = 50_000
# Per run, beyond the epochs: data preparation job, pulling the multi-GB image onto fresh
# nodes, rendezvous and CUDA start-up, final evaluation and model save.
RUN_OVERHEAD_MINUTES = 10


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
    overhead_hours: float
    assumptions: tuple[str, ...] = field(default=())
    not_included: tuple[str, ...] = field(default=())

    @property
    def training_per_hour(self) -> float:
        return sum(i.training_per_hour for i in self.items)

    @property
    def idle_per_hour(self) -> float:
        return sum(i.idle_per_hour for i in self.items)

    @property
    def run_hours(self) -> float:
        return self.run_images / self.images_per_second / 3600 + self.overhead_hours

    @property
    def per_run(self) -> float:
        return self.training_per_hour * self.run_hours

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
            "run_hours": r(self.run_hours),
            "run_images": self.run_images,
            "images_per_second": round(self.images_per_second, 1),
            "line_items": [{"name": i.name, "unit": i.unit, "unit_price_per_hour": round(i.unit_price, 6),
                            "training_units": i.training_units, "idle_units": i.idle_units,
                            "training_per_hour": r(i.training_per_hour), "idle_per_hour": r(i.idle_per_hour),
                            **({"note": i.note} if i.note else {})} for i in self.items],
            "assumptions": list(self.assumptions),
            "not_included": list(self.not_included),
        }

    def render(self) -> str:
        return render(self.as_dict())


def _gb_month(key: str) -> float:
    """A $/GB-month price as $/GB-hour."""
    return price(key) / HOURS_PER_MONTH


def _items(cfg: StackConfig) -> list[LineItem]:
    items = [LineItem("EKS control plane (standard support)", "cluster", price("eks_cluster_hour"), 1, 1)]
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
        if g.capacity_reservation_id and g.capacity_type == "onDemand":
            note = f"reservation {g.capacity_reservation_id} bills its unused instances at this rate too"
        items.append(LineItem(f"GPU nodes '{g.name}' ({it.name}, {it.gpus} x {it.gpu_model})", "node",
                              it.price_per_hour, busy, g.min_size, note=note))
        items.append(LineItem(f"EBS gp3 root volumes, '{g.name}' ({g.root_volume_gib} GiB each)", "GiB",
                              _gb_month("ebs_gp3_gb_month"), busy * g.root_volume_gib, g.min_size * g.root_volume_gib))
    items.append(LineItem(f"EFS Standard storage (assumed {EFS_ASSUMED_GB} GB)", "GB", _gb_month("efs_standard_gb_month"),
                          EFS_ASSUMED_GB, EFS_ASSUMED_GB,
                          note=f"plus Elastic Throughput ${price('efs_elastic_read_gb')}/GB read, "
                               f"${price('efs_elastic_write_gb')}/GB written"))
    if cfg.image.prebuilt is None:
        items.append(LineItem(f"ECR image storage (assumed {ECR_ASSUMED_GB} GB)", "GB", _gb_month("ecr_gb_month"),
                              ECR_ASSUMED_GB, ECR_ASSUMED_GB))
    items.append(LineItem("KMS keys (EKS secrets, EFS)", "key", price("kms_key_month") / HOURS_PER_MONTH,
                          KMS_KEYS, KMS_KEYS))
    logs_per_hour = LOGS_ASSUMED_GB_PER_DAY * price("logs_ingest_gb") / 24
    items.append(LineItem(f"CloudWatch Logs ingestion (assumed {LOGS_ASSUMED_GB_PER_DAY:g} GB/day)", "GB/day",
                          logs_per_hour / LOGS_ASSUMED_GB_PER_DAY, LOGS_ASSUMED_GB_PER_DAY, LOGS_ASSUMED_GB_PER_DAY))
    return items


def throughput(cfg: StackConfig) -> tuple[float, str]:
    """Estimated images/s of the whole job, and how it was derived."""
    it = catalog.lookup(cfg.job_group.instance_type)
    per_gpu = IMAGES_PER_SECOND[it.gpu_model] * MODEL_SPEED[cfg.job.model]
    gpus = cfg.job.nodes * it.gpus
    if gpus == 1:
        efficiency = 1.0
    elif cfg.job.nodes == 1 or cfg.job_group.efa:
        efficiency = SCALING_FAST
    else:
        efficiency = SCALING_TCP
    how = (f"{per_gpu:,.0f} images/s per {it.gpu_model} for {cfg.job.model} (estimate) x {gpus} GPUs"
           f" x {efficiency:g} data-parallel efficiency")
    return per_gpu * gpus * efficiency, how


def estimate(cfg: StackConfig) -> Estimate:
    """The stack's cost estimate from the catalog and :data:`PRICES`."""
    rate, how = throughput(cfg)
    images = cfg.job.epochs * CIFAR10_TRAIN_IMAGES
    assumptions = [
        f"prices are {PRICE_REGION} list prices (instances: {catalog.PRICE_SOURCE}, {catalog.PRICE_DATE}; "
        f"other services: {PRICE_DATE})"
        + ("" if cfg.region == PRICE_REGION else f"; {cfg.region} prices may differ by a few percent"),
        f"training: group '{cfg.job_group.name}' at job.nodes ({cfg.job.nodes}), other GPU groups at desiredSize; "
        "idle: GPU groups at minSize",
        f"a run: {cfg.job.epochs} epochs x {CIFAR10_TRAIN_IMAGES:,} images = {images:,} images at ~{rate:,.0f} "
        f"images/s ({how}) plus {RUN_OVERHEAD_MINUTES} min start-up and evaluation",
        f"sizes not fixed by the stack: EFS {EFS_ASSUMED_GB} GB, ECR {ECR_ASSUMED_GB} GB, "
        f"control-plane logs {LOGS_ASSUMED_GB_PER_DAY:g} GB/day; {HOURS_PER_MONTH} hours per month",
    ]
    not_included = [
        f"NAT gateway data processing (${price('nat_gateway_gb')}/GB)",
        f"EFS Elastic Throughput (${price('efs_elastic_read_gb')}/GB read, ${price('efs_elastic_write_gb')}/GB write)",
        "CloudWatch Logs storage beyond ingestion, data transfer out, burstable (t3) CPU credits",
    ]
    for g in cfg.node_groups:
        if g.capacity_reservation_id:
            it = catalog.lookup(g.instance_type)
            not_included.append(f"capacity reservation {g.capacity_reservation_id}: ${it.price_per_hour:g}/h per "
                                f"reserved {it.name} from its start to its end, nodes running or not (idle too)")
    return Estimate(region=cfg.region, items=tuple(_items(cfg)), run_images=images, images_per_second=rate,
                    overhead_hours=RUN_OVERHEAD_MINUTES / 60, assumptions=tuple(assumptions),
                    not_included=tuple(not_included))


def render(data: dict[str, Any]) -> str:
    """Human-readable form of ``Estimate.as_dict()`` (also of the ``costEstimate`` stack output)."""
    lines = [
        f"Estimated cost ({data['currency']}, {data['price_region']} list prices"
        + ("" if data["region"] == data["price_region"] else f"; stack region {data['region']} may differ") + ")",
        f"  while training: ${data['training_per_hour']:.2f}/hour",
        f"  while idle:     ${data['idle_per_hour']:.2f}/hour (~${data['idle_per_month']:,.0f}/month)",
        f"  per run:        ${data['per_run']:.2f} ({data['run_hours'] * 60:.0f} min: {int(data['run_images']):,} images "
        f"at ~{data['images_per_second']:,.0f} images/s, estimated, plus start-up)",
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
