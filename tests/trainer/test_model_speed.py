"""The default model's speed and airbench94 fidelity: BatchNorm over the whole step at any world size, FLOPs and
CPU speed against airbench94's network, DDP's settings, --compile without a second graph and with a persistent
cache, Lookahead and precision defaults (review 2026-11-24-trainer F1/F2/F8/F10/F12/F13)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from eks_ddp_trainer import train, wrap
from eks_ddp_trainer.data import write_synthetic_cifar
from eks_ddp_trainer.lookahead import Lookahead, LookaheadConfig
from eks_ddp_trainer.model import StepBatchNorm, build_model, calibrate_bn, precision_for
from tests.support import bn_worker
from tests.support.etcd_server import ROOT, trainer_env

sys.path.insert(0, str(ROOT / "bench"))
from airbench94_net import Airbench94Net  # noqa: E402
from throughput import fwd_bwd_flops_per_image  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference() -> dict[str, torch.Tensor]:
    """One process, plain nn.BatchNorm2d over the whole batch in training mode: airbench94's semantics."""
    x_all, w_all = bn_worker.batch()
    bn = torch.nn.BatchNorm2d(bn_worker.C, eps=1e-5)
    with torch.no_grad():
        bn.bias.copy_(torch.linspace(-1, 1, bn_worker.C))
    x = x_all.clone().requires_grad_(True)
    y = bn(x)
    (y * w_all).sum().backward()
    return {"y": y.detach(), "x_grad": x.grad, "bias_grad": bn.bias.grad}


def _world(tmp_path, world: int) -> list[dict]:
    port, out = _free_port(), tmp_path / f"w{world}"
    out.mkdir()
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "bn_worker.py"), str(r), str(world), str(port),
                               str(out)], cwd=ROOT, env=trainer_env(), start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        for p in procs:
            log, _ = p.communicate(timeout=120)
            assert p.returncode == 0, log[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [torch.load(out / f"{r}.pt") for r in range(world)]


def test_step_batchnorm_in_one_process_is_plain_batchnorm_over_the_whole_batch():
    """World 1: the statistics are those of the whole batch (as airbench94's nn.BatchNorm2d), not of groups of 32."""
    torch.manual_seed(0)
    x_all, w_all = torch.randn(96, 5, 3, 3) * 3 + 2, torch.randn(96, 5, 3, 3)
    ref_bn, bn = torch.nn.BatchNorm2d(5, eps=1e-5), StepBatchNorm(5, eps=1e-5)
    outs, grads = [], []
    for m in (ref_bn, bn):
        with torch.no_grad():
            m.bias.copy_(torch.linspace(-1, 1, 5))
        x = x_all.clone().requires_grad_(True)
        y = m(x)
        (y * w_all).sum().backward()
        outs.append(y.detach())
        grads.append(x.grad)
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(grads[1], grads[0])
    # Negative control: normalising parts on their own (what ghost groups did) is another function.
    assert not torch.allclose(torch.cat([ref_bn(x_all[:32]), ref_bn(x_all[32:64]), ref_bn(x_all[64:])]), outs[0],
                              atol=1e-3)


@pytest.mark.parametrize("world", [2, pytest.param(8, marks=pytest.mark.long)])
def test_step_batchnorm_at_any_world_size_is_batchnorm_over_the_whole_step(tmp_path, world):
    """Real gloo worlds of 2 and 8 processes (at 8, two hold no sample and train on a stand-in that must not
    count): every process's outputs, input gradients (per unit of the summed loss) and the reduced bias
    gradient are those of one process normalising the whole step. Negative control: the same layer without
    the all-reduce is not."""
    ref = _reference()
    parts = _world(tmp_path, world)
    if world == 8:
        assert sum(not p["counts"] for p in parts) == 2
    for p in parts:
        if not p["counts"]:
            continue
        a, b = p["range"]
        torch.testing.assert_close(p["y"], ref["y"][a:b], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(p["x_grad"], ref["x_grad"][a:b], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(p["bias_grad"], ref["bias_grad"], atol=1e-5, rtol=1e-5)
    a, b = parts[0]["range"]
    assert not torch.allclose(parts[0]["y_local"], ref["y"][a:b], atol=1e-3)


def test_calibrated_statistics_are_the_population_statistics_of_the_calibration_images():
    """Evaluation uses statistics computed from training images after training, never stale running averages."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), StepBatchNorm(4))
    images = torch.randn(70, 3, 8, 8) * 2 + 0.5
    calibrate_bn(model, images, batch=32)  # chunks of 32, 32 and 6
    feats = model[0](images).detach()
    var, mean = torch.var_mean(feats, dim=(0, 2, 3), correction=1)
    torch.testing.assert_close(model[1].running_mean, mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model[1].running_var, var, atol=1e-5, rtol=1e-5)
    model.eval()
    torch.testing.assert_close(model(images), F.batch_norm(feats, mean, var, model[1].weight, model[1].bias,
                                                           eps=model[1].eps), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- FLOPs and speed against airbench94's network

def test_default_model_flops_per_image_are_within_5_percent_of_airbench94():
    """Forward and backward of one training step, per image (FlopCounterMode)."""
    ours = fwd_bwd_flops_per_image(build_model("airnet"))
    theirs = fwd_bwd_flops_per_image(Airbench94Net())
    assert theirs > 0
    assert ours / theirs <= 1.05, (ours, theirs)
    # Negative control: a wider network is caught.
    assert fwd_bwd_flops_per_image(build_model("airnet", width=72)) / theirs > 1.05


SPEED_FACTOR = 1.08
"""How much slower than airbench94's network the default model's CPU forward/backward may be. Both are the same
convolutions; the ghost-group BatchNorm this replaced measured 1.11-1.18x here (review F15)."""


@pytest.mark.long  # make test-long: a CPU-time ratio with an 8 % margin; beside make test's other process and its
# agents on 2 cores it measured 1.09 once (quiet, 2026-11-26), so it runs where nothing else competes for the cores
def test_default_model_step_on_cpu_is_not_slower_than_airbench94_net(monkeypatch):
    """Forward and backward at batch 64 on one thread, the two nets interleaved in this process, and the least CPU
    time of this thread over several repetitions of each compared: other processes on a loaded machine take
    wall time from both, but not this thread's CPU time."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    nets = [build_model("airnet").to(memory_format=torch.channels_last).train(),
            Airbench94Net().to(memory_format=torch.channels_last).train()]
    x = torch.randn(64, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (64,))
    best = [float("inf")] * 2
    # Bounded: 15 rounds, ~0.3 s each per net on an idle core. The least of 15 and not of 5: under a CPU hog with
    # `make test`'s second pytest process beside it, cache and scheduler noise lifted every one of 5 airnet
    # samples (ratio 1.18); the noise only adds time, so the least of more samples converges on each net's cost.
    for r in range(15):
        for i in (0, 1) if r % 2 == 0 else (1, 0):  # each net goes first in half of the rounds
            net = nets[i]
            t = time.thread_time()
            F.cross_entropy(net(x), y, reduction="sum").backward()
            best[i] = min(best[i], time.thread_time() - t)
            net.zero_grad(set_to_none=True)
    ratio = best[0] / best[1]
    print(f"[measure] airnet / airbench94 net, CPU forward+backward, batch 64: {ratio:.3f}")
    assert ratio <= SPEED_FACTOR


# ---------------------------------------------------------------- DDP settings

def test_the_trainer_builds_ddp_with_the_chosen_bucket_and_gradient_settings(tmp_path, monkeypatch):
    """A real (world-1, gloo) process group through train.main: the DDP it builds has 2 MB buckets, gradients as
    bucket views, no static graph and no buffer broadcast."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    built: list[DDP] = []
    init = DDP.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(DDP, "__init__", spy)
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "LOCAL_RANK": "0",
                 "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    torch.set_num_threads(1)
    data = tmp_path / "data"
    write_synthetic_cifar(data, n_train=32, n_test=8, seed=0)
    assert train.main([f"--data-dir={data}", f"--run-dir={tmp_path / 'run'}", "--epochs=1", "--global-batch-size=16",
                       "--bn-group=4", "--min-steps=0", "--width=4", "--max-steps=1"]) == 0
    assert len(built) == 1
    ddp = built[0]
    assert ddp.bucket_bytes_cap == int(wrap.DDP_BUCKET_CAP_MB * 1024 * 1024) == 2 * 1024 * 1024
    assert ddp.gradient_as_bucket_view is True
    assert ddp.static_graph is False
    assert ddp.forward_sync_buffers is False


def test_full_share_is_this_process_part_of_a_full_step():
    from eks_ddp_trainer.data import plan_batching

    plan = plan_batching(50_000, 10, 1024, 32, 0)
    assert [wrap.full_share(plan, 3, r) for r in range(3)] == [352, 352, 320]
    assert wrap.full_share(plan, 1, 0) == 1024
    assert [wrap.full_share(plan, 64, r) for r in (0, 31, 32, 63)] == [32, 32, 0, 0]


# ---------------------------------------------------------------- --compile

def test_compile_cache_dir_defaults_to_the_run_dir_and_keeps_a_given_one(tmp_path, monkeypatch):
    monkeypatch.setenv(wrap.CACHE_ENV, "")
    assert wrap.compile_cache_dir(tmp_path / "run") == str((tmp_path / "run" / "compile-cache").resolve())
    assert os.environ[wrap.CACHE_ENV] == str((tmp_path / "run" / "compile-cache").resolve())
    monkeypatch.setenv(wrap.CACHE_ENV, str(tmp_path / "node-cache"))
    assert wrap.compile_cache_dir(tmp_path / "run") == str(tmp_path / "node-cache")


def test_a_compiled_worker_keeps_inductor_cache_in_the_run_dir_by_default(tmp_path):
    """A real trainer process with --compile and no TORCHINDUCTOR_CACHE_DIR: after its side-thread import of
    torch._dynamo (which sets the variable to /tmp/torchinductor_<user> when unset) and the compile, the cache
    directory is <run-dir>/compile-cache. torch.compile is replaced by the identity to keep this cheap; the
    long test below compiles for real."""
    data = tmp_path / "data"
    write_synthetic_cifar(data, n_train=40, n_test=8, seed=0)
    run = tmp_path / "run"
    script = ("import os, sys, torch; torch.compile = lambda m, **kw: m; from eks_ddp_trainer import train; "
              "rc = train.main(sys.argv[1:]); import torch._dynamo; "
              "print('CACHE_DIR=' + os.environ.get('TORCHINDUCTOR_CACHE_DIR', '')); raise SystemExit(rc)")
    env = trainer_env()
    env.pop(wrap.CACHE_ENV, None)
    p = subprocess.run([sys.executable, "-c", script, *_compile_flags(data, run, "--max-steps=2")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300, start_new_session=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert f"CACHE_DIR={(run / 'compile-cache').resolve()}" in p.stdout.splitlines()


@pytest.fixture
def tiny_data(tmp_path):
    d = tmp_path / "data"
    write_synthetic_cifar(d, n_train=40, n_test=8, seed=0)
    return d


def _compile_flags(data, run, *extra: str) -> list[str]:
    # 40 images at global batch 16: steps of 16, 16 and a short last step of 8, in each of 2 epochs.
    return [f"--data-dir={data}", f"--run-dir={run}", "--epochs=2", "--global-batch-size=16", "--bn-group=4",
            "--min-steps=0", "--width=4", "--log-every=50", "--compile", *extra]


def test_compile_runs_the_short_last_step_eagerly_and_compiles_once(tiny_data, tmp_path, monkeypatch,
                                                                   in_process_trainer):
    """The cheap check (no real compile): torch.compile is called once, and the compiled module only ever sees
    this process's full-step shape; the epochs' short last steps go to the eager module."""
    calls: list[int] = []
    shapes: list[int] = []

    def fake_compile(module, **kwargs):
        calls.append(1)
        assert kwargs.get("dynamic") is False

        def compiled(x):
            shapes.append(len(x))
            return module(x)
        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setenv(wrap.CACHE_ENV, str(tmp_path / "cache"))
    assert train.main(_compile_flags(tiny_data, tmp_path / "run")) == 0
    assert calls == [1]
    assert shapes == [16, 16, 16, 16], shapes  # 2 epochs x 2 full steps; the 2 steps of 8 ran eagerly


@pytest.mark.long
def test_compile_builds_one_graph_and_the_short_last_step_does_not_recompile(tiny_data, tmp_path, monkeypatch,
                                                                          in_process_trainer):
    """Two epochs, each ending in a short step: exactly one graph is compiled (the full step); the short steps
    run the same module eagerly. (The trainer before compiled a second graph at the first short step.)"""
    from torch._dynamo.utils import counters

    monkeypatch.setenv(wrap.CACHE_ENV, str(tmp_path / "cache"))
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    assert train.main(_compile_flags(tiny_data, tmp_path / "run")) == 0
    assert counters["stats"]["unique_graphs"] - before == 1
    assert any((tmp_path / "cache").rglob("*")), "Inductor wrote its cache where the trainer pointed it"


@pytest.mark.long
def test_a_restarted_compiled_worker_reuses_the_cache_of_the_run(tiny_data, tmp_path, in_process_trainer):
    """A worker compiles and stops after 3 steps (as if killed); a fresh process (dynamo's in-memory state reset,
    as in a restart) resumes the run and loads the compiled graph from <run-dir>/compile-cache instead of
    generating it. Real processes, the cache dir left to the trainer's default."""
    run = tmp_path / "run"
    env = trainer_env()
    env.pop(wrap.CACHE_ENV, None)  # the trainer's default
    # torch._dynamo is imported only after main() has set the cache directory, as in a worker.
    script = ("import json, sys; from eks_ddp_trainer import train; rc = train.main(sys.argv[1:]); "
              "from torch._dynamo.utils import counters; "
              "print('COUNTERS ' + json.dumps({k: dict(v) for k, v in counters.items()})); raise SystemExit(rc)")
    out = []
    for extra in (["--max-steps=3"], []):
        p = subprocess.run([sys.executable, "-c", script, *_compile_flags(tiny_data, run, *extra)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
        out.append(json.loads(p.stdout.rsplit("COUNTERS ", 1)[1].splitlines()[0]))
    assert (run / "compile-cache").is_dir()
    hits = out[1].get("inductor", {}).get("fxgraph_cache_hit", 0) + out[1].get("aot_autograd", {}).get(
        "autograd_cache_hit", 0)
    assert out[0].get("inductor", {}).get("fxgraph_cache_miss", 0) > 0
    assert hits > 0, out[1]


# ---------------------------------------------------------------- Lookahead and precision defaults

def test_lookahead_does_not_reset_at_epoch_ends_by_default_but_does_at_the_end_of_training():
    """airbench94: weights := average only after the last step (F8); the per-epoch reset is opt-in."""
    model = torch.nn.Linear(2, 2)
    la = Lookahead(model, LookaheadConfig(start=0.0, every=1))
    la.after_step(1, 10)  # the average starts here
    with torch.no_grad():
        model.weight.add_(1.0)
    moved = model.weight.detach().clone()
    la.end_of_epoch()
    torch.testing.assert_close(model.weight.detach(), moved)  # kept the epoch's last updates
    la.after_step(10, 10)
    torch.testing.assert_close(model.weight.detach(), la.average[0])  # the end of training: the average
    assert not torch.allclose(model.weight.detach(), moved)
    opt_in = Lookahead(model, LookaheadConfig(start=0.0, every=1, reset_each_epoch=True))
    opt_in.after_step(1, 10)
    with torch.no_grad():
        model.weight.add_(1.0)
    opt_in.end_of_epoch()
    torch.testing.assert_close(model.weight.detach(), opt_in.average[0])


def test_gpu_precision_defaults_to_fp16_as_airbench_and_bf16_is_opt_in(monkeypatch):
    """F10: on a bf16-capable GPU (an A100 here by mock) the default is still fp16, without loss scaling (as
    airbench: no skipped steps, no per-step host read of the overflow flag)."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    cuda = torch.device("cuda", 0)
    p = precision_for(cuda)
    assert (p.dtype, p.use_scaler, p.name) == (torch.float16, False, "fp16")
    assert precision_for(cuda, "bf16").dtype == torch.bfloat16
    assert precision_for(cuda, "fp32").dtype is None
    assert precision_for(torch.device("cpu"), "fp16").dtype is None  # a CPU trains in fp32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(ValueError, match=r"--precision=bf16: Tesla T4 has no bf16; use fp16"):
        precision_for(cuda, "bf16")
    with pytest.raises(ValueError, match=r"--precision: got 'fp8'; expected one of fp16, bf16, fp32"):
        precision_for(cuda, "fp8")
