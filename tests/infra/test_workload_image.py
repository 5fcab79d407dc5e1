"""Run images are pullable by the nodes and gated like the stack's image (B1, U1, T10).

The node role pulls only what it is granted (components/eks_ddp/infra/cluster.py), so every distinct ``runs[i].workload.image``
in ECR gets a pull-only grant on exactly its repository (partition-aware ARN) and passes the ECR scan gate before
any Job gets it; a library ElasticJob does the same given ``node_role_name``.
"""

from __future__ import annotations

import json

import pulumi
import pytest

from eks_ddp import ElasticJob, Workload
from eks_ddp.infra.image import ecr_repository_arn
from eks_ddp.infra.workload_image import WorkloadImage, WorkloadImageArgs, workload_image_name
from eks_ddp.tooling.mocks import run_program
from tests.support.job_args import job_args
from tests.support.util import BYO_OTHER_ACCOUNT_IMAGE, BYO_OWN_ACCOUNT_IMAGE, byo_stack_config, run

POLICY = "aws:iam/rolePolicy:RolePolicy"
GATE = "pulumi-python:dynamic:Resource"
JOB = "kubernetes:batch/v1:Job"
BERT_REPO = "arn:aws:ecr:us-west-2:123456789012:repository/nlp/bert"
VIT_REPO = "arn:aws:ecr:us-west-2:210987654321:repository/vision/vit"
NGC_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3@sha256:" + "d3" * 32
STACK_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:" + "ab" * 32


def pull_grants(result, role: str = "cluster-node") -> dict[str, list[str]]:
    """Repository ARN -> names of the inline policies on ``role`` that allow ecr:BatchGetImage on it."""
    out: dict[str, list[str]] = {}
    for p in result.of_type(POLICY):
        if p.inputs["role"] != role:
            continue
        for st in json.loads(p.inputs["policy"])["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            if st["Effect"] == "Allow" and "ecr:BatchGetImage" in actions:
                for r in resources:
                    out.setdefault(r, []).append(p.name)
    return out


def test_every_run_image_repository_is_pullable_by_the_node_role(byo_result):
    grants = pull_grants(byo_result)
    assert grants[BERT_REPO] == ["run-image-bert-b1b1b1b1-node-pull"]
    assert grants[VIT_REPO] == ["run-image-vit-c2c2c2c2-node-pull"]  # the tag is not part of the repository
    for name in ("run-image-bert-b1b1b1b1-node-pull", "run-image-vit-c2c2c2c2-node-pull"):
        policy = json.loads(byo_result.one(POLICY, name).inputs["policy"])
        # Least privilege: that one repository, plus the login GetAuthorizationToken needs on "*".
        assert [s["Resource"] for s in policy["Statement"]] in ([BERT_REPO, "*"], [VIT_REPO, "*"])


def test_every_run_image_passes_the_scan_gate_before_its_jobs_get_it(byo_result):
    gates = {g.inputs["image_ref"]: g for g in byo_result.of_type(GATE)}
    assert {BYO_OWN_ACCOUNT_IMAGE, BYO_OTHER_ACCOUNT_IMAGE} <= set(gates)
    assert all(g.inputs["setting"] == "eks-ddp:image.scanFailSeverity" for g in gates.values())
    grants = {p.name: p.urn for p in byo_result.of_type(POLICY)}
    for image, job_names in ((BYO_OWN_ACCOUNT_IMAGE, ("training-bert-1-bert-1", "training-bert-1-stage-data")),
                             (BYO_OTHER_ACCOUNT_IMAGE, ("training-vit-1-vit-1",))):
        gate = gates[image]
        grant = grants[f"run-image-{workload_image_name(image)}-node-pull"]
        for name in job_names:
            job = next(j for j in byo_result.of_type(JOB) if j.inputs["metadata"]["name"] == name)
            assert job.inputs["spec"]["template"]["spec"]["containers"][0]["image"] == image
            # A data dependency: Kubernetes gets the Job only once the gate passed and the grant exists.
            assert gate.urn in job.dependencies and grant in job.dependencies, name


def test_one_grant_per_distinct_image_and_none_outside_ecr():
    cfg = byo_stack_config()
    cfg["eks-ddp:runs"] = [
        {"runId": "bert-1", "workload": {"image": BYO_OWN_ACCOUNT_IMAGE, "module": "bert.train"}},
        {"runId": "bert-2", "workload": {"image": BYO_OWN_ACCOUNT_IMAGE, "module": "bert.train"}},
        {"runId": "ngc-1", "workload": {"image": NGC_IMAGE, "module": "bert.train"}},
    ]
    result = run(cfg)
    grants = pull_grants(result)
    assert grants[BERT_REPO] == ["run-image-bert-b1b1b1b1-node-pull"]
    assert not [r for r in grants if "nvcr" in r or "pytorch" in r]
    gated = [g.inputs["image_ref"] for g in result.of_type(GATE)]
    assert gated.count(BYO_OWN_ACCOUNT_IMAGE) == 1 and NGC_IMAGE not in gated  # no ECR scan to read for nvcr.io
    ngc = next(j for j in result.of_type(JOB) if j.inputs["metadata"]["name"] == "training-ngc-1-ngc-1")
    assert ngc.inputs["spec"]["template"]["spec"]["containers"][0]["image"] == NGC_IMAGE


@pytest.mark.parametrize("image, arn", [
    ("123456789012.dkr.ecr.us-gov-west-1.amazonaws.com/a/b@sha256:" + "0" * 64,
     "arn:aws-us-gov:ecr:us-gov-west-1:123456789012:repository/a/b"),
    ("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/a@sha256:" + "0" * 64,
     "arn:aws-cn:ecr:cn-north-1:123456789012:repository/a"),
    ("123456789012.dkr.ecr-fips.us-east-1.amazonaws.com/a:v1@sha256:" + "0" * 64,
     "arn:aws:ecr:us-east-1:123456789012:repository/a"),
    ("123456789012.dkr-ecr.eu-west-1.on.aws/team/a@sha256:" + "0" * 64,  # the dual-stack registry host
     "arn:aws:ecr:eu-west-1:123456789012:repository/team/a"),
    (NGC_IMAGE, None),
])
def test_the_repository_arn_names_the_registrys_partition(image, arn):
    from eks_ddp.infra.scan_gate import scan_target

    assert ecr_repository_arn(image) == arn
    target = scan_target(image)  # the scan gate and preflight read the same registry, region and repository
    assert (target is None) == (arn is None)
    if target:
        assert arn == f"arn:{arn.split(':')[1]}:ecr:{target['region']}:{target['account']}:repository/{target['repo']}"


def test_a_library_elastic_job_builds_no_aws_resource_for_its_image():
    """One door for images: an ElasticJob given a workload.image string builds no grant and no gate of its own
    (the WorkloadImage is infra's); its pods run the image as given."""
    def program() -> None:
        import pulumi_kubernetes as k8s

        provider = k8s.Provider("k8s", kubeconfig="{}")
        job = ElasticJob("ft", job_args(
            namespace="ml", pvc_name="shared", instance_type="g4dn.xlarge", nodes=1, rdzv_backend="c10d",
            workload=Workload(name="bert", module="bert.train", image=BYO_OTHER_ACCOUNT_IMAGE)),
            opts=pulumi.ResourceOptions(provider=provider))
        pulumi.export("image", job.image)

    result = run_program({}, program=program)
    assert not [r for r in result.resources if r.type.startswith("aws:")] and not result.of_type(GATE)
    assert result.outputs["image"] == BYO_OTHER_ACCOUNT_IMAGE


def test_workload_image_args_name_the_bad_field():
    with pytest.raises(ValueError, match=r"image: got 'bert:latest'; expected an image pinned by digest"):
        WorkloadImageArgs(image="bert:latest")
    with pytest.raises(ValueError, match=r"scan_fail_severity: got 'SEVERE'; expected one of CRITICAL"):
        WorkloadImageArgs(image=BYO_OWN_ACCOUNT_IMAGE, scan_fail_severity="SEVERE")


def test_an_output_image_is_taken_as_it_is():
    def program() -> None:
        made = WorkloadImage("img", WorkloadImageArgs(image=BYO_OWN_ACCOUNT_IMAGE, node_role_name="r"))
        ElasticJob("ft", job_args(
            namespace="ml", image=STACK_IMAGE, pvc_name="shared", instance_type="g4dn.xlarge", nodes=1,
            rdzv_backend="c10d",
            workload=Workload(name="bert", module="bert.train", image=made.image_ref)))

    result = run_program({}, program=program)
    assert pull_grants(result, "r") == {BERT_REPO: ["img-node-pull"]} and len(result.of_type(GATE)) == 1
