"""Two test "nodes" as Linux network namespaces joined by one veth pair, for real network partitions.

Addresses (10.213.0.0/24) exist only inside the namespaces made here; every namespace, and every process
left in one, is removed on exit. Needs root (CI and the developers' machines run as root). Shared by
tests/runtime/test_resilience.py and bench/recovery.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, AgentOptions, RdzvTimeouts, job_command
from eks_ddp_trainer.config import TrainerConfig
from tests.support.etcd_server import ROOT, Agent, Job, RestartableEtcd, client_tls, trainer_env

SNAPSHOT_DIR_ENV = "EKS_DDP_SNAPSHOT_DIR"
"""training/eks_ddp_trainer/snapshot.py ``DIR_ENV`` (not imported: this module runs where the trainer's dependencies may not)."""


@dataclass(frozen=True)
class Nodes:
    namespaces: tuple[str, str]
    links: tuple[str, str]
    addrs: tuple[str, str]

    def cut(self, i: int) -> None:
        """Partition node ``i``: its end of the link goes down (no reset reaches anyone)."""
        subprocess.run(["ip", "-n", self.namespaces[i], "link", "set", self.links[i], "down"], check=True,
                       timeout=10)

    def heal(self, i: int) -> None:
        """End node ``i``'s partition: its end of the link comes up again (addresses and routes are kept)."""
        subprocess.run(["ip", "-n", self.namespaces[i], "link", "set", self.links[i], "up"], check=True,
                       timeout=10)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def two_nodes() -> Iterator[Nodes]:
    tag = uuid.uuid4().hex[:6]
    nodes = Nodes((f"eksddp-{tag}-a", f"eksddp-{tag}-b"), (f"ed{tag}a", f"ed{tag}b"), ("10.213.0.1", "10.213.0.2"))
    made: list[str] = []
    try:
        for n in nodes.namespaces:
            _ip("netns", "add", n)
            made.append(n)
            _ip("-n", n, "link", "set", "lo", "up")
        _ip("link", "add", nodes.links[0], "netns", nodes.namespaces[0], "type", "veth", "peer", "name",
            nodes.links[1], "netns", nodes.namespaces[1])
        for n, link, addr in zip(nodes.namespaces, nodes.links, nodes.addrs, strict=True):
            _ip("-n", n, "addr", "add", f"{addr}/24", "dev", link)
            _ip("-n", n, "link", "set", link, "up")
        yield nodes
    finally:
        for n in made:
            pids = subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=10)


CommandFor = Callable[[str, str, str], list[str]]
"""(etcd endpoint, rendezvous id, the node's address) -> one agent's command."""


def cluster_command(trainer: TrainerConfig, timeouts: RdzvTimeouts = CLUSTER_TIMEOUTS) -> CommandFor:
    """The cluster's agent command (training/runtime/eks_ddp_runtime/launch_command.py) for one node of a two-node job."""
    def build(endpoint: str, rdzv_id: str, addr: str) -> list[str]:
        opts = AgentOptions(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend="etcd",
                            rdzv_endpoint=endpoint, rdzv_id=rdzv_id, local_addr=addr, timeouts=timeouts,
                            tls=client_tls(endpoint))
        return job_command(opts, trainer, python=sys.executable)
    return build


def start_job(nodes: Nodes, tmp: Path, run_dir: Path, command: CommandFor, *,
              env: Callable[[dict[str, str]], dict[str, str]] = trainer_env, cwd: Path = ROOT,
              plain: bool = False, on: tuple[int, ...] = (0, 1)) -> tuple[RestartableEtcd, Job]:
    """etcd on node 0 and one agent on each node of ``on`` running ``command`` from ``cwd``; the caller stops
    both (:func:`add_agent` starts more)."""
    etcd = RestartableEtcd(tmp / "etcd", host=nodes.addrs[0], prefix=["ip", "netns", "exec", nodes.namespaces[0]],
                           plain=plain)
    etcd.start()
    job = Job.of_command(tmp, run_dir, [], {}, nodes=0, cwd=cwd)  # agents started here, one per namespace
    job.rdzv_id = f"partition-{uuid.uuid4().hex[:6]}"
    for i in on:
        add_agent(job, nodes, i, etcd, command, env=env)
    return etcd, job


def add_agent(job: Job, nodes: Nodes, i: int, etcd: RestartableEtcd, command: CommandFor, *,
              env: Callable[[dict[str, str]], dict[str, str]] = trainer_env, held: bool = False) -> Agent:
    """One more agent of ``job`` on node ``i`` (a replacement pod); ``held``: see tests.etcd_server.Agent.
    Each node keeps its node-local snapshots in a folder of its own, as separate machines do."""
    n = len(job.agents)
    # gloo would pick the host name's address (loopback); pin it to the node's veth.
    extra = {"GLOO_SOCKET_IFNAME": nodes.links[i], SNAPSHOT_DIR_ENV: str(job.tmp / f"snapshots-node{i}")}
    agent = Agent(f"agent{n}", command(etcd.endpoint, job.rdzv_id, nodes.addrs[i]), job.tmp / f"agent{n}.log",
                  env(extra), job.cwd, held=held, prefix=["ip", "netns", "exec", nodes.namespaces[i]])
    job.agents.append(agent)
    return agent
