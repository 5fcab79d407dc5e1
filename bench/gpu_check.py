"""One-command GPU acceptance: ``make gpu-check`` (``python bench/gpu_check.py [--out gpu-check-out]``).

On any Linux machine with one NVIDIA GPU (two are used when present) and this repository, with NO network, in at
most about 10 minutes; writes ``gpu-check.json`` and ``gpu-check.md`` to ``--out``:

(a) recovery: the real launcher (``python -m eks_ddp_runtime.launch`` with the cluster's flags from
    components/torchrun.py, one agent per GPU, up to two), a real etcd, training on CUDA; one worker is SIGKILLed
    and training resumes: seconds from the kill to the next step, and steps redone;
(b) images/s of the default model (airnet) vs airbench94's network (bench/airbench94_net.py) in the same run,
    eager and compiled, bf16 and fp16 autocast (a bare step: forward, backward, SGD);
(c) seconds for 10 epochs of 50,000 CIFAR-shaped synthetic images with the trainer's defaults (one process);
(d) ``torch.cuda.set_sync_debug_mode("error")`` around steady-state steps of the real trainer raises nothing
    (bench/sync_probe.py runs training.train with the mode on for a window of steps in mid-epoch);
(e) the trainer's images/s with node-local snapshots on vs off.

Without a GPU it runs (a) on CPU (gloo, a tiny model) and marks the others "needs a GPU".

What the GPU machines lack (python-etcd and its dependencies, the etcd binary) comes from ``.gpu-bundle/``, which
``make gpu-check-bundle`` fills beforehand on a machine with this project's venv (bench/gpu_bundle.py); nothing is
downloaded here. The check runs on the torch it finds: torch 2.11 to 2.14 (the project pins 2.14.1); outside that
it stops at once and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / ".gpu-bundle"
SUPPORTED_TORCH = ((2, 11), (2, 14))
"""Oldest and newest torch (major, minor) the check and the launcher's private-API use are known to fit."""
NEEDS_GPU = "needs a GPU"
EPOCH_IMAGES = 50_000


def torch_version_problem(version: str) -> str | None:
    """Why this torch is unsupported, or None."""
    try:
        major, minor = (int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        return f"torch {version}: cannot read the version; supported: {_supported()}"
    if not SUPPORTED_TORCH[0] <= (major, minor) <= SUPPORTED_TORCH[1]:
        return f"torch {version} is not supported by the GPU check; supported: {_supported()}"
    return None


def _supported() -> str:
    (a, b), (c, d) = SUPPORTED_TORCH
    return f"{a}.{b} to {c}.{d}"


def prepare_environment(bundle: Path) -> dict[str, str]:
    """The environment of every process the check starts: this checkout and the bundle on the import path, the
    bundle's etcd on PATH. Also applied to this process (the etcd helpers import python-etcd)."""
    paths = [str(ROOT)]
    if (bundle / "site").is_dir():
        paths.append(str(bundle / "site"))
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if (bundle / "bin" / "etcd").exists():
        env["PATH"] = f"{bundle / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        os.environ["PATH"] = env["PATH"]
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _history(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "history.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def _wait(pred: Callable[[], Any], timeout_s: float, what: str, procs: list[subprocess.Popen]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if procs and all(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    raise RuntimeError(f"timed out or agents ended waiting for {what}")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        for pid in [p.pid, *_children(p.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def item_a(tmp: Path, env: dict[str, str], gpus: int) -> dict[str, Any]:
    """The real launcher, cluster flags, real etcd; SIGKILL one worker; recovery seconds and steps redone."""
    from components.torchrun import AGENT_ENV, CLUSTER_TIMEOUTS, AgentOptions, RdzvTls, TrainerOptions, job_command
    from training.data import write_synthetic_cifar
    from training.etcd_local import start_etcd

    on_gpu = gpus > 0
    agents = min(gpus, 2) if on_gpu else 1
    n_train = 20_000 if on_gpu else 480
    write_synthetic_cifar(tmp / "data-a", n_train=n_train, n_test=500, seed=0)
    trainer = (TrainerOptions(data_dir=str(tmp / "data-a"), run_dir=str(tmp / "run-a"), epochs=50, log_every=1,
                              checkpoint_every=50, min_steps=0) if on_gpu else
               TrainerOptions(data_dir=str(tmp / "data-a"), run_dir=str(tmp / "run-a"), epochs=50,
                              global_batch_size=16, bn_group=8, min_steps=0, width=8, log_every=1,
                              checkpoint_every=5))
    procs: list[subprocess.Popen] = []
    with start_etcd(tmp / "etcd") as endpoint:
        opts = AgentOptions(min_nodes=1, max_nodes=agents, nproc_per_node=1, rdzv_backend="etcd-v2",
                            rdzv_endpoint=endpoint, rdzv_id=f"gpu-check-{os.getpid()}", local_addr="127.0.0.1",
                            timeouts=CLUSTER_TIMEOUTS, tls=RdzvTls.of(endpoint.tls))
        cmd = job_command(opts, trainer, python=sys.executable)
        try:
            for i in range(agents):
                e = {**env, **AGENT_ENV, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "2")}
                e["CUDA_VISIBLE_DEVICES"] = str(i) if on_gpu else ""
                with open(tmp / f"agent{i}.log", "wb") as log:
                    procs.append(subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True))
            run = Path(trainer.run_dir)

            def steps() -> list[dict[str, Any]]:
                return [r for r in _history(run) if r.get("kind") == "step"]

            _wait(lambda: len(steps()) >= 8, 300, "8 training steps", procs)
            victim = _wait(lambda: _children(procs[-1].pid), 30, "a worker", procs)[0]
            last = steps()[-1]["step"]
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            start = _wait(lambda: [r for r in _history(run) if r.get("kind") == "start" and r["time"] > killed],
                          300, "a restarted worker group", procs)[0]
            nxt = _wait(lambda: [r for r in steps() if r["time"] > start["time"]], 300, "a step after the restart",
                        procs)[0]
            fork = any("workers are forked" in (tmp / f"agent{i}.log").read_text(errors="replace")
                       for i in range(agents))
            return {"status": "ok", "device": "cuda" if on_gpu else "cpu (gloo)", "agents": agents,
                    "recovery_s": round(nxt["time"] - killed, 2), "kill_to_start_s": round(start["time"] - killed, 2),
                    "steps_redone": max(0, last - start["resumed_step"]), "resumed_step": start["resumed_step"],
                    "workers": "forked from the agent" if fork else "fresh processes"}
        finally:
            _stop(procs)


def _bare_step(model: Any, batch: int, dtype: Any, compiled: bool) -> Callable[[], float]:
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    model = model.to(dev, memory_format=torch.channels_last).train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3, momentum=0.85, nesterov=True)
    fwd = torch.compile(model) if compiled else model
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    x = torch.randn(batch, 3, 32, 32, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step() -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=dtype):
            loss = F.cross_entropy(fwd(x).float(), y, label_smoothing=0.2, reduction="sum")
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    return step


def item_b(batch: int = 1024, steps: int = 20, warmup: int = 5) -> dict[str, Any]:
    """Bare-step images/s, airnet vs airbench94's network, eager/compiled x bf16/fp16, alternating in one run."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from airbench94_net import Airbench94Net

    from training.model import build_model

    rows = []
    for compiled in (False, True):
        for dtype in (torch.bfloat16, torch.float16):
            timers = {"airnet (default)": _bare_step(build_model("airnet"), batch, dtype, compiled),
                      "airbench94 net": _bare_step(Airbench94Net(), batch, dtype, compiled)}
            times: dict[str, list[float]] = {k: [] for k in timers}
            for i in range(warmup + steps):
                for name, step in timers.items():
                    t = step()
                    if i >= warmup:
                        times[name].append(t)
            img = {k: batch / statistics.median(v) for k, v in times.items()}
            rows.append({"mode": "compiled" if compiled else "eager", "dtype": str(dtype).removeprefix("torch."),
                         "airnet_img_s": round(img["airnet (default)"]), "airbench94_img_s": round(img["airbench94 net"]),
                         "ratio": round(img["airnet (default)"] / img["airbench94 net"], 3)})
    return {"status": "ok", "global_batch": batch, "steps_timed": steps, "rows": rows}


def _trainer_run(tmp: Path, env: dict[str, str], name: str, args: list[str], extra_env: dict[str, str] | None = None,
                 module: str = "training.train", timeout_s: float = 300) -> tuple[subprocess.CompletedProcess, Path, float]:
    run = tmp / f"run-{name}"
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, f"--run-dir={run}", *args], cwd=ROOT,
                          env={**env, **(extra_env or {})}, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    return proc, run, time.monotonic() - t


def _data_50k(tmp: Path) -> Path:
    from training.data import write_synthetic_cifar

    d = tmp / "data-50k"
    if not (d / "cifar-10-batches-py" / "test_batch").exists():
        write_synthetic_cifar(d, n_train=EPOCH_IMAGES, n_test=1000, seed=0)
    return d


def item_c(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """10 epochs of 50,000 synthetic CIFAR-shaped images, the trainer's defaults, one process on one GPU."""
    proc, run, wall = _trainer_run(tmp, env, "c", [f"--data-dir={_data_50k(tmp)}", "--epochs=10"], timeout_s=400)
    if proc.returncode != 0:
        return {"status": "failed", "exit_code": proc.returncode, "tail": (proc.stdout + proc.stderr)[-1500:]}
    hist = _history(run)
    start = next(r["time"] for r in hist if r.get("kind") == "start")
    last = [r for r in hist if r.get("kind") == "step"][-1]
    return {"status": "ok", "process_wall_s": round(wall, 1), "start_to_last_step_s": round(last["time"] - start, 1),
            "steps": last["step"]}


def item_d(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """set_sync_debug_mode("error") around steady-state steps of the real trainer (bench/sync_probe.py)."""
    args = [f"--data-dir={_data_50k(tmp)}", "--epochs=2", "--max-steps=60", "--log-every=1000", "--check-every=1000",
            "--checkpoint-every=1000"]
    proc, _, _ = _trainer_run(tmp, env, "d", args, {"EKS_DDP_SYNC_WINDOW": "52:56"}, module="bench.sync_probe")
    out = proc.stdout + proc.stderr
    ok = proc.returncode == 0 and "sync window clean" in out
    return {"status": "ok" if ok else "failed", "window_steps": "52-56 (epoch 2, no log/check/checkpoint step)",
            "exit_code": proc.returncode, **({} if ok else {"tail": out[-2000:]})}


def item_e(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """Trainer images/s with node-local snapshots on vs off (median of its logged windows after the first)."""
    out = {}
    for mode in ("on", "off"):
        args = [f"--data-dir={_data_50k(tmp)}", "--epochs=1", "--max-steps=45", "--log-every=5"]
        extra = {"EKS_DDP_SNAPSHOT_DIR": "off"} if mode == "off" else {"EKS_DDP_SNAPSHOT_DIR": str(tmp / "shm")}
        proc, run, _ = _trainer_run(tmp, env, f"e-{mode}", args, extra)
        if proc.returncode != 0:
            return {"status": "failed", "mode": mode, "tail": (proc.stdout + proc.stderr)[-1500:]}
        windows = [r["img_s"] for r in _history(run) if r.get("kind") == "step"][1:]
        out[mode] = round(statistics.median(windows))
    return {"status": "ok", "img_s_snapshots_on": out["on"], "img_s_snapshots_off": out["off"],
            "overhead_pct": round(100 * (out["off"] - out["on"]) / out["off"], 1)}


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"# GPU check ({m['gpu'] or 'no GPU'}; torch {m['torch']}; Python {m['python']})", "",
             "| item | status | figures |", "|---|---|---|"]
    for key, title in ITEMS.items():
        r = report["items"].get(key, {})
        figures = "; ".join(f"{k}={v}" for k, v in r.items() if k not in ("status", "rows", "tail"))
        lines.append(f"| ({key}) {title} | {r.get('status', 'not run')} | {figures} |")
    rows = report["items"].get("b", {}).get("rows")
    if rows:
        lines += ["", "| mode | dtype | airnet img/s | airbench94 img/s | ratio |", "|---|---|---|---|---|"]
        lines += [f"| {r['mode']} | {r['dtype']} | {r['airnet_img_s']} | {r['airbench94_img_s']} | {r['ratio']} |"
                  for r in rows]
    return "\n".join(lines) + "\n"


ITEMS = {"a": "launcher + etcd, worker SIGKILL, recovery", "b": "images/s airnet vs airbench94 (eager/compiled, bf16/fp16)",
         "c": "10 epochs x 50,000 images, default recipe", "d": "sync debug mode 'error' around steady steps",
         "e": "snapshot overhead on vs off"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "gpu-check-out", help="folder for gpu-check.json/.md")
    p.add_argument("--bundle", type=Path, default=BUNDLE, help="python-etcd and etcd for offline machines")
    p.add_argument("--items", default="abcde", help="which items to run (default: all)")
    a = p.parse_args(argv)
    if bad := sorted(set(a.items) - set(ITEMS)):
        print(f"gpu-check: --items: got {bad[0]!r}; expected letters of 'abcde'", file=sys.stderr)
        return 2
    env = prepare_environment(a.bundle)
    import torch

    if problem := torch_version_problem(torch.__version__):
        print(f"gpu-check: {problem}", file=sys.stderr)
        return 2
    try:
        import etcd  # noqa: F401  (python-etcd, the rendezvous client the agents need)

        from training.etcd_local import find_etcd
        find_etcd()
    except (ImportError, FileNotFoundError) as e:
        print(f"gpu-check: {e}; run `make gpu-check-bundle` on a machine with the project's venv and copy "
              f"{BUNDLE.name}/ here", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    report: dict[str, Any] = {"machine": {"gpu": torch.cuda.get_device_name(0) if gpus else None, "gpus": gpus,
                                          "torch": torch.__version__, "cuda": torch.version.cuda,
                                          "python": platform.python_version(), "cores": os.cpu_count(),
                                          "load_avg_1m_at_start": round(os.getloadavg()[0], 2)},
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "items": {}}
    runners: dict[str, Callable[[Path], dict[str, Any]]] = {
        "a": lambda tmp: item_a(tmp, env, gpus), "b": lambda tmp: item_b(),
        "c": lambda tmp: item_c(tmp, env), "d": lambda tmp: item_d(tmp, env), "e": lambda tmp: item_e(tmp, env)}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmpdir:
        for key in a.items:
            if key != "a" and not gpus:
                report["items"][key] = {"status": NEEDS_GPU}
                continue
            t = time.monotonic()
            try:
                report["items"][key] = runners[key](Path(tmpdir))
            except Exception as e:  # noqa: BLE001  (one item failing must not hide the others' figures)
                report["items"][key] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
            report["items"][key]["seconds"] = round(time.monotonic() - t, 1)
            print(f"gpu-check ({key}) {ITEMS[key]}: {json.dumps(report['items'][key])}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu-check.json").write_text(json.dumps(report, indent=2))
    (a.out / "gpu-check.md").write_text(markdown(report))
    print(markdown(report))
    failed = [k for k, r in report["items"].items() if r["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
