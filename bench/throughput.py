"""Training speed of the default model (airnet) side by side with airbench94's own network, and FLOPs per image.

    .venv/bin/python bench/throughput.py [--batch 256] [--steps 6] [--out bench/throughput.json]

In one run, on CIFAR-sized synthetic data (3x32x32, 10 classes):

* FLOPs per image (forward, torch.utils.flop_counter.FlopCounterMode) of every trainer model and of
  airbench94's network (bench/airbench94_net.py);
* a bare training step (forward, backward, SGD Nesterov; channels_last; bf16 autocast on a GPU,
  fp32 on a CPU) of airnet and of airbench94's network with the same batch, alternating the two so
  that load changes on a shared machine hit both: images/s and seconds per 10 epochs of 50,000 images;
* the real trainer (``python -m training.train``, default model, one process): images/s from its log,
  which adds augmentation, BatchNorm groups, the divergence checks and logging to the bare step.

The first ``--warmup`` steps (allocator, one-time set-up) are left out of every figure.
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
from airbench94_net import Airbench94Net
from common import machine, run_trainer, synthetic
from torch.utils.flop_counter import FlopCounterMode

from training.model import MODELS, build_model

EPOCH_IMAGES = 50_000


def flops_per_image(model: torch.nn.Module) -> float:
    model.eval()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    return fc.get_total_flops()


def step_timer(model: torch.nn.Module, batch: int, dev: torch.device):
    model.to(dev, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3, momentum=0.85, nesterov=True)
    x = torch.randn(batch, 3, 32, 32, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=dev)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)

    def step() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with amp:
            loss = F.cross_entropy(model(x).float(), y, label_smoothing=0.2, reduction="sum")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    return step


def side_by_side(batch: int, steps: int, warmup: int, dev: torch.device) -> dict:
    nets = {"airnet (default)": build_model("airnet", bn_group=32), "airbench94 net": Airbench94Net()}
    timers = {name: step_timer(m, batch, dev) for name, m in nets.items()}
    times: dict[str, list[float]] = {name: [] for name in nets}
    for i in range(warmup + steps):
        for name, step in timers.items():  # alternate, so load changes hit both
            t = step()
            if i >= warmup:
                times[name].append(t)
    out = {}
    for name, ts in times.items():
        img_s = batch / statistics.median(ts)
        out[name] = {"img_s": round(img_s, 1), "seconds_per_10_epochs": round(10 * EPOCH_IMAGES / img_s, 1),
                     "step_s_median": round(statistics.median(ts), 4), "steps_timed": len(ts)}
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
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--trainer-steps", type=int, default=8)
    p.add_argument("--out", default=str(Path(__file__).with_name("throughput.json")))
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res: dict = {"machine": machine(), "device": str(dev), "batch": a.batch}
    torch.manual_seed(0)
    flops = {name: flops_per_image(build_model(name)) for name in MODELS}
    flops["airbench94 net"] = flops_per_image(Airbench94Net())
    res["gflops_per_image_forward"] = {k: round(v / 1e9, 4) for k, v in flops.items()}
    res["airnet_flops_vs_airbench94"] = round(flops["airnet"] / flops["airbench94 net"], 3)
    print(json.dumps(res, indent=2), flush=True)
    res["bare_step"] = side_by_side(a.batch, a.steps, a.warmup, dev)
    print(json.dumps(res["bare_step"], indent=2), flush=True)
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
