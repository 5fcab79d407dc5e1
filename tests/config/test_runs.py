"""Several runs per stack: `eks-ddp:runs` (a list) or `eks-ddp:job` (one run), checked per run by key."""

from __future__ import annotations

import dataclasses

import pytest

from eks_ddp.config import ConfigError, RunConfig, StackConfig, WorkloadConfig
from tests.config.test_config import load, rejects
from tests.support.util import stack_config

DIGEST = "123456789012.dkr.ecr.us-west-2.amazonaws.com/bert@sha256:" + "a" * 64


def drop_path(cfg: dict, key: str) -> dict:
    """The config without one top-level key."""
    return {k: v for k, v in cfg.items() if k != key}


def with_runs(*runs: dict, base: str = "dev") -> dict:
    cfg = drop_path(stack_config(base), "eks-ddp:job")
    cfg["eks-ddp:runs"] = list(runs)
    return cfg


def custom(**workload) -> dict:
    return {"image": DIGEST, "module": "bert.train", **workload}


def test_job_is_the_one_run_form():
    for stack in ("dev", "p4de"):
        cfg = load(stack_config(stack))
        assert len(cfg.runs) == 1 and cfg.job is cfg.runs[0] and not cfg.runs_listed
        assert isinstance(cfg.job, RunConfig) and cfg.job.workload == WorkloadConfig()
        assert cfg.job.workload.kind == "cifar10" and not cfg.job.workload.custom
        assert cfg.run_key(0) == "job"


def test_neither_job_nor_runs_gives_one_default_run():
    cfg = load(drop_path(stack_config("dev"), "eks-ddp:job"))
    assert cfg.runs == (RunConfig(),)


def test_runs_list_parses_each_run_with_its_workload():
    cfg = load(with_runs(
        {"runId": "cifar-a", "nodes": 1},
        {"runId": "bert-1", "nodes": 2, "minNodes": 2, "rdzvBackend": "c10d",
         "workload": custom(args=["--lr", "0.1", ""], env={"OMP_NUM_THREADS": 4, "MODE": "fast"},
                            data={"s3": "s3://my-data/corpora/wiki/"})},
        {"runId": "script-run", "workload": {"script": "/app/train.py", "image": DIGEST}},
    ))
    assert cfg.runs_listed and [r.run_id for r in cfg.runs] == ["cifar-a", "bert-1", "script-run"]
    assert cfg.job is cfg.runs[0] and cfg.run_key(1) == "runs[1]"
    assert cfg.runs[0].workload.kind == "cifar10" and cfg.runs[0].nodes == 1
    bert = cfg.runs[1].workload
    assert bert.custom and bert.image == DIGEST and bert.module == "bert.train" and bert.script is None
    assert bert.args == ("--lr", "0.1", "") and dict(bert.env) == {"OMP_NUM_THREADS": "4", "MODE": "fast"}
    assert bert.s3_uri == "s3://my-data/corpora/wiki/"
    script = cfg.runs[2].workload
    assert script.script == "/app/train.py" and script.image == DIGEST and script.s3_uri is None
    assert cfg.group_of(cfg.runs[1]).name == "gpu" and cfg.uses_etcd
    with pytest.raises(TypeError):
        bert.env["X"] = "y"  # type: ignore[index]  # frozen data, like the rest of the config


def test_a_workload_declares_its_egress_and_iam_statements():
    st = {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::ckpt/*"]}
    cfg = load(with_runs({"runId": "a", "workload": custom(egress=["https", "10.20.0.0/16:5432"],
                                                          iamStatements=[st])}))
    w = cfg.runs[0].workload
    assert w.egress == ("https", "10.20.0.0/16:5432") and [dict(x) for x in w.iam_statements] == [st]


def test_workload_string_cifar10_is_the_default():
    cfg = load(with_runs({"runId": "a", "workload": "cifar10"}))
    assert cfg.runs[0].workload == WorkloadConfig()


def test_job_and_runs_together_name_both_keys():
    dev = stack_config("dev")
    msg = rejects({**dev, "eks-ddp:runs": [{"runId": "x"}]}, "eks-ddp:job", "eks-ddp:runs", "both set")
    assert "expected one of them" in msg


@pytest.mark.parametrize("value", [[], {"runId": "a"}, "run-1", None])
def test_runs_must_be_a_non_empty_list(value):
    cfg = drop_path(stack_config("dev"), "eks-ddp:job")
    cfg["eks-ddp:runs"] = value
    rejects(cfg, "runs: got", repr(value), "expected a")
    rejects(cfg, "runs: got", "list")


def test_run_keys_are_checked_per_run_with_its_index():
    rejects(with_runs({"runId": "a"}, {"runId": "Bad_Id"}), "runs[1].runId: got 'Bad_Id'")
    rejects(with_runs({"runId": "a"}, {"runId": "b", "nodeGroup": "gpus"}), "runs[1].nodeGroup: got 'gpus'",
            "expected one of gpu")
    rejects(with_runs({"runId": "a", "nodes": 3}), "runs[0].nodes: got 3", "maxSize of group 'gpu' (2)")
    rejects(with_runs({"runId": "a", "nodes": 1, "minNodes": 2}), "runs[0].minNodes: got 2",
            "expected <= runs[0].nodes (1)")
    rejects(with_runs({"runId": "a", "epoch": 3}), "runs[0].epoch: got 3", "did you mean 'epochs'")
    rejects(with_runs({"runId": "a", "namespace": "kube-system"}), "runs[0].namespace: got 'kube-system'")
    rejects(with_runs("run-1"), "runs[0]: got 'run-1'; expected an object with keys")


def test_run_ids_are_unique():
    msg = rejects(with_runs({"runId": "a"}, {"runId": "b"}, {"runId": "a"}), "runs[2].runId: got 'a'",
                  "runId of runs[0]")
    assert "expected a runId of its own" in msg
    load(with_runs({"runId": "a"}, {"runId": "b"}))  # control: distinct ids pass


def test_runs_share_one_namespace():
    rejects(with_runs({"runId": "a"}, {"runId": "b", "namespace": "other"}), "runs[1].namespace: got 'other'",
            "namespace of runs[0] ('training')")


def test_workload_image_must_be_pinned_by_digest():
    rejects(with_runs({"runId": "a", "workload": custom(image="myrepo/bert:v1")}),
            "runs[0].workload.image: got 'myrepo/bert:v1'", "pinned by digest")


@pytest.mark.parametrize(("workload", "fragment"), [
    ({"image": DIGEST}, "got neither module nor script"),
    (custom(script="/app/train.py"), "got module 'bert.train' and script '/app/train.py'"),
])
def test_workload_has_exactly_one_of_module_and_script(workload, fragment):
    msg = rejects(with_runs({"runId": "a", "workload": workload}), "runs[0].workload: ", fragment)
    assert "exactly one of runs[0].workload.module" in msg


@pytest.mark.parametrize(("workload", "key", "fragment"), [
    (custom(module="bert-train"), "runs[0].workload.module: got 'bert-train'", "Python module name"),
    (custom(module="bert.train.py."), "runs[0].workload.module", "Python module name"),
    ({"script": "train.py --lr 1"}, "runs[0].workload.script: got 'train.py --lr 1'", "arguments go in args"),
    (custom(args="--lr 0.1"), "runs[0].workload.args: got '--lr 0.1'", "a list of strings"),
    (custom(args=["--lr", 0.1]), "runs[0].workload.args[1]: got 0.1", "a string: quote the value"),
    (custom(env={"EKS_DDP_RUN_DIR": "/x"}), "runs[0].workload.env.EKS_DDP_RUN_DIR", "not starting with EKS_DDP_"),
    (custom(env={"MY-VAR": "1"}), "runs[0].workload.env.MY-VAR", "a variable name"),
    (custom(env={"FLAG": True}), "runs[0].workload.env.FLAG: got True", "a string"),
    (custom(env=["A=1"]), "runs[0].workload.env: got ['A=1']", "an object"),
    (custom(data={"s3": "s3://my-data/wiki"}), "runs[0].workload.data.s3: got 's3://my-data/wiki'",
     "end it with '/': s3://my-data/wiki/"),
    (custom(data={"s3": "s3://my-bucket/corpora/wiki.tar"}), "runs[0].workload.data.s3: got "
     "'s3://my-bucket/corpora/wiki.tar'", "(wiki.tar names one object: the stage copies every object under a prefix; "
     "give the folder that holds it, s3://my-bucket/corpora/, or put it in a folder of its own)"),
    (custom(egress=["169.254.169.254/32:80"]), "runs[0].workload.egress[0].cidr: got '169.254.169.254/32'",
     "expected a narrower CIDR, or 'internet:80' for public addresses"),
    (custom(data={"s3": "https://my-data.s3.amazonaws.com/wiki/"}), "runs[0].workload.data.s3", "an S3 prefix"),
    (custom(data={"s3": "s3://My_Bucket/wiki/"}), "runs[0].workload.data.s3", "an S3 prefix"),
    (custom(data="s3://my-data/wiki/"), "runs[0].workload.data: got 's3://my-data/wiki/'", "an object with keys s3, sha256"),
    (custom(data={"s3": "s3://my-data/wiki/", "sha256": "ABC"}), "runs[0].workload.data.sha256: got 'ABC'",
     "64 lowercase hex digits: the sha256 of the data set's manifest"),
    (custom(data={"s3": "s3://my-data/wiki/", "md5": "x"}), "runs[0].workload.data.md5: got 'x'", "known keys: s3, sha256"),
    (custom(entrypoint="x"), "runs[0].workload.entrypoint", "one of the known keys: image, module, script"),
    (custom(imgae=DIGEST), "runs[0].workload.imgae", "did you mean 'image'"),
    ("bert", "runs[0].workload: got 'bert'", "'cifar10' (the bundled trainer) or an object"),
    (custom(egress="https"), "runs[0].workload.egress: got 'https'", "a list of strings"),
    (custom(egress=["https", "0.0.0.0/0:443"]), "runs[0].workload.egress[1].cidr: got '0.0.0.0/0'",
     "instance metadata service"),
    (custom(egress=["api.wandb.ai:443"]), "runs[0].workload.egress[0].cidr: got 'api.wandb.ai'", "an IPv4 network"),
    (custom(iamStatements={"Effect": "Allow"}), "runs[0].workload.iamStatements: got {'Effect': 'Allow'}", "a list of objects"),
    (custom(iamStatements=[{"Effect": "Allow", "Action": "*", "Resource": "*"}]),
     "runs[0].workload.iamStatements[0].Action: got '*'", "never a bare '*'"),
])
def test_bad_workload_values_name_their_key(workload, key, fragment):
    rejects(with_runs({"runId": "a", "workload": workload}), key, fragment)


@pytest.mark.parametrize("uri", ["s3://my-data/", "s3://my-data/a/", "s3://my.data-1/a/b c/"[:-5] + "/"])
def test_s3_prefixes_accepted(uri):
    cfg = load(with_runs({"runId": "a", "workload": custom(data={"s3": uri})}))
    assert cfg.runs[0].workload.s3_uri == uri


@pytest.mark.parametrize("key", ["epochs", "globalBatchSize", "model", "learningRate", "compile"])
def test_trainer_only_keys_with_your_own_workload_are_refused(key):
    value = {"epochs": 3, "globalBatchSize": 256, "model": "resnet18", "learningRate": 0.1, "compile": True}[key]
    rejects(with_runs({"runId": "a", key: value, "workload": custom()}), f"runs[0].{key}: set with a workload",
            "runs[0].workload.args")
    load(with_runs({"runId": "a", key: value}))  # control: the bundled trainer reads it


def test_etcd_settings_with_only_c10d_runs_are_refused():
    cfg = with_runs({"runId": "a", "rdzvBackend": "c10d"}, {"runId": "b", "rdzvBackend": "c10d"})
    rejects(cfg, "etcd: got", "every run's rdzvBackend 'c10d'")
    mixed = load(with_runs({"runId": "a", "rdzvBackend": "c10d"}, {"runId": "b"}))  # control: one uses etcd
    assert mixed.uses_etcd
    assert not load(drop_path(cfg, "eks-ddp:etcd")).uses_etcd


def test_stack_config_always_has_a_run():
    cfg = load(stack_config("dev"))
    with pytest.raises(ValueError, match="StackConfig.runs"):
        dataclasses.replace(cfg, runs=())


def test_fabric_check_per_run_defaults_to_its_groups_efa():
    cfg = load(stack_config("p4de"))
    assert cfg.fabric_check_of(cfg.job) is True
    off = dataclasses.replace(cfg.job, fabric_check=False)
    assert cfg.fabric_check_of(off) is False


def test_problems_of_several_runs_are_all_reported():
    with pytest.raises(ConfigError) as info:
        load(with_runs({"runId": "A"}, {"runId": "b", "nodes": 9}, {"runId": "c", "workload": {"image": DIGEST}}))
    text = "\n".join(info.value.problems)
    assert "runs[0].runId" in text and "runs[1].nodes" in text and "runs[2].workload" in text


def test_stack_config_type_has_runs_not_a_job_field():
    names = {f.name for f in dataclasses.fields(StackConfig)}
    assert "runs" in names and "job" not in names


def test_dev_stacks_commented_runs_example_is_valid():
    """The commented-out example in Pulumi.dev.yaml, uncommented in place of eks-ddp:job, loads as written."""
    import yaml

    from tests.support.util import ROOT

    lines = (ROOT / "Pulumi.dev.yaml").read_text().splitlines()
    start = lines.index("  # eks-ddp:runs:")
    block = []
    for line in lines[start:]:
        if not line.startswith("  # "):
            break
        block.append(line[:2] + line[4:])
    runs = yaml.safe_load("\n".join(block).replace("<64 hex>", "0" * 64))["eks-ddp:runs"]
    cfg = load(with_runs(*runs))
    assert [r.run_id for r in cfg.runs] == ["cifar-a", "bert-1"]
    assert cfg.runs[1].workload.s3_uri == "s3://my-bucket/corpora/wiki/"


def test_a_workload_under_job_points_at_runs():
    raw = stack_config("dev")
    raw["eks-ddp:job"] = {**raw["eks-ddp:job"], "workload": custom()}
    rejects(raw, "job.workload: eks-ddp:job runs the bundled trainer", "under eks-ddp:runs")


def test_the_stack_forms_egress_message_names_no_python_argument():
    """Review mistake 29: the fix named Egress's except_, a Python argument the stack file has no key for."""
    msg = rejects(with_runs({"runId": "a", "workload": custom(egress=["169.254.169.254/32:80"])}),
                  "runs[0].workload.egress[0].cidr")
    assert "except_" not in msg and "Egress.internet" not in msg, msg
