"""Real AWS: the dev stack's whole lifecycle through the Automation API.

Skipped unless the `pulumi` CLI is on PATH and AWS credentials are available, because it
creates billable resources (an EKS cluster, GPU nodes) for 30-60 minutes. Run it deliberately:

    EKS_DDP_IT_CIDR=$(curl -s https://checkip.amazonaws.com)/32 \
    .venv/bin/python -m pytest tests/test_integration_aws.py -m integration -s

It uses a throw-away stack named ``it-<random>`` with a local file backend and runs

    up -> the job completes -> change job.epochs -> up -> the job completes again (resumed)
       -> destroy -> nothing is left -> up (same stack: a re-deploy after destroy) -> the job completes
       -> destroy -> nothing is left

``test_day_two_lifecycle`` (same gates) then takes a second throw-away stack through day two:

    up at the minor before the default (1 system node) -> resize the system group 1 -> 2
    -> start a run; while its GPU nodes run, raise the GPU group's maxSize -> up: the live desired size and the
       run's nodes are untouched, the run completes
    -> upgrade Kubernetes one minor (control plane, add-ons, autoscaler, every node group)
    -> a second stack in the same account asking for the same cluster name is refused by preflight before it
       creates anything -> destroy

"Nothing is left" is asked of AWS directly: no EKS cluster, no VPC named for it, no ECR repository, no
EFS file system (the test sets ``storage.retainOnDestroy false``). The control-plane log group is kept on
purpose (EKS re-creates it while the cluster is deleted; the next up adopts it): the test checks that the
second up adopted it and deletes it at the end. The stack is always destroyed, even when a step fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from typing import Any

import pytest

from tests.support.util import ROOT, stack_config


def _aws_credentials() -> bool:
    try:
        import boto3

        return boto3.session.Session().get_credentials() is not None
    except Exception:  # noqa: BLE001 - any failure means "no usable credentials"
        return False


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("pulumi") is None, reason="needs the pulumi CLI (not installed here)"),
    pytest.mark.skipif(not _aws_credentials(), reason="needs AWS credentials (none configured here)"),
    pytest.mark.skipif("EKS_DDP_IT_CIDR" not in os.environ,
                       reason="needs EKS_DDP_IT_CIDR: the CIDR allowed to reach the test cluster's API"),
]


JOB_TIMEOUT_S = 3600
GONE_TIMEOUT_S = 900


@pytest.fixture
def stack(tmp_path):
    from pulumi import automation as auto

    backend = tmp_path / "state"
    backend.mkdir()
    env = {"PULUMI_BACKEND_URL": f"file://{backend}", "PULUMI_CONFIG_PASSPHRASE": "integration-test"}
    name = f"it-{uuid.uuid4().hex[:6]}"
    ws = auto.LocalWorkspaceOptions(env_vars=env, work_dir=str(ROOT))
    st = auto.create_stack(stack_name=name, work_dir=str(ROOT), opts=ws)
    config = stack_config("dev")
    config["eks-ddp:cluster"]["publicAccessCidrs"] = [os.environ["EKS_DDP_IT_CIDR"]]
    config["eks-ddp:job"]["epochs"] = 2
    config["eks-ddp:storage"] = {**config.get("eks-ddp:storage", {}), "retainOnDestroy": False}
    config["eks-ddp:preflight"] = True
    for key, value in config.items():
        set_config(st, key, value)
    try:
        yield st
    finally:
        outputs = {}
        try:
            outputs = {k: v.value for k, v in st.outputs().items()}
        finally:
            st.destroy(on_output=print)
            _delete_log_group(st)
            _delete_results_bucket(st, outputs)  # retained by design: the test removes what it made
            st.workspace.remove_stack(name)


def set_config(st: Any, key: str, value: Any) -> None:
    from pulumi import automation as auto

    text = value if isinstance(value, str) else json.dumps(value)
    st.set_config(key, auto.ConfigValue(value=text), path=False)


def _region(st: Any) -> str:
    return st.get_config("aws:region").value


def _cluster_name(st: Any) -> str:
    from eks_ddp.config import cluster_name_for

    return cluster_name_for(st.name)


def _delete_log_group(st: Any) -> None:
    import boto3

    logs = boto3.client("logs", region_name=_region(st))
    try:
        logs.delete_log_group(logGroupName=f"/aws/eks/{_cluster_name(st)}/cluster")
    except logs.exceptions.ResourceNotFoundException:
        pass


def _delete_results_bucket(st: Any, outputs: dict[str, Any]) -> None:
    import boto3

    bucket = (outputs.get("results") or {}).get("bucket")
    if not bucket:
        return
    s3 = boto3.resource("s3", region_name=_region(st)).Bucket(bucket)
    s3.object_versions.delete()  # versioned: every version and delete marker
    s3.delete()


def up_and_train(st: Any, tmp_path) -> dict[str, Any]:
    """`pulumi up`, then wait for the training Job to complete; returns the outputs."""
    outputs = st.up(on_output=print).outputs
    assert outputs["kubeconfig"].secret
    kubeconfig = tmp_path / f"kubeconfig-{uuid.uuid4().hex[:4]}"
    kubeconfig.write_text(outputs["kubeconfig"].value)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    job_cfg = json.loads(st.get_config("eks-ddp:job").value)
    ns = job_cfg.get("namespace", "training")
    job = outputs["trainingJobName"].value  # the name the component gave the Job, not a guess
    subprocess.run(["kubectl", "-n", ns, "wait", "--for=condition=complete", f"job/{job}",
                    f"--timeout={JOB_TIMEOUT_S}s"], env=env, check=True)
    # Results land in the stack's bucket: the run's metrics.json is the proof the trainer finished
    # (pod logs may already be gone once the success policy ended the lingering pods).
    import boto3

    results = outputs["results"].value
    s3 = boto3.client("s3", region_name=_region(st))
    metrics = json.loads(s3.get_object(Bucket=results["bucket"], Key=f"{results['prefix']}metrics.json")["Body"].read())
    assert metrics["epochs"] == job_cfg["epochs"], metrics
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["total"] == 10000, metrics
    return {k: v.value for k, v in outputs.items()}


def assert_nothing_left(st: Any, outputs: dict[str, Any]) -> None:
    """After destroy: every billable resource of the stack is gone from AWS (bounded wait)."""
    import boto3
    from botocore.exceptions import ClientError

    region, name = _region(st), _cluster_name(st)
    eks, ec2 = boto3.client("eks", region_name=region), boto3.client("ec2", region_name=region)
    ecr, efs = boto3.client("ecr", region_name=region), boto3.client("efs", region_name=region)
    repo = outputs["imageRef"].split("/", 1)[1].split("@", 1)[0]

    def gone(call, missing: tuple[str, ...]) -> bool:
        try:
            call()
        except ClientError as err:
            return err.response["Error"]["Code"] in missing
        return False

    checks = {
        "EKS cluster": lambda: gone(lambda: eks.describe_cluster(name=name), ("ResourceNotFoundException",)),
        "ECR repository": lambda: gone(lambda: ecr.describe_repositories(repositoryNames=[repo]),
                                       ("RepositoryNotFoundException",)),
        "EFS file system": lambda: gone(lambda: efs.describe_file_systems(FileSystemId=outputs["efsId"]),
                                        ("FileSystemNotFound",)),
        "VPC": lambda: not ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": [f"{name}-vpc"]}])["Vpcs"],
    }
    deadline = time.monotonic() + GONE_TIMEOUT_S
    left = [what for what in checks if not checks[what]()]
    while left and time.monotonic() < deadline:  # deletions settle (ENIs, mount targets): bounded wait
        time.sleep(30)
        left = [what for what in left if not checks[what]()]
    assert not left, f"left behind after pulumi destroy: {left}"
    assert st.export_stack().deployment.get("resources") in (None, []), "the stack still holds resources"
    # The results bucket is kept on purpose ("kept" means kept): it must still be there, then the test removes it.
    s3 = boto3.client("s3", region_name=region)
    s3.head_bucket(Bucket=outputs["results"]["bucket"])
    _delete_results_bucket(st, outputs)


def test_dev_stack_lifecycle(stack, tmp_path):
    first = up_and_train(stack, tmp_path)

    # A config change is an update of the running stack: the job is re-created and resumes.
    job = json.loads(stack.get_config("eks-ddp:job").value)
    set_config(stack, "eks-ddp:job", {**job, "epochs": job["epochs"] + 1})
    up_and_train(stack, tmp_path)

    stack.destroy(on_output=print)
    assert_nothing_left(stack, first)

    # A re-deploy of the same stack after destroy (same cluster name, the kept log group is adopted).
    again = up_and_train(stack, tmp_path)
    resources = stack.export_stack().deployment["resources"]
    assert any(r["type"] == "aws:cloudwatch/logGroup:LogGroup" for r in resources)

    stack.destroy(on_output=print)
    assert_nothing_left(stack, again)


# --- day two: resize, resize during a run, upgrade, a second stack ------------------------------------------------

def upgrade_path() -> tuple[str, str]:
    """(from, to): the supported minor just below the default, and the default (one minor up)."""
    from eks_ddp.core import k8s_versions

    versions = list(k8s_versions.SUPPORTED_VERSIONS)
    to = k8s_versions.DEFAULT_VERSION
    return versions[versions.index(to) - 1], to


def live_groups(region: str, cluster: str) -> dict[str, dict[str, Any]]:
    """The cluster's managed node groups by pool/group label: {"system": {...}, "<gpu group>": {...}}."""
    import boto3

    eks = boto3.client("eks", region_name=region)
    out = {}
    for name in eks.list_nodegroups(clusterName=cluster)["nodegroups"]:
        group = eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"]
        labels = group.get("labels") or {}
        out[labels.get("eks-ddp/node-group") or labels.get("eks-ddp/pool", name)] = group
    return out


def scaling(group: dict[str, Any]) -> tuple[int, int, int]:
    s = group["scalingConfig"]
    return int(s["minSize"]), int(s["desiredSize"]), int(s["maxSize"])


def versions_of(region: str, cluster: str) -> dict[str, str]:
    """The control plane's and every node group's Kubernetes minor."""
    import boto3

    eks = boto3.client("eks", region_name=region)
    out = {"cluster": eks.describe_cluster(name=cluster)["cluster"]["version"]}
    out |= {k: g["version"] for k, g in live_groups(region, cluster).items()}
    return out


def wait_for_gpu_nodes(region: str, cluster: str, group: str, at_least: int, timeout_s: int = 1800) -> int:
    """Bounded wait until the autoscaler has brought ``at_least`` nodes to ``group``; returns the desired size."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        desired = scaling(live_groups(region, cluster)[group])[1]
        if desired >= at_least:
            return desired
        time.sleep(30)
    raise AssertionError(f"{group} did not reach {at_least} nodes in {timeout_s} s")


def test_day_two_lifecycle(stack, tmp_path):
    from pulumi import automation as auto

    from tests.support.util import at_version

    region, cluster = _region(stack), _cluster_name(stack)
    before, after = upgrade_path()
    raw = at_version(stack_config("dev"), before)
    set_config(stack, "eks-ddp:cluster", {**json.loads(stack.get_config("eks-ddp:cluster").value),
                                          "kubernetesVersion": before, "systemNodeCount": 1,
                                          "upgradePolicy": raw["eks-ddp:cluster"].get("upgradePolicy", "STANDARD")})
    up_and_train(stack, tmp_path)

    # Resize the system group 1 -> 2: min == max == desired, sent whole (no stale desired size).
    cluster_cfg = json.loads(stack.get_config("eks-ddp:cluster").value)
    set_config(stack, "eks-ddp:cluster", {**cluster_cfg, "systemNodeCount": 2})
    stack.up(on_output=print)
    assert scaling(live_groups(region, cluster)["system"]) == (2, 2, 2)

    # Resize a GPU group while a run's nodes are up: raise maxSize; the live desired size is kept (refresh).
    job = json.loads(stack.get_config("eks-ddp:job").value)
    set_config(stack, "eks-ddp:job", {**job, "runId": f"{job['runId']}-b", "epochs": 4})
    outputs = stack.up(on_output=print).outputs
    groups = json.loads(stack.get_config("eks-ddp:nodeGroups").value)
    gpu = groups[0]["name"]
    running = wait_for_gpu_nodes(region, cluster, gpu, job.get("nodes", 2))
    set_config(stack, "eks-ddp:nodeGroups", [{**groups[0], "maxSize": groups[0].get("maxSize", 2) + 1}, *groups[1:]])
    stack.up(on_output=print)
    assert scaling(live_groups(region, cluster)[gpu])[1] >= running, "the resize scaled in the run's nodes"
    kubeconfig = tmp_path / "kubeconfig-day2"
    kubeconfig.write_text(outputs["kubeconfig"].value)
    subprocess.run(["kubectl", "-n", job.get("namespace", "training"), "wait", "--for=condition=complete",
                    f"job/{outputs['trainingJobName'].value}", f"--timeout={JOB_TIMEOUT_S}s"],
                   env={**os.environ, "KUBECONFIG": str(kubeconfig)}, check=True)

    # Upgrade one minor: the control plane and every node group follow; the autoscaler image follows too.
    cluster_cfg = json.loads(stack.get_config("eks-ddp:cluster").value)
    set_config(stack, "eks-ddp:cluster", {**cluster_cfg, "kubernetesVersion": after, "upgradePolicy": "STANDARD"})
    stack.up(on_output=print)
    assert set(versions_of(region, cluster).values()) == {after}

    # A second stack in the same account asking for this cluster's name: refused before it creates anything.
    other = auto.create_stack(stack_name=f"{stack.name}-b", work_dir=str(ROOT), opts=auto.LocalWorkspaceOptions(
        env_vars=stack.workspace.env_vars, work_dir=str(ROOT)))
    try:
        for key, value in stack.get_all_config().items():
            other.set_config(key, value)
        cluster_cfg = json.loads(stack.get_config("eks-ddp:cluster").value)
        set_config(other, "eks-ddp:cluster", {**cluster_cfg, "name": cluster})
        with pytest.raises(auto.errors.CommandError, match="belongs to stack"):
            other.up(on_output=print)
        assert other.export_stack().deployment.get("resources") in (None, []) or all(
            r["type"].startswith("pulumi:") for r in other.export_stack().deployment["resources"])
    finally:
        other.workspace.remove_stack(other.name)

