"""Instance-type catalog: the one table that drives validation, EFA wiring,
torchrun's ``--nproc-per-node``, GPU limits and cost estimates.

Prices are Linux on-demand $/hour in us-east-1 as published on the AWS EC2
on-demand pricing page on ``PRICE_DATE``. Other regions differ (usually by a
few percent); the cost estimate says so when it prints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

PRICE_DATE = "2025-10-01"
PRICE_SOURCE = "AWS EC2 On-Demand Pricing page, Linux, us-east-1"


@dataclass(frozen=True, kw_only=True)
class InstanceType:
    """One EC2 instance type as eks-ddp needs to know it."""

    name: str
    """The EC2 instance type, e.g. ``g4dn.xlarge``."""
    gpus: int
    """NVIDIA GPUs per instance (0 for CPU types)."""
    gpu_model: str
    """GPU model, e.g. ``T4`` ('' for CPU types)."""
    gpu_memory_gib: int
    """Memory per GPU in GiB (0 for CPU types)."""
    vcpus: int
    """vCPUs per instance; counts against the EC2 vCPU quotas."""
    memory_gib: int
    """Instance memory in GiB."""
    efa_interfaces: int
    """EFA-capable network cards; 0 when the type has no EFA."""
    price_per_hour: float
    """On-demand $/hour (see ``PRICE_DATE`` and ``PRICE_SOURCE``)."""
    bf16: bool = False
    """Whether the GPU does bf16 matmuls natively (Ampere and newer)."""
    efa_only_secondary: bool = False
    """EFA interfaces on cards > 0 are ``efa-only`` (no IP address), as AWS configures p5 for full bandwidth."""

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def quota_class(self) -> str:
        """EC2 on-demand vCPU quota bucket: 'G' (G and VT), 'P', or 'Standard'."""
        if self.family.startswith(("g", "vt")):
            return "G"
        if self.family.startswith("p"):
            return "P"
        return "Standard"

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0


def _gpu(name: str, gpus: int, model: str, gmem: int, vcpus: int, mem: int,
         efa: int, price: float, bf16: bool) -> InstanceType:
    return InstanceType(name=name, gpus=gpus, gpu_model=model, gpu_memory_gib=gmem,
                        vcpus=vcpus, memory_gib=mem, efa_interfaces=efa,
                        price_per_hour=price, bf16=bf16)


def _cpu(name: str, vcpus: int, mem: int, price: float) -> InstanceType:
    return InstanceType(name=name, gpus=0, gpu_model="", gpu_memory_gib=0, vcpus=vcpus,
                        memory_gib=mem, efa_interfaces=0, price_per_hour=price)


_TYPES: tuple[InstanceType, ...] = (
    # NVIDIA T4 (Turing: fp16, no bf16)
    _gpu("g4dn.xlarge", 1, "T4", 16, 4, 16, 0, 0.526, False),
    _gpu("g4dn.2xlarge", 1, "T4", 16, 8, 32, 0, 0.752, False),
    _gpu("g4dn.4xlarge", 1, "T4", 16, 16, 64, 0, 1.204, False),
    _gpu("g4dn.8xlarge", 1, "T4", 16, 32, 128, 1, 2.176, False),
    _gpu("g4dn.12xlarge", 4, "T4", 16, 48, 192, 1, 3.912, False),
    _gpu("g4dn.16xlarge", 1, "T4", 16, 64, 256, 1, 4.352, False),
    _gpu("g4dn.metal", 8, "T4", 16, 96, 384, 1, 7.824, False),
    # NVIDIA A10G
    _gpu("g5.xlarge", 1, "A10G", 24, 4, 16, 0, 1.006, True),
    _gpu("g5.2xlarge", 1, "A10G", 24, 8, 32, 0, 1.212, True),
    _gpu("g5.4xlarge", 1, "A10G", 24, 16, 64, 0, 1.624, True),
    _gpu("g5.8xlarge", 1, "A10G", 24, 32, 128, 1, 2.448, True),
    _gpu("g5.12xlarge", 4, "A10G", 24, 48, 192, 1, 5.672, True),
    _gpu("g5.24xlarge", 4, "A10G", 24, 96, 384, 1, 8.144, True),
    _gpu("g5.48xlarge", 8, "A10G", 24, 192, 768, 1, 16.288, True),
    # NVIDIA L4
    _gpu("g6.xlarge", 1, "L4", 24, 4, 16, 0, 0.8048, True),
    _gpu("g6.2xlarge", 1, "L4", 24, 8, 32, 0, 0.9776, True),
    _gpu("g6.4xlarge", 1, "L4", 24, 16, 64, 0, 1.3232, True),
    _gpu("g6.8xlarge", 1, "L4", 24, 32, 128, 1, 2.0144, True),
    _gpu("g6.12xlarge", 4, "L4", 24, 48, 192, 1, 4.6016, True),
    _gpu("g6.24xlarge", 4, "L4", 24, 96, 384, 1, 6.6752, True),
    _gpu("g6.48xlarge", 8, "L4", 24, 192, 768, 1, 13.3504, True),
    # NVIDIA A100 / H100
    _gpu("p4d.24xlarge", 8, "A100", 40, 96, 1152, 4, 21.96, True),
    _gpu("p4de.24xlarge", 8, "A100", 80, 96, 1152, 4, 27.447, True),
    # p5: AWS "EFA configuration for P5 and P5e instances" (EC2 User Guide, efa-acc-inst-types): EFA-only
    # interfaces on the non-primary cards; 32 'efa' interfaces would also take 32 subnet IPs per node.
    dataclasses.replace(_gpu("p5.48xlarge", 8, "H100", 80, 192, 2048, 32, 55.04, True), efa_only_secondary=True),
    # CPU types for the system node group
    _cpu("t3.medium", 2, 4, 0.0416),
    _cpu("t3.large", 2, 8, 0.0832),
    _cpu("t3.xlarge", 4, 16, 0.1664),
    _cpu("m6i.large", 2, 8, 0.096),
    _cpu("m6i.xlarge", 4, 16, 0.192),
    _cpu("m7i.large", 2, 8, 0.1008),
    _cpu("m7i.xlarge", 4, 16, 0.2016),
    _cpu("c6i.xlarge", 4, 8, 0.17),
)

CATALOG: dict[str, InstanceType] = {t.name: t for t in _TYPES}

# --- fabric floors: the fabric check's pass mark ---------------------------------------------------------
#
# Per-node network bandwidth (Gbps) of the EFA-capable GPU types, as AWS lists it ("Network bandwidth")
# in the Amazon EC2 instance type specifications for accelerated computing
# (https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html) and on the P4, P5, G4dn, G5 and G6
# product pages. Across nodes an all-reduce's bus bandwidth (nccl-tests doc/PERFORMANCE.md: "busbw",
# comparable to the hardware's peak) is bounded by this line rate / 8 (GB/s).
NETWORK_GBPS: dict[str, int] = {
    "p4d.24xlarge": 400, "p4de.24xlarge": 400, "p5.48xlarge": 3200,
    "g4dn.8xlarge": 50, "g4dn.12xlarge": 50, "g4dn.16xlarge": 50, "g4dn.metal": 100,
    "g5.8xlarge": 25, "g5.12xlarge": 40, "g5.24xlarge": 50, "g5.48xlarge": 100,
    "g6.8xlarge": 25, "g6.12xlarge": 40, "g6.24xlarge": 50, "g6.48xlarge": 100,
}
NETWORK_SOURCE = "AWS EC2 instance type specifications, accelerated computing: network bandwidth"
# The floor is a quarter of the line rate: far enough below what a healthy EFA fabric reaches at large
# messages that tuning noise never trips it, high enough that a fabric running at a fraction of its speed
# (one NIC of four, a wrong placement) does. TCP fallback is caught by the transport check, not the floor.
FABRIC_FLOOR_FRACTION = 0.25


def fabric_floor_gbs(name: str) -> float | None:
    """Lowest acceptable peak all-reduce bus bandwidth (GB/s) across nodes of ``name``; None without EFA."""
    gbps = NETWORK_GBPS.get(name)
    return None if gbps is None else gbps / 8 * FABRIC_FLOOR_FRACTION


def fabric_floor_source(name: str) -> str:
    gbps = NETWORK_GBPS.get(name)
    if gbps is None:
        return f"{name}: no EFA, no floor"
    return (f"{name}: {gbps} Gbps per node ({NETWORK_SOURCE}) / 8 x {FABRIC_FLOOR_FRACTION} "
            f"= {fabric_floor_gbs(name)} GB/s")


def lookup(name: str) -> InstanceType:
    """Return the catalog entry for ``name``; KeyError lists what is known."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"unknown instance type {name!r}; known: {', '.join(sorted(CATALOG))}") from None


def gpu_types() -> list[str]:
    return sorted(n for n, t in CATALOG.items() if t.gpus > 0)


def cpu_types() -> list[str]:
    return sorted(n for n, t in CATALOG.items() if t.gpus == 0)
