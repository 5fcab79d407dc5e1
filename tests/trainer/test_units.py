"""Unit tests of the trainer's parts: checkpoints, sharding, augmentation, schedule, data format."""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch

from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer.data import (
    ALL_FILES,
    MIN_STEPS,
    Batching,
    StepNoise,
    augment,
    epoch_permutation,
    flip_parity,
    load_cifar,
    plan_batching,
    rank_indices,
    read_class_names,
    write_synthetic_cifar,
)
from eks_ddp_trainer.integrity import write_manifest
from eks_ddp_trainer.model import build_model, precision_for
from eks_ddp_trainer.train import lr_factor, parse_args


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
    with caplog.at_level(logging.WARNING, logger="eks_ddp_trainer.checkpoint"):
        state, path = ckpt.load_latest(tmp_path)
    assert state["step"] == 10 and path.name == "ckpt-000000010.pt"
    assert "unreadable checkpoint" in caplog.text and newest.name in caplog.text


def test_foreign_and_garbage_files_are_skipped_and_set_aside(tmp_path):
    ckpt.save_checkpoint(tmp_path, _state(3), keep=3)
    torch.save({"step": 99}, ckpt.ckpt_path(tmp_path, 99))  # loads, but lacks the required keys
    ckpt.ckpt_path(tmp_path, 100).write_bytes(b"\x00garbage")
    (ckpt.ckpt_dir(tmp_path) / ".ckpt-000000200.pt.tmp-123").write_bytes(b"half written")
    state, _ = ckpt.load_latest(tmp_path, set_aside=True)
    assert state["step"] == 3
    assert sorted(p.name for p in ckpt.ckpt_dir(tmp_path).glob("*.unreadable")) == [
        "ckpt-000000099.pt.unreadable", "ckpt-000000100.pt.unreadable"]


def test_no_checkpoint_gives_none(tmp_path):
    assert ckpt.load_latest(tmp_path) is None


def test_only_unreadable_checkpoints_fail_loudly_and_stay_in_place(tmp_path):
    for step in (10, 20, 30):
        ckpt.ckpt_path(tmp_path, step).parent.mkdir(parents=True, exist_ok=True)
        ckpt.ckpt_path(tmp_path, step).write_bytes(b"not a checkpoint")
    with pytest.raises(ckpt.CheckpointError, match="ckpt-000000030.pt") as e:
        ckpt.load_latest(tmp_path, set_aside=True)
    assert "ckpt-000000010.pt" in str(e.value)
    assert len(ckpt.list_checkpoints(tmp_path)) == 3, "a retry must fail the same way, not start over"
    assert ckpt.load_latest(tmp_path, set_aside=True, allow_none_valid=True) is None
    assert ckpt.list_checkpoints(tmp_path) == []


def test_retention_never_deletes_the_checkpoint_just_written(tmp_path):
    """Unreadable files with higher steps (a restart from scratch) must not push out the new valid ones."""
    for step in (100, 110, 120):
        ckpt.ckpt_path(tmp_path, step).parent.mkdir(parents=True, exist_ok=True)
        ckpt.ckpt_path(tmp_path, step).write_bytes(b"unreadable")
    for step in (5, 10, 15):
        written = ckpt.save_checkpoint(tmp_path, _state(step), keep=2)
        assert written.exists()
    names = [p.name for p in ckpt.list_checkpoints(tmp_path)]
    assert "ckpt-000000015.pt" in names and "ckpt-000000010.pt" in names and "ckpt-000000005.pt" not in names
    state, path = ckpt.load_latest(tmp_path, set_aside=True)
    assert state["step"] == 15


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

def _walk_epoch(plan: Batching, perm: torch.Tensor, worlds) -> list[int]:
    """Every rank's samples over one epoch, the world size changing at each step as ``worlds`` says."""
    seen: list[int] = []
    pos, step = 0, 0
    while pos < plan.n:
        world = worlds[min(step, len(worlds) - 1)]
        parts = [rank_indices(perm, pos, world, r, plan) for r in range(world)]
        spans = {span for _, span in parts}
        assert len(spans) == 1, "ranks disagree on the step's size"
        sizes = [len(idx) for idx, _ in parts]
        assert max(sizes) - min(sizes) <= plan.group + plan.n % plan.group, sizes
        odd = [s for s in sizes if s % plan.group]
        assert not odd or (len(odd) == 1 and step == plan.steps_per_epoch - 1), "ranks hold whole BN groups"
        for idx, _ in parts:
            seen += idx.tolist()
        pos += spans.pop()
        step += 1
    assert step == plan.steps_per_epoch
    return seen


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("n,batch,group", [(100, 16, 8), (97, 16, 4), (30, 10, 5), (64, 32, 8), (10, 4, 2), (7, 8, 8)])
def test_every_sample_once_per_epoch(world, n, batch, group):
    plan = Batching(n, batch, group)
    for epoch in (0, 1):
        perm = epoch_permutation(n, epoch, seed=5)
        assert sorted(_walk_epoch(plan, perm, [world])) == list(range(n))


def test_step_contents_do_not_depend_on_the_world_size():
    plan = Batching(120, 24, 4)
    perm = epoch_permutation(120, 0, seed=0)
    for pos in range(0, 120, 24):
        whole, span = rank_indices(perm, pos, 1, 0, plan)
        for world in (2, 3, 4, 7):
            parts = [rank_indices(perm, pos, world, r, plan)[0] for r in range(world)]
            assert torch.equal(torch.cat(parts), whole) and span == 24


def test_permutation_agrees_across_ranks_and_changes_per_epoch():
    assert torch.equal(epoch_permutation(50, 3, 1), epoch_permutation(50, 3, 1))
    assert not torch.equal(epoch_permutation(50, 3, 1), epoch_permutation(50, 4, 1))


def test_world_size_change_mid_epoch_still_covers_each_sample_once():
    plan = Batching(120, 14, 7)
    seen = _walk_epoch(plan, epoch_permutation(120, 0, seed=0), [2, 2, 2, 3, 3, 1, 1, 1, 3])
    assert sorted(seen) == list(range(120))


def test_batch_plan_is_capped_for_small_data_and_ignores_world():
    assert plan_batching(50_000, 10).global_batch == 1024  # CIFAR-10: airbench94's batch
    small = plan_batching(1_297, 10)
    assert small.global_batch == 32 and 10 * small.steps_per_epoch >= MIN_STEPS * 0.95
    assert plan_batching(1_297, 10, 16, 32).global_batch == 16  # the group never exceeds the batch
    with pytest.raises(ValueError, match="multiple"):
        Batching(100, 30, 8)


# ---------------------------------------------------------------- augmentation, data, model

def test_augment_translates_and_mirrors_exactly_as_drawn():
    x = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    noise = StepNoise.draw(16, 2, torch.Generator().manual_seed(0), torch.device("cpu"))
    again = StepNoise.draw(16, 2, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert torch.equal(noise.dy, again.dy) and int(noise.dy.abs().max()) <= 2
    flip = torch.arange(16) % 2 == 0
    out = augment(x, noise, flip)
    assert out.shape == (16, 3, 32, 32) and out.dtype == torch.float32
    from eks_ddp_trainer.data import normalize
    pad = torch.nn.functional.pad(normalize(x), (2, 2, 2, 2), mode="reflect")
    for i in range(16):
        oy, ox = int(noise.dy[i]) + 2, int(noise.dx[i]) + 2
        window = pad[i, :, oy:oy + 32, ox:ox + 32]
        assert torch.allclose(out[i], window.flip(-1) if flip[i] else window)
    assert augment(x[:0], noise.part(0, 0), flip[:0]).shape == (0, 3, 32, 32)


def test_alternating_flips_mirror_each_sample_every_other_epoch():
    bits = flip_parity(1000, seed=0)
    assert 400 < int(bits.sum()) < 600 and torch.equal(bits, flip_parity(1000, seed=0))
    assert torch.equal(bits ^ True, ~bits)


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
    write_manifest(root, ALL_FILES)  # as a data stage that wrote these files would
    d2 = load_cifar(tmp_path, torch.device("cpu"))
    assert torch.equal(d2.test.images, d.test.images) and read_class_names(root) == d.classes


def test_missing_batches_name_prepare_data(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare_data"):
        load_cifar(tmp_path, torch.device("cpu"))


@pytest.mark.parametrize("name,width", [("airnet", 8), ("resnet-small", 8), ("resnet18", None), ("workshop-cnn", None)])
def test_models_take_cifar_images(name, width):
    m = build_model(name, 10, width).to(memory_format=torch.channels_last)
    out = m(torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last))
    assert out.shape == (2, 10)


def test_width_only_for_airnet_and_resnet_small():
    with pytest.raises(ValueError, match="--width"):
        build_model("resnet18", 10, 8)


def test_cpu_precision_is_fp32():
    p = precision_for(torch.device("cpu"))
    assert p.dtype is None and not p.use_scaler and p.name == "fp32"


def test_schedule_is_a_triangle():
    assert lr_factor(0.0) == pytest.approx(0.2) and lr_factor(0.23) == pytest.approx(1.0)
    assert lr_factor(1.0) == pytest.approx(0.07) and lr_factor(0.115) == pytest.approx(0.6)


def test_cli_contract_flags_parse():
    a = parse_args(["--data-dir=d", "--run-dir=r", "--epochs=2", "--global-batch-size=8", "--model=resnet-small",
                    "--keep-checkpoints=2", "--seed=3", "--lr=0.1", "--compile", "--checkpoint-every=5",
                    "--log-every=2", "--max-steps=9", "--width=16", "--bn-group=4", "--start-over"])
    assert (a.epochs, a.global_batch_size, a.model, a.keep_checkpoints, a.seed, a.lr, a.compile, a.checkpoint_every,
            a.log_every, a.max_steps, a.width, a.bn_group, a.start_over) == (2, 8, "resnet-small", 2, 3, 0.1, True, 5,
                                                                            2, 9, 16, 4, True)
    with pytest.raises(SystemExit):
        parse_args(["--data-dir=d", "--run-dir=r", "--checkpoint-every=0"])


# ---------------------------------------------------------------- BatchNorm: tests/trainer/test_model_speed.py

def test_whitening_layer_whitens_patches():
    from eks_ddp_trainer.model import AirNet

    torch.manual_seed(0)
    net = AirNet(10, 8)
    images = torch.randn(256, 3, 16, 16) @ torch.randn(16, 16) * 0.3 + 0.2  # correlated pixels
    net.init_whitening(images)
    out = torch.nn.functional.conv2d(images, net.whiten.weight)[:, :12]  # the 12 eigen-directions
    flat = out.permute(1, 0, 2, 3).reshape(12, -1).double()
    moment = flat @ flat.T / flat.shape[1]  # second moment of the 2x2 patches' projections
    off = moment - torch.diag(moment.diagonal())
    assert float(off.abs().max()) < 1e-3, "projections must be decorrelated"
    assert float(moment.diagonal().max()) <= 1.0 + 1e-6 and float(moment.diagonal().min()) > 0.5
    assert torch.equal(net.whiten.weight[12:], -net.whiten.weight[:12])


def test_learning_rate_follows_the_global_batch_only():
    """Linear scaling up to 1,024 images (Goyal et al.), square root above; the GPU count never enters."""
    from eks_ddp_trainer.recipe import RECIPES, build_optimizer, torch_lr

    base = torch_lr(11.5, 0.85, 1024)
    assert torch_lr(11.5, 0.85, 256) == pytest.approx(base)  # per example: the summed loss scales the step
    assert torch_lr(11.5, 0.85, 4096) == pytest.approx(base / 2)
    m = build_model("airnet", 10, 8)
    opt = build_optimizer(m, RECIPES["airnet"], 11.5, 256)
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["bn_bias"]["base_lr"] == pytest.approx(64 * groups["rest"]["base_lr"])
    # The same decay per step in every group: lr * weight_decay is equal.
    decays = {n: g["base_lr"] * g["weight_decay"] for n, g in groups.items()}
    assert len({round(v, 12) for v in decays.values()}) == 1, decays


@pytest.mark.parametrize("batch,group", [(7, 32), (48, 32), (16, 32)])
def test_a_global_batch_that_is_not_a_multiple_of_the_bn_group_is_a_config_error(batch, group, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--data-dir=d", "--run-dir=r", f"--global-batch-size={batch}", f"--bn-group={group}"])
    assert e.value.code == 3
    assert f"--global-batch-size: got {batch}; expected a multiple of --bn-group ({group})" in capsys.readouterr().err
    assert parse_args(["--data-dir=d", "--run-dir=r", f"--global-batch-size={batch}", f"--bn-group={batch}"])


def test_whitening_is_computed_on_a_fresh_start_only(tmp_path, monkeypatch, in_process_trainer):
    """A restart loads the whitening from its checkpoint; computing it again (the old order) cost seconds per
    restart on a CPU and a cuSOLVER start plus ~0.5 GB of temporaries on a GPU."""
    from eks_ddp_trainer import train
    from eks_ddp_trainer.data import write_synthetic_cifar
    from eks_ddp_trainer.model import AirNet

    calls = []
    real = AirNet.init_whitening
    monkeypatch.setattr(AirNet, "init_whitening", lambda self, images: calls.append(len(images)) or real(self, images))
    write_synthetic_cifar(tmp_path / "data", n_train=32, n_test=8, seed=0)
    flags = [f"--data-dir={tmp_path / 'data'}", f"--run-dir={tmp_path / 'run'}", "--global-batch-size=16",
             "--bn-group=4", "--min-steps=0", "--width=4"]
    monkeypatch.setenv("EKS_DDP_SNAPSHOT_DIR", "off")
    assert train.main([*flags, "--epochs=1"]) == 0
    assert calls == [32]
    assert train.main([*flags, "--epochs=2"]) == 0  # resumes from the epoch-1 checkpoint
    assert calls == [32]
