"""ElasticJobArgs from the flat keywords tests have always spelled (instance_type, nodes, rdzv_endpoint, ...): each
goes into its typed part, so a test names only what it varies."""

from __future__ import annotations

from typing import Any

from eks_ddp.infra.iam import workload_policy
from eks_ddp.workloads.elastic_job import (
    C10d,
    ElasticJobArgs,
    EtcdStore,
    PerRunClaims,
    Placement,
    Results,
    Size,
    WholeVolume,
)

PLACEMENT = ("instance_type", "efa", "node_selector", "system_node_selector", "max_nodes", "group")
SIZE = ("nodes", "min_nodes", "max_restarts", "fault_budget", "active_deadline_hours", "ttl_seconds_after_finished")


def job_args(**flat: Any) -> ElasticJobArgs:
    """The Args of ``flat``: placement and size fields, ``pvc_name`` or ``data_claim``/``run_claim``/
    ``data_read_only_claim``, ``rdzv_backend``/``rdzv_endpoint``/``rdzv_tls_secret``/``rdzv_server_labels``,
    ``results_url``/``results_role_arn``/``results_kms_key_arn``; the rest as they are."""
    placement = {k: flat.pop(k) for k in PLACEMENT if k in flat}
    size = {k: flat.pop(k) for k in SIZE if k in flat}
    pvc = flat.pop("pvc_name", None)
    claims = {k: flat.pop(f"{k}_claim") for k in ("data", "run", "data_read_only") if f"{k}_claim" in flat}
    storage = WholeVolume(claim=pvc) if pvc is not None else PerRunClaims(**claims)
    backend = flat.pop("rdzv_backend", "etcd-v2")
    endpoint, secret = flat.pop("rdzv_endpoint", None), flat.pop("rdzv_tls_secret", None)
    labels = flat.pop("rdzv_server_labels", None)
    rendezvous = C10d() if backend == "c10d" else EtcdStore(endpoint=endpoint, tls_secret=secret, server_labels=labels)
    url, role, kms = (flat.pop(k, None) for k in ("results_url", "results_role_arn", "results_kms_key_arn"))
    statements = getattr(flat.get("workload"), "iam_statements", ())
    if role and statements:  # as a program grants them: a policy on the uploader role (infra's)
        role = workload_policy("training-workload", role, statements)
    results = Results(url=url or "s3://b/runs/r/", role_arn=role, kms_key_arn=kms) if url or role else None
    return ElasticJobArgs(placement=Placement(**placement), size=Size(**size), storage=storage,
                          rendezvous=rendezvous, results=results, **flat)
