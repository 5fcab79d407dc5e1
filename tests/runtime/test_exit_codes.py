"""Exit codes as the pod sees them: every exit path of the trainer as a real process, alone and under the launcher.

The Job's pod failure policy acts on the agent's exit status (training/runtime/eks_ddp_runtime/exitcodes.py, components/eks_ddp/workloads/elastic_job/__init__.py):
0 done, 3/4/5 FATAL (fail the Job at once), 1 a spent fault budget (retried). Alone, ``python -m eks_ddp_trainer.train``
is what a user runs first; under ``python -m eks_ddp_runtime.launch`` (the Job's own flags from training/runtime/eks_ddp_runtime/launch_command.py,
a real etcd) the agent must hand the worker's code to the pod, whether workers are forked or fresh processes.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from eks_ddp_runtime import exitcodes
from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, AgentOptions, job_command
from eks_ddp_trainer.config import TrainerConfig
from eks_ddp_trainer.data import TRAIN_FILES, batches_root, write_synthetic_cifar
from tests.support.etcd_server import ROOT, Job, client_tls, etcd_endpoint, jobs, kill_workers_in_a_row, trainer_env  # noqa: F401


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cifar")
    write_synthetic_cifar(d, n_train=256, n_test=64, seed=0)
    return d


@pytest.fixture(scope="module")
def corrupt_data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cifar-bad")
    write_synthetic_cifar(d, n_train=256, n_test=64, seed=0)
    (batches_root(d) / TRAIN_FILES[0]).write_bytes(b"not a pickle")
    return d


def _trainer(data: Path, run: Path, **kw) -> TrainerConfig:
    base = TrainerConfig(data_dir=str(data), run_dir=str(run), epochs=2, global_batch_size=16, bn_group=8,
                         min_steps=0, width=8, log_every=1)
    return replace(base, **kw)


# (case, trainer overrides, expected code, what the output must say)
CASES = {
    "done": (dict(max_steps=2), 0, "[eval] acc="),
    "config": (dict(global_batch_size=7), exitcodes.CONFIG_ERROR, "--global-batch-size: got 7; expected a multiple "
               "of --bn-group (8)"),
    "diverged": (dict(lr=5000.0), exitcodes.DIVERGED, "the run diverged"),
    "bad_input": (dict(), exitcodes.BAD_INPUT, "data set:"),
}


def _data_for(case: str, data_dir: Path, corrupt_data_dir: Path) -> Path:
    return corrupt_data_dir if case == "bad_input" else data_dir


@pytest.mark.parametrize("case", sorted(CASES))
def test_alone_the_process_exits_with_the_contract_code(case, tmp_path, data_dir, corrupt_data_dir):
    over, code, says = CASES[case]
    opts = _trainer(_data_for(case, data_dir, corrupt_data_dir), tmp_path / "run", **over)
    env = trainer_env()
    proc = subprocess.run([sys.executable, "-m", "eks_ddp_trainer.train", *opts.flags()], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    # Diverged used to end in "terminate called without an active exception" (134): the snapshot writer thread
    # was still inside torch when the interpreter shut down.
    assert proc.returncode == code, out[-3000:]
    assert says in out
    assert "terminate called" not in out


def test_alone_a_fatal_code_survives_a_side_thread_inside_torch(tmp_path, data_dir):
    # Deterministic form of the 134: a side thread sits in torch's C++ code for the whole run, as a snapshot
    # write in flight can at the moment the trainer exits (tests/support/busy_exit_probe.py runs eks_ddp_trainer.train as
    # __main__). Interpreter shutdown would stop that thread in C++ and abort; the exit path must not.
    opts = _trainer(data_dir, tmp_path / "run", lr=5000.0)
    proc = subprocess.run([sys.executable, "-m", "tests.support.busy_exit_probe", *opts.flags()], cwd=ROOT, env=trainer_env(),
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == exitcodes.DIVERGED, out[-3000:]
    assert "terminate called" not in out
    assert "side thread(s) still running after 10 s (busy-torch): exiting 4" in out


@pytest.mark.parametrize("case", ["done", "diverged"])
def test_alone_the_code_is_final_before_interpreter_shutdown(case, tmp_path, data_dir):
    # Seen once at the end of a successful two-process run on a loaded machine: rank 1 printed nothing wrong, then
    # "terminate called without an active exception" and SIGABRT at interpreter shutdown (C++ teardown), so the
    # agent saw a failed worker. tests/support/shutdown_abort_probe.py makes shutdown abort every time; the process must
    # still end with the trainer's code.
    over, code, says = CASES[case]
    opts = _trainer(data_dir, tmp_path / "run", **over)
    proc = subprocess.run([sys.executable, "-m", "tests.support.shutdown_abort_probe", "eks_ddp_trainer.train", *opts.flags()], cwd=ROOT,
                          env=trainer_env(), capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert says in out


def _agent(endpoint: str, max_restarts: int = 20) -> AgentOptions:
    return AgentOptions(min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_backend="etcd", rdzv_endpoint=endpoint,
                        rdzv_id=f"codes-{id(endpoint)}", max_restarts=max_restarts, local_addr="127.0.0.1",
                        timeouts=CLUSTER_TIMEOUTS, tls=client_tls(endpoint))


@pytest.mark.slow
@pytest.mark.parametrize("case,fork", [
    # make test keeps one FATAL code under the launcher (the same Agent.fatal_code path serves 3, 4 and 5);
    # the others run in make test-long, as do fresh worker processes (what a GPU node without NVML gets,
    # training/runtime/eks_ddp_runtime/launch.py), where the standalone 134 would reach the agent as a SIGABRT, a transient failure.
    ("diverged", "1"),
    *(pytest.param(c, "1", marks=pytest.mark.long) for c in ("bad_input", "config", "done")),
    *(pytest.param(c, "0", marks=pytest.mark.long) for c in ("diverged", "done"))])
def test_under_the_launcher_the_pod_sees_the_workers_code(case, fork, tmp_path, etcd_endpoint, data_dir,  # noqa: F811
                                                          corrupt_data_dir):
    over, code, says = CASES[case]
    opts = _trainer(_data_for(case, data_dir, corrupt_data_dir), tmp_path / "run", **over)
    proc = subprocess.run(job_command(_agent(etcd_endpoint), opts, python=sys.executable), cwd=ROOT,
                          env=trainer_env({"EKS_DDP_FORK_WORKERS": fork}), capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-4000:]
    assert says in out
    if code:
        # A FATAL code costs no restart: one worker start, then the pod's verdict.
        assert "not restarting" in out and out.count("[train] start") <= 1, out[-4000:]


@pytest.mark.slow
def test_under_the_launcher_a_spent_fault_budget_exits_1(tmp_path, etcd_endpoint, jobs, data_dir):  # noqa: F811
    # The worker keeps dying (SIGKILL, a transient fault): with --max-restarts=1 the second death spends the budget.
    job = Job(tmp_path, etcd_endpoint, _trainer(data_dir, tmp_path / "run", epochs=200), nodes=1, min_nodes=1,
              max_nodes=1, max_restarts=1, timeouts=CLUSTER_TIMEOUTS)
    jobs.append(job)
    job.wait_step(2, 120)  # the first start is on record before the kills count starts
    assert kill_workers_in_a_row(job, 2) == 2, job.logs()
    assert job.wait_all(60) == [1], job.logs()
    assert "fault budget spent (--max-restarts=1)" in job.logs()
