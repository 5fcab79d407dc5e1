"""Users' scripts under ``torchrun`` and under the launcher: the same output, the same success or failure.

The corpus (tests/fixtures/corpus) has the shapes real training code has: a package run with ``-m`` whose module
parses its arguments and reads ``LOCAL_RANK`` at import and imports relatively, a script run by path that imports
a sibling module, ``if __name__ == "__main__"`` guards, ``sys.exit`` with 0, None, 1, 2, other codes and a message,
``os._exit(0)``, an uncaught exception, a SIGTERM handler, and a real gloo all-reduce across 2 processes.

Each case runs twice, with the same flags (one node of 2 workers, no restarts) and the Job's environment
(training/runtime/eks_ddp_runtime/launch_command.py ``AGENT_ENV``): the venv's real ``torchrun`` (c10d rendezvous), and the Job's agent command
(``python -m eks_ddp_runtime.launch``, the eks-etcd rendezvous on a real etcd with client certificates, workers
forked from the zygote as on the cluster). The lines the user's code prints must be the same, and the run must
succeed or fail alike; the launcher's exit code follows its contract on top (exitcodes.py: 2 and 3-5 are passed
on, any other failure is 1, as torchrun's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eks_ddp_local.etcd_server import free_port, start_etcd
from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, AgentOptions, module_command, script_command
from tests.support.etcd_server import ROOT, TORCHRUN, client_tls, trainer_env

CORPUS = ROOT / "tests" / "fixtures" / "corpus"
CONTRACT = {0: 0, 2: 2, 3: 3, 4: 4, 5: 5}
"""The launcher's exit code for a worker's exit status; any other failure is 1."""

# case: (entrypoint and arguments, the worker's exit status)
FAST = {
    "module_reads_args_and_env_at_import": (["-m", "userpkg.train", "--lr", "0.5"], 0),
    "module_usage_error_at_import": (["-m", "userpkg.train", "--lr", "fast"], 2),
    "script_by_path_with_sibling_import": (["scripts/train_script.py", "--steps", "3"], 0),
    "sigterm_handler": (["scripts/sigterm.py"], 1),
}
"""make test: the module-level cases (they fail on a launcher that imports the module in the agent), a script by
path, and a signal handler. Each runs both launchers at once, ~10-20 s on 2 cores."""
LONG = {
    "script_sys_exit_none": (["scripts/train_script.py", "--end", "none"], 0),
    "script_exit_7": (["scripts/train_script.py", "--end", "7"], 7),
    "module_exit_code_3": (["-m", "userpkg.train", "--lr", "0.5", "--exit", "3"], 3),
    "script_exit_1": (["scripts/train_script.py", "--end", "1"], 1),
    "script_exit_2": (["scripts/train_script.py", "--end", "2"], 2),
    "script_exit_256_is_0": (["scripts/train_script.py", "--end", "256"], 0),
    "script_exit_message": (["scripts/train_script.py", "--end", "message"], 1),
    "script_os_exit_0": (["scripts/train_script.py", "--end", "os_exit0"], 0),
    "script_raises": (["scripts/train_script.py", "--end", "raise"], 1),
    "script_missing": (["scripts/no_such_script.py"], 2),
    "module_missing": (["-m", "userpkg.no_such_module"], 1, 2),
}
"""A case's third value: the launcher's code where it differs from the contract's for the worker's status. A module
that cannot be found: the launcher's look-up before any worker starts (eks_ddp_runtime/modules.py) is turned off
here, so that its workers fail as torchrun's do (the package imported, then "No module named"), and the same
failure in every worker before its first step stops the run with 2 (eks_ddp_runtime/startfail.py)."""


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """One real etcd (TLS, client certificates) for every case of this module."""
    with start_etcd(tmp_path_factory.mktemp("etcd")) as endpoint:
        yield endpoint


def _torchrun(entry: list[str]) -> list[str]:
    return [TORCHRUN, "--nnodes=1:1", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=0", "--monitor-interval=0.5",
            "--local-addr=127.0.0.1", *entry]


def _launcher(etcd: str, entry: list[str], *, max_restarts: int = 0) -> list[str]:
    agent = AgentOptions(min_nodes=1, max_nodes=1, nproc_per_node=2, rdzv_backend="etcd", rdzv_endpoint=etcd,
                         rdzv_id=f"corpus-{os.getpid()}-{time.time_ns()}", max_restarts=max_restarts,
                         local_addr="127.0.0.1", timeouts=CLUSTER_TIMEOUTS, tls=client_tls(etcd))
    if entry[0] == "-m":
        return module_command(agent, entry[1], entry[2:], python=sys.executable)
    return script_command(agent, entry[0], entry[1:], python=sys.executable)


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, cwd=CORPUS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _finish(proc: subprocess.Popen[str], timeout_s: float = 150) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args[:4]} did not end in {timeout_s} s\n{err[-3000:]}") from None
    return proc.returncode, out, err


def _user_lines(out: str) -> list[str]:
    # The corpus writes each line in one write (print() writes the text and the newline separately, and two
    # processes that share a pipe can interleave between them, under either launcher).
    return sorted(line for line in out.splitlines() if line.startswith("[user]"))


def run_both(etcd: str, entry: list[str], env: dict[str, str] | None = None):
    """(torchrun's code, its lines, stderr), (the launcher's code, its lines, stderr): both run at once."""
    env = trainer_env({"EKS_DDP_CHECK_MODULE": "0", **(env or {})})
    procs = [_start(_torchrun(entry), env), _start(_launcher(etcd, entry), env)]
    (tc, tout, terr), (lc, lout, lerr) = [_finish(p) for p in procs]
    return (tc, _user_lines(tout), terr), (lc, _user_lines(lout), lerr)


def _check(etcd: str, entry: list[str], worker_status: int, launcher_code: int | None = None) -> None:
    (tc, tlines, terr), (lc, llines, lerr) = run_both(etcd, entry)
    both = f"torchrun rc={tc}\n{terr[-2500:]}\n----- launcher rc={lc}\n{lerr[-2500:]}"
    if "no_such" in " ".join(entry):  # nothing to print: Python's own message, on stderr, under both
        assert "can't open file" in terr and "can't open file" in lerr or "No module named" in terr + lerr, both
    else:
        assert tlines, f"the case printed nothing under torchrun\n{both}"
    assert llines == tlines, f"torchrun printed\n{chr(10).join(tlines)}\nthe launcher\n{chr(10).join(llines)}\n{both}"
    assert (tc == 0) == (worker_status == 0), both
    assert (lc == 0) == (tc == 0), both
    assert lc == (CONTRACT.get(worker_status, 1) if launcher_code is None else launcher_code), both
    assert "workers are forked from a zygote" in lerr, lerr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(FAST))
def test_the_corpus_runs_the_same_under_torchrun_and_the_launcher(case, etcd):
    _check(etcd, *FAST[case])


@pytest.mark.long
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(LONG))
def test_more_exits_run_the_same_under_torchrun_and_the_launcher(case, etcd):
    _check(etcd, *LONG[case])


def _worker_starts(err: str) -> int:
    return err.count("Setting worker0 reply file")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_usage_error_stops_the_run_at_once(etcd):
    """argparse's exit 2 (and a missing script's) is fatal: the Job's restart budget is not spent on it."""
    entry = ["-m", "userpkg.train", "--lr", "fast"]
    proc = _start(_launcher(etcd, entry, max_restarts=20), trainer_env())
    code, out, err = _finish(proc)
    assert code == 2, err[-3000:]
    assert _worker_starts(err) == 1 and "not restarting" in err, err[-3000:]
    assert "invalid float value: 'fast'" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_workloads_own_fatal_code_reaches_the_launcher(etcd):
    """``EKS_DDP_FATAL_EXIT_CODES`` (set by the Job from ``Workload.fatal_exit_codes``) stops the run at once with
    that code; without it the same exit is a transient failure that spends the restart budget."""
    entry = ["scripts/exit_with.py", "7"]
    fatal = _start(_launcher(etcd, entry, max_restarts=20), trainer_env({"EKS_DDP_FATAL_EXIT_CODES": "7,9"}))
    code, _, err = _finish(fatal)
    assert code == 7 and _worker_starts(err) == 1, err[-3000:]
    retried = _start(_launcher(etcd, entry, max_restarts=1), trainer_env())
    code, _, err = _finish(retried)
    assert code == 1 and _worker_starts(err) == 2, err[-3000:]


def test_a_bad_fatal_code_setting_is_a_usage_error(etcd):
    proc = _start(_launcher(etcd, ["scripts/train_script.py"]), trainer_env({"EKS_DDP_FATAL_EXIT_CODES": "7,x"}))
    code, _, err = _finish(proc)
    assert code == 2 and "EKS_DDP_FATAL_EXIT_CODES: got '7,x'; expected comma-separated exit codes" in err, err


def test_the_corpus_is_where_the_cases_point():
    for entry, *_ in (*FAST.values(), *LONG.values()):
        if entry[0] != "-m" and "no_such" not in entry[0]:
            assert (CORPUS / entry[0]).is_file(), entry
    assert (Path(CORPUS) / "userpkg" / "train.py").is_file()


@pytest.mark.parametrize("code", ["None", "0", "1", "2", "7", "256", "-1", "True", "'a message'"])
def test_a_forked_workers_exit_status_is_what_python_exits_with(code):
    """workers.exit_status against the rule's source, a fresh interpreter (CPython's handle_system_exit)."""
    from eks_ddp_runtime.workers import exit_status

    fresh = subprocess.run([sys.executable, "-c", f"import sys; sys.exit({code})"], capture_output=True, text=True,
                           timeout=30)
    assert exit_status(eval(code)) == fresh.returncode  # noqa: S307  (the parametrized literals above)


def test_a_scripts_own_dash_m_argument_is_not_taken_for_a_module():
    from eks_ddp_runtime.workers import Entrypoint, parse_entrypoint

    assert parse_entrypoint(sys.executable, ["-u", "train.py", "-m", "x"]) == Entrypoint("script", "train.py",
                                                                                        ("-m", "x"))
    assert parse_entrypoint(sys.executable, ["-u", "-m", "pkg.train", "--lr", "1"]) == Entrypoint(
        "module", "pkg.train", ("--lr", "1"))
    assert parse_entrypoint("/other/python", ["-u", "train.py"]) is None  # PYTHON_EXEC: another interpreter
    assert parse_entrypoint(sys.executable, ["-u", "train.py", "--local-rank=${local_rank}"]) is None


def test_standalone_runs_as_under_torchrun():
    """torchrun's --standalone (one node, a local c10d store on a free port) is rewritten in torch's ``run()``,
    which the launcher does not call: without the same rewrite the launcher failed with endpoint
    '127.0.0.1:None'. Both launchers, the same script, the same lines and exit status."""
    entry = ["scripts/train_script.py", "--steps", "2"]
    flags = ["--standalone", "--nproc-per-node=2", "--max-restarts=0", "--monitor-interval=0.5"]
    env = trainer_env()
    procs = [_start([TORCHRUN, *flags, *entry], env),
             _start([sys.executable, "-m", "eks_ddp_runtime.launch", *flags, *entry], env)]
    (tc, tout, terr), (lc, lout, lerr) = [_finish(p) for p in procs]
    assert (tc, lc) == (0, 0), (terr[-2000:], lerr[-2000:])
    assert _user_lines(lout) == _user_lines(tout) != [], (tout, lout)
