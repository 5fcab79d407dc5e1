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


BUCKET = "results-0123abcd"


def _outputs(repo: str = "eks-ddp/trainer", fs: str = "fs-0123456789abcdef0") -> dict:
    return {"imageRef": f"123456789012.dkr.ecr.{REGION}.amazonaws.com/{repo}@sha256:{'a' * 64}", "efsId": fs,
            "results": {"bucket": BUCKET, "prefix": "runs/run-1/"}}


def _retained_results_bucket() -> None:
    """What a destroy leaves on purpose: the versioned results bucket with a run's objects."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    for _ in range(2):
        s3.put_object(Bucket=BUCKET, Key="runs/run-1/metrics.json", Body=b"{}")


def test_an_empty_account_passes_and_the_kept_results_bucket_is_then_removed(account):
    _retained_results_bucket()
    it.assert_nothing_left(FakeStack(), _outputs())
    assert BUCKET not in [b["Name"] for b in boto3.client("s3", region_name=REGION).list_buckets()["Buckets"]]


def test_a_results_bucket_that_did_not_survive_the_destroy_is_an_error(account):
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError):
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


# --- day-two helpers ---------------------------------------------------------------------------------------------

def test_upgrade_path_is_one_minor_to_the_default():
    from eks_ddp.core import k8s_versions

    before, after = it.upgrade_path()
    assert after == k8s_versions.DEFAULT_VERSION and before in k8s_versions.SUPPORTED_VERSIONS
    (bm, bn), (am, an) = (map(int, v.split(".")) for v in (before, after))
    assert (bm, bn + 1) == (am, an)


def test_live_groups_scaling_and_versions_read_eks(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(var, "testing")
    with mock_aws():
        eks = boto3.client("eks", region_name=REGION)
        eks.create_cluster(name="c", version="1.35", roleArn="arn:aws:iam::123456789012:role/eks",
                           resourcesVpcConfig={"subnetIds": []})
        for name, labels, size in (("sys-1", {"eks-ddp/pool": "system"}, 2),
                                   ("gpu-1", {"eks-ddp/pool": "gpu", "eks-ddp/node-group": "gpu"}, 1)):
            eks.create_nodegroup(clusterName="c", nodegroupName=name, subnets=["s"], labels=labels,
                                 nodeRole="arn:aws:iam::123456789012:role/n", version="1.35",
                                 scalingConfig={"minSize": size, "maxSize": size + 1, "desiredSize": size})
        groups = it.live_groups(REGION, "c")
        assert sorted(groups) == ["gpu", "system"]
        assert it.scaling(groups["system"]) == (2, 2, 3) and it.scaling(groups["gpu"]) == (1, 1, 2)
        assert it.versions_of(REGION, "c") == {"cluster": "1.35", "system": "1.35", "gpu": "1.35"}
        assert it.wait_for_gpu_nodes(REGION, "c", "gpu", 1, timeout_s=5) == 1
        with pytest.raises(AssertionError, match="did not reach 3 nodes"):
            it.wait_for_gpu_nodes(REGION, "c", "gpu", 3, timeout_s=0)
