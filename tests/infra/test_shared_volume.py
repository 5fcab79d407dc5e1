"""What each pod of the stack sees of the shared volume (security review S2, S3), on the dev stack under mocks.

Per workload: the data stage writes the dataset and nothing else; the training, fabric-check and
evaluation pods read the dataset (read-only) and write only their own run's directory. The Job pins
the dataset the loaders accept (``EKS_DDP_DATA_PIN``).
"""

from __future__ import annotations

import pytest

from eks_ddp_trainer import integrity
from tests.workloads.test_elastic_job import run_job

JOB = "kubernetes:batch/v1:Job"


def _templates(result) -> dict[str, dict]:
    jobs = {r.name.removeprefix("training-"): r.inputs["spec"]["template"] for r in result.of_type(JOB)}
    cron = result.one("kubernetes:batch/v1:CronJob").inputs["spec"]["jobTemplate"]["spec"]["template"]
    return {"train": jobs["train"], "prepare": jobs["prepare-data"], "evaluate": cron}


def _shared(template: dict) -> dict[str, tuple[str, bool, bool]]:
    """mount path -> (claim, mount readOnly, claim readOnly) for every claim-backed volume."""
    spec = template["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
    mounts = spec["containers"][0]["volumeMounts"]
    return {m["mountPath"]: (claims[m["name"]]["claimName"], bool(m.get("readOnly")),
                             bool(claims[m["name"]].get("readOnly"))) for m in mounts if m["name"] in claims}


def test_each_pod_mounts_the_dataset_and_only_its_own_run(dev_result):
    run_dir = "/shared/runs/run-1"
    data_claim, run_claim = dev_result.outputs["dataClaimName"], dev_result.outputs["pvcName"]
    assert run_claim.endswith("-run-1")
    t = _templates(dev_result)
    assert _shared(t["prepare"]) == {"/shared/data": (data_claim, False, False)}
    # T12: every pod that only reads the dataset mounts it through the read-only access point's claim.
    for kind in ("train", "evaluate"):
        assert _shared(t[kind]) == {"/shared/data": (f"{data_claim}-ro", True, True),
                                    run_dir: (run_claim, False, False)}, kind


def test_the_job_pins_the_official_dataset_for_every_loader(dev_result):
    t = _templates(dev_result)
    for kind in ("train", "evaluate"):
        env = {e["name"]: e.get("value") for e in t[kind]["spec"]["containers"][0]["env"]}
        assert env[integrity.PIN_ENV] == integrity.CIFAR10_PIN, kind


def test_a_whole_volume_claim_is_still_accepted_for_library_users():
    t = _templates(run_job())  # pvc_name="shared"
    assert _shared(t["train"]) == {"/shared": ("shared", False, False)}


@pytest.mark.parametrize("storage", ["shared", None, {"data": "d", "run": "r"}])
def test_storage_is_per_run_claims_or_the_whole_volume(storage):
    """The two ways are the union's two parts, so "both at once" and "neither" cannot be written; anything else in
    the field is refused naming it and both parts."""
    import dataclasses

    from tests.support.job_args import job_args
    from tests.workloads.test_elastic_job import ETCD, GPU_NODES, IMAGE, RDZV_TLS_SECRET

    good = job_args(namespace="training", image=IMAGE, pvc_name="shared", instance_type="g4dn.xlarge",
                    node_selector=GPU_NODES, nodes=2, min_nodes=1, rdzv_endpoint=ETCD, rdzv_tls_secret=RDZV_TLS_SECRET)
    with pytest.raises(ValueError, match=r"storage: got .*; expected PerRunClaims\(data=\.\.\., run=\.\.\.\) or "
                                         r"WholeVolume\(claim=\.\.\.\)"):
        dataclasses.replace(good, storage=storage)
    assert dataclasses.replace(good, storage=good.storage).storage == good.storage  # control: a part is accepted


def test_the_stack_locks_its_file_system_to_tls_and_its_access_points(dev_result):
    """S2 on the whole program: EFS's default policy (full access, root included, no TLS) is never left on."""
    import json

    policies = dev_result.of_type("aws:efs/fileSystemPolicy:FileSystemPolicy")
    assert len(policies) == 1
    statements = json.loads(policies[0].inputs["policy"])["Statement"]
    denies = {s["Sid"]: s for s in statements if s["Effect"] == "Deny"}
    assert denies["DenyWithoutTls"]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert denies["DenyRootAccess"]["Action"] == "elasticfilesystem:ClientRootAccess"
    aps = sorted(ap.outputs["arn"] for ap in dev_result.of_type("aws:efs/accessPoint:AccessPoint"))
    assert len(aps) == 3  # data, data read-only, run
    assert sorted(denies["DenyOtherThanStackAccessPoints"]["Condition"]["StringNotEquals"][
        "elasticfilesystem:AccessPointArn"]) == aps
