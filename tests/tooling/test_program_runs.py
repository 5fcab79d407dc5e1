"""The program runs one ElasticJob per entry of ``eks-ddp:runs``: adding a run never changes another's resources."""

from __future__ import annotations

from tests.config.test_runs import DIGEST, with_runs
from tests.support.util import run, stack_config

JOB = "kubernetes:batch/v1:Job"
EFS_POLICY = "aws:efs/fileSystemPolicy:FileSystemPolicy"


def _by_urn(result) -> dict[str, dict]:
    return {r.urn: r.inputs for r in result.resources}


def test_adding_a_run_leaves_the_first_runs_resources_identical():
    a = {"runId": "a", "nodes": 1}
    b = {"runId": "b", "nodes": 2, "minNodes": 2, "workload": {"image": DIGEST, "module": "bert.train",
                                                               "args": ["--out=$(EKS_DDP_RUN_DIR)"]}}
    one, two = run(with_runs(a)), run(with_runs(a, b))
    before, after = _by_urn(one), _by_urn(two)
    assert set(before) <= set(after)
    changed = sorted(urn for urn in before if before[urn] != after[urn])
    # Only the file system policy and the CSI role's mount policy change: both admit b's access point too.
    assert [u.rsplit("::", 1)[1] for u in changed] == ["storage-policy", "storage-efs-csi-mount"], changed
    assert [u.rsplit("::", 1)[0].rsplit("$", 1)[1] for u in changed] == [EFS_POLICY,
                                                                         "aws:iam/rolePolicy:RolePolicy"]
    # b's own Job, claim, role: named after its runId.
    train_b = two.one(JOB, "training-b-train").inputs
    assert train_b["metadata"]["name"] == "training-b-b"
    [c] = train_b["spec"]["template"]["spec"]["containers"]
    assert c["image"] == DIGEST and c["command"][-3:] == ["-m", "bert.train", "--out=/shared/runs/b"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in train_b["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"shared-data-ro", "shared-run-b"}
    assert two.one("aws:iam/role:Role", "results-uploader-b")
    assert not [r for r in two.of_type(JOB) if r.name == "training-b-prepare-data"]  # no CIFAR-10 for b
    # Negative control: the comparison sees a change to run a.
    three = _by_urn(run(with_runs({**a, "maxRestarts": 3}, b)))
    assert sorted(urn for urn in before if before[urn] != three.get(urn)) != changed


def test_each_run_exports_its_commands_with_the_stacks_profile():
    cfg = with_runs({"runId": "a", "nodes": 1}, {"runId": "b", "nodes": 1})
    cfg["aws:profile"] = "research"
    out = run(cfg).outputs
    runs = out["runs"]
    assert sorted(runs) == ["a", "b"]
    b = runs["b"]
    assert b["follow"].startswith("kubectl -n training logs -f ") and "instance=training-b-b" in b["follow"]
    assert b["status"] == "kubectl -n training get job training-b-b -o wide"
    assert b["cancel"] == ("kubectl -n training delete job training-b-b --ignore-not-found "  # queued: Kueue's
                           "&& pulumi config set --path 'runs[1].state' cancelled")
    assert b["fetchResults"].startswith("eks-ddp-fetch-results s3://") and "/runs/b/ " in b["fetchResults"]
    assert b["fetchResults"].endswith("--out results/b --profile research")
    assert out["kubectl"].startswith("aws eks update-kubeconfig --region ") and "--profile research &&" in \
        out["kubectl"]
    # Control: without aws:profile no --profile anywhere.
    plain = run(with_runs({"runId": "a", "nodes": 1})).outputs
    assert "--profile" not in plain["kubectl"] and "--profile" not in plain["runs"]["a"]["fetchResults"]


def test_the_job_form_keeps_its_names():
    result = run(stack_config("dev"))
    assert result.one(JOB, "training-train").inputs["metadata"]["name"] == "training-run-1"
    assert sorted(result.outputs["runs"]) == ["run-1"]
    assert result.outputs["trainingJobName"] == "training-run-1"


def test_fetch_results_reads_with_the_profile_it_is_given(tmp_path, capsys, monkeypatch):
    from eks_ddp_local import fetch_results

    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    rc = fetch_results.main(["s3://bucket/runs/b/", "--profile", "research", "--out", str(tmp_path / "out")])
    assert rc == 1 and "profile (research) could not be found" in capsys.readouterr().err


def test_a_plan_with_a_custom_s3_run_passes_the_strict_kubernetes_schema(tmp_path):
    import yaml

    from eks_ddp.tooling.plan import render_manifests, write_manifests
    from tests.support.kueue_schema import strict_problems

    cfg = with_runs({"runId": "a", "nodes": 1}, {"runId": "b", "nodes": 1, "workload": {
        "image": DIGEST, "script": "/app/train.py", "args": ["--x"], "env": {"MODE": "fast"},
        "data": {"s3": "s3://my-data/wiki/"}}})
    write_manifests(render_manifests(run(cfg)), tmp_path)
    version = cfg["eks-ddp:cluster"]["kubernetesVersion"]
    names, errors = set(), []
    for path in sorted(tmp_path.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        names.add(doc["metadata"]["name"])
        errors += [f"{path.name}: {e}" for e in strict_problems(doc, version)]  # Kueue's: the pinned CRDs
    assert not errors, "\n".join(errors)
    assert {"training-b-stage-data", "training-b-b", "training-b-stage"} <= names
