"""The agents' command line (training/runtime/eks_ddp_runtime/launch_command.py), as a pure function: the flags the
launcher gets, and what a run's ``rdzvBackend`` becomes there."""

from __future__ import annotations

import pytest

from eks_ddp_runtime.launch_command import (
    ETCD_BACKEND,
    AgentOptions,
    FabricCheckOptions,
    fabric_check_command,
    job_command,
    torchrun_args,
)
from eks_ddp_trainer.config import TrainerConfig


def agent(backend: str) -> AgentOptions:
    return AgentOptions(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend=backend, rdzv_endpoint="etcd:2379",
                        rdzv_id="r")


def rdzv_flags(backend: str) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in torchrun_args(agent(backend)))


def test_launched_by_the_training_command_builder():
    agent = AgentOptions(min_nodes=2, max_nodes=2, nproc_per_node=8, rdzv_backend="etcd",
                         rdzv_endpoint="etcd:2379", rdzv_id="$(JOB_UID)", max_restarts=0)
    check = fabric_check_command(agent, FabricCheckOptions(run_dir="/shared/runs/r1", require_efa=True,
                                                           min_busbw_gbs=12.5))
    train = job_command(agent, TrainerConfig(data_dir="/shared/data", run_dir="/shared/runs/r1"))
    # Same torchrun flags as training; only the module and its arguments differ.
    assert check[:check.index("-m", 3)] == train[:train.index("-m", 3)]
    assert check[check.index("-m", 3):] == ["-m", "eks_ddp_runtime.fabric_check", "--run-dir=/shared/runs/r1",
                                         "--require-efa", "--min-busbw-gbs=12.5"]


@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_the_stack_value_etcd_is_the_runtimes_v3_backend(backend):
    """``rdzvBackend: etcd`` (and ``etcd-v2``, its old name) is the handler the runtime registers, with the client
    certificate; never torch's own ``etcd``/``etcd-v2`` backends, whose store is etcd's v2 API."""
    from eks_ddp_runtime.rendezvous.handler import BACKEND

    f = rdzv_flags(backend)
    assert f["rdzv-backend"] == ETCD_BACKEND == BACKEND
    assert "ssl_cert=" in f["rdzv-conf"] and "protocol=https" in f["rdzv-conf"]


def test_c10d_is_passed_through_without_certificates_and_an_unknown_value_is_refused():
    f = rdzv_flags("c10d")  # control: c10d keeps its name and takes no client certificate
    assert f["rdzv-backend"] == "c10d" and "ssl_cert" not in f["rdzv-conf"]
    with pytest.raises(ValueError, match="rdzv_backend: got 'zk'; expected 'etcd' or 'c10d'"):
        torchrun_args(agent("zk"))


def test_the_library_name_re_exports_the_runtime_builder():
    """``eks_ddp.core.launch_command`` keeps programs written against it working: every name of the runtime's module,
    as the same object (nothing is defined twice)."""
    import eks_ddp.core.launch_command as library
    import eks_ddp_runtime.launch_command as runtime

    assert library.__all__ == runtime.__all__
    for name in library.__all__:
        assert getattr(library, name) is getattr(runtime, name), name


def test_the_runtime_builder_takes_any_trainer_flags():
    """job_command needs only the config's flags(): the runtime imports nothing of the bundled trainer."""

    class Flags:
        def flags(self) -> list[str]:
            return ["--epochs=1"]

    cmd = job_command(agent("etcd"), Flags())
    assert cmd[-3:] == ["-m", "eks_ddp_trainer.train", "--epochs=1"]
