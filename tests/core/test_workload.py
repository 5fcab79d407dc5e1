"""Workloads: what a run trains. The bundled trainer renders the command it always had; any other workload gets
the same pods (GPUs, EFA, NCCL, volumes, NetworkPolicies) with its own entrypoint, image, env and fatal codes."""

from __future__ import annotations

import json
import re

import pulumi
import pytest

from eks_ddp.config import load_stack_config
from eks_ddp.core import catalog
from eks_ddp.core.workload import Cifar10Data, Egress, S3Data, Workload, dataset_name
from eks_ddp.tooling.mocks import run_program
from eks_ddp_runtime.launch_command import CLUSTER_TIMEOUTS, AgentOptions, job_command
from eks_ddp_trainer.config import TrainerConfig
from tests.support.job_args import job_args
from tests.support.util import run, stack_config
from tests.workloads.test_elastic_job import (
    ETCD,
    GPU_NODES,
    IMAGE,
    JOB,
    NETPOL,
    RDZV_TLS_SECRET,
    env_of,
    run_job,
    trainer,
)

OTHER_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/mine@sha256:" + "cd" * 32


def custom(**over) -> Workload:
    return Workload(**{"name": "bert", "module": "bert.train", "args": ("--lr", "0.1", "--out=$(EKS_DDP_RUN_DIR)"),
                       "env": {"MODE": "fast"}, **over})


# --- the Workload data ----------------------------------------------------------------------------
@pytest.mark.parametrize("over,field", [
    ({"module": None}, "module/script: got neither"),
    ({"script": "/app/t.py"}, "module/script: got module 'bert.train' and script"),
    ({"module": "bert-train"}, "module: got 'bert-train'"),
    ({"module": None, "script": "/app/my train.py"}, "script: got '/app/my train.py'"),
    ({"env": {"EKS_DDP_RUN_DIR": "/x"}}, "env.EKS_DDP_RUN_DIR: got"),
    ({"env": {"1BAD": "x"}}, "env.1BAD: got"),
    ({"env": {"N": 4}}, "env.N: got 4"),
    ({"args": "--lr 0.1"}, "args: got '--lr 0.1'"),
    ({"image": "repo:latest"}, "image: got 'repo:latest'"),
    ({"data": "s3://b/p/"}, "data: got 's3://b/p/'"),
    ({"fatal_exit_codes": (0,)}, "fatal_exit_codes: got (0,)"),
    ({"fatal_exit_codes": (3, 8)}, "fatal_exit_codes: got (3, 8); [8] are the runtime's own retryable codes"),
    ({"name": "Bert"}, "name: got 'Bert'"),
    ({"egress": "https"}, "egress: got 'https'; expected a tuple of Egress"),
    ({"egress": ("10.0.0.0/8:443",)}, "egress[0]: got '10.0.0.0/8:443'; expected Egress"),
    ({"iam_statements": ({"Effect": "Allow", "Action": "*", "Resource": "*"},)},
     "iam_statements[0].Action: got '*'; expected actions like 's3:GetObject'"),
    ({"iam_statements": ({"Effect": "Allow", "NotAction": "s3:*", "Resource": "*"},)},
     "iam_statements[0]: got keys ['NotAction']"),
    ({"iam_statements": ({"Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"},)},
     "iam_statements[0].Effect: got None; expected 'Allow' or 'Deny'"),
    ({"iam_statements": {"Effect": "Allow"}}, "iam_statements: got {'Effect': 'Allow'}; expected a list"),
])
def test_a_bad_workload_names_its_field(over, field):
    with pytest.raises(ValueError, match=r"(^|; )" + re.escape(field)):
        custom(**over)


def test_a_good_workload_is_frozen_data():
    w = custom()
    assert w.args == ("--lr", "0.1", "--out=$(EKS_DDP_RUN_DIR)") and w.entrypoint() == ["-m", "bert.train"]
    assert custom(module=None, script="/app/train.py").entrypoint() == ["/app/train.py"]
    with pytest.raises(TypeError):
        w.env["X"] = "y"  # type: ignore[index]


@pytest.mark.parametrize("make, fragment", [
    (lambda: Egress(cidr="0.0.0.0/0", ports=(443,)), "egress.cidr: got '0.0.0.0/0', which includes the instance "
                                                      "metadata service"),
    (lambda: Egress(cidr="169.254.169.254/32", ports=(80,)), "egress.cidr: got '169.254.169.254/32'"),
    (lambda: Egress(cidr="10.0.0.1/16", ports=(443,)), "egress.cidr: got '10.0.0.1/16'; expected an IPv4 network"),
    (lambda: Egress(cidr="10.0.0.0/16", ports=()), "egress.ports: got (); expected one or more ports"),
    (lambda: Egress(cidr="10.0.0.0/16", ports=(70000,)), "egress.ports: got (70000,)"),
    (lambda: Egress(cidr="10.0.0.0/16", ports=(53,), protocol="ICMP"), "egress.protocol: got 'ICMP'"),
    (lambda: Egress(cidr="10.0.0.0/16", ports=(1,), except_=("10.1.0.0/16",)), "egress.except_: got '10.1.0.0/16'"),
    (lambda: Egress.parse("runs[0].workload.egress[1]", "0.0.0.0/0:443"),
     "runs[0].workload.egress[1].cidr: got '0.0.0.0/0', which includes"),
    (lambda: Egress.parse("runs[0].workload.egress[0]", "wandb.ai:443"), "runs[0].workload.egress[0].cidr: got "
                                                                         "'wandb.ai'"),
    (lambda: Egress.parse("runs[0].workload.egress[0]", "443"), "runs[0].workload.egress[0]: got '443'; expected "
                                                                "'https', 'internet:PORTS' or 'CIDR:PORTS'"),
])
def test_a_bad_egress_names_its_field(make, fragment):
    with pytest.raises(ValueError, match="^" + re.escape(fragment)):
        make()


def test_egress_forms():
    assert Egress.parse("k", "https") == Egress.internet(443) == Egress.internet()
    assert Egress.internet().except_ and "169.254.0.0/16" in Egress.internet().except_
    assert Egress.parse("k", "internet:443,8443") == Egress.internet(443, 8443)
    assert Egress.parse("k", "10.20.0.0/16:5432") == Egress(cidr="10.20.0.0/16", ports=(5432,))
    assert Egress.parse("k", "10.20.0.0/16:53/udp") == Egress(cidr="10.20.0.0/16", ports=(53,), protocol="UDP")


def test_s3_data_checks_its_uri_and_name():
    d = S3Data(uri="s3://my-data/corpora/wiki/", name="wiki")
    assert (d.bucket, d.prefix) == ("my-data", "corpora/wiki/")
    with pytest.raises(ValueError, match="data.uri: got 's3://my-data/wiki'.*end it with '/'"):
        S3Data(uri="s3://my-data/wiki", name="wiki")
    with pytest.raises(ValueError, match="data.name: got 'Wiki_1'"):
        S3Data(uri="s3://my-data/wiki/", name="Wiki_1")
    assert dataset_name("s3://my-data/corpora/Wiki_EN/") == "wiki-en" and dataset_name("s3://my-data/") == "my-data"


# --- the bundled trainer renders exactly what it always did -----------------------------------------
def _expected_dev_command(cfg, endpoint: str) -> list[str]:
    """The train command as the stack built it before workloads: TrainerConfig through job_command."""
    j, it = cfg.job, catalog.lookup(cfg.job_group.instance_type)
    agent = AgentOptions(min_nodes=j.min_nodes, max_nodes=j.nodes, nproc_per_node=it.gpus,
                         rdzv_backend=j.rdzv_backend, rdzv_endpoint=endpoint, rdzv_id="$(JOB_UID)",
                         local_addr="$(POD_IP)", max_restarts=j.max_restarts, timeouts=CLUSTER_TIMEOUTS)
    trainer_opts = TrainerConfig(data_dir="/shared/data", run_dir=f"/shared/runs/{j.run_id}", epochs=j.epochs,
                                 global_batch_size=j.global_batch_size, model=j.model,
                                 lr=j.learning_rate, compile=j.compile)
    return job_command(agent, trainer_opts)


@pytest.mark.parametrize("stack", ["dev", "p4de"])
def test_the_bundled_stacks_render_the_train_command_they_always_had(stack):
    raw = stack_config(stack)
    cfg = load_stack_config({k: v for k, v in raw.items() if k.startswith("eks-ddp:")},
                            region=raw.get("aws:region", "us-west-2"), stack=stack)
    job = run(raw, stack).one(JOB, "training-train")
    [c] = job.inputs["spec"]["template"]["spec"]["containers"]
    endpoint = next(a for a in c["command"] if a.startswith("--rdzv-endpoint=")).split("=", 1)[1]
    expected = _expected_dev_command(cfg, endpoint)
    assert c["command"] == expected
    # Negative control: the comparison sees a change in the trainer's flags.
    assert _expected_dev_command(cfg, endpoint + "x") != c["command"]
    env = env_of(c)
    assert env["EKS_DDP_DATA_PIN"]["value"] == "cifar-10"
    assert env["EKS_DDP_RUN_DIR"]["value"] == f"/shared/runs/{cfg.job.run_id}"
    assert env["EKS_DDP_DATA_DIR"]["value"] == "/shared/data"
    [trainer_rule] = [r for r in job.inputs["spec"]["podFailurePolicy"]["rules"]
                      if (r.get("onExitCodes") or {}).get("containerName") == "trainer"]
    assert trainer_rule["onExitCodes"]["values"] == [2, 3, 4, 5]


# --- any workload: same pods, its own entrypoint ----------------------------------------------------
def _pod(result, name="training-train") -> dict:
    return result.one(JOB, name).inputs["spec"]["template"]["spec"]


def test_a_custom_workload_gets_the_same_pods_with_its_own_command_image_env_and_codes():
    base = dict(instance_type="p4de.24xlarge", efa=True, fabric_check=True)
    bundled = run_job(**base)
    mine = run_job(**base, workload=custom(image=OTHER_IMAGE, fatal_exit_codes=(9,), data=S3Data(
        uri="s3://my-data/wiki/", name="wiki")), data_role_arn=DATA_ROLE)
    [c] = _pod(mine)["containers"]
    cmd = c["command"]
    i = cmd.index("-m", 3)
    assert cmd[:3] == ["python", "-m", "eks_ddp_runtime.launch"]
    assert cmd[i:] == ["-m", "bert.train", "--lr", "0.1", "--out=/shared/runs/run-1"]
    assert cmd[:i] == trainer(bundled)["command"][:i]  # the same torchrun flags
    [check] = _pod(mine)["initContainers"]  # the fabric check runs first in each training pod, in the same image
    assert c["image"] == OTHER_IMAGE and check["image"] == OTHER_IMAGE
    env = env_of(c)
    assert env["MODE"]["value"] == "fast" and env["EKS_DDP_DATA_DIR"]["value"] == "/shared/data/wiki"
    assert env["EKS_DDP_RUN_DIR"]["value"] == "/shared/runs/run-1" and "EKS_DDP_DATA_PIN" not in env
    assert env["EKS_DDP_DATA_VERIFY"]["value"] == "manifest"
    assert set(env) - {"MODE", "EKS_DDP_DATA_VERIFY"} == set(env_of(trainer(bundled))) - {"EKS_DDP_DATA_PIN"}
    for key in ("resources", "volumeMounts", "securityContext", "ports"):
        assert c.get(key) == trainer(bundled).get(key), key
    for key in ("volumes", "tolerations", "nodeSelector", "affinity", "securityContext", "serviceAccountName"):
        assert _pod(mine).get(key) == _pod(bundled).get(key), key
    policy = [r for r in mine.one(JOB, "training-train").inputs["spec"]["podFailurePolicy"]["rules"]
              if (r.get("onExitCodes") or {}).get("containerName") == "trainer"]
    # 2 and the runtime's 3/4/5 stay fatal (the launcher exits with them whatever the workload; 5 is also its
    # verdict on S3 data that fails its manifest), and the launcher gets the same set, so it stops at once where
    # the pod failure policy fails the Job.
    assert policy[0]["onExitCodes"]["values"] == [2, 3, 4, 5, 9]
    assert env["EKS_DDP_FATAL_EXIT_CODES"]["value"] == "2,3,4,5,9"
    from eks_ddp_runtime import exitcodes

    assert exitcodes.fatal_codes({exitcodes.FATAL_CODES_ENV: env["EKS_DDP_FATAL_EXIT_CODES"]["value"]}) == \
        set(policy[0]["onExitCodes"]["values"])
    assert env_of(trainer(bundled))["EKS_DDP_FATAL_EXIT_CODES"]["value"] == "2,3,4,5"
    # No CIFAR-10 download, no evaluation CronJob, nor their NetworkPolicies (a policy for pods that never run
    # would open 443 to any pod given its label); the same policies otherwise.
    assert not [r for r in mine.of_type(JOB) if r.name == "training-prepare-data"]
    assert not mine.of_type("kubernetes:batch/v1:CronJob") and mine.outputs["evaluate"] is None
    # (its own stages: the S3 stage and the image check of its own image)
    assert [(r.name, r.inputs["spec"]) for r in mine.of_type(NETPOL)
            if r.name not in ("training-stage-data-netpol", "training-image-check-netpol")] == \
        [(r.name, r.inputs["spec"]) for r in bundled.of_type(NETPOL)
         if r.name not in ("training-prepare-data-netpol", "training-evaluate-netpol")]
    assert not [d for d in mine.one(JOB, "training-train").dependencies if "prepare-data" in d]
    assert [d for d in bundled.one(JOB, "training-train").dependencies if "prepare-data" in d]


def test_a_script_workload_runs_the_script_after_the_torchrun_flags():
    cmd = trainer(run_job(workload=custom(module=None, script="/app/train.py")))["command"]
    assert "-m" not in cmd[3:] and cmd[-4:] == ["/app/train.py", "--lr", "0.1", "--out=/shared/runs/run-1"]
    assert cmd[-5].startswith("--")


def test_a_workload_env_that_the_job_sets_itself_is_refused():
    with pytest.raises(ValueError, match="workload.env: got NCCL_DEBUG; expected names the job does not set"):
        run_job(workload=custom(env={"NCCL_DEBUG": "INFO"}))
    run_job(workload=custom(env={"NCCL_ALGO": "Ring"}))  # control: a name the job leaves alone


def test_elastic_job_args_take_only_a_workload():
    def program() -> None:
        from eks_ddp.workloads.elastic_job import ElasticJob

        ElasticJob("training", job_args(
            namespace="training", image=IMAGE, pvc_name="shared", instance_type="g4dn.xlarge",
            node_selector=GPU_NODES, rdzv_endpoint=ETCD, rdzv_tls_secret=RDZV_TLS_SECRET,
            workload=Workload(name="x", module="x.y", data=Cifar10Data())))
        pulumi.export("ok", True)

    assert run_program({}, program=program).outputs["ok"] is True


# --- the S3 data stage -------------------------------------------------------------------------------
DATA_ROLE = "arn:aws:iam::123456789012:role/data-stage"
WIKI = S3Data(uri="s3://my-data/corpora/wiki/", name="wiki")


def test_an_s3_workload_stages_its_prefix_first_in_its_own_image_with_its_own_role():
    result = run_job(workload=custom(image=OTHER_IMAGE, data=WIKI), data_role_arn=DATA_ROLE,
                     system_node_selector={"role": "system"})
    stage = result.one(JOB, "training-stage-data")
    spec = stage.inputs["spec"]
    pod = spec["template"]["spec"]
    [c] = pod["containers"]
    assert c["command"] == ["python", "-m", "eks_ddp_runtime.stage_s3", "s3://my-data/corpora/wiki/",
                            "/shared/data/wiki"]
    assert c["image"] == OTHER_IMAGE and pod["nodeSelector"] == {"role": "system"} and not pod.get("tolerations")
    assert pod["restartPolicy"] == "Never" and spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == \
        [2, 3, 5]
    [sa] = [r for r in result.of_type("kubernetes:core/v1:ServiceAccount") if r.name == "training-stage-sa"]
    assert pod["serviceAccountName"] == sa.inputs["metadata"]["name"] == "training-stage"
    assert sa.inputs["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": DATA_ROLE}
    # The shared volume read-write for the stage (it writes /shared/data/wiki), read-only for training.
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == "/shared"]
    assert not mount.get("readOnly")
    netpol = result.one(NETPOL, "training-stage-data-netpol").inputs["spec"]
    assert netpol["ingress"] == [] and [p["port"] for p in netpol["egress"][1]["ports"]] == [443]
    train = result.one(JOB, "training-train")
    assert [d for d in train.dependencies if d.endswith("training-stage-data")]
    # Other workloads have no stage.
    assert not [r for r in run_job().of_type(JOB) if r.name == "training-stage-data"]


def test_an_s3_workload_needs_the_stage_role():
    with pytest.raises(ValueError, match=r"data_role_arn: got None with workload.data 's3://my-data/corpora/wiki/'"):
        run_job(workload=custom(data=WIKI))


def test_the_stage_role_lists_exactly_the_prefix_and_reads_only_under_it():
    import json

    from eks_ddp.infra.iam import read_prefix_policy

    doc = json.loads(read_prefix_policy(WIKI, "aws-cn"))
    listing, read, decrypt = doc["Statement"]
    assert listing == {"Sid": "ListThePrefixOnly", "Effect": "Allow", "Action": "s3:ListBucket",
                       "Resource": "arn:aws-cn:s3:::my-data",
                       "Condition": {"StringEquals": {"s3:prefix": "corpora/wiki/"}}}
    assert read == {"Sid": "ReadUnderThePrefixOnly", "Effect": "Allow", "Action": "s3:GetObject",
                    "Resource": "arn:aws-cn:s3:::my-data/corpora/wiki/*"}
    # SSE-KMS objects under the prefix only, through S3 only: a bucket under a customer-managed key is readable
    assert decrypt == {"Sid": "DecryptTheseObjectsThroughS3Only", "Effect": "Allow", "Action": "kms:Decrypt",
                       "Resource": "*", "Condition": {"StringLike": {
                           "kms:ViaService": "s3.*",
                           "kms:EncryptionContext:aws:s3:arn": ["arn:aws-cn:s3:::my-data",
                                                                "arn:aws-cn:s3:::my-data/corpora/wiki/*"]}}}
    assert len(doc["Statement"]) == 3


def test_the_program_gives_an_s3_run_its_stage_and_role():
    from tests.config.test_runs import DIGEST, with_runs

    result = run(with_runs({"runId": "a", "nodes": 1}, {"runId": "b", "nodes": 1, "workload": {
        "image": DIGEST, "module": "bert.train", "data": {"s3": "s3://my-data/corpora/wiki/", "sha256": "cd" * 32}}}))
    role = result.one("aws:iam/role:Role", "data-stage-b")
    assert ':serviceaccount:training:training-b-stage"' in role.inputs["assumeRolePolicy"]
    policy = result.one("aws:iam/rolePolicy:RolePolicy", "data-stage-b").inputs["policy"]
    assert "arn:aws:s3:::my-data/corpora/wiki/*" in policy
    stage = result.one(JOB, "training-b-stage-data").inputs["spec"]["template"]["spec"]["containers"][0]
    assert stage["command"][-2:] == ["s3://my-data/corpora/wiki/", "/shared/data/wiki"] and stage["image"] == DIGEST
    train = result.one(JOB, "training-b-train").inputs["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in train["env"]}["EKS_DDP_DATA_DIR"] == "/shared/data/wiki"
    assert {e["name"]: e.get("value") for e in train["env"]}["EKS_DDP_DATA_VERIFY"] == "sha256:" + "cd" * 32


def test_two_prefixes_that_would_stage_into_one_directory_are_refused():
    from tests.config.test_runs import DIGEST, with_runs

    def s3_run(run_id: str, uri: str) -> dict:
        return {"runId": run_id, "nodes": 1, "workload": {"image": DIGEST, "module": "m", "data": {"s3": uri}}}

    with pytest.raises(Exception, match=r"runs\[1\].workload.data.s3: got 's3://other/x/wiki/'.*/shared/data/wiki "
                                        r"like runs\[0\]'s 's3://my-data/wiki/'"):
        run(with_runs(s3_run("a", "s3://my-data/wiki/"), s3_run("b", "s3://other/x/wiki/")))
    # Control: the same prefix twice is one data set, staged idempotently.
    run(with_runs(s3_run("a", "s3://my-data/wiki/"), s3_run("b", "s3://my-data/wiki/")))


def test_the_stage_pod_is_hardened_like_every_other():
    result = run_job(workload=custom(data=WIKI), data_role_arn=DATA_ROLE)
    stage = result.one(JOB, "training-stage-data").inputs["spec"]["template"]
    bundled = result.one(JOB, "training-train").inputs["spec"]["template"]
    spec, [c] = stage["spec"], stage["spec"]["containers"]
    assert spec["automountServiceAccountToken"] is False and spec["securityContext"] == bundled["spec"]["securityContext"]
    assert c["securityContext"] == bundled["spec"]["containers"][0]["securityContext"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    [sa] = [r for r in result.of_type("kubernetes:core/v1:ServiceAccount") if r.name == "training-stage-sa"]
    assert sa.inputs["automountServiceAccountToken"] is False
    netpol = result.one(NETPOL, "training-stage-data-netpol").inputs["spec"]
    assert all(stage["metadata"]["labels"].get(k) == v for k, v in netpol["podSelector"]["matchLabels"].items())


def _job_with_stage_role(**role_kw) -> None:
    from eks_ddp.infra.iam import data_stage_role
    from eks_ddp.workloads.elastic_job import ElasticJob

    def program() -> None:
        role = data_stage_role("stage", WIKI, oidc_provider_arn="arn:aws:iam::123456789012:oidc-provider/x",
                               oidc_provider_url="https://x", namespace="training", **role_kw)
        ElasticJob("training", job_args(
            namespace="training", image=IMAGE, pvc_name="shared", instance_type="g4dn.xlarge", rdzv_endpoint=ETCD,
            rdzv_tls_secret=RDZV_TLS_SECRET, workload=custom(data=WIKI), data_role_arn=role))

    run_program({}, program=program)


def test_a_stage_role_trusting_another_service_account_fails_at_construction():
    """The stage pods run as stage_service_account(<ElasticJob name>); a role trusting anything else would pass the
    plan and fail inside the awaited stage Job with AccessDenied."""
    with pytest.raises(ValueError, match=r"^data_role_arn: the role trusts ServiceAccount 'mlp-stage', but "
                                         r"ElasticJob 'training' runs its S3 stage as 'training-stage'.*"
                                         r"data_stage_role\(\.\.\., job_name='training'\)"):
        _job_with_stage_role(service_account="mlp-stage")
    with pytest.raises(ValueError, match=r"^data_role_arn: the role trusts ServiceAccount 'train-stage'"):
        _job_with_stage_role(job_name="train")
    with pytest.raises(ValueError, match=r"^job_name/service_account: got job_name=None, service_account=None"):
        _job_with_stage_role()
    _job_with_stage_role(job_name="training")  # control: the job's own name
    _job_with_stage_role(service_account="training-stage")


def test_an_s3_data_set_is_verified_by_the_stage_and_every_training_pod_pinned_when_asked():
    from eks_ddp_runtime import dataset

    assert WIKI.verify == "manifest"
    pin = "ab" * 32
    pinned = S3Data(uri=WIKI.uri, name="wiki", sha256=pin)
    result = run_job(workload=custom(data=pinned), data_role_arn=DATA_ROLE)
    stage = result.one(JOB, "training-stage-data").inputs["spec"]["template"]["spec"]["containers"][0]
    for c in (stage, trainer(result)):
        assert env_of(c)["EKS_DDP_DATA_VERIFY"]["value"] == f"sha256:{pin}"
    # The runtime reads exactly what the Job writes.
    assert dataset.parse_verify(pinned.verify) == pin and dataset.parse_verify(WIKI.verify) is None
    with pytest.raises(ValueError, match=r"data.sha256: got 'AB'; expected 64 lowercase hex digits"):
        S3Data(uri=WIKI.uri, name="wiki", sha256="AB")


# --- what a workload declares: egress and AWS permissions ---------------------------------------------
ROLE = "arn:aws:iam::123456789012:role/eks-ddp/results-uploader"
READ_CKPT = {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::ckpt/*"]}


def _ip_rules(result) -> list[tuple[str, list, list]]:
    train = result.one(NETPOL, "training-train-netpol").inputs["spec"]
    return [(t["ipBlock"]["cidr"], t["ipBlock"].get("except") or [], [int(p["port"]) for p in r["ports"]])
            for r in train["egress"] for t in r["to"] if "ipBlock" in t]


def test_declared_egress_and_statements_reach_the_training_pods():
    w = custom(egress=(Egress.internet(443), Egress(cidr="10.20.0.0/16", ports=(5432,))), iam_statements=(READ_CKPT,))
    result = run_job(workload=w, results_role_arn=ROLE)
    internet = ("0.0.0.0/0", list(Egress.internet().except_), [443])
    assert _ip_rules(result) == [internet, ("10.20.0.0/16", [], [5432])]  # HTTPS once: the role needs it anyway
    job = result.one(JOB, "training-train").inputs["metadata"]["annotations"]
    assert json.loads(job["eks-ddp/egress"]) == [e.record() for e in w.egress]
    policy = result.one("aws:iam/rolePolicy:RolePolicy").inputs
    assert policy["role"] == "results-uploader"
    assert json.loads(policy["policy"]) == {"Version": "2012-10-17", "Statement": [READ_CKPT]}


def test_without_a_role_or_declarations_the_pods_reach_no_address_outside():
    result = run_job(workload=custom())
    assert _ip_rules(result) == [] and not result.of_type("aws:iam/rolePolicy:RolePolicy")
    assert "eks-ddp/egress" not in result.one(JOB, "training-train").inputs["metadata"]["annotations"]


def test_statements_need_the_training_pods_role():
    with pytest.raises(ValueError, match=r"^workload.iam_statements: given, but results is None"):
        run_job(workload=custom(iam_statements=(READ_CKPT,)))


def test_statements_no_policy_grants_are_refused():
    """The job builds no AWS resource: statements reach the role only through infra's workload_policy, and a role
    given without it would leave them ungranted, so the job says so."""
    import dataclasses

    from eks_ddp.workloads.elastic_job import ElasticJob, Results

    def program() -> None:
        base = job_args(namespace="training", image=IMAGE, pvc_name="shared", instance_type="g4dn.xlarge",
                        rdzv_backend="c10d", workload=custom(iam_statements=(READ_CKPT,)), results_role_arn=ROLE)
        ElasticJob("training", base)  # through workload_policy (the helper): accepted
        ElasticJob("other", dataclasses.replace(base, run_id="r2", results=Results(url="s3://b/runs/r2/",
                                                                                     role_arn=ROLE)))

    with pytest.raises(ValueError, match=r"^workload.iam_statements: given, but no policy on results.role_arn grants "
                                         r"them; expected results.role_arn = eks_ddp.infra.iam.workload_policy"):
        run_program({}, program=program)
