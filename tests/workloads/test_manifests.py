"""The Kubernetes manifests the dev and p4de stacks would apply: schema, security scan, torchrun command.

Manifests come from the offline plan (eks_ddp.tooling.plan.render_manifests) of the whole program.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import latest_version
from kubernetes_validate.utils import major_minor
from torch.distributed.run import get_args_parser

from eks_ddp.config import PROJECT, SUPPORTED_KUBERNETES_VERSIONS, StackConfig, load_stack_config
from eks_ddp.core import catalog
from eks_ddp.tooling.plan import load_stack_file, render_manifests, write_manifests
from tests.support.kueue_schema import strict_problems
from tests.support.util import ROOT

CHECKOV = ROOT / ".venv-scan" / "bin" / "checkov"
SKIPS_FILE = Path(__file__).parents[1] / "checkov-skips.yaml"
STACKS = ("dev", "p4de")
EXPECTED_GPUS = {"dev": 1, "p4de": 8}
OUR_KINDS = {"Job", "CronJob", "StatefulSet", "Secret", "Service", "ServiceAccount", "NetworkPolicy", "PodDisruptionBudget",
             "PriorityClass"}


def stack(name: str) -> StackConfig:
    raw = load_stack_file(name)
    ours = {k: v for k, v in raw.items() if k.startswith(PROJECT + ":")}  # as __main__.py reads it
    return load_stack_config(ours, region=raw.get("aws:region"), placeholders_ok=True)  # as the offline plan


@pytest.fixture(scope="module")
def manifests(dev_result, p4de_result) -> dict[str, list[dict]]:
    return {"dev": render_manifests(dev_result), "p4de": render_manifests(p4de_result)}


@pytest.fixture(scope="module")
def manifest_dir(manifests, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifests")
    for name, docs in manifests.items():
        write_manifests(docs, root / name)
    return root


def training_job(docs: list[dict]) -> dict:
    [job] = [m for m in docs if m["kind"] == "Job"
             and (m["metadata"].get("annotations") or {}).get("pulumi.com/skipAwait") == "true"]
    return job


def test_kubernetes_validate_knows_every_supported_version():
    assert all(major_minor(v) <= major_minor(latest_version()) for v in SUPPORTED_KUBERNETES_VERSIONS)


@pytest.mark.parametrize("name", STACKS)
def test_every_manifest_passes_the_strict_schema(name, manifest_dir):
    version = stack(name).cluster.kubernetes_version
    files = sorted((manifest_dir / name).glob("*.yaml"))
    kinds = set()
    errors = []
    for path in files:
        doc = yaml.safe_load(path.read_text())
        kinds.add(doc["kind"])
        # Unknown kinds raise SchemaNotFoundError: no silent pass. Kueue's objects: the pinned CRDs' schemas.
        errors += [f"{path.name}: {e}" for e in strict_problems(doc, version)]
    assert not errors, "\n".join(errors)
    assert OUR_KINDS <= kinds, f"missing kinds: {OUR_KINDS - kinds}"


def test_checkov_finds_nothing_beyond_the_documented_skips(manifest_dir):
    skips = yaml.safe_load(SKIPS_FILE.read_text())
    assert isinstance(skips, dict) and skips, f"{SKIPS_FILE.name}: expected a mapping check id -> reason"
    for check_id, reason in skips.items():
        assert isinstance(reason, str) and len(reason.split()) >= 10, f"{check_id}: write down why it is skipped"
    assert CHECKOV.exists(), f"{CHECKOV} missing: run `make install` (checkov lives in its own environment)"
    proc = subprocess.run(
        [str(CHECKOV), "-d", str(manifest_dir), "--framework", "kubernetes", "--skip-download", "--output", "json"],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.stdout.strip(), proc.stderr
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [c for r in reports for c in r["results"]["failed_checks"]]
    passed = sum(r["summary"]["passed"] for r in reports)
    unexpected = [f"{c['check_id']} {c['check_name']}: {c['resource']} ({c['file_path']})"
                  for c in failed if c["check_id"] not in skips]
    skipped = [c for c in failed if c["check_id"] in skips]
    print(f"\ncheckov: {passed} passed, {len(unexpected)} failed, {len(skipped)} skipped "
          f"({', '.join(sorted({c['check_id'] for c in skipped}))})")
    assert not unexpected, "\n".join(unexpected)
    stale = set(skips) - {c["check_id"] for c in failed}
    assert not stale, f"skips that no longer fail, remove them from {SKIPS_FILE.name}: {sorted(stale)}"
    assert passed > 100  # the scan saw the manifests


@pytest.mark.parametrize("name", STACKS)
def test_training_command_is_valid_for_torchrun(name, manifests):
    cfg = stack(name)
    docs = manifests[name]
    [container] = training_job(docs)["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    # The agent is torchrun behind training/runtime/eks_ddp_runtime/launch.py's exit-code contract; it takes torchrun's flags.
    assert command[:3] == ["python", "-m", "eks_ddp_runtime.launch"]
    parser = get_args_parser()
    agent_flags = command[3:command.index("-m", 3)]
    # Exact option names (argparse would also accept abbreviations and silently misread them).
    unknown = [f for f in agent_flags if f.split("=", 1)[0] not in parser._option_string_actions]
    assert not unknown, f"not torchrun options: {unknown}"
    args = parser.parse_args(command[3:])
    assert args.module and args.training_script == "eks_ddp_trainer.train"
    assert args.nnodes == f"{cfg.job.min_nodes}:{cfg.job.nodes}"
    gpus = catalog.lookup(cfg.job_group.instance_type).gpus
    assert args.nproc_per_node == str(gpus) == str(EXPECTED_GPUS[name])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
    assert args.rdzv_backend == {"etcd": "eks-etcd"}.get(cfg.job.rdzv_backend, cfg.job.rdzv_backend)
    assert args.rdzv_id == "$(JOB_UID)" and args.local_addr == "$(POD_IP)"
    assert args.max_restarts == cfg.job.max_restarts
    if cfg.job.rdzv_backend == "etcd":
        [etcd] = [m for m in docs if m["kind"] == "Service" and m["spec"].get("type") == "ClusterIP"
                  and any(p["port"] == 2379 for p in m["spec"]["ports"])]
        assert args.rdzv_endpoint.startswith(f"{etcd['metadata']['name']}.{cfg.job.namespace}.svc")
    env = {e["name"] for e in container["env"]}
    assert ("FI_PROVIDER" in env) == cfg.job_group.efa

    from eks_ddp_trainer.train import parse_args  # the trainer's own parser accepts what the job passes

    trainer = parse_args(args.training_script_args)
    assert trainer.data_dir == "/shared/data" and trainer.run_dir == f"/shared/runs/{cfg.job.run_id}"
    assert (trainer.epochs, trainer.global_batch_size, trainer.model) == (cfg.job.epochs, cfg.job.global_batch_size,
                                                                          cfg.job.model)


def test_p4de_fabric_check_runs_first_in_the_training_pods_with_torchrun_on_the_admitted_nodes(manifests):
    import shlex

    cfg = stack("p4de")
    assert cfg.fabric_check_of(cfg.job)  # default with efa
    assert not [m for m in manifests["p4de"] if m["kind"] == "Job" and "fabric" in m["metadata"]["name"]]
    job = training_job(manifests["p4de"])
    assert job["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"  # pulumi up never waits for it
    [init] = job["spec"]["template"]["spec"]["initContainers"]
    assert init["name"] == "fabric-check" and init["command"][:2] == ["sh", "-c"]
    command = shlex.split(init["command"][2].split("fi; exec ", 1)[1])
    args = get_args_parser().parse_args(command[3:])
    assert args.module and args.training_script == "eks_ddp_runtime.fabric_check"
    assert args.nnodes == f"{cfg.job.min_nodes}:{cfg.job.nodes}" and args.max_restarts == 0
    assert args.nproc_per_node == "8"

    from eks_ddp_runtime.fabric_check import _parse

    check = _parse(args.training_script_args)
    assert check.require_efa and check.min_busbw_gbs == catalog.fabric_floor_gbs("p4de.24xlarge")
    assert check.run_dir == f"/shared/runs/{cfg.job.run_id}"
    assert "initContainers" not in training_job(manifests["dev"])["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", STACKS)
def test_rendered_job_semantics_and_egress(name, manifests):
    """What the stacks apply: the training Job's success and retry semantics, and egress with destinations."""
    from eks_ddp_runtime import exitcodes

    docs = manifests[name]
    job = training_job(docs)
    spec = job["spec"]
    assert spec["successPolicy"] == {"rules": [{"succeededCount": 1}]}
    assert spec["backoffLimit"] == stack(name).job.fault_budget >= 20
    assert "backoffLimitPerIndex" not in spec
    [fail] = [r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob"
              and r["onExitCodes"]["containerName"] == "trainer"]
    assert set(exitcodes.FATAL) <= set(fail["onExitCodes"]["values"])
    assert job["metadata"]["annotations"]["pulumi.com/deletionPropagationPolicy"] == "background"
    assert spec["activeDeadlineSeconds"] > 0
    for m in docs:
        if m["kind"] == "NetworkPolicy":
            assert all(rule.get("to") for rule in m["spec"].get("egress", [])), m["metadata"]["name"]
    [etcd] = [m for m in docs if m["kind"] == "StatefulSet"]
    assert etcd["spec"]["replicas"] == 1
    [pdb] = [m for m in docs if m["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1  # a drain may move the store (review K5)
