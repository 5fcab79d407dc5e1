"""Run the elastic training job on this machine: the out-of-the-box demo (``make demo``).

    python -m training.local [--agents 2] [--rdzv etcd|c10d] [--data ./data] [--out demo-out]
                             [--kill-worker-at-step N]

The job is the one the EKS ElasticJob runs: the agents' command line comes from
``components.torchrun.job_command`` (the cluster's builder, here with LOCAL_TIMEOUTS and
``--local-addr=127.0.0.1``), the rendezvous is a real etcd with the v2 API on a free
loopback port (started and stopped here; ``--rdzv c10d`` needs none) and the trainer is
``training.train``. Uses CIFAR-10 from ``--data`` when present, else writes a small
learnable CIFAR-format set into the output folder.

``--kill-worker-at-step N`` SIGKILLs one trainer worker when step N is logged: its agent
restarts the workers, the job resumes from the newest checkpoint, and the runner says how
long recovery took. Ctrl-C (SIGINT) or SIGTERM stops everything: agents' process groups get
SIGTERM, then SIGKILL after a grace period, workers (each torchrun starts in its own session)
are killed by pid, and etcd is stopped. Exit status: 0 only if every agent exits 0.

Writes to --out: ``runs/<run-id>/`` (the trainer's run dir: checkpoints, model.pt,
metrics.json, history.jsonl), ``training-curve.png``, ``pids.json`` (every process
started, for leak checks) and ``result.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from components.torchrun import AGENT_ENV, LOCAL_TIMEOUTS, TRAIN_MODULE, AgentOptions, TrainerOptions, job_command
from training.procs import cmdline, descendants, executable_name, kill_tagged, proc_table, send, stop_agents
from training.progress import Progress, format_duration

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CIFAR_SUBDIR = "cifar-10-batches-py"
CIFAR_TRAIN_IMAGES = 50_000
GRACE_S = 10.0
"""Seconds agents get to stop their workers after SIGTERM before everything is SIGKILLed."""
FINISH_GRACE_S = 60.0
"""Once one agent has exited, seconds the others get to exit on their own."""


@dataclass
class RunResult:
    returncode: int
    agent_returncodes: list[int | None]
    reason: str
    run_dir: Path
    recovery_s: float | None = None
    resumed_step: int | None = None
    metrics: Path | None = None
    plot: Path | None = None
    pids: dict[str, object] = field(default_factory=dict)


def resolve_data(data: Path, *, explicit: bool) -> Path | None:
    """The folder holding cifar-10-batches-py (given it or its parent), or None when absent."""
    for candidate in (data, data.parent):
        if (candidate / CIFAR_SUBDIR / "data_batch_1").exists() and candidate.name != CIFAR_SUBDIR:
            return candidate.resolve()
    if explicit and data.exists():
        raise SystemExit(f"eks-ddp-local: --data {data}: no {CIFAR_SUBDIR}/data_batch_1 there")
    if explicit:
        raise SystemExit(f"eks-ddp-local: --data {data}: no such folder")
    return None


class LocalJob:
    """One local run: etcd, N torchrun agents, their logs, the optional worker kill and the cleanup."""

    def __init__(self, opts: argparse.Namespace, progress: Progress) -> None:
        self.o = opts
        self.progress = progress
        self.out: Path = opts.out.resolve()
        self.run_id = f"local-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        self.run_dir = self.out / "runs" / self.run_id
        self.agents: list[subprocess.Popen[str]] = []
        self.lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.started: dict[str, list[int]] = {"etcd": [], "agents": [], "workers": []}
        """pids of every process this run started, by role: written to pids.json as they appear."""
        self.endpoint: str | None = None
        self.stop_signal: int | None = None
        self.signals_seen = 0
        self.killed_at: float | None = None
        self.kill_step: int | None = None
        self.recovery_s: float | None = None
        self.resumed_step: int | None = None
        self._restart_seen = False

    def on_signal(self, signum: int, _frame: object) -> None:
        self.stop_signal = self.stop_signal or signum
        self.signals_seen += 1

    def pids(self) -> dict[str, object]:
        return {"runner": os.getpid(), "token": self.run_id, "rdzv_endpoint": self.endpoint, **self.started}

    def _record(self, role: str, pids: list[int]) -> None:
        new = [p for p in pids if p not in self.started[role]]
        if new:
            self.started[role].extend(new)
            self._write_json("pids.json", self.pids())

    def _write_json(self, name: str, doc: object) -> None:
        tmp = self.out / f".{name}.tmp"
        tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        os.replace(tmp, self.out / name)

    def _scan(self) -> None:
        table = proc_table()
        agent_pids = {a.pid for a in self.agents}
        workers = [p for a in self.agents for p in descendants(a.pid, table)]
        self._record("workers", workers)
        etcd = [p for p in descendants(os.getpid(), table)
                if p not in agent_pids and p not in workers and executable_name(p) == "etcd"]
        self._record("etcd", etcd)

    def agent_command(self, endpoint: str, data_dir: Path) -> list[str]:
        torchrun = Path(sys.executable).with_name("torchrun")
        agent = AgentOptions(
            min_nodes=self.o.min_agents or self.o.agents, max_nodes=self.o.agents,
            nproc_per_node=self.o.nproc_per_node,
            rdzv_backend="etcd-v2" if self.o.rdzv == "etcd" else "c10d", rdzv_endpoint=endpoint,
            rdzv_id=self.run_id, max_restarts=self.o.max_restarts, timeouts=LOCAL_TIMEOUTS, local_addr="127.0.0.1")
        trainer = TrainerOptions(
            data_dir=str(data_dir), run_dir=str(self.run_dir), epochs=self.o.epochs, batch_size=self.o.batch_size,
            model=self.o.model, width=self.o.width, checkpoint_every=self.o.checkpoint_every,
            log_every=self.o.log_every, max_steps=self.o.max_steps, seed=self.o.seed)
        return job_command(agent, trainer, torchrun=str(torchrun) if torchrun.exists() else "torchrun")

    def agent_env(self) -> dict[str, str]:
        env = {**os.environ, **AGENT_ENV}
        workers = self.o.agents * self.o.nproc_per_node
        # N agents x M workers share this machine's cores; torch's default (all cores each) oversubscribes.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
        if sys.platform.startswith("linux"):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep collectives on loopback
        return env

    def start_agents(self, command: list[str]) -> None:
        env = self.agent_env()
        for i in range(self.o.agents):
            if self.stop_signal is not None:
                return  # Ctrl-C while etcd was starting
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1,
                                    start_new_session=True)  # own group: Ctrl-C reaches the runner, which stops it
            self.agents.append(proc)
            self._record("agents", [proc.pid])
            threading.Thread(target=self._pump, args=(i, proc), daemon=True, name=f"agent{i}-log").start()

    def _pump(self, i: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put((i, line.rstrip("\n")))
        self.lines.put((i, None))

    def _handle(self, i: int, text: str) -> None:
        record = self.progress.line(f"agent{i}", text)
        if record is None:
            return
        now = time.monotonic()
        if record.kind == "step" and self.o.kill_worker_at_step is not None and self.killed_at is None:
            step = record.as_int("step")
            if step is not None and step >= self.o.kill_worker_at_step:
                self._kill_worker(step)
        elif self.killed_at is not None and self.recovery_s is None:
            if record.kind == "start":
                self._restart_seen = True
                self.resumed_step = record.as_int("resumed_step")
                if self.resumed_step:
                    self._recovered(now, f"rejoined and resumed from the checkpoint at step {self.resumed_step}")
                else:
                    self.progress.message("workers restarted without a checkpoint: training starts over")
            elif record.kind == "step" and self._restart_seen:
                self._recovered(now, f"training again at step {record.as_int('step')}")

    def _recovered(self, now: float, what: str) -> None:
        assert self.killed_at is not None
        self.recovery_s = now - self.killed_at
        self.progress.message(f"recovered in {self.recovery_s:.1f} s: {what}")
        self.progress.note = ""

    def _kill_worker(self, step: int) -> None:
        target = self.agents[1 if len(self.agents) > 1 else 0]
        workers = [p for p in descendants(target.pid) if TRAIN_MODULE in cmdline(p)]
        if not workers:
            return  # between restarts: try again on the next step record
        victim = workers[0]
        self._record("workers", workers)
        send(victim, signal.SIGKILL)
        self.killed_at, self.kill_step = time.monotonic(), step
        index = self.agents.index(target)
        self.progress.message(f"step {step}: SIGKILL trainer worker pid {victim} of agent{index} to show recovery "
                              "(the errors that follow are its peers noticing)")
        self.progress.note = "worker killed, recovering"

    def supervise(self) -> str:
        """Stream logs until every agent exits; returns why the run stopped."""
        deadline = time.monotonic() + self.o.timeout
        open_streams = set(range(len(self.agents)))
        first_exit: float | None = None
        next_scan = 0.0
        while True:
            if self.stop_signal is not None:
                return f"stopped by {signal.Signals(self.stop_signal).name}"
            try:
                i, text = self.lines.get(timeout=0.2)
                if text is None:
                    open_streams.discard(i)
                else:
                    self._handle(i, text)
            except queue.Empty:
                pass
            now = time.monotonic()
            if now >= next_scan:
                self._scan()
                self.progress.refresh()
                next_scan = now + 0.5
            codes = [a.poll() for a in self.agents]
            if all(c is not None for c in codes) and not open_streams:
                failed = [c for c in codes if c != 0]
                return "all agents exited 0" if not failed else f"agent exit statuses {codes}"
            if any(c is not None for c in codes):
                first_exit = first_exit or now
                if now - first_exit > FINISH_GRACE_S:
                    return f"agents still running {FINISH_GRACE_S:.0f} s after the first exited ({codes})"
            if now > deadline:
                return f"timed out after {self.o.timeout:.0f} s (--timeout)"

    def _workers(self) -> list[int]:
        self._scan()
        return self.started["workers"]

    def stop_all(self) -> None:
        """Stop agents and workers (a second Ctrl-C cuts the grace period short), then anything else that
        carries this run's id, such as a worker whose agent died before it was seen."""
        seen = self.signals_seen
        stop_agents(self.agents, self._workers, self.run_id, grace_s=GRACE_S, hurry=lambda: self.signals_seen > seen)
        kill_tagged(self.run_id, spare=self.started["etcd"])


@contextlib.contextmanager
def rendezvous(kind: str, work: Path) -> Iterator[str]:
    if kind == "c10d":
        from training.etcd_local import free_port

        yield f"127.0.0.1:{free_port()}"
        return
    from training.etcd_local import find_etcd, start_etcd

    try:
        find_etcd()
    except FileNotFoundError as err:
        raise SystemExit(f"eks-ddp-local: {err}; or run with --rdzv c10d") from None
    with start_etcd(work) as endpoint:
        yield endpoint


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="eks-ddp-local", description="Run the cluster's elastic training job on this "
                                "machine: etcd, torchrun agents and the trainer, then the evaluation table and a plot.")
    arg = p.add_argument
    arg("--agents", type=int, default=2, help="torchrun agents, the cluster's nodes (2)")
    arg("--min-agents", type=int, help="agents the rendezvous needs (default: --agents)")
    arg("--nproc-per-node", type=int, default=1, help="trainer workers per agent (1)")
    arg("--rdzv", choices=("etcd", "c10d"), default="etcd", help="rendezvous: etcd (v2 API, as on the cluster) or c10d")
    arg("--data", type=Path, help="folder holding cifar-10-batches-py (default ./data; generated data when absent)")
    arg("--synthetic", action="store_true", help="use generated data even when CIFAR-10 is there")
    arg("--synthetic-train", type=int, default=4096, help="generated training images (4096)")
    arg("--synthetic-test", type=int, default=1024, help="generated test images (1024)")
    arg("--out", type=Path, default=Path("demo-out"), help="output folder (demo-out)")
    arg("--epochs", type=int, default=4, help="(4)")
    arg("--batch-size", type=int, default=128, help="per worker (128)")
    arg("--model", default="resnet-small", help="resnet-small, resnet18 or workshop-cnn (resnet-small)")
    arg("--width", type=int, default=8, help="resnet-small base channels; small is fast on a CPU (8)")
    arg("--max-steps", type=int, help="stop after this many steps")
    arg("--log-every", type=int, default=5, help="steps between log records (5)")
    arg("--checkpoint-every", type=int, default=10, help="steps between checkpoints (10)")
    arg("--max-restarts", type=int, default=3, help="worker-group restarts torchrun allows (3)")
    arg("--seed", type=int, default=0)
    arg("--kill-worker-at-step", type=int, metavar="N", help="SIGKILL one trainer worker at step N to show recovery")
    arg("--timeout", type=float, default=900, help="seconds before the run is stopped (900)")
    args = p.parse_args(argv)
    for name in ("agents", "nproc_per_node", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if args.min_agents is not None and not 1 <= args.min_agents <= args.agents:
        p.error("--min-agents: must be between 1 and --agents")
    return args


def _total_steps(o: argparse.Namespace, n_train: int) -> Callable[[int], int]:
    from training.data import steps_in_epoch

    def total(world: int) -> int:
        steps = o.epochs * steps_in_epoch(n_train, world, o.batch_size)
        return min(steps, o.max_steps) if o.max_steps else steps

    return total


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv)).returncode


def run(o: argparse.Namespace, progress: Progress | None = None) -> RunResult:
    from training.plot import summarize

    progress = progress or Progress()
    job = LocalJob(o, progress)
    job.out.mkdir(parents=True, exist_ok=True)
    data = None if o.synthetic else resolve_data(o.data or Path("data"), explicit=o.data is not None)
    synthetic = data is None
    if synthetic:
        from training.data import write_synthetic_cifar

        data = job.out / "data"
        write_synthetic_cifar(data, o.synthetic_train, o.synthetic_test, o.seed)
        progress.message(f"CIFAR-10 not found in {o.data or './data'} (a folder holding {CIFAR_SUBDIR}): "
                         f"using a generated CIFAR-format set ({o.synthetic_train} train / {o.synthetic_test} test "
                         f"images) in {data}. Accuracies below are on that set, not CIFAR-10.")
    else:
        progress.message(f"data: CIFAR-10 from {data / CIFAR_SUBDIR}")
    progress.total_steps = _total_steps(o, o.synthetic_train if synthetic else CIFAR_TRAIN_IMAGES)

    previous = {s: signal.signal(s, job.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    reason, started = "not started", time.monotonic()
    etcd_dir = Path(tempfile.mkdtemp(prefix=f"eks-ddp-etcd-{job.run_id}-"))
    try:
        with rendezvous(o.rdzv, etcd_dir) as endpoint:
            job.endpoint = endpoint
            job._scan()
            command = job.agent_command(endpoint, data)
            progress.message(f"run {job.run_id}: {o.agents} agents x {o.nproc_per_node} worker(s), rendezvous "
                             f"{'etcd-v2' if o.rdzv == 'etcd' else 'c10d'} at {endpoint}")
            progress.message("agent command (the cluster job's, from components/torchrun.py): "
                             + shlex.join(command))
            progress.started = time.monotonic()
            try:
                job.start_agents(command)
                reason = job.supervise()
            finally:
                if job.stop_signal is not None:
                    progress.message(f"{signal.Signals(job.stop_signal).name}: stopping the agents, their workers "
                                     "and the rendezvous")
                job.stop_all()
                while True:  # the agents' last lines (not their tracebacks about being stopped on request)
                    try:
                        i, text = job.lines.get_nowait()
                    except queue.Empty:
                        break
                    if text is not None and job.stop_signal is None:
                        job._handle(i, text)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        kill_tagged(job.run_id)  # etcd too, should stopping it have failed
        shutil.rmtree(etcd_dir, ignore_errors=True)
        progress.close()

    codes = [a.returncode for a in job.agents]
    ok = job.stop_signal is None and bool(codes) and all(c == 0 for c in codes)
    returncode = 0 if ok else 128 + job.stop_signal if job.stop_signal else next((c for c in codes if c and c > 0), 1)
    result = RunResult(returncode=returncode, agent_returncodes=codes, reason=reason, run_dir=job.run_dir,
                       recovery_s=job.recovery_s, resumed_step=job.resumed_step, pids=job.pids())
    print(f"[local] {reason} after {format_duration(time.monotonic() - started)} (run dir {job.run_dir})")
    if o.kill_worker_at_step is not None:
        print("[local] recovery: " + (
            f"no worker killed (the job ended before step {o.kill_worker_at_step})" if job.kill_step is None else
            f"worker killed at step {job.kill_step}; the job did not recover" if job.recovery_s is None else
            f"worker killed at step {job.kill_step}, training resumed {job.recovery_s:.1f} s later "
            + (f"from the checkpoint at step {job.resumed_step}" if job.resumed_step else "from scratch")))
    result.metrics, result.plot = summarize(job.run_dir, job.out / "training-curve.png", kill_step=job.kill_step,
                                            title=f"eks-ddp local run {job.run_id}")
    if ok and result.metrics is None:
        print(f"[local] the trainer wrote no metrics.json in {job.run_dir}", file=sys.stderr)
        result.returncode = 1
    job._write_json("result.json", {
        "returncode": result.returncode, "agent_returncodes": codes, "reason": reason, "run_dir": job.run_dir,
        "kill_step": job.kill_step, "recovery_s": job.recovery_s, "resumed_step": job.resumed_step,
        "metrics": result.metrics, "plot": result.plot})
    return result


if __name__ == "__main__":
    sys.exit(main())
