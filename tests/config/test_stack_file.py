"""The stack file's JSON Schema (docs/stack-config.schema.json): generated from the config models, and what an
editor holding it says about the example stacks (they pass; a wrong key or type fails). What the stack file refuses
although pydantic alone would take it is tests/config/test_messages.py."""

from __future__ import annotations

import copy

import pytest
import yaml
from jsonschema import Draft202012Validator

from eks_ddp.tooling.config_docs import SCHEMA_FILE, schema_text, stack_file_schema
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
        "regenerate it: python -m eks_ddp.tooling.config_docs --schema > docs/stack-config.schema.json")


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


