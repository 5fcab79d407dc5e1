"""Unit tests of the trainer's parts: checkpoints, sharding, augmentation, schedule, data format."""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch

from training import checkpoint as ckpt
from training.data import (
    augment,
    epoch_permutation,
    load_cifar,
    rank_indices,
    read_class_names,
    steps_in_epoch,
    write_synthetic_cifar,
)
from training.model import build_model, precision_for
from training.train import lr_factor, parse_args


def _state(step: int) -> dict:
    m = torch.nn.Linear(2, 2)
    return {"step": step, "epoch": 0, "sample_in_epoch": step * 4, "samples_seen": step * 4, "model": m.state_dict(),
            "optimizer": torch.optim.SGD(m.parameters(), lr=0.1).state_dict(), "config": {"model": "x"}}


# ---------------------------------------------------------------- checkpoints

def test_save_is_atomic_and_keeps_last_k(tmp_path):
    for step in (5, 10, 15, 20):
        ckpt.save_checkpoint(tmp_path, _state(step), keep=2)
    names = [p.name for p in ckpt.list_checkpoints(tmp_path)]
    assert names == ["ckpt-000000015.pt", "ckpt-000000020.pt"]
    assert not [p for p in ckpt.ckpt_dir(tmp_path).iterdir() if ".tmp" in p.name], "temp files left behind"
    state, path = ckpt.load_latest(tmp_path)
    assert state["step"] == 20 and path.name == "ckpt-000000020.pt"


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep_checkpoints"):
        ckpt.save_checkpoint(tmp_path, _state(1), keep=0)


def test_truncated_newest_is_skipped_with_warning(tmp_path, caplog):
    ckpt.save_checkpoint(tmp_path, _state(10), keep=3)
    newest = ckpt.save_checkpoint(tmp_path, _state(20), keep=3)
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        state, path = ckpt.load_latest(tmp_path)
    assert state["step"] == 10 and path.name == "ckpt-000000010.pt"
    assert "skipping unreadable checkpoint" in caplog.text and newest.name in caplog.text


def test_foreign_and_garbage_files_are_skipped(tmp_path):
    ckpt.save_checkpoint(tmp_path, _state(3), keep=3)
    torch.save({"step": 99}, ckpt.ckpt_path(tmp_path, 99))  # loads, but lacks the required keys
    ckpt.ckpt_path(tmp_path, 100).write_bytes(b"\x00garbage")
    (ckpt.ckpt_dir(tmp_path) / ".ckpt-000000200.pt.tmp-123").write_bytes(b"half written")
    state, _ = ckpt.load_latest(tmp_path)
    assert state["step"] == 3


def test_no_checkpoint_gives_none(tmp_path):
    assert ckpt.load_latest(tmp_path) is None


def test_writer_dying_before_replace_leaves_previous_file(tmp_path):
    target = tmp_path / "f.bin"
    ckpt.atomic_write_bytes(target, b"old")

    def die() -> None:
        raise KeyboardInterrupt  # the writer is interrupted between write and replace

    with pytest.raises(KeyboardInterrupt):
        ckpt.atomic_write_bytes(target, b"new" * 1000, before_replace=die)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]


def test_pause_hook_only_for_its_step_and_only_once(tmp_path, monkeypatch):
    marker = tmp_path / "paused"
    monkeypatch.setenv(ckpt.PAUSE_STEP_ENV, "7")
    monkeypatch.setenv(ckpt.PAUSE_MARKER_ENV, str(marker))
    assert ckpt._pause_hook(6) is None
    assert ckpt._pause_hook(7) is not None
    marker.write_text("1")
    assert ckpt._pause_hook(7) is None


# ---------------------------------------------------------------- sharding

@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("n,batch", [(100, 8), (97, 16), (30, 10), (64, 32), (10, 3)])
def test_every_sample_once_per_epoch(world, n, batch):
    for epoch in (0, 1):
        perm = epoch_permutation(n, epoch, seed=5)
        seen: list[int] = []
        pos, steps = 0, 0
        while pos < n:
            parts = [rank_indices(perm, pos, world, r, batch) for r in range(world)]
            spans = {span for _, span in parts}
            assert len(spans) == 1, "ranks disagree on the step's size"
            for idx, _ in parts:
                assert len(idx) >= 1, "a rank got an empty batch"
                seen += idx.tolist()
            pos += spans.pop()
            steps += 1
        assert sorted(seen) == list(range(n))
        assert steps == steps_in_epoch(n, world, batch)


def test_permutation_agrees_across_ranks_and_changes_per_epoch():
    assert torch.equal(epoch_permutation(50, 3, 1), epoch_permutation(50, 3, 1))
    assert not torch.equal(epoch_permutation(50, 3, 1), epoch_permutation(50, 4, 1))


def test_world_size_change_mid_epoch_still_covers_each_sample_once():
    n, batch = 120, 7
    perm = epoch_permutation(n, 0, seed=0)
    seen, pos = [], 0
    for world in (2, 2, 2, 3, 3, 1, 1, 1, 3):  # restarts at other sizes, resuming by global position
        if pos >= n:
            break
        span = 0
        for r in range(world):
            idx, span = rank_indices(perm, pos, world, r, batch)
            seen += idx.tolist()
        pos += span
    while pos < n:
        idx, span = rank_indices(perm, pos, 1, 0, batch)
        seen += idx.tolist()
        pos += span
    assert sorted(seen) == list(range(n))


# ---------------------------------------------------------------- augmentation, data, model

def test_augment_shapes_dtypes_and_content():
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    out = augment(x, g)
    assert out.shape == (16, 3, 32, 32) and out.dtype == torch.float32
    assert torch.equal(out, augment(x, torch.Generator().manual_seed(0))), "same seed, same augmentation"
    assert not torch.equal(out, augment(x, torch.Generator().manual_seed(1)))
    # Every output is a 32x32 window of the reflect-padded (and possibly mirrored) input, values unchanged.
    from training.data import normalize
    pad = torch.nn.functional.pad(normalize(x), (4, 4, 4, 4), mode="reflect")
    for i in range(16):
        windows = [pad[i, :, oy:oy + 32, ox:ox + 32] for oy in range(9) for ox in range(9)]
        assert any(torch.allclose(out[i], w) or torch.allclose(out[i], w.flip(-1)) for w in windows)
    assert augment(x[:0], g).shape == (0, 3, 32, 32)


def test_synthetic_data_loads_with_str_keys_and_real_style_bytes_keys(tmp_path):
    root = write_synthetic_cifar(tmp_path, n_train=50, n_test=20, seed=1)
    d = load_cifar(tmp_path, torch.device("cpu"))
    assert d.train.images.dtype == torch.uint8 and d.train.images.shape == (50, 3, 32, 32)
    assert len(d.test) == 20 and d.classes[0] == "airplane" and len(d.classes) == 10
    # Rewrite one batch and the meta the way the official archive has them (bytes keys and values).
    with open(root / "test_batch", "rb") as f:
        raw = pickle.load(f)
    with open(root / "test_batch", "wb") as f:
        pickle.dump({b"data": raw["data"], b"labels": raw["labels"]}, f)
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in d.classes]}, f)
    d2 = load_cifar(tmp_path, torch.device("cpu"))
    assert torch.equal(d2.test.images, d.test.images) and read_class_names(root) == d.classes


def test_missing_batches_name_prepare_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare_data"):
        load_cifar(tmp_path, torch.device("cpu"))


@pytest.mark.parametrize("name,width", [("resnet-small", 8), ("resnet18", None), ("workshop-cnn", None)])
def test_models_take_cifar_images(name, width):
    m = build_model(name, 10, width).to(memory_format=torch.channels_last)
    out = m(torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last))
    assert out.shape == (2, 10)


def test_width_only_for_resnet_small():
    with pytest.raises(ValueError, match="--width"):
        build_model("resnet18", 10, 8)


def test_cpu_precision_is_fp32():
    p = precision_for(torch.device("cpu"))
    assert p.dtype is None and not p.use_scaler and p.name == "fp32"


def test_schedule_warms_up_then_decays_to_zero():
    assert lr_factor(0.0) == 0.0 and lr_factor(0.2) == pytest.approx(1.0) and lr_factor(1.0) == 0.0
    assert lr_factor(0.1) == pytest.approx(0.5) and lr_factor(0.6) == pytest.approx(0.5)


def test_cli_contract_flags_parse():
    a = parse_args(["--data-dir=d", "--run-dir=r", "--epochs=2", "--batch-size=8", "--model=resnet18",
                    "--keep-checkpoints=2", "--seed=3", "--lr=0.1", "--compile", "--checkpoint-every=5",
                    "--log-every=2", "--max-steps=9", "--width=16"])
    assert (a.epochs, a.batch_size, a.model, a.keep_checkpoints, a.seed, a.lr, a.compile, a.checkpoint_every,
            a.log_every, a.max_steps, a.width) == (2, 8, "resnet18", 2, 3, 0.1, True, 5, 2, 9, 16)
    with pytest.raises(SystemExit):
        parse_args(["--data-dir=d", "--run-dir=r", "--checkpoint-every=0"])
