"""The one place that builds the torchrun agent's command line.

The cluster's ElasticJob pods and the local runner (``python -m training.local``)
both call :func:`job_command`, so the job tested on a laptop is the job that
runs on EKS. Pure Python: no Pulumi, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

TRAIN_MODULE = "training.train"
"""The trainer, run by torchrun as ``-m training.train`` from the image's WORKDIR."""

SHARED_ROOT = "/shared"
DATA_SUBDIR = "data"
RUNS_SUBDIR = "runs"


@dataclass(frozen=True, kw_only=True)
class RdzvTimeouts:
    """Rendezvous timing; torch's defaults (600 s join, 30 s last call) make recovery slow."""

    join: int = 900
    """Seconds a rendezvous may take to complete (pulling images on fresh nodes is slow)."""
    last_call: int = 5
    """Seconds to wait for more nodes once the minimum has joined."""
    close: int = 30
    keep_alive_interval: int = 5
    """Seconds between heartbeats; a node missing keep_alive_max_attempt of them is dropped."""
    keep_alive_max_attempt: int = 3

    def conf(self) -> str:
        return (f"join_timeout={self.join},last_call_timeout={self.last_call},"
                f"close_timeout={self.close},keep_alive_interval={self.keep_alive_interval},"
                f"keep_alive_max_attempt={self.keep_alive_max_attempt}")


CLUSTER_TIMEOUTS = RdzvTimeouts()
LOCAL_TIMEOUTS = RdzvTimeouts(join=120, last_call=1, close=10, keep_alive_interval=1, keep_alive_max_attempt=3)


@dataclass(frozen=True, kw_only=True)
class TrainerOptions:
    """Arguments of ``training/train.py``; flag names are the trainer's argparse names."""

    data_dir: str
    run_dir: str
    epochs: int = 10
    batch_size: int = 512
    model: str = "resnet-small"
    learning_rate: float | None = None
    compile: bool = False
    checkpoint_every: int | None = None
    """Steps between checkpoints; default: the trainer's (once per epoch)."""
    keep_checkpoints: int = 3
    log_every: int | None = None
    max_steps: int | None = None
    """Stop after this many optimizer steps (tests and demos)."""
    width: int | None = None
    """Channel width multiplier of resnet-small (tests and demos use a tiny model)."""
    seed: int = 0

    def args(self) -> list[str]:
        out = [f"--data-dir={self.data_dir}", f"--run-dir={self.run_dir}", f"--epochs={self.epochs}",
               f"--batch-size={self.batch_size}", f"--model={self.model}",
               f"--keep-checkpoints={self.keep_checkpoints}", f"--seed={self.seed}"]
        if self.learning_rate is not None:
            out.append(f"--lr={self.learning_rate}")
        if self.compile:
            out.append("--compile")
        for flag, value in (("--checkpoint-every", self.checkpoint_every), ("--log-every", self.log_every),
                            ("--max-steps", self.max_steps), ("--width", self.width)):
            if value is not None:
                out.append(f"{flag}={value}")
        return out


@dataclass(frozen=True, kw_only=True)
class AgentOptions:
    """How one torchrun agent joins the elastic job."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    max_restarts: int
    local_addr: str | None = None
    timeouts: RdzvTimeouts = CLUSTER_TIMEOUTS
    monitor_interval: float = 0.5


def torchrun_args(a: AgentOptions) -> list[str]:
    """torchrun's own flags (everything before the trainer module)."""
    if not 1 <= a.min_nodes <= a.max_nodes:
        raise ValueError(f"nnodes: got {a.min_nodes}:{a.max_nodes}; expected 1 <= min <= max")
    if a.nproc_per_node < 1:
        raise ValueError(f"nproc_per_node: got {a.nproc_per_node}; expected >= 1")
    out = [
        f"--nnodes={a.min_nodes}:{a.max_nodes}",
        f"--nproc-per-node={a.nproc_per_node}",
        f"--rdzv-backend={a.rdzv_backend}",
        f"--rdzv-endpoint={a.rdzv_endpoint}",
        f"--rdzv-id={a.rdzv_id}",
        f"--rdzv-conf={a.timeouts.conf()}",
        f"--max-restarts={a.max_restarts}",
        f"--monitor-interval={a.monitor_interval}",
    ]
    if a.local_addr:
        out.append(f"--local-addr={a.local_addr}")
    return out


def job_command(agent: AgentOptions, trainer: TrainerOptions, *, torchrun: str = "torchrun") -> list[str]:
    """The full agent command: ``torchrun <flags> -m training.train <trainer flags>``."""
    return [torchrun, *torchrun_args(agent), "-m", TRAIN_MODULE, *trainer.args()]


# Environment every agent needs. Without TORCH_DISABLE_SHARE_RDZV_TCP_STORE a restart after a
# worker failure reuses stale TCPStore addresses and burns the restart budget (pytorch#135712).
AGENT_ENV = {
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    "PYTHONUNBUFFERED": "1",
}
