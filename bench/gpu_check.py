"""One-command GPU acceptance: ``make gpu-check`` (``python bench/gpu_check.py [--out gpu-check-out]``).

Runs with the GPU machine's own interpreter (Python 3.12, torch 2.11 to 2.14) and nothing else installed: no Pulumi,
boto3 or cryptography, no install of this project, no network. It puts this checkout on the import path and
``.gpu-bundle/bin`` (the etcd server, from ``make gpu-check-bundle``) on PATH, maps ``eks_ddp_runtime`` to
training/runtime itself (its etcd client is the standard library's HTTP), the agents' command line included
(``eks_ddp_runtime.launch_command``: nothing of the Pulumi library is imported). Each item has a bar; the
verdict (exit code) fails when an item fails or misses its bar. ``gpu-check.json`` and ``gpu-check.md`` in ``--out``
are rewritten after every item, so a run cut short keeps what it measured.

| item | what | bar (on a GPU) |
|---|---|---|
| a | the real launcher with the cluster's flags, a real etcd, one worker SIGKILLed | recovery <= 4 s, work redone <= 0.1 s |
| b | the trainer's img/s (default recipe, batch 1,024, steps after Lookahead starts) / airbench94's training loop | >= 0.9 |
| c | the trainer with ``--compile``: compile seconds (cold and from the cache), recompiles | no recompile |
| d | ``set_sync_debug_mode("error")`` over steps 200-212 (after Lookahead), and a control that must trip | clean; control trips |
| e | snapshot overhead: on/off/on/off runs, mean img/s of 100-step windows after Lookahead | <= 3 % |
| f | two worker processes on one GPU (gloo on CUDA tensors): DDP, synced BatchNorm, the launcher | finishes |
| g | the CUDA-only tests (tests/trainer/test_gpu_true.py) collected and run there | all pass, none skipped |

Without a GPU, (a) runs on CPU (gloo, a tiny model; its figures are reported, its bars apply on a GPU only) and
every other item says "needs a GPU".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shutil
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
NEEDS_GPU = "needs a GPU"
EPOCH_IMAGES = 50_000
BARS = {
    "a": "recovery_s <= 4.0 and work_redone_s <= 0.1",
    "b": "ratio >= 0.9",
    "c": "recompiles == 0",
    "d": "window clean and the control trips",
    "e": "overhead_pct <= 3.0",
    "f": "both processes finish (exit 0, world 2)",
    "g": "CUDA tests pass, none skipped",
}
ITEMS = {"a": "launcher + etcd, worker SIGKILL, recovery", "b": "trainer img/s / airbench94 training loop",
         "c": "--compile: compile seconds and recompiles", "d": "no host sync after Lookahead (with a control)",
         "e": "snapshot overhead, interleaved on/off", "f": "2 processes on one GPU (gloo on CUDA)",
         "g": "CUDA-only tests (pytest)"}
TAIL = 2500
AIRBENCH_ARGS: list[str] = []
"""Extra flags for bench/airbench94_loop.py (a toy-size rehearsal of the items on a CPU sets them)."""


def torchrun_command():
    """``eks_ddp_runtime.launch_command`` (stdlib only): the cluster's agent command line."""
    return importlib.import_module("eks_ddp_runtime.launch_command")


def prepare_environment(bundle: Path, shim: Path) -> dict[str, str]:
    """The environment of every process the check starts, also applied to this one: this checkout and a shim folder
    and the source roots of ``eks_ddp_runtime``, ``eks_ddp_trainer`` and ``eks_ddp_local`` (training/runtime and
    training: each package's folder is its import name, so no install is needed) on the import path, with the bundle's
    psutil and cryptography where this Python lacks them; the bundle's etcd on PATH. ``shim`` is kept for callers and
    left empty."""
    shim.mkdir(parents=True, exist_ok=True)
    paths = [str(ROOT), str(ROOT / "training"), str(ROOT / "training" / "runtime")]
    if (bundle / "fallback").is_dir():  # psutil, cryptography: each only where this Python lacks it
        paths += [str(d) for d in sorted((bundle / "fallback").iterdir()) if importlib.util.find_spec(d.name) is None]
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


def tls_tooling() -> str | None:
    """The package that makes the local etcd's throw-away CA (training/eks_ddp_local/etcd_server.py), as ``cryptography <version>``;
    None when it does not load here (absent, or the bundle's cffi backend was built for another Python)."""
    try:
        import cryptography
        from cryptography.hazmat.bindings import _rust  # noqa: F401  (loads the cffi backend of this Python)
    except ImportError:
        return None
    return f"cryptography {cryptography.__version__}"


def verdict(result: dict[str, Any]) -> bool | None:
    """An item's ``pass``: None where no bar applies (needs a GPU; CPU-only figures)."""
    return result.get("pass")


def _history(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "history.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


class ItemFailed(RuntimeError):
    """An item could not measure; ``tail`` holds the logs that say why."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


def _wait(pred: Callable[[], Any], timeout_s: float, what: str, procs: list[subprocess.Popen],
          logs: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if procs and all(p.poll() is not None for p in procs):
            raise ItemFailed(f"every agent ended (exit codes {[p.poll() for p in procs]}) while waiting for {what}",
                             logs())
        time.sleep(0.05)
    raise ItemFailed(f"timed out after {timeout_s:.0f} s waiting for {what}", logs())


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        from eks_ddp_local.procs import proc_table  # the local runner's process table (prepare_environment maps it)

        table = proc_table()
        for pid in [p.pid, *(c for c, parent in table.items() if parent == p.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


@contextlib.contextmanager
def snapshot_dir(tag: str):
    """A node-local snapshot folder for one item, where the cluster keeps them (/dev/shm), removed afterwards."""
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    d = base / f"eks-ddp-gpu-check-{os.getpid()}-{tag}"
    d.mkdir(parents=True, exist_ok=True)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _step_seconds(steps: list[dict[str, Any]]) -> float | None:
    """Median seconds per optimizer step from consecutive step records."""
    gaps = [(b["time"] - a["time"]) / (b["step"] - a["step"]) for a, b in zip(steps, steps[1:], strict=False)
            if b["step"] > a["step"]]
    return statistics.median(gaps) if gaps else None


def item_a(tmp: Path, env: dict[str, str], gpus: int) -> dict[str, Any]:
    """The real launcher, cluster flags, real etcd; SIGKILL one worker; recovery seconds and work redone."""
    tr = torchrun_command()
    from eks_ddp_local.etcd_server import start_etcd
    from eks_ddp_trainer.config import TrainerConfig
    from eks_ddp_trainer.data import write_synthetic_cifar

    on_gpu = gpus > 0
    agents = min(gpus, 2) if on_gpu else 1
    n_train = 20_000 if on_gpu else 480
    write_synthetic_cifar(tmp / "data-a", n_train=n_train, n_test=500, seed=0)
    trainer = (TrainerConfig(data_dir=str(tmp / "data-a"), run_dir=str(tmp / "run-a"), epochs=50, log_every=1,
                              checkpoint_every=50, min_steps=0) if on_gpu else
               TrainerConfig(data_dir=str(tmp / "data-a"), run_dir=str(tmp / "run-a"), epochs=50,
                              global_batch_size=16, bn_group=8, min_steps=0, width=8, log_every=1,
                              checkpoint_every=5))
    procs: list[subprocess.Popen] = []

    def logs() -> str:
        return "\n".join(f"----- agent{i} (exit {p.poll()})\n"
                         + (tmp / f"agent{i}.log").read_text(errors="replace")[-TAIL:] for i, p in enumerate(procs))

    with start_etcd(tmp / "etcd") as endpoint, snapshot_dir("a") as snaps:
        opts = tr.AgentOptions(min_nodes=1, max_nodes=agents, nproc_per_node=1, rdzv_backend="etcd",
                               rdzv_endpoint=endpoint, rdzv_id=f"gpu-check-{os.getpid()}", local_addr="127.0.0.1",
                               timeouts=tr.CLUSTER_TIMEOUTS, tls=tr.RdzvTls.of(endpoint.tls))
        cmd = tr.job_command(opts, trainer, python=sys.executable)
        try:
            for i in range(agents):
                e = {**env, **tr.AGENT_ENV, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "2"),
                     "EKS_DDP_SNAPSHOT_DIR": str(snaps)}
                e["CUDA_VISIBLE_DEVICES"] = str(i) if on_gpu else ""
                with open(tmp / f"agent{i}.log", "wb") as log:
                    procs.append(subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True))
            run = Path(trainer.run_dir)

            def steps() -> list[dict[str, Any]]:
                return [r for r in _history(run) if r.get("kind") == "step"]

            _wait(lambda: len(steps()) >= 8, 300, "8 training steps", procs, logs)
            from eks_ddp_local.procs import worker_pids  # the zygote's children, not the zygote itself

            victim = _wait(lambda: worker_pids(procs[-1].pid), 30, "a worker", procs, logs)[0]
            before = steps()
            last = before[-1]["step"]
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            start = _wait(lambda: [r for r in _history(run) if r.get("kind") == "start" and r["time"] > killed],
                          300, "a restarted worker group", procs, logs)[0]
            nxt = _wait(lambda: [r for r in steps() if r["time"] > start["time"]], 300, "a step after the restart",
                        procs, logs)[0]
            fork = any("workers are forked" in (tmp / f"agent{i}.log").read_text(errors="replace")
                       for i in range(agents))
        finally:
            _stop(procs)
    redone = max(0, last - start["resumed_step"])
    step_s = _step_seconds(before[-20:])
    out = {"device": "cuda" if on_gpu else "cpu (gloo)", "agents": agents,
           "recovery_s": round(nxt["time"] - killed, 2), "kill_to_start_s": round(start["time"] - killed, 2),
           "steps_redone": redone, "step_s": None if step_s is None else round(step_s, 4),
           "work_redone_s": None if step_s is None else round(redone * step_s, 3),
           "resumed_step": start["resumed_step"], "workers": "forked from the agent" if fork else "fresh processes"}
    if on_gpu:
        out["pass"] = out["recovery_s"] <= 4.0 and (out["work_redone_s"] or 0.0) <= 0.1
    else:
        out["note"] = "CPU figures; the bars apply on a GPU"
    return out


def _trainer_run(tmp: Path, env: dict[str, str], name: str, args: list[str], extra_env: dict[str, str] | None = None,
                 module: str = "eks_ddp_trainer.train", timeout_s: float = 300) -> tuple[subprocess.CompletedProcess, Path, float]:
    run = tmp / f"run-{name}"
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, f"--run-dir={run}", *args], cwd=ROOT,
                          env={**env, **(extra_env or {})}, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    return proc, run, time.monotonic() - t


def _ok(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        raise ItemFailed(f"{what}: exit {proc.returncode}", (proc.stdout + proc.stderr)[-TAIL:])


def _data_50k(tmp: Path) -> Path:
    from eks_ddp_trainer.data import write_synthetic_cifar

    d = tmp / "data-50k"
    if not (d / "cifar-10-batches-py" / "test_batch").exists():
        write_synthetic_cifar(d, n_train=EPOCH_IMAGES, n_test=1000, seed=0)
    return d


def img_s_after(history: list[dict[str, Any]], first_step: int) -> float:
    """Images/s of a run's logged windows that start at or after ``first_step``: images over seconds, each window's
    images being its logged rate times its length."""
    steps = [r for r in history if r.get("kind") == "step"]
    pairs = [(a, b) for a, b in zip(steps, steps[1:], strict=False) if a["step"] >= first_step]
    if not pairs:
        raise ItemFailed(f"no logged window starts at or after step {first_step}", json.dumps(steps[-5:]))
    images = sum(b["img_s"] * (b["time"] - a["time"]) for a, b in pairs)
    return images / sum(b["time"] - a["time"] for a, b in pairs)


def lookahead_start(history: list[dict[str, Any]]) -> int:
    """The first step of the Lookahead phase (training/eks_ddp_trainer/lookahead.py: 30 % of the run's steps)."""
    from eks_ddp_trainer.lookahead import LookaheadConfig

    total = max(r["step"] for r in history if r.get("kind") == "step")
    return int(LookaheadConfig().start * total + 0.999)


def bf16_supported() -> bool:
    """bf16 convolutions in hardware (sm80+), not emulated: a T4 has none."""
    import torch

    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # an older signature without the flag
        return torch.cuda.get_device_capability(0) >= (8, 0)


def item_b(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """The trainer (default recipe, 10 epochs of 50,000, batch 1,024) vs airbench94's training loop
    (bench/airbench94_loop.py, airbench94's network), interleaved T, A, T, A; the best of each."""
    data = _data_50k(tmp)
    trainer, airbench, ten_epochs = [], [], []
    with snapshot_dir("b") as snaps:
        for i in range(2):
            proc, run, wall = _trainer_run(tmp, env, f"b-{i}", [f"--data-dir={data}", "--epochs=10"],
                                           {"EKS_DDP_SNAPSHOT_DIR": str(snaps)})
            _ok(proc, "the trainer")
            hist = _history(run)
            trainer.append(img_s_after(hist, lookahead_start(hist)))
            start = next(r["time"] for r in hist if r.get("kind") == "start")
            ten_epochs.append(round(max(r["time"] for r in hist if r.get("kind") == "step") - start, 2))
            out_json = tmp / f"airbench-{i}.json"
            ab = subprocess.run([sys.executable, str(ROOT / "bench" / "airbench94_loop.py"), f"--data-dir={data}",
                                 f"--out={out_json}", *AIRBENCH_ARGS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                                stdin=subprocess.DEVNULL)
            _ok(ab, "the airbench94 loop")
            airbench.append(json.loads(out_json.read_text())["img_s"])
    ratio = max(trainer) / max(airbench)
    out = {"trainer_img_s": [round(v) for v in trainer], "airbench94_img_s": airbench, "ratio": round(ratio, 3),
           "trainer_10_epochs_s": ten_epochs, "global_batch": 1024,
           "note": "trainer: fp32 master weights under fp16 autocast; airbench94: a .half() network"}
    if bf16_supported():
        proc, run, _ = _trainer_run(tmp, env, "b-bf16", [f"--data-dir={data}", "--epochs=10", "--precision=bf16"],
                                    {"EKS_DDP_SNAPSHOT_DIR": "off"})
        _ok(proc, "the trainer in bf16")
        hist = _history(run)
        out["trainer_bf16_img_s"] = round(img_s_after(hist, lookahead_start(hist)))
    else:
        out["trainer_bf16_img_s"] = "bf16 not supported in hardware here"
    out["pass"] = ratio >= 0.9
    return out


def item_c(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """``--compile`` at batch 1,024 for 2 epochs, cold and again from the first run's Inductor cache."""
    data = _data_50k(tmp)
    cache = tmp / "inductor-cache"
    runs = []
    for name in ("cold", "cached"):
        proc, run, wall = _trainer_run(tmp, env, f"c-{name}", [f"--data-dir={data}", "--epochs=2", "--min-steps=0",
                                                              "--compile", "--log-every=10"],
                                       {"TORCH_LOGS": "recompiles", "TORCHINDUCTOR_CACHE_DIR": str(cache),
                                        "EKS_DDP_SNAPSHOT_DIR": "off"}, timeout_s=400)
        _ok(proc, f"the compiled trainer ({name})")
        hist = _history(run)
        steps = [r for r in hist if r.get("kind") == "step"]
        start = next(r["time"] for r in hist if r.get("kind") == "start")
        runs.append({"first_window_s": round(steps[0]["time"] - start, 2), "process_s": round(wall, 1),
                     "img_s_last_window": round(steps[-1]["img_s"]),
                     "recompiles": len(re.findall(r"Recompiling function", proc.stdout + proc.stderr))})
    recompiles = sum(r["recompiles"] for r in runs)
    return {"cold": runs[0], "cached": runs[1], "recompiles": recompiles, "pass": recompiles == 0}


def item_d(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """Sync-debug mode "error" over optimizer steps 200-212 of the default run (batch 1,024; Lookahead from step
    147, epochs end at 196 and 245), with logs, checks and checkpoints out of the window; then the control: the
    same with the divergence check every 5 steps (a host read), which must trip the mode."""
    base = [f"--data-dir={_data_50k(tmp)}", "--epochs=10", "--max-steps=215", "--log-every=1000",
            "--checkpoint-every=1000"]
    with snapshot_dir("d") as snaps:
        extra = {"EKS_DDP_SYNC_WINDOW": "200:212", "EKS_DDP_SNAPSHOT_DIR": str(snaps)}
        clean, _, _ = _trainer_run(tmp, env, "d", [*base, "--check-every=1000"], extra, module="bench.sync_probe")
        control, _, _ = _trainer_run(tmp, env, "d-control", [*base, "--check-every=5"], extra,
                                     module="bench.sync_probe")
    out_clean, out_control = clean.stdout + clean.stderr, control.stdout + control.stderr
    ok = clean.returncode == 0 and "sync window clean" in out_clean
    tripped = control.returncode != 0 and "sync window clean" not in out_control and "synchroniz" in out_control
    out = {"window": "optimizer steps 200-212 of 490 (epoch 5, after Lookahead starts)", "clean": ok,
           "control_tripped": tripped, "pass": ok and tripped}
    if not ok:
        out["tail"] = out_clean[-TAIL:]
    if not tripped:
        out["control_tail"] = out_control[-TAIL:]
    return out


def item_e(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """Snapshots on vs off, interleaved on/off/on/off, default recipe at batch 1,024, node-local in /dev/shm: the
    mean img/s of the 100-step windows that start after Lookahead (steps 200-300 and 300-400)."""
    data = _data_50k(tmp)
    rates: dict[str, list[float]] = {"on": [], "off": []}
    with snapshot_dir("e") as snaps:
        for i, mode in enumerate(("on", "off", "on", "off")):
            extra = {"EKS_DDP_SNAPSHOT_DIR": str(snaps) if mode == "on" else "off"}
            proc, run, _ = _trainer_run(tmp, env, f"e-{i}-{mode}", [f"--data-dir={data}", "--epochs=10",
                                                                    "--log-every=100"], extra)
            _ok(proc, f"the trainer (snapshots {mode})")
            windows = [r["img_s"] for r in _history(run) if r.get("kind") == "step" and 200 < r["step"] <= 400]
            if len(windows) < 2:
                raise ItemFailed("fewer than two 100-step windows after step 200", json.dumps(windows))
            rates[mode].extend(windows)
    on, off = statistics.mean(rates["on"]), statistics.mean(rates["off"])
    overhead = 100 * (off - on) / off
    return {"img_s_snapshots_on": round(on), "img_s_snapshots_off": round(off), "overhead_pct": round(overhead, 2),
            "windows_per_mode": len(rates["on"]), "pass": overhead <= 3.0}


def item_f(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """The real launcher with two workers on one GPU (EKS_DDP_SHARE_ONE_GPU: gloo, which takes CUDA tensors, since
    NCCL refuses two ranks on one device): DDP with gradient bucket views, the synced BatchNorm's autograd
    all-reduce, two epochs at batch 1,024."""
    run = tmp / "run-f"
    cmd = [sys.executable, "-m", "eks_ddp_runtime.launch", "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
           "--rdzv-endpoint=localhost:0", f"--rdzv-id=gpu-check-f-{os.getpid()}", "-m", "eks_ddp_trainer.train", f"--data-dir={_data_50k(tmp)}", f"--run-dir={run}", "--epochs=2", "--min-steps=0",
           "--log-every=10"]
    e = {**env, "EKS_DDP_SHARE_ONE_GPU": "1", "CUDA_VISIBLE_DEVICES": "0", "EKS_DDP_SNAPSHOT_DIR": "off",
         "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    _ok(proc, "two workers on one GPU")
    hist = _history(run)
    world = max((r.get("world", 0) for r in hist if r.get("kind") == "step"), default=0)
    steps = [r for r in hist if r.get("kind") == "step"]
    return {"world": world, "steps": steps[-1]["step"] if steps else 0,
            "img_s_last_window": round(steps[-1]["img_s"]) if steps else None, "backend": "gloo on CUDA tensors",
            "pass": world == 2}


def item_g(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    """tests/trainer/test_gpu_true.py with pytest (collected without Pulumi): its CUDA-only tests must run and pass."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                           "tests/trainer/test_gpu_true.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=400, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    summary = next((line for line in reversed(out.splitlines()) if " passed" in line or " failed" in line), "")
    skipped_cuda = "needs a CUDA GPU" in out
    ok = proc.returncode == 0 and not skipped_cuda
    return {"summary": summary.strip("= "), "cuda_tests_skipped": skipped_cuda, "pass": ok,
            **({} if ok else {"tail": out[-TAIL:]})}


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"# GPU check ({m['gpu'] or 'no GPU'}; torch {m['torch']}; Python {m['python']})", "",
             f"Verdict: **{report.get('verdict', 'running')}**", "",
             "| item | status | bar | pass | figures |", "|---|---|---|---|---|"]
    for key, title in ITEMS.items():
        r = report["items"].get(key, {})
        figures = "; ".join(f"{k}={v}" for k, v in r.items() if k not in ("status", "tail", "control_tail", "pass"))
        p = {True: "yes", False: "**NO**", None: "-"}[r.get("pass")]
        lines.append(f"| ({key}) {title} | {r.get('status', 'not run')} | {BARS[key]} | {p} | {figures} |")
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gpu-check.json.tmp"
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, out / "gpu-check.json")
    (out / "gpu-check.md").write_text(markdown(report))


def preflight(bundle: Path) -> str | None:
    """Why the check cannot start here, or None."""
    try:
        from eks_ddp_local.etcd_server import find_etcd

        find_etcd()
    except (ImportError, FileNotFoundError) as e:
        return (f"{e}; run `make gpu-check-bundle` on a machine with the project's venv and copy {bundle.name}/ "
                "beside bench/ here")
    if tls_tooling() is None:
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        return (f"the cryptography package does not load under this Python {version}: the local etcd cannot get its "
                f"TLS; run `make gpu-check-bundle GPU_PYTHON_VERSION={version}` and copy {bundle.name}/ beside bench/")
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "gpu-check-out", help="folder for gpu-check.json/.md")
    p.add_argument("--bundle", type=Path, default=BUNDLE, help="the etcd server for offline machines")
    p.add_argument("--items", default="".join(ITEMS), help="which items to run (default: all)")
    a = p.parse_args(argv)
    if bad := sorted(set(a.items) - set(ITEMS)):
        print(f"gpu-check: --items: got {bad[0]!r}; expected letters of {''.join(ITEMS)!r}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmpdir:
        tmp = Path(tmpdir)
        env = prepare_environment(a.bundle, tmp / "shim")
        from eks_ddp_runtime import compat

        if problem := compat.torch_problem(compat.installed_torch_version()):
            print(f"gpu-check: {problem}", file=sys.stderr)
            return 2
        if problem := preflight(a.bundle):
            print(f"gpu-check: {problem}", file=sys.stderr)
            return 2
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        report: dict[str, Any] = {
            "machine": {"gpu": torch.cuda.get_device_name(0) if gpus else None, "gpus": gpus,
                        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                        "cores": os.cpu_count(), "tls": tls_tooling(),
                        "load_avg_1m_at_start": round(os.getloadavg()[0], 2)},
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "bars": BARS, "items": {}}
        runners: dict[str, Callable[[], dict[str, Any]]] = {
            "a": lambda: item_a(tmp, env, gpus), "b": lambda: item_b(tmp, env), "c": lambda: item_c(tmp, env),
            "d": lambda: item_d(tmp, env), "e": lambda: item_e(tmp, env), "f": lambda: item_f(tmp, env),
            "g": lambda: item_g(tmp, env)}
        for key in a.items:
            if key != "a" and not gpus:
                report["items"][key] = {"status": NEEDS_GPU}
                write_report(a.out, report)
                continue
            report["items"][key] = {"status": "running"}
            write_report(a.out, report)
            t = time.monotonic()
            try:
                result = {"status": "ok", **runners[key]()}
            except ItemFailed as e:
                result = {"status": "failed", "error": str(e), "tail": e.tail}
            except Exception as e:  # noqa: BLE001  (one item failing must not hide the others' figures)
                result = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
            result["seconds"] = round(time.monotonic() - t, 1)
            report["items"][key] = result
            write_report(a.out, report)
            print(f"gpu-check ({key}) {ITEMS[key]}: {json.dumps({k: v for k, v in result.items() if k != 'tail'})}",
                  flush=True)
            if result.get("tail"):
                print(result["tail"], flush=True)
        failed = sorted(k for k, r in report["items"].items() if r["status"] == "failed")
        missed = sorted(k for k, r in report["items"].items() if verdict(r) is False)
        report["verdict"] = ("pass" if not failed and not missed else
                             f"FAIL (failed: {','.join(failed) or '-'}; bar missed: {','.join(missed) or '-'})")
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_report(a.out, report)
        print(markdown(report))
        return 1 if failed or missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
