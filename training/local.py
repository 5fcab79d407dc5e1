"""Run the elastic training job on this machine: the out-of-the-box demo (``make demo``).

    python -m training.local [--agents 2] [--rdzv etcd|c10d] [--data ./data] [--out demo-out]
                             [--kill-worker-at-step N] [--resume RUN_DIR]

The job is the one the EKS ElasticJob runs: the agents' command line comes from
``components.torchrun.job_command`` (the cluster's builder, here with LOCAL_TIMEOUTS and
``--local-addr=127.0.0.1``), the rendezvous is a real etcd with the v2 API on a free
loopback port (started and stopped here; ``--rdzv c10d`` needs none) and the trainer is
``training.train``. Uses CIFAR-10 from ``--data`` when present, else writes a small
learnable CIFAR-format set into the run's folder.

Each run gets its own folder ``<out>/<run-id>/``: the trainer's files (checkpoints, model.pt,
metrics.json, history.jsonl), ``logs/`` (every agent's and etcd's full output),
``training-curve.png``, ``run.json`` (its settings, for ``--resume``), ``pids.json`` (every
process started, for leak checks) and ``result.json`` (exit status and the one-line cause).

Nothing outlives the runner: Ctrl-C, SIGTERM and SIGHUP (terminal closed) stop the agents,
their workers and etcd; should the runner die without doing so (SIGKILL), the kernel signals
etcd and the agents (PR_SET_PDEATHSIG) and a reaper process kills the workers (torchrun puts
each in its own session) and removes the temporary etcd folder.

The console shows the trainer's records, a progress line, one line per worker failure and
per traceback (the traceback itself is in logs/), the per-class table once, and on failure
one line, ``[local] FAILED: <cause>``: etcd gone, disk full (ENOSPC), the corrupt data file,
a bad trainer flag. Those a retry cannot fix (training/runtime/exitcodes.py) stop the run at once:
no retries. ``--kill-worker-at-step N`` SIGKILLs one trainer worker at step N to show
recovery. Exit status: 0 when every agent exits 0, or when the job finished with the agents
left after losing some (``--min-agents`` below ``--agents``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
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

try:  # from this repository (make demo): the cluster's own command builder, as the tests import it
    from components.torchrun import (
        AGENT_ENV,
        LOCAL_TIMEOUTS,
        TRAIN_MODULE,
        AgentOptions,
        RdzvTls,
        TrainerOptions,
        job_command,
    )
except ImportError:  # installed (eks-ddp[trainer]), next to a project whose `components` is its own
    from eks_ddp.torchrun import (
        AGENT_ENV,
        LOCAL_TIMEOUTS,
        TRAIN_MODULE,
        AgentOptions,
        RdzvTls,
        TrainerOptions,
        job_command,
    )

from eks_ddp_runtime.procs import (
    alive,
    cmdline,
    descendants,
    die_with_parent,
    executable_name,
    kill_tagged,
    proc_table,
    send,
    start_reaper,
    stop_agents,
)

from .local_args import _NOT_RESUMED, RUN_FILE, parse_args
from .progress import Progress, exception_line, format_duration, root_cause

PROJECT_ROOT = Path(__file__).resolve().parent.parent
_REPO_PACKAGE = "training"


def _client_tls(endpoint: str) -> RdzvTls | None:
    """The agents' client files for the local etcd (training/etcd_local.py: TLS, client certificates required)."""
    tls = getattr(endpoint, "tls", None)
    return None if tls is None else RdzvTls(ca_cert=str(tls.ca_cert), cert=str(tls.client_cert),
                                             key=str(tls.client_key))

def installed_modules(command: list[str], package: str | None = __package__) -> list[str]:
    """The command with ``training.*`` modules named as this package is importable: ``training`` in the
    repository, ``eks_ddp_trainer`` when installed (``eks-ddp-local``), where no ``training`` package exists."""
    if not package or package == _REPO_PACKAGE:
        return command
    return [f"{package}{c[len(_REPO_PACKAGE):]}" if i and command[i - 1] == "-m" and c.startswith(_REPO_PACKAGE + ".")
            else c for i, c in enumerate(command)]


def resume_command(run_dir: Path, package: str | None = __package__) -> str:
    """The command that resumes ``run_dir``, pasteable as printed: this interpreter (the virtual environment
    that has torch, activated or not) and this runner's module name (``training`` or ``eks_ddp_trainer``)."""
    return shlex.join([sys.executable, "-m", f"{package or _REPO_PACKAGE}.local", "--resume", str(run_dir)])


CIFAR_SUBDIR = "cifar-10-batches-py"
CIFAR_TRAIN_IMAGES = 50_000
GRACE_S = 10.0
"""Seconds agents get to stop their workers after SIGTERM before everything is SIGKILLed."""
_WORKER_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+) \(pid: (?P<pid>\d+)\)")
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
        if opts.resume is not None:  # the interrupted run's folder: same id, same checkpoints
            self.run_dir = opts.resume.resolve()
            self.run_id = self.run_dir.name
        else:  # a folder of its own per run: two runs never overwrite each other
            self.run_id = f"local-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
            self.run_dir = opts.out.resolve() / self.run_id
        self.out = self.run_dir
        """Everything of this run: the trainer's files, logs/, pids.json, result.json, the curve."""
        self.logs = self.run_dir / "logs"
        self.cause: str | None = None
        """One line: why the run failed (set by the first failure a retry cannot fix, or the first error)."""
        self.fatal = False
        self.start_step: int | None = None
        """The step the first workers started from (a checkpoint's when resumed)."""
        self.first_error: str | None = None
        self._errors_shown: set[tuple[int, int, str]] = set()
        self._generation = [0] * opts.agents
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
        agent = AgentOptions(
            min_nodes=self.o.min_agents or self.o.agents, max_nodes=self.o.agents,
            nproc_per_node=self.o.nproc_per_node,
            rdzv_backend="etcd-v2" if self.o.rdzv == "etcd" else "c10d", rdzv_endpoint=endpoint,
            rdzv_id=self.run_id, max_restarts=self.o.max_restarts, timeouts=LOCAL_TIMEOUTS, local_addr="127.0.0.1",
            tls=_client_tls(endpoint))
        trainer = TrainerOptions(
            data_dir=str(data_dir), run_dir=str(self.run_dir), epochs=self.o.epochs,
            global_batch_size=self.o.global_batch_size, bn_group=self.o.bn_group,
            model=self.o.model, width=self.o.width, checkpoint_every=self.o.checkpoint_every,
            log_every=self.o.log_every, max_steps=self.o.max_steps, seed=self.o.seed)
        return installed_modules(job_command(agent, trainer, python=sys.executable))

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
            # Own session: Ctrl-C and a closed terminal's SIGHUP reach the runner only, which stops the agents;
            # SIGTERM from the kernel should the runner die without doing so (the reaper kills the rest).
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1,
                                    start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))
            self.agents.append(proc)
            self._record("agents", [proc.pid])
            threading.Thread(target=self._pump, args=(i, proc), daemon=True, name=f"agent{i}-log").start()

    def _pump(self, i: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with open(self.logs / f"agent{i}.log", "a", buffering=1) as log:  # the full log; the console is filtered
            for line in proc.stdout:
                log.write(line)
                self.lines.put((i, line.rstrip("\n")))
        self.lines.put((i, None))

    def _show(self, i: int, text: str) -> bool:
        """Trainer lines are shown; a traceback shows as its last line, once per agent and worker start."""
        if "[train]" in text or "[eval]" in text:
            return True
        m = _WORKER_FAILED.search(text)  # torchrun's line about one of its workers
        if m and self.stop_signal is None:
            self.progress.line(f"agent{i}", f"worker pid {m['pid']} (local rank {m['rank']}) exited with "
                               f"{m['code']}" + (f" ({signal.Signals(-int(m['code'])).name})"
                                                 if m['code'].startswith("-") else ""))
            return False
        summary = exception_line(text)
        if summary is None:
            return False
        self.first_error = self.first_error or f"agent{i}: {summary}"
        key = (i, self._generation[i], summary.split(":", 1)[0])
        if key in self._errors_shown or self.stop_signal is not None:
            return False
        self._errors_shown.add(key)
        self.progress.line(f"agent{i}", f"{summary}  (traceback in {self.logs / f'agent{i}.log'})")
        return False

    def _handle(self, i: int, text: str) -> None:
        cause = root_cause(text)
        if cause is not None and self.cause is None:
            self.cause, self.fatal = cause, True  # supervise stops the run: a retry cannot fix it
        if not self._show(i, text):
            return
        record = self.progress.line(f"agent{i}", text)
        if record is None:
            return
        if record.kind == "start":
            self._generation[i] += 1
            if self.start_step is None:
                self.start_step = record.as_int("resumed_step")  # > 0: resumed (--resume)
        now = time.monotonic()
        kill_at = self.o.kill_worker_at_step if self.o.kill_agent_at_step is None else self.o.kill_agent_at_step
        if record.kind == "step" and kill_at is not None and self.killed_at is None:
            step = record.as_int("step")
            if step is not None and step >= kill_at:
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
        if self.o.kill_agent_at_step is not None:
            return self._kill_agent(step)
        target = self.agents[1 if len(self.agents) > 1 else 0]
        train_module = installed_modules(["-m", TRAIN_MODULE])[1]
        workers = [p for p in descendants(target.pid) if train_module in cmdline(p)]
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

    def _kill_agent(self, step: int) -> None:
        """Lose a node: SIGKILL the last agent and its workers (the others re-form the rendezvous)."""
        target = self.agents[-1]
        workers = descendants(target.pid)
        self._record("workers", workers)
        send(target.pid, signal.SIGKILL, group=True)
        for pid in workers:
            send(pid, signal.SIGKILL, group=True)
        self.killed_at, self.kill_step = time.monotonic(), step
        self.progress.message(f"step {step}: SIGKILL agent{len(self.agents) - 1} (pid {target.pid}) and its "
                              "workers: a lost node; the other agents continue without it")
        self.progress.note = "agent lost, recovering"

    def supervise(self) -> str:
        """Stream logs until every agent exits; returns why the run stopped."""
        deadline = time.monotonic() + self.o.timeout
        open_streams = set(range(len(self.agents)))
        first_exit: float | None = None
        next_scan = 0.0
        while True:
            if self.stop_signal is not None:
                return f"stopped by {signal.Signals(self.stop_signal).name}"
            if self.fatal:
                return "failed: no retry can fix this"
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
                etcd_gone = [p for p in self.started["etcd"] if not alive(p)]
                if etcd_gone and self.cause is None:
                    self.cause, self.fatal = (f"the etcd rendezvous server (pid {etcd_gone[0]}, {self.endpoint}) "
                                              "exited during the run; its log is in logs/"), True
                self.progress.refresh()
                next_scan = now + 0.5
            codes = [a.poll() for a in self.agents]
            if all(c is not None for c in codes) and not open_streams:
                failed = [c for c in codes if c != 0]
                return "all agents exited 0" if not failed else f"agent exit statuses {codes}"
            if any(c == 0 for c in codes):  # a finished agent; a lost one (killed) does not start the clock
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
        from .etcd_local import free_port

        yield f"127.0.0.1:{free_port()}"
        return
    from .etcd_local import find_etcd, start_etcd

    try:
        find_etcd()
    except FileNotFoundError as err:
        raise SystemExit(f"eks-ddp-local: {err}; or run with --rdzv c10d") from None
    with start_etcd(work) as endpoint:
        yield endpoint


def _total_steps(o: argparse.Namespace, n_train: int) -> Callable[[int], int]:
    from .data import plan_batching

    def total(world: int) -> int:
        # The global batch fixes the steps; the world size does not change them.
        steps = o.epochs * plan_batching(n_train, o.epochs, o.global_batch_size, o.bn_group).steps_per_epoch
        return min(steps, o.max_steps) if o.max_steps else steps

    return total


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv)).returncode


def run(o: argparse.Namespace, progress: Progress | None = None) -> RunResult:
    from .plot import summarize

    progress = progress or Progress()
    job = LocalJob(o, progress)
    job.logs.mkdir(parents=True, exist_ok=True)
    if o.resume is None:
        job._write_json(RUN_FILE, {k: v for k, v in vars(o).items() if k not in _NOT_RESUMED})
    else:
        progress.message(f"resuming run {job.run_id} in {job.run_dir} from its newest checkpoint")
    data = None if o.synthetic else resolve_data(o.data or Path("data"), explicit=o.data is not None)
    synthetic = data is None
    if synthetic:
        from .data import write_synthetic_cifar

        data = job.out / "data"
        if not (data / CIFAR_SUBDIR / "test_batch").exists():  # a resumed run keeps its data
            write_synthetic_cifar(data, o.synthetic_train, o.synthetic_test, o.seed)
        progress.message(f"CIFAR-10 not found in {o.data or './data'} (a folder holding {CIFAR_SUBDIR}): "
                         f"using a generated CIFAR-format set ({o.synthetic_train} train / {o.synthetic_test} test "
                         f"images) in {data}. Accuracies below are on that set, not CIFAR-10.")
    else:
        progress.message(f"data: CIFAR-10 from {data / CIFAR_SUBDIR}")
    progress.total_steps = _total_steps(o, o.synthetic_train if synthetic else CIFAR_TRAIN_IMAGES)

    # SIGHUP: the terminal was closed. Handled like Ctrl-C; should the runner die anyway (SIGKILL), the
    # kernel signals etcd and the agents (die_with_parent) and the reaper kills the workers and removes etcd_dir.
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, job.on_signal) for s in handled}
    reason, started = "not started", time.monotonic()
    etcd_dir = Path(tempfile.mkdtemp(prefix=f"eks-ddp-etcd-{job.run_id}-"))
    reaper = start_reaper(job.run_id, [str(etcd_dir)])
    try:
        with rendezvous(o.rdzv, etcd_dir) as endpoint:
            job.endpoint = endpoint
            job._scan()
            command = job.agent_command(endpoint, data)
            progress.message(f"run {job.run_id}: {o.agents} agents x {o.nproc_per_node} worker(s), rendezvous "
                             f"{'etcd-v2' if o.rdzv == 'etcd' else 'c10d'} at {endpoint}; full logs in {job.logs}")
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
                    if text is not None and job.stop_signal is None and not job.fatal:
                        job._handle(i, text)
                for log in etcd_dir.glob("etcd-*.log"):
                    shutil.copy(log, job.logs / log.name)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        kill_tagged(job.run_id, spare=[reaper.pid])  # etcd too, should stopping it have failed
        shutil.rmtree(etcd_dir, ignore_errors=True)
        send(reaper.pid, signal.SIGKILL)
        reaper.wait()
        progress.close()

    codes = [a.returncode for a in job.agents]
    metrics_file = job.run_dir / "metrics.json"
    finished = metrics_file.exists() and metrics_file.stat().st_mtime >= time.time() - (time.monotonic() - started)
    # Success: every agent exited 0, or the job finished (fresh metrics) with the agents that were left
    # after losing some (an elastic job with --min-agents below --agents).
    ok = (job.stop_signal is None and not job.fatal and bool(codes)
          and (all(c == 0 for c in codes) or (finished and any(c == 0 for c in codes))))
    if not ok and job.stop_signal is None and job.cause is None:
        job.cause = job.first_error or f"agent exit statuses {codes}"
    returncode = 0 if ok else 128 + job.stop_signal if job.stop_signal else next((c for c in codes if c and c > 0), 1)
    result = RunResult(returncode=returncode, agent_returncodes=codes, reason=reason, run_dir=job.run_dir,
                       recovery_s=job.recovery_s, resumed_step=job.resumed_step, pids=job.pids())
    print(f"[local] {reason} after {format_duration(time.monotonic() - started)} (run dir {job.run_dir})")
    if ok and not all(c == 0 for c in codes):
        print(f"[local] the job finished with the agents left (exit statuses {codes}: the others were lost)")
    if o.kill_worker_at_step is not None:
        print("[local] recovery: " + (
            f"no worker killed (the job ended before step {o.kill_worker_at_step})" if job.kill_step is None else
            f"worker killed at step {job.kill_step}; the job did not recover" if job.recovery_s is None else
            f"worker killed at step {job.kill_step}, training resumed {job.recovery_s:.1f} s later "
            + (f"from the checkpoint at step {job.resumed_step}" if job.resumed_step else "from scratch")))
    result.metrics, result.plot = summarize(job.run_dir, job.out / "training-curve.png", kill_step=job.kill_step,
                                            title=f"eks-ddp local run {job.run_id}")
    if ok and result.metrics is None:
        job.cause = f"the trainer wrote no metrics.json in {job.run_dir}"
        result.returncode = 1
    if result.returncode != 0 and job.cause:
        # The one line that says why; the tracebacks are in the logs.
        print(f"[local] FAILED: {job.cause} (full logs: {job.logs})", file=sys.stderr, flush=True)
    if result.returncode != 0:
        print("[local] not retried: a retry cannot fix this" if job.fatal else
              f"[local] resume it with: {resume_command(job.run_dir)}", flush=True)
    job._write_json("result.json", {
        "returncode": result.returncode, "agent_returncodes": codes, "reason": reason, "cause": job.cause,
        "run_dir": job.run_dir, "kill_step": job.kill_step, "recovery_s": job.recovery_s,
        "resumed_step": job.resumed_step, "start_step": job.start_step, "metrics": result.metrics, "plot": result.plot})
    return result


if __name__ == "__main__":
    sys.exit(main())
