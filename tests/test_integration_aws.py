"""Real AWS: `pulumi up` the dev stack through the Automation API, check it, destroy it.

Skipped unless the `pulumi` CLI is on PATH and AWS credentials are available, because it
creates billable resources (an EKS cluster, GPU nodes) for 30-60 minutes. Run it deliberately:

    EKS_DDP_IT_CIDR=$(curl -s https://checkip.amazonaws.com)/32 \
    .venv/bin/python -m pytest tests/test_integration_aws.py -m integration -s

It uses a throw-away stack named ``it-<random>`` with a local file backend, scales the GPU group
to the job's 2 nodes, waits for the training job to finish, and always destroys the stack.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from tests.util import ROOT, stack_config


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
    config["eks-ddp:preflight"] = True
    for key, value in config.items():
        text = value if isinstance(value, str) else json.dumps(value)
        st.set_config(key, auto.ConfigValue(value=text), path=False)
    try:
        yield st
    finally:
        st.destroy(on_output=print)
        st.workspace.remove_stack(name)


def test_dev_stack_up_trains_and_destroys(stack, tmp_path):
    result = stack.up(on_output=print)
    outputs = result.outputs
    assert outputs["kubeconfig"].secret
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(outputs["kubeconfig"].value)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    ns = stack_config("dev")["eks-ddp:job"].get("namespace", "training")
    job = f"train-{stack_config('dev')['eks-ddp:job']['runId']}"
    subprocess.run(["kubectl", "-n", ns, "wait", "--for=condition=complete", f"job/{job}", "--timeout=3600s"],
                   env=env, check=True)
    logs = subprocess.run(["kubectl", "-n", ns, "logs", f"job/{job}"], env=env, check=True,
                          capture_output=True, text=True).stdout
    assert "[eval] acc=" in logs
