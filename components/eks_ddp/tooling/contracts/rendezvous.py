"""The rendezvous contract: a rendezvous store accepts the client certificates of one run's pods only, and its
NetworkPolicy admits no pod outside them.

Why it matters: torch's agents unpickle the rendezvous state they read from the store (torch
``distributed/elastic/rendezvous/dynamic_rendezvous.py``, ``_RendezvousStateHolder`` / ``_BackendRendezvousStateHolder.sync``:
``pickle.loads(state_bits)``), so whoever may write a run's state runs code in that run's agents, with that run's
uploader role and run directory. Which pods may write is decided by two rules that are not ours:

* **etcd's client-certificate authentication** (etcd ``Documentation/op-guide/security.md``, "Basic setup" and
  ``--client-cert-auth``: "When this is set etcd will check all incoming HTTPS requests for a client certificate
  signed by the trusted CA"; ``--trusted-ca-file``): a store accepts every client certificate signed by the CA in
  its ``--trusted-ca-file``. So a store's clients are the pods that mount a TLS Secret whose ``ca.crt`` is the CA its
  own server Secret carries (components/eks_ddp/workloads/etcd_tls.py puts the CA into both);
* **NetworkPolicy ingress** (Kubernetes API ``networking.k8s.io/v1`` NetworkPolicySpec: a pod selected by a policy
  admits only what some ingress rule's ``from`` peers select; a ``podSelector`` peer selects pods of the policy's
  namespace by label, ``matchLabels`` and ``matchExpressions`` ANDed; a rule without ``from`` admits every source).

A pod's run is the run directory it mounts (``/shared/runs/<runId>``), else its ``app.kubernetes.io/instance``.

A store must also **never exist twice**: two live members of one store behind one Service let two groups of agents
form two worlds of one job. Which controllers can run two pods of one store
at once is Kubernetes' rule, not ours:

* a **StatefulSet** creates the pod of an ordinal only after the previous pod of that ordinal is gone from the API
  (Kubernetes docs, "Force Delete StatefulSet Pods": "StatefulSet ensures that, at any time, there is at most one
  Pod with a given identity running in a cluster"; a pod on an unreachable node stays until the Node is deleted or
  the pod is force-deleted), so one replica is at most one member;
* a **Deployment/ReplicaSet** counts a terminating pod as gone and creates its replacement at once (kube-controller-
  manager ``replica_set.go`` ``FilterActivePods`` leaves out pods with a deletionTimestamp; ``Recreate`` orders
  rollouts only), so an evicted member on a node the control plane lost keeps serving beside its replacement;
* more than one replica of a single-member etcd is more than one store (each bootstraps its own cluster).
"""

from __future__ import annotations

from typing import Any

from . import PlanView, Violation, contract

RUNS_PREFIX = "/shared/runs/"
WORKLOAD_KINDS = ("Job", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet")
AT_MOST_ONE = "StatefulSet"
"""The one controller that never runs two pods of one identity (see the module docstring)."""
CLIENT_PORT = 2379


def pod_templates(view: PlanView) -> list[tuple[str, str, dict[str, Any]]]:
    """(subject, namespace, pod template) of every Job, CronJob, Deployment, ReplicaSet, StatefulSet and DaemonSet."""
    out = []
    for m in view.manifests:
        spec = m.get("spec") or {}
        template = (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") if m.get("kind") == "CronJob"
                    else spec.get("template") if m.get("kind") in WORKLOAD_KINDS else None)
        if template:
            meta = m.get("metadata") or {}
            out.append((f"{m['kind']}/{meta.get('name')}", meta.get("namespace", "default"), template))
    return out


def _secrets(view: PlanView) -> dict[tuple[str, str], dict[str, Any]]:
    return {((m.get("metadata") or {}).get("namespace", "default"), m["metadata"]["name"]):
            {**(m.get("stringData") or {}), **(m.get("data") or {})} for m in view.kind("Secret")}


def _mounted_secrets(template: dict[str, Any]) -> list[str]:
    return [v["secret"]["secretName"] for v in (template.get("spec") or {}).get("volumes") or [] if v.get("secret")]


def _is_store(template: dict[str, Any]) -> bool:
    return any("--client-cert-auth=true" in (c.get("args") or []) or "--client-cert-auth=true" in (c.get("command") or [])
               for c in (template.get("spec") or {}).get("containers") or [])


def run_of(template: dict[str, Any]) -> str:
    for c in (template.get("spec") or {}).get("containers") or []:
        for mount in c.get("volumeMounts") or []:
            path = mount.get("mountPath", "")
            if path.startswith(RUNS_PREFIX) and path[len(RUNS_PREFIX):].strip("/"):
                return path[len(RUNS_PREFIX):].strip("/").split("/")[0]
    return ((template.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/instance", "?")


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions, ANDed; empty selects everything)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) or \
                (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def _admits(rule: dict[str, Any], labels: dict[str, str]) -> bool:
    ports = rule.get("ports") or []
    if ports and not any(p.get("port") in (CLIENT_PORT, "client") for p in ports):
        return False
    peers = rule.get("from")
    if not peers:
        return True
    return any("podSelector" in p and "namespaceSelector" not in p and "ipBlock" not in p
               and selects(p["podSelector"], labels) for p in peers)


@contract("rendezvous")
def one_run_per_store(view: PlanView) -> list[Violation]:
    """Every rendezvous store accepts the client certificates of one run's pods, and admits no other pod."""
    secrets = _secrets(view)
    templates = pod_templates(view)
    out: list[Violation] = []
    by_subject = {f"{m['kind']}/{(m.get('metadata') or {}).get('name')}": m for m in view.manifests
                  if m.get("kind") in WORKLOAD_KINDS}
    for subject, ns, store in templates:
        if not _is_store(store):
            continue
        owner = by_subject.get(subject) or {}
        replicas = int((owner.get("spec") or {}).get("replicas", 1))
        if owner.get("kind") != AT_MOST_ONE or replicas != 1:
            out.append(Violation("rendezvous", subject, f"can run two members at once ({owner.get('kind')}, "
                                 f"{replicas} replica(s)): a replacement starts while an evicted member may still "
                                 "serve, and two stores mean two worlds; expected a StatefulSet of one replica"))
        cas = {secrets.get((ns, s), {}).get("ca.crt") for s in _mounted_secrets(store)} - {None}
        clients = [(sub, t) for sub, n, t in templates if n == ns and sub != subject and not _is_store(t)
                   and any(secrets.get((ns, s), {}).get("ca.crt") in cas and "tls.crt" in secrets.get((ns, s), {})
                           for s in _mounted_secrets(t))]
        runs = sorted({run_of(t) for _, t in clients})
        if len(runs) > 1:
            out.append(Violation("rendezvous", subject, f"accepts the client certificates of runs {', '.join(runs)} "
                                 f"({', '.join(sorted(s for s, _ in clients))}): code in one run can write another's "
                                 "rendezvous state, which its agents unpickle; expected a store (and CA) per run"))
        labels = (store.get("metadata") or {}).get("labels") or {}
        rules = [r for m in view.kind("NetworkPolicy") if (m.get("metadata") or {}).get("namespace", "default") == ns
                 and "Ingress" in ((m.get("spec") or {}).get("policyTypes") or ["Ingress"])
                 and selects((m.get("spec") or {}).get("podSelector"), labels)
                 for r in (m.get("spec") or {}).get("ingress") or []]
        client_subjects = {s for s, _ in clients}
        strangers = sorted(sub for sub, n, t in templates if n == ns and sub != subject and sub not in client_subjects
                           and any(_admits(r, (t.get("metadata") or {}).get("labels") or {}) for r in rules))
        if strangers:
            out.append(Violation("rendezvous", subject, f"its NetworkPolicy admits {', '.join(strangers)} on the "
                                 "client port, which hold none of its client certificates; expected only its run's "
                                 "pods"))
    return out
