"""The README matches the code: config reference, make targets, example stack keys."""

from __future__ import annotations

import re

import yaml
from eks_ddp.config.reference import reference_table
from eks_ddp.config.schema import TOP_LEVEL_KEYS

from tests.util import ROOT


def test_readme_config_reference_is_the_schema():
    readme = (ROOT / "README.md").read_text()
    assert reference_table() in readme, "regenerate the table: python -m eks_ddp.config"


def test_readme_make_targets_exist():
    readme = (ROOT / "README.md").read_text()
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    for target in set(re.findall(r"`make ([a-z-]+)", readme)):
        assert target in targets, f"README mentions `make {target}` but the Makefile has no such target"


def test_dev_stack_sets_every_top_level_key():
    text = (ROOT / "Pulumi.dev.yaml").read_text()
    doc = yaml.safe_load(text)["config"]
    # `runs` is the alternative to `job` (both set is an error), so the file shows it commented out.
    missing = [k for k in TOP_LEVEL_KEYS if k != "runs" and f"eks-ddp:{k}" not in doc]
    assert not missing, f"Pulumi.dev.yaml should show every key, with a comment; missing {missing}"
    assert "eks-ddp:runs" not in doc and re.search(r"^  # eks-ddp:runs:", text, re.M), \
        "Pulumi.dev.yaml should show eks-ddp:runs as a commented-out alternative to eks-ddp:job"


def test_dev_stack_comments_every_key():
    for line in (ROOT / "Pulumi.dev.yaml").read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped in ("config:",) or stripped.endswith(":"):
            continue
        if stripped.startswith("- ") and ":" not in stripped:
            continue  # list items are commented on the key line above or inline
        assert "#" in line, f"uncommented key in Pulumi.dev.yaml: {line!r}"


def test_readme_and_checkov_skip_say_how_etcd_and_the_shared_volume_are_protected():
    # Review finding B-19: the CKV_K8S_40 reason credited the pod uid with file ownership on EFS, and
    # nothing said that etcd is unauthenticated.
    skips = yaml.safe_load((ROOT / "tests" / "checkov-skips.yaml").read_text())
    assert "PosixUser" in skips["CKV_K8S_40"] and "access point" in skips["CKV_K8S_40"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    # Review S1: the store requires a client certificate; the NetworkPolicy is only a second layer.
    assert "requires a client certificate" in readme and "NetworkPolicy, which admits only the training pods" in readme
    assert "without authentication" not in readme


def test_trainer_docstring_shows_the_command_the_cluster_runs():
    """train.py's docstring is where users look for the command: it must be job_command's, with its env."""
    import shlex

    import eks_ddp_trainer.train as train
    from eks_ddp.core.torchrun import AGENT_ENV, AgentOptions, job_command
    from eks_ddp_trainer.config import TrainerConfig

    doc = train.__doc__
    block = doc[doc.index("::") + 2:doc.index("The optimisation")]
    words = shlex.split(block.replace("\\\n", " "))
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and w.split("=")[0].isupper())
    command = [w for w in words if not ("=" in w and not w.startswith("-") and w.split("=")[0].isupper())]
    expected = job_command(
        AgentOptions(min_nodes=1, max_nodes=2, nproc_per_node=1, rdzv_backend="etcd-v2",
                     rdzv_endpoint="ETCD_HOST:2379", rdzv_id="RUN_ID", local_addr="POD_IP"),
        TrainerConfig(data_dir="/shared/data", run_dir="/shared/runs/RUN_ID"))
    assert command == expected
    assert env == AGENT_ENV


def test_the_c10d_backend_is_documented_as_unauthenticated_where_it_is_chosen():
    """The config reference row and the Job-semantics paragraph say what c10d trusts (torch's TCPStore has no
    authentication and every agent unpickles its state), not only that it is less available."""
    readme = (ROOT / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| `eks-ddp:job.rdzvBackend`")]
    assert "unauthenticated" in row and "unpickles" in row
    assert re.search(r"The c10d store is torch's TCPStore: no TLS, no authentication, and every agent unpickles",
                     readme)


def test_the_job_back_off_for_ignored_disruptions_is_documented():
    readme = (ROOT / "README.md").read_text()
    assert "pod-creation back-off, which counts every failed pod, ignored\n  ones included" in readme


def test_running_on_aws_keeps_the_passphrase_out_of_shell_history_and_names_a_kms_secrets_provider():
    step = (ROOT / "README.md").read_text().split("## Running on AWS", 1)[1].split("2. **AWS credentials**", 1)[0]
    assert "export PULUMI_CONFIG_PASSPHRASE_FILE=" in step and "--secrets-provider \"awskms://" in step
    assert "can mint rendezvous certificates" in step
