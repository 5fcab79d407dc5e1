"""``eks-ddp status|logs|cancel|fetch RUN`` (components/eks_ddp/tooling/runs/): the run's state and cause from its kept logs,
for a local run's directory and for a cluster run named in the stack's outputs.

The cluster path needs kubectl, pulumi and S3, which this machine lacks: the commands run against a fake
``kubectl`` and ``pulumi`` on PATH (scripts that record their arguments; the fake kubectl runs the exact ``sh -c``
tar script the command sends into the pod, on a local folder standing in for the run's directory) and moto's S3.
The ``runs`` entry comes from the dev stack's own outputs (the program under mocks): what ``pulumi up`` exports
is what the command reads.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eks_ddp.tooling.runs import cli, kubectl
from eks_ddp.tooling.runs.status import local_status
from eks_ddp_runtime import runlogs

FAKE_KUBECTL = r'''
import json, os, subprocess, sys
scenario = json.load(open(os.environ["FAKE_SCENARIO"]))
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\n")
args = sys.argv[1:]
if os.path.basename(sys.argv[0]) == "pulumi":
    if args[:3] == ["stack", "output", "--json"]:
        print(json.dumps(scenario["outputs"]))
    sys.exit(0)
if args[:1] == ["-n"]:
    args = args[2:]
if args[:2] == ["get", "job"]:
    if scenario.get("job") is None:
        sys.exit(sys.stderr.write('Error from server (NotFound): jobs.batch "%s" not found\n' % args[2]) and 1)
    print(json.dumps(scenario["job"]))
elif args[:2] == ["get", "workloads.kueue.x-k8s.io"]:
    items = scenario.get("workloads", [])
    if "-l" in args:  # key=value, as kubectl's label selector
        key, _, value = args[args.index("-l") + 1].partition("=")
        items = [w for w in items if (w.get("metadata", {}).get("labels") or {}).get(key) == value]
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
elif args[:2] in (["get", "localqueues.kueue.x-k8s.io"], ["get", "clusterqueues.kueue.x-k8s.io"]):
    doc = scenario.get(args[1].split(".")[0][:-1])  # localqueue / clusterqueue
    if doc is None:
        sys.exit(sys.stderr.write('Error from server (NotFound): %s "%s" not found\n' % (args[1], args[2])) and 1)
    print(json.dumps(doc))
elif args[:2] == ["get", "pods"] and args[-2:] == ["-o", "json"]:
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": scenario.get("pods", [])}))
elif args[:2] == ["get", "pods"]:
    print(" ".join(scenario.get("running", [])))
elif args[:2] == ["get", "--raw"]:
    if scenario.get("pending") is None:
        sys.exit(sys.stderr.write("Error from server (ServiceUnavailable): the server is currently unable to "
                                  "handle the request\n") and 1)
    print(json.dumps(scenario["pending"]))
elif args[:1] == ["exec"]:
    cmd = args[args.index("--") + 1:]
    cmd[-1] = scenario["volume"]  # the run's directory in the pod -> the local stand-in
    sys.exit(subprocess.run(cmd).returncode)
elif args[:1] not in (["run"], ["wait"], ["delete"], ["patch"]):
    sys.exit(99)
'''


def _record(pod: Path, doc: dict) -> None:
    runlogs.append_record(pod / runlogs.FAILURES, {"pod": pod.name, **doc})


def failed_run(run_dir: Path) -> Path:
    """The kept logs of a two-agent run whose rank 3 was OOM-killed in round 1, its peers failing after it."""
    a, b = run_dir / "logs" / "pod-a", run_dir / "logs" / "pod-b"
    for pod in (a, b):
        pod.mkdir(parents=True)
        (pod / runlogs.AGENT_LOG).write_text("[launch] started\n")
    (b / "rank-3.log").write_text("[eks-ddp] ---- round 1 ----\nstep 40 loss 1.2\nstep 45 loss 1.1\n")
    (a / "rank-0.log").write_text("[eks-ddp] ---- round 1 ----\nstep 45 loss 1.1\nRuntimeError: Connection reset\n")
    # Round 0 failed too (a SIGKILL, restarted): not the cause of the run's end.
    _record(b, {"rank": 2, "local_rank": 0, "exit_code": -9, "signal": "SIGKILL", "restart": 0, "time": "T00:01",
                "last_lines": ["old"], "log": "rank-2.log"})
    _record(a, {"rank": 0, "local_rank": 0, "exit_code": 1, "signal": None, "restart": 1, "time": "T00:05",
                "last_lines": ["RuntimeError: Connection reset"], "log": "rank-0.log"})
    _record(b, {"rank": 3, "local_rank": 1, "exit_code": -9, "signal": "SIGKILL", "restart": 1, "time": "T00:05",
                "last_lines": ["step 40 loss 1.2", "step 45 loss 1.1"], "log": "rank-3.log"})
    _record(b, {"rank": 2, "local_rank": 0, "exit_code": -15, "signal": "SIGTERM", "restart": 1, "time": "T00:04",
                "last_lines": [], "log": "rank-2.log"})
    runlogs.write_json(a / runlogs.EXIT_RECORD, {"exit_code": 1, "reason": "fault budget spent (--max-restarts=1)"})
    runlogs.write_json(b / runlogs.EXIT_RECORD, {"exit_code": 1, "reason": "fault budget spent (--max-restarts=1)"})
    return run_dir


def test_the_cause_is_the_killed_rank_of_the_last_round_not_its_peers(tmp_path):
    s = local_status(failed_run(tmp_path / "run-9"))
    assert (s.state, s.because) == ("failed", "every agent exited non-zero")
    assert (s.cause.rank, s.cause.signal, s.cause.restart) == (3, "SIGKILL", 1)
    assert sorted(o.rank for o in s.others) == [0, 2]  # round 0's SIGKILL of rank 2 is not listed
    text = s.render()
    assert "cause: rank 3 (pod pod-b, local rank 1, round 1) was killed by SIGKILL (exit code -9)" in text
    assert "last lines of rank 3 (logs/pod-b/rank-3.log):\n  | step 40 loss 1.2\n  | step 45 loss 1.1" in text


def test_a_fatal_exit_code_outranks_a_signal_and_a_finished_run_has_no_cause(tmp_path):
    run = failed_run(tmp_path / "run-9")
    _record(run / "logs" / "pod-a", {"rank": 1, "local_rank": 1, "exit_code": 4, "signal": None, "restart": 1,
                                     "fatal": True, "time": "T00:06", "last_lines": ["ConfigError: lr"]})
    c = local_status(run).cause
    assert (c.rank, c.exit_code) == (1, 4) and c.how() == "exited with code 4 (a fatal code: not retried)"
    (run / runlogs.FINAL_MARKER).write_text("{}")
    done = local_status(run)
    assert done.state == "succeeded" and done.cause is None and "cause" not in done.render()


def test_an_unknown_run_lists_the_known_ones(tmp_path, capsys):
    failed_run(tmp_path / "out" / "local-a")
    (tmp_path / "out" / "not-a-run").mkdir()
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"runs": {"run-1": {}, "run-2": {}}}))
    rc = cli.main(["status", "nope", "--runs", str(tmp_path / "out"), "--outputs", str(outputs)])
    err = capsys.readouterr().err
    assert rc == 2
    assert ("eks-ddp status: RUN: got 'nope', an unknown run; expected a run's directory or one of these run ids: "
            f"local ({tmp_path / 'out'}): local-a; cluster: run-1, run-2") in err
    assert cli.main(["status", str(tmp_path / "out" / "not-a-run")]) == 2
    assert "a folder without a run's files" in capsys.readouterr().err
    assert cli.main(["status", "local-a", "--runs", str(tmp_path / "out")]) == 1  # found by its id under --runs


def test_logs_prints_one_rank_and_names_the_ranks_there_for_a_wrong_one(tmp_path, capsys):
    run = failed_run(tmp_path / "run-9")
    assert cli.main(["logs", str(run), "--rank", "3"]) == 0
    out = capsys.readouterr().out
    assert f"==> {run / 'logs' / 'pod-b' / 'rank-3.log'} <==" in out and "step 45 loss 1.1" in out
    assert "Connection reset" not in out
    assert cli.main(["logs", str(run), "--rank", "7"]) == 2
    assert "--rank: got 7; expected a rank with a log in" in capsys.readouterr().err


def test_follow_on_a_run_no_runner_runs_prints_once_and_returns(tmp_path, capsys):
    run = failed_run(tmp_path / "run-9")
    assert cli.main(["logs", str(run), "--follow", "--tail", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("==> ") == 4 and "RuntimeError: Connection reset" in out and "step 40" not in out


# --- cluster runs -------------------------------------------------------------------------------------
@pytest.fixture
def fake(tmp_path, monkeypatch, dev_result):
    """kubectl and pulumi on PATH, a scenario file, the dev stack's outputs, a stand-in for the run's directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("kubectl", "pulumi"):
        script = bin_dir / name
        script.write_text(f"#!{sys.executable}\n{FAKE_KUBECTL}")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    log, scenario_file = tmp_path / "calls.jsonl", tmp_path / "scenario.json"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_SCENARIO", str(scenario_file))

    class Fake:
        volume = failed_run(tmp_path / "volume")
        outputs = json.loads(json.dumps({"runs": dev_result.outputs["runs"]}, default=str))

        def scenario(self, **kw) -> None:
            scenario_file.write_text(json.dumps({"volume": str(self.volume), "outputs": self.outputs, **kw}))

        def calls(self) -> list[list[str]]:
            return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return Fake()


FAILED_JOB = {"spec": {}, "status": {"failed": 2, "conditions": [
    {"type": "FailureTarget", "status": "True"},
    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified "
     "backoff limit"}]}}


def test_status_of_a_gone_cluster_run_reads_its_kept_logs_through_a_reader_pod(fake, tmp_path, capsys):
    fake.scenario(job=FAILED_JOB, running=[])
    assert cli.main(["status", "run-1"]) == 1  # pulumi stack output --json names run-1
    out = capsys.readouterr().out
    assert out.startswith("run run-1: failed (Job training-run-1 Failed (BackoffLimitExceeded: Job has reached")
    assert "cause: rank 3 (pod pod-b, local rank 1, round 1) was killed by SIGKILL (exit code -9)" in out
    assert (tmp_path / "results" / "run-1" / "logs" / "pod-b" / "rank-3.log").exists()  # kept here too
    calls = fake.calls()
    assert calls[0] == ["pulumi", "stack", "output", "--json"]
    assert calls[1] == ["kubectl", "-n", "training", "get", "job", "training-run-1", "-o", "json"]
    run_call = next(c for c in calls if c[3] == "run")
    name = run_call[4]
    assert name.startswith("training-run-1-logs-") and len(name) <= 63
    pod = json.loads(next(a for a in run_call if a.startswith("--overrides="))[len("--overrides="):])
    assert calls[-3:] == [
        ["kubectl", "-n", "training", "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=300s"],
        ["kubectl", "-n", "training", "exec", name, "--", *kubectl.tar_command("/shared/runs/run-1")],
        ["kubectl", "-n", "training", "delete", "pod", name, "--wait=false", "--ignore-not-found"]]
    spec = pod["spec"]
    assert spec["volumes"] == [{"name": "run", "persistentVolumeClaim": {"claimName": "shared-run-run-1",
                                                                          "readOnly": True}}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "run", "mountPath": "/shared/runs/run-1",
                                                      "readOnly": True}]
    assert spec["nodeSelector"] == {"eks-ddp/pool": "system"} and spec["automountServiceAccountToken"] is False
    assert spec["containers"][0]["image"] == fake.outputs["runs"]["run-1"]["logs"]["image"]


def _restricted_violations(pod: dict) -> list[str]:
    """The Pod Security Standards' Restricted profile, the fields a reader pod could get wrong
    (kubernetes.io/docs/concepts/security/pod-security-standards/, "Restricted": runAsNonRoot, seccomp
    RuntimeDefault, allowPrivilegeEscalation false, capabilities drop ALL, volume types)."""
    spec, bad = pod["spec"], []
    for c in spec["containers"]:
        sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
        if sc.get("runAsNonRoot") is not True:
            bad.append("runAsNonRoot")
        if (sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            bad.append("seccompProfile")
        if c.get("securityContext", {}).get("allowPrivilegeEscalation") is not False:
            bad.append("allowPrivilegeEscalation")
        if "ALL" not in (c.get("securityContext", {}).get("capabilities") or {}).get("drop", []):
            bad.append("capabilities")
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
               "secret"}
    bad += [f"volume {k}" for v in spec.get("volumes", []) for k in v if k != "name" and k not in allowed]
    return bad


def test_the_reader_pod_passes_the_strict_schema_and_the_restricted_profile(fake):
    from kubernetes_validate import latest_version, validate

    run = kubectl.ClusterRun("run-1", fake.outputs["runs"]["run-1"])
    pod = {"kind": "Pod", **kubectl.reader_pod(run, "r"), "metadata": {"name": "r", "namespace": "training"}}
    pod["spec"] = {k: v for k, v in pod["spec"].items() if v is not None}
    validate(pod, latest_version(), strict=True)
    assert _restricted_violations(pod) == []
    # Negative control: the checker sees a container that may escalate.
    pod["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation")
    assert _restricted_violations(pod) == ["allowPrivilegeEscalation"]


def test_a_running_run_is_read_through_its_training_pod_and_missing_logs_name_no_cause(fake, tmp_path, capsys):
    fake.scenario(job={"spec": {}, "status": {"active": 2, "ready": 2}}, running=["training-run-1-0-abcde"])
    assert cli.main(["status", "run-1"]) == 0
    assert capsys.readouterr().out.startswith("run run-1: running (Job training-run-1: 2 pod(s) active, 2 ready")
    assert fake.calls()[-1][:6] == ["kubectl", "-n", "training", "exec", "training-run-1-0-abcde", "-c"]
    assert not [c for c in fake.calls() if c[3] in ("run", "delete")]
    # Negative control: the Job is gone and the volume holds no logs/: missing, not a cause.
    empty = tmp_path / "empty-run"
    empty.mkdir()
    fake.volume = empty
    fake.scenario(job=None, running=[])
    assert cli.main(["status", "run-1", "--cache", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "cause: unknown: the kept logs are missing (/shared/runs/run-1/logs: no such folder on the claim " \
           "shared-run-run-1)" in out and "SIGKILL" not in out
    assert fake.calls()[-1][3:5] == ["delete", "pod"]  # the reader pod is removed either way


def test_cancel_runs_the_stacks_cancel_line(fake, capsys):
    fake.scenario(job={"spec": {}, "status": {"active": 1}})
    assert cli.main(["cancel", "run-1"]) == 0
    assert fake.calls()[-2:] == [  # the dev stack queues its run: Kueue would unsuspend a suspended Job
        ["kubectl", "-n", "training", "delete", "job", "training-run-1", "--ignore-not-found"],
        ["pulumi", "config", "set", "--path", "job.state", "cancelled"]]


SEEDED_S3 = """
import json, os
if os.environ.get("FAKE_S3_SEED"):  # moto's S3 in this process, holding the seed's objects
    import boto3, moto
    moto.mock_aws().start()
    seed = json.load(open(os.environ["FAKE_S3_SEED"]))
    s3 = boto3.client("s3", region_name="us-west-2")
    s3.create_bucket(Bucket=seed["bucket"], CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    for key, body in seed["objects"].items():
        s3.put_object(Bucket=seed["bucket"], Key=key, Body=body.encode())
"""


def test_fetch_downloads_the_results_and_the_kept_logs(fake, tmp_path, monkeypatch, capfd):
    """``eks-ddp fetch`` runs the stack's fetchResults command as a process; moto's S3 is started in it."""
    pytest.importorskip("moto")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SEEDED_S3)
    url = fake.outputs["runs"]["run-1"]["fetchResults"].split()[1]
    bucket, prefix = url[len("s3://"):].split("/", 1)
    metrics = {"accuracy": 0.5, "correct": 5, "total": 10, "per_class": {"a": 0.5}, "per_class_total": {"a": 10}}
    seed = tmp_path / "seed.json"
    seed.write_text(json.dumps({"bucket": bucket, "objects": {prefix + "metrics.json": json.dumps(metrics)}}))
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "FAKE_S3_SEED": str(seed),
                 "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}.items():
        monkeypatch.setenv(k, v)
    fake.scenario(job=FAILED_JOB, running=[])
    rc = cli.main(["fetch", "run-1", "--out", str(tmp_path / "got")])
    out = capfd.readouterr().out
    assert rc == 0, out
    assert json.loads((tmp_path / "got" / "metrics.json").read_text()) == metrics
    assert (tmp_path / "got" / "logs" / "pod-a" / "agent.log").exists()
    assert f"[fetch] kept logs: {tmp_path / 'got' / 'logs'}" in out and "[fetch] 1 file(s) in" in out
    # Control: nothing uploaded under the run's prefix: the same command fails and says so.
    seed.write_text(json.dumps({"bucket": bucket, "objects": {}}))
    assert cli.main(["fetch", "run-1", "--out", str(tmp_path / "got2")]) == 1
    assert f"nothing under {url} yet" in capfd.readouterr().err


def test_the_console_script_is_declared_and_imports_no_torch():
    import tomllib

    from tests.support.util import ROOT

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["eks-ddp"] == "eks_ddp.tooling.runs:main"
    code = "import sys, eks_ddp.tooling.runs; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def _eks_ddp(*args: str, **kw) -> subprocess.Popen:
    """``eks-ddp ARGS`` as a process (the console script's module, with this tree's packages)."""
    return subprocess.Popen([sys.executable, "-m", "eks_ddp.tooling.runs", *args], stdin=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_cancel_help_says_what_cancel_does(capsys):
    """It said "suspend its Job": the cancel line deletes the Job (suspending is no cancel under Kueue)."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "cancel" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["cancel", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "suspend" not in text and "deletes its Job" in text and "SIGTERM to its runner" in text, text


def test_status_into_a_closed_pipe_ends_quietly(tmp_path):
    """`eks-ddp status RUN | head -0`: the reader is gone before the first line; no BrokenPipeError traceback,
    SIGPIPE's status (141) as a shell reports it."""
    run = failed_run(tmp_path / "run-9")
    proc = _eks_ddp("status", str(run), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # head -0: closes its end at once
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and "Traceback" not in err and "BrokenPipe" not in err, (proc.returncode, err)


def test_follow_right_after_the_start_waits_for_the_logs(tmp_path):
    """`eks-ddp logs RUN --follow` as the runner starts: no agent's folder yet. It waits while the runner lives
    (it used to exit 1, "the kept logs are missing"), prints them as they come, and returns 0 when the run ends."""
    run = tmp_path / "local-run"
    run.mkdir()
    # A stand-in runner: a live process whose command line names the local runner, as pids.json's runner has.
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "eks_ddp_local"])
    try:
        (run / "pids.json").write_text(json.dumps({"runner": runner.pid, "agents": [], "workers": [], "etcd": []}))
        follow = _eks_ddp("logs", str(run), "--follow", stdout=subprocess.PIPE)
        try:
            time.sleep(1.5)
            assert follow.poll() is None, follow.communicate()
            agent = run / "logs" / "agent0"
            agent.mkdir(parents=True)
            (agent / "rank-0.log").write_text("step 1 loss 2.0\n")
            time.sleep(1.5)
        finally:
            runner.kill()
            runner.wait()
        out, err = follow.communicate(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert follow.returncode == 0, err
    assert "step 1 loss 2.0" in out, (out, err)


FAILED_FABRIC = {"passed": False, "slow_nodes": ["ip-10-0-1-7.ec2.internal"], "reasons": [
    "slow node ip-10-0-1-7.ec2.internal: every pair it was measured in is below the floor 46.07 GB/s "
    "(with ip-10-0-1-5.ec2.internal 19.20 GB/s, with ip-10-0-1-9.ec2.internal 19.11 GB/s)"]}


def test_a_failed_fabric_check_is_the_runs_status_and_names_the_slow_node(tmp_path, capsys):
    """A run whose fabric check failed never trained: no agent records, only fabric.json (fabric_check.py's report).
    The status says failed, why, and which node; a passed check is one line beside the training's state."""
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    (run_dir / "fabric.json").write_text(json.dumps(FAILED_FABRIC))
    assert cli.main(["status", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("run run-1: failed (fabric.json: the fabric check failed, so training never started)\n"
                          "fabric check: FAILED: slow node ip-10-0-1-7.ec2.internal: every pair it was measured in "
                          "is below the floor 46.07 GB/s"), out
    assert "(slow node(s): ip-10-0-1-7.ec2.internal)" in out
    # Control: a passed check does not decide the state.
    (run_dir / "fabric.json").write_text(json.dumps({"passed": True, "reasons": [], "slow_nodes": []}))
    assert local_status(run_dir).state == "unknown" and local_status(run_dir).fabric == "passed"


def test_the_tar_of_the_run_directory_carries_fabric_json_without_logs(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert subprocess.run(kubectl.tar_command(str(run_dir)), capture_output=True).returncode == 3
    (run_dir / "fabric.json").write_text(json.dumps(FAILED_FABRIC))
    proc = subprocess.run(kubectl.tar_command(str(run_dir)), capture_output=True)
    assert proc.returncode == 0
    dest = tmp_path / "dest"
    dest.mkdir()
    kubectl._untar(proc.stdout, dest)
    assert json.loads((dest / "fabric.json").read_text())["slow_nodes"] == ["ip-10-0-1-7.ec2.internal"]


def test_a_late_nodes_failed_check_is_listed_and_copied_beside_a_passed_fabric_json(tmp_path, monkeypatch):
    """A node that joined after the job's check passed and failed its node-only check writes
    fabric-node-<node>.json (fabric_check.node_only): status no longer says only 'passed', and the tar carries it.
    The control: without that file nothing is listed."""
    from eks_ddp_runtime import fabric_check as fc

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "fabric.json").write_text(json.dumps({"passed": True, "reasons": [], "slow_nodes": []}))
    assert local_status(run_dir).late_nodes == []
    monkeypatch.setenv("NODE_NAME", "ip-10-0-1-9.ec2.internal")
    monkeypatch.setattr(fc, "count_efa_devices", lambda: 0)
    assert fc.main([f"--run-dir={run_dir}", "--node-only", "--require-efa"]) == fc.FABRIC_FAILED
    text = local_status(run_dir).render()
    assert "fabric check: passed" in text
    assert "late node failed: ip-10-0-1-9.ec2.internal: no EFA devices in the pod on ip-10-0-1-9.ec2.internal" in text
    assert "(fabric-node-ip-10-0-1-9.ec2.internal.json)" in text
    proc = subprocess.run(kubectl.tar_command(str(run_dir)), capture_output=True)
    assert proc.returncode == 0
    dest = tmp_path / "dest"
    dest.mkdir()
    kubectl._untar(proc.stdout, dest)
    assert json.loads((dest / "fabric-node-ip-10-0-1-9.ec2.internal.json").read_text())["passed"] is False


def test_status_names_a_node_whose_snapshot_does_not_fit_with_its_size_and_the_limit(tmp_path, capsys, monkeypatch):
    """The trainer says once, in the rank's log, that the node's copy of the state does not fit /dev/shm
    (snapshot.py); `eks-ddp status` reads the kept logs and shows it, per pod, with the size and the limit."""
    import torch

    from eks_ddp_trainer import snapshot

    snaps = snapshot.Snapshots(tmp_path / "trained", root=str(tmp_path / "shm"))
    monkeypatch.setattr(snapshot.os, "statvfs", lambda _: os.statvfs_result((4096, 4096, 262144, 1000, 1000,
                                                                             0, 0, 0, 0, 255)))
    snaps._write({"step": 12, "model": {"w": torch.zeros(4 << 20)}})  # 16 MiB, 3.9 MiB free
    line = capsys.readouterr().out.strip()
    assert line.startswith("[snapshot] step 12: ") and "does not fit" in line, line  # the trainer's own line
    run = failed_run(tmp_path / "run-9")
    with open(run / "logs" / "pod-b" / "rank-2.log", "a") as f:
        f.write(f"[eks-ddp] ---- round 0 ----\n{line}\nstep 13 loss 1.3\n")
    s = local_status(run)
    assert len(s.snapshots_off) == 1 and s.snapshots_off[0].startswith("pod-b, step 12: the node's copy of the state "
                                                                       "(0.02 GiB) does not fit "), s.snapshots_off
    assert "(0.00 GiB free of 1.00 GiB;" in s.snapshots_off[0] and "(logs/pod-b/rank-2.log)" in s.snapshots_off[0]
    assert f"node-local snapshots off: {s.snapshots_off[0]}" in s.render()
    assert local_status(failed_run(tmp_path / "run-10")).snapshots_off == []  # control: no such line, nothing said
