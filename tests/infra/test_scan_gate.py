"""The ECR scan gate (security review S5/S14, issue 24 item 4): findings at or above the configured severity fail
``pulumi up`` before any job gets the image. The check itself runs against a scripted ECR client; the wiring is
checked on the dev plan."""

from __future__ import annotations

import pytest

from eks_ddp.infra.scan_gate import STACK_SETTING, ScanGateError, blocking, check_image, scan_target
from tests.support.util import run, set_path, stack_config

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
    return check_image(ecr, REF, fail_at, setting=STACK_SETTING, wait_s=wait_s, poll_s=10, sleep=clock.sleep,
                       clock=clock)


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
    from eks_ddp.config import ConfigError, load_stack_config

    cfg = {k: v for k, v in set_path(stack_config("dev"), "eks-ddp:image.scanFailSeverity", "SEVERE").items()
           if k.startswith("eks-ddp:")}
    with pytest.raises(ConfigError) as info:
        load_stack_config(cfg, region="us-west-2")
    assert any(p.startswith("image.scanFailSeverity: got 'SEVERE'") and "'disabled'" in p
               for p in info.value.problems), info.value.problems


# --- an image without any scan (U3): reported at once, naming what to do in the caller's terms ---------------

@pytest.fixture
def moto_ecr(monkeypatch):
    """moto's ECR with one repository that does not scan on push, holding one image pushed just now."""
    import json

    import boto3
    from moto import mock_aws

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        ecr = boto3.client("ecr", region_name="us-west-2")
        ecr.create_repository(repositoryName="nlp/bert")  # scanOnPush defaults to false
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                               "config": {}, "layers": []})
        digest = ecr.put_image(repositoryName="nlp/bert", imageManifest=manifest)["image"]["imageId"]["imageDigest"]
        yield ecr, f"123456789012.dkr.ecr.us-west-2.amazonaws.com/nlp/bert@{digest}"


def test_a_prebuilt_image_without_a_scan_fails_at_once_with_what_to_do(moto_ecr):
    import datetime as dt

    ecr, ref = moto_ecr
    pushed = ecr.describe_images(repositoryName="nlp/bert")["imageDetails"][0]["imagePushedAt"]
    clock = Clock()
    with pytest.raises(ScanGateError) as info:
        check_image(ecr, ref, "CRITICAL", setting="WorkloadImageArgs.scan_fail_severity", sleep=clock.sleep,
                    clock=clock, now=lambda: pushed + dt.timedelta(days=3))
    msg = str(info.value)
    assert clock.now == 0, "waited for a scan that will never come"
    assert "ECR has no scan of this image" in msg and ref in msg
    assert "aws ecr start-image-scan --registry-id 123456789012 --repository-name nlp/bert" in msg
    assert "scanOnPush=true" in msg and "WorkloadImageArgs.scan_fail_severity to 'disabled'" in msg
    assert "eks-ddp:image" not in msg  # a library caller is never told about a stack key it does not have


def test_a_fresh_push_gets_a_short_grace_for_its_scan_on_push(moto_ecr):
    import datetime as dt

    ecr, ref = moto_ecr  # pushed "now": the scan on push may still be starting
    pushed = ecr.describe_images(repositoryName="nlp/bert")["imageDetails"][0]["imagePushedAt"]
    clock = Clock()
    with pytest.raises(ScanGateError, match="ECR has no scan of this image"):
        check_image(ecr, ref, "HIGH", setting=STACK_SETTING, poll_s=10, sleep=clock.sleep, clock=clock,
                    now=lambda: pushed + dt.timedelta(seconds=clock.now))
    assert clock.now == 120, clock.now  # the grace after the push (NOT_FOUND_GRACE_S), not the 900 s scan wait


def test_without_a_push_time_a_missing_scan_fails_after_the_grace_not_the_whole_wait():
    ecr = FakeEcr(("NOT_FOUND", None))  # no describe_images on this client: the grace counts from the first miss
    with pytest.raises(ScanGateError, match="none after 120 s") as info:
        check(ecr, wait_s=900)
    assert len(ecr.calls) == 13 and STACK_SETTING in str(info.value)


def test_a_denied_scan_read_names_the_permission_and_the_setting():
    from botocore.exceptions import ClientError

    class Denied(FakeEcr):
        def describe_image_scan_findings(self, **kw):
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}},
                              "DescribeImageScanFindings")

    with pytest.raises(ScanGateError) as info:
        check(Denied(("COMPLETE", {})))
    msg = str(info.value)
    assert "allow ecr:DescribeImageScanFindings" in msg and "repository/eks-ddp/trainer" in msg
    assert f"set {STACK_SETTING} to 'disabled'" in msg


def test_the_gate_names_the_setting_of_its_callers_context(dev_result):
    from eks_ddp import TrainerImage, TrainerImageArgs
    from eks_ddp.tooling.mocks import run_program

    [gate] = dev_result.of_type(GATE)
    assert gate.inputs["setting"] == STACK_SETTING  # the stack's program: its stack key

    def program():
        TrainerImage("lib", TrainerImageArgs(prebuilt=REF))

    [lib_gate] = run_program({}, program=program).of_type(GATE)
    assert lib_gate.inputs["setting"] == "TrainerImageArgs.scan_fail_severity"
