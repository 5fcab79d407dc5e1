"""The local runner (python -m eks_ddp_local): the cluster's job on one machine.

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
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from eks_ddp_local import cli as local
from eks_ddp_local import procs
from eks_ddp_local.job import LocalJob
from eks_ddp_local.procs import alive, descendants, listening
from eks_ddp_local.progress import History, Progress
from eks_ddp_runtime.launch_command import AGENT_ENV, LOCAL_TIMEOUTS, AgentOptions, RdzvTls, job_command
from eks_ddp_trainer.config import TrainerConfig
from eks_ddp_trainer.plot import metrics_table, plot_history, read_history, read_test_accuracy
from tests.support.shm import run_shm
from tests.support.util import ROOT

STEP = "[train] epoch=2 step=25 loss=1.2749 acc=0.804 img_s=603 world=2 lr=0.1562"
STEP_RECORD = {"event": "train", "time": 1.0, "kind": "step", "epoch": 2, "step": 25, "loss": 1.2749, "acc": 0.804,
               "img_s": 603.0, "world": 2, "lr": 0.1562}


def test_history_reads_the_records_the_trainer_appends_as_they_arrive(tmp_path):
    """The runner reads the trainer's JSON records, not its log text: whole lines only (a line being written is read
    once complete), and a resumed run's old records are not new."""
    path = tmp_path / "history.jsonl"
    fresh = History(path)
    assert fresh.read() == []  # no file yet
    start = {"event": "train", "kind": "start", "world": 2, "resumed_step": 20}
    path.write_text(json.dumps(start) + "\n" + json.dumps(STEP_RECORD)[:30])
    assert fresh.read() == [start]
    with path.open("a") as f:
        f.write(json.dumps(STEP_RECORD)[30:] + "\nnot json\n")
    assert fresh.read() == [STEP_RECORD]
    assert fresh.read() == []
    resumed = History(path)
    with path.open("a") as f:
        f.write(json.dumps({"event": "eval", "kind": "eval", "accuracy": 0.91}) + "\n")
    assert resumed.read() == [{"event": "eval", "kind": "eval", "accuracy": 0.91}]


def test_progress_prefixes_lines_and_shows_step_of_total():
    out = io.StringIO()
    p = Progress(total_steps=lambda world: 64 // world * 2, stream=out, tty=False)
    p.line("agent1", "W1121 some torch warning [rank0]: a [bracketed] :thing:")
    p.line("agent0", STEP)
    p.record({"event": "train", "kind": "start", "world": 2, "resumed_step": 0})
    p.record(STEP_RECORD)
    p.record({**STEP_RECORD, "step": 26})  # within every_s of the last status line: not printed
    p.close()
    text = out.getvalue()
    assert "\x1b" not in text  # plain lines off a terminal
    assert "[agent1] W1121 some torch warning [rank0]: a [bracketed] :thing:\n" in text
    assert f"[agent0] {STEP}\n" in text
    status = [line for line in text.splitlines() if line.startswith("[progress]")]
    assert len(status) == 1
    for part in ("step 25/64", "loss 1.275", "acc 80.4%", "603 img/s", "world 2"):
        assert part in status[0]


def test_progress_keeps_the_status_below_the_lines_on_a_terminal_and_erases_it_at_the_end():
    out = io.StringIO()
    p = Progress(stream=out, tty=True)
    p.line("agent0", STEP)
    p.record(STEP_RECORD)
    p.line("agent0", "next")
    text = out.getvalue()
    # Each line is printed over the erased status line, and the status is drawn again below it.
    assert "\r\x1b[2K[agent0] next\n" in text and text.rindex("[progress] step 25") > text.index("[agent0] next")
    p.close()
    assert out.getvalue()[len(text):].endswith("\x1b[2K")  # erased: the lines that follow start clean


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
    job = LocalJob(opts, Progress(stream=io.StringIO()))
    from eks_ddp_local.etcd_server import EtcdEndpoint, make_tls

    tls = make_tls(tmp_path / "tls")
    command = job.agent_command(EtcdEndpoint("127.0.0.1:2379", tls), tmp_path / "data")
    expected = job_command(
        AgentOptions(min_nodes=3, max_nodes=3, nproc_per_node=1, rdzv_backend="etcd",
                     rdzv_endpoint="127.0.0.1:2379", rdzv_id=job.run_id, max_restarts=opts.max_restarts,
                     timeouts=LOCAL_TIMEOUTS, local_addr="127.0.0.1",
                     tls=RdzvTls(ca_cert=str(tls.ca_cert), cert=str(tls.client_cert), key=str(tls.client_key))),
        TrainerConfig(data_dir=str(tmp_path / "data"), run_dir=str(job.run_dir), epochs=2,
                      global_batch_size=opts.global_batch_size, bn_group=opts.bn_group, width=opts.width,
                      checkpoint_every=opts.checkpoint_every, log_every=opts.log_every), python=command[0])
    assert command == expected
    env = job.agent_env()
    assert all(env[k] == v for k, v in AGENT_ENV.items())
    assert int(env["OMP_NUM_THREADS"]) == max(1, (os.cpu_count() or 1) // 3)
    with pytest.raises(SystemExit):
        local.parse_args(["--agents", "2", "--min-agents", "3"])


def test_descendants_and_alive():
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


def test_a_zombie_is_neither_alive_nor_in_the_table_and_a_listener_is_seen():
    """An exited child nobody reaped yet is a zombie: not alive, not a descendant, no command line (as /proc/<pid>/stat
    state Z said before psutil); a listening socket is seen on its port and not after it closes."""
    import socket

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None  # exited, unreaped
        assert not alive(proc.pid) and proc.pid not in procs.proc_table()
        assert proc.pid not in descendants(os.getpid()) and procs.cmdline(proc.pid) == ""
    finally:
        proc.wait()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not listening(port)
        s.listen()
        assert listening(port)
    assert not listening(port)


# --- the real job --------------------------------------------------------------------------------

def _runner(out: Path, *extra: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Start the runner; its output lines collect in the returned list."""
    cmd = [sys.executable, "-m", "eks_ddp_local", "--out", str(out), "--synthetic", "--synthetic-train", "2048",
           "--synthetic-test", "512", "--global-batch-size", "64", "--log-every", "2", "--checkpoint-every", "6",
           "--timeout", "240", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _run_dir(out: Path) -> Path:
    """The run's own folder: <out>/<run-id>/ (one per run)."""
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _wait_for(proc: subprocess.Popen, lines: list[str], text: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert proc.poll() is None and time.monotonic() < deadline, "\n".join(lines[-50:])
        time.sleep(0.2)


def _assert_nothing_left(out: Path) -> dict:
    pids = json.loads((_run_dir(out) / "pids.json").read_text())
    started = pids["etcd"] + pids["agents"] + pids["workers"]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in started if alive(p)] == [], pids
    if pids["rdzv_endpoint"]:
        assert not listening(int(pids["rdzv_endpoint"].rsplit(":", 1)[1]))
    return pids


@pytest.mark.long  # 44 s: make test-long and make demo; make test keeps the runner's signal, Ctrl-C and bad-data cases
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
    run_dir = _run_dir(out)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["returncode"] == 0 and result["agent_returncodes"] == [0, 0]
    assert result["kill_step"] >= 10 and 0 < result["recovery_s"] < 120, result
    assert result["resumed_step"] > 0  # resumed from a checkpoint, not from scratch
    assert "recovered in" in log and "[agent0] " in log
    assert "[agent1] worker pid " in log and "exited with -9 (SIGKILL)" in log  # torchrun's report, one line
    metrics = json.loads(Path(result["metrics"]).read_text())
    assert len(metrics["per_class"]) == 10 and metrics["accuracy"] > 0.3
    assert log.count("test accuracy") == 1 and f"metrics: {result['metrics']}" in log  # one table
    assert len([ln for ln in log.splitlines() if "Traceback" in ln]) == 0  # peers' tracebacks: one line each
    assert "Traceback" in (run_dir / "logs" / "agent0.log").read_text() + (run_dir / "logs" / "agent1.log").read_text()
    png = run_dir / "training-curve.png"
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
        _wait_for(proc, lines, "[train] epoch=")
        os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert rc == 128 + signal.SIGINT, "\n".join(lines[-50:])
    assert any("stopped by SIGINT" in line for line in lines)
    pids = _assert_nothing_left(out)
    assert len(pids["agents"]) == 2 and len(pids["workers"]) >= 2 and len(pids["etcd"]) == 1


def test_bad_model_is_one_line_and_starts_nothing(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "eks_ddp_local", "--out", str(out), "--model", "resnet50"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--model resnet50: unknown" in proc.stderr, proc.stderr
    assert not out.exists()  # nothing started, nothing retried


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGHUP, marks=pytest.mark.long), signal.SIGKILL])
def test_runner_killed_leaves_no_process_and_no_temp_dir(tmp_path, sig):
    """A closed terminal (SIGHUP) or SIGKILL of the runner: etcd, agents and workers die with it, and nothing of the
    run's stays in /dev/shm (its node-local snapshot and the agents' lease folders: memory, until a reboot)."""
    out = tmp_path / "out"
    proc, lines = _runner(out, "--agents", "2", "--epochs", "200")
    try:
        _wait_for(proc, lines, "[train] epoch=")
        run_id = _run_dir(out).name
        assert list(Path(tempfile.gettempdir()).glob(f"eks-ddp-etcd-{run_id}-*"))
        deadline = time.monotonic() + 30
        while not [p for d in run_shm(run_id) for p in d.glob("eks-ddp-*/node.snap")] and time.monotonic() < deadline:
            time.sleep(0.1)
        [shm] = run_shm(run_id)
        assert list(shm.glob("eks-ddp-*/node.snap")) and list(shm.glob("eks-ddp-lease-*")), \
            sorted(str(p.relative_to(shm)) for p in shm.rglob("*"))
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    pids = _assert_nothing_left(out)  # waits up to 10 s, then asserts every pid gone and the etcd port closed
    assert len(pids["agents"]) == 2 and len(pids["workers"]) >= 2 and len(pids["etcd"]) == 1
    deadline = time.monotonic() + 10
    while ((list(Path(tempfile.gettempdir()).glob(f"eks-ddp-etcd-{run_id}-*")) or run_shm(run_id))
           and time.monotonic() < deadline):
        time.sleep(0.1)
    assert not list(Path(tempfile.gettempdir()).glob(f"eks-ddp-etcd-{run_id}-*"))
    assert run_shm(run_id) == []


def _failed_line(lines: list[str]) -> str:
    failed = [ln for ln in lines if ln.startswith("[local] FAILED: ")]
    assert len(failed) == 1, "\n".join(lines[-60:])
    return failed[0]


@pytest.mark.long  # make test-long; make test keeps the runner's signal, Ctrl-C and bad-data cases
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_etcd_killed_gives_a_one_line_cause(tmp_path):
    out = tmp_path / "out"
    proc, lines = _runner(out, "--agents", "2", "--epochs", "200")
    try:
        _wait_for(proc, lines, "[train] epoch=")
        pids = json.loads((_run_dir(out) / "pids.json").read_text())
        os.kill(pids["etcd"][0], signal.SIGKILL)
        rc = proc.wait(timeout=120)
    finally:
        proc.kill()
    assert rc != 0
    assert "the etcd rendezvous server" in _failed_line(lines) and "exited during the run" in _failed_line(lines)
    _assert_nothing_left(out)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_corrupt_data_file_is_named_and_not_retried(tmp_path):
    from eks_ddp_trainer.data import write_synthetic_cifar

    data = tmp_path / "data"
    write_synthetic_cifar(data, 256, 64, 0)
    bad = data / "cifar-10-batches-py" / "data_batch_1"
    bad.write_bytes(b"not a pickle" * 100)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "eks_ddp_local", "--out", str(out / "real"), "--data", str(data),
           "--global-batch-size", "64", "--agents", "2", "--epochs", "1", "--timeout", "200"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=250)
    out_lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode != 0
    assert str(bad) in _failed_line(out_lines), "\n".join(out_lines[-40:])
    assert "not retried" in done.stdout
    logs = "".join(p.read_text() for p in (_run_dir(out / "real") / "logs").glob("agent*.log"))
    assert logs.count("will restart worker group") == 0  # torchrun restarted nothing
    assert logs.count("[train] error:") <= 2  # one failure per worker, no second attempt
    _assert_nothing_left(out / "real")


@pytest.mark.long  # make test-long; make test keeps the runner's signal, Ctrl-C and bad-data cases
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_interrupted_run_resumes_from_its_folder(tmp_path):
    out = tmp_path / "out"
    proc, lines = _runner(out, "--agents", "2", "--epochs", "2", "--max-steps", "24")
    try:
        _wait_for(proc, lines, "step=8 ")
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 128 + signal.SIGINT
    finally:
        proc.kill()
    run_dir = _run_dir(out)
    assert any(f"resume it with: {sys.executable} -m eks_ddp_local --resume {run_dir}" in line for line in lines)
    done = subprocess.run([sys.executable, "-m", "eks_ddp_local", "--resume", str(run_dir), "--timeout", "240"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["start_step"] >= 6 and [p for p in out.iterdir() if p.is_dir()] == [run_dir]
    assert json.loads((run_dir / "metrics.json").read_text())["step"] == 24


@pytest.mark.long  # make test-long; make test keeps the runner's signal, Ctrl-C and bad-data cases
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_losing_an_agent_then_finishing_exits_0(tmp_path):
    """3 agents, min 1: one agent (a node) is lost mid-run, the other two finish the job: success."""
    out = tmp_path / "out"
    proc, lines = _runner(out, "--agents", "3", "--min-agents", "1", "--epochs", "1", "--kill-agent-at-step", "8")
    try:
        rc = proc.wait(timeout=330)
    finally:
        proc.kill()
    result = json.loads((_run_dir(out) / "result.json").read_text())
    assert rc == 0, "\n".join(lines[-60:])
    assert result["returncode"] == 0 and result["agent_returncodes"][:2] == [0, 0]
    assert result["agent_returncodes"][2] == -signal.SIGKILL and result["kill_step"] >= 8
    assert json.loads(Path(result["metrics"]).read_text())["world_size"] == 2
    _assert_nothing_left(out)


def test_root_cause_of_a_full_disk_and_of_a_bad_trainer_flag_from_the_real_messages():
    """The runner's one-line causes, fed the messages the kernel and the trainer really print."""
    from eks_ddp_local.progress import root_cause

    try:  # /dev/full answers every write with ENOSPC, as a full EFS or node disk does
        with open("/dev/full", "wb") as f:
            f.write(b"\0" * 65536)
            f.flush()
    except OSError as err:
        full = f"OSError: {err}"
    cause = root_cause(full)
    assert cause is not None and cause.startswith("disk full (ENOSPC)"), (full, cause)

    proc = subprocess.run([sys.executable, "-m", "eks_ddp_trainer.train", "--data-dir=/x", "--run-dir=/y", "--bogus=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    from eks_ddp_runtime import exitcodes

    assert proc.returncode == exitcodes.CONFIG_ERROR  # FATAL: the Job and the runner do not retry it
    (usage,) = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert root_cause(f"[default0]:{usage}") == "bad trainer flag: unrecognized arguments: --bogus=1"
    assert root_cause("[train] epoch=1 step=3 loss=2.1") is None


@pytest.mark.long  # make test-long; make test keeps the runner's signal, Ctrl-C and bad-data cases
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_runs_sharing_out_keep_separate_folders(tmp_path):
    out = tmp_path / "out"
    folders = []
    for _ in range(2):
        proc, lines = _runner(out, "--agents", "1", "--epochs", "1", "--max-steps", "3")
        try:
            assert proc.wait(timeout=200) == 0, "\n".join(lines[-40:])
        finally:
            proc.kill()
        result_files = sorted(out.glob("*/result.json"))
        folders = [p.parent for p in result_files]
    assert len(folders) == 2 and folders[0] != folders[1]
    for f in folders:
        result = json.loads((f / "result.json").read_text())
        assert result["returncode"] == 0 and Path(result["run_dir"]).is_relative_to(f)
        assert (f / "training-curve.png").exists()


def test_resume_line_names_this_interpreter_so_it_runs_without_an_activated_venv(tmp_path):
    """Review U20: the printed command must work pasted as is, also when the venv with torch is not activated."""
    run_dir = tmp_path / "my runs" / "run-1"
    line = local.resume_command(run_dir)
    assert shlex.split(line) == [sys.executable, "-m", "eks_ddp_local", "--resume", str(run_dir)]
