"""Training speed of the default model (airnet) side by side with airbench94's own network, and FLOPs per image.

    .venv/bin/python bench/throughput.py [--batch 256] [--steps 6] [--compiled] [--dtype fp32 ...] [--out FILE]

The function for other scripts (bench/gpu_check.py holds the trainer against airbench94's training loop instead,
bench/airbench94_loop.py)::

    from throughput import compare          # with bench/ on sys.path, or: from bench.throughput import compare
    compare(device, dtype, compiled, batch, steps) -> dict

``compare`` times one training step of each network in the same process, alternating the two (blocks of
``steps`` steps, ``rounds`` times) so that load changes and GPU clock changes hit both alike:
``device`` a torch.device or "cuda"/"cpu"; ``dtype`` "fp16", "bf16" or "fp32" (autocast; fp32 on a CPU);
``compiled`` torch.compile both (default mode, static shapes; the compile is in the warm-up, not timed);
``batch`` images per step (1,024 is the trainer's default global batch); ``steps`` timed steps per block.
The step is the trainer's model step: channels_last input, autocast forward, summed label-smoothed
cross-entropy, backward, SGD Nesterov (no GradScaler, no data pipeline: the same for both nets). It
returns ``{"device", "dtype", "compiled", "batch", "steps", "clock", "airnet": {"img_s", "step_ms"},
"airbench94": {...}, "ratio": airnet img/s / airbench94 img/s}`` (ratio >= 0.9 is the goal on a GPU).
On a GPU the clock is wall time around synchronised blocks; on a CPU it is this thread's CPU time with
torch on one thread (other processes on a shared machine take wall time from both nets, not CPU time),
so CPU images/s are per core.

The script also writes, in one run on CIFAR-sized synthetic data (3x32x32, 10 classes):

* FLOPs per image (torch.utils.flop_counter.FlopCounterMode; forward, and forward+backward of a training
  step) of every trainer model and of airbench94's network (bench/airbench94_net.py);
* ``compare`` for every ``--dtype`` asked (eager, and compiled with ``--compiled``): images/s and seconds
  per 10 epochs of 50,000 images;
* the real trainer (``python -m eks_ddp_trainer.train``, default model, one process): images/s from its log,
  which adds augmentation, the divergence checks, snapshots and logging to the bare step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from airbench94_net import Airbench94Net  # noqa: E402
from common import machine, run_trainer, synthetic  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from eks_ddp_trainer.model import MODELS, build_model  # noqa: E402

EPOCH_IMAGES = 50_000
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}


def flops_per_image(model: torch.nn.Module) -> float:
    """Forward FLOPs of one image (evaluation mode)."""
    model.eval()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    return fc.get_total_flops()


def fwd_bwd_flops_per_image(model: torch.nn.Module, batch: int = 2) -> float:
    """Forward + backward FLOPs per image of a training step (training mode; BatchNorm needs a batch > 1)."""
    model.train()
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(model(torch.randn(batch, 3, 32, 32)), torch.zeros(batch, dtype=torch.long)).backward()
    model.zero_grad(set_to_none=True)
    return fc.get_total_flops() / batch


def _step(model: torch.nn.Module, batch: int, dev: torch.device, dtype: torch.dtype | None, compiled: bool):
    model.to(dev, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4, momentum=0.85, nesterov=True)
    fwd = torch.compile(model, dynamic=False) if compiled else model
    x = torch.randn(batch, 3, 32, 32, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=dev)
    use_amp = dtype is not None and dev.type == "cuda"

    def step() -> None:
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=use_amp):
            loss = F.cross_entropy(fwd(x).float(), y, label_smoothing=0.2, reduction="sum")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def compare(device: torch.device | str, dtype: str, compiled: bool, batch: int = 1024, steps: int = 20, *,
            rounds: int = 5, warmup: int = 3) -> dict:
    """Images/s of airnet and of airbench94's network, same step, same process, interleaved (see the module doc)."""
    dev = torch.device(device)
    if dtype not in DTYPES:
        raise ValueError(f"dtype: got {dtype!r}; expected one of {', '.join(DTYPES)}")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    cpu = dev.type != "cuda"
    clock = time.thread_time if cpu else time.perf_counter
    if cpu:
        torch.set_num_threads(1)
    try:
        return _compare(dev, dtype, compiled, batch, steps, rounds, warmup, clock)
    finally:
        torch.set_num_threads(threads)


def _compare(dev: torch.device, dtype: str, compiled: bool, batch: int, steps: int, rounds: int, warmup: int,
             clock) -> dict:
    nets = {"airnet": build_model("airnet"), "airbench94": Airbench94Net()}
    steps_of = {name: _step(m, batch, dev, DTYPES[dtype], compiled) for name, m in nets.items()}
    for step in steps_of.values():  # compile (when asked), allocator, cuDNN autotuning
        for _ in range(warmup):
            step()
    _sync(dev)
    per_step: dict[str, list[float]] = {name: [] for name in nets}
    for _ in range(rounds):
        for name, step in steps_of.items():
            _sync(dev)
            t = clock()
            for _ in range(steps):
                step()
            _sync(dev)
            per_step[name].append((clock() - t) / steps)
    out: dict = {"device": str(dev), "dtype": dtype if dev.type == "cuda" else "fp32", "compiled": compiled,
                 "batch": batch, "steps": steps, "rounds": rounds,
                 "clock": "wall, synchronised" if dev.type == "cuda" else "thread CPU time, 1 thread"}
    for name, ts in per_step.items():
        s = statistics.median(ts) if dev.type == "cuda" else min(ts)
        out[name] = {"img_s": round(batch / s, 1), "step_ms": round(1000 * s, 3),
                     "seconds_per_10_epochs": round(10 * EPOCH_IMAGES * s / batch, 2)}
    out["ratio"] = round(out["airnet"]["img_s"] / out["airbench94"]["img_s"], 3)
    return out


def trainer_img_s(tmp: Path, threads: int, batch: int, steps: int) -> dict:
    data = synthetic(tmp / "data", n_train=4096)
    run = tmp / "run"
    args = [f"--data-dir={data}", f"--run-dir={run}", "--epochs=100", f"--global-batch-size={batch}",
            "--min-steps=0", f"--max-steps={steps}", "--log-every=2", "--checkpoint-every=100000"]
    hist = run_trainer([sys.executable], args, threads, timeout_s=1800)
    windows = [r["img_s"] for r in hist if r.get("kind") == "step"][1:]
    return {"img_s_median": round(statistics.median(windows), 1), "img_s_windows": [round(w, 1) for w in windows],
            "global_batch": batch, "steps": steps, "threads": threads}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=2, help="timed steps per block")
    p.add_argument("--rounds", type=int, default=4, help="interleaved blocks per net")
    p.add_argument("--dtype", nargs="+", default=None, choices=list(DTYPES),
                   help="default: fp16 and bf16 on a GPU, fp32 on a CPU")
    p.add_argument("--compiled", action="store_true", help="also compare both nets compiled")
    p.add_argument("--trainer-steps", type=int, default=8, help="0: skip the real trainer")
    p.add_argument("--out", default=str(Path(__file__).with_name("throughput.json")))
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res: dict = {"machine": machine(), "device": str(dev), "batch": a.batch}
    torch.manual_seed(0)
    flops = {name: flops_per_image(build_model(name)) for name in MODELS}
    flops["airbench94 net"] = flops_per_image(Airbench94Net())
    res["gflops_per_image_forward"] = {k: round(v / 1e9, 4) for k, v in flops.items()}
    res["airnet_flops_vs_airbench94"] = round(flops["airnet"] / flops["airbench94 net"], 3)
    fb = {"airnet": fwd_bwd_flops_per_image(build_model("airnet")), "airbench94 net": fwd_bwd_flops_per_image(
        Airbench94Net())}
    res["gflops_per_image_train_step"] = {k: round(v / 1e9, 4) for k, v in fb.items()}
    print(json.dumps(res, indent=2), flush=True)
    dtypes = a.dtype or (["fp16", "bf16"] if dev.type == "cuda" else ["fp32"])
    res["compare"] = []
    for compiled in ([False, True] if a.compiled else [False]):
        for dtype in dtypes:
            r = compare(dev, dtype, compiled, a.batch, a.steps, rounds=a.rounds)
            r["load_avg_1m"] = round(os.getloadavg()[0], 2)
            print(json.dumps(r), flush=True)
            res["compare"].append(r)
    if a.trainer_steps:
        tmp = Path(tempfile.mkdtemp(prefix="bench-tp-"))
        try:
            res["trainer_default_model_1proc"] = trainer_img_s(tmp, os.cpu_count() or 1, a.batch, a.trainer_steps)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    res["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    if dev.type != "cuda":
        res["gpu"] = "not measured: no GPU available"
    print(json.dumps(res, indent=2))
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
