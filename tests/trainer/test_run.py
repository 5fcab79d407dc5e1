"""The trainer end to end in one process, the standalone evaluation, and resume at another world size."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch

from eks_ddp_runtime import exitcodes
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import evaluate, train
from eks_ddp_trainer.config import TrainerConfig
from eks_ddp_trainer.data import write_synthetic_cifar
from tests.support.etcd_server import ROOT, TORCHRUN, trainer_env

LINE = re.compile(r"^\[train\] epoch=\d+ step=\d+ loss=\d+\.\d{4} acc=\d\.\d{3} img_s=\d+ world=\d+ lr=\d+\.\d{4}$")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_synthetic_cifar(d, n_train=320, n_test=100, seed=0)
    return d


def _history(run_dir):
    return [json.loads(line) for line in (run_dir / train.HISTORY_FILE).read_text().splitlines()]


def test_contract_flags_from_torchrun_builder_parse():
    opts = TrainerConfig(data_dir="d", run_dir="r", epochs=2, global_batch_size=8, lr=0.1, compile=True,
                         checkpoint_every=4, keep_checkpoints=2, log_every=3, max_steps=7, width=8, seed=1,
                         bn_group=4, min_steps=0)
    a = train.parse_args(opts.flags())
    assert (a.data_dir, a.run_dir, a.epochs, a.global_batch_size, a.lr, a.compile, a.checkpoint_every,
            a.keep_checkpoints, a.log_every, a.max_steps, a.width, a.seed, a.model, a.bn_group, a.min_steps) == (
        "d", "r", 2, 8, 0.1, True, 4, 2, 3, 7, 8, 1, "airnet", 4, 0)
    assert train.parse_args(TrainerConfig(data_dir="d", run_dir="r").flags()).global_batch_size == 1024


def test_single_process_trains_evaluates_and_resumes_finished(data_dir, tmp_path, capsys, in_process_trainer):
    run = tmp_path / "run"
    args = [f"--data-dir={data_dir}", f"--run-dir={run}", "--epochs=3", "--global-batch-size=32", "--width=8", "--lr=30",
            "--log-every=2", "--keep-checkpoints=2"]
    assert train.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"[train] start world=1 resumed_step=0 run_dir={run}"
    steps = [line for line in out if line.startswith("[train] epoch=")]
    assert steps and all(LINE.match(line) for line in steps), steps[:3]
    assert any(line.startswith("[eval] acc=") for line in out)
    assert any(line.startswith("airplane") for line in out)

    hist = [r for r in _history(run) if r.get("kind") == "step"]
    assert hist[-1]["loss"] < hist[0]["loss"] - 0.2, "loss must fall on learnable data"
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics["per_class"]) == {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                         "ship", "truck"}
    assert metrics["total"] == 100 and metrics["accuracy"] > 0.3 and metrics["step"] == 30
    # Default cadence: once per epoch (10 steps each) plus the end, keeping the last 2.
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000020.pt", "ckpt-000000030.pt"]

    # Standalone evaluation of model.pt agrees with the trainer's own.
    (run / "metrics.json").unlink()
    assert evaluate.main([f"--data-dir={data_dir}", f"--run-dir={run}"]) == 0
    assert json.loads((run / "metrics.json").read_text())["accuracy"] == pytest.approx(metrics["accuracy"])

    # A restart after the end resumes at the last step and only re-evaluates.
    assert train.main(args) == 0
    starts = [r for r in _history(run) if r.get("kind") == "start"]
    assert starts[-1]["resumed_step"] == 30
    assert [p.name for p in ckpt.list_checkpoints(run)][-1] == "ckpt-000000030.pt"


def test_other_model_or_width_in_same_run_dir_is_refused(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    run = tmp_path / "run"
    base = [f"--data-dir={data_dir}", f"--run-dir={run}", "--epochs=1", "--global-batch-size=64", "--max-steps=1"]
    assert train.main([*base, "--width=4"]) == 0
    assert train.main([*base, "--width=8"]) == exitcodes.CONFIG_ERROR
    assert "new --run-dir" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_at_other_world_size_continues_from_global_step(data_dir, tmp_path, monkeypatch):
    """Two processes (DDP, gloo) stop at step 6; one process resumes there with the same global batch."""
    run = tmp_path / "run"
    common = [f"--data-dir={data_dir}", f"--run-dir={run}", "--epochs=2", "--global-batch-size=16", "--bn-group=8",
              "--min-steps=0", "--width=4",
              "--checkpoint-every=3", "--log-every=1"]
    cmd = [TORCHRUN, "--standalone", "--nnodes=1", "--nproc-per-node=2", "-m", "eks_ddp_trainer.train", *common,
           "--max-steps=6"]
    proc = subprocess.run(cmd, cwd=ROOT, env=trainer_env(), capture_output=True, text=True, timeout=120,
                          start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, _ = ckpt.load_latest(run)
    assert (first["step"], first["samples_seen"], first["config"]["world_size"]) == (6, 6 * 16, 2)

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    torch.set_num_threads(1)
    assert train.main([*common, "--max-steps=10"]) == 0
    start = [r for r in _history(run) if r.get("kind") == "start"][-1]
    assert (start["world"], start["resumed_step"]) == (1, 6)
    last, _ = ckpt.load_latest(run)
    assert last["step"] == 10
    assert last["samples_seen"] == 10 * 16, "the global batch is the same at world 1"
    assert last["sample_in_epoch"] == last["samples_seen"]  # still in epoch 0 of 320 samples
    steps = [r["step"] for r in _history(run) if r.get("kind") == "step"]
    assert steps == list(range(1, 11)), "the step counter continues, no step is repeated or skipped"


def test_tensorboard_flag_says_when_tensorboard_is_missing(tmp_path, capsys):
    import importlib.util

    log = train.RunLog(tmp_path, enabled=True, tensorboard=True)
    if importlib.util.find_spec("tensorboard") is None:
        assert log.tb is None and "tensorboard package is not installed" in capsys.readouterr().out
    else:
        assert log.tb is not None
    log.record("train", None, kind="step", step=1, loss=1.0, acc=0.5, lr=0.1, img_s=10.0)
    log.close()
    assert json.loads((tmp_path / train.HISTORY_FILE).read_text())["step"] == 1
