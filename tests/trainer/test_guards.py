"""The trainer fails loudly instead of training on garbage: divergence, unreadable checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from eks_ddp_runtime import exitcodes
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import train
from eks_ddp_trainer.data import write_synthetic_cifar


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_synthetic_cifar(d, n_train=128, n_test=20, seed=0)
    return d


pytestmark = pytest.mark.usefixtures("in_process_trainer")


def _flags(data_dir, run, *extra: str) -> list[str]:
    return [f"--data-dir={data_dir}", f"--run-dir={run}", "--epochs=4", "--global-batch-size=16", "--bn-group=8",
            "--min-steps=0", "--log-every=1", *(extra or ["--width=4"])]


def _steps(run) -> list[int]:
    return [json.loads(line).get("step") for line in (run / train.HISTORY_FILE).read_text().splitlines()
            if json.loads(line).get("kind") == "step"]


@pytest.mark.parametrize("model", ["--width=4", "--model=workshop-cnn"])
def test_huge_learning_rate_exits_diverged_within_a_few_steps_and_saves_nothing(data_dir, tmp_path, capsys, model):
    run = tmp_path / "run"
    # A checkpoint every step: the guard must stop non-finite states from being written.
    rc = train.main(_flags(data_dir, run, "--lr=5000", "--checkpoint-every=1", model))
    assert rc == exitcodes.DIVERGED
    assert "diverged" in capsys.readouterr().err
    assert max(_steps(run), default=0) <= 10, "must stop within a few steps"
    for path in ckpt.list_checkpoints(run):
        state = ckpt.load_checkpoint(path)
        assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point()), path
    assert not (run / "model.pt").exists()


def test_unreadable_checkpoints_fail_with_bad_input_naming_the_file(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert train.main(_flags(data_dir, run, "--width=4", "--max-steps=4", "--checkpoint-every=2")) == 0
    files = ckpt.list_checkpoints(run)
    assert [p.name for p in files] == ["ckpt-000000002.pt", "ckpt-000000004.pt"]
    for p in files:
        p.write_bytes(p.read_bytes()[:200])  # truncated, e.g. by a bad copy
    assert train.main(_flags(data_dir, run)) == exitcodes.BAD_INPUT
    err = capsys.readouterr().err
    assert "ckpt-000000004.pt" in err and "ckpt-000000002.pt" in err and "--start-over" in err
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["ckpt-000000002.pt", "ckpt-000000004.pt"], \
        "the evidence stays, and a retry fails the same way"

    # Opt-in: set them aside and train from scratch; the new checkpoints are kept.
    assert train.main(_flags(data_dir, run, "--width=4", "--start-over", "--checkpoint-every=2")) == 0
    start = [json.loads(x) for x in (run / train.HISTORY_FILE).read_text().splitlines()
             if json.loads(x).get("kind") == "start"][-1]
    assert start["resumed_step"] == 0
    assert ckpt.list_checkpoints(run)[-1].name == "ckpt-000000032.pt"
    assert sorted(p.name for p in ckpt.ckpt_dir(run).glob("*.unreadable")) == [
        "ckpt-000000002.pt.unreadable", "ckpt-000000004.pt.unreadable"]


def test_corrupt_newest_falls_back_to_previous_with_a_warning(data_dir, tmp_path, caplog):
    run = tmp_path / "run"
    assert train.main(_flags(data_dir, run, "--width=4", "--max-steps=4", "--checkpoint-every=2")) == 0
    newest = ckpt.list_checkpoints(run)[-1]
    newest.write_bytes(b"garbage")
    assert train.main(_flags(data_dir, run, "--width=4", "--max-steps=6", "--checkpoint-every=2")) == 0
    assert newest.name in caplog.text
    start = [json.loads(x) for x in (run / train.HISTORY_FILE).read_text().splitlines()
             if json.loads(x).get("kind") == "start"][-1]
    assert start["resumed_step"] == 2
    assert ckpt.list_checkpoints(run)[-1].name == "ckpt-000000006.pt"
