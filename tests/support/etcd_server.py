"""Real etcd and real torchrun agents for the trainer tests and the recovery benchmark.

etcd start/stop lives in training/eks_ddp_local/etcd_server.py (shared with the local runner); this module
adds the pytest fixture and a small harness around torchrun agent processes: each agent
runs in its own process group so a test can kill a whole "node", every wait is bounded,
and everything started is killed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eks_ddp_local.etcd_server import TlsFiles, start_etcd
from eks_ddp_local.procs import worker_pids
from eks_ddp_runtime.launch_command import (
    AGENT_ENV,
    LOCAL_TIMEOUTS,
    AgentOptions,
    RdzvTimeouts,
    RdzvTls,
    job_command,
)
from eks_ddp_trainer.config import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def client_tls(endpoint: str) -> RdzvTls:
    """The agents' TLS files for a store started here (``endpoint.tls``, from training/eks_ddp_local/etcd_server.py)."""
    tls: TlsFiles = endpoint.tls  # type: ignore[attr-defined]
    return RdzvTls.of(tls)


@pytest.fixture
def etcd_endpoint(tmp_path: Path) -> Iterator[str]:
    """A real etcd (v3 API only, TLS with client certificates required) on 127.0.0.1 for one test; stopped and
    reaped afterwards. The string is ``host:port``; ``.tls`` holds the client's files."""
    with start_etcd(tmp_path / "etcd") as endpoint:
        yield endpoint


def trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env.update(AGENT_ENV)
    # ROOT first (``training``, ``tests``); the rest kept, so ``eks_ddp_runtime`` resolves as it does here.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra or {})
    return env


def _processes() -> list[tuple[int, int, bytes]]:
    """(pid, ppid, cmdline) of every process we can read."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            out.append((int(entry.name), ppid, (entry / "cmdline").read_bytes()))
        except (OSError, IndexError, ValueError):
            continue
    return out


_HELD = """import importlib, os, sys, time
marker, module = sys.argv[1], sys.argv[2]
launch = importlib.import_module(module)
importlib.import_module("torch._dynamo")  # what the launcher imports at start (training/runtime/eks_ddp_runtime/launch.py)
deadline = time.monotonic() + 600
while not os.path.exists(marker) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.argv = [module, *sys.argv[3:]]
raise SystemExit(launch.main(sys.argv[1:]))
"""
"""A held agent: imports its launcher (and torch) now, runs it once its marker file exists."""


class Agent:
    """One torchrun agent (a "node"), in its own process group, output to a log file.

    ``held``: the process imports torch and the launcher at once but starts the agent only at :meth:`release`, so a
    test can have a replacement node arrive at a chosen moment rather than after seconds of imports. ``prefix``
    goes in front of the command line (``ip netns exec NS``: tests/support/netns.py)."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path = ROOT,
                 held: bool = False, prefix: list[str] | None = None) -> None:
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.marker = log_path.with_suffix(".release")
        if held:
            if cmd[1] != "-m":
                raise ValueError(f"a held agent runs a module (python -m ...); got {cmd[:3]}")
            cmd = [cmd[0], "-c", _HELD, str(self.marker), cmd[2], *cmd[3:]]
        cmd = [*(prefix or []), *cmd]  # e.g. ``ip netns exec NS``: the agent runs on another "node"
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def release(self) -> None:
        """Start a held agent's launcher."""
        self.marker.touch()

    def workers(self) -> list[int]:
        """PIDs of this agent's worker processes: fresh ones, or forked from its zygote (procs.worker_pids)."""
        return worker_pids(self.pid)

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill_node(self) -> None:
        """Lose the whole node: the agent's process group and its workers' (torchrun starts each worker in a
        session of its own, so killing the agent's group alone would leave them training)."""
        workers = self.workers()
        self.kill_group(signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        workers = self.workers()
        if self.proc.poll() is None:
            self.kill_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group(signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


class Job:
    """N agents of one elastic job against a real etcd; ``close()`` kills everything it started."""

    def __init__(self, tmp: Path, endpoint: str, trainer: TrainerConfig, *, nodes: int = 2, min_nodes: int = 1,
                 max_nodes: int = 2, max_restarts: int = 3, env: dict[str, str] | None = None,
                 rdzv_id: str | None = None, timeouts: RdzvTimeouts = LOCAL_TIMEOUTS) -> None:
        self.tmp, self.trainer = tmp, trainer
        tmp.mkdir(parents=True, exist_ok=True)
        self.run_dir = Path(trainer.run_dir)
        agent = AgentOptions(min_nodes=min_nodes, max_nodes=max_nodes, nproc_per_node=1, rdzv_backend="etcd",
                             rdzv_endpoint=endpoint, rdzv_id=rdzv_id or f"run-{os.getpid()}-{time.time_ns()}",
                             max_restarts=max_restarts, local_addr="127.0.0.1", timeouts=timeouts,
                             tls=client_tls(endpoint))
        self.env = trainer_env(env)
        self.cmd = job_command(agent, trainer, python=sys.executable)
        self.cwd = ROOT
        self.agents: list[Agent] = []
        for _ in range(nodes):
            self.add_agent()

    @classmethod
    def of_command(cls, tmp: Path, run_dir: Path, cmd: list[str], env: dict[str, str], *, nodes: int = 2,
                   cwd: Path = ROOT) -> Job:
        """A job whose agents run ``cmd`` from ``cwd`` (another checkout's agent command, for comparisons)."""
        job = cls.__new__(cls)
        tmp.mkdir(parents=True, exist_ok=True)
        job.tmp, job.trainer, job.run_dir, job.cmd, job.env, job.cwd = tmp, None, Path(run_dir), cmd, env, cwd
        job.agents = []
        for _ in range(nodes):
            job.add_agent()
        return job

    def add_agent(self, held: bool = False) -> Agent:
        """Start one more agent of this job (a replacement or late node); ``held``: see :class:`Agent`."""
        i = len(self.agents)
        self.agents.append(Agent(f"agent{i}", self.cmd, self.tmp / f"agent{i}.log", self.env, self.cwd, held))
        return self.agents[-1]

    def history(self) -> list[dict[str, Any]]:
        """Rank 0's records so far. Read incrementally: tests poll this every 20 ms while a long run appends
        thousands of records, and re-parsing the whole file each time would take the CPU the agents need."""
        path = self.run_dir / "history.jsonl"
        if not path.exists():
            return []
        cache = self.__dict__.setdefault("_history", {"offset": 0, "records": []})
        with path.open("rb") as f:
            if f.seek(0, os.SEEK_END) < cache["offset"]:  # a new file: start over
                cache.update(offset=0, records=[])
            f.seek(cache["offset"])
            chunk = f.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]  # a line being appended right now waits for the next call
        cache["offset"] += len(complete)
        for line in complete.splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                cache["records"].append(json.loads(line))
        return list(cache["records"])

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if all(a.proc.poll() is not None for a in self.agents):
                break
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()}")

    def wait_step(self, step: int, timeout_s: float = 60.0) -> dict[str, Any]:
        return self.wait_for(lambda: next((r for r in self.history() if r.get("kind") == "step"
                                           and r["step"] >= step), None), timeout_s, f"step {step}")

    def wait_all(self, timeout_s: float) -> list[int]:
        deadline = time.monotonic() + timeout_s
        codes = []
        for a in self.agents:
            try:
                codes.append(a.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{a.name} did not finish in {timeout_s} s\n{self.logs()}") from None
        return codes

    def logs(self) -> str:
        return "\n".join(f"----- {a.name} (rc={a.proc.poll()}) -----\n{a.log()[-4000:]}" for a in self.agents)

    def close(self) -> None:
        for a in self.agents:
            a.stop()
        # Workers whose agent died first are re-parented; find them by this job's unique run dir.
        mark = f"--run-dir={self.run_dir}".encode()
        for pid, _, cmdline in _processes():
            if b"eks_ddp_trainer.train" in cmdline and mark + b"\0" in cmdline + b"\0":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    """Jobs appended to this list are torn down (every process group killed) when the test ends."""
    started: list[Job] = []
    yield started
    for job in started:
        job.close()


def _plain_healthy(endpoint: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1) as r:
            return b'"true"' in r.read()
    except OSError:
        return False


class RestartableEtcd:
    """One etcd member on a fixed port and data dir that a test can SIGKILL, SIGSTOP, wipe and start again
    (an etcd pod restart, a hung store, a pod recreated empty). TLS with client certificates required, as on
    the cluster. ``prefix`` runs it under e.g. ``ip netns exec NS``; ``host`` is the address it listens on.
    ``plain=True`` serves unauthenticated HTTP and etcd's v2 API, only for bench/recovery.py's ``--baseline`` (an
    older checkout whose agents speak neither TLS nor v3)."""

    def __init__(self, data_dir: Path, *, host: str = "127.0.0.1", prefix: list[str] | None = None,
                 plain: bool = False, flags: list[str] | None = None) -> None:
        from eks_ddp_local.etcd_server import EtcdEndpoint, find_etcd, free_port, make_tls

        self.data_dir, self.host, self.prefix, self.plain = data_dir, host, prefix or [], plain
        self.flags = list(flags or [])
        """More etcd flags (the store's quota and compaction as rendered: bench/store_soak.py)."""
        self.client, self.peer = free_port(), free_port()
        self.tls = make_tls(data_dir / "tls", [host])
        self.endpoint = f"{host}:{self.client}" if plain else EtcdEndpoint(f"{host}:{self.client}", self.tls)
        self.binary = find_etcd()
        self.proc: subprocess.Popen | None = None
        data_dir.mkdir(parents=True, exist_ok=True)

    def start(self, timeout_s: float = 30.0) -> None:
        from eks_ddp_local.etcd_server import healthy

        cmd = [*self.prefix, self.binary, "--name=local", f"--data-dir={self.data_dir / 'member'}",
               f"--listen-client-urls={self._scheme}://{self.endpoint}",
               f"--advertise-client-urls={self._scheme}://{self.endpoint}",
               f"--listen-peer-urls=http://{self.host}:{self.peer}",
               f"--initial-advertise-peer-urls=http://{self.host}:{self.peer}",
               f"--initial-cluster=local=http://{self.host}:{self.peer}",
               # plain: an older checkout's agents (bench/recovery.py --baseline), which spoke etcd's v2 API
               *(["--enable-v2=true"] if self.plain else self.tls.server_flags()), *self.flags]
        with open(self.data_dir / "etcd.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if not self.prefix and (_plain_healthy(self.endpoint) if self.plain else healthy(self.endpoint, self.tls)):
                return
            if self.prefix and subprocess.run([*self.prefix, sys.executable, "-c",
                                               "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
                                               "from tests.support.etcd_server import _plain_healthy; "
                                               "from eks_ddp_local.etcd_server import TlsFiles, healthy; "
                                               "raise SystemExit(0 if (_plain_healthy(sys.argv[2]) if sys.argv[3] == 'plain' "
                                               "else healthy(sys.argv[2], TlsFiles(*map(Path, sys.argv[4:])))) else 1)",
                                               str(ROOT), self.endpoint, "plain" if self.plain else "tls",
                                               *map(str, (self.tls.ca_cert, self.tls.server_cert, self.tls.server_key,
                                                          self.tls.client_cert, self.tls.client_key))],
                                              capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"etcd did not start: {(self.data_dir / 'etcd.log').read_text()[-2000:]}")

    @property
    def _scheme(self) -> str:
        return "http" if self.plain else "https"

    def pause(self) -> None:
        """SIGSTOP: the port stays open and connections hang (a hung store, its node NotReady)."""
        assert self.proc is not None and self.proc.poll() is None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def wipe(self) -> None:
        """Kill it and drop its data: the next start() is a pod recreated on an empty volume."""
        import shutil

        self.kill()
        shutil.rmtree(self.data_dir / "member", ignore_errors=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def restartable_etcd(tmp_path: Path) -> Iterator[RestartableEtcd]:
    etcd = RestartableEtcd(tmp_path / "etcd-r")
    try:
        etcd.start()
        yield etcd
    finally:
        etcd.kill()


def kill_workers_in_a_row(job: Job, kills: int, timeout_s: float = 120.0) -> int:
    """SIGKILL a worker (alternating nodes) as soon as training runs again after each restart; returns the kills
    made, fewer than asked when the run ended first (every agent exited, or training finished)."""
    def starts() -> list[dict[str, Any]]:
        return [r for r in job.history() if r.get("kind") == "start"]

    def ended() -> bool:
        return all(a.proc.poll() is not None for a in job.agents)

    done = 0
    for i in range(kills):
        n = len(starts())
        try:
            # Training runs again (a step after the newest start), then the next worker dies.
            job.wait_for(lambda: starts() and [r for r in job.history() if r.get("kind") == "step"
                                               and r["time"] > starts()[-1]["time"]], timeout_s,
                         f"training before kill {i + 1}")
            pids = job.agents[i % len(job.agents)].workers()
            if not pids:
                break
            os.kill(pids[0], signal.SIGKILL)
            done += 1
            job.wait_for(lambda n=n: len(starts()) > n, timeout_s, f"restart after kill {i + 1}")
        except AssertionError:
            if ended():
                break
            raise
    return done


def max_weight_diff(run_a: Path, run_b: Path) -> float:
    """Largest absolute difference between the final weights (model.pt) of two runs (0.0: bit-identical)."""
    import torch

    from eks_ddp_trainer.evaluate import MODEL_FILE

    a = torch.load(Path(run_a) / MODEL_FILE, weights_only=True)["model"]
    b = torch.load(Path(run_b) / MODEL_FILE, weights_only=True)["model"]
    assert a.keys() == b.keys()
    return max((float((a[k].double() - b[k].double()).abs().max()) if a[k].numel() else 0.0) for k in a)
