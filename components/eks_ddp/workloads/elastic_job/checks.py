"""The checks of :class:`~eks_ddp.workloads.elastic_job.args.ElasticJobArgs` across fields and against the
catalog: each names the field, the bad value and what is allowed."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import pulumi

from eks_ddp.core import catalog, rules
from eks_ddp.core.torchrun import AGENT_ENV
from eks_ddp.core.workload import DATA_VERIFY_ENV, S3Data
from eks_ddp.infra.gpu_nodegroup import group_for
from eks_ddp.infra.iam import trust_problem
from eks_ddp.workloads.elastic_job.args import ElasticJobArgs
from eks_ddp.workloads.elastic_job.pods import CACHE_ENV, nccl_env
from eks_ddp.workloads.elastic_job.stages import DATA_PIN_ENV
from eks_ddp_runtime.contract import RESULTS_KMS_KEY_ENV, RESULTS_URL_ENV


def validate(name: str, a: ElasticJobArgs) -> catalog.InstanceType:
    """The checks that need more than one field or the catalog (each field's own rules ran when the Args were
    built: :func:`~eks_ddp.workloads.elastic_job.args.check_rules`)."""
    try:
        it = catalog.lookup(a.instance_type)
    except KeyError as err:
        raise ValueError(f"instance_type: {err.args[0]}") from None
    if it.gpus < 1:
        raise ValueError(f"instance_type: got {a.instance_type!r}, which has no GPU; expected a GPU type")
    whole, per_workload = a.pvc_name is not None, (a.data_claim is not None, a.run_claim is not None)
    if not ((whole and per_workload == (False, False)) or (not whole and per_workload == (True, True))):
        raise ValueError(f"pvc_name/data_claim/run_claim: got pvc_name={a.pvc_name!r}, data_claim={a.data_claim!r}, "
                         f"run_claim={a.run_claim!r}; expected data_claim and run_claim (per workload), or pvc_name "
                         "(the whole volume) alone")
    if a.data_read_only_claim is not None and a.data_claim is None:
        raise ValueError(f"data_read_only_claim: got {a.data_read_only_claim!r} without data_claim; expected it with "
                         "data_claim (the data stage writes through data_claim)")
    owned = {*CACHE_ENV, *AGENT_ENV, *nccl_env(it, True), "POD_IP", "JOB_UID", RESULTS_URL_ENV,
             RESULTS_KMS_KEY_ENV, DATA_PIN_ENV, DATA_VERIFY_ENV}
    if clash := sorted(owned & set(a.workload.env)):
        raise ValueError(f"workload.env: got {', '.join(clash)}; expected names the job does not set itself "
                         f"(it sets {', '.join(sorted(owned))})")
    if isinstance(a.workload.data, S3Data) and a.data_role_arn is None:
        raise ValueError(f"data_role_arn: got None with workload.data {a.workload.data.uri!r}; expected the S3 data "
                         "stage's IAM role (eks_ddp.infra.iam.data_stage_role(...)); its pods get no other AWS credentials")
    if isinstance(a.workload.data, S3Data) and (bad := trust_problem(name, a.namespace, a.data_role_arn)):
        raise ValueError(bad)
    if a.workload.iam_statements and a.results_role_arn is None:
        raise ValueError("workload.iam_statements: given, but results_role_arn is None; expected the training pods' "
                         "IRSA role to attach them to (ResultsBucket.uploader_role(...), or a role of yours trusting "
                         "the ServiceAccount <name>-trainer)")
    if a.efa and not it.has_efa:
        raise ValueError(f"efa: got True for {a.instance_type!r}, which has no EFA interfaces")
    group = a.node_group if a.node_group is not None else group_for(a.node_selector)
    if group is not None and a.nodes > group.max_size:
        raise ValueError(f"nodes: got {a.nodes}; expected at most {group.max_size}, the max_size of node group "
                         f"{group.group_name!r} the job runs on (one agent per node: the autoscaler never grows the "
                         "group past max_size, and the extra pods would stay Pending)")
    if not 1 <= a.min_nodes <= a.nodes:
        raise ValueError(f"min_nodes: got {a.min_nodes}; expected 1 <= min_nodes <= nodes ({a.nodes})")
    for key in ("max_restarts", "fault_budget"):
        if getattr(a, key) < 0:
            raise ValueError(f"{key}: got {getattr(a, key)}; expected a whole number >= 0")
    if a.state not in ("run", "cancelled"):
        raise ValueError(f"state: got {a.state!r}; expected 'run' or 'cancelled'")
    if a.active_deadline_hours is not None and not a.active_deadline_hours * 3600 >= 1:
        raise ValueError(f"active_deadline_hours: got {a.active_deadline_hours}; expected None or at least 1 second")
    if a.rdzv_backend not in ("etcd-v2", "c10d"):
        raise ValueError(f"rdzv_backend: got {a.rdzv_backend!r}; expected 'etcd-v2' or 'c10d'")
    if a.rdzv_backend == "etcd-v2" and a.rdzv_endpoint is None:
        raise ValueError("rdzv_endpoint: required with rdzv_backend 'etcd-v2' (EtcdRendezvous.endpoint)")
    if a.rdzv_backend == "etcd-v2" and a.rdzv_tls_secret is None:
        raise ValueError("rdzv_tls_secret: required with rdzv_backend 'etcd-v2' (EtcdRendezvous.client_tls_secret: "
                         "the store accepts only clients with its certificate)")
    if a.rdzv_server_labels is not None and not (
            isinstance(a.rdzv_server_labels, Mapping) and a.rdzv_server_labels
            and all(isinstance(k, str) and isinstance(v, str) for k, v in a.rdzv_server_labels.items())):
        raise ValueError(f"rdzv_server_labels: got {a.rdzv_server_labels!r}; expected None (the EtcdRendezvous "
                         "of rdzv_endpoint) or the store Service's selector, a non-empty mapping of strings")
    if a.rdzv_backend == "c10d" and a.rdzv_endpoint is not None:
        raise ValueError(f"rdzv_endpoint: got {a.rdzv_endpoint!r}; expected None with 'c10d' "
                         "(the agent of index 0 hosts the store)")
    # Pod hostnames are <job>-<index>; both must stay DNS labels.
    rules.require(rules.run_id("run_id", a.run_id))
    if len(f"{name}-{a.run_id}-{a.nodes}") > 63:
        raise ValueError(f"run_id: got {a.run_id!r}; expected lowercase letters, digits and '-' making "
                         f"'{name}-<run_id>-<index>' at most 63 characters (pod host names)")
    return it


_RUN_DIRS: weakref.WeakKeyDictionary[Any, list[tuple[str, Any, Any, str | None]]] = weakref.WeakKeyDictionary()
"""Per program run (its root stack): (job name, namespace, claim, run id) of every ElasticJob made so far."""


def _same(x: Any, y: Any) -> bool:
    """The same claim or namespace: equal plain values, or the very same Output (an Output's value is unknown)."""
    return x is y or (isinstance(x, str) and isinstance(y, str) and x == y)


def claim_run_dir(name: str, a: ElasticJobArgs) -> None:
    """Refuse a second ElasticJob of this program writing the same run directory: the same ``run_id`` on the same
    whole-volume claim (``pvc_name``: ``/shared/runs/<run_id>``), or the same ``run_claim`` (the run directory
    itself); then register this one."""
    root = pulumi.runtime.get_root_resource()
    if root is None:
        return
    seen = _RUN_DIRS.setdefault(root, [])
    whole = a.pvc_name is not None
    claim, run_id = (a.pvc_name, a.run_id) if whole else (a.run_claim, None)
    for other, namespace, other_claim, other_run in seen:
        if _same(namespace, a.namespace) and _same(other_claim, claim) and other_run == run_id:
            shown = claim if isinstance(claim, str) else "(the same Output)"
            key = "run_id" if whole else "run_claim"
            value = a.run_id if whole else shown
            raise ValueError(f"{key}: got {value!r} for ElasticJob {name!r}, but ElasticJob {other!r} already writes "
                             f"/shared/runs/{a.run_id} on claim {shown!r}: the second would resume from the "
                             f"first's checkpoints and overwrite its results; expected a {key} no other job of the "
                             "program uses on that claim")
    seen.append((name, a.namespace, claim, run_id))
