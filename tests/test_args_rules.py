"""Component Args reject what the stack config rejects, where they are built, naming the field."""

from __future__ import annotations

import math

import pytest

from components.elastic_job import ElasticJobArgs
from components.etcd import EtcdRendezvousArgs

DIGEST = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:" + "a" * 64
GOOD = dict(namespace="training", image=DIGEST, pvc_name="shared", instance_type="g5.12xlarge",
            rdzv_endpoint="http://etcd:2379", rdzv_tls_secret="rendezvous-etcd-tls-client-tls")

BAD_JOB = {
    "epochs": 0, "global_batch_size": -5, "model": "resnet50", "learning_rate": math.nan,
    "namespace": "Bad_NS", "image": "repo@sha256:...", "nodes": "4",
}


@pytest.mark.parametrize("field,value", BAD_JOB.items(), ids=BAD_JOB.keys())
def test_elastic_job_args_reject_a_bad_value_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^(.*; )?{field}: got "):
        ElasticJobArgs(**{**GOOD, field: value})


def test_elastic_job_args_list_every_bad_field_at_once():
    with pytest.raises(ValueError) as info:
        ElasticJobArgs(**{**GOOD, **{k: v for k, v in BAD_JOB.items() if k != "nodes"}})
    for field in ("epochs", "global_batch_size", "model", "learning_rate", "namespace", "image"):
        assert f"{field}: got" in str(info.value), field


def test_good_elastic_job_args_build():
    assert ElasticJobArgs(**GOOD).nodes == 2


@pytest.mark.parametrize("namespace", ["default", "kube-system", "Bad_NS"])
def test_etcd_args_reject_a_namespace_the_config_rejects(namespace):
    with pytest.raises(ValueError, match="namespace: got"):
        EtcdRendezvousArgs(namespace=namespace)


@pytest.mark.parametrize("vpc_cidr", ["127.0.0.0/16", "224.0.0.0/16", "0.0.0.0/16", "10.0.0.1/16"])
def test_network_rejects_a_vpc_range_the_config_rejects(vpc_cidr):
    from components.network import NetworkArgs, validate

    with pytest.raises(ValueError, match="vpc_cidr: got"):
        validate(NetworkArgs(cluster_name="c", availability_zones=["us-west-2a", "us-west-2b"], vpc_cidr=vpc_cidr))
