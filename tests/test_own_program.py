"""A platform engineer's own Pulumi program, outside this repository, on the installed library (issue 21).

The program has its own ``components/`` package, installs eks-ddp from a built wheel (not editable, no torch),
brings its own VPC, defines one GPU group, an S3 data stage and two runs of its own image and entrypoint,
and is previewed offline with the documented command (``eks-ddp-plan --project-dir``). The rendered Jobs
must run that entrypoint under the elastic launcher.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.test_library import installed  # noqa: F401  (pytest fixture: a non-editable install of the wheel)

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/ml/bert-ft@sha256:" + "ab" * 32

PROGRAM = textwrap.dedent('''
    """myinfra: a team's own program on the eks-ddp library."""
    import pulumi
    import pulumi_kubernetes as k8s

    import components  # this project's own package of the same name as eks-ddp's source folder
    from eks_ddp import (EfsStore, EfsStoreArgs, EksCluster, EksClusterArgs, ElasticJob, ElasticJobArgs,
                         EtcdRendezvous, EtcdRendezvousArgs, EtcdStore, GpuNodeGroup, GpuNodeGroupArgs, Network,
                         NetworkArgs, PerRunClaims, Placement, S3Data, Size, Workload, WorkloadImage,
                         WorkloadImageArgs, data_stage_role)

    assert components.OWNER == "myinfra"
    cfg = pulumi.Config()  # this project's namespace: myinfra:*
    name = cfg.require("clusterName")
    net = Network("net", NetworkArgs(cluster_name=name, vpc_id=cfg.require("vpcId"),
                                     public_subnet_ids=cfg.require_object("publicSubnets"),
                                     private_subnet_ids=cfg.require_object("privateSubnets")))
    cluster = EksCluster("eks", EksClusterArgs(cluster_name=name, vpc_id=net.vpc_id,
                                               public_subnet_ids=net.public_subnet_ids,
                                               private_subnet_ids=net.private_subnet_ids,
                                               public_access_cidrs=["203.0.113.7/32"]))
    gpus = GpuNodeGroup("gpus", GpuNodeGroupArgs(
        group_name="a10g", cluster_name=cluster.cluster_name, node_role_arn=cluster.node_role_arn,
        subnet_ids=net.private_subnet_ids, subnet_by_az=net.private_subnet_by_az,
        node_security_group_id=cluster.node_security_group_id,
        cluster_security_group_id=cluster.cluster_security_group_id, vpc_id=net.vpc_id,
        instance_type="g5.12xlarge", min_size=0, max_size=4))
    provider = k8s.Provider("k8s", kubeconfig=cluster.kubeconfig)
    opts = pulumi.ResourceOptions(provider=provider)
    ns = k8s.core.v1.Namespace("ns", metadata={"name": "ml"}, opts=opts)
    store = EfsStore("efs", EfsStoreArgs(
        cluster_name=cluster.cluster_name, vpc_id=net.vpc_id,
        subnet_ids=list(net.private_subnet_by_az.values()),
        node_security_group_id=cluster.node_security_group_id, oidc_provider_arn=cluster.oidc_provider_arn,
        oidc_provider_url=cluster.oidc_provider_url, namespace="ml", run_id="bert-a", more_run_ids=("bert-b",)),
        opts=pulumi.ResourceOptions(providers={"kubernetes": provider}, depends_on=[ns]))
    etcd = EtcdRendezvous("rdzv", EtcdRendezvousArgs(namespace="ml"), opts=opts)
    data = S3Data(uri="s3://team-datasets/glue/sst2/", name="sst2")
    # The image's door is infra's: the nodes' pull grant and the scan gate, then its reference goes to the jobs.
    image = WorkloadImage("bert-image", WorkloadImageArgs(image="''' + IMAGE + '''",
                                                          node_role_name=cluster.node_role_name)).image_ref
    for run_id, lr in (("bert-a", "1e-4"), ("bert-b", "3e-5")):
        job_name = f"ft-{run_id}"
        workload = Workload(name="bert-ft", module="myproj.finetune", args=("--lr", lr, "--epochs", "3"),
                            image=image, data=data)
        role = data_stage_role(f"stage-{run_id}", data, oidc_provider_arn=cluster.oidc_provider_arn,
                               oidc_provider_url=cluster.oidc_provider_url, namespace="ml", job_name=job_name)
        job = ElasticJob(job_name, ElasticJobArgs(
            namespace="ml", workload=workload, placement=Placement.on(gpus), size=Size(nodes=2, min_nodes=1),
            storage=PerRunClaims(data=store.data_claim_name, run=store.run_claim_names[run_id]),
            rendezvous=EtcdStore.of(etcd), run_id=run_id, data_role_arn=role), opts=opts)
        pulumi.export(f"follow-{run_id}", job.follow_command)
''')


def _project(root: Path) -> Path:
    project = root / "myinfra"
    (project / "components").mkdir(parents=True)
    (project / "components" / "__init__.py").write_text("OWNER = 'myinfra'\n")
    (project / "Pulumi.yaml").write_text("name: myinfra\nruntime: python\ndescription: our training\n")
    (project / "Pulumi.dev.yaml").write_text(textwrap.dedent("""
        config:
          aws:region: us-west-2
          myinfra:clusterName: ml-dev
          myinfra:vpcId: vpc-0123456789abcdef0
          myinfra:publicSubnets: [subnet-0aaaaaaaaaaaaaaa1, subnet-0aaaaaaaaaaaaaaa2]
          myinfra:privateSubnets: [subnet-0bbbbbbbbbbbbbbb1, subnet-0bbbbbbbbbbbbbbb2]
    """))
    (project / "__main__.py").write_text(PROGRAM)
    return project


def _plan(installed: Path, project: Path, cwd: Path, out: Path) -> subprocess.CompletedProcess:  # noqa: F811
    """The documented command, as the console script the wheel installs, with torch unimportable."""
    script = installed / "bin" / "eks-ddp-plan"
    assert script.exists(), sorted(p.name for p in (installed / "bin").iterdir())
    blocker = cwd / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nfor m in ('torch', 'torchvision', 'matplotlib', 'etcd'):\n    sys.modules[m] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(installed)])}
    return subprocess.run([sys.executable, str(script), "--project-dir", str(project), "--stack", "dev",
                           "--out", str(out)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_users_own_program_previews_offline_and_runs_its_entrypoint_under_the_launcher(
        installed, tmp_path):  # noqa: F811
    project = _project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "manifests"
    done = _plan(installed, project, elsewhere, out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]

    docs = [d for f in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    jobs = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Job"}
    train = [j for j in jobs.values() if "eks_ddp_runtime.launch" in " ".join(_command(j))]
    assert len(train) == 2, sorted(jobs)
    for job, lr in zip(sorted(train, key=lambda j: j["metadata"]["name"]), ("1e-4", "3e-5"), strict=True):
        command = _command(job)
        launch = command.index("eks_ddp_runtime.launch")
        assert command[launch - 1] == "-m"
        entry = command.index("myproj.finetune")
        assert command[entry - 1] == "-m" and entry > launch
        assert command[entry + 1:] == ["--lr", lr, "--epochs", "3"], command
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == IMAGE
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env["EKS_DDP_DATA_DIR"].endswith("/sst2"), env
        assert "prepare_data" not in " ".join(command)  # no CIFAR-10 anywhere near this program

    stages = [j for j in jobs.values() if "eks_ddp_runtime.stage_s3" in " ".join(_command(j))]
    assert stages and all("s3://team-datasets/glue/sst2/" in _command(j) for j in stages), sorted(jobs)
    assert not [j for j in jobs.values() if "eks_ddp_trainer.prepare_data" in " ".join(_command(j))]
    assert "ml-dev" in done.stdout or "myinfra" in done.stdout, done.stdout[-2000:]
    # The nodes may pull the image: infra's WorkloadImage grants the node role pull on its repository once (and
    # gates it); the jobs make no AWS resource of their own.
    assert "bert-image-node-pull" in done.stdout and "ft-bert-a-image-node-pull" not in done.stdout, \
        done.stdout[-3000:]


def _command(job: dict) -> list[str]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return [*container.get("command", []), *container.get("args", [])]
