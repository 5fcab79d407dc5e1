"""The stack file's JSON Schema (docs/stack-config.schema.json): generated from the config models, and what an
editor holding it says about the example stacks (they pass; a wrong key or type fails). And what the models refuse
although pydantic alone would take it (null, field names as keys, lax coercion), as the hand-written reader did."""

from __future__ import annotations

import copy

import pytest
import yaml
from jsonschema import Draft202012Validator

from eks_ddp.config.reference import SCHEMA_FILE, schema_text, stack_file_schema
from tests.support.util import ROOT

MODELINE = f"# yaml-language-server: $schema={SCHEMA_FILE.as_posix()}"


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = stack_file_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def stack_file(name: str) -> dict:
    return yaml.safe_load((ROOT / f"Pulumi.{name}.yaml").read_text())


def errors(validator: Draft202012Validator, document: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_checked_in_schema_is_what_the_models_generate():
    assert (ROOT / SCHEMA_FILE).read_text() == schema_text(), (
        "regenerate it: python -m eks_ddp.config --schema > docs/stack-config.schema.json")


@pytest.mark.parametrize("name", ["dev", "p4de"])
def test_example_stacks_validate_and_name_the_schema(validator, name):
    assert errors(validator, stack_file(name)) == []
    assert (ROOT / f"Pulumi.{name}.yaml").read_text().splitlines()[0] == MODELINE


def test_the_dev_stacks_runs_example_validates(validator):
    """The commented-out runs: example (a workload of your own, with data and env) is valid too."""
    lines = (ROOT / "Pulumi.dev.yaml").read_text().splitlines()
    block = []
    for line in lines[lines.index("  # eks-ddp:runs:"):]:
        if not line.startswith("  # "):
            break
        block.append(line[:2] + line[4:])
    doc = stack_file("dev")
    del doc["config"]["eks-ddp:job"]
    doc["config"].update(yaml.safe_load("\n".join(block).replace("<64 hex>", "0" * 64)))
    assert errors(validator, doc) == []


@pytest.mark.parametrize(("change", "where"), [
    (lambda c: c.update({"eks-ddp:nodeGroup": []}), "config"),                       # a typo'd top-level key
    (lambda c: c["eks-ddp:nodeGroups"][0].update(instanceTyp="g5.xlarge"), "config.eks-ddp:nodeGroups.0"),
    (lambda c: c["eks-ddp:nodeGroups"][0].update(efa="yes"), "config.eks-ddp:nodeGroups.0.efa"),
    (lambda c: c["eks-ddp:nodeGroups"][0].update(capacityType="reserved"), "config.eks-ddp:nodeGroups.0.capacityType"),
    (lambda c: c["eks-ddp:job"].update(epochs="ten"), "config.eks-ddp:job.epochs"),
    (lambda c: c["eks-ddp:job"].update(workload="cifar10"), "config.eks-ddp:job"),  # runs only
    (lambda c: c["eks-ddp:cluster"].update(kubernetesVersion=1.35), "config.eks-ddp:cluster.kubernetesVersion"),
])
def test_a_wrong_key_or_type_fails(validator, change, where):
    doc = stack_file("dev")
    change(doc["config"])
    assert any(e.startswith(f"{where}:") for e in errors(validator, doc)), errors(validator, doc)


def test_other_namespaces_and_pulumi_forms_pass(validator):
    """Pulumi's own keys and other providers' stay free; numbers `pulumi config set --path` stores as strings pass."""
    doc = copy.deepcopy(stack_file("dev"))
    doc["config"].update({"aws:profile": "ml", "pulumi:tags": {"team": "ml"}})
    doc["config"]["eks-ddp:job"].update(learningRate="0.1", epochs="20", runId=2024)
    doc["encryptionsalt"] = "v1:abc"
    assert errors(validator, doc) == []


# --- what pydantic alone would accept, and the stack file refuses -----------------------------------------------------

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
    from eks_ddp.config import ConfigError, load_stack_config
    from tests.support.util import set_path, stack_config

    raw = set_path(stack_config("dev"), path, value)
    if path == "eks-ddp:runs":
        del raw["eks-ddp:job"]
    with pytest.raises(ConfigError) as info:
        load_stack_config({k: v for k, v in raw.items() if k.startswith("eks-ddp:")}, region=raw["aws:region"])
    assert any(p.startswith(message) for p in info.value.problems), info.value.problems
