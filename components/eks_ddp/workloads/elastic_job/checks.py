"""The rules of :class:`~eks_ddp.workloads.elastic_job.args.ElasticJobArgs` that need more than its parts: the
roles its pods assume, the pod names' length, and one run directory per job of the program (each part checked
itself where it was built: args.py)."""

from __future__ import annotations

import weakref
from typing import Any

import pulumi

from eks_ddp.core import rules
from eks_ddp.core.workload import S3Data
from eks_ddp.infra.iam import granted_statements, trust_problem
from eks_ddp.workloads.elastic_job.args import ElasticJobArgs, PerRunClaims


def validate(name: str, a: ElasticJobArgs) -> None:
    """Each names the field, the bad value and what is allowed."""
    if isinstance(a.workload.data, S3Data) and a.data_role_arn is None:
        raise ValueError(f"data_role_arn: got None with workload.data {a.workload.data.uri!r}; expected the S3 data "
                         "stage's IAM role (eks_ddp.infra.iam.data_stage_role(...)); its pods get no other AWS "
                         "credentials")
    if isinstance(a.workload.data, S3Data) and (bad := trust_problem(name, a.namespace, a.data_role_arn)):
        raise ValueError(bad)
    if a.workload.iam_statements and a.results is None:
        raise ValueError("workload.iam_statements: given, but results is None; expected Results(role_arn=...): the "
                         "training pods' IRSA role to attach them to (ResultsBucket.uploader_role(...), or a role of "
                         "yours trusting the ServiceAccount <name>-trainer)")
    if a.workload.iam_statements and a.results is not None and \
            granted_statements(a.results.role_arn) != tuple(dict(st) for st in a.workload.iam_statements):
        raise ValueError("workload.iam_statements: given, but no policy on results.role_arn grants them; expected "
                         "results.role_arn = eks_ddp.infra.iam.workload_policy(<name>, <role ARN>, "
                         "workload.iam_statements), which attaches them")
    # Pod hostnames are <job>-<index>; both must stay DNS labels.
    rules.require(rules.run_id("run_id", a.run_id))
    if len(f"{name}-{a.run_id}-{a.size.nodes}") > 63:
        raise ValueError(f"run_id: got {a.run_id!r}; expected lowercase letters, digits and '-' making "
                         f"'{name}-<run_id>-<index>' at most 63 characters (pod host names)")


_RUN_DIRS: weakref.WeakKeyDictionary[Any, list[tuple[str, Any, Any, str | None]]] = weakref.WeakKeyDictionary()
"""Per program run (its root stack): (job name, namespace, claim, run id) of every ElasticJob made so far."""


def _same(x: Any, y: Any) -> bool:
    """The same claim or namespace: equal plain values, or the very same Output (an Output's value is unknown)."""
    return x is y or (isinstance(x, str) and isinstance(y, str) and x == y)


def claim_run_dir(name: str, a: ElasticJobArgs) -> None:
    """Refuse a second ElasticJob of this program writing the same run directory: the same ``run_id`` on the same
    whole-volume claim (``WholeVolume``: ``/shared/runs/<run_id>``), or the same ``PerRunClaims.run`` (the run
    directory itself); then register this one."""
    root = pulumi.runtime.get_root_resource()
    if root is None:
        return
    seen = _RUN_DIRS.setdefault(root, [])
    whole = not isinstance(a.storage, PerRunClaims)
    claim, run_id = (a.storage.claim, a.run_id) if not isinstance(a.storage, PerRunClaims) else (a.storage.run, None)
    for other, namespace, other_claim, other_run in seen:
        if _same(namespace, a.namespace) and _same(other_claim, claim) and other_run == run_id:
            shown = claim if isinstance(claim, str) else "(the same Output)"
            key = "run_id" if whole else "storage.run"
            value = a.run_id if whole else shown
            raise ValueError(f"{key}: got {value!r} for ElasticJob {name!r}, but ElasticJob {other!r} already writes "
                             f"/shared/runs/{a.run_id} on claim {shown!r}: the second would resume from the "
                             f"first's checkpoints and overwrite its results; expected a {key} no other job of the "
                             "program uses on that claim")
    seen.append((name, a.namespace, claim, run_id))
