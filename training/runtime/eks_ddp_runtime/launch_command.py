"""The one place that builds the torchrun agent's command line.

The cluster's ElasticJob pods and the local runner (``python -m eks_ddp_local``)
both call :func:`job_command`, so the job tested on a laptop is the job that
runs on EKS. The agent is ``python -m eks_ddp_runtime.launch`` (torchrun's flags, the Job's
exit-code contract, an etcd rendezvous that survives etcd restarting). Pure Python: no Pulumi, no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from eks_ddp_runtime.contract import DATA_DIR_ENV, DATA_SUBDIR, RUN_DIR_ENV, RUNS_SUBDIR, SHARED_ROOT

__all__ = [  # the builder, and the contract's shared-volume paths that its callers take from here
    "AGENT_ENV",
    "CLUSTER_TIMEOUTS",
    "CLUSTER_TLS",
    "DATA_SUBDIR",
    "DEFAULT_MAX_RESTARTS",
    "ETCD_BACKEND",
    "FABRIC_CHECK_MODULE",
    "LAUNCHER_BACKENDS",
    "LAUNCHER_MODULE",
    "LOCAL_TIMEOUTS",
    "DATA_DIR_REF",
    "PEER_DEADLINE_S",
    "RDZV_TLS_DIR",
    "RUN_DIR_REF",
    "RUNS_SUBDIR",
    "SHARED_ROOT",
    "TRAIN_MODULE",
    "AgentOptions",
    "FabricCheckOptions",
    "RdzvTimeouts",
    "RdzvTls",
    "TrainerFlags",
    "cluster_timeouts",
    "fabric_check_command",
    "job_command",
    "module_command",
    "script_command",
    "torchrun_args",
]

LAUNCHER_MODULE = "eks_ddp_runtime.launch"
"""The agent: torchrun with the Job's exit-code contract and the store-tolerant rendezvous (training/runtime/eks_ddp_runtime/launch.py,
installed as ``eks_ddp_runtime``)."""
ETCD_BACKEND = "eks-etcd"
"""The launcher's name of the etcd rendezvous: torch's dynamic rendezvous on an etcd v3 store, registered by
training/runtime/eks_ddp_runtime/rendezvous/handler.py (``BACKEND``)."""
LAUNCHER_BACKENDS = {"etcd": ETCD_BACKEND, "etcd-v2": ETCD_BACKEND, ETCD_BACKEND: ETCD_BACKEND, "c10d": "c10d"}
"""A run's ``rdzvBackend`` as the launcher's ``--rdzv-backend``: ``etcd`` is the v3 store (``etcd-v2``, its old
name, for one release); torch's own ``etcd``/``etcd-v2`` backends are never rendered."""
TRAIN_MODULE = "eks_ddp_trainer.train"
"""The trainer, run by torchrun as ``-m eks_ddp_trainer.train`` from the image's WORKDIR."""
RUN_DIR_REF = f"$({RUN_DIR_ENV})"
"""``$(EKS_DDP_RUN_DIR)`` in a workload's arguments: the run's directory, as the kubelet expands it in the Job (the
local runner replaces it itself)."""
DATA_DIR_REF = f"$({DATA_DIR_ENV})"
"""``$(EKS_DDP_DATA_DIR)`` in a workload's arguments: the staged data set's directory."""



@dataclass(frozen=True, kw_only=True)
class RdzvTimeouts:
    """Rendezvous timing (``--rdzv-conf``); torch's defaults (600 s join, 30 s last call) make recovery slow.

    A lost node costs about ``keep_alive_interval * keep_alive_max_attempt`` (until the survivors drop
    it from the rendezvous) + ``last_call`` + worker start-up; see docs/rendezvous.md "The launcher".
    """

    join: int = 900
    """Seconds a rendezvous may take to complete (pulling images on fresh nodes is slow)."""
    last_call: int = 1
    """Seconds to wait for more nodes once the minimum has joined, in every round but the first."""
    first_round: int = 300
    """Seconds the first round waits for all max nodes (image pulls), so a job starts at full size."""
    close: int = 30
    keep_alive_interval: int = 1
    """Seconds between an agent's heartbeats to etcd; a node missing keep_alive_max_attempt of them is
    dropped. The agent beats from a thread of its own, so slow training never delays it."""
    keep_alive_max_attempt: int = 4
    store_retry: int = 600
    """Seconds of continuous store failure an agent rides out (an outage, etcd's node lost, a wipe) before
    it gives up; meanwhile its workers keep training. At least 10 minutes: etcd's replacement after a node
    loss takes about 1-2 minutes on EKS (docs/rendezvous.md "Store")."""
    read_timeout: int = 5
    """Seconds one etcd request may take: a partitioned etcd fails over to a retry instead of hanging."""

    def conf(self) -> str:
        return (f"join_timeout={self.join},last_call_timeout={self.last_call},"
                f"first_round_timeout={self.first_round},close_timeout={self.close},"
                f"keep_alive_interval={self.keep_alive_interval},keep_alive_max_attempt={self.keep_alive_max_attempt},"
                f"store_retry_timeout={self.store_retry},read_timeout={self.read_timeout}")


@dataclass(frozen=True, kw_only=True)
class RdzvTls:
    """Files of the agents' rendezvous client over HTTPS: etcd requires a client certificate."""

    ca_cert: str
    """PEM of the CA that signed the store's server certificate (and the client's)."""
    cert: str
    """PEM of this job's client certificate."""
    key: str
    """PEM of its private key."""

    @classmethod
    def under(cls, directory: str) -> RdzvTls:
        """``ca.crt``, ``tls.crt`` and ``tls.key`` in ``directory`` (a mounted Kubernetes TLS Secret's keys)."""
        d = directory.rstrip("/")
        return cls(ca_cert=f"{d}/ca.crt", cert=f"{d}/tls.crt", key=f"{d}/tls.key")

    @classmethod
    def of(cls, files: object) -> RdzvTls:
        """A local store's client files: anything with ``ca_cert``, ``client_cert`` and ``client_key`` paths
        (``training/eks_ddp_local/etcd_server.py``'s ``TlsFiles``, which the local runner, the tests and the GPU check use)."""
        return cls(ca_cert=str(files.ca_cert), cert=str(files.client_cert),  # type: ignore[attr-defined]
                   key=str(files.client_key))  # type: ignore[attr-defined]

    def conf(self) -> str:
        # torch's own etcd-v2 rdzv-conf keys (etcd_rendezvous_backend.create_backend).
        return f"protocol=https,ca_cert={self.ca_cert},ssl_cert={self.cert},ssl_cert_key={self.key}"


RDZV_TLS_DIR = "/etc/eks-ddp/rdzv-tls"
"""Where the Job mounts the rendezvous client Secret (read-only)."""
CLUSTER_TLS = RdzvTls.under(RDZV_TLS_DIR)

CLUSTER_TIMEOUTS = RdzvTimeouts()
"""What the EKS training Job runs at up to 8 nodes, and what tests/runtime/test_resilience.py and bench/recovery.py
measure."""


def cluster_timeouts(nodes: int) -> RdzvTimeouts:
    """The Job's rendezvous timing for ``nodes`` agents: :data:`CLUSTER_TIMEOUTS` with a last call that grows with
    the fleet (1 s up to 8 nodes, 2 s up to 32, 3 s beyond).

    Every arrival re-opens the last call (training/runtime/eks_ddp_runtime/rendezvous/handler.py), so agents that
    arrive within ``last_call`` of one another form one round; what must fit is the largest gap between consecutive
    arrivals, not the whole spread. More pods restarting on more nodes (different teardown and start times, a slow
    node's CUDA context) widen the largest gap; a longer last call costs only a lost node's re-form, once (a worker
    crash brings every agent back at once, and a round of ``max_nodes`` completes at once). Detection
    (keep-alive 1 s x 4) stays: a heartbeat is a lease renewal, which costs the store no write at any N."""
    if nodes < 1:
        raise ValueError(f"nodes: got {nodes}; expected >= 1")
    return CLUSTER_TIMEOUTS if nodes <= 8 else dataclasses.replace(CLUSTER_TIMEOUTS, last_call=2 if nodes <= 32 else 3)
LOCAL_TIMEOUTS = RdzvTimeouts(join=120, last_call=1, first_round=30, close=10)
"""The local runner: the cluster's detection timings, shorter waits for agents that never come."""

DEFAULT_MAX_RESTARTS = 20
"""Worker-group restarts per agent: each fault (a crash, a lost node, a spot interruption) costs one,
a node joining costs none. Transient faults never end the run before this; FATAL codes end it at once."""
PEER_DEADLINE_S = 5
"""Seconds a worker waits for a silent peer's heartbeat before re-forming the group (training/runtime/eks_ddp_runtime/watchdog.py)."""


@dataclass(frozen=True, kw_only=True)
class AgentOptions:
    """How one torchrun agent joins the elastic job."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    max_restarts: int = DEFAULT_MAX_RESTARTS
    local_addr: str | None = None
    timeouts: RdzvTimeouts = CLUSTER_TIMEOUTS
    monitor_interval: float = 0.5
    tls: RdzvTls | None = CLUSTER_TLS
    """Client files for the etcd rendezvous (required with etcd; unused by c10d)."""


def torchrun_args(a: AgentOptions) -> list[str]:
    """torchrun's own flags (everything before the trainer module)."""
    if not 1 <= a.min_nodes <= a.max_nodes:
        raise ValueError(f"nnodes: got {a.min_nodes}:{a.max_nodes}; expected 1 <= min <= max")
    if a.nproc_per_node < 1:
        raise ValueError(f"nproc_per_node: got {a.nproc_per_node}; expected >= 1")
    if a.rdzv_backend not in LAUNCHER_BACKENDS:
        raise ValueError(f"rdzv_backend: got {a.rdzv_backend!r}; expected 'etcd' or 'c10d'")
    backend = LAUNCHER_BACKENDS[a.rdzv_backend]
    etcd = backend == ETCD_BACKEND
    if etcd and a.tls is None:
        raise ValueError("tls: got None; expected the rendezvous client's RdzvTls (the etcd store requires a "
                         "client certificate)")
    conf = a.timeouts.conf() + (f",{a.tls.conf()}" if etcd and a.tls else "")
    for path in (a.tls.ca_cert, a.tls.cert, a.tls.key) if etcd and a.tls else ():
        if "," in path or "=" in path:
            raise ValueError(f"tls: got path {path!r}; expected no ',' or '=' (they separate --rdzv-conf items)")
    out = [
        f"--nnodes={a.min_nodes}:{a.max_nodes}",
        f"--nproc-per-node={a.nproc_per_node}",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={a.rdzv_endpoint}",
        f"--rdzv-id={a.rdzv_id}",
        f"--rdzv-conf={conf}",
        f"--max-restarts={a.max_restarts}",
        f"--monitor-interval={a.monitor_interval}",
    ]
    if a.local_addr:
        out.append(f"--local-addr={a.local_addr}")
    return out


def module_command(agent: AgentOptions, module: str, args: list[str], *, python: str = "python") -> list[str]:
    """``python -m eks_ddp_runtime.launch <torchrun flags> -m <module> <args>``: every agent command line comes from here."""
    return [python, "-m", LAUNCHER_MODULE, *torchrun_args(agent), "-m", module, *args]


def script_command(agent: AgentOptions, script: str, args: list[str], *, python: str = "python") -> list[str]:
    """``python -m eks_ddp_runtime.launch <torchrun flags> <script> <args>``: a workload that is a file in the image."""
    if not script or script.startswith("-"):
        raise ValueError(f"script: got {script!r}; expected a path to a script (not a flag)")
    return [python, "-m", LAUNCHER_MODULE, *torchrun_args(agent), script, *args]


class TrainerFlags(Protocol):
    """What :func:`job_command` needs of the bundled trainer's config (``eks_ddp_trainer.config.TrainerConfig``):
    its flags. Structural, so the runtime never imports the trainer."""

    def flags(self) -> list[str]: ...


def job_command(agent: AgentOptions, trainer: TrainerFlags, *, python: str = "python") -> list[str]:
    """The full agent command: ``python -m eks_ddp_runtime.launch <torchrun flags> -m eks_ddp_trainer.train <trainer flags>``
    (the flags rendered by the trainer's own config class, so the two never disagree)."""
    return module_command(agent, TRAIN_MODULE, trainer.flags(), python=python)


FABRIC_CHECK_MODULE = "eks_ddp_runtime.fabric_check"
"""The fabric check (all-reduce sweep, transport, bandwidth floor), run by the same agents as training."""


@dataclass(frozen=True, kw_only=True)
class FabricCheckOptions:
    """Arguments of ``training/runtime/eks_ddp_runtime/fabric_check.py`` (``eks_ddp_runtime.fabric_check``)."""

    run_dir: str
    """Where ``fabric.json`` goes: the training run's directory."""
    require_efa: bool = False
    """Fail unless every rank has EFA devices and NCCL picked the OFI/EFA transport."""
    min_busbw_gbs: float | None = None
    """Fail below this peak all-reduce bus bandwidth (GB/s): the instance type's catalog floor."""
    instance_type: str | None = None
    max_bytes: int | None = None
    """Largest message; default 1 GiB on GPUs, 4 MiB on CPU."""
    factor: int | None = None
    iters: int | None = None
    warmup: int | None = None
    pass_marker: str | None = None
    """A file rank 0 creates when the check passed."""
    node_only: bool = False
    """Check this node alone (no process group): a pod that joins after the job's check passed."""

    def args(self) -> list[str]:
        out = [f"--run-dir={self.run_dir}"]
        if self.require_efa:
            out.append("--require-efa")
        if self.node_only:
            out.append("--node-only")
        for flag, value in (("--min-busbw-gbs", self.min_busbw_gbs), ("--instance-type", self.instance_type),
                            ("--max-bytes", self.max_bytes), ("--factor", self.factor), ("--iters", self.iters),
                            ("--warmup", self.warmup), ("--pass-marker", self.pass_marker)):
            if value is not None:
                out.append(f"{flag}={value}")
        return out


def fabric_check_command(agent: AgentOptions, check: FabricCheckOptions, *, python: str = "python") -> list[str]:
    """The fabric check's agent command: the training command's agent flags, ``-m eks_ddp_runtime.fabric_check``."""
    return module_command(agent, FABRIC_CHECK_MODULE, check.args(), python=python)


# Environment every agent needs. Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE a restart after a
# worker failure reuses stale TCPStore addresses and burns the restart budget (pytorch#135712).
# PYTORCH_NVML_BASED_CUDA_CHECK=1: torch's launcher asks for an accelerator in the agent; NVML answers
# without initialising CUDA, so the workers the agent forks can still use their GPU (training/runtime/eks_ddp_runtime/launch.py).
AGENT_ENV = {
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    "EKS_DDP_PEER_DEADLINE_S": str(PEER_DEADLINE_S),
    "PYTHONUNBUFFERED": "1",
}
