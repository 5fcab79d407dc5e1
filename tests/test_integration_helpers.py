"""The lifecycle integration test's "nothing is left behind" check, against moto (no real AWS here)."""

from __future__ import annotations

from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from tests import test_integration_aws as it

REGION = "us-west-2"


class FakeStack:
    """The few Automation-API calls the helpers make."""

    name = "it-abc123"

    def __init__(self, resources=None):
        self._resources = resources or []

    def get_config(self, key):
        return SimpleNamespace(value={"aws:region": REGION}[key])

    def export_stack(self):
        return SimpleNamespace(deployment={"resources": self._resources})


@pytest.fixture
def account(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setattr(it, "GONE_TIMEOUT_S", 0)
    with mock_aws():
        yield


def _outputs(repo: str = "eks-ddp/trainer", fs: str = "fs-0123456789abcdef0") -> dict:
    return {"imageRef": f"123456789012.dkr.ecr.{REGION}.amazonaws.com/{repo}@sha256:{'a' * 64}", "efsId": fs}


def test_an_empty_account_passes(account):
    it.assert_nothing_left(FakeStack(), _outputs())


def test_each_leftover_is_named(account):
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    ec2.create_tags(Resources=[vpc], Tags=[{"Key": "Name", "Value": "eks-ddp-it-abc123-vpc"}])
    boto3.client("ecr", region_name=REGION).create_repository(repositoryName="eks-ddp/trainer")
    fs = boto3.client("efs", region_name=REGION).create_file_system(CreationToken="t")["FileSystemId"]
    with pytest.raises(AssertionError) as err:
        it.assert_nothing_left(FakeStack(), _outputs(fs=fs))
    for what in ("VPC", "ECR repository", "EFS file system"):
        assert what in str(err.value)
    assert "EKS cluster" not in str(err.value)


def test_resources_still_in_the_state_fail(account):
    with pytest.raises(AssertionError, match="still holds resources"):
        it.assert_nothing_left(FakeStack(resources=[{"type": "aws:ec2/vpc:Vpc"}]), _outputs())
