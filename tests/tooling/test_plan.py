"""The offline plan: runs the real program under mocks, prints the tree, writes manifests."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys

import pulumi
import pytest
import yaml

from eks_ddp.tooling.mocks import RecordingMocks, run_program
from tests.support.util import ROOT, set_path, stack_config


def _plan(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eks_ddp.tooling.plan", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_bad_config_registers_nothing():
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match="job.nodes"):
        run_program(set_path(stack_config("dev"), "eks-ddp:job.nodes", 0), mocks=mocks)
    assert mocks.inputs == {}, "resources were registered before the config was rejected"


def test_bad_config_exits_2_with_the_message_alone(tmp_path):
    shutil.copy(ROOT / "__main__.py", tmp_path / "__main__.py")
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    doc = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    doc["config"]["eks-ddp:nodeGroups"][0]["instanceType"] = "g4dn.enormous"
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump(doc))
    proc = _plan("--stack", "bad", "--project-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "nodeGroups[0].instanceType" in proc.stderr and "'g4dn.enormous'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_unknown_stack_names_the_known_ones():
    proc = _plan("--stack", "nope")
    assert proc.returncode == 2 and "Pulumi.nope.yaml" in proc.stderr and "dev" in proc.stderr


def test_dev_plan_prints_tree_counts_and_writes_manifests(tmp_path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = _plan("--stack", "dev", "--out", str(tmp_path))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "## Resource tree" in out and "## Resources per type" in out
    # the tree nests children under their component: an indented line follows the component line
    lines = out.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("eks-ddp:network:Network"))
    assert lines[i + 1].startswith("  ")
    assert "aws:eks/nodeGroup:NodeGroup" in out and "kubernetes:batch/v1:Job" in out
    assert "kubeconfig: [secret]" in out
    assert "## Queue: who is admitted, who waits" in out and "  training-run-1: admitted, 2 pod(s) on gpu-gpu" in out
    written = sorted(tmp_path.glob("*.yaml"))
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in written}
    assert {"Job", "StatefulSet", "Service", "NetworkPolicy", "PersistentVolumeClaim"} <= kinds
    # The design target is < 10 s on a 2-core machine, imports included. Measured as the plan process's own CPU
    # time, not wall-clock time, so that other work on a busy machine cannot fail it.
    assert cpu_s < 10, f"offline plan used {cpu_s:.1f} CPU seconds"


def test_rendered_manifests_carry_ints_not_floats(dev_result):
    from eks_ddp.tooling.plan import render_manifests

    def floats(value, path="$"):
        if isinstance(value, float):
            yield path
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from floats(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                yield from floats(v, f"{path}[{i}]")

    docs = render_manifests(dev_result)
    job = next(d for d in docs if d["kind"] == "Job" and d["spec"].get("completionMode") == "Indexed")
    assert isinstance(job["spec"]["completions"], int)
    assert [p for d in docs for p in floats(d)] == []


def test_p4de_plan_user_data_survives_nodeadms_merge(p4de_result):
    # Review A-B1: what containerd reads on a p4de node after nodeadm's float64 merge must decode as uint64
    # and equal what the user data asked for.
    from tests.support.nodeadm_roundtrip import go_decode_integer, merged_base_runtime_spec, node_configs

    lts = [r for r in p4de_result.of_type("aws:ec2/launchTemplate:LaunchTemplate") if "userData" in r.inputs]
    assert lts, "the p4de plan has an EFA launch template with user data"
    for lt in lts:
        for doc in node_configs(lt.inputs["userData"]):
            wanted = {r["type"]: r for r in doc["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"]}
            written = json.loads(merged_base_runtime_spec(doc), parse_int=str, parse_float=str)
            assert {r["type"] for r in written["process"]["rlimits"]} == set(wanted) >= {"RLIMIT_MEMLOCK"}
            for limit in written["process"]["rlimits"]:
                for key in ("hard", "soft"):
                    assert go_decode_integer(limit[key], unsigned=True) == wanted[limit["type"]][key]


def test_p4de_plan_gates_training_on_the_fabric_check(p4de_result, dev_result):
    """The check is the training pods' first phase (an init container), not a Job `pulumi up` awaits."""
    jobs = {r.name: r for r in p4de_result.of_type("kubernetes:batch/v1:Job")}
    assert "training-fabric-check" not in jobs
    train = jobs["training-train"]
    assert [c["name"] for c in train.inputs["spec"]["template"]["spec"]["initContainers"]] == ["fabric-check"]
    assert train.inputs["metadata"]["annotations"]["pulumi.com/skipAwait"] == "true"
    assert not [r for r in dev_result.of_type("kubernetes:batch/v1:Job") if "fabric" in r.name]


def test_p4de_stack_can_skip_the_fabric_check_by_config():
    """job.fabricCheck: false: no gate, and the training Job waits for nothing but data preparation."""
    from tests.support.util import run, set_path, stack_config

    result = run(set_path(stack_config("p4de"), "eks-ddp:job.fabricCheck", False), stack="p4de")
    jobs = {r.name: r for r in result.of_type("kubernetes:batch/v1:Job")}
    assert "training-fabric-check" not in jobs
    assert not [u for u in jobs["training-train"].dependencies if "fabric" in u]
    assert "initContainers" not in jobs["training-train"].inputs["spec"]["template"]["spec"]


# --- --out never deletes or overwrites what it did not write (review U5) ------------------------------------


# A manifest the dev plan writes (the data volume, after the cluster-scoped objects that sort before it).
PLAN_FILE = "03-persistentvolume-cluster-training-shared-data.yaml"


def test_out_into_a_project_folder_keeps_every_file_it_did_not_write(tmp_path):
    """The review ran `eks-ddp-plan --out <project>`: Pulumi.yaml, the stack file and my-notes.yaml were deleted."""
    mine = {"Pulumi.yaml": "name: mine\nruntime: python\n", "Pulumi.dev.yaml": "config:\n  mine:secret: x\n",
            "my-notes.yaml": "notes: keep\n", PLAN_FILE: "kind: PersistentVolume  # a team's own manifest\n"}
    for name, text in mine.items():
        (tmp_path / name).write_text(text)
    first = _plan("--stack", "dev", "--out", str(tmp_path))
    # A file of the plan's own name that it did not write: refused, nothing written, nothing deleted.
    assert first.returncode == 2 and PLAN_FILE not in first.stdout, first.stdout[-500:]
    assert "did not write" in first.stderr and PLAN_FILE in first.stderr, first.stderr
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == mine
    (tmp_path / PLAN_FILE).unlink()
    del mine[PLAN_FILE]
    for _ in range(2):
        proc = _plan("--stack", "dev", "--out", str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        assert all((tmp_path / name).read_text() == text for name, text in mine.items())
    index = json.loads((tmp_path / ".eks-ddp-plan.json").read_text())["files"]
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == sorted([*mine, *index])


def test_out_deletes_only_the_manifests_its_index_lists(tmp_path):
    from eks_ddp.tooling.plan import INDEX_FILE, write_manifests

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "a", "namespace": "t"}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b", "namespace": "t"}}
    first = write_manifests([job, svc], tmp_path)
    assert [p.name for p in first] == ["00-job-t-a.yaml", "01-service-t-b.yaml"]
    (tmp_path / "notes.yaml").write_text("mine\n")
    # An index edited to name other files never gets them deleted: only plain manifest names count.
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    (tmp_path / INDEX_FILE).write_text(json.dumps({"files": [*index["files"], "notes.yaml", "../x.yaml"]}))
    second = write_manifests([svc], tmp_path)
    assert [p.name for p in second] == ["00-service-t-b.yaml"]
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == ["00-service-t-b.yaml", "notes.yaml"]


# --- any program that uses the components (review U2, U9) --------------------------------------------------


def test_no_project_here_names_the_folder_and_the_flag(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "eks_ddp.tooling.plan", "--stack", "dev"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # the installed name, as eks-ddp-plan runs
    assert proc.returncode == 2 and str(tmp_path) in proc.stderr and "--project-dir" in proc.stderr, proc.stderr


def test_a_program_in_a_main_folder_plans_from_its_own_folder_with_its_own_packages(tmp_path):
    """Review U2: run as the console script, the project's folder was not on the import path and the config was
    read under eks-ddp:. Here the program lives in `main: infra/`, imports a sibling module and the project's own
    `components` package (which this repository, also on the path, has too), and reads its own namespace."""
    (tmp_path / "Pulumi.yaml").write_text("name: teamx\nruntime: python\nmain: infra/\n")
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  teamx:size: '3'\n")
    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "__init__.py").write_text("OWNER = 'teamx'\n")
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "naming.py").write_text("def name(n):\n    return f'teamx-{n}'\n")
    (tmp_path / "infra" / "__main__.py").write_text(
        "import pulumi\nimport components\nfrom naming import name\n"
        "pulumi.export('owner', components.OWNER)\n"
        "pulumi.export('cluster', name(pulumi.Config().require_int('size')))\n")
    (tmp_path / "elsewhere").mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path[1:], str(ROOT)])}
    # From the project's folder with no arguments (the default), and from another folder with --project-dir.
    for cwd, args in ((tmp_path, []), (tmp_path / "elsewhere", ["--project-dir", str(tmp_path)])):
        proc = subprocess.run([sys.executable, "-m", "eks_ddp.tooling.plan", *args], cwd=cwd, capture_output=True,
                              text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "project 'teamx', stack 'dev'" in proc.stdout
        assert "owner: teamx" in proc.stdout and "cluster: teamx-3" in proc.stdout, proc.stdout
        assert "Cost estimate" not in proc.stdout and "preflight" not in proc.stdout  # eks-ddp's notes: its own


def test_a_failing_program_says_what_and_where_in_one_screen(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: teamx\nruntime: python\n")
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  teamx:size: '3'\n")
    (tmp_path / "__main__.py").write_text("import pulumi\nsize = pulumi.Config().require_int('size')\n"
                                          "raise ValueError(f'size {size} is too small')\n")
    proc = _plan("--stack", "dev", "--project-dir", str(tmp_path))
    assert proc.returncode == 1
    assert "ValueError: size 3 is too small" in proc.stderr  # read from teamx:size, the program's own namespace
    assert f"{tmp_path / '__main__.py'}:3" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    full = _plan("--stack", "dev", "--project-dir", str(tmp_path), "--traceback")
    assert full.returncode == 1 and "Traceback" in full.stderr


def test_p4de_plan_notes_the_example_reservation_id():
    """Review U23: the example stack's documentation reservation id passed the offline plan without a word."""
    from eks_ddp.tooling.plan import load_stack_file, placeholder_notes

    p4de = placeholder_notes(load_stack_file("p4de", ROOT))
    assert any("nodeGroups[0].capacityReservationId" in n and "cr-0123456789abcdef0" in n for n in p4de), p4de
    assert not any("capacityReservationId" in n for n in placeholder_notes(load_stack_file("dev", ROOT)))


def test_out_naming_a_file_exits_2_and_leaves_it_alone(tmp_path):
    """--out naming an existing file (or a path under one) ended in a FileExistsError traceback."""
    notes = tmp_path / "my-notes.yaml"
    notes.write_text("notes: keep\n")
    for out in (notes, notes / "sub"):
        proc = _plan("--stack", "dev", "--out", str(out))
        assert proc.returncode == 2, proc.stderr[-800:]
        assert str(notes) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-800:]
    assert notes.read_text() == "notes: keep\n" and sorted(p.name for p in tmp_path.iterdir()) == ["my-notes.yaml"]


def test_a_bad_args_error_points_at_the_users_line_not_the_librarys():
    """The library installed inside the project (an editable install of this repository): the line reported is
    the one that built the Args, never the check inside the library that raised."""
    from eks_ddp import Size
    from eks_ddp.tooling.plan import program_error
    from tests.support.util import ROOT

    try:
        Size(nodes="four")  # the user's line
    except ValueError as err:
        line = program_error(err, ROOT)
    assert "size.nodes: got 'four'" in line
    assert "tests/tooling/test_plan.py" in line and 'Size(nodes="four")' in line, line
