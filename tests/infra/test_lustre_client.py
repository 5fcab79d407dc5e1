"""Every node that can mount the FSx for Lustre file system installs the Lustre client of the file system's version
from its own user data (issue 52, item 1): each launch template of the FSx stack is decoded, its shell-script part
is the client installer of the file system's ``fileSystemTypeVersion``, and the script itself is run under bash with
stand-ins for ``rpm``, ``dnf`` and ``modprobe`` (it installs, refuses another release, and stops on a failed
install). Negative controls: the EFS stack's templates carry no installer, and the check reports a launch template
stripped of it (the plan before this change)."""

from __future__ import annotations

import base64
import copy
import email
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from eks_ddp.core.storage import LUSTRE_VERSION
from eks_ddp.infra.node_user_data import LUSTRE_CLIENT_PACKAGE, lustre_client_script, node_user_data
from eks_ddp.tooling.mocks import ProgramResult
from tests.infra.test_fsx import FS, fsx_p4de_config
from tests.support.nodeadm_roundtrip import node_configs
from tests.support.util import run

LT = "aws:ec2/launchTemplate:LaunchTemplate"


def shell_parts(user_data_b64: str | None) -> list[str]:
    """The ``text/x-shellscript`` parts of base64 launch-template user data (MIME multipart)."""
    if not user_data_b64:
        return []
    msg = email.message_from_bytes(base64.b64decode(user_data_b64))
    return [p.get_payload(decode=True).decode() for p in msg.walk() if p.get_content_type() == "text/x-shellscript"]


def missing_client(result: ProgramResult) -> list[str]:
    """Launch templates of a stack with an FSx for Lustre file system whose user data does not install the client
    of that file system's Lustre version (empty: every node can mount it)."""
    versions = {fs.inputs["fileSystemTypeVersion"] for fs in result.of_type(FS)}
    if not versions:
        return []
    (version,) = versions
    return [lt.name for lt in result.of_type(LT)
            if lustre_client_script(version) not in shell_parts(lt.inputs.get("userData"))]


@pytest.fixture(scope="module")
def fsx_result():
    return run(fsx_p4de_config(), stack="p4de")


def test_every_launch_template_of_the_fsx_stack_installs_the_client_of_the_file_systems_version(fsx_result):
    templates = fsx_result.of_type(LT)
    assert {"cluster-system", "gpu-a100-lt"} <= {lt.name for lt in templates}  # system nodes run the layout Job
    assert fsx_result.one(FS).inputs["fileSystemTypeVersion"] == LUSTRE_VERSION
    assert missing_client(fsx_result) == []
    for lt in templates:
        (script,) = shell_parts(lt.inputs["userData"])
        assert f"dnf install -y '{LUSTRE_CLIENT_PACKAGE}-{LUSTRE_VERSION}.*'" in script


def test_the_gpu_nodes_keep_their_node_config_beside_the_installer(fsx_result, p4de_result):
    """The EFA memlock NodeConfig part is unchanged by the added part (nodeadm reads only its own parts)."""
    gpu = next(lt for lt in fsx_result.of_type(LT) if lt.name == "gpu-a100-lt")
    efs_gpu = next(lt for lt in p4de_result.of_type(LT) if lt.name == "gpu-a100-lt")
    assert node_configs(gpu.inputs["userData"]) == node_configs(efs_gpu.inputs["userData"])
    assert node_configs(gpu.inputs["userData"])  # the memlock spec is still there


def test_the_efs_stack_installs_no_client_and_its_user_data_is_byte_for_byte_unchanged(p4de_result):
    """Negative control, and no new launch-template version for EFS stacks: the EFA/RAID0 user data is exactly
    the one NodeConfig part it was."""
    for lt in p4de_result.of_type(LT):
        assert shell_parts(lt.inputs.get("userData")) == []
    gpu = next(lt for lt in p4de_result.of_type(LT) if lt.name == "gpu-a100-lt")
    assert base64.b64decode(gpu.inputs["userData"]).decode().count("--EKSDDP\n") == 1
    assert "userData" not in next(lt for lt in p4de_result.of_type(LT) if lt.name == "cluster-system").inputs


def test_the_check_reports_a_template_without_the_installer(fsx_result):
    """Negative control: the plan before this change (no shell part on either template) is reported."""
    stripped = copy.deepcopy(fsx_result)
    for lt in stripped.of_type(LT):
        lt.inputs["userData"] = node_user_data(efa=lt.name.startswith("gpu-"))
    assert sorted(missing_client(stripped)) == ["cluster-system", "gpu-a100-lt"]
    for fs in stripped.of_type(FS):  # a client of another release is not a match either
        fs.inputs["fileSystemTypeVersion"] = "2.12"
    assert len(missing_client(stripped)) == len(stripped.of_type(LT))


# -- the script itself, under bash with stand-ins for the node's tools ------------------------------------------------
def _tools(tmp_path: Path, *, installed: str | None, repo: str | None, modprobe_rc: int = 0) -> dict[str, str]:
    """A PATH whose rpm, dnf and modprobe act like a node's: ``installed`` (None: not installed), ``repo`` the
    version dnf would install (None: dnf finds no match)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "installed"
    bin_dir.mkdir()
    if installed:
        state.write_text(installed)
    (bin_dir / "rpm").write_text(f"""#!/bin/bash
[ -s {state} ] || {{ echo "package {LUSTRE_CLIENT_PACKAGE} is not installed"; exit 1; }}
[ "$2" = "--qf" ] && cat {state} || echo "{LUSTRE_CLIENT_PACKAGE}-$(cat {state})-1.amzn2023.x86_64"
""")
    (bin_dir / "dnf").write_text(f"""#!/bin/bash
echo "dnf $*" >> {tmp_path}/log
{"echo 'No match for argument'; exit 1" if repo is None else f"printf %s {repo} > {state}"}
""")
    (bin_dir / "modprobe").write_text(f"#!/bin/bash\necho \"modprobe $*\" >> {tmp_path}/log\nexit {modprobe_rc}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _run_script(tmp_path: Path, **tools) -> subprocess.CompletedProcess:
    script = tmp_path / "lustre.sh"
    script.write_text(lustre_client_script())
    return subprocess.run(["bash", str(script)], env=_tools(tmp_path, **tools), capture_output=True, text=True,
                          timeout=30)


pytestmark_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="bash runs the user-data script")


@pytestmark_bash
def test_the_script_installs_the_matching_release_and_loads_the_module(tmp_path):
    done = _run_script(tmp_path, installed=None, repo=f"{LUSTRE_VERSION}.6")
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "log").read_text()
    assert f"dnf install -y {LUSTRE_CLIENT_PACKAGE}-{LUSTRE_VERSION}.*" in log and "modprobe lustre" in log
    assert f"{LUSTRE_VERSION}.6" in done.stdout


@pytestmark_bash
def test_the_script_refuses_a_preinstalled_client_of_another_release(tmp_path):
    done = _run_script(tmp_path, installed="2.12.8", repo=None)
    assert done.returncode == 1 and f"is not Lustre {LUSTRE_VERSION}" in done.stderr
    assert not (tmp_path / "log").exists()  # neither dnf nor modprobe ran


@pytestmark_bash
def test_the_script_stops_when_dnf_finds_no_client_or_the_module_does_not_load(tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    assert _run_script(tmp_path / "a", installed=None, repo=None).returncode != 0
    assert _run_script(tmp_path / "b", installed=f"{LUSTRE_VERSION}.6", repo=None, modprobe_rc=1).returncode != 0


def test_a_lustre_version_that_is_not_major_minor_is_refused():
    with pytest.raises(ValueError, match=r"lustre_version: got '2\.15\.6'; expected a major\.minor"):
        lustre_client_script("2.15.6")
