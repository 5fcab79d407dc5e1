"""The ``eks-ddp`` command line: its subcommands over a local run's directory or a cluster run (``eks-ddp --help``
and ``eks-ddp <command> --help`` say what each does)."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from eks_ddp.tooling.runs import kubectl
from eks_ddp.tooling.runs.kubectl import CliError, ClusterRun
from eks_ddp.tooling.runs.status import Status, is_run_dir, local_status, log_files, pods, runner_alive

DEFAULT_RUNS = Path("demo-out")
"""eks-ddp-local's default ``--out``."""
FOLLOW_POLL_S = 0.5


def _say(text: str) -> None:
    print(f"[eks-ddp] {text}", file=sys.stderr, flush=True)


def local_runs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if is_run_dir(p)) if root.is_dir() else []


def resolve(o: argparse.Namespace) -> Path | ClusterRun:
    """The run ``o.run`` names: a local run's directory, or a cluster run of the stack (CliError listing the
    known runs when it is neither)."""
    given = Path(o.run)
    if given.is_dir():
        if not is_run_dir(given):
            raise CliError(f"RUN: got {o.run!r}, a folder without a run's files; expected a run's directory "
                           "(logs/, result.json, eks-ddp-final.json) or a run id", 2)
        return given
    if "/" not in o.run and is_run_dir(o.runs / o.run):
        return o.runs / o.run
    outputs_error = None
    outputs: dict = {}
    try:
        outputs = kubectl.stack_outputs(o.stack, o.outputs)
    except CliError as e:
        outputs_error = str(e)
    found = outputs.get("runs")
    runs: dict = found if isinstance(found, dict) else {}
    if o.run in runs:
        return ClusterRun(o.run, runs[o.run])
    local = local_runs(o.runs)
    known = [f"local ({o.runs}): {', '.join(local) if local else 'none'}",
             f"cluster: {', '.join(sorted(runs)) if runs else 'none'}"
             + (f" (stack outputs not read: {outputs_error})" if outputs_error else "")]
    raise CliError(f"RUN: got {o.run!r}, an unknown run; expected a run's directory or one of these run ids: "
                   + "; ".join(known), 2)


def cache_dir(o: argparse.Namespace, run: ClusterRun) -> Path:
    return o.cache or Path("results") / run.run_id


def cluster_status(o: argparse.Namespace, run: ClusterRun) -> Status:
    state = kubectl.job_state(run)
    dest = cache_dir(o, run)
    missing = kubectl.fetch_logs(run, dest, _say)
    status = local_status(dest, run.run_id)
    if state is not None:
        status.state, status.because = state
    elif status.state in ("unknown", "running"):
        status.because = f"Job {run.job} is gone and " + status.because
    if missing:
        status.logs_missing, status.cause, status.others = missing, None, []
    status.logs = dest / "logs"
    return status


def cmd_status(o: argparse.Namespace) -> int:
    run = resolve(o)
    status = local_status(run) if isinstance(run, Path) else cluster_status(o, run)
    print(json.dumps(status.as_dict(), indent=2) if o.json else status.render())
    return 1 if status.state == "failed" else 0


def _print_files(files: list[Path], tail: int | None) -> dict[Path, int]:
    """Each file under a header, whole or its last ``tail`` lines; returns the sizes printed up to."""
    seen = {}
    for f in files:
        print(f"==> {f} <==", flush=True)
        data = f.read_bytes()
        seen[f] = len(data)
        if tail is not None:
            data = b"".join(data.splitlines(keepends=True)[-tail:]) if tail else b""
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.flush()
    return seen


def _follow(run_dir: Path, rank: int | None, seen: dict[Path, int]) -> None:
    """Print what the kept logs gain while the local runner runs (files that appear included)."""
    logs = run_dir / "logs"
    last: Path | None = None
    while True:
        running = runner_alive(run_dir) is not None
        for f in log_files(logs, rank):
            size = f.stat().st_size
            if size < seen.get(f, 0):  # rotated: the file started again
                seen[f] = 0
            if size > seen.get(f, 0):
                with open(f, "rb") as fh:
                    fh.seek(seen.get(f, 0))
                    data = fh.read(size - seen.get(f, 0))
                if f != last:
                    print(f"==> {f} <==", flush=True)
                    last = f
                sys.stdout.write(data.decode("utf-8", "replace"))
                sys.stdout.flush()
                seen[f] = size
        if not running:
            return
        time.sleep(FOLLOW_POLL_S)


def cmd_logs(o: argparse.Namespace) -> int:
    run = resolve(o)
    if isinstance(run, ClusterRun):
        state = kubectl.job_state(run)
        if o.follow and state is not None and state[0] == "running":
            if o.rank is None:
                follow = str(run.entry.get("follow") or "")
                return subprocess.call(shlex.split(follow)) if follow else 1
            pod = kubectl.running_pod(run)
            if pod is not None:
                return subprocess.call(run.kubectl("exec", pod, "-c", "trainer", "--", "sh", "-c",
                                                   f'exec tail -n +1 -F "$1"/*/rank-{o.rank}.log', "sh",
                                                   str(run.logs["dir"])))
        run_dir = cache_dir(o, run)
        missing = kubectl.fetch_logs(run, run_dir, _say)
        if missing:
            raise CliError(f"run {run.run_id}: the kept logs are missing ({missing})")
    else:
        run_dir = run
    logs = run_dir / "logs"
    if o.follow and isinstance(run, Path):  # just started: its agents' logs appear once they run
        while not pods(logs) and runner_alive(run_dir) is not None:
            time.sleep(FOLLOW_POLL_S)
    if not pods(logs):
        raise CliError(f"run {run_dir.name}: the kept logs are missing ({logs}: no agent's folder)")
    files = log_files(logs, o.rank)
    if not files and o.rank is not None:
        raise CliError(f"--rank: got {o.rank}; expected a rank with a log in {logs} (there: "
                       + ", ".join(sorted({p.name for p in logs.glob('*/rank-*.log')})) + ")", 2)
    seen = _print_files(files, o.tail)
    if o.follow and isinstance(run, Path):
        _follow(run_dir, o.rank, seen)
    return 0


def cmd_cancel(o: argparse.Namespace) -> int:
    run = resolve(o)
    if isinstance(run, ClusterRun):
        line = str(run.entry.get("cancel") or "")
        if not line:
            raise CliError(f"runs.{run.run_id}.cancel: missing from the stack's outputs")
        _say(line)
        return subprocess.call(["sh", "-c", line])
    pid = runner_alive(run)
    if pid is None:
        print(f"run {run.name}: not running (no live local runner in {run / 'pids.json'})")
        return 0
    from eks_ddp_local.procs import alive, send

    send(pid, signal.SIGTERM)  # the runner stops its agents, their workers and etcd (eks_ddp_local/cli.py)
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(pid):
        raise CliError(f"run {run.name}: the local runner (pid {pid}) still runs 30 s after SIGTERM")
    print(f"run {run.name}: cancelled (the local runner, pid {pid}, stopped its agents and workers)")
    return 0


def cmd_fetch(o: argparse.Namespace) -> int:
    run = resolve(o)
    if isinstance(run, Path):
        print(f"run {run.name}: a local run; its files are in {run.resolve()}")
        return 0
    out = o.out or cache_dir(o, run)
    missing = kubectl.fetch_logs(run, out, _say)
    print(f"[fetch] kept logs: {'missing (' + missing + ')' if missing else out / 'logs'}", flush=True)
    line = shlex.split(str(run.entry.get("fetchResults") or ""))
    if not line:
        raise CliError(f"runs.{run.run_id}.fetchResults: missing from the stack's outputs")
    args = line[1:]
    if "--out" in args:
        i = args.index("--out")
        del args[i:i + 2]
    # The stack's own fetchResults command (eks_ddp_local/fetch_results.py: the results, the table, the curve),
    # run as a process: the library never imports the local runner (pyproject's import contracts).
    code = subprocess.call([sys.executable, "-m", "eks_ddp_local.fetch_results", *args, "--out", str(out)])
    return code or (1 if missing else 0)


def cmd_destroy_check(o: argparse.Namespace) -> int:
    """What in the stack's VPC the state does not hold (eks_ddp.tooling.destroy_check); 1 when any of it blocks."""
    from eks_ddp.tooling import destroy_check

    if o.state is not None:
        try:
            state = json.loads(o.state.read_text())
        except (OSError, ValueError) as e:
            raise CliError(f"--state: got {str(o.state)!r} ({e}); expected the JSON of `pulumi stack export`", 2) from None
    else:
        state = kubectl.pulumi_json("export", stack=o.stack)
    vpc, region = destroy_check.state_vpc_and_region(state)
    vpc, region = o.vpc_id or vpc, o.region or region
    if not vpc or not region:
        raise CliError("the state names no VPC or no AWS region (a destroyed stack?); give --vpc-id and --region", 2)
    ec2, elbv2 = _aws_clients(region, o.profile)
    findings = destroy_check.find(ec2, elbv2, vpc, destroy_check.held_ids(state), region)
    print(destroy_check.as_json(findings) if o.json else f"VPC {vpc} ({region}):\n"
          + destroy_check.report(findings, show_all=o.all))
    return 1 if any(f.blocks for f in findings) else 0


def _aws_clients(region: str, profile: str | None):
    import boto3
    from botocore.config import Config

    config = Config(region_name=region, connect_timeout=5, read_timeout=30, retries={"max_attempts": 3,
                                                                                      "mode": "standard"})
    session = boto3.Session(profile_name=profile) if profile else boto3.Session()
    return session.client("ec2", config=config), session.client("elbv2", config=config)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eks-ddp", description="One command per run, for a local run's directory and "
                                "a cluster run alike, working after its pods and nodes are gone.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("run", metavar="RUN", help="a run's directory, or a run id (local, or the stack's runs output)")
    common.add_argument("--runs", type=Path, default=DEFAULT_RUNS, help="where local runs are (eks-ddp-local --out; "
                        "default demo-out)")
    common.add_argument("--stack", help="the Pulumi stack whose outputs name cluster runs (default: the selected one)")
    common.add_argument("--outputs", type=Path, help="a saved `pulumi stack output --json` instead of asking pulumi")
    common.add_argument("--cache", type=Path, help="where a cluster run's kept logs are copied (results/<runId>)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("status", parents=[common], help="running / succeeded / failed, with the cause")
    s.add_argument("--json", action="store_true", help="the status as JSON")
    s.set_defaults(func=cmd_status)
    s = sub.add_parser("logs", parents=[common], help="the kept logs (every agent and rank)")
    s.add_argument("--follow", "-f", action="store_true", help="keep printing while the run runs")
    s.add_argument("--rank", type=int, help="only this global rank's output")
    s.add_argument("--tail", type=int, help="only the last N lines of each file")
    s.set_defaults(func=cmd_logs)
    says = ("stop the run (a local run: SIGTERM to its runner, which stops what it started; a cluster run: the stack's "
            "cancel line, which deletes its Job and sets its state to cancelled in the stack config)")
    s = sub.add_parser("cancel", parents=[common], help=says, description=says[0].upper() + says[1:] + ".")
    s.set_defaults(func=cmd_cancel)
    s = sub.add_parser("fetch", parents=[common], help="a cluster run's results (S3) and kept logs")
    s.add_argument("--out", type=Path, help="local folder (default results/<runId>)")
    s.set_defaults(func=cmd_fetch)
    s = sub.add_parser("destroy-check", help="before pulumi destroy: what in the stack's VPC the state does not hold "
                       "(ENIs, VPC endpoints, security groups, load balancers) and would block the delete")
    s.add_argument("--stack", help="the Pulumi stack (default: the selected one)")
    s.add_argument("--state", type=Path, help="a saved `pulumi stack export` instead of asking pulumi")
    s.add_argument("--vpc-id", help="the VPC (default: the state's)")
    s.add_argument("--region", help="the AWS region (default: the state's AWS provider's)")
    s.add_argument("--profile", help="the AWS profile (the stack's aws:profile)")
    s.add_argument("--all", action="store_true", help="also what goes with its owner")
    s.add_argument("--json", action="store_true", help="the findings as JSON")
    s.set_defaults(func=cmd_destroy_check)
    return p


def main(argv: list[str] | None = None) -> int:
    o = parser().parse_args(argv)
    try:
        code = o.func(o)
        sys.stdout.flush()  # here, where a closed pipe is caught below, not in the interpreter's exit
        return code
    except CliError as e:
        print(f"eks-ddp {o.command}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `eks-ddp status | head`: the reader has gone; say nothing more, as cat and grep do
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's last flush does not fail again
        return 141


if __name__ == "__main__":
    sys.exit(main())
