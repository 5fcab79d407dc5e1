"""Test helpers: stack configs as dicts, path edits, and program runs under fresh mocks."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from eks_ddp.tooling.mocks import PROJECT_ROOT, ProgramResult, run_program
from eks_ddp.tooling.plan import load_stack_file

ROOT = PROJECT_ROOT
TEST_PUBLIC_CIDR = "1.2.3.4/32"


def stack_config(stack: str = "dev") -> dict[str, Any]:
    """The stack file's config with objects decoded, preflight off (no AWS here)."""
    raw = load_stack_file(stack)
    out: dict[str, Any] = {}
    for k, v in raw.items():
        try:
            out[k] = json.loads(v)
        except (TypeError, json.JSONDecodeError):
            out[k] = v
    out["eks-ddp:preflight"] = False
    # The example stacks ship documentation-range placeholders that `pulumi up` rejects (on purpose);
    # tests stand in a real public address, as a user's edited stack would have.
    cluster = out.get("eks-ddp:cluster")
    if isinstance(cluster, dict) and "publicAccessCidrs" in cluster:
        cluster["publicAccessCidrs"] = [TEST_PUBLIC_CIDR]
    return out


BYO_OWN_ACCOUNT_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/nlp/bert@sha256:" + "b1" * 32
"""A run image in another repository of the stack's own account (the mocks' account)."""
BYO_OTHER_ACCOUNT_IMAGE = "210987654321.dkr.ecr.us-west-2.amazonaws.com/vision/vit:v3@sha256:" + "c2" * 32
"""A run image in another account's repository, same region (a tag before the digest, as users write it)."""
BYO_OTHER_ACCOUNT_DATA = "s3://datalake-210987654321-usw2/corpora/wiki/"
"""An S3 data set in a bucket another account (210987654321) owns."""


def byo_stack_config() -> dict[str, Any]:
    """The dev stack with three runs: the bundled trainer, and two runs of other images (two ECR repositories,
    one in another account), one of them staging an S3 data set from another account's bucket."""
    out = {k: v for k, v in stack_config("dev").items() if k != "eks-ddp:job"}
    out["eks-ddp:runs"] = [
        {"runId": "cifar-a", "nodes": 1},
        {"runId": "bert-1", "nodes": 2, "workload": {
            "image": BYO_OWN_ACCOUNT_IMAGE, "module": "bert.train", "args": ["--lr", "0.1"],
            "data": {"s3": BYO_OTHER_ACCOUNT_DATA}}},
        {"runId": "vit-1", "nodes": 2, "rdzvBackend": "c10d", "workload": {
            "image": BYO_OTHER_ACCOUNT_IMAGE, "script": "/app/train.py"}},
    ]
    return out


def set_path(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Copy of ``config`` with ``path`` set, e.g. ``eks-ddp:nodeGroups[0].efa``."""
    new = copy.deepcopy(config)
    key, _, rest = path.partition(".")
    m = re.match(r"^(.*?)((\[\d+\])*)$", key)
    top, idx = m.group(1), m.group(2)
    parts: list[Any] = [int(i) for i in re.findall(r"\[(\d+)\]", idx)]
    parts += [p for p in rest.split(".") if p] if rest else []
    if not parts:
        new[top] = value
        return new
    target = new.setdefault(top, {})
    for p in parts[:-1]:
        target = target[p]
    target[parts[-1]] = value
    return new


def at_version(config: dict[str, Any], version: str) -> dict[str, Any]:
    """Copy of ``config`` at Kubernetes ``version``, with upgradePolicy EXTENDED where today EKS would refuse
    STANDARD (a version already past standard support)."""
    import datetime as dt

    from eks_ddp.core import k8s_versions

    out = set_path(config, "eks-ddp:cluster.kubernetesVersion", version)
    if k8s_versions.support_on(version, dt.date.today()) == "extended":
        out = set_path(out, "eks-ddp:cluster.upgradePolicy", "EXTENDED")
    return out


def drop_path(config: dict[str, Any], path: str) -> dict[str, Any]:
    new = copy.deepcopy(config)
    top, _, rest = path.partition(".")
    target = new[top]
    parts = rest.split(".")
    for p in parts[:-1]:
        target = target[int(p)] if p.isdigit() else target[p]
    del target[parts[-1]]
    return new


def run(config: dict[str, Any], stack: str = "dev") -> ProgramResult:
    region = config.get("aws:region", "us-west-2")
    return run_program(config, stack=stack, region=region)


def parent_chain(result: ProgramResult, urn: str) -> list[str]:
    """Types from a resource's parent up to the root."""
    chain = []
    r = result.by_urn(urn)
    while r is not None and r.parent_urn:
        parent = result.by_urn(r.parent_urn)
        if parent is None:
            break
        chain.append(parent.type)
        r = parent
    return chain


__all__ = ["ROOT", "Path", "stack_config", "byo_stack_config", "set_path", "drop_path", "run", "parent_chain"]
