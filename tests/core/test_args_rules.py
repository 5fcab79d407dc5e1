"""Component Args reject what the stack config rejects, where they are built, naming the field."""

from __future__ import annotations

import math

import pytest

from eks_ddp.core.workload import cifar10_workload
from eks_ddp.workloads.etcd import EtcdRendezvousArgs
from tests.support.job_args import job_args

DIGEST = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:" + "a" * 64
GOOD = dict(namespace="training", image=DIGEST, pvc_name="shared", instance_type="g5.12xlarge",
            rdzv_endpoint="http://etcd:2379", rdzv_tls_secret="rendezvous-etcd-tls-client-tls")

BAD_JOB = {"namespace": "Bad_NS", "image": "repo@sha256:...", "nodes": "4", "workload": "cifar10"}
BAD_TRAINER = {"epochs": 0, "global_batch_size": -5, "model": "resnet50", "learning_rate": math.nan}


@pytest.mark.parametrize("field,value", BAD_JOB.items(), ids=BAD_JOB.keys())
def test_elastic_job_args_reject_a_bad_value_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^(.*; )?(size\.)?{field}: got "):
        job_args(**{**GOOD, field: value})


@pytest.mark.parametrize("field,value", BAD_TRAINER.items(), ids=BAD_TRAINER.keys())
def test_the_bundled_trainer_workload_rejects_a_bad_value_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^(.*; )?{field}: got "):
        cifar10_workload(**{field: value})


def test_elastic_job_args_list_every_bad_field_at_once():
    with pytest.raises(ValueError) as info:
        job_args(**{**GOOD, **{k: v for k, v in BAD_JOB.items() if k != "nodes"}})
    for field in ("namespace", "image", "workload"):
        assert f"{field}: got" in str(info.value), field
    with pytest.raises(ValueError) as info:
        cifar10_workload(**BAD_TRAINER)
    for field in BAD_TRAINER:
        assert f"{field}: got" in str(info.value), field


def test_good_elastic_job_args_build():
    assert job_args(**GOOD).size.nodes == 2


@pytest.mark.parametrize("namespace", ["default", "kube-system", "Bad_NS"])
def test_etcd_args_reject_a_namespace_the_config_rejects(namespace):
    with pytest.raises(ValueError, match="namespace: got"):
        EtcdRendezvousArgs(namespace=namespace)


@pytest.mark.parametrize("vpc_cidr", ["127.0.0.0/16", "224.0.0.0/16", "0.0.0.0/16", "10.0.0.1/16"])
def test_network_rejects_a_vpc_range_the_config_rejects(vpc_cidr):
    from eks_ddp.infra.network import NetworkArgs, validate

    with pytest.raises(ValueError, match="vpc_cidr: got"):
        validate(NetworkArgs(cluster_name="c", availability_zones=["us-west-2a", "us-west-2b"], vpc_cidr=vpc_cidr))


# --- the infrastructure Args: the stack config's rules, and pulumi.Input values ------------------------------------

def _in_program(build):
    """Run ``build`` inside a Pulumi program (Outputs need one) and return what it returned."""
    import pulumi

    from eks_ddp.tooling.mocks import run_program

    holder = {}

    def program():
        holder["value"] = build(pulumi.Output.from_input)
        pulumi.export("done", True)

    run_program({}, program=program)
    return holder["value"]


def _cluster_args(**change):
    from eks_ddp.infra.cluster import EksClusterArgs

    base = dict(cluster_name="eks-ddp-test", vpc_id="vpc-123", public_subnet_ids=["subnet-p1", "subnet-p2"],
                private_subnet_ids=["subnet-a", "subnet-b"], public_access_cidrs=["1.2.3.4/32"])
    return EksClusterArgs(**{**base, **change})


def _group_args(**change):
    import dataclasses

    from tests.infra.test_gpu_nodegroup import BASE

    return dataclasses.replace(BASE, **change)


def test_network_args_zones_default_to_none_with_your_own_vpc():
    """availability_zones was required although bring-your-own ignores it."""
    from eks_ddp.infra.network import NetworkArgs, validate

    validate(NetworkArgs(cluster_name="c", vpc_id="vpc-1", private_subnet_ids=["subnet-a", "subnet-b"]))
    with pytest.raises(ValueError, match=r"^availability_zones: got \[\]"):  # a new VPC still needs them
        validate(NetworkArgs(cluster_name="c"))


def test_network_args_with_outputs_give_a_message_or_are_accepted():
    """NetworkArgs(private_subnet_ids=Output) was a TypeError (len() of an Output)."""
    from eks_ddp.infra.network import NetworkArgs, validate

    def build(out):
        problems = {}
        for name, args in {
            "whole list": NetworkArgs(cluster_name="c", vpc_id="vpc-1", private_subnet_ids=out(["subnet-a", "b"])),
            "one id": NetworkArgs(cluster_name="c", vpc_id="vpc-1", private_subnet_ids=[out("subnet-a"), "b"]),
            "zones": NetworkArgs(cluster_name="c", availability_zones=out(["us-west-2a", "us-west-2b"])),
            "name": NetworkArgs(cluster_name=out("c"), availability_zones=["us-west-2a", "us-west-2b"]),
        }.items():
            with pytest.raises(ValueError) as info:
                validate(args)
            problems[name] = str(info.value)
        # vpc_id and public subnets are only passed on: Outputs are fine there.
        validate(NetworkArgs(cluster_name="c", vpc_id=out("vpc-1"), public_subnet_ids=[out("subnet-p")],
                             private_subnet_ids=["subnet-a", "subnet-b"]))
        return problems

    problems = _in_program(build)
    assert problems["whole list"].startswith("private_subnet_ids: got a pulumi Output; expected a list known when")
    assert problems["one id"].startswith("private_subnet_ids[0]: got a pulumi Output; expected a subnet id string")
    assert problems["zones"].startswith("availability_zones: got a pulumi Output")
    assert problems["name"].startswith("cluster_name: got a pulumi Output")


def test_network_args_check_names_and_zones_like_the_stack_config():
    from eks_ddp.infra.network import NetworkArgs, validate

    with pytest.raises(ValueError, match="^cluster_name: got 'My Cluster'"):
        validate(NetworkArgs(cluster_name="My Cluster", availability_zones=["us-west-2a", "us-west-2b"]))
    with pytest.raises(ValueError, match=r"^availability_zones\[1\]: got 'us-west-2'"):
        validate(NetworkArgs(cluster_name="c", availability_zones=["us-west-2a", "us-west-2"]))


@pytest.mark.parametrize(("change", "fragment"), [
    ({"kubernetes_version": "1.29"}, "kubernetes_version: got '1.29'; expected one of 1.3"),
    ({"cluster_name": "My Cluster"}, "cluster_name: got 'My Cluster'"),
    ({"system_instance_type": "m7g.large"}, "system_instance_type: got 'm7g.large'; expected one of"),
    ({"system_instance_type": "m7g.large"}, "catalog.register(InstanceType(...))"),
    ({"admin_principal_arns": ["alice"]}, "admin_principal_arns[0]: got 'alice'; expected an IAM role or user ARN"),
    ({"system_node_count": "2"}, "system_node_count: got '2'; expected a whole number"),
])
def test_cluster_args_follow_the_stack_configs_rules(change, fragment):
    """these were accepted, and kubernetes_version='1.29' was a KeyError."""
    from eks_ddp.infra.cluster import validate

    with pytest.raises(ValueError) as info:
        validate(_cluster_args(**change))
    assert fragment in str(info.value)


def test_cluster_args_accept_what_the_stack_config_accepts():
    from eks_ddp.infra.cluster import validate

    validate(_cluster_args(system_instance_type="m5.large", cluster_name="team_a-dev"))


def test_cluster_args_take_outputs_where_they_are_inputs_and_say_so_where_not():
    """public_access_cidrs=Output was "'Output' object is not iterable"."""
    from eks_ddp.infra.cluster import EksCluster, validate

    def build(out):
        validate(_cluster_args(public_access_cidrs=out(["1.2.3.4/32"]), private_subnet_ids=out(["a", "b"]),
                               public_subnet_ids=out(["p"])))
        validate(_cluster_args(public_access_cidrs=[out("1.2.3.4/32"), "5.6.7.8/32"]))
        validate(_cluster_args(public_access_cidrs=[out("1.2.3.4/32")]))
        validate(_cluster_args(public_access_cidrs=out([]), endpoint_public_access=False))
        EksCluster("c", _cluster_args(public_access_cidrs=out(["1.2.3.4/32"]), private_subnet_ids=out(["a", "b"])))
        bad = {}
        for field, value in {"system_node_count": out(2), "kubernetes_version": out("1.35"),
                             "admin_principal_arns": out(["arn:aws:iam::123456789012:role/x"])}.items():
            with pytest.raises(ValueError) as info:
                validate(_cluster_args(**{field: value}))
            bad[field] = str(info.value)
        return bad

    bad = _in_program(build)
    for field, message in bad.items():
        assert message.startswith(f"{field}: got a pulumi Output; expected"), message
        assert "known when the program runs" in message


def test_cluster_args_still_refuse_a_world_open_plain_cidr_next_to_an_output():
    from eks_ddp.infra.cluster import validate

    def build(out):
        with pytest.raises(ValueError, match="narrower than /0"):
            validate(_cluster_args(public_access_cidrs=[out("1.2.3.4/32"), "0.0.0.0/0"]))
        return True

    assert _in_program(build)


@pytest.mark.parametrize(("change", "fragment"), [
    ({"group_name": "GPU_A"}, "group_name: got 'GPU_A'"),
    ({"group_name": "g" * 41}, "(max 40)"),
    ({"capacity_reservation_id": "cr-123", "availability_zone": "us-west-2a"}, "capacity_reservation_id: got 'cr-123'"),
    ({"max_size": 2.5}, "max_size: got 2.5; expected a whole number"),
])
def test_gpu_nodegroup_args_follow_the_stack_configs_rules(change, fragment):
    """GpuNodeGroupArgs(group_name='GPU_A') was accepted."""
    from eks_ddp.infra.gpu_nodegroup import validate

    with pytest.raises(ValueError) as info:
        validate(_group_args(**change))
    assert fragment in str(info.value)


def test_gpu_nodegroup_args_with_outputs_give_a_message_or_are_accepted():
    """GpuNodeGroupArgs(max_size=Output) was "'<' not supported between 'Output' and 'int'"."""
    from eks_ddp.infra.gpu_nodegroup import GpuNodeGroup, validate

    def build(out):
        bad = {}
        for field, value in {"max_size": out(2), "min_size": out(0), "group_name": out("gpu"),
                             "instance_type": out("g4dn.xlarge"), "availability_zone": out("us-west-2a")}.items():
            with pytest.raises(ValueError) as info:
                validate(_group_args(**{field: value}))
            bad[field] = str(info.value)
        args = _group_args(subnet_ids=out(["subnet-a", "subnet-b"]), cluster_name=out("eks-ddp-test"),
                           capacity_reservation_id=None, placement_group_name=out("pg"))
        validate(args)
        GpuNodeGroup("g", args)
        return bad

    bad = _in_program(build)
    for field, message in bad.items():
        assert message.startswith(f"{field}: got a pulumi Output; expected"), message


@pytest.mark.parametrize(("change", "fragment"), [
    ({"scale_down_unneeded_time": "10 minutes"}, "scale_down_unneeded_time: got '10 minutes'; expected a duration"),
    ({"region": "us-west-3"}, "region: got 'us-west-3'; expected an AWS region"),
    ({"cluster_name": "My Cluster"}, "cluster_name: got 'My Cluster'"),
    ({"kubernetes_version": "1.29"}, "kubernetes_version: got '1.29'; expected one of"),
])
def test_autoscaler_args_follow_the_stack_configs_rules(change, fragment):
    """ClusterAutoscalerArgs(scale_down_unneeded_time='10 minutes', region='us-west-3') was accepted."""
    from eks_ddp.infra.autoscaler import ClusterAutoscalerArgs, validate

    base = dict(cluster_name="eks-ddp-test", region="us-west-2", kubernetes_version="1.35",
                oidc_provider_arn="arn:aws:iam::123456789012:oidc-provider/x", oidc_provider_url="https://x",
                node_selector={"eks-ddp/role": "system"})
    validate(ClusterAutoscalerArgs(**base))  # control
    with pytest.raises(ValueError) as info:
        validate(ClusterAutoscalerArgs(**{**base, **change}))
    assert fragment in str(info.value)


def test_the_package_exports_its_components_statically_and_is_typed():
    """U14 and U11: a lazy __getattr__ (mypy saw Any), no py.typed, a docstring naming `components`."""
    import tomllib

    import eks_ddp
    from tests.support.util import ROOT

    assert not hasattr(eks_ddp, "__getattr__")
    assert "from eks_ddp import" in eks_ddp.__doc__ and "from components import" not in eks_ddp.__doc__
    for name in eks_ddp.__all__:
        assert getattr(eks_ddp, name).__module__.startswith(eks_ddp.__name__ + "."), name
    assert (ROOT / "components" / "eks_ddp" / "py.typed").exists()
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["eks_ddp"]


def test_importing_the_package_loads_no_torch():
    import subprocess
    import sys

    from tests.support.util import ROOT

    code = ("import sys\nfor m in ('torch', 'torchvision', 'matplotlib', 'etcd'):\n    sys.modules[m] = None\n"
            "import eks_ddp, eks_ddp.core.launch_command\nprint(' '.join(sorted(eks_ddp.__all__)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"ClusterAddons", "ElasticJob", "Workload", "cifar10_workload"} <= set(out.stdout.split())
