"""A start failure stops the run at once; real faults are still retried (eks_ddp_runtime/startfail.py).

Real launchers with the Job's agent command (training/runtime/eks_ddp_runtime/launch_command.py, a real etcd with client
certificates, workers forked from the zygote) and a fault budget of 20 restarts: a script whose import fails in
every worker must exit 2 (the usage error's code, fatal in the Job's pod failure policy) after one worker start,
naming the exception, where it used to spend the whole budget. The controls fail once and then succeed: every worker
failing after a step, and one worker failing before its first step while its peer is already in
``init_process_group``; both must be restarted and finish.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eks_ddp_runtime import startfail
from eks_ddp_runtime.podfs import READ_ONLY_ENV
from tests.runtime.test_torchrun_corpus import _finish, _launcher, _start, _worker_starts, etcd  # noqa: F401
from tests.support.etcd_server import ROOT, trainer_env

CORPUS = ROOT / "tests" / "fixtures" / "corpus"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("entry,says", [
    (["scripts/import_error.py"], "ModuleNotFoundError: No module named 'mypkg_that_is_missing'"),
    # the launcher's own look-up turned off (EKS_DDP_CHECK_MODULE=0): python -m's own failure in every worker
    pytest.param(["-m", "userpkg.no_such_module"], "No module named userpkg.no_such_module", marks=pytest.mark.long),
])
def test_an_import_error_in_every_worker_stops_the_run_at_once(entry, says, etcd, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    env = trainer_env({"EKS_DDP_RUN_DIR": str(run_dir), "EKS_DDP_CHECK_MODULE": "0"})
    proc = _start(_launcher(etcd, entry, max_restarts=20), env)
    code, _, err = _finish(proc)
    assert code == 2, err[-3000:]
    records = [json.loads(x) for f in run_dir.glob("logs/*/failures.jsonl") for x in f.read_text().splitlines()]
    assert records and {(r["restart"], r["restarting"]) for r in records} == {(0, False)}, records  # one start
    [line] = [x for x in err.splitlines() if "every worker failed before its first step with the same error" in x]
    assert says in line and "exit 2" in line, err[-3000:]
    [exit_record] = run_dir.glob("logs/*/exit.json")
    doc = json.loads(exit_record.read_text())
    assert doc["exit_code"] == 2 and says in doc["reason"], doc


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", [pytest.param("after_step", marks=pytest.mark.long), "rank1_before_start"])
def test_a_failure_that_is_not_a_start_failure_is_retried(when, etcd, tmp_path):  # noqa: F811
    entry = ["scripts/fails_once.py", str(tmp_path / "failed-once"), when]
    proc = _start(_launcher(etcd, entry, max_restarts=20), trainer_env())
    code, out, err = _finish(proc)
    assert code == 0, err[-3000:]
    assert _worker_starts(err) == 2, err[-3000:]
    assert out.count("[user] rank 0 done") == 1 and "before its first step" not in err, err[-3000:]


def _record(tmp_path, name: str, *, before: bool, transient: bool = False, message: str = "E: x") -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {
        "timestamp": "0", startfail.KEY: {"before_first_step": before, "transient": transient}}}}))
    return str(path)


def test_the_agents_rule_over_the_workers_records(tmp_path):
    same = {0: _record(tmp_path, "a", before=True), 1: _record(tmp_path, "b", before=True)}
    assert startfail.start_failure(same, {0}) == "E: x"
    other = {**same, 1: _record(tmp_path, "c", before=True, message="E: y")}
    assert startfail.start_failure(other, {0}) is None  # not the same error
    later = {**same, 1: _record(tmp_path, "d", before=False)}
    assert startfail.start_failure(later, {0}) is None  # one got past init_process_group
    assert startfail.start_failure({0: _record(tmp_path, "e", before=True, transient=True)}, {0}) is None
    stopped = {**same, 1: str(tmp_path / "none.json")}  # stopped by the agent before it wrote anything
    assert startfail.start_failure(stopped, {0}) == "E: x"
    (tmp_path / "none.json.started").write_text("")  # ... but it was already in init_process_group
    assert startfail.start_failure(stopped, {0}) is None
    assert startfail.start_failure({0: str(tmp_path / "none.json")}, {0}) is None  # killed: no record at all


@pytest.mark.parametrize("error,transient", [
    (ModuleNotFoundError("x"), False), (NameError("x"), False), (FileNotFoundError(2, "x"), False),
    (SystemExit("msg"), False), (RuntimeError("CUDA error"), True), (ConnectionError(), True),
    (TimeoutError(), True), (OSError(5, "EIO"), True), (KeyboardInterrupt(), True),
])
def test_which_errors_can_pass_on_their_own(error, transient):
    assert startfail.transient(error) is transient


def test_a_module_the_workers_would_not_find_is_refused_before_any_worker_starts():
    """``-m userpkg.trian``: exit 2 at once with one line naming it and the module that is there, and the user's
    package is not imported in the agent (its ``__init__`` would print)."""
    cmd = [sys.executable, "-m", "eks_ddp_runtime.launch", "--standalone", "--nproc-per-node=2", "--max-restarts=20",
           "-m", "userpkg.trian", "--lr", "1"]
    proc = subprocess.run(cmd, cwd=CORPUS, env=trainer_env(), capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if "userpkg.trian" in x and "ERROR" in x]
    assert "-m userpkg.trian: got 'userpkg.trian'; expected a module of package 'userpkg'" in line
    assert "did you mean 'userpkg.train'?" in line
    assert "workers are forked" not in proc.stderr and "[user]" not in proc.stdout


@pytest.mark.parametrize("module,says", [
    ("userpkg.train", None),
    ("userpkg.common", None),
    ("userpkg.trian", "no 'trian' in {corpus}/userpkg); did you mean 'userpkg.train'?"),
    ("userpgk.train", "no top-level module or package 'userpgk'); did you mean 'userpkg.train'?"),
    ("userpkg.train.main", "expected 'userpkg.train' to be a package (it is a module, so it has no 'main')"),
    ("userpkg", "'userpkg' is a package and cannot be run with -m"),
    ("json.tool", None),
    ("json.tol", "did you mean 'json.tool'?"),
])
def test_a_module_is_found_as_python_m_finds_it_without_importing_it(module, says, tmp_path):
    """Against the rule's source: ``python -m`` itself in the same folder (exit 0 or "No module named"/"cannot be
    directly executed"), and nothing imported: each package's ``__init__`` here refuses to be imported."""
    guarded = tmp_path / "project"
    shutil.copytree(CORPUS, guarded)
    for init in guarded.rglob("__init__.py"):
        init.write_text("raise SystemExit('imported')\n")
    probe = ("import sys; from eks_ddp_runtime.modules import module_problem as m; p = m(sys.argv[1]); "
             "print(p or 'ok'); sys.exit(0 if p is None else 9)")
    ours = subprocess.run([sys.executable, "-c", probe, module], cwd=guarded, env=trainer_env(), capture_output=True,
                          text=True, timeout=60)
    assert "imported" not in ours.stdout + ours.stderr and ours.returncode in (0, 9), ours.stderr
    # runpy's own look-up (what python -m calls; it imports the parent packages), in the untouched corpus
    python_m = subprocess.run([sys.executable, "-c", f"import runpy; runpy._get_module_details({module!r})"],
                              cwd=CORPUS, env=trainer_env(), capture_output=True, text=True, timeout=60)
    assert (ours.returncode == 0) == (python_m.returncode == 0), (ours.stdout, python_m.stderr[-2000:])
    if says is None:
        assert ours.stdout.strip() == "ok"
    else:
        assert says.format(corpus=guarded) in ours.stdout, ours.stdout


def _after_init(etcd: str, tmp_path, *flags: str) -> tuple[int, int, str, str, Path]:  # noqa: F811
    """scripts/fails_after_init.py under the Job's agent command (2 workers, a budget of 20 restarts), from a copy of
    the corpus whose folder is read-only as the pod's /app is (podfs.py): exit code, rounds, stdout, stderr, run dir."""
    project, state, run_dir = tmp_path / "project", tmp_path / "state", tmp_path / "run"
    shutil.copytree(CORPUS, project)
    state.mkdir()
    env = trainer_env({"EKS_DDP_RUN_DIR": str(run_dir), READ_ONLY_ENV: str(project)})
    cmd = _launcher(etcd, ["scripts/fails_after_init.py", str(state), *flags], max_restarts=20)
    proc = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    code, out, err = _finish(proc, timeout_s=200)
    assert not (project / "checkpoints").exists()
    rounds = (state / "rounds").read_text().count("round\n") if (state / "rounds").exists() else 0
    return code, rounds, out, err, run_dir


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failure_every_round_repeats_after_init_stops_the_run_in_three_rounds(etcd, tmp_path):  # noqa: F811
    """The review's R1: rank 0 creates ./checkpoints after init_process_group, on the read-only root, in every round.
    No start failure (it is past init), yet certain: the same OSError at the same line before any step. The agent
    exits 2 after startfail.REPEATS rounds (it used to spend all 20 restarts), naming the error, the place and the
    fix, in its log and in exit.json."""
    code, rounds, _, err, run_dir = _after_init(etcd, tmp_path)
    assert code == 2, err[-3000:]
    assert rounds == startfail.REPEATS == 3, err[-3000:]
    [line] = [x for x in err.splitlines() if "rounds in a row failed with the same error" in x]
    assert "OSError: [Errno 30] Read-only file system" in line and "'checkpoints'" in line, line
    assert "fails_after_init.py:37" in line and "exit 2" in line and "Fix the code or the path at" in line, line
    assert "before any step completed" in line and "a restart or a resume would repeat it" in line, line
    [exit_record] = run_dir.glob("logs/*/exit.json")
    doc = json.loads(exit_record.read_text())
    assert doc["exit_code"] == 2 and "a failure every round repeats" in doc["reason"], doc
    assert "fails_after_init.py:37" in doc["reason"], doc


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("flags,code,starts", [
    (["--fail-rounds", "2"], 0, 3),  # the same error twice, then gone: retried, and the run finishes
    pytest.param(["--step-first", "--fail-rounds", "4"], 0, 5, marks=pytest.mark.long),  # after a step: retried
])
def test_a_failure_a_restart_can_fix_is_still_retried(flags, code, starts, etcd, tmp_path):  # noqa: F811
    got, rounds, out, err, _ = _after_init(etcd, tmp_path, *flags)
    assert got == code, err[-3000:]
    assert rounds == starts, err[-3000:]
    assert "rounds in a row failed" not in err and out.count("[user] rank 0 done") == 1, err[-3000:]


def test_the_rule_over_consecutive_rounds(tmp_path):
    def rec(name: str, *, message: str = "OSError: x", where: str | None = "/app/train.py:9", stepped: bool = False,
            transient: bool = False) -> str:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": "0", startfail.KEY: {
            "before_first_step": False, "transient": transient, "stepped": stepped, "place": where}}}}))
        return str(path)

    peer = rec("peer", message="RuntimeError: Connection closed by peer", where="/x/c10d.py:1", transient=True)
    one = {0: rec("a"), 1: peer}
    assert startfail.round_failure(one, {0}) == ("OSError: x", "/app/train.py:9")  # a peer noticing does not hide it
    assert startfail.round_failure(one, {0, 1}) == ("OSError: x", "/app/train.py:9")
    assert startfail.round_failure({0: rec("b"), 1: rec("c", where="/app/train.py:10")}, {0}) is None  # two places
    assert startfail.round_failure({0: rec("d", stepped=True)}, {0}) is None  # a step completed: training ran
    (tmp_path / "peer.json.stepped").write_text("")
    assert startfail.round_failure(one, {0}) is None  # ... in a peer too
    assert startfail.round_failure({0: rec("e"), 1: str(tmp_path / "none.json")}, {1}) is None  # killed: no record
    assert startfail.round_failure({0: rec("f", transient=True)}, {0}) is None
    assert startfail.round_failure({0: rec("g", where=None)}, {0}) is None  # no place to compare

    err, other = ("OSError: x", "/app/train.py:9"), ("OSError: y", "/app/train.py:9")
    r = startfail.RepeatedFailure()
    assert [r.add(1, err), r.add(2, err), r.add(3, err)] == [None, None, err]
    r = startfail.RepeatedFailure()
    assert [r.add(1, err), r.add(2, other), r.add(3, err), r.add(4, err)] == [None, None, None, None]  # not the same
    r = startfail.RepeatedFailure()
    assert [r.add(1, err), r.add(2, None), r.add(3, err), r.add(4, err)] == [None, None, None, None]  # broken chain
    r = startfail.RepeatedFailure()
    assert [r.add(1, err), r.add(3, err), r.add(4, err)] == [None, None, None]  # not consecutive starts
