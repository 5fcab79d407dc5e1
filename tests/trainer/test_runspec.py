"""A run spec changed under one run id (review 2026-11-24, K6): `pulumi up` replaces the Job and the new
trainer starts on the same run directory. More (or fewer) epochs resume the run; another model or global
batch is refused with a message that says to pick a new ``job.runId``, as docs/rendezvous.md states. Each trainer is
a real process started with the flags the Job renders (training/eks_ddp_trainer/config.py TrainerConfig)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from eks_ddp_runtime import exitcodes
from eks_ddp_trainer import train
from eks_ddp_trainer.config import TrainerConfig
from eks_ddp_trainer.data import write_synthetic_cifar
from tests.support.etcd_server import ROOT, trainer_env

N_TRAIN, BATCH = 64, 16  # 4 steps per epoch


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_synthetic_cifar(d, n_train=N_TRAIN, n_test=20, seed=0)
    return d


def _job(data_dir, run, **changes) -> TrainerConfig:
    base = TrainerConfig(data_dir=str(data_dir), run_dir=str(run), epochs=1, global_batch_size=BATCH, bn_group=4,
                         min_steps=0, width=4, log_every=50)
    return replace(base, **changes)


def _trainer(opts: TrainerConfig) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eks_ddp_trainer.train", *opts.flags()], cwd=ROOT, env=trainer_env(),
                          capture_output=True, text=True, timeout=180)


def _starts(run) -> list[dict]:
    lines = (run / train.HISTORY_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "start"]


def test_more_epochs_resume_and_another_model_or_batch_is_refused_under_the_same_run_id(data_dir, tmp_path):
    run = tmp_path / "run"
    first = _trainer(_job(data_dir, run, epochs=1))
    assert first.returncode == 0, first.stderr[-2000:]
    second = _trainer(_job(data_dir, run, epochs=2))
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "resuming at step 4 with --epochs=2" in second.stdout
    assert [(s["resumed_step"], s["total_steps"]) for s in _starts(run)] == [(0, 4), (4, 8)]
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["step"], metrics["epochs"], metrics["samples_seen"]) == (8, 2, 2 * N_TRAIN)

    for change, named in (({"model": "resnet-small"}, "'model'"), ({"global_batch_size": 2 * BATCH}, "'global_batch'")):
        again = _trainer(_job(data_dir, run, epochs=3, **change))
        assert again.returncode == exitcodes.CONFIG_ERROR, (change, again.stderr[-2000:])
        assert named in again.stderr and "new job.runId" in again.stderr, again.stderr[-2000:]
    assert len(_starts(run)) == 2, "a refused run trains nothing"
