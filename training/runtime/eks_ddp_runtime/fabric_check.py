"""Fabric check: prove the job's network before an expensive training run starts on it.

Run by torchrun on every node of the job (``python -m eks_ddp_runtime.fabric_check`` as the worker module,
the same agent command line as training), one process per GPU. It

1. records which transport the collective library picked on each rank: NCCL writes its INIT/NET log
   to a file (``NCCL_DEBUG_FILE``) that is parsed for ``Using network AWS Libfabric`` and
   ``NET/OFI Selected provider is efa`` (aws-ofi-nccl over EFA) versus ``Using network Socket``
   (TCP); gloo (CPU) is TCP by construction;
2. counts the EFA devices the pod was given (``/dev/infiniband/uverbs*``, what the EFA device plugin
   mounts);
3. times an all-reduce (sum, float32) over a sweep of message sizes, 8 B to 1 GiB on GPUs (4 MiB on
   CPU), and reports per size, as nccl-tests does (NVIDIA nccl-tests ``doc/PERFORMANCE.md``):
   ``time`` (the slowest rank's mean per iteration), algorithm bandwidth ``algbw = bytes / time``
   and bus bandwidth ``busbw = algbw * 2 (n - 1) / n`` for n ranks, the figure comparable with the
   hardware's link speed whatever the rank count;
4. measures each pair of neighbouring nodes on their own (:func:`pair_rounds`: the ring 0-1, 1-2, ..., n-1 - 0,
   in rounds of disjoint pairs, one all-reduce of the largest size per pair over a process group of the
   two nodes' ranks), so one slow node cannot hide in the whole job's figure: a node all of whose pairs are below
   the floor is named (:func:`slow_nodes`; with two nodes the pair is named, it cannot tell which);
5. fails (exit code :data:`FABRIC_FAILED`) when ``--require-efa`` and a rank has no EFA device or
   did not get the OFI/EFA transport, or when the peak bus bandwidth, or a pair's, is below ``--min-busbw-gbs``
   (the instance type's floor, passed by the Job from the catalog: near AWS's published two-node figure).

Rank 0 writes ``fabric.json`` to ``--run-dir`` (atomically) and prints a table; every rank exits
with the same code, so torchrun and the training Job (the check is its pods' init container: the pod failure policy
fails the Job on :data:`FABRIC_FAILED`) see the verdict; ``pulumi up`` does not wait for it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .contract import FABRIC_JSON, FABRIC_NODE_REPORT_PREFIX, NODE_NAME_ENV
from .exitcodes import FABRIC_FAILED, exit_process

GPU_MAX_BYTES = 1 << 30
CPU_MAX_BYTES = 4 << 20
DTYPE_BYTES = 4  # float32

_NETWORK = re.compile(r"Using network (.+?)\s*$", re.M)
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\w[\w-]*)")


@dataclass
class RankInfo:
    rank: int
    host: str
    node_rank: int
    """torchrun's GROUP_RANK: which agent (node) this rank belongs to."""
    local_rank: int
    backend: str
    transport: str
    """'efa', 'ofi:<provider>', 'socket', 'ib', 'gloo-tcp' or 'unknown'."""
    network: str | None = None
    """NCCL's 'Using network ...' name."""
    ofi_provider: str | None = None
    efa_devices: int = 0
    cuda_bad_fork: bool = False
    """This process was forked from one that had initialised CUDA: it can never use a GPU (launch.py)."""
    node: str | None = None
    """The Kubernetes node (``NODE_NAME``, the downward API's ``spec.nodeName``), when the pod was given it."""

    @property
    def where(self) -> str:
        return self.node or self.host


@dataclass
class PairResult:
    """One pair of nodes measured on their own: an all-reduce of ``bytes`` over both nodes' ranks."""

    node_ranks: list[int]
    nodes: list[str]
    bytes: int
    time_us: float
    busbw_gbs: float


@dataclass
class SizeResult:
    bytes: int
    count: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float


@dataclass
class Report:
    passed: bool
    reasons: list[str]
    backend: str
    world_size: int
    nodes: int
    require_efa: bool
    floor_busbw_gbs: float | None
    peak_busbw_gbs: float
    transports: list[str]
    instance_type: str | None
    ranks: list[RankInfo] = field(default_factory=list)
    results: list[SizeResult] = field(default_factory=list)
    iters: int = 0
    warmup: int = 0
    duration_s: float = 0.0
    torch_version: str = ""
    nccl_version: str | None = None
    pairs: list[PairResult] = field(default_factory=list)
    slow_nodes: list[str] = field(default_factory=list)


def sweep(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes`` (both included), multiplied by ``factor``."""
    if min_bytes < DTYPE_BYTES or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"sweep: got {min_bytes}..{max_bytes} x{factor}; expected {DTYPE_BYTES} <= min <= max, "
                         "factor >= 2")
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: each byte crosses 2 (n-1)/n of the ring."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 1 else 0.0


def parse_nccl_log(text: str) -> tuple[str, str | None, str | None]:
    """(transport, network, OFI provider) from NCCL's INIT/NET log lines."""
    networks = _NETWORK.findall(text)
    providers = _OFI_PROVIDER.findall(text)
    network = networks[-1].strip() if networks else None
    provider = providers[-1] if providers else None
    if network is None:
        return "unknown", None, provider
    low = network.lower()
    if "libfabric" in low or "ofi" in low:
        return ("efa" if provider == "efa" else f"ofi:{provider or 'unknown'}"), network, provider
    if low == "socket":
        return "socket", network, provider
    if low.startswith("ib"):
        return "ib", network, provider
    return "unknown", network, provider


def pair_rounds(nodes: int) -> list[list[tuple[int, int]]]:
    """The ring of ``nodes`` nodes (0-1, 1-2, ..., n-1 - 0; one pair for two nodes) in rounds of disjoint pairs, so
    every node is measured with both its neighbours and no link carries two pairs at once."""
    if nodes < 2:
        return []
    if nodes == 2:
        return [[(0, 1)]]
    edges = [(i, (i + 1) % nodes) for i in range(nodes)]
    rounds: list[list[tuple[int, int]]] = []
    for a, b in edges:
        for r in rounds:
            if not any({a, b} & set(p) for p in r):
                r.append((a, b))
                break
        else:
            rounds.append([(a, b)])
    return rounds


def slow_nodes(pairs: list[PairResult], floor_busbw_gbs: float | None) -> tuple[list[str], list[str]]:
    """(nodes all of whose measured pairs are below the floor, reasons naming them and the pairs no node explains)."""
    if floor_busbw_gbs is None or not pairs:
        return [], []
    slow = [p for p in pairs if p.busbw_gbs < floor_busbw_gbs]
    if not slow:
        return [], []
    # By node rank: two pods may share a host name (one machine in tests), never a node rank.
    by_node: dict[int, list[PairResult]] = {}
    name: dict[int, str] = {}
    for p in pairs:
        for rank, node in zip(p.node_ranks, p.nodes, strict=True):
            by_node.setdefault(rank, []).append(p)
            name[rank] = node
    named = sorted(r for r, ps in by_node.items() if len(ps) > 1 and all(p in slow for p in ps))
    reasons = []
    for r in named:
        figures = ", ".join(f"with {name[o]} {p.busbw_gbs:.2f} GB/s" for o, p in sorted(
            (next(x for x in p.node_ranks if x != r), p) for p in by_node[r]))
        reasons.append(f"slow node {name[r]}: every pair it was measured in is below the floor "
                       f"{floor_busbw_gbs:.2f} GB/s ({figures})")
    for p in slow:
        if not set(p.node_ranks) & set(named):
            alone = len(by_node[p.node_ranks[0]]) == 1
            reasons.append(f"slow pair {p.nodes[0]} - {p.nodes[1]}: {p.busbw_gbs:.2f} GB/s below the floor "
                           f"{floor_busbw_gbs:.2f} GB/s (one of the two"
                           + (", measured only together)" if alone else ", not slow with its other neighbour)"))
    return [name[r] for r in named], reasons


def count_efa_devices(dev_dir: str = "/dev/infiniband") -> int:
    """EFA devices in this container: the uverbs character devices the EFA device plugin mounts."""
    return len(glob.glob(os.path.join(dev_dir, "uverbs*")))


def evaluate(ranks: list[RankInfo], results: list[SizeResult], *, require_efa: bool,
             floor_busbw_gbs: float | None, pairs: list[PairResult] | None = None) -> list[str]:
    """Reasons the fabric is not fit for training (empty: it passed)."""
    reasons = []
    if require_efa:
        no_dev = sorted({r.host for r in ranks if r.efa_devices == 0})
        if no_dev:
            reasons.append("no EFA devices in the pod on " + ", ".join(no_dev) + " (/dev/infiniband/uverbs* "
                           "missing): the pod did not get vpc.amazonaws.com/efa devices, or the node has no EFA "
                           "interfaces or device plugin")
        wrong = sorted({f"{r.transport} on {r.host}" for r in ranks if r.transport != "efa"})
        if wrong:
            hint = ("NCCL fell back to TCP sockets (NET/Socket): the aws-ofi-nccl plugin or libfabric's EFA "
                    "provider did not load" if any(r.transport == "socket" for r in ranks) else "")
            reasons.append("transport is not OFI/EFA: " + ", ".join(wrong) + (f"; {hint}" if hint else ""))
    peak = max((r.busbw_gbs for r in results), default=0.0)
    if floor_busbw_gbs is not None and peak < floor_busbw_gbs:
        reasons.append(f"low bandwidth: peak all-reduce bus bandwidth {peak:.2f} GB/s is below the floor "
                       f"{floor_busbw_gbs:.2f} GB/s for this instance type")
    reasons += slow_nodes(pairs or [], floor_busbw_gbs)[1]
    return reasons


def table(report: Report) -> str:
    lines = [f"{'size':>12} {'count':>12} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"]
    for r in report.results:
        lines.append(f"{_human(r.bytes):>12} {r.count:>12} {r.time_us:>12.1f} {r.algbw_gbs:>12.3f} "
                     f"{r.busbw_gbs:>12.3f}")
    floor = f"{report.floor_busbw_gbs:.2f}" if report.floor_busbw_gbs is not None else "none"
    lines.append(f"ranks={report.world_size} nodes={report.nodes} backend={report.backend} "
                 f"transport={','.join(report.transports)} peak busbw={report.peak_busbw_gbs:.3f} GB/s "
                 f"floor={floor} GB/s")
    for p in report.pairs:
        lines.append(f"pair {p.nodes[0]} - {p.nodes[1]}: {_human(p.bytes)} busbw={p.busbw_gbs:.3f} GB/s")
    lines.append("FABRIC CHECK PASSED" if report.passed else "FABRIC CHECK FAILED: " + "; ".join(report.reasons))
    return "\n".join(lines)


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def write_report(run_dir: Path, report: Report) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / FABRIC_JSON
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".fabric.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(report), f, indent=2)
    os.replace(tmp, path)
    return path


NODE_REPORT_PREFIX = FABRIC_NODE_REPORT_PREFIX


def write_node_report(run_dir: Path, node: str, reason: str) -> Path | None:
    """The failed node-only check's verdict, atomically, beside ``fabric.json`` (which stays the job's check's);
    None when the run directory cannot be written (the exit code still fails the pod)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / f"{NODE_REPORT_PREFIX}{node}.json"
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".fabric-node.", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"passed": False, "node": node, "reasons": [reason], "node_only": True}, f, indent=2)
        os.replace(tmp, path)
        return path
    except OSError:
        return None


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eks_ddp_runtime.fabric_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, help="where fabric.json is written (the training run's directory)")
    p.add_argument("--require-efa", action="store_true", help="fail unless every rank has EFA devices and NCCL "
                   "picked the OFI/EFA transport")
    p.add_argument("--min-busbw-gbs", type=float, default=None, help="fail below this peak bus bandwidth (GB/s)")
    p.add_argument("--instance-type", default=None, help="recorded in fabric.json")
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=None,
                   help=f"largest message; default {_human(GPU_MAX_BYTES)} on GPUs, {_human(CPU_MAX_BYTES)} on CPU")
    p.add_argument("--factor", type=int, default=2, help="size step of the sweep")
    p.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size")
    p.add_argument("--timeout-s", type=float, default=600.0, help="process-group timeout")
    p.add_argument("--pass-marker", default=None, help="a file rank 0 creates when the check passed (the training "
                   "pods' gate reads it: a pod that starts later checks only its own node)")
    p.add_argument("--node-only", action="store_true", help="no process group: check this node alone (its EFA "
                   "devices), for a pod that joins after the job's check passed; writes no fabric.json, and on failure "
                   "fabric-node-<node>.json")
    return p.parse_args(argv)


def node_only(args: argparse.Namespace) -> int:
    """The check of one node that joins a job whose fabric already passed: what it can see without a peer."""
    devices = count_efa_devices()
    where = os.environ.get(NODE_NAME_ENV) or socket.gethostname()
    if args.require_efa and devices == 0:
        reason = (f"no EFA devices in the pod on {where} (/dev/infiniband/uverbs* missing): the pod did not get "
                  "vpc.amazonaws.com/efa devices, or the node has no EFA interfaces or device plugin")
        print(f"FABRIC CHECK FAILED (this node only): {reason}", file=sys.stderr)
        write_node_report(Path(args.run_dir), where, reason)
        return FABRIC_FAILED
    print(f"FABRIC CHECK PASSED (this node only: {devices} EFA device(s) on {where}; the job's fabric passed "
          "before it joined, its bandwidth is not measured)")
    return 0


def _nccl_log_setup() -> Path:
    # Before the process group exists: NCCL reads these when it initialises. The log goes to a file of
    # our own so the transport can be read back, not only printed.
    log = Path(tempfile.gettempdir()) / f"nccl-fabric-{os.getpid()}.log"
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    os.environ["NCCL_DEBUG_FILE"] = str(log)
    return log


def _measure(torch: Any, dist: Any, device: Any, sizes: list[int], iters: int, warmup: int,
             world: int) -> list[SizeResult]:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    results = []
    for size in sizes:
        count = max(1, size // DTYPE_BYTES)
        buf = torch.ones(count, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        sync()
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        seconds = float(elapsed.item())
        nbytes = count * DTYPE_BYTES
        algbw = nbytes / seconds / 1e9
        results.append(SizeResult(bytes=nbytes, count=count, time_us=round(seconds * 1e6, 2),
                                  algbw_gbs=round(algbw, 4), busbw_gbs=round(bus_bandwidth(algbw, world), 4)))
        del buf
    return results


def _measure_pairs(torch: Any, dist: Any, device: Any, infos: list[RankInfo], nbytes: int, iters: int,
                   warmup: int) -> list[PairResult]:
    """Each round of :func:`pair_rounds` at once: every pair all-reduces over its own group, every rank creating
    every group in the same order (``new_group`` is collective over the default group)."""
    node_ranks = sorted({r.node_rank for r in infos})
    members = {n: [r.rank for r in infos if r.node_rank == n] for n in node_ranks}
    names = {n: next(r.where for r in infos if r.node_rank == n) for n in node_ranks}
    me = dist.get_rank()
    out: list[PairResult] = []
    count = max(1, nbytes // DTYPE_BYTES)
    for round_ in pair_rounds(len(node_ranks)):
        mine = None
        groups = []
        for a, b in round_:
            ranks = sorted(members[node_ranks[a]] + members[node_ranks[b]])
            group = dist.new_group(ranks)
            groups.append(((a, b), ranks, group))
            if me in ranks:
                mine = ((a, b), ranks, group)
        seconds = 0.0
        if mine is not None:
            _, ranks, group = mine
            buf = torch.ones(count, dtype=torch.float32, device=device)
            for _ in range(warmup):
                dist.all_reduce(buf, group=group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dist.barrier(group=group)
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf, group=group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
            seconds = float(elapsed.item())
            del buf
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (list(mine[0]) if mine else None, seconds))
        for (a, b), ranks, _ in groups:
            t = max(sec for pair, sec in gathered if pair == [a, b])
            algbw = count * DTYPE_BYTES / t / 1e9
            out.append(PairResult(node_ranks=[node_ranks[a], node_ranks[b]],
                                  nodes=[names[node_ranks[a]], names[node_ranks[b]]], bytes=count * DTYPE_BYTES,
                                  time_us=round(t * 1e6, 2),
                                  busbw_gbs=round(bus_bandwidth(algbw, len(ranks)), 4)))
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.node_only:
        return node_only(args)
    log_path = _nccl_log_setup()
    started = time.monotonic()

    import torch
    import torch.distributed as dist

    from . import compat
    from .dist import process_group

    bad_fork = bool(compat.in_bad_fork())
    if bad_fork and torch.cuda.is_available():
        # set_device would raise "Cannot re-initialize CUDA in forked subprocess"; say why, as the verdict.
        print("FABRIC CHECK FAILED: this worker was forked from a process that had initialised CUDA and cannot "
              "use its GPU; start workers as fresh processes (EKS_DDP_FORK_WORKERS=0)", file=sys.stderr)
        return FABRIC_FAILED
    with process_group(timeout_s=args.timeout_s) as env:
        if not env.distributed:
            print("fabric_check: not launched by torchrun (no MASTER_ADDR): measuring a world of one",
                  file=sys.stderr)
        world = env.world_size
        max_bytes = args.max_bytes or (GPU_MAX_BYTES if env.device.type == "cuda" else CPU_MAX_BYTES)
        sizes = sweep(args.min_bytes, max_bytes, args.factor)
        if env.distributed:
            results = _measure(torch, dist, env.device, sizes, args.iters, args.warmup, world)
        else:
            results = []
        if env.backend == "nccl":
            transport, network, provider = parse_nccl_log(log_path.read_text(errors="replace")
                                                          if log_path.exists() else "")
        else:
            transport, network, provider = "gloo-tcp", None, None
        mine = RankInfo(rank=env.rank, host=socket.gethostname(), node_rank=int(os.environ.get("GROUP_RANK", "0")),
                        local_rank=env.local_rank, backend=env.backend,
                        transport=transport, network=network, ofi_provider=provider,
                        efa_devices=count_efa_devices(), cuda_bad_fork=bad_fork,
                        node=os.environ.get(NODE_NAME_ENV) or None)
        ranks: list[Any] = [None] * world
        if env.distributed:
            dist.all_gather_object(ranks, asdict(mine))
        else:
            ranks = [asdict(mine)]
        infos = [RankInfo(**r) for r in ranks]
        pairs = _measure_pairs(torch, dist, env.device, infos, max_bytes, args.iters, args.warmup) \
            if env.distributed else []
        reasons = evaluate(infos, results, require_efa=args.require_efa, floor_busbw_gbs=args.min_busbw_gbs,
                           pairs=pairs)
        nccl = None
        if env.backend == "nccl":
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        report = Report(
            passed=not reasons, reasons=reasons, backend=env.backend, world_size=world,
            nodes=len({r.node_rank for r in infos}), require_efa=args.require_efa,
            floor_busbw_gbs=args.min_busbw_gbs, peak_busbw_gbs=max((r.busbw_gbs for r in results), default=0.0),
            transports=sorted({r.transport for r in infos}), instance_type=args.instance_type, ranks=infos,
            results=results, iters=args.iters, warmup=args.warmup,
            duration_s=round(time.monotonic() - started, 2), torch_version=torch.__version__, nccl_version=nccl,
            pairs=pairs, slow_nodes=slow_nodes(pairs, args.min_busbw_gbs)[0])
        if env.is_main:
            path = write_report(Path(args.run_dir), report)
            print(table(report))
            print(f"fabric_check: wrote {path}")
            if report.passed and args.pass_marker:
                Path(args.pass_marker).touch()
        if env.distributed:
            dist.barrier()  # nobody tears the group down while rank 0 still writes
    return 0 if report.passed else FABRIC_FAILED


if __name__ == "__main__":
    exit_process(main())  # the verdict is final before interpreter shutdown, which can abort (exitcodes.py)
