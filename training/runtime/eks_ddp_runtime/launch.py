"""The elastic agent: ``python -m eks_ddp_runtime.launch <torchrun flags> (-m MODULE | SCRIPT) <args>``.

torch's torchrun with the job semantics a Kubernetes Job needs (the pod's exit code is the contract,
see exitcodes.py and the Job's pod failure policy):

* **0** when the run finished, also for an agent that arrives after it finished (a replacement pod
  for a lost node): it finds the rendezvous closed and has nothing left to do;
* a **fatal** code as soon as one local worker exits with it (exitcodes.py ``fatal_codes``: 2 for a usage
  error, FATAL's 3/4/5, and the workload's own ``EKS_DDP_FATAL_EXIT_CODES``): a retry cannot fix a bad
  argument, a config error, a divergence or unreadable input, so no worker restart is spent on it;
* **2** for a bad launcher setting, the rendezvous store's client settings included (rendezvous/etcd_backend.py), at start;
* **2** when, in this agent's first round, every local worker failed with the same error before its first step (a
  module that cannot be imported, an exception at import): startfail.py; a retry would only repeat it;
* **2** when startfail.REPEATS consecutive rounds of this agent failed with the same exception at the same place
  before any step completed (a checkpoint folder on a read-only path, created after ``init_process_group``):
  startfail.py ``RepeatedFailure``; a restart or a resume would repeat it;
* **5** (BAD_INPUT) before any worker starts when the Job asks for its data set to be verified
  (``EKS_DDP_DATA_VERIFY``, dataset.py) and a file no longer matches the stage's manifest or pin;
* **8** (SUPERSEDED) when a worker found its world replaced by a newer world that another rendezvous store holds
  (two live stores over one run directory: the trainer's fences, training/eks_ddp_trainer/checkpoint.py): restarting
  into this agent's store would fence the live world out, so it stops; the Job retries the pod;
* **1** when the fault budget (``--max-restarts``) is spent. The rendezvous stays open: only a finished
  run closes it (rendezvous/handler.py), so a retried pod or the surviving agents carry on.

Flags are torchrun's; use ``--rdzv-backend=eks-etcd`` for the store-restart-tolerant etcd backend. The user's
module or script runs only in the workers, as under torchrun; workers.py forks them from a warm zygote.
"""

# ruff: noqa: E402  (the torch check below must run before torch's elastic internals are imported)
from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import logging
import os
import sys
import uuid

from . import compat

compat.refuse_unsupported_torch(main=__name__ == "__main__")

from torch.distributed import run as torchrun
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError
from torch.distributed.launcher import api as launcher_api

from . import dataset, fence, fence_store, modules, runlogs, startfail
from .clock_check import ClockSkewError, check_clock
from .contract import RUN_DIR_ENV
from .exitcodes import BAD_INPUT, SUPERSEDED, fatal_codes
from .keptlogs import KeptLogs, RunLogsSpecs, open_kept_logs
from .rendezvous import handler as rendezvous
from .rendezvous.etcd_backend import RendezvousConfigError, client_settings
from .rendezvous.handler import DEFAULT_STORE_RETRY_S
from .workers import FORK_ENV, all_exited_zero, parse_entrypoint, settle, warm_workers

log = logging.getLogger("training.launch")
FAILED = 1
USAGE = 2
"""A bad agent setting (torchrun's own usage errors exit 2 too): the Job fails at once."""


__all__ = ["FORK_ENV", "Agent", "launch", "main", "warm_workers"]
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""``1``: torch answers "is CUDA available?" through NVML instead of initialising CUDA, which would poison
every later fork (torch/cuda/__init__.py ``is_available``). torch's launcher asks it in the agent
(``LaunchConfig.__post_init__`` calls ``torch.accelerator.is_available()``), before any worker exists."""


def no_nvidia_driver() -> bool:
    """True only where CUDA certainly cannot work: no NVIDIA kernel driver (/proc/driver/nvidia), no NVIDIA device
    node (/dev/nvidia*) and no NVML library. (A GPU node, or a container given a GPU, has all three.)"""
    if os.path.exists("/proc/driver/nvidia") or glob.glob("/dev/nvidia*"):
        return False
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return True
    return False


def fork_is_clean() -> bool:
    """Whether a process forked from this one now could use CUDA: fork a probe and ask it torch's own question,
    ``torch.cuda._is_in_bad_fork()`` (what ``torch.cuda.set_device`` checks before it raises "Cannot re-initialize
    CUDA in forked subprocess"). True on a torch built without CUDA; costs one fork (milliseconds)."""
    import torch

    if torch.cuda.is_initialized():
        return False
    pid = os.fork()
    if pid == 0:  # the probe: no Python clean-up, no atexit handlers of the agent
        os._exit(0 if compat.in_bad_fork() is False else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def preload_failure_logging() -> None:
    """Import what torch's log formatter imports the first time it formats an exception: ``torch._dynamo``
    (torch/_logging/_internal.py, ``TorchLogsFormatter.format``). The agent formats one when a worker fails, so
    the first restart paid that import (~0.9 s on an idle 2-core machine, seconds on a busy node) between the
    failure and the next rendezvous. Imported once at start instead, before any worker is forked (the fork
    probe then covers it: it does not touch CUDA)."""
    import torch._dynamo  # noqa: F401


class Agent(LocalElasticAgent):
    """LocalElasticAgent that stops restarting at once when a worker exits with a fatal code (exitcodes.py
    ``fatal_codes``: a usage error, FATAL, the workload's own), and that counts forked workers which all exited 0
    as a success, as torchrun does for fresh processes (workers.py ``all_exited_zero``)."""

    fatal_code: int | None = None
    fatal_cause: str | None = None
    """The error every local worker failed with before its first step (startfail.py), when that ended the run."""
    superseded: bool = False
    """A worker exited with SUPERSEDED: another store's world holds the run directory (checkpoint.py's fences)."""
    starts: int = 0
    """Worker starts of this agent: a start failure counts in the first only."""
    repeated: startfail.RepeatedFailure | None = None
    """This agent's failed rounds, for a failure every round repeats (startfail.py)."""
    fatal_codes: frozenset[int] = fatal_codes({})
    _remaining_restarts: int  # torch's SimpleElasticAgent sets it (compat.require checks it exists)
    kept: KeptLogs | None = None
    """Where each failed worker gets its record (keptlogs.py); None without a run directory."""

    def _start_workers(self, worker_group: WorkerGroup):
        settle(self)  # the first start waits for the zygote's probe (workers.py)
        self.starts += 1
        specs = getattr(self, "_logs_specs", None)
        if isinstance(specs, RunLogsSpecs):  # fresh processes get their FIFOs from torch, forked ones by env
            specs.forked = not isinstance(worker_group.spec.entrypoint, str)
        return super()._start_workers(worker_group)

    def _setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
        # torch's _start_workers hands it every worker's environment just before it starts them: the round they
        # run for and where the agent's lease is, for fence.commit_allowed (fresh and forked workers alike).
        lease = fence.agent_lease()
        if lease is not None and lease.round is not None:
            for env in envs.values():
                env[fence.ROUND_ENV] = str(lease.round)
                env[fence.LEASE_FILE_ENV] = lease.path
        super()._setup_local_watchdog(envs)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if result.state == WorkerState.HEALTHY and all_exited_zero(self._pcontext):
            return RunResult(state=WorkerState.SUCCEEDED,
                             return_values={w.global_rank: None for w in worker_group.workers})
        if result.is_failed():
            restart = worker_group.spec.max_restarts - self._remaining_restarts
            fatal = sorted({f.exitcode for f in result.failures.values() if f.exitcode in self.fatal_codes})
            error_files = getattr(self._pcontext, "error_files", None) or {}
            failed = {f.local_rank for f in result.failures.values()}
            cause = None if fatal or self.starts != 1 else startfail.start_failure(error_files, failed)
            if self.repeated is None:
                self.repeated = startfail.RepeatedFailure()
            repeated = self.repeated.add(self.starts, None if fatal else startfail.round_failure(error_files, failed))
            if not fatal and any(f.exitcode == SUPERSEDED for f in result.failures.values()):
                self.superseded = True
                self._remaining_restarts = 0
                log.error("a worker found its world replaced by a newer one that another rendezvous store holds "
                          "(exit %s): not restarting it into this store, which would fence the live world out",
                          SUPERSEDED)
            elif fatal:
                self.fatal_code = fatal[0]
                self._remaining_restarts = 0  # _invoke_run then stops the workers and returns the failure
                log.error("worker exited with fatal code %s (eks_ddp_runtime/exitcodes.py): not restarting", fatal[0])
            elif cause is not None:
                self.fatal_code, self.fatal_cause = USAGE, cause
                self._remaining_restarts = 0
                log.error("every worker failed before its first step with the same error: %s; a restart would repeat "
                          "it: not restarting, exit %s (eks_ddp_runtime/startfail.py)", cause, USAGE)
            elif repeated is not None:
                message, where = repeated
                self.fatal_code = USAGE
                self.fatal_cause = (f"{message} (at {where}), the same in {self.repeated.repeats} rounds in a row "
                                    "before any step completed")
                self._remaining_restarts = 0
                log.error("%s rounds in a row failed with the same error before any step completed: %s at %s; a "
                          "restart or a resume would repeat it: not restarting, exit %s (eks_ddp_runtime/startfail.py)."
                          " Fix the code or the path at %s and start the run again", self.repeated.repeats, message,
                          where, USAGE, where)
            if self.kept is not None:
                self.kept.record_failures(result.failures, restart, restarting=self._remaining_restarts > 0,
                                          fatal=set(self.fatal_codes))
        return result


def make_agent(spec: WorkerSpec, config: launcher_api.LaunchConfig) -> Agent:
    """The agent for ``spec`` with the launch config's settings that this torch's agent takes (compat.py)."""
    agent = Agent(spec=spec, **compat.agent_kwargs(config, Agent))
    # Agent overrides _monitor_workers and zeroes _remaining_restarts on a fatal exit code, and adds to the
    # workers' environment in _setup_local_watchdog.
    compat.require(agent, "_monitor_workers", "_remaining_restarts", "_setup_local_watchdog")
    return agent


CLOCK_LIMIT_S = 1.0
"""How far this node's clock may provably be from the store's (the lease's margin, one keep_alive_interval)."""


def launch(config: launcher_api.LaunchConfig, entrypoint, args: list[str], kept: KeptLogs | None = None,
           why: list[str] | None = None, command: list[str] | None = None) -> int:
    """Run one agent until the run ends; returns the process exit code (and appends why to ``why``).
    ``command``: the workers' command, for the final marker, written when the run finished; by this agent's own
    workers only while it held its lease (fence.py)."""
    why = [] if why is None else why
    rendezvous.register()
    params = RendezvousParameters(backend=config.rdzv_backend, endpoint=config.rdzv_endpoint,
                                  run_id=config.run_id, min_nodes=config.min_nodes, max_nodes=config.max_nodes,
                                  local_addr=config.local_addr, **config.rdzv_configs)
    if config.rdzv_backend == rendezvous.BACKEND:  # a node clock off by more than the lease's margin refuses to start
        settings = client_settings(params)
        try:
            check_clock(settings["host"], settings["port"], context=settings["context"],
                        timeout_s=min(2.0, settings["read_timeout"]), limit_s=CLOCK_LIMIT_S)
        except ClockSkewError as e:
            raise RendezvousConfigError(str(e)) from e
    master_addr, master_port = compat.addr_and_port(params)
    spec = WorkerSpec(
        role=config.role, local_world_size=config.nproc_per_node, entrypoint=entrypoint, args=tuple(args),
        rdzv_handler=rdzv_registry.get_rendezvous_handler(params), max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval, master_addr=master_addr, master_port=master_port,
        local_addr=config.local_addr,
    )
    agent = make_agent(spec, config)
    agent.kept = kept
    finished = False
    try:
        result = agent.run()
        if result is None:
            # torch's run() returns None on RendezvousGracefulExitError: this agent waited in the redundancy list
            # (more agents than max nodes) and the run finished without it. Nothing left to do.
            log.info("rendezvous %s closed while this agent waited as a spare: the run finished; exiting 0",
                     config.run_id)
            why.append("the run finished while this agent waited as a spare")
            if command is not None:
                mark_finished(command)
            return 0
        finished = not result.is_failed()
        lease = fence.agent_lease()
        if finished and command is not None:
            if lease is None or lease.valid():
                mark_finished(command)
            else:
                log.warning("the run finished while this agent held no lease (it may have been replaced): %s not "
                            "written", FINAL_MARKER)
    except RendezvousClosedError:
        # Only a finished run closes the rendezvous (rendezvous/handler.py): nothing left to do.
        log.info("rendezvous %s is closed: the run already finished; exiting 0", config.run_id)
        why.append("the rendezvous is closed: the run already finished")
        if command is not None:
            mark_finished(command)  # the store says so: only a finished run closes it
        return 0
    finally:
        if finished:
            rendezvous.allow_close()
        # Closes the rendezvous only after success; otherwise it just stops this node's heartbeats.
        spec.rdzv_handler.shutdown()
    if finished:
        why.append("the workers finished")
        return 0
    for rank, failure in sorted(result.failures.items()):
        log.error("worker rank %s (local %s) failed: exitcode %s", rank, failure.local_rank, failure.exitcode)
    if agent.fatal_cause is not None and agent.repeated is not None and agent.repeated.hit:
        why.append(f"a failure every round repeats: {agent.fatal_cause}: not restarted")
        return agent.fatal_code or USAGE
    if agent.fatal_cause is not None:
        why.append(f"every worker failed before its first step with {agent.fatal_cause}: not restarted")
        return agent.fatal_code or USAGE
    if agent.fatal_code is not None:
        why.append(f"a worker exited with fatal code {agent.fatal_code}: not restarted")
        return agent.fatal_code
    if agent.superseded:
        why.append(f"this world was replaced by one that another rendezvous store holds (exit {SUPERSEDED}): not "
                   "restarted; a new pod joins through the store the Service names")
        return SUPERSEDED
    log.error("fault budget spent (--max-restarts=%s); the rendezvous stays open for a retry", config.max_restarts)
    why.append(f"fault budget spent (--max-restarts={config.max_restarts})")
    return FAILED


@contextlib.contextmanager
def fence_store_published(config: launcher_api.LaunchConfig):
    """:data:`fence_store.FENCE_STORE_ENV` for every worker started from here on: this agent's store endpoint, its
    TLS client files (paths, as the agent was given them), the rendezvous id and ``store_retry_timeout``."""
    conf = dict(config.rdzv_configs)
    os.environ[fence_store.FENCE_STORE_ENV] = fence_store.config_for(
        config.rdzv_endpoint, config.run_id, conf, float(conf.get("store_retry_timeout", DEFAULT_STORE_RETRY_S)))
    try:
        yield
    finally:
        os.environ.pop(fence_store.FENCE_STORE_ENV, None)


FINAL_MARKER = runlogs.FINAL_MARKER
"""Written into ``$EKS_DDP_RUN_DIR`` by an agent whose run finished (exit 0), with the workers' command. A later
agent of the same run with the same command exits 0 at once: a Job created again for a finished run (deleted by
hand, or replaced under the same name) never trains it a second time. Another command (``--epochs=30`` after 20)
runs, so a finished run can still be extended."""


def _final_marker() -> str | None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    return os.path.join(run_dir, FINAL_MARKER) if run_dir else None


def finished_before(command: list[str]) -> bool:
    """Whether this run already finished with ``command`` (the final marker names it)."""
    path = _final_marker()
    if path is None or not os.path.exists(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f).get("command")
    except (OSError, ValueError, AttributeError) as e:
        log.warning("%s: unreadable (%s); running the workers", path, e)
        return False
    return recorded == command


def mark_finished(command: list[str]) -> None:
    """Record that the run finished with ``command`` (atomically; a failed write only loses the shortcut)."""
    path = _final_marker()
    if path is None:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"command": command}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write %s (%s): a Job created again for this run would train it again", path, e)


def standalone(args) -> None:
    """``--standalone`` as torchrun gives it: a c10d store on a free local port and a fresh run id, whatever
    rendezvous flags were given (torch/distributed/run.py ``run()``, which this launcher does not call: it reads
    the flags with torch's own ``parse_args`` and ``config_from_args``, and ``run()`` holds this rewrite)."""
    if getattr(args, "standalone", False):
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
        log.info("--standalone: --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --rdzv-id=%s", args.rdzv_id)


def main(argv: list[str] | None = None) -> int:
    # Each restart gets fresh worker-group store addresses (pytorch#135712).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    logging.basicConfig(level=logging.INFO, format="[launch] %(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # Rendezvous rounds and restarts in the pod log (torch's elastic loggers default to WARNING).
    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "training", "eks_ddp_runtime"):
        logging.getLogger(name).setLevel(logging.INFO)
    # Before torch's launch config asks for an accelerator: with NVML answering, the agent never initialises
    # CUDA on a GPU node (workers fork from the zygote, which never touches CUDA; its probe verifies that).
    os.environ.setdefault(NVML_CHECK_ENV, "1")
    if "CUDA_VISIBLE_DEVICES" not in os.environ and no_nvidia_driver():
        # No NVML to answer torch's check, so it would initialise CUDA (and find nothing): with no device visible
        # it answers 0 without touching CUDA, and a CPU machine with a CUDA build of torch keeps forked workers.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        log.info("no NVIDIA driver on this machine: CUDA_VISIBLE_DEVICES='' for the agent and its workers")
    args = torchrun.parse_args(argv)
    try:
        kept = open_kept_logs()
    except ValueError as e:
        log.error("%s", e)
        return USAGE
    why: list[str] = []
    code = FAILED
    try:
        code = _run(args, kept, why)
        return code
    except BaseException as e:  # a signal (torch's SignalException), or a crash: its record says so
        why.append(f"{type(e).__name__}: {e}")
        if isinstance(e, SystemExit) and isinstance(e.code, int):
            code = e.code
        raise
    finally:
        if kept is not None:
            kept.close(code, "; ".join(why) or "unknown")


def module_problem_of(entrypoint, cmd_args: list[str]) -> str | None:
    """For ``-m MODULE``: why the workers' ``python -m`` would not find it (one line naming it, with a did-you-mean),
    found without importing any of it in the agent (modules.py); None when it would, for a script, and with
    ``EKS_DDP_CHECK_MODULE=0``."""
    ep = parse_entrypoint(entrypoint, cmd_args)
    if ep is None or ep.kind != "module" or os.environ.get(modules.CHECK_ENV, "1") == "0":
        return None
    problem = modules.module_problem(ep.target)
    return None if problem is None else f"-m {ep.target}: {problem} (run in {os.getcwd()}; the workers' python -m " \
        f"would fail on every start)"


def _run(args, kept: KeptLogs | None, why: list[str]) -> int:
    standalone(args)
    config, entrypoint, cmd_args = torchrun.config_from_args(args)
    if kept is not None:
        kept.install(config, args)
    command = [entrypoint, *cmd_args]
    if finished_before(command):
        log.info("%s holds %s with this command: the run already finished; exiting 0",
                 os.environ.get(RUN_DIR_ENV), FINAL_MARKER)
        why.append(f"{FINAL_MARKER}: the run already finished with this command")
        return 0
    problem = module_problem_of(entrypoint, cmd_args)
    if problem is not None:
        log.error("%s", problem)
        why.append(f"usage: {problem}")
        return USAGE
    try:
        # Before any worker reads it: the staged data set against its manifest and pin (dataset.py), when the
        # Job asks for it (EKS_DDP_DATA_VERIFY).
        dataset.check_environment(log=log.info)
    except dataset.DataError as e:
        log.error("data set: %s", e)
        why.append(f"data set: {e}")
        return BAD_INPUT
    preload_failure_logging()
    with contextlib.ExitStack() as stack:
        if config.rdzv_backend == rendezvous.BACKEND:
            # Before the zygote starts: every worker finds the agent's lease through its environment (fence.py),
            # and the run's store, where rank 0 keeps the run's fence (fence_store.py).
            stack.enter_context(fence.published())
            stack.enter_context(fence_store_published(config))
        try:
            Agent.fatal_codes = fatal_codes()
            entrypoint, cmd_args = warm_workers(config, entrypoint, cmd_args)
        except ValueError as e:
            log.error("%s", e)
            why.append(f"usage: {e}")
            return USAGE
        try:
            return launch(config, entrypoint, cmd_args, kept, why, command)
        except RendezvousConfigError as e:
            log.error("%s", e)
            why.append(f"usage: {e}")
            return USAGE

if __name__ == "__main__":
    raise SystemExit(main())
