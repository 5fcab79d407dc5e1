"""The one formatter (components/eks_ddp/config/messages.py): every refusal pydantic reports reads
``<key>: got X; expected Y``, naming the YAML key, the bad value and what the key allows; unknown keys with a
did-you-mean; what pydantic alone would coerce and the stack file refuses."""

from __future__ import annotations

import pytest

from eks_ddp.config import ConfigError, load_stack_config
from tests.config.test_config import rejects
from tests.support.util import set_path, stack_config


@pytest.fixture
def dev():
    return stack_config("dev")


def test_unknown_top_level_key_is_a_typo(dev):
    cfg = dict(dev, **{"eks-ddp:nodeGroup": []})
    msg = rejects(cfg, "eks-ddp:nodeGroup", "unknown key")
    assert "did you mean 'nodeGroups'" in msg


def test_unknown_nested_key_is_a_typo(dev):
    msg = rejects(set_path(dev, "eks-ddp:job.epoch", 3), "job.epoch", "known keys")
    assert "did you mean 'epochs'" in msg


@pytest.mark.parametrize("path,value,key,allowed", [
    ("eks-ddp:job.epochs", "ten", "job.epochs", "whole number"),
    ("eks-ddp:nodeGroups[0].efa", "yes", "nodeGroups[0].efa", "true or false"),
    ("eks-ddp:nodeGroups[0].capacityType", "reserved", "nodeGroups[0].capacityType", "'spot'"),
    ("eks-ddp:cluster.publicAccessCidrs", "10.0.0.0/8", "cluster.publicAccessCidrs", "list of strings"),
    ("eks-ddp:job.model", "vit", "job.model", "'resnet18'"),
    ("eks-ddp:job.learningRate", "fast", "job.learningRate", "a number"),
])
def test_wrong_types(dev, path, value, key, allowed):
    rejects(set_path(dev, path, value), key, repr(value), allowed)


def test_bool_is_not_a_count(dev):
    rejects(set_path(dev, "eks-ddp:job.nodes", True), "job.nodes", "True", "whole number")


@pytest.mark.parametrize(("value", "shown"), [(1.35, "1.35"), (1.3, "1.3")])
def test_unquoted_kubernetes_version_says_to_quote_it_and_lists_the_versions(dev, value, shown):
    """`kubernetesVersion: 1.35` (and 1.30, read as 1.3) said only "expected a non-empty string"."""
    from eks_ddp.config import SUPPORTED_KUBERNETES_VERSIONS

    msg = rejects(set_path(dev, "eks-ddp:cluster.kubernetesVersion", value), f"cluster.kubernetesVersion: got {shown};")
    assert "quote the value" in msg and "1.30 as the number 1.3" in msg
    assert "expected one of " + ", ".join(map(repr, SUPPORTED_KUBERNETES_VERSIONS)) in msg  # what is allowed
    other = rejects(set_path(dev, "eks-ddp:job.runId", 1.5), "job.runId: got 1.5;")  # any string key: quote it
    assert "quote the value" in other and SUPPORTED_KUBERNETES_VERSIONS[-1] not in other


@pytest.mark.parametrize(("key", "value", "path"), [
    ("eks-ddp:image.prebuilt", "repo@sha256:" + "a" * 64, "image.prebuilt"),
    ("eks-ddp:nodeGroups[0].instanceType", "g5.xlarge", "nodeGroups[0].instanceType"),
    ("eks-ddp:job.epochs", "20", "job.epochs"),
])
def test_a_dotted_top_level_key_suggests_path(dev, key, value, path):
    """`pulumi config set eks-ddp:image.prebuilt X` without --path gave only "unknown key"."""
    msg = rejects({**dev, key: value}, f"{key}: unknown key, a path set without --path")
    assert f"pulumi config set --path '{path}' '{value}'" in msg
    assert f"pulumi config rm '{key}'" in msg
    plain = rejects({**dev, "eks-ddp:imagez": "x"}, "eks-ddp:imagez: unknown key; known keys")  # control
    assert "--path" not in plain


@pytest.mark.parametrize(("path", "value", "message"), [
    # null is not "unset": a key given is read (the models' None default stays for Python callers)
    ("eks-ddp:network.vpcId", None, "network.vpcId: got None; expected a string (leave the key out"),
    ("eks-ddp:runs", None, "runs: got None; expected a list of objects with keys nodeGroup, nodes"),
    # the stack file is read by its keys only; Python's field names are not keys
    ("eks-ddp:nodeGroups", [{"name": "gpu", "instance_type": "g4dn.xlarge", "max_size": 2}],
     "nodeGroups[0].instance_type: got 'g4dn.xlarge'; expected one of the known keys: name, instanceType"),
    # a workload's kind is what its form says ('cifar10' or an object), never a key
    ("eks-ddp:runs", [{"runId": "a", "workload": {"kind": "custom", "module": "m"}}],
     "runs[0].workload.kind: got 'custom'; expected one of the known keys: image, module, script, args, env, data"),
    # no lax coercion: a bool is not a count, a number is not a string list, "1.5" is not a whole number
    ("eks-ddp:job.nodes", True, "job.nodes: got True; expected a whole number"),
    ("eks-ddp:job.epochs", "1.5", "job.epochs: got '1.5'; expected a whole number"),
    ("eks-ddp:cluster.publicAccessCidrs", ["1.2.3.4/32", 5], "cluster.publicAccessCidrs[1]: got 5; expected a string"),
    ("eks-ddp:nodeGroups[0].efa", "yes", "nodeGroups[0].efa: got 'yes'; expected true or false"),
    ("eks-ddp:job.learningRate", True, "job.learningRate: got True; expected a number"),
])
def test_the_stack_file_refuses_what_pydantic_would_coerce(path, value, message):
    from tests.support.util import set_path

    raw = set_path(stack_config("dev"), path, value)
    if path == "eks-ddp:runs":
        del raw["eks-ddp:job"]
    with pytest.raises(ConfigError) as info:
        load_stack_config({k: v for k, v in raw.items() if k.startswith("eks-ddp:")}, region=raw["aws:region"])
    assert any(p.startswith(message) for p in info.value.problems), info.value.problems


def test_a_top_level_section_left_empty_reads_as_its_defaults(dev):
    """`eks-ddp:observability:` with every key commented out is null in YAML: the section's defaults, as before;
    null anywhere else (a key, a list) is refused naming the key."""
    cfg = load_stack_config({**{k: v for k, v in dev.items() if k.startswith("eks-ddp:")}, "eks-ddp:observability": None},
                            region=dev["aws:region"])
    assert cfg.observability.cloudwatch is True
    rejects(set_path(dev, "eks-ddp:observability.cloudwatch", None), "observability.cloudwatch: got None",
            "expected true or false")


def test_a_required_key_left_out_says_what_it_takes(dev):
    """A missing key reads like every other refusal (``key: required; expected Y``): what the key takes, not its
    documentation (the page's meaning column)."""
    rejects(set_path(dev, "eks-ddp:nodeGroups", [{"name": "gpu"}]),
            "nodeGroups[0].instanceType: required; expected a string")
    rejects({k: v for k, v in dev.items() if k != "eks-ddp:nodeGroups"},
            "nodeGroups: required; expected a list of objects with keys name, instanceType, minSize")
