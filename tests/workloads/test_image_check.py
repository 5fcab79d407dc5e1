"""A workload's own image is checked on a system node before the training Job exists (review N6).

Over the plan (Pulumi mocks): the image-check Job runs the workload's image and entrypoint through
``python -m eks_ddp_runtime.image_check`` on the system nodes (no GPU asked for, no GPU taint tolerated), is awaited,
fails at once on the check's findings, and gates the training Job; the bundled trainer's image gets none. The
command itself is run for real in tests/runtime/test_image_check.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from kubernetes_validate import validate

from eks_ddp.config import SUPPORTED_KUBERNETES_VERSIONS
from eks_ddp.core.workload import Workload
from eks_ddp.tooling.plan import render_manifests, write_manifests
from eks_ddp.workloads.elastic_job.image_check import IMAGE_CHECK_FAILS, IMAGE_CHECK_MODULE
from tests.support.util import ROOT
from tests.workloads.test_elastic_job import GPU_NODES, IMAGE, JOB, NETPOL, run_job, train_job

CHECKOV = ROOT / ".venv-scan" / "bin" / "checkov"
SKIPS_FILE = ROOT / "tests" / "checkov-skips.yaml"

OWN_IMAGE = "210987654321.dkr.ecr.us-west-2.amazonaws.com/acme/ddp-train@sha256:" + "cd" * 32
SYSTEM = {"eks-ddp/pool": "system"}
CHECK = "training-image-check"


def _own(**kw) -> Workload:
    return Workload(name="toy", **{"script": "/app/train.py", "image": OWN_IMAGE, **kw})


def test_a_workloads_own_image_is_checked_on_a_system_node_before_training():
    result = run_job(workload=_own(env={"MY_FLAG": "1"}), system_node_selector=SYSTEM)
    check = result.one(JOB, CHECK)
    spec = check.inputs["spec"]
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["python", "-m", IMAGE_CHECK_MODULE, "--script", "/app/train.py"]
    assert container["image"] == OWN_IMAGE and container["workingDir"] == "/app"  # the training pod's
    assert {"name": "MY_FLAG", "value": "1"} in container["env"]
    assert pod["nodeSelector"] == SYSTEM and not pod.get("tolerations")
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert pod["securityContext"]["runAsUser"] == 1000 and container["securityContext"]["readOnlyRootFilesystem"]
    # awaited (no skipAwait), fails the Job at once on a finding, gates the training Job
    assert "pulumi.com/skipAwait" not in check.inputs["metadata"].get("annotations", {})
    [fail] = [r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    assert fail["onExitCodes"] == {"containerName": "image-check", "operator": "In", "values": IMAGE_CHECK_FAILS}
    assert check.urn in train_job(result).dependencies
    # its pod is selected by exactly one policy, which lets nothing in or out
    labels = spec["template"]["metadata"]["labels"]
    selecting = [p.inputs["spec"] for p in result.of_type(NETPOL)
                 if all(labels.get(k) == v for k, v in p.inputs["spec"]["podSelector"]["matchLabels"].items())]
    assert selecting == [{"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress", "Egress"],
                          "ingress": [], "egress": []}]


def test_a_module_workload_is_checked_for_its_module():
    result = run_job(workload=_own(script=None, module="mypkg.train"), system_node_selector=SYSTEM)
    [container] = result.one(JOB, CHECK).inputs["spec"]["template"]["spec"]["containers"]
    assert container["command"][-2:] == ["--module", "mypkg.train"]


@pytest.mark.parametrize("overrides", [
    {},  # the bundled trainer, in the stack's image (built here with the pinned torch)
    {"workload": Workload(name="toy", script="/app/train.py")},  # no image of its own: the stack's
    {"workload": _own(), "state": "cancelled"},  # no training Job to gate
])
def test_no_image_check_without_an_image_of_its_own_or_a_training_job(overrides):
    result = run_job(node_selector=GPU_NODES, image=IMAGE, **overrides)
    assert [j.name for j in result.of_type(JOB) if "image-check" in j.name] == []


def test_the_check_passes_the_strict_schema_and_the_security_scan(tmp_path):
    docs = [d for d in render_manifests(run_job(workload=_own(), system_node_selector=SYSTEM))
            if "image-check" in d["metadata"]["name"]]
    assert sorted(d["kind"] for d in docs) == ["Job", "NetworkPolicy"]
    for doc in docs:
        validate(doc, SUPPORTED_KUBERNETES_VERSIONS[-1], strict=True)
    write_manifests(docs, tmp_path)
    proc = subprocess.run([str(CHECKOV), "-d", str(tmp_path), "--framework", "kubernetes", "--skip-download",
                           "--output", "json"], capture_output=True, text=True, timeout=300, check=False)
    skips = yaml.safe_load(SKIPS_FILE.read_text())
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [f"{c['check_id']} {c['check_name']}" for r in reports for c in r["results"]["failed_checks"]
              if c["check_id"] not in skips]
    assert not failed, failed
