"""One local run of the elastic job (``python -m eks_ddp_local``): etcd, N torchrun agents, their logs, the
optional worker or agent kill, and the cleanup. The agents' command line is the cluster's (training/runtime/eks_ddp_runtime/launch_command.py).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from eks_ddp_local.procs import (
    Owned,
    alive,
    descendants,
    die_with_parent,
    executable_name,
    kill_owned,
    proc_table,
    send,
    stop_agents,
    worker_pids,
)
from eks_ddp_local.progress import History, Progress, Record, exception_line, root_cause, start_failure
from eks_ddp_runtime.contract import USAGE
from eks_ddp_runtime.fence import LEASE_ROOT_ENV
from eks_ddp_runtime.launch_command import (
    AGENT_ENV,
    DATA_DIR_REF,
    LOCAL_TIMEOUTS,
    RUN_DIR_REF,
    AgentOptions,
    RdzvTls,
    job_command,
    module_command,
    script_command,
)
from eks_ddp_runtime.podfs import READ_ONLY_ENV
from eks_ddp_runtime.runlogs import FIFO_DIR_ENV, LOG_DIR_ENV, LOG_NAME_ENV
from eks_ddp_trainer.config import TrainerConfig
from eks_ddp_trainer.runlog import HISTORY_FILE


def _client_tls(endpoint: str) -> RdzvTls | None:
    """The agents' client files for the local etcd (training/eks_ddp_local/etcd_server.py: TLS, client certificates required)."""
    tls = getattr(endpoint, "tls", None)
    return None if tls is None else RdzvTls.of(tls)


GRACE_S = 10.0
"""Seconds agents get to stop their workers after SIGTERM before everything is SIGKILLed."""
_WORKER_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<rank>\d+) \(pid: (?P<pid>\d+)\)")
_AGENT_LOG = re.compile(r"^(\[launch\] |[IWEF]\d{4} \d\d:\d\d:\d\d|\*{5}|<frozen )")
"""The launcher's and torch's own log lines (the rest of an agent's output is the user's code's)."""
FINISH_GRACE_S = 60.0
FATAL_GRACE_S = 10.0
"""Seconds the agents get to exit on their own after one reported a start failure (each exits 2 within one)."""
"""Once one agent has exited, seconds the others get to exit on their own."""


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
        self.fatal_code: int | None = None
        self._fatal_at = 0.0
        """The exit status a fatal cause stands for, when the runner stops the agents before they exit with it."""
        self.start_step: int | None = None
        """The step the first workers started from (a checkpoint's when resumed)."""
        self.first_error: str | None = None
        self._errors_shown: set[tuple[int, int, str]] = set()
        self._generation = 0
        """Worker starts seen (the trainer's start records): an error shows once per agent and worker start."""
        self.history = History(self.run_dir / HISTORY_FILE)
        """The trainer's records (rank 0 appends them to history.jsonl), read as they arrive."""
        self.agents: list[subprocess.Popen[str]] = []
        self.lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.started: dict[str, list[int]] = {"etcd": [], "agents": [], "workers": []}
        """pids of every process this run started, by role: written to pids.json as they appear."""
        self.owned = Owned()
        """Every process this run started or that descends from one (pid and start time): all the runner ends."""
        self.reaper: int | None = None
        """The reaper's pid (procs.start_reaper): the runner's child, but not the run's to end."""
        self.endpoint: str | None = None
        self.scratch: Path | None = None
        self.shm: Path | None = None
        """This run's folder in memory for its snapshots and lease folders (cli.py), removed when the run ends."""
        """The run's temporary folder (the runner's; its reaper removes it): the agents' FIFOs go there."""
        self.stop_signal: int | None = None
        self.signals_seen = 0
        self.killed_at: float | None = None
        self.kill_step: int | None = None
        self.recovery_s: float | None = None
        self.resumed_step: int | None = None
        self._restart_seen = False
        self.agents_started = time.monotonic()

    def on_signal(self, signum: int, _frame: object) -> None:
        self.stop_signal = self.stop_signal or signum
        self.signals_seen += 1

    def pids(self) -> dict[str, object]:
        return {"runner": os.getpid(), "token": self.run_id, "rdzv_endpoint": self.endpoint, **self.started}

    def _record(self, role: str, pids: list[int]) -> None:
        new = [p for p in pids if p not in self.started[role]]
        self.owned.add(new)
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
        mine = [p for p in descendants(os.getpid(), table) if p != self.reaper]
        etcd = [p for p in mine if p not in agent_pids and p not in workers and executable_name(p) == "etcd"]
        self._record("etcd", etcd)
        # Anything else below the runner (it is the subreaper of its tree: a worker whose agent died is here too).
        self.owned.add(mine)

    def agent_command(self, endpoint: str, data_dir: Path | None) -> list[str]:
        agent = AgentOptions(
            min_nodes=self.o.min_agents or self.o.agents, max_nodes=self.o.agents,
            nproc_per_node=self.o.nproc_per_node,
            rdzv_backend=self.o.rdzv, rdzv_endpoint=endpoint,
            rdzv_id=self.run_id, max_restarts=self.o.max_restarts, timeouts=LOCAL_TIMEOUTS, local_addr="127.0.0.1",
            tls=_client_tls(endpoint))
        # $(EKS_DDP_RUN_DIR) and $(EKS_DDP_DATA_DIR) in your arguments become the paths, as the stack renders them
        # (Workload.rendered_args), so the same args rehearse here.
        user_args = [a.replace(RUN_DIR_REF, str(self.run_dir)) for a in self.o.user_args]
        if data_dir is not None:
            user_args = [a.replace(DATA_DIR_REF, str(data_dir)) for a in user_args]
        if self.o.module:  # the user's own code: the cluster's command for a module or script workload
            return module_command(agent, self.o.module, user_args, python=sys.executable)
        if self.o.script:
            return script_command(agent, self.o.script, user_args, python=sys.executable)
        trainer = TrainerConfig(
            data_dir=str(data_dir), run_dir=str(self.run_dir), epochs=self.o.epochs,
            global_batch_size=self.o.global_batch_size, bn_group=self.o.bn_group,
            model=self.o.model, width=self.o.width, checkpoint_every=self.o.checkpoint_every,
            log_every=self.o.log_every, max_steps=self.o.max_steps, seed=self.o.seed)
        return job_command(agent, trainer, python=sys.executable)

    def agent_env(self, data_dir: Path | None = None) -> dict[str, str]:
        env = {**os.environ, **AGENT_ENV}
        if self.o.module or self.o.script:  # what the Job tells every worker of any workload
            env["EKS_DDP_RUN_DIR"] = str(self.run_dir)
            if data_dir is not None:
                env["EKS_DDP_DATA_DIR"] = str(data_dir)
            # The pod's read-only places (its working directory /app, the image's code, the data set): the
            # workers may write only below the run's directory and the temp folder, as there.
            read_only = [os.getcwd(), *([os.path.dirname(os.path.abspath(self.o.script))] if self.o.script else []),
                         *([str(data_dir)] if data_dir is not None else [])]
            env[READ_ONLY_ENV] = os.pathsep.join(dict.fromkeys(read_only))
        if self.shm is not None:  # the run's own folder in memory (cli.py): nothing of it outlives the run
            env[SNAPSHOT_DIR_ENV] = str(self.shm)
            env[LEASE_ROOT_ENV] = str(self.shm)
        workers = self.o.agents * self.o.nproc_per_node
        # N agents x M workers share this machine's cores; torch's default (all cores each) oversubscribes.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
        if sys.platform.startswith("linux"):
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep collectives on loopback
        return env

    def start_agents(self, command: list[str], data_dir: Path | None = None) -> None:
        env = self.agent_env(data_dir)
        self.agents_started = time.monotonic()
        for i in range(self.o.agents):
            if self.stop_signal is not None:
                return  # Ctrl-C while etcd was starting
            # The launcher keeps its own log and its workers' output in logs/agent<i>/ (eks_ddp_runtime/runlogs.py):
            # what `eks-ddp status|logs <run dir>` reads.
            env = {**env, LOG_DIR_ENV: str(self.logs), LOG_NAME_ENV: f"agent{i}"}
            if self.scratch is not None:  # removed by the runner and its reaper, whatever becomes of the agents
                env[FIFO_DIR_ENV] = str(self.scratch)
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
        """Trainer lines are shown (with your own code, every line that is not the launcher's or torch's log); a
        traceback shows as its last line, once per agent and worker start."""
        if "[train]" in text or "[eval]" in text:
            return True
        if (self.o.module or self.o.script) and not _AGENT_LOG.match(text) and exception_line(text) is None \
                and not text.startswith(("Traceback", "  ")):
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
        key = (i, self._generation, summary.split(":", 1)[0])
        if key in self._errors_shown or self.stop_signal is not None:
            return False
        self._errors_shown.add(key)
        self.progress.line(f"agent{i}", f"{summary}  (traceback in {self.logs / f'agent{i}.log'})")
        return False

    def _handle(self, i: int, text: str) -> None:
        cause = root_cause(text)
        if cause is not None and self.cause is None:
            self.cause, self.fatal = cause, True  # supervise stops the run: a retry cannot fix it
        cause = start_failure(text)
        if cause is not None and self.cause is None:
            self.cause, self.fatal, self.fatal_code = cause, True, USAGE  # the agent's own exit status
            self._fatal_at = time.monotonic()  # the agents exit 2 on their own: supervise gives them a moment
        if self._show(i, text):
            self.progress.line(f"agent{i}", text)

    def read_history(self) -> None:
        """Act on the trainer's new records: the status line, the step a worker is killed at, the recovery."""
        for record in self.history.read():
            self._on_record(record)

    def _on_record(self, record: Record) -> None:
        self.progress.record(record)
        kind = record.get("kind")
        if kind == "start":
            self._generation += 1
            if self.start_step is None:
                self.start_step = record.get("resumed_step")  # > 0: resumed (--resume)
        now = time.monotonic()
        kill_at = self.o.kill_worker_at_step if self.o.kill_agent_at_step is None else self.o.kill_agent_at_step
        if kind == "step" and kill_at is not None and self.killed_at is None:
            step = record.get("step")
            if isinstance(step, int) and step >= kill_at:
                self._kill_worker(step)
        elif self.killed_at is not None and self.recovery_s is None:
            if kind == "start":
                self._restart_seen = True
                self.resumed_step = record.get("resumed_step")
                if self.resumed_step:
                    self._recovered(now, f"rejoined and resumed from the checkpoint at step {self.resumed_step}")
                else:
                    self.progress.message("workers restarted without a checkpoint: training starts over")
            elif kind == "step" and self._restart_seen:
                self._recovered(now, f"training again at step {record.get('step')}")

    def _recovered(self, now: float, what: str) -> None:
        assert self.killed_at is not None
        self.recovery_s = now - self.killed_at
        self.progress.message(f"recovered in {self.recovery_s:.1f} s: {what}")
        self.progress.note = ""

    def _kill_worker(self, step: int | None) -> None:
        if self.o.kill_agent_at_step is not None:
            return self._kill_agent(step)
        target = self.agents[1 if len(self.agents) > 1 else 0]
        workers = worker_pids(target.pid)
        if not workers:
            return  # between restarts: try again on the next step record
        victim = workers[0]
        self._record("workers", workers)
        send(victim, signal.SIGKILL)
        self.killed_at, self.kill_step = time.monotonic(), step
        index = self.agents.index(target)
        self.progress.message(f"{'' if step is None else f'step {step}: '}SIGKILL worker pid {victim} of agent{index} "
                              "to show recovery (the errors that follow are its peers noticing)")
        self.progress.note = "worker killed, recovering"

    def _kill_agent(self, step: int | None) -> None:
        """Lose a node: SIGKILL the last agent and its workers (the others re-form the rendezvous)."""
        target = self.agents[-1]
        workers = descendants(target.pid)
        self._record("workers", workers)
        send(target.pid, signal.SIGKILL, group=True)
        for pid in workers:
            send(pid, signal.SIGKILL, group=True)
        self.killed_at, self.kill_step = time.monotonic(), step
        self.progress.message(f"{'' if step is None else f'step {step}: '}SIGKILL agent{len(self.agents) - 1} "
                              f"(pid {target.pid}) and its workers: a lost node; the other agents continue without it")
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
            if self.fatal and (self.fatal_code is None or all(a.poll() is not None for a in self.agents)
                               or time.monotonic() > self._fatal_at + FATAL_GRACE_S):
                return "failed: no retry can fix this"
            try:
                i, text = self.lines.get(timeout=0.2)
                if text is None:
                    open_streams.discard(i)
                else:
                    self._handle(i, text)
            except queue.Empty:
                pass
            self.read_history()
            now = time.monotonic()
            after = self.o.kill_worker_after
            if after is not None and self.killed_at is None and now - self.agents_started >= after:
                self._kill_worker(None)
            after = self.o.kill_agent_after
            if after is not None and self.killed_at is None and now - self.agents_started >= after:
                self._kill_agent(None)
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
        """Stop agents and workers (a second Ctrl-C cuts the grace period short), then anything else this run
        started (etcd aside: its context manager stops it), such as a worker whose agent died. Only what the run
        started: a process of the user's that names the run's folder is not the run's (procs.Owned)."""
        seen = self.signals_seen
        stop_agents(self.agents, self._workers, self.owned, grace_s=GRACE_S, hurry=lambda: self.signals_seen > seen)
        self._scan()
        kill_owned(self.owned, spare=[*self.started["etcd"], *([self.reaper] if self.reaper else [])])


SNAPSHOT_DIR_ENV = "EKS_DDP_SNAPSHOT_DIR"
"""eks_ddp_trainer.snapshot.DIR_ENV, named here so that the runner does not import torch (a test keeps them equal)."""


def shm_root() -> str | None:
    """/dev/shm when this machine has a writable one (memory, as the training pod's), else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
