"""A run's state across `pulumi up`s (Pulumi.yaml refreshes before every one): a cancelled run stays cancelled, a
finished run stays finished.

- The training and stage Jobs keep no TTL: a Job removed by its TTL is dropped from state by the refresh and the
  next `pulumi up` creates it again (pulumi ``step.go`` RefreshStep: a resource Read returns without an ID is
  deleted from state), which restarts a finished run or an awaited stage. A Complete Job holds no pods.
- ``state: cancelled`` (``job.state`` / ``runs[i].state``) renders no training Job, so nothing re-creates it; the
  ``cancel`` output stops the live Job at once and sets the key: an unqueued Job is suspended (the program never
  sets ``spec.suspend``, and the provider diffs the live object pruned to the inputs' shape, so no ``up`` resumes
  it); a queued one is deleted (Kueue unsuspends a suspended Job whose Workload is admitted).
- The launcher exits 0 at once in a run directory whose final marker names its command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.config.test_runs import with_runs
from tests.support.util import run, set_path, stack_config

JOB = "kubernetes:batch/v1:Job"


def _managed_jobs(result) -> list:
    return result.of_type(JOB)


def test_no_pulumi_managed_job_has_a_ttl(dev_result, p4de_result):
    for result in (dev_result, p4de_result):
        jobs = _managed_jobs(result)
        assert jobs and any(j.name.endswith("-train") for j in jobs)
        assert any(j.name.endswith("-prepare-data") for j in jobs)
        for j in jobs:
            assert "ttlSecondsAfterFinished" not in j.inputs["spec"], (j.name, j.inputs["spec"])


def test_an_s3_stage_job_has_no_ttl():
    from tests.config.test_runs import DIGEST
    result = run(with_runs({"runId": "a", "nodes": 1, "workload": {
        "image": DIGEST, "module": "m.train", "data": {"s3": "s3://bucket/sets/one/"}}}))
    [stage] = [j for j in _managed_jobs(result) if j.name.endswith("-stage-data")]
    assert "ttlSecondsAfterFinished" not in stage.inputs["spec"]


def test_an_unqueued_training_job_never_sets_suspend_so_a_kubectl_cancel_survives_an_up():
    """Nothing ignored either: Pulumi would carry an ignored input's old value (a queued Job's suspend: true) into
    a replacement, leaving a Job that left the queue suspended for good (tests/workloads/test_queue.py)."""
    result = run(set_path(stack_config("dev"), "eks-ddp:queue", {"enabled": False}))
    train = result.one(JOB, "training-train")
    assert "suspend" not in train.inputs["spec"] and train.ignore_changes == []  # kubectl patch owns it
    # Control: queued, the Job is created suspended and Kueue owns the field.
    queued = run(stack_config("dev")).one(JOB, "training-train")
    assert queued.inputs["spec"]["suspend"] is True and "spec.suspend" in queued.ignore_changes


def test_a_cancelled_run_renders_no_training_job_and_the_others_keep_theirs():
    cfg = with_runs({"runId": "a", "nodes": 1}, {"runId": "b", "nodes": 1, "state": "cancelled"})
    result = run(cfg)
    names = {j.inputs["metadata"]["name"] for j in _managed_jobs(result) if j.name.endswith("-train")}
    assert names == {"training-a"}
    runs = result.outputs["runs"]
    assert runs["b"]["cancel"] == ("kubectl -n training delete job training-b-b --ignore-not-found && "
                                   "pulumi config set --path 'runs[1].state' cancelled")  # queued (the default)
    # Control: the same stack with b running renders b's Job.
    again = run(with_runs({"runId": "a", "nodes": 1}, {"runId": "b", "nodes": 1}))
    assert {j.inputs["metadata"]["name"] for j in _managed_jobs(again) if j.name.endswith("-train")} == \
        {"training-a", "training-b-b"}


def test_the_job_form_cancel_line_names_job_state(dev_result):
    cancel = dev_result.outputs["runs"]["run-1"]["cancel"]
    assert cancel.endswith("&& pulumi config set --path 'job.state' cancelled")
    assert cancel.startswith("kubectl -n training delete job training-run-1 ")


def test_a_bad_state_names_the_key_and_the_choices():
    from eks_ddp.config import ConfigError, load_stack_config
    raw = stack_config("dev")
    raw["eks-ddp:job"] = {**raw["eks-ddp:job"], "state": "stopped"}
    with pytest.raises(ConfigError) as err:
        load_stack_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()
                           if k.startswith("eks-ddp:")}, region="us-west-2", stack="dev")
    assert "job.state: got 'stopped'" in str(err.value) and "'cancelled'" in str(err.value)


# --- the launcher's final marker, on real processes ------------------------------------------------------------

WORKER = """import os, sys
with open(os.environ["WORKER_LOG"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
"""


def _launch(tmp_path, run_dir, *worker_args: str) -> subprocess.CompletedProcess:
    from eks_ddp_local.etcd_server import free_port
    from tests.support.etcd_server import trainer_env

    env = trainer_env({"EKS_DDP_RUN_DIR": str(run_dir), "WORKER_LOG": str(tmp_path / "worker.log"),
                       "EKS_DDP_FORK_WORKERS": "0"})
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    cmd = [sys.executable, "-m", "eks_ddp_runtime.launch", "--nnodes=1", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id=r{time.time_ns()}",
           "-m", "marker_worker", *worker_args]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the agent and its workers: one process group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
def test_a_finished_run_is_not_trained_again_by_its_launcher(tmp_path):
    (tmp_path / "marker_worker.py").write_text(WORKER)
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    first = _launch(tmp_path, run_dir, "--epochs=1")
    assert first.returncode == 0, first.stderr[-3000:]
    marker = json.loads((run_dir / "eks-ddp-final.json").read_text())
    assert marker["command"][-2:] == ["marker_worker", "--epochs=1"]
    started = time.monotonic()
    second = _launch(tmp_path, run_dir, "--epochs=1")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "the run already finished; exiting 0" in second.stderr
    assert (tmp_path / "worker.log").read_text().splitlines() == ["--epochs=1"]  # the worker ran once
    assert time.monotonic() - started < 60
    # Negative control: another command (a finished run extended) runs its workers.
    third = _launch(tmp_path, run_dir, "--epochs=2")
    assert third.returncode == 0, third.stderr[-3000:]
    assert (tmp_path / "worker.log").read_text().splitlines() == ["--epochs=1", "--epochs=2"]
