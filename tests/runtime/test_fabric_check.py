"""The fabric check: its arithmetic and verdicts, and the real thing under torchrun + etcd (gloo on CPU).

No GPU here: NCCL's transport detection is tested on NCCL's own log lines, and the measurement,
gathering, fabric.json and exit codes on 2 real torchrun agents with gloo.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eks_ddp_runtime import fabric_check as fc
from eks_ddp_runtime.exitcodes import FABRIC_FAILED
from eks_ddp_runtime.launch_command import (
    FABRIC_CHECK_MODULE,
    LOCAL_TIMEOUTS,
    AgentOptions,
    FabricCheckOptions,
    fabric_check_command,
)
from tests.support.etcd_server import ROOT, TORCHRUN, Agent, _processes, client_tls, etcd_endpoint, trainer_env  # noqa: F401

# NCCL 2.2x INIT/NET lines as they appear with NCCL_DEBUG=INFO (host:pid:tid prefix), aws-ofi-nccl's included.
NCCL_EFA_LOG = """\
ip-10-0-1-5:123:123 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ^lo
ip-10-0-1-5:123:123 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)
ip-10-0-1-5:123:123 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.20.0
ip-10-0-1-5:123:123 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)
ip-10-0-1-5:123:123 [0] NCCL INFO Using network AWS Libfabric
"""
NCCL_SOCKET_LOG = """\
ip-10-0-1-5:123:123 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net-ofi.so. Using internal net plugin.
ip-10-0-1-5:123:123 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.5<0>
ip-10-0-1-5:123:123 [0] NCCL INFO Using network Socket
"""


def _rank(host: str, transport: str, devices: int, rank: int = 0) -> fc.RankInfo:
    return fc.RankInfo(rank=rank, host=host, node_rank=rank, local_rank=0, backend="nccl", transport=transport,
                       efa_devices=devices)


def _result(busbw: float) -> fc.SizeResult:
    return fc.SizeResult(bytes=1 << 30, count=1 << 28, time_us=1.0, algbw_gbs=busbw / 1.875, busbw_gbs=busbw)


# --- arithmetic and parsing -------------------------------------------------------------------------------


def test_sweep_spans_8_bytes_to_1_gib():
    sizes = fc.sweep(8, fc.GPU_MAX_BYTES)
    assert sizes[0] == 8 and sizes[-1] == 1 << 30 and len(sizes) == 28
    assert fc.sweep(8, 4 << 20, 4) == [8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288, 2097152]
    with pytest.raises(ValueError):
        fc.sweep(2, 1024)


def test_bus_bandwidth_is_nccl_tests_all_reduce_formula():
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce.
    assert fc.bus_bandwidth(10.0, 16) == pytest.approx(18.75)
    assert fc.bus_bandwidth(10.0, 2) == pytest.approx(10.0)
    assert fc.bus_bandwidth(10.0, 1) == 0.0


def test_transport_from_nccl_log_lines():
    assert fc.parse_nccl_log(NCCL_EFA_LOG) == ("efa", "AWS Libfabric", "efa")
    assert fc.parse_nccl_log(NCCL_SOCKET_LOG) == ("socket", "Socket", None)
    tcp_ofi = NCCL_EFA_LOG.replace("provider is efa, fabric is efa", "provider is tcp, fabric is tcp")
    assert fc.parse_nccl_log(tcp_ofi)[0] == "ofi:tcp"
    assert fc.parse_nccl_log("NCCL INFO Using network IB\n")[0] == "ib"
    assert fc.parse_nccl_log("")[0] == "unknown"


def test_efa_devices_are_the_uverbs_the_device_plugin_mounts(tmp_path):
    assert fc.count_efa_devices(str(tmp_path)) == 0
    for i in range(4):
        (tmp_path / f"uverbs{i}").touch()
    (tmp_path / "rdma_cm").touch()
    assert fc.count_efa_devices(str(tmp_path)) == 4


# --- verdicts ---------------------------------------------------------------------------------------------


def test_efa_fabric_above_the_floor_passes():
    ranks = [_rank("node-a", "efa", 4, 0), _rank("node-b", "efa", 4, 1)]
    assert fc.evaluate(ranks, [_result(40.0)], require_efa=True, floor_busbw_gbs=12.5) == []


def test_no_efa_devices_is_named():
    reasons = fc.evaluate([_rank("node-a", "efa", 4, 0), _rank("node-b", "socket", 0, 1)], [_result(40.0)],
                          require_efa=True, floor_busbw_gbs=None)
    assert any(r.startswith("no EFA devices in the pod on node-b") for r in reasons)


def test_socket_transport_is_named():
    reasons = fc.evaluate([_rank("node-a", "socket", 4)], [_result(40.0)], require_efa=True, floor_busbw_gbs=None)
    assert reasons == ["transport is not OFI/EFA: socket on node-a; NCCL fell back to TCP sockets (NET/Socket): "
                       "the aws-ofi-nccl plugin or libfabric's EFA provider did not load"]


def test_low_bandwidth_is_named_with_both_figures():
    reasons = fc.evaluate([_rank("node-a", "efa", 4)], [_result(3.2)], require_efa=True, floor_busbw_gbs=12.5)
    assert reasons == ["low bandwidth: peak all-reduce bus bandwidth 3.20 GB/s is below the floor 12.50 GB/s "
                       "for this instance type"]


def test_without_efa_only_the_floor_counts():
    assert fc.evaluate([_rank("n", "socket", 0)], [_result(1.0)], require_efa=False, floor_busbw_gbs=None) == []


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_pair_rounds_cover_the_ring_with_disjoint_pairs(n):
    rounds = fc.pair_rounds(n)
    edges = [p for r in rounds for p in r]
    assert sorted(tuple(sorted(p)) for p in edges) == sorted({tuple(sorted((i, (i + 1) % n))) for i in range(n)})
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    assert len(rounds) == (1 if n == 2 else 2 if n % 2 == 0 else 3)
    assert fc.pair_rounds(1) == []


def _pairs(n: int, slow: set[int], good: float = 76.0, bad: float = 19.0) -> list[fc.PairResult]:
    return [fc.PairResult(node_ranks=[a, b], nodes=[f"node-{a}", f"node-{b}"], bytes=1 << 30, time_us=1.0,
                          busbw_gbs=bad if {a, b} & slow else good)
            for r in fc.pair_rounds(n) for a, b in r]


def test_the_slow_node_is_named_from_its_pairs():
    """One node on one EFA card of four among four: its two pairs are slow, its neighbours' other pairs are not, so
    it alone is named; the whole job's peak (the sweep) would not show it."""
    ranks = [_rank(f"node-{i}", "efa", 4, i) for i in range(4)]
    named, reasons = fc.slow_nodes(_pairs(4, {2}), 46.07)
    assert named == ["node-2"]
    assert reasons == ["slow node node-2: every pair it was measured in is below the floor 46.07 GB/s "
                       "(with node-1 19.00 GB/s, with node-3 19.00 GB/s)"]
    assert fc.evaluate(ranks, [_result(76.0)], require_efa=True, floor_busbw_gbs=46.07,
                       pairs=_pairs(4, {2})) == reasons
    # Controls: all pairs healthy; no floor (no EFA); two nodes cannot tell which, the pair is named.
    assert fc.slow_nodes(_pairs(4, set()), 46.07) == ([], [])
    assert fc.slow_nodes(_pairs(4, {2}), None) == ([], [])
    assert fc.slow_nodes(_pairs(2, {1}), 46.07) == ([], [
        "slow pair node-0 - node-1: 19.00 GB/s below the floor 46.07 GB/s (one of the two, measured only together)"])


def test_alone_without_torchrun_require_efa_fails_with_the_reason_and_exit_code(tmp_path):
    env = trainer_env()
    proc = subprocess.run([sys.executable, "-m", FABRIC_CHECK_MODULE, f"--run-dir={tmp_path}", "--require-efa"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == FABRIC_FAILED, proc.stdout + proc.stderr
    report = json.loads((tmp_path / fc.FABRIC_JSON).read_text())
    assert report["passed"] is False
    assert report["reasons"][0].startswith("no EFA devices in the pod")
    assert "transport is not OFI/EFA: gloo-tcp" in report["reasons"][1]
    assert "FABRIC CHECK FAILED: no EFA devices" in proc.stdout


def test_node_only_checks_this_nodes_devices_without_a_peer_and_writes_no_report(tmp_path, monkeypatch):
    """The gate of a pod that joins after the job's check passed (fabric_gate.py): no process group, no torch."""
    monkeypatch.setenv("NODE_NAME", "ip-10-0-1-7.ec2.internal")
    monkeypatch.setattr(fc, "count_efa_devices", lambda: 0)
    assert fc.main([f"--run-dir={tmp_path}", "--node-only", "--require-efa"]) == FABRIC_FAILED
    monkeypatch.setattr(fc, "count_efa_devices", lambda: 4)
    assert fc.main([f"--run-dir={tmp_path}", "--node-only", "--require-efa"]) == 0
    assert fc.main([f"--run-dir={tmp_path}", "--node-only"]) == 0
    assert not (tmp_path / fc.FABRIC_JSON).exists()


def _gate(tmp_path: Path, admission: str | None, marker_request: str | None) -> str:
    """Run the training pods' gate script (fabric_gate.gate_command, queued) as the kubelet and sh would: the
    kubelet expands $(JOB_UID) and $(FABRIC_ADMISSION) ("" for a pod without the annotation), sh runs it with a
    ``python`` that only says which check it was asked for. Returns 'node-only' or 'full'."""
    from eks_ddp.workloads.elastic_job.args import Queued
    from eks_ddp.workloads.elastic_job.fabric_gate import gate_command
    from eks_ddp.workloads.elastic_job.info import job_info
    from tests.support.job_args import job_args
    from tests.workloads.test_elastic_job import ETCD, GPU_NODES, IMAGE, RDZV_TLS_SECRET

    run = tmp_path / "run"
    run.mkdir(parents=True, exist_ok=True)
    if marker_request is not None:
        (run / f".fabric-passed-uid-1-{marker_request}").touch()
    args = job_args(namespace="training", image=IMAGE, pvc_name="shared", instance_type="p4de.24xlarge", efa=True,
                    node_selector=GPU_NODES, nodes=2, min_nodes=1, rdzv_endpoint=ETCD, rdzv_tls_secret=RDZV_TLS_SECRET,
                    fabric_check=True, run_id="r1", queue=Queued(local_queue="training", priority_class="eks-ddp-normal"))
    script = gate_command(job_info("training", args, trainer_sa="t", worker_sa="w"), ETCD)[2]
    assert "/shared/runs/r1/.fabric-passed-$(JOB_UID)-$(FABRIC_ADMISSION)" in script
    script = script.replace("/shared/runs/r1", str(run)).replace("$(JOB_UID)", "uid-1")
    script = script.replace("$(FABRIC_ADMISSION)", admission or "")
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python").write_text('#!/bin/sh\ncase "$*" in *--node-only*) echo node-only;; *) echo full;; esac\n')
    (fake / "python").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "FABRIC_ADMISSION": admission or ""}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30,
                          check=True).stdout.strip()


def test_a_marker_of_another_admission_leads_to_the_full_check(tmp_path):
    """Kueue readmits an evicted Job (same UID) with a new ProvisioningRequest (<workload>-<check>-<attempt>): the
    marker of attempt 1 must not let attempt 2's new nodes skip the bandwidth check."""
    assert _gate(tmp_path / "a", "wl-gpu-capacity-1", "wl-gpu-capacity-1") == "node-only"  # same admission: a late pod
    assert _gate(tmp_path / "b", "wl-gpu-capacity-2", "wl-gpu-capacity-1") == "full"
    assert _gate(tmp_path / "c", None, "") == "full"  # no annotation: never trusts a marker
    assert _gate(tmp_path / "d", "wl-gpu-capacity-1", None) == "full"


def test_alone_the_fabric_verdict_is_final_before_interpreter_shutdown(tmp_path):
    # As for the trainer (tests/runtime/test_exit_codes.py): shutdown made to abort must not change the Job's verdict.
    proc = subprocess.run([sys.executable, "-m", "tests.support.shutdown_abort_probe", FABRIC_CHECK_MODULE,
                           f"--run-dir={tmp_path}", "--require-efa"],
                          cwd=ROOT, env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == FABRIC_FAILED, proc.stdout + proc.stderr
    assert "FABRIC CHECK FAILED: no EFA devices" in proc.stdout


# --- the real thing: 2 torchrun agents, real etcd, gloo ------------------------------------------------


def _run_agents(tmp: Path, endpoint: str, check: FabricCheckOptions, rdzv_id: str) -> tuple[list[int], list[Agent]]:
    agent = AgentOptions(min_nodes=2, max_nodes=2, nproc_per_node=1, rdzv_backend="etcd",
                         rdzv_endpoint=endpoint, rdzv_id=rdzv_id, max_restarts=0, local_addr="127.0.0.1",
                         timeouts=LOCAL_TIMEOUTS, tls=client_tls(endpoint))
    cmd = fabric_check_command(agent, check, python=sys.executable)
    agents = [Agent(f"{rdzv_id}-{i}", cmd, tmp / f"{rdzv_id}-{i}.log", trainer_env()) for i in range(2)]
    try:
        codes = [a.wait(120) for a in agents]
    finally:
        for a in agents:
            a.stop()
        mark = f"--run-dir={check.run_dir}".encode()
        for pid, _, cmdline in _processes():
            if FABRIC_CHECK_MODULE.encode() in cmdline and mark in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
    return codes, agents


@pytest.mark.slow
def test_two_agents_measure_write_fabric_json_and_fail_without_efa(tmp_path, etcd_endpoint):  # noqa: F811
    run = tmp_path / "run"
    quick = {"iters": 3, "warmup": 1, "factor": 4, "max_bytes": 2 << 20}
    start = time.monotonic()
    marker = tmp_path / ".fabric-passed"
    codes, agents = _run_agents(tmp_path, etcd_endpoint, FabricCheckOptions(run_dir=str(run), pass_marker=str(marker),
                                                                             **quick), "fc-ok")
    assert codes == [0, 0], "\n".join(a.log()[-3000:] for a in agents)
    assert marker.exists()  # the gate of a pod that starts later checks only its node
    marker.unlink()
    report = json.loads((run / fc.FABRIC_JSON).read_text())
    assert report["passed"] is True and report["reasons"] == []
    assert report["world_size"] == 2 and report["nodes"] == 2 and report["backend"] == "gloo"
    assert report["transports"] == ["gloo-tcp"]
    sizes = [r["bytes"] for r in report["results"]]
    assert sizes == fc.sweep(8, 2 << 20, 4)
    for r in report["results"]:
        assert r["time_us"] > 0
        assert r["algbw_gbs"] == pytest.approx(r["bytes"] / (r["time_us"] / 1e6) / 1e9, rel=0.02, abs=1e-4)
        assert r["busbw_gbs"] == pytest.approx(fc.bus_bandwidth(r["algbw_gbs"], 2), abs=1e-3)
    assert report["peak_busbw_gbs"] == max(r["busbw_gbs"] for r in report["results"]) > 0
    [pair] = report["pairs"]  # two nodes: one pair, measured on its own at the largest size
    assert pair["node_ranks"] == [0, 1] and pair["bytes"] == 2 << 20 and pair["busbw_gbs"] > 0
    assert report["slow_nodes"] == []
    table = next(a.log() for a in agents if "FABRIC CHECK" in a.log())
    assert "busbw(GB/s)" in table and "FABRIC CHECK PASSED" in table

    # The same agents asked for EFA on a machine without it: every agent fails, fabric.json says why.
    codes, agents = _run_agents(tmp_path, etcd_endpoint, FabricCheckOptions(
        run_dir=str(run), require_efa=True, min_busbw_gbs=1e6, pass_marker=str(marker), **quick), "fc-efa")
    assert all(c != 0 for c in codes), codes
    assert not marker.exists()
    report = json.loads((run / fc.FABRIC_JSON).read_text())
    assert report["passed"] is False
    assert [r.split(":")[0] for r in report["reasons"]] == [
        "no EFA devices in the pod on " + os.uname().nodename + " (/dev/infiniband/uverbs* missing)",
        "transport is not OFI/EFA", "low bandwidth", f"slow pair {os.uname().nodename} - {os.uname().nodename}"]
    print(f"[measure] fabric_check_two_runs={time.monotonic() - start:.1f}s")


def test_every_efa_type_has_a_cited_floor():
    from eks_ddp.core import catalog

    efa_types = {n for n in catalog.gpu_types() if catalog.CATALOG[n].has_efa}
    assert set(catalog.NETWORK_GBPS) == efa_types
    for name in efa_types:
        source = catalog.fabric_floor_source(name)
        if name in catalog.PUBLISHED_BUSBW_GBS:
            assert catalog.fabric_floor_gbs(name) == pytest.approx(catalog.PUBLISHED_BUSBW_GBS[name][0] * 0.6, abs=0.01)
            assert "awsome-distributed-training" in source and "published" in source
        else:
            assert catalog.fabric_floor_gbs(name) == pytest.approx(catalog.NETWORK_GBPS[name] / 8 / 4)
            assert "modelled" in source and "Gbps" in source
    assert catalog.fabric_floor_gbs("g4dn.xlarge") is None


@pytest.mark.parametrize(("name", "published"), [("p4de.24xlarge", 76.79), ("p4d.24xlarge", 76.79),
                                                 ("p5.48xlarge", 436.95)])
def test_the_floor_fails_a_node_on_one_efa_card_of_four(name, published):
    """The performance review's case: the old floor (line rate / 8 x 0.25 = 12.5 GB/s on p4de) passed a node whose
    traffic runs over one EFA card of four (about a quarter of the published 76.8 GB/s); the floor near the published
    figure fails it, and two cards of four, and passes a healthy pair (the published figure itself)."""
    from eks_ddp.core import catalog

    floor = catalog.fabric_floor_gbs(name)
    one_card, two_cards = published / 4, published / 2
    assert 12.5 < one_card  # the old p4de floor let it pass
    ranks = [_rank("node-a", "efa", 4, 0), _rank("node-b", "efa", 4, 1)]
    assert fc.evaluate(ranks, [_result(one_card)], require_efa=True, floor_busbw_gbs=floor)
    assert fc.evaluate(ranks, [_result(two_cards)], require_efa=True, floor_busbw_gbs=floor)
    assert fc.evaluate(ranks, [_result(published)], require_efa=True, floor_busbw_gbs=floor) == []
