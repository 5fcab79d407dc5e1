"""A cluster run, reached through the stack's outputs (``pulumi stack output --json``: the ``runs`` entry's ``logs``):
kubectl for the Job and its pods, the run's kept logs read off the shared volume, S3 for the results.

The kept logs (``<run dir>/logs/``, eks_ddp_runtime/runlogs.py) are on the run's EFS claim, which outlives the
pods and the GPU nodes. They are copied here as a tar stream through ``kubectl exec``: into a training pod while
one runs, else into a short-lived reader pod that mounts the claim read-only on the system nodes, with the stack's
image, as the uid the trainers write as, under the namespace's 'restricted' Pod Security profile (it sleeps until
the copy is done, is deleted afterwards, and ends itself after :data:`READER_DEADLINE_S` should this command die).
"""

from __future__ import annotations

import io
import json
import secrets
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from eks_ddp.tooling.runs.status import (
    JOB_UID_LABEL,
    QUEUE_NAME_LABEL,
    competition,
    consumed_pending,
    pending_path,
    queue_position,
    queue_state,
    requeued,
)
from eks_ddp_runtime.contract import FABRIC_JSON, FABRIC_NODE_REPORT_PREFIX, LOGS_SUBDIR
from eks_ddp_runtime.runlogs import FINAL_MARKER

TRAINER_UID = 1000
"""The uid the training pods run as (components/eks_ddp/workloads/elastic_job/pods.py ``TRAINER_UID``), so the reader
may read what they wrote."""
READER_DEADLINE_S = 900
READY_TIMEOUT_S = 300
"""How long the reader pod may take to start (scheduling, and pulling the image on a system node)."""
_NO_LOGS = 3


class CliError(Exception):
    """A one-line error for the user (exit 2 when it is their input, else 1)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def run_cmd(argv: Sequence[str], *, binary: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=not binary, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise CliError(f"{argv[0]}: not found on PATH (needed for cluster runs)") from None
    except subprocess.TimeoutExpired:
        raise CliError(f"{' '.join(argv[:4])} ...: no answer in {timeout:.0f} s") from None


def _last_line(err: str | bytes) -> str:
    text = err.decode("utf-8", "replace") if isinstance(err, bytes) else err
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "(no message)"


def pulumi_json(*args: str, stack: str | None = None):
    """What ``pulumi stack ARGS [--stack STACK]`` prints, parsed as JSON; CliError naming the command when it fails
    or prints something else."""
    argv = ["pulumi", "stack", *args, *(["--stack", stack] if stack else [])]
    proc = run_cmd(argv)
    if proc.returncode != 0:
        raise CliError(f"{' '.join(argv)}: {_last_line(proc.stderr)}")
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise CliError(f"{' '.join(argv)}: not JSON") from None


def stack_outputs(stack: str | None = None, outputs_file: Path | None = None) -> dict:
    """The stack's outputs: from ``outputs_file`` (saved ``pulumi stack output --json``) or from pulumi itself."""
    if outputs_file is not None:
        try:
            doc = json.loads(outputs_file.read_text())
        except (OSError, ValueError) as e:
            raise CliError(f"--outputs: got {str(outputs_file)!r} ({e}); expected the JSON of "
                           "`pulumi stack output --json`", 2) from None
    else:
        doc = pulumi_json("output", "--json", stack=stack)
    if not isinstance(doc, dict):
        raise CliError("stack outputs: expected a JSON object", 2)
    return doc


@dataclass(frozen=True)
class ClusterRun:
    """One entry of the ``runs`` output: its shell lines and its ``logs`` location."""

    run_id: str
    entry: dict

    @property
    def logs(self) -> dict:
        logs = self.entry.get("logs")
        if not isinstance(logs, dict) or not {"namespace", "job", "dir", "claim", "mountPath", "image"} <= set(logs):
            raise CliError(f"runs.{self.run_id}.logs: missing from the stack's outputs (a stack deployed before "
                           "this version: `pulumi up` adds it)")
        return logs

    @property
    def namespace(self) -> str:
        return str(self.logs["namespace"])

    @property
    def job(self) -> str:
        return str(self.logs["job"])

    @property
    def run_dir(self) -> str:
        return str(self.logs["dir"]).rstrip("/").rsplit("/", 1)[0]

    def kubectl(self, *args: str) -> list[str]:
        return ["kubectl", "-n", self.namespace, *args]


def job_state(run: ClusterRun) -> tuple[str, str] | None:
    """(state, why) from the Job's status; None when the Job is gone (finished and removed, or cancelled)."""
    proc = run_cmd(run.kubectl("get", "job", run.job, "-o", "json"))
    if proc.returncode != 0:
        if "NotFound" in proc.stderr or "not found" in proc.stderr:
            return None
        raise CliError(f"kubectl get job {run.job}: {_last_line(proc.stderr)}")
    job = json.loads(proc.stdout)
    conditions = {c.get("type"): c for c in job.get("status", {}).get("conditions") or [] if c.get("status") == "True"}
    for kind, state in (("Complete", "succeeded"), ("SuccessCriteriaMet", "succeeded"), ("Failed", "failed"),
                        ("FailureTarget", "failed")):
        if kind in conditions:
            c = conditions[kind]
            why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            return state, f"Job {run.job} {kind}" + (f" ({why})" if why else "")
    labels = (job.get("metadata") or {}).get("labels") or {}
    if QUEUE_NAME_LABEL in labels and (job.get("spec", {}).get("suspend") or not job.get("status", {}).get("active")):
        workload = workload_of(run, str((job.get("metadata") or {}).get("uid", "")))
        state, why = queue_state(workload, run.job)
        if workload is not None and (state == "queued" or state in ("preempted", "evicted") and requeued(workload)):
            why += f"; {position(run, labels[QUEUE_NAME_LABEL], workload)}"
        return state, why + _competing(run, workload)
    if job.get("spec", {}).get("suspend"):
        return "cancelled", f"Job {run.job} is suspended (eks-ddp cancel)"
    s = job.get("status", {})
    if QUEUE_NAME_LABEL in labels and s.get("ready", 0) < job.get("spec", {}).get("parallelism", 0):
        pods = job_pods(run)
        if consumed_pending(pods, job, None) is not None:  # the Workload is read only for the fix's command
            return consumed_pending(pods, job, workload_of(run, str((job.get("metadata") or {}).get("uid", ""))))
    running = (f"Job {run.job}: {s.get('active', 0)} pod(s) active, {s.get('ready', 0)} ready, "
               f"{s.get('failed', 0)} failed")
    if QUEUE_NAME_LABEL in labels:
        running += _competing(run, workload_of(run, str((job.get("metadata") or {}).get("uid", ""))))
    return "running", running


def _competing(run: ClusterRun, workload: dict | None) -> str:
    """``; <the other runs of its queue and who would preempt whom>`` (status.competition), or "" (no other run, no
    Workload, or kubectl could not list them: the run's own state stands without it)."""
    if workload is None:
        return ""
    proc = run_cmd(run.kubectl("get", "workloads.kueue.x-k8s.io", "-o", "json"))
    if proc.returncode != 0:
        return ""
    try:
        workloads = json.loads(proc.stdout).get("items") or []
    except ValueError:
        return ""
    cq = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
    if not cq:  # a waiting Workload: its LocalQueue names its ClusterQueue
        local = run_cmd(run.kubectl("get", "localqueues.kueue.x-k8s.io", str((workload.get("spec") or {}).get(
            "queueName", "")), "-o", "json"))
        cq = _json_field(local, "spec", "clusterQueue")
    policy = None
    if cq:
        policy = _json_field(run_cmd(["kubectl", "get", "clusterqueues.kueue.x-k8s.io", str(cq), "-o", "json"]),
                             "spec", "preemption", "withinClusterQueue")
    said = competition(workload, workloads, policy)
    return f"; {said}" if said else ""


def _json_field(proc: subprocess.CompletedProcess, *path: str) -> str | None:
    """``path`` in the JSON a kubectl call printed; None when it failed, printed no JSON or lacks the field."""
    if proc.returncode != 0:
        return None
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        return None
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc if isinstance(doc, str) else None


def workload_of(run: ClusterRun, job_uid: str) -> dict | None:
    """The Kueue Workload of the run's Job: the one labelled with the Job's UID (status.JOB_UID_LABEL); the newest
    when a requeue left more than one."""
    proc = run_cmd(run.kubectl("get", "workloads.kueue.x-k8s.io", "-l", f"{JOB_UID_LABEL}={job_uid}", "-o", "json"))
    if proc.returncode != 0:
        raise CliError(f"kubectl get workloads -l {JOB_UID_LABEL}={job_uid}: {_last_line(proc.stderr)}")
    items = json.loads(proc.stdout).get("items") or []
    items.sort(key=lambda w: str((w.get("metadata") or {}).get("creationTimestamp", "")))
    return items[-1] if items else None


def position(run: ClusterRun, local_queue: str, workload: dict) -> str:
    """The Workload's place in the queue from Kueue's visibility API; what went wrong instead, never an error (the
    state is known without it)."""
    path = pending_path(run.namespace, local_queue)
    proc = run_cmd(["kubectl", "get", "--raw", path])
    if proc.returncode != 0:
        return f"queue position unknown (kubectl get --raw {path}: {_last_line(proc.stderr)})"
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        return f"queue position unknown (kubectl get --raw {path}: not JSON)"
    return queue_position(summary, str((workload.get("metadata") or {}).get("name", "")))


def job_pods(run: ClusterRun) -> list[dict]:
    """The run's training pods, whole (their phase and annotations)."""
    proc = run_cmd(run.kubectl("get", "pods", "-l", f"app.kubernetes.io/instance={run.job}", "-o", "json"))
    if proc.returncode != 0:
        raise CliError(f"kubectl get pods: {_last_line(proc.stderr)}")
    return list(json.loads(proc.stdout).get("items") or [])


def running_pod(run: ClusterRun) -> str | None:
    proc = run_cmd(run.kubectl("get", "pods", "-l", f"app.kubernetes.io/instance={run.job}",
                               "--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}"))
    if proc.returncode != 0:
        raise CliError(f"kubectl get pods: {_last_line(proc.stderr)}")
    names = proc.stdout.split()
    return names[0] if names else None


def tar_command(run_dir: str) -> list[str]:
    """Streams ``logs/`` (and the final marker, the fabric check's ``fabric.json`` and a late node's failed
    ``fabric-node-<node>.json``, when there) of ``run_dir`` as a tar; exit 3 with neither ``logs/`` nor ``fabric.json``."""
    nodes = f"{FABRIC_NODE_REPORT_PREFIX}*.json"
    script = (f'cd "$1" || exit 4; test -d {LOGS_SUBDIR} || test -e {FABRIC_JSON} || exit {_NO_LOGS}; '
              f'exec tar -cf - $(test -d {LOGS_SUBDIR} && echo {LOGS_SUBDIR}) '
              f'$(test -e {FINAL_MARKER} && echo {FINAL_MARKER}) $(test -e {FABRIC_JSON} && echo {FABRIC_JSON}) '
              f'$(for f in {nodes}; do test -e "$f" && echo "$f"; done)')
    return ["sh", "-c", script, "sh", run_dir]


def reader_pod(run: ClusterRun, name: str) -> dict:
    """The reader pod's spec, as ``kubectl run --overrides`` merges it (its container list replaced whole)."""
    logs = run.logs
    security = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                "runAsUser": TRAINER_UID, "runAsGroup": TRAINER_UID, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}}
    return {"apiVersion": "v1", "metadata": {"labels": {"app.kubernetes.io/part-of": "eks-ddp",
                                                        "app.kubernetes.io/component": "log-reader",
                                                        "app.kubernetes.io/instance": f"{run.job}-logs"}},
            "spec": {
                "restartPolicy": "Never", "activeDeadlineSeconds": READER_DEADLINE_S,
                "automountServiceAccountToken": False, "enableServiceLinks": False,
                "nodeSelector": logs.get("nodeSelector") or None, "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": True, "runAsUser": TRAINER_UID, "runAsGroup": TRAINER_UID,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "reader", "image": logs["image"], "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", str(READER_DEADLINE_S)], "securityContext": security,
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                  "limits": {"cpu": "500m", "memory": "256Mi"}},
                    "volumeMounts": [{"name": "run", "mountPath": logs["mountPath"], "readOnly": True}]}],
                "volumes": [{"name": "run", "persistentVolumeClaim": {"claimName": logs["claim"], "readOnly": True}}],
            }}


def reader_name(run: ClusterRun) -> str:
    return f"{run.job[:40].rstrip('-')}-logs-{secrets.token_hex(3)}"


def _untar(data: bytes, dest: Path) -> None:
    """Into ``dest`` (its ``logs/`` replaced): only regular files and folders, none outside ``dest``."""
    staging = Path(tempfile.mkdtemp(prefix=".eks-ddp-logs-", dir=dest))
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = []
            for m in tar.getmembers():
                parts = Path(m.name).parts
                if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                    continue
                if parts and parts[0] not in (LOGS_SUBDIR, FINAL_MARKER, FABRIC_JSON) and not (
                        len(parts) == 1 and parts[0].startswith(FABRIC_NODE_REPORT_PREFIX) and parts[0].endswith(".json")):
                    continue
                members.append(m)
            if hasattr(tarfile, "data_filter"):  # Python's safe extraction filter (3.12, 3.11.4+)
                tar.extractall(staging, members=members, filter="data")
            else:
                tar.extractall(staging, members=members)
        shutil.rmtree(dest / LOGS_SUBDIR, ignore_errors=True)
        for item in staging.iterdir():
            target = dest / item.name
            if target.is_file():
                target.unlink()
            item.replace(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_logs(run: ClusterRun, dest: Path, say: Callable[[str], None]) -> str | None:
    """Copy the run's kept logs into ``dest/logs``; returns why they are missing, or None when copied."""
    dest.mkdir(parents=True, exist_ok=True)
    pod = running_pod(run)
    made = None
    try:
        if pod is None:
            made = reader_name(run)
            say(f"no training pod runs: reading the kept logs through a reader pod {made} on the run's claim "
                f"{run.logs['claim']} (namespace {run.namespace})")
            proc = run_cmd(run.kubectl("run", made, f"--image={run.logs['image']}", "--restart=Never",
                                       f"--overrides={json.dumps(reader_pod(run, made))}", "--command", "--",
                                       "sleep", str(READER_DEADLINE_S)))
            if proc.returncode != 0:
                raise CliError(f"kubectl run {made}: {_last_line(proc.stderr)}")
            proc = run_cmd(run.kubectl("wait", "--for=condition=Ready", f"pod/{made}", f"--timeout={READY_TIMEOUT_S}s"),
                           timeout=READY_TIMEOUT_S + 30)
            if proc.returncode != 0:
                raise CliError(f"the reader pod {made} did not start ({_last_line(proc.stderr)}); see "
                               f"kubectl -n {run.namespace} describe pod {made}")
            pod = made
        proc = run_cmd(run.kubectl("exec", pod, *(["-c", "trainer"] if made is None else []), "--",
                                   *tar_command(run.run_dir)), binary=True, timeout=600)
        if proc.returncode == _NO_LOGS:
            return f"{run.logs['dir']}: no such folder on the claim {run.logs['claim']}"
        if proc.returncode != 0:
            raise CliError(f"kubectl exec {pod} (tar of {run.logs['dir']}): {_last_line(proc.stderr)}")
        _untar(proc.stdout, dest)
        return None
    finally:
        if made is not None:
            run_cmd(run.kubectl("delete", "pod", made, "--wait=false", "--ignore-not-found"))
