"""The ECR scan gate (security review S5/S14, issue 24 item 4): findings at or above the configured severity fail
``pulumi up`` before any job gets the image. The check itself runs against a scripted ECR client; the wiring is
checked on the dev plan."""

from __future__ import annotations

import pytest

from components.scan_gate import ScanGateError, blocking, check_image, scan_target
from tests.util import run, set_path, stack_config

DIGEST = "sha256:" + "ab" * 32
REF = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/eks-ddp/trainer@{DIGEST}"
GATE = "pulumi-python:dynamic:Resource"


class ScanNotFoundException(Exception):
    pass


class FakeEcr:
    """Answers describe_image_scan_findings from a script of (status, counts), the last one repeating."""

    class exceptions:
        ScanNotFoundException = ScanNotFoundException

    def __init__(self, *script):
        self.script, self.calls = list(script), []

    def describe_image_scan_findings(self, **kw):
        self.calls.append(kw)
        status, counts = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if status == "NOT_FOUND":
            raise ScanNotFoundException()
        return {"imageScanStatus": {"status": status, "description": "scripted"},
                "imageScanFindings": {"findingSeverityCounts": counts}}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def check(ecr, fail_at="CRITICAL", wait_s=100):
    clock = Clock()
    return check_image(ecr, REF, fail_at, wait_s=wait_s, poll_s=10, sleep=clock.sleep, clock=clock)


def test_a_critical_finding_fails_naming_the_image_counts_and_key():
    with pytest.raises(ScanGateError) as info:
        check(FakeEcr(("COMPLETE", {"CRITICAL": 2, "HIGH": 5})))
    msg = str(info.value)
    assert REF in msg and "{'CRITICAL': 2}" in msg and "eks-ddp:image.scanFailSeverity" in msg


def test_findings_below_the_threshold_pass_and_are_returned():
    ecr = FakeEcr(("COMPLETE", {"HIGH": 5, "LOW": 1}))
    assert check(ecr) == {"HIGH": 5, "LOW": 1}
    assert ecr.calls == [{"registryId": "123456789012", "repositoryName": "eks-ddp/trainer",
                          "imageId": {"imageDigest": DIGEST}}]
    with pytest.raises(ScanGateError):
        check(FakeEcr(("COMPLETE", {"HIGH": 5})), fail_at="HIGH")


def test_waits_for_scan_on_push_then_decides():
    ecr = FakeEcr(("NOT_FOUND", None), ("IN_PROGRESS", None), ("COMPLETE", {}))
    assert check(ecr) == {} and len(ecr.calls) == 3


def test_a_scan_that_never_finishes_or_fails_fails_the_deploy():
    ecr = FakeEcr(("IN_PROGRESS", None))
    with pytest.raises(ScanGateError, match="still IN_PROGRESS after 100 s"):
        check(ecr)
    assert len(ecr.calls) == 11  # bounded: one call per 10 s poll over 100 s
    with pytest.raises(ScanGateError, match="'UNSUPPORTED_IMAGE'"):
        check(FakeEcr(("UNSUPPORTED_IMAGE", None)))


def test_severity_order_and_targets():
    assert blocking({"CRITICAL": 0, "HIGH": 1, "MEDIUM": 3}, "MEDIUM") == {"HIGH": 1, "MEDIUM": 3}
    assert blocking({"LOW": 9}, "CRITICAL") == {}
    assert scan_target(REF)["repo"] == "eks-ddp/trainer"
    assert scan_target(f"nvcr.io/nvidia/pytorch@{DIGEST}") is None


def test_the_job_image_comes_through_the_gate_on_the_dev_plan(dev_result):
    [gate] = dev_result.of_type(GATE)
    assert gate.inputs["fail_at"] == "CRITICAL" and gate.parent_type == "eks-ddp:image:TrainerImage"
    build = dev_result.one("docker-build:index:Image")
    assert gate.inputs["image_ref"].endswith("@" + build.outputs["digest"])
    job = next(j for j in dev_result.of_type("kubernetes:batch/v1:Job")
               if j.inputs["metadata"]["name"].startswith("training-run"))
    assert job.inputs["spec"]["template"]["spec"]["containers"][0]["image"] == gate.outputs["image_ref"]


def test_scan_gate_off_leaves_no_gate():
    result = run(set_path(stack_config("dev"), "eks-ddp:image.scanFailSeverity", "disabled"))
    assert not result.of_type(GATE)


def test_a_severity_outside_the_list_is_rejected_naming_the_key():
    from components.config import ConfigError, load_stack_config

    cfg = {k: v for k, v in set_path(stack_config("dev"), "eks-ddp:image.scanFailSeverity", "SEVERE").items()
           if k.startswith("eks-ddp:")}
    with pytest.raises(ConfigError) as info:
        load_stack_config(cfg, region="us-west-2")
    assert any(p.startswith("image.scanFailSeverity: got 'SEVERE'") and "'disabled'" in p
               for p in info.value.problems), info.value.problems
