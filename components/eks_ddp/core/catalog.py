"""Instance-type catalog: the one table that drives validation, EFA wiring,
torchrun's ``--nproc-per-node``, GPU limits and cost estimates.

Prices are Linux on-demand $/hour in us-east-1 as published on the AWS EC2
on-demand pricing page on ``PRICE_DATE`` (a row says so when its source differs). Other regions
differ (usually by a few percent); the cost estimate says so when it prints.

A type the table does not list can be added: :func:`register` from Python, or the stack key
``eks-ddp:catalog`` (the stack config registers its entries). Either way the type is checked like
the built-in rows (name shape, counts, x86_64: the node groups run x86_64 AMIs).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

PRICE_DATE = "2025-10-01"
PRICE_SOURCE = "AWS EC2 On-Demand Pricing page, Linux, us-east-1"

#: An EC2 instance type name: family (letters, digits, '-'), a dot, a size (``g6e.12xlarge``, ``p6-b200.48xlarge``).
TYPE_NAME = re.compile(r"^[a-z][a-z0-9-]*[0-9][a-z0-9-]*\.[a-z0-9]+$")
#: Families of Graviton (arm64) types: a 'g' after the generation digit (m7g, c7gn, g5g, t4g, x2gd,
#: p6e-gb200). The GPU and system node groups run x86_64 AMIs, on which these never boot.
ARM64_FAMILY = re.compile(r"^[a-z]+[0-9]+[a-z-]*g")
#: Bounds of what a type may say (the largest EC2 types today: 8 GPUs, 32 EFA cards, 896 vCPUs).
MAX_GPUS = 16
MAX_EFA = 32
#: A GPU model as the node label nvidia-<model> carries it (L40S, H200, A100).
GPU_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,30}$")


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def instance_type_problems(it: Any, key: str, *, names: dict[str, str] | None = None) -> list[str]:
    """What is wrong with a type's description, one line per field named ``<key>.<field>``.

    ``names`` maps field names to the keys to report (the stack config's camelCase); default the field names."""
    n = names or {}

    def k(field: str) -> str:
        return f"{key}.{n.get(field, field)}"

    p: list[str] = []
    name = it.name
    if not isinstance(name, str) or not TYPE_NAME.match(name):
        p.append(f"{k('name')}: got {name!r}; expected an EC2 instance type name such as g6e.12xlarge")
    elif ARM64_FAMILY.match(name):
        p.append(f"{k('name')}: got {name!r}, a Graviton (arm64) type; expected an x86_64 type (the node groups run "
                 "x86_64 AMIs)")
    if not _whole(it.gpus, 0, MAX_GPUS):
        p.append(f"{k('gpus')}: got {it.gpus!r}; expected a whole number from 0 to {MAX_GPUS}")
    elif it.gpus > 0 and (not isinstance(it.gpu_model, str) or not GPU_MODEL.match(it.gpu_model)):
        p.append(f"{k('gpu_model')}: got {it.gpu_model!r}; expected the NVIDIA GPU model, e.g. L40S or H200 "
                 "(letters, digits, '-')")
    elif it.gpus == 0 and it.gpu_model:
        p.append(f"{k('gpu_model')}: got {it.gpu_model!r} with {n.get('gpus', 'gpus')} 0; expected no GPU model")
    if not _whole(it.gpu_memory_gib, 0, 4096) or (_whole(it.gpus, 1, MAX_GPUS) and it.gpu_memory_gib == 0):
        p.append(f"{k('gpu_memory_gib')}: got {it.gpu_memory_gib!r}; expected the memory of one GPU in GiB "
                 "(a whole number, 0 for CPU types)")
    if not _whole(it.vcpus, 1, 4096):
        p.append(f"{k('vcpus')}: got {it.vcpus!r}; expected a whole number >= 1")
    if not _whole(it.memory_gib, 1, 65536):
        p.append(f"{k('memory_gib')}: got {it.memory_gib!r}; expected the instance memory in GiB (a whole number "
                 ">= 1)")
    if not _whole(it.efa_interfaces, 0, MAX_EFA):
        p.append(f"{k('efa_interfaces')}: got {it.efa_interfaces!r}; expected a whole number from 0 (no EFA) to "
                 f"{MAX_EFA}")
    price = it.price_per_hour
    if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
        p.append(f"{k('price_per_hour')}: got {price!r}; expected the on-demand $/hour (a number > 0)")
    nvme = getattr(it, "local_nvme_gb", 0)
    if not _whole(nvme, 0, 1_000_000):
        p.append(f"{k('local_nvme_gb')}: got {nvme!r}; expected the instance store in GB (a whole number, 0 for none)")
    gbps = it.network_gbps
    if gbps is not None and not _whole(gbps, 1, 100_000):
        p.append(f"{k('network_gbps')}: got {gbps!r}; expected the per-node network bandwidth in Gbps")
    return p


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
    network_gbps: int | None = None
    """Per-node network bandwidth (Gbps) for the fabric check's floor; built-in rows use NETWORK_GBPS."""
    local_nvme_gb: int = 0
    """NVMe instance store, GB in all (0: EBS only, or not known): the GPU node groups stripe it as RAID0 for the
    kubelet's and containerd's directories (images, emptyDir scratch). Built-in rows: :data:`LOCAL_NVME_GB`."""
    price_date: str = PRICE_DATE
    """When ``price_per_hour`` was read."""
    price_source: str = PRICE_SOURCE
    """Where ``price_per_hour`` comes from."""

    def __post_init__(self) -> None:
        problems = instance_type_problems(self, "InstanceType")
        if problems:
            raise ValueError("; ".join(problems))

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
    # NVIDIA L40S (Ada: bf16). Prices: AWS EC2 On-Demand Pricing page, us-east-1, cross-checked on
    # 2026-11-25 against a public price table that lists the same g4dn/g5/g6/p4d/p5 prices as the rows above.
    # EFA: 8xlarge and up. Network cards: AWS EC2 User Guide, "Maximize network bandwidth ... with multiple network
    # cards" (efa-acc-inst-types): "G6e instances support up to four network cards and up to 400 Gbps" (48xlarge);
    # 24xlarge has 2 cards (200 Gbps), 8/12/16xlarge 1. Preflight compares the count with AWS's
    # MaximumEfaInterfaces and warns when AWS reports fewer.
    _gpu("g6e.xlarge", 1, "L40S", 48, 4, 32, 0, 1.861, True),
    _gpu("g6e.2xlarge", 1, "L40S", 48, 8, 64, 0, 2.24208, True),
    _gpu("g6e.4xlarge", 1, "L40S", 48, 16, 128, 0, 3.00424, True),
    _gpu("g6e.8xlarge", 1, "L40S", 48, 32, 256, 1, 4.52856, True),
    _gpu("g6e.12xlarge", 4, "L40S", 48, 48, 384, 1, 10.49264, True),
    _gpu("g6e.16xlarge", 1, "L40S", 48, 64, 512, 1, 7.57719, True),
    _gpu("g6e.24xlarge", 4, "L40S", 48, 96, 768, 2, 15.06559, True),
    _gpu("g6e.48xlarge", 8, "L40S", 48, 192, 1536, 4, 30.13118, True),
    # NVIDIA H200 (141 GB). p5e: "P5 and P5e instances support up to 32 network cards and up to 3200 Gbps"
    # (same User Guide page, which configures both with EFA-only secondary interfaces). p5e has no on-demand
    # list price (AWS sells it through Capacity Blocks): its estimate uses p5en's on-demand rate, and says so.
    # p5en: 16 EFAv3 cards x 200 Gbps = 3200 Gbps (EC2 accelerated-computing specifications; torchx's AWS
    # named resources also give p5en 16 EFA devices); EFA-only secondaries as the User Guide recommends.
    dataclasses.replace(_gpu("p5e.48xlarge", 8, "H200", 141, 192, 2048, 32, 63.296, True), efa_only_secondary=True,
                        price_source="no on-demand list price (Capacity Blocks only): p5en.48xlarge's on-demand "
                                     "rate, AWS EC2 On-Demand Pricing page, us-east-1", price_date="2026-11-25"),
    dataclasses.replace(_gpu("p5en.48xlarge", 8, "H200", 141, 192, 2048, 16, 63.296, True), efa_only_secondary=True,
                        price_date="2026-11-25"),
    # CPU types for the system node group: x86_64 (the system group runs AL2023_x86_64_STANDARD), at least
    # 2 vCPUs and 4 GiB (CoreDNS, etcd, the autoscaler, the add-ons and data prep share them). A type not listed
    # here can be registered (catalog.register, or eks-ddp:catalog) rather than accepted by name shape alone:
    # the cost estimate and preflight's vCPU quota need its vCPUs and price, and a name-shape rule would let
    # arm64 (m7g.large) or 1 GiB (t3.micro) types through, which fail only minutes into `pulumi up`.
    _cpu("t3.medium", 2, 4, 0.0416),
    _cpu("t3.large", 2, 8, 0.0832),
    _cpu("t3.xlarge", 4, 16, 0.1664),
    _cpu("m6i.large", 2, 8, 0.096),
    _cpu("m6i.xlarge", 4, 16, 0.192),
    _cpu("m7i.large", 2, 8, 0.1008),
    _cpu("m7i.xlarge", 4, 16, 0.2016),
    _cpu("c6i.xlarge", 4, 8, 0.17),
    # Added 2026-11-25 (same pricing page; m6a/c6a/m7i cross-checked against the 2xlarge prices of the
    # public table above, which are exactly twice these).
    _cpu("m5.large", 2, 8, 0.096),
    _cpu("m5.xlarge", 4, 16, 0.192),
    _cpu("m6a.large", 2, 8, 0.0864),
    _cpu("m6a.xlarge", 4, 16, 0.1728),
    _cpu("m6i.2xlarge", 8, 32, 0.384),
    _cpu("m7i.2xlarge", 8, 32, 0.4032),
    _cpu("t3a.medium", 2, 4, 0.0376),
    _cpu("t3a.large", 2, 8, 0.0752),
    _cpu("t3a.xlarge", 4, 16, 0.1504),
    _cpu("c5.xlarge", 4, 8, 0.17),
    _cpu("c6a.xlarge", 4, 8, 0.153),
)

# --- instance store ---------------------------------------------------------------------------------------
#
# NVMe instance store per type, GB in all: the label karpenter.k8s.aws/instance-local-nvme of Karpenter's instance
# type reference, which it generates from EC2 DescribeInstanceTypes (aws/karpenter-provider-aws
# website/content/en/docs/reference/instance-types.md at 1d927085, 2026-08-21). The g4dn, g5, p4d and p4de rows agree
# with the EC2 User Guide's "Instance store volumes" table (awsdocs/amazon-ec2-user-guide
# doc_source/InstanceStorage.md at e3707c4, 2023-06-15; e.g. p4de.24xlarge "8 x 1000 GB NVMe SSD"). The CPU types
# of the system group have none (EBS only).
LOCAL_NVME_GB: dict[str, int] = {
    "g4dn.xlarge": 125, "g4dn.2xlarge": 225, "g4dn.4xlarge": 225, "g4dn.8xlarge": 900, "g4dn.12xlarge": 900,
    "g4dn.16xlarge": 900, "g4dn.metal": 1800,
    "g5.xlarge": 250, "g5.2xlarge": 450, "g5.4xlarge": 600, "g5.8xlarge": 900, "g5.12xlarge": 3800,
    "g5.24xlarge": 3800, "g5.48xlarge": 7600,
    "g6.xlarge": 250, "g6.2xlarge": 450, "g6.4xlarge": 600, "g6.8xlarge": 900, "g6.12xlarge": 3760,
    "g6.24xlarge": 3760, "g6.48xlarge": 7520,
    "g6e.xlarge": 250, "g6e.2xlarge": 450, "g6e.4xlarge": 600, "g6e.8xlarge": 900, "g6e.12xlarge": 3800,
    "g6e.16xlarge": 1900, "g6e.24xlarge": 3800, "g6e.48xlarge": 7600,
    "p4d.24xlarge": 8000, "p4de.24xlarge": 8000, "p5.48xlarge": 30400, "p5e.48xlarge": 30400, "p5en.48xlarge": 30400,
}
# Source of LOCAL_NVME_GB: Karpenter's instance type reference (karpenter.k8s.aws/instance-local-nvme, from EC2
# DescribeInstanceTypes), 2026-08-21.
_TYPES = tuple(dataclasses.replace(t, local_nvme_gb=LOCAL_NVME_GB.get(t.name, 0)) for t in _TYPES)

CATALOG: dict[str, InstanceType] = {t.name: t for t in _TYPES}
#: The rows above, before anything is registered.
BUILTIN: frozenset[str] = frozenset(CATALOG)

# --- fabric floors: the fabric check's pass mark ---------------------------------------------------------
#
# Per-node network bandwidth (Gbps) of the EFA-capable GPU types, as AWS lists it ("Network bandwidth")
# in the Amazon EC2 instance type specifications for accelerated computing
# (https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html) and on the P4, P5, G4dn, G5 and G6
# product pages.
NETWORK_GBPS: dict[str, int] = {
    "p4d.24xlarge": 400, "p4de.24xlarge": 400, "p5.48xlarge": 3200, "p5e.48xlarge": 3200, "p5en.48xlarge": 3200,
    "g6e.8xlarge": 25, "g6e.12xlarge": 100, "g6e.16xlarge": 35, "g6e.24xlarge": 200, "g6e.48xlarge": 400,
    "g4dn.8xlarge": 50, "g4dn.12xlarge": 50, "g4dn.16xlarge": 50, "g4dn.metal": 100,
    "g5.8xlarge": 25, "g5.12xlarge": 40, "g5.24xlarge": 50, "g5.48xlarge": 100,
    "g6.8xlarge": 25, "g6.12xlarge": 40, "g6.24xlarge": 50, "g6.48xlarge": 100,
}
NETWORK_SOURCE = "AWS EC2 instance type specifications, accelerated computing: network bandwidth"
# Where AWS publishes a two-node all-reduce, the floor is a fraction of that figure; elsewhere a quarter of the
# line rate (a model: busbw counts the NVLink part of the ring too, so a healthy fabric's busbw exceeds line rate / 8,
# and this floor is loose there). TCP fallback is caught by the transport check, not the floor.
FABRIC_FLOOR_FRACTION = 0.25
PUBLISHED_BUSBW_SOURCE = ("aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md, \"Results\" "
                          "(commit 0162aacd): all_reduce_perf, float sum, 2 nodes x 8 GPUs, out-of-place busbw at "
                          "1 GiB, the fabric check's largest message")
PUBLISHED_BUSBW_GBS: dict[str, tuple[float, str]] = {
    "p4de.24xlarge": (76.79, "2x p4de.24xlarge"),
    "p4d.24xlarge": (76.79, "p4de's figure: the same 4 x 100 Gbps EFA cards and NVSwitch, only HBM differs"),
    "p5.48xlarge": (436.95, "2x p5.48xlarge"),
    "p5e.48xlarge": (436.95, "p5's figure: the same 32 x 100 Gbps EFA cards (EC2 User Guide, P5/P5e EFA)"),
    "p5en.48xlarge": (436.95, "p5's figure: the same 3200 Gbps per node (16 x 200 Gbps EFAv3)"),
}
"""Published two-node all-reduce bus bandwidth (GB/s) at 1 GiB, per type, and which measurement it is."""
PUBLISHED_FLOOR_FRACTION = 0.6
"""The floor's share of the published figure. A node whose traffic runs over one EFA card of four reaches about a
quarter of it (p4de: ~19 GB/s against 76.8; a model: the inter-node part of the ring scales with the cards), two of
four about half: both fail. The 40 % margin covers what the project's pods lack beside AWS's benchmark job
(``NCCL_BUFFSIZE``, ``NCCL_P2P_NET_CHUNKSIZE``, huge pages) and run-to-run noise at 1 GiB."""


def _network_gbps(name: str) -> tuple[int | None, str]:
    if name in NETWORK_GBPS:
        return NETWORK_GBPS[name], NETWORK_SOURCE
    it = CATALOG.get(name)
    if it is not None and it.has_efa and it.network_gbps:
        return it.network_gbps, "registered with the type"
    return None, ""


def fabric_floor_gbs(name: str) -> float | None:
    """Lowest acceptable all-reduce bus bandwidth (GB/s) of ``name`` at 1 GiB between two nodes (each pair the check
    measures, and the whole job's peak); None without EFA."""
    if name in PUBLISHED_BUSBW_GBS:
        return round(PUBLISHED_BUSBW_GBS[name][0] * PUBLISHED_FLOOR_FRACTION, 2)
    gbps, _ = _network_gbps(name)
    return None if gbps is None else gbps / 8 * FABRIC_FLOOR_FRACTION


def fabric_floor_source(name: str) -> str:
    if name in PUBLISHED_BUSBW_GBS:
        busbw, which = PUBLISHED_BUSBW_GBS[name]
        return (f"{name}: published {busbw} GB/s ({which}; {PUBLISHED_BUSBW_SOURCE}) x {PUBLISHED_FLOOR_FRACTION} "
                f"= {fabric_floor_gbs(name)} GB/s")
    gbps, source = _network_gbps(name)
    if gbps is None:
        return f"{name}: no EFA, no floor"
    return (f"{name}: no published all-reduce figure; modelled from {gbps} Gbps per node ({source}) / 8 x "
            f"{FABRIC_FLOOR_FRACTION} = {fabric_floor_gbs(name)} GB/s")


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


def register(it: InstanceType, *, replace: bool = False) -> InstanceType:
    """Add a type the built-in table does not list (or, with ``replace``, correct one), for every component.

    Registering the same description twice is a no-op; a different one for a known name is a ValueError
    unless ``replace``. An EFA type needs ``network_gbps`` (the fabric check's floor)."""
    if not isinstance(it, InstanceType):
        raise TypeError(f"catalog.register: got {type(it).__name__}; expected an InstanceType")
    if it.has_efa and it.gpus > 0 and not it.network_gbps and it.name not in NETWORK_GBPS:
        raise ValueError(f"InstanceType.network_gbps: required for {it.name}, which has {it.efa_interfaces} EFA "
                         "interfaces; expected its per-node network bandwidth in Gbps (the fabric check's floor)")
    known = CATALOG.get(it.name)
    if known is not None and known != it and not replace:
        raise ValueError(f"InstanceType.name: {it.name!r} is already in the catalog as {known}; expected a new name, "
                         "or register(..., replace=True) to correct it")
    CATALOG[it.name] = it
    return it


def unregister(name: str) -> None:
    """Remove a registered type (built-in rows stay)."""
    if name in BUILTIN:
        raise ValueError(f"catalog.unregister: {name!r} is a built-in type")
    CATALOG.pop(name, None)
