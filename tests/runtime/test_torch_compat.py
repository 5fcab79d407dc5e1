"""The runtime's declared torch range (training/runtime/eks_ddp_runtime/compat.py): refused outside it at start with one line, and
what differs inside it detected from the torch at hand. ``make test-compat`` runs this file (and the user example
under the real launcher with real etcd) on the oldest supported torch; ``make test`` on the newest."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.launcher.api import LaunchConfig

from eks_ddp_runtime import compat, launch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version,ok", [("2.14.1+cu130", True), ("2.11.0", True), ("2.12.0a0+git1234", True),
                                        ("2.13.0+cpu", True), ("2.10.2", False), ("2.15.0", False),
                                        ("3.0.0", False), ("nightly", False), ("1.13.1", False)])
def test_the_supported_range_is_2_11_to_2_14(version, ok):
    problem = compat.torch_problem(version)
    assert (problem is None) == ok, problem
    if not ok:
        assert "\n" not in problem and version in problem and "supported: torch 2.11 to 2.14" in problem


def test_this_torch_is_inside_the_range():
    assert compat.torch_problem(torch.__version__) is None, torch.__version__


def _fake_torch(tmp_path: Path, version: str) -> dict[str, str]:
    """An environment whose ``import torch`` finds a package that has only a version (what the check reads
    before any torch internal)."""
    pkg = tmp_path / "faketorch" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "faketorch"), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.mark.parametrize("version", ["2.10.2", "2.15.0"])
def test_the_launcher_refuses_an_unsupported_torch_with_one_line_and_exit_2(tmp_path, version):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    proc = subprocess.run([sys.executable, "-m", "eks_ddp_runtime.launch", "--nnodes=1", "--nproc-per-node=1",
                           str(script)], env=_fake_torch(tmp_path, version), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == compat.USAGE == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert f"torch {version} is not supported" in proc.stderr and "torch 2.11 to 2.14" in proc.stderr
    assert "never runs" not in proc.stdout


def test_importing_the_launcher_under_an_unsupported_torch_raises_import_error_naming_the_range(tmp_path):
    code = ("try:\n    import eks_ddp_runtime.launch\nexcept ImportError as e:\n    print('IMPORT-ERROR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=_fake_torch(tmp_path, "2.9.1"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert "IMPORT-ERROR eks_ddp_runtime: torch 2.9.1 is not supported" in proc.stdout, proc.stdout + proc.stderr


# A LaunchConfig and agent shaped like torch 2.11's (pytorch/pytorch v2.11.0 torch/distributed/launcher/api.py and
# torch/distributed/elastic/agent/server/local_elastic_agent.py): no shutdown_timeout anywhere.
LaunchConfig211 = dataclasses.make_dataclass(
    "LaunchConfig211", [(f.name, f.type, f) for f in dataclasses.fields(LaunchConfig) if f.name != "shutdown_timeout"])


class Agent211(launch.Agent):
    def __init__(self, spec, logs_specs, start_method="spawn", exit_barrier_timeout: float = 300,
                 log_line_prefix_template: str | None = None):
        super().__init__(spec, logs_specs, start_method, exit_barrier_timeout, log_line_prefix_template)


def _config(cls=LaunchConfig):
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {"min_nodes": 1, "max_nodes": 1, "nproc_per_node": 1, "run_id": "t", "rdzv_backend": "static",
          "rdzv_endpoint": "127.0.0.1:29999"}
    return cls(**{k: v for k, v in kw.items() if k in fields})


def test_shutdown_timeout_is_passed_only_where_config_and_agent_both_have_it():
    new, old = _config(), _config(LaunchConfig211)
    assert not hasattr(old, "shutdown_timeout")
    assert "shutdown_timeout" not in compat.agent_kwargs(old, Agent211)
    assert "shutdown_timeout" not in compat.agent_kwargs(new, Agent211)  # a 2.14 config, a 2.11-shaped agent
    assert "shutdown_timeout" not in compat.agent_kwargs(old, LocalElasticAgent)
    has = compat.accepts(LocalElasticAgent.__init__, "shutdown_timeout")
    assert ("shutdown_timeout" in compat.agent_kwargs(new, LocalElasticAgent)) == has
    if torch.__version__.startswith("2.14"):
        assert has and compat.agent_kwargs(new, launch.Agent)["shutdown_timeout"] == new.shutdown_timeout


def test_the_launchers_agent_builds_from_a_2_11_shaped_config(monkeypatch):
    """The launcher's own construction path (launch.make_agent) with torch 2.11's LaunchConfig and agent signature:
    on the old code it passed config.shutdown_timeout, an AttributeError there."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec

    monkeypatch.setattr(launch, "Agent", Agent211)
    config = _config(LaunchConfig211)
    params = RendezvousParameters(backend="static", endpoint="127.0.0.1:29999", run_id="t", min_nodes=1,
                                  max_nodes=1, rank=0)
    addr, port = compat.addr_and_port(params)
    spec = WorkerSpec(role="trainer", local_world_size=1, entrypoint=sys.executable, args=("-c", "pass"),
                      rdzv_handler=None, master_addr=addr, master_port=port)
    agent = launch.make_agent(spec, config)
    assert isinstance(agent, Agent211) and agent._remaining_restarts == spec.max_restarts


def test_the_master_address_rule_without_torchs_private_helper(monkeypatch):
    from torch.distributed.launcher import api as launcher_api

    static = RendezvousParameters(backend="static", endpoint="10.0.0.1:29500", run_id="t", min_nodes=1, max_nodes=1)
    etcd = RendezvousParameters(backend="etcd-v2", endpoint="127.0.0.1:2379", run_id="t", min_nodes=1, max_nodes=1)
    with_torch = compat.addr_and_port(static), compat.addr_and_port(etcd)
    monkeypatch.delattr(launcher_api, "_get_addr_and_port")
    assert (compat.addr_and_port(static), compat.addr_and_port(etcd)) == with_torch == (("10.0.0.1", 29500), (None, None))
    bad = RendezvousParameters(backend="static", endpoint="10.0.0.1", run_id="t", min_nodes=1, max_nodes=1)
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        compat.addr_and_port(bad)


def test_a_private_name_this_torch_lacks_is_named_with_the_range():
    class Handler:  # a torch whose rendezvous handler moved _state_holder
        _op_executor = object()

    with pytest.raises(RuntimeError, match=r"Handler has no _state_holder in torch .*; supported: torch 2.11 to 2.14"):
        compat.require(Handler(), "_op_executor", "_state_holder")
    assert compat.in_bad_fork() is False  # this process never initialised CUDA


def test_the_private_names_the_rendezvous_uses_exist_in_this_torch():
    """The guards pass on this torch (the real handler; make test-compat runs this on the oldest torch)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from eks_ddp_runtime.rendezvous import handler as rendezvous

    compat.require(dynamic_rendezvous, "_delay")
    compat.require(dynamic_rendezvous._BackendRendezvousStateHolder, "_sanitize")
    compat.require(rendezvous.ElasticHandler, "_keep_alive", "_stop_heartbeats", "num_nodes_waiting")
