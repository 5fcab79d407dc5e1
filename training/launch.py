"""The elastic agent: ``python -m training.launch <torchrun flags> -m training.train <trainer flags>``.

torch's torchrun with the job semantics a Kubernetes Job needs (the pod's exit code is the contract,
see training/exitcodes.py and the Job's pod failure policy):

* **0** when the run finished, also for an agent that arrives after it finished (a replacement pod
  for a lost node): it finds the rendezvous closed and has nothing left to do;
* a **FATAL** code (training/exitcodes.py) as soon as one local worker exits with it: a retry cannot
  fix a config error, a divergence or unreadable input, so no worker restart is spent on it;
* **1** when the fault budget (``--max-restarts``) is spent. The rendezvous stays open: only a finished
  run closes it (training/rendezvous.py), so a retried pod or the surviving agents carry on.

Flags are torchrun's; use ``--rdzv-backend=eks-etcd`` for the store-restart-tolerant etcd backend.
"""

from __future__ import annotations

import logging
import os
import sys

from torch.distributed import run as torchrun
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.elastic.rendezvous.api import RendezvousClosedError
from torch.distributed.launcher import api as launcher_api

from . import rendezvous
from .exitcodes import FATAL

log = logging.getLogger("training.launch")
FAILED = 1


FORK_ENV = "EKS_DDP_FORK_WORKERS"
"""``0`` starts each worker as a fresh ``python -m`` process (torchrun's way) instead of forking it."""


def _run_module(module: str, *argv: str) -> None:
    """A forked worker: run ``python -m module argv`` in this (already warm) interpreter."""
    import runpy

    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def warm_workers(config: launcher_api.LaunchConfig, entrypoint, args: list[str]):
    """Fork workers from the agent, which has torch and the trainer imported already, instead of starting
    a new interpreter per worker: a restart then costs no import time (seconds on a busy node)."""
    if os.environ.get(FORK_ENV, "1") == "0" or entrypoint != sys.executable or "-m" not in args:
        return entrypoint, args
    module, argv = args[args.index("-m") + 1], args[args.index("-m") + 2:]
    import importlib

    importlib.import_module(module)  # imported once here; every fork inherits it
    config.start_method = "fork"
    return _run_module, [module, *argv]


class Agent(LocalElasticAgent):
    """LocalElasticAgent that stops restarting at once when a worker exits with a FATAL code."""

    fatal_code: int | None = None

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if result.is_failed():
            fatal = sorted({f.exitcode for f in result.failures.values() if f.exitcode in FATAL})
            if fatal:
                self.fatal_code = fatal[0]
                self._remaining_restarts = 0  # _invoke_run then stops the workers and returns the failure
                log.error("worker exited with fatal code %s (training/exitcodes.py): not restarting", fatal[0])
        return result


def launch(config: launcher_api.LaunchConfig, entrypoint, args: list[str]) -> int:
    """Run one agent until the run ends; returns the process exit code."""
    rendezvous.register()
    params = RendezvousParameters(backend=config.rdzv_backend, endpoint=config.rdzv_endpoint,
                                  run_id=config.run_id, min_nodes=config.min_nodes, max_nodes=config.max_nodes,
                                  local_addr=config.local_addr, **config.rdzv_configs)
    master_addr, master_port = launcher_api._get_addr_and_port(params)
    spec = WorkerSpec(
        role=config.role, local_world_size=config.nproc_per_node, entrypoint=entrypoint, args=tuple(args),
        rdzv_handler=rdzv_registry.get_rendezvous_handler(params), max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval, master_addr=master_addr, master_port=master_port,
        local_addr=config.local_addr,
    )
    agent = Agent(spec=spec, logs_specs=config.logs_specs, start_method=config.start_method,
                  log_line_prefix_template=config.log_line_prefix_template,
                  shutdown_timeout=config.shutdown_timeout)
    finished = False
    try:
        result = agent.run()
        finished = not result.is_failed()
    except RendezvousClosedError:
        # Only a finished run closes the rendezvous (training/rendezvous.py): nothing left to do.
        log.info("rendezvous %s is closed: the run already finished; exiting 0", config.run_id)
        return 0
    finally:
        if finished:
            rendezvous.allow_close()
        # Closes the rendezvous only after success; otherwise it just stops this node's heartbeats.
        spec.rdzv_handler.shutdown()
    if finished:
        return 0
    for rank, failure in sorted(result.failures.items()):
        log.error("worker rank %s (local %s) failed: exitcode %s", rank, failure.local_rank, failure.exitcode)
    if agent.fatal_code is not None:
        return agent.fatal_code
    log.error("fault budget spent (--max-restarts=%s); the rendezvous stays open for a retry", config.max_restarts)
    return FAILED


def main(argv: list[str] | None = None) -> int:
    # Each restart gets fresh worker-group store addresses (pytorch#135712).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    logging.basicConfig(level=logging.INFO, format="[launch] %(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # Rendezvous rounds and restarts in the pod log (torch's elastic loggers default to WARNING).
    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "training"):
        logging.getLogger(name).setLevel(logging.INFO)
    args = torchrun.parse_args(argv)
    config, entrypoint, cmd_args = torchrun.config_from_args(args)
    entrypoint, cmd_args = warm_workers(config, entrypoint, cmd_args)
    return launch(config, entrypoint, cmd_args)


if __name__ == "__main__":
    raise SystemExit(main())
