"""The local runner's command line (``python -m eks_ddp_local --help``) and ``--resume``'s saved settings."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from eks_ddp_runtime.launch_command import DEFAULT_MAX_RESTARTS

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        # One line, not the 25-line usage: the flag and what is wrong with it.
        self.exit(2, f"{self.prog}: {message} (--help lists the flags)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    import sys

    from eks_ddp_trainer.config import (
        MODELS,  # the trainer's own list: a bad --model fails here, before anything starts
    )

    argv = list(sys.argv[1:] if argv is None else argv)
    user_args: list[str] = []
    if "--" in argv:  # everything after "--" belongs to the user's module or script
        i = argv.index("--")
        argv, user_args = argv[:i], argv[i + 1:]
    p = _Parser(prog="eks-ddp-local", description="Run the cluster's elastic training job on this "
                "machine: etcd, torchrun agents and the trainer, then the evaluation table and a plot. With "
                "--module or --script, your own training code instead: eks-ddp-local --module pkg.train -- ARGS")
    arg = p.add_argument
    own = p.add_mutually_exclusive_group()
    own.add_argument("--module", metavar="PKG.MOD", help="your own module, run in each worker as python -m PKG.MOD "
                     "ARGS (importable from the current folder); its arguments follow --")
    own.add_argument("--script", metavar="PATH", help="your own script, run in each worker as python PATH ARGS; its "
                     "arguments follow --")
    arg("--agents", type=int, default=2, help="torchrun agents, the cluster's nodes (2)")
    arg("--min-agents", type=int, help="agents the rendezvous needs (default: --agents)")
    arg("--nproc-per-node", type=int, default=1, help="trainer workers per agent (1)")
    arg("--rdzv", choices=("etcd", "c10d"), default="etcd", help="rendezvous: etcd (v3 API, as on the cluster) or c10d")
    arg("--data", type=Path, help="folder holding cifar-10-batches-py (default ./data; generated data when absent)")
    arg("--synthetic", action="store_true", help="use generated data even when CIFAR-10 is there")
    arg("--synthetic-train", type=int, default=4096, help="generated training images (4096)")
    arg("--synthetic-test", type=int, default=1024, help="generated test images (1024)")
    arg("--out", type=Path, default=Path("demo-out"), help="output folder; each run gets <out>/<run-id>/ (demo-out)")
    arg("--resume", type=Path, metavar="RUN_DIR", help="resume an interrupted run from its folder (<out>/<run-id>) "
        "with its own settings, from its newest checkpoint")
    arg("--epochs", type=int, default=4, help="(4)")
    arg("--global-batch-size", type=int, default=256, help="images per step over all workers (256)")
    arg("--bn-group", type=int, default=16, help="images per BatchNorm group; the workers share a step's groups (16)")
    arg("--model", default="airnet", help=f"{', '.join(sorted(MODELS))} (airnet)")
    arg("--width", type=int, default=8, help="airnet/resnet-small base width; small is fast on a CPU (8)")
    arg("--max-steps", type=int, help="stop after this many steps")
    arg("--log-every", type=int, default=5, help="steps between log records (5)")
    arg("--checkpoint-every", type=int, default=10, help="steps between checkpoints (10)")
    arg("--max-restarts", type=int, default=DEFAULT_MAX_RESTARTS,
        help=f"worker-group restarts each agent allows ({DEFAULT_MAX_RESTARTS})")
    arg("--seed", type=int, default=0)
    arg("--kill-worker-at-step", type=int, metavar="N", help="SIGKILL one trainer worker at step N to show recovery")
    arg("--kill-agent-at-step", type=int, metavar="N", help="SIGKILL the last agent and its workers at step N "
        "(a lost node; with --min-agents below --agents the others finish the job)")
    arg("--kill-worker-after", type=float, metavar="S", help="SIGKILL one worker S seconds after the agents start (your "
        "own code too), to see it recover")
    arg("--kill-agent-after", type=float, metavar="S", help="SIGKILL the last agent and its workers S seconds after the "
        "agents start (your own code too): a lost node")
    arg("--timeout", type=float, default=900, help="seconds before the run is stopped (900)")
    args = p.parse_args(argv)
    args.user_args = user_args
    if args.resume is not None:
        args = _resumed(p, args)
    if user_args and not (args.module or args.script):
        p.error(f"arguments after --: got {' '.join(user_args)!r}; expected them only with --module or --script")
    if args.module and not _MODULE.match(args.module):
        p.error(f"--module: got {args.module!r}; expected a dotted module name such as mypkg.train")
    if args.module:  # found as python -m would find it in the workers, importing none of it (training/runtime/eks_ddp_runtime/modules.py)
        from eks_ddp_runtime.modules import module_problem

        problem = module_problem(args.module)
        if problem:
            p.error(f"--module: {problem}")
    if args.script and not Path(args.script).is_file():
        p.error(f"--script: got {args.script!r}; expected a Python file (no such file)")
    if (args.module or args.script) and args.kill_worker_at_step is not None:
        p.error("--kill-worker-at-step: the step comes from the bundled trainer's records; with your own code use "
                "--kill-worker-after SECONDS")
    if (args.module or args.script) and args.kill_agent_at_step is not None:
        p.error("--kill-agent-at-step: the step comes from the bundled trainer's records; with your own code use "
                "--kill-agent-after SECONDS")
    if args.kill_agent_at_step is not None and args.kill_agent_after is not None:
        p.error("--kill-agent-after: not with --kill-agent-at-step; expected one of them")
    if args.model not in MODELS:
        p.error(f"--model {args.model}: unknown; expected one of {', '.join(sorted(MODELS))}")
    for name in ("agents", "nproc_per_node", "epochs", "global_batch_size", "bn_group"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be >= 1")
    if args.min_agents is not None and not 1 <= args.min_agents <= args.agents:
        p.error("--min-agents: must be between 1 and --agents")
    return args


RUN_FILE = "run.json"
"""The run's settings, in its folder: what ``--resume`` restarts it with."""
_NOT_RESUMED = ("resume", "timeout", "kill_worker_at_step", "kill_agent_at_step", "kill_worker_after", "kill_agent_after",
                "out")


def _resumed(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    saved_file = args.resume / RUN_FILE
    try:
        saved = json.loads(saved_file.read_text())
    except (OSError, ValueError) as err:
        p.error(f"--resume {args.resume}: not a local run's folder ({saved_file}: {err})")
    out = vars(args).copy()
    for key, value in saved.items():
        if key in out and key not in _NOT_RESUMED:
            out[key] = Path(value) if key == "data" and value is not None else value
    out["kill_worker_at_step"] = out["kill_agent_at_step"] = out["kill_worker_after"] = None  # not repeated
    out["kill_agent_after"] = None
    return argparse.Namespace(**out)
