"""The trainer is right on a GPU by construction, proved on CPU where possible (review 2026-11-24, F4, F6, F9):
durable checkpoints wait for their device-to-host copies, a steady-state step makes no host sync, and the
fp16 loss scaler starts without skipping steps. The CUDA variants run only where a GPU is."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from eks_ddp_runtime.dist import DistEnv
from eks_ddp_trainer import checkpoint as ckpt
from eks_ddp_trainer import snapshot, train
from eks_ddp_trainer.data import write_synthetic_cifar
from eks_ddp_trainer.evaluate import MODEL_FILE

pytestmark = pytest.mark.usefixtures("in_process_trainer")
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    write_synthetic_cifar(d, n_train=100, n_test=40, seed=0)
    return d


def _args(data_dir, run, *extra: str):
    # 100 images at a global batch of 16: 7 steps per epoch, 21 in all; Lookahead from step 10.
    return train.parse_args([f"--data-dir={data_dir}", f"--run-dir={run}", "--epochs=3", "--global-batch-size=16",
                             "--bn-group=4", "--min-steps=0", "--width=4", *extra])


def _env(device: str = "cpu") -> DistEnv:
    return DistEnv(0, 0, 1, torch.device(device), "nccl" if device == "cuda" else "gloo", 0)


# ---------------------------------------------------------------- F4: durable checkpoints wait for their copies

class _AsyncCopies:
    """CUDA's non-blocking device-to-host copy, faked on CPU: the destination holds zeros until an event
    recorded after the copy is synchronised; only then do the values land (as with cudaMemcpyAsync)."""

    def __init__(self) -> None:
        self.queued: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.real_to_cpu = snapshot.to_cpu

    def to_cpu(self, obj, into=None):
        landed = self.real_to_cpu(obj)
        out = self.real_to_cpu(obj)
        for dst, src in zip(snapshot._tensors(out), snapshot._tensors(landed), strict=True):
            if dst.is_floating_point():
                dst.zero_()
                self.queued.append((dst, src))
        return out

    def event(self, enable_timing: bool = False):
        copies = self

        class Event:
            def record(self, stream=None) -> None:
                self.batch, copies.queued = copies.queued, []

            def synchronize(self) -> None:
                for dst, src in self.batch:
                    dst.copy_(src)

            def elapsed_time(self, other) -> float:
                return 0.0

        return Event()


def test_durable_checkpoint_is_written_after_its_device_to_host_copies_land(data_dir, tmp_path, monkeypatch):
    fake = _AsyncCopies()
    monkeypatch.setenv(snapshot.DIR_ENV, "off")
    monkeypatch.setattr(snapshot, "to_cpu", fake.to_cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", fake.event)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)  # the copies' destinations, as on a GPU
    monkeypatch.setattr(train, "_rng_state", lambda: {"torch": torch.get_rng_state(), "python": train.random.getstate()})
    run = tmp_path / "run"
    train.train(_args(data_dir, run, "--max-steps=9", "--checkpoint-every=4"), _env())
    final = ckpt.load_latest(run)[0]
    assert final["step"] == 9
    trained = torch.load(run / MODEL_FILE, weights_only=True)["model"]
    params = [k for k in trained if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert params
    for k in params:
        assert torch.equal(final["model"][k], trained[k]), f"{k}: the checkpoint holds what was there before the copy"


@cuda_only
def test_durable_copy_on_a_gpu_holds_the_values_of_the_step(tmp_path):
    """A busy stream delays the copies: the HostCopy's wait still returns the values the step left."""
    x = torch.randn(4_000_000, device="cuda")
    torch.cuda._sleep(int(5e8))  # ~0.3 s of GPU work queued ahead of the copy
    copy = snapshot.HostCopy({"w": x})
    copy.wait()
    assert torch.equal(copy.state["w"], x.cpu())


# ---------------------------------------------------------------- F6: no host sync in a steady-state step

SYNCING = {"tensor", "as_tensor", "from_numpy", "item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__",
           "__int__", "__index__"}
"""Calls that wait for the device, or (torch.tensor and friends) copy host data to it, each a stream sync on CUDA."""


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if self.on and name in SYNCING:
            import traceback

            where = [f for f in traceback.extract_stack()[:-1] if "/training/" in f.filename]
            self.seen.append(f"{name} at {where[-1].filename.rsplit('/', 2)[-1]}:{where[-1].lineno}" if where else name)
        return func(*args, **(kwargs or {}))


def _steady_window(monkeypatch, on, off, first: int = 10, last: int = 13) -> None:
    """Call ``on()`` as step ``first`` (0-based) sets its LR and ``off()`` as step ``last`` does: in between
    lie whole regular steps (Lookahead running, snapshots taken, no check, log line or checkpoint due)."""
    from eks_ddp_trainer import data

    monkeypatch.setattr(train, "rank_indices", data.rank_indices)  # the trainer's own, not a test's logger
    real = train.lr_factor

    def hooked(progress: float) -> float:
        step = round(progress * 21)
        if step == first:
            on()
        elif step == last:
            off()
        return real(progress)

    monkeypatch.setattr(train, "lr_factor", hooked)


_QUIET = ("--check-every=1000", "--log-every=1000", "--checkpoint-every=1000")


def test_a_steady_state_step_makes_no_host_sync(data_dir, tmp_path, monkeypatch):
    rec = _Recorder()
    _steady_window(monkeypatch, lambda: setattr(rec, "on", True), lambda: setattr(rec, "on", False))
    with rec:
        train.train(_args(data_dir, tmp_path / "run", *_QUIET), _env())
    assert not rec.on, "the window closed: the steps ran"
    assert rec.seen == [], f"host syncs in a regular step: {rec.seen}"


def test_the_sync_recorder_sees_a_sync_in_the_step(data_dir, tmp_path, monkeypatch):
    """Negative control: a step that reads its loss on the host is caught."""
    rec = _Recorder()
    _steady_window(monkeypatch, lambda: setattr(rec, "on", True), lambda: setattr(rec, "on", False))
    real = train.augment
    monkeypatch.setattr(train, "augment", lambda x, *a: real(x, *a) * (1 + 0 * x.float().sum().item()))
    with rec:
        train.train(_args(data_dir, tmp_path / "run", *_QUIET), _env())
    assert any(s.startswith("item") for s in rec.seen), rec.seen


@cuda_only
def test_a_steady_state_step_on_a_gpu_passes_sync_debug_error_mode(data_dir, tmp_path, monkeypatch):
    _steady_window(monkeypatch, lambda: torch.cuda.set_sync_debug_mode("error"),
                   lambda: torch.cuda.set_sync_debug_mode("default"))
    try:
        train.train(_args(data_dir, tmp_path / "run", *_QUIET), _env("cuda"))
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------- F9: fp16 loss scaling skips no step at start

FP16_MAX = 65504.0


def test_fp16_scaler_start_leaves_the_first_step_finite_at_the_default_global_batch(tmp_path):
    """The largest gradient at initialisation of the default model, with the trainer's summed loss over the
    default global batch (as 256 images x world 4, each rank's loss times the world as the trainer does), times
    the scaler's first scale. (The loss itself stays in fp32: only the gradients flow through fp16.)"""
    from torch import nn

    from eks_ddp_trainer.config import DEFAULT_MODEL
    from eks_ddp_trainer.data import DEFAULT_GLOBAL_BATCH, StepNoise, augment, load_cifar
    from eks_ddp_trainer.model import build_model
    from eks_ddp_trainer.recipe import FP16_INIT_SCALE

    torch.manual_seed(0)
    write_synthetic_cifar(tmp_path, n_train=256, n_test=10, seed=0)
    data = load_cifar(tmp_path, torch.device("cpu"))
    model = build_model(DEFAULT_MODEL, len(data.classes))
    model.init_whitening(train.normalize(data.train.images))
    g = torch.Generator().manual_seed(0)
    x = augment(data.train.images, StepNoise.draw(256, 2, g, torch.device("cpu")), torch.zeros(256, dtype=torch.bool))
    world = DEFAULT_GLOBAL_BATCH // 256
    loss = nn.CrossEntropyLoss(label_smoothing=0.2, reduction="sum")(model(x), data.train.labels) * world
    loss.backward()
    top = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    assert 1.0 < top < 1e3, top  # the review measured 19.1 on its set
    assert top * FP16_INIT_SCALE < FP16_MAX / 8, (top, FP16_INIT_SCALE)
    # Negative control: torch's default first scale overflows fp16 on the same step.
    assert top * torch.amp.GradScaler("cpu").get_scale() > FP16_MAX


def test_trainer_builds_its_scaler_with_the_fp16_start_scale(data_dir, tmp_path, monkeypatch):
    from eks_ddp_trainer.model import Precision
    from eks_ddp_trainer.recipe import FP16_INIT_SCALE

    made: list[float] = []
    real = torch.amp.GradScaler

    def spy(*a, **k):
        s = real(*a, **k)
        made.append(s._init_scale)
        return s

    monkeypatch.setattr(torch.amp, "GradScaler", spy)
    monkeypatch.setattr(train, "precision_for", lambda dev, *_: Precision(None, True))  # the T4 path's scaler, fp32 math
    train.train(_args(data_dir, tmp_path / "run", "--max-steps=3"), _env())
    assert made == [FP16_INIT_SCALE]
    assert ckpt.load_latest(Path(tmp_path / "run"))[0]["scaler"]["scale"] == FP16_INIT_SCALE, "no step was skipped"
