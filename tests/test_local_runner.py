"""The local runner (python -m training.local): the cluster's job on one machine.

Fast tests check the pieces (record parsing, the progress line, the training-curve
input, data lookup, that the agents' command is the cluster's). The slow ones run
the real thing: etcd, two torchrun agents and the trainer, once with a worker
SIGKILLed mid-run (the job must recover and finish), once stopped by SIGINT (nothing
it started may survive).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.torchrun import AGENT_ENV, LOCAL_TIMEOUTS, AgentOptions, TrainerOptions, job_command
from tests.util import ROOT
from training import local, procs
from training.plot import metrics_table, plot_history, read_history, read_test_accuracy
from training.procs import alive, descendants, listening
from training.progress import Progress, parse_record

STEP = "[train] epoch=2 step=25 loss=1.2749 acc=0.804 img_s=603 world=2 lr=0.1562"


def test_parse_record_kinds():
    start = parse_record("[train] start world=2 resumed_step=20 run_dir=/x/runs/r1")
    assert start is not None and start.kind == "start"
    assert (start.as_int("world"), start.as_int("resumed_step")) == (2, 20)
    step = parse_record("[rank0]: " + STEP)  # torch may prefix worker output
    assert step is not None and step.kind == "step"
    assert (step.as_int("step"), step.num("loss"), step.as_int("world")) == (25, 1.2749, 2)
    assert parse_record("[eval] acc=0.9100 correct=910 total=1000").kind == "eval"
    for other in ("I1121 torch/distributed/elastic/agent rendezvous complete", "[train] --tensorboard: not installed"):
        assert parse_record(other) is None


def test_progress_prefixes_lines_and_shows_step_of_total():
    out = io.StringIO()
    p = Progress(total_steps=lambda world: 64 // world * 2, stream=out, tty=False)
    p.line("agent1", "W1121 some torch warning")
    p.line("agent0", STEP)
    text = out.getvalue()
    assert "[agent1] W1121 some torch warning\n" in text
    assert f"[agent0] {STEP}\n" in text
    status = [line for line in text.splitlines() if line.startswith("[progress]")]
    assert len(status) == 1
    for part in ("step 25/64", "loss 1.275", "acc 80.4%", "603 img/s", "world 2"):
        assert part in status[0]


def test_progress_redraws_in_place_on_a_terminal():
    out = io.StringIO()
    p = Progress(stream=out, tty=True)
    p.line("agent0", STEP)
    p.line("agent0", "next")
    assert "\r\033[K[agent0] next\n[progress] step 25" in out.getvalue()
    p.close()
    assert out.getvalue().endswith("\r\033[K")


def test_history_keeps_the_last_record_per_step(tmp_path):
    rows = [{"kind": "start", "resumed_step": 0}, {"kind": "step", "step": 5, "loss": 2.0, "acc": 0.1, "world": 2},
            {"kind": "step", "step": 10, "loss": 1.5, "acc": 0.4, "world": 2},
            {"kind": "start", "resumed_step": 5},  # restarted: step 10 is trained again
            {"kind": "step", "step": 10, "loss": 1.4, "acc": 0.5, "world": 1},
            {"kind": "eval", "step": 10, "accuracy": 0.6}]
    history = tmp_path / "history.jsonl"
    history.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 11, "lo')  # cut by a kill
    assert [(r["step"], r["loss"]) for r in read_history(history)] == [(5, 2.0), (10, 1.4)]
    assert read_test_accuracy(history) == (10, 0.6)
    png = plot_history(history, tmp_path / "curve.png", marks={"worker killed": 7})
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_metrics_table_lists_every_class():
    table = metrics_table({"accuracy": 0.5, "correct": 5, "total": 10, "step": 40, "world_size": 2,
                           "per_class": {"cat": 1.0, "dog": 0.0, "ship": None},
                           "per_class_total": {"cat": 5, "dog": 5, "ship": 0}})
    assert "test accuracy 50.0%" in table
    assert "cat" in table and "100.0%" in table and "dog" in table and "ship" in table


def test_data_lookup(tmp_path):
    assert local.resolve_data(tmp_path / "nothing", explicit=False) is None
    with pytest.raises(SystemExit, match="no such folder"):
        local.resolve_data(tmp_path / "nothing", explicit=True)
    with pytest.raises(SystemExit, match="data_batch_1"):
        local.resolve_data(tmp_path, explicit=True)
    batches = tmp_path / "cifar" / "cifar-10-batches-py"
    batches.mkdir(parents=True)
    (batches / "data_batch_1").write_bytes(b"")
    # Either the folder holding cifar-10-batches-py or that folder itself.
    assert local.resolve_data(tmp_path / "cifar", explicit=True) == (tmp_path / "cifar").resolve()
    assert local.resolve_data(batches, explicit=True) == (tmp_path / "cifar").resolve()


def test_agents_run_the_cluster_command(tmp_path):
    opts = local.parse_args(["--out", str(tmp_path), "--agents", "3", "--rdzv", "etcd", "--epochs", "2"])
    job = local.LocalJob(opts, Progress(stream=io.StringIO()))
    command = job.agent_command("127.0.0.1:2379", tmp_path / "data")
    expected = job_command(
        AgentOptions(min_nodes=3, max_nodes=3, nproc_per_node=1, rdzv_backend="etcd-v2",
                     rdzv_endpoint="127.0.0.1:2379", rdzv_id=job.run_id, max_restarts=opts.max_restarts,
                     timeouts=LOCAL_TIMEOUTS, local_addr="127.0.0.1"),
        TrainerOptions(data_dir=str(tmp_path / "data"), run_dir=str(job.run_dir), epochs=2,
                       batch_size=opts.batch_size, width=opts.width, checkpoint_every=opts.checkpoint_every,
                       log_every=opts.log_every), torchrun=command[0])
    assert command == expected
    env = job.agent_env()
    assert all(env[k] == v for k, v in AGENT_ENV.items())
    assert int(env["OMP_NUM_THREADS"]) == max(1, (os.cpu_count() or 1) // 3)
    with pytest.raises(SystemExit):
        local.parse_args(["--agents", "2", "--min-agents", "3"])


@pytest.mark.parametrize("source", ["proc", "ps"])
def test_descendants_and_alive(source, monkeypatch):
    monkeypatch.setattr(procs, "HAVE_PROC", source == "proc")  # "ps": the path for machines without /proc
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '30'])"])
    try:
        deadline = time.monotonic() + 10
        while not descendants(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = descendants(proc.pid)
        assert alive(proc.pid) and alive(child)
        assert procs.cmdline(child) == "sleep 30"
    finally:
        proc.kill()
        proc.wait()
    assert not alive(proc.pid)  # reaped
    os.kill(child, signal.SIGKILL)


# --- the real job --------------------------------------------------------------------------------

def _runner(out: Path, *extra: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Start the runner; its output lines collect in the returned list."""
    cmd = [sys.executable, "-m", "training.local", "--out", str(out), "--synthetic", "--synthetic-train", "2048",
           "--synthetic-test", "512", "--batch-size", "64", "--log-every", "2", "--checkpoint-every", "6",
           "--timeout", "240", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _assert_nothing_left(out: Path) -> dict:
    pids = json.loads((out / "pids.json").read_text())
    started = pids["etcd"] + pids["agents"] + pids["workers"]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in started if alive(p)] == [], pids
    if pids["rdzv_endpoint"]:
        assert not listening(int(pids["rdzv_endpoint"].rsplit(":", 1)[1]))
    return pids


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_killed_worker_recovers_and_the_job_finishes(tmp_path):
    out = tmp_path / "out"
    proc, lines = _runner(out, "--agents", "2", "--epochs", "3", "--kill-worker-at-step", "10")
    try:
        rc = proc.wait(timeout=300)
    finally:
        proc.kill()
    log = "\n".join(lines)
    assert rc == 0, log[-5000:]
    result = json.loads((out / "result.json").read_text())
    assert result["returncode"] == 0 and result["agent_returncodes"] == [0, 0]
    assert result["kill_step"] >= 10 and 0 < result["recovery_s"] < 120, result
    assert result["resumed_step"] > 0  # resumed from a checkpoint, not from scratch
    assert "recovered in" in log and "[agent0] " in log and "[agent1] " in log
    metrics = json.loads(Path(result["metrics"]).read_text())
    assert len(metrics["per_class"]) == 10 and metrics["accuracy"] > 0.3
    assert "test accuracy" in log and f"metrics: {result['metrics']}" in log
    png = out / "training-curve.png"
    assert Path(result["plot"]) == png and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pids = _assert_nothing_left(out)
    assert len(pids["agents"]) == 2 and len(pids["etcd"]) == 1
    assert len(pids["workers"]) >= 3  # the first two and at least one restarted


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigint_mid_run_stops_everything(tmp_path):
    out = tmp_path / "out"
    proc, lines = _runner(out, "--agents", "2", "--epochs", "200")
    try:
        deadline = time.monotonic() + 180
        while not any("[train] epoch=" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines[-50:])
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert rc == 128 + signal.SIGINT, "\n".join(lines[-50:])
    assert any("stopped by SIGINT" in line for line in lines)
    pids = _assert_nothing_left(out)
    assert len(pids["agents"]) == 2 and len(pids["workers"]) >= 2 and len(pids["etcd"]) == 1
