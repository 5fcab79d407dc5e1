"""Workers of the real launcher can use CUDA (review 2026-11-24 K1).

torch's launcher asks ``torch.accelerator.is_available()`` in the agent before it starts any worker; that
initialises CUDA unless NVML answers, and a worker forked from such an agent dies in ``torch.cuda.set_device``
("Cannot re-initialize CUDA in forked subprocess"). The venv's torch is a CUDA build, so the poison shows on a
machine without a GPU: torch's own bad-fork flag is set in the worker. Every agent here is
``python -m eks_ddp_runtime.launch`` with the Job's flags from training/runtime/eks_ddp_runtime/launch_command.py and a real etcd.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eks_ddp_runtime.launch import no_nvidia_driver
from eks_ddp_runtime.launch_command import (
    CLUSTER_TIMEOUTS,
    AgentOptions,
    FabricCheckOptions,
    fabric_check_command,
    module_command,
)
from tests.support.etcd_server import ROOT, client_tls, etcd_endpoint, trainer_env  # noqa: F401  (fixture)

needs_cuda_build = pytest.mark.skipif(not torch.cuda._is_compiled(), reason="torch without CUDA cannot poison a fork")


def _agent(endpoint: str, nproc: int = 2) -> AgentOptions:
    # The cluster's rendezvous timings and restart budget; one node, so the first round completes at once.
    return AgentOptions(min_nodes=1, max_nodes=1, nproc_per_node=nproc, rdzv_backend="etcd",
                        rdzv_endpoint=endpoint, rdzv_id=f"cuda-{Path(endpoint).name}-{id(endpoint)}",
                        local_addr="127.0.0.1", timeouts=CLUSTER_TIMEOUTS,
                        tls=client_tls(endpoint))


def _run(cmd: list[str], env: dict[str, str], timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


def _probe(tmp_path: Path, endpoint: str, extra_env: dict[str, str] | None = None) -> tuple[list[dict], str]:
    out = tmp_path / "probe"
    proc = _run(module_command(_agent(endpoint), "tests.support.fork_probe", [str(out)], python=sys.executable),
                trainer_env(extra_env))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert len(ranks) == 2, log[-4000:]
    return ranks, log


def _assert_cuda_usable(ranks: list[dict], log: str) -> None:
    for r in ranks:
        assert not r["in_bad_fork"], f"rank {r['rank']} was forked from a process that initialised CUDA\n{log[-3000:]}"
        assert "forked subprocess" not in (r["lazy_init_error"] or ""), r


@needs_cuda_build
def test_workers_of_the_real_launcher_are_not_in_a_bad_fork(tmp_path, etcd_endpoint):  # noqa: F811
    ranks, log = _probe(tmp_path, etcd_endpoint)
    _assert_cuda_usable(ranks, log)
    # Review E7: forked by the zygote, which had one Python thread at that instant (workers.FORKED_FROM), never by
    # the agent, which meanwhile runs the rendezvous heartbeat thread. Negative controls: tests/runtime/test_fork_threads.py.
    for r in ranks:
        assert r["forked_from"] is not None and r["forked_from"]["pid"] == r["ppid"] != r["agent"], r
        assert r["forked_from"]["python_threads"] == 1 and r["agent_threads"] >= 2, r
    assert "1 Python thread at fork" in log, log[-3000:]


@needs_cuda_build
def test_an_agent_that_initialised_cuda_still_gets_clean_workers_from_the_zygote(tmp_path, etcd_endpoint):  # noqa: F811
    # NVML off: torch's accelerator check initialises CUDA in the agent (a GPU node without NVML would do this).
    # The workers are not forked from the agent but from the zygote, a fresh interpreter that never touched CUDA.
    ranks, log = _probe(tmp_path, etcd_endpoint, {"EKS_DDP_FORK_WORKERS": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "0"})
    _assert_cuda_usable(ranks, log)
    zygote = re.search(r"workers are forked from a zygote \(pid (\d+), 1 thread\(s\), clean for CUDA", log)
    assert zygote, log[-3000:]
    assert {r["ppid"] for r in ranks} == {int(zygote[1])}


@needs_cuda_build
def test_a_zygote_that_touched_cuda_is_not_forked(tmp_path, etcd_endpoint):  # noqa: F811
    # Negative control for the zygote's probe: a preloaded module that initialises CUDA on import (through torch's
    # accelerator check without NVML) poisons every fork of the zygote; the launcher must start fresh processes.
    ranks, log = _probe(tmp_path, etcd_endpoint, {"EKS_DDP_PRELOAD": "tests.support.cuda_touch_probe",
                                                  "PYTORCH_NVML_BASED_CUDA_CHECK": "0"})
    _assert_cuda_usable(ranks, log)
    assert "EKS_DDP_FORK_WORKERS=1 overridden: the zygote is not safe to fork" in log, log[-3000:]
    assert "'bad_fork': True" in log


@needs_cuda_build
@pytest.mark.skipif(not no_nvidia_driver(), reason="a machine with an NVIDIA driver")
def test_without_a_driver_workers_are_still_forked_and_clean(tmp_path, etcd_endpoint):  # noqa: F811
    # A CPU machine (CI, a laptop) with torch's CUDA build and nobody setting CUDA_VISIBLE_DEVICES: the agent hides
    # the (absent) devices, so torch's check needs no CUDA, and the fast restart stays.
    env = trainer_env()
    env.pop("CUDA_VISIBLE_DEVICES")
    out = tmp_path / "probe"
    proc = _run(module_command(_agent(etcd_endpoint), "tests.support.fork_probe", [str(out)], python=sys.executable), env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    _assert_cuda_usable([json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))], log)
    assert "workers are forked from a zygote" in log and "no NVIDIA driver on this machine" in log


def test_a_bad_fork_setting_is_a_usage_error_naming_the_variable(tmp_path, etcd_endpoint):  # noqa: F811
    proc = _run(module_command(_agent(etcd_endpoint), "tests.support.fork_probe", [str(tmp_path / "p")],
                               python=sys.executable), trainer_env({"EKS_DDP_FORK_WORKERS": "yes"}))
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert "EKS_DDP_FORK_WORKERS: got 'yes'; expected 0" in proc.stderr


def test_the_probe_sees_a_poisoned_fork():
    # Negative control for the probe the tests above rely on: after torch's accelerator check without NVML,
    # a forked child is in a bad fork, and launch.fork_is_clean says so.
    code = ("import os, torch\nfrom eks_ddp_runtime.launch import fork_is_clean\nclean = fork_is_clean()\n"
            "torch.accelerator.is_available()\nprint(clean, fork_is_clean(), torch.cuda._is_compiled())")
    env = trainer_env({"PYTORCH_NVML_BASED_CUDA_CHECK": "0"})
    out = _run([sys.executable, "-c", code], env, 60).stdout.split()
    assert out[0] == "True"
    assert out[1] == ("False" if out[2] == "True" else "True")


@needs_cuda_build
def test_fabric_check_workers_are_not_in_a_bad_fork(tmp_path, etcd_endpoint):  # noqa: F811
    check = FabricCheckOptions(run_dir=str(tmp_path / "run"), max_bytes=64, iters=1, warmup=0)
    proc = _run(fabric_check_command(_agent(etcd_endpoint), check, python=sys.executable), trainer_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads((tmp_path / "run" / "fabric.json").read_text())
    assert [r["cuda_bad_fork"] for r in report["ranks"]] == [False, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_every_worker_sets_its_device_and_runs_a_kernel(tmp_path, etcd_endpoint):  # noqa: F811
    out = tmp_path / "probe"
    agent = _agent(etcd_endpoint, nproc=1)
    env = trainer_env()
    env.pop("CUDA_VISIBLE_DEVICES")
    proc = _run(module_command(agent, "tests.support.fork_probe", [str(out)], python=sys.executable), env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rank = json.loads((out / "rank-0.json").read_text())
    assert rank["set_device"] == 4.0 and not rank["in_bad_fork"]
