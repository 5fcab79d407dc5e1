"""Preflight: every ECR image the stack names exists by its digest (B1), on moto's ECR.

A missing repository or digest fails naming the stack key (``runs[i].workload.image``, ``image.prebuilt``); a
denied call (another account's repository without a policy for us) is a warning, like every preflight check.
"""

from __future__ import annotations

import json

import boto3
import pytest

from eks_ddp.tooling import preflight
from eks_ddp.tooling.preflight import checker as preflight_checker
from eks_ddp.tooling.preflight import images as preflight_images
from tests.support.moto_account import fake_account
from tests.support.stub_quotas import StubQuotas, client_error
from tests.support.util import BYO_OTHER_ACCOUNT_IMAGE, BYO_OWN_ACCOUNT_IMAGE, byo_stack_config, set_path, stack_config
from tests.tooling.preflight.test_preflight import config

MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                       "config": {}, "layers": []})


@pytest.fixture
def aws(monkeypatch):
    """moto's EC2 and ECR; yields the ECR client factory preflight takes and a push helper."""
    with fake_account(monkeypatch):
        yield lambda region: boto3.client("ecr", region_name=region)


def push(image: str) -> None:
    """Put ``image`` (``<account>.dkr.ecr.<region>.amazonaws.com/<repo>[:tag]@sha256:...``) into moto's ECR."""
    host, _, rest = image.partition("/")
    repo, _, digest = rest.partition("@")
    ecr = boto3.client("ecr", region_name=host.split(".")[3])
    repo, registry = repo.split(":", 1)[0], host.split(".")[0]
    try:
        ecr.create_repository(registryId=registry, repositoryName=repo)
    except ecr.exceptions.RepositoryAlreadyExistsException:
        pass
    ecr.put_image(registryId=registry, repositoryName=repo, imageManifest=MANIFEST, imageDigest=digest)


def check(raw: dict, ecr) -> preflight.Report:
    """The image checks alone (the rest of preflight has its own tests and costs seconds on moto's EC2)."""
    c = preflight_checker._Checker(config(raw), None, None)  # noqa: SLF001 - the checker's failure/warning plumbing
    preflight_images.check_images(c, ecr)
    return c.report


def image_failures(report: preflight.Report) -> list[str]:
    return [f for f in report.failures if ".workload.image" in f or f.startswith("image.prebuilt")]


def test_pushed_run_images_pass(aws):
    push(BYO_OWN_ACCOUNT_IMAGE)
    push(BYO_OTHER_ACCOUNT_IMAGE)
    cfg = config(byo_stack_config())  # the whole preflight, as __main__.py runs it
    report = preflight.check(cfg, ec2=boto3.client("ec2", region_name=cfg.region), quotas=StubQuotas(), ecr=aws)
    assert report.ok and report.warnings == []


def test_a_missing_digest_fails_naming_the_runs_key(aws):
    push(BYO_OWN_ACCOUNT_IMAGE)
    wrong = BYO_OWN_ACCOUNT_IMAGE.replace("b1" * 32, "e5" * 32)
    push(BYO_OTHER_ACCOUNT_IMAGE)
    [msg] = image_failures(check(set_path(byo_stack_config(), "eks-ddp:runs[1].workload.image", wrong), aws))
    assert msg.startswith(f"runs[1].workload.image: got {wrong!r}")
    assert "repository nlp/bert of account 123456789012 in us-west-2 holds no image with digest sha256:e5e5" in msg
    assert "aws ecr describe-images --registry-id 123456789012 --repository-name nlp/bert --region us-west-2" in msg


def test_a_missing_repository_fails_naming_the_runs_key(aws):
    push(BYO_OWN_ACCOUNT_IMAGE)  # vision/vit never pushed
    [msg] = image_failures(check(byo_stack_config(), aws))
    assert msg.startswith("runs[2].workload.image: got ") and "repository vision/vit of account 210987654321" in msg
    assert "does not exist" in msg


def test_the_prebuilt_image_is_looked_up_too(aws):
    raw = set_path(stack_config("dev"), "eks-ddp:image.prebuilt", BYO_OWN_ACCOUNT_IMAGE)
    [msg] = image_failures(check(raw, aws))
    assert msg.startswith("image.prebuilt: got ")


def test_a_denied_lookup_is_a_warning_naming_the_action(aws):
    class Denied:
        def describe_images(self, **kw):
            raise client_error("AccessDeniedException", "DescribeImages", "no resource-based policy allows it")

    report = check(byo_stack_config(), lambda region: Denied())
    assert image_failures(report) == []
    assert any("runs[1].workload.image exists" in w and "allow ecr:DescribeImages" in w for w in report.warnings), \
        report.warnings


def test_images_outside_ecr_are_not_looked_up(aws):
    asked: list[str] = []

    class Recording:
        def describe_images(self, **kw):
            asked.append(kw["repositoryName"])

    ngc = "nvcr.io/nvidia/pytorch@sha256:" + "d3" * 32
    raw = set_path(byo_stack_config(), "eks-ddp:runs[2].workload.image", ngc)
    assert image_failures(check(raw, lambda region: Recording())) == [] and asked == ["nlp/bert"]
