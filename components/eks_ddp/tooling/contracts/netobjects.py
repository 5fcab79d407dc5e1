"""Kubernetes objects and addresses as the network contract reads them: pods (one per workload template), Services,
label selectors, port sets and CIDR arithmetic; the platform objects every EKS cluster has.

Used by :mod:`.vpc_cni` (the EKS policy controller and agent) and :mod:`.network` (the contract); registers no
contract itself.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Net = ipaddress.IPv4Network
PROTOCOLS = ("TCP", "UDP", "SCTP")
MAX_PORT = 65535
EKS_SERVICE_CIDRS = (Net("10.100.0.0/16"), Net("172.20.0.0/16"))
"""EKS picks one of these for ClusterIPs when the cluster names none (EKS API ``KubernetesNetworkConfigRequest``
``serviceIpv4Cidr``)."""
PRIVATE_RANGES = (Net("10.0.0.0/8"), Net("172.16.0.0/12"), Net("192.168.0.0/16"), Net("100.64.0.0/10"))
"""Where a VPC (and so its pods) can live when the plan does not say (RFC 1918 and the shared space EKS custom
networking uses)."""


# --- ports ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ports:
    """A set of (protocol, port) pairs as closed intervals per protocol."""

    spans: tuple[tuple[str, int, int], ...] = ()

    @staticmethod
    def of(*items: tuple[str, int, int]) -> Ports:
        return Ports(()).union(Ports(tuple(items)))

    @staticmethod
    def all(*protocols: str) -> Ports:
        return Ports.of(*((p, 1, MAX_PORT) for p in (protocols or PROTOCOLS)))

    def _by(self) -> dict[str, list[tuple[int, int]]]:
        out: dict[str, list[tuple[int, int]]] = {}
        for proto, lo, hi in self.spans:
            out.setdefault(proto, []).append((lo, hi))
        return out

    def union(self, other: Ports) -> Ports:
        merged: list[tuple[str, int, int]] = []
        by = Ports(self.spans + other.spans)._by()
        for proto in sorted(by):
            for lo, hi in sorted(by[proto]):
                if merged and merged[-1][0] == proto and lo <= merged[-1][2] + 1:
                    merged[-1] = (proto, merged[-1][1], max(hi, merged[-1][2]))
                else:
                    merged.append((proto, lo, hi))
        return Ports(tuple(merged))

    def intersect(self, other: Ports) -> Ports:
        b = other._by()
        return Ports.of(*((p, max(lo, lo2), min(hi, hi2)) for p, lo, hi in self.spans for lo2, hi2 in b.get(p, ())
                          if max(lo, lo2) <= min(hi, hi2)))

    def minus(self, other: Ports) -> Ports:
        out = []
        b = other._by()
        for p, lo, hi in self.spans:
            pieces = [(lo, hi)]
            for lo2, hi2 in b.get(p, ()):
                pieces = [q for a, z in pieces for q in ((a, min(z, lo2 - 1)), (max(a, hi2 + 1), z)) if q[0] <= q[1]]
            out += [(p, a, z) for a, z in pieces]
        return Ports.of(*out)

    def has(self, protocol: str, port: int) -> bool:
        return any(p == protocol and lo <= port <= hi for p, lo, hi in self.spans)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __str__(self) -> str:
        if not self.spans:
            return "nothing"
        return ", ".join(f"{p} {lo}" if lo == hi else f"{p} {lo}-{hi}" for p, lo, hi in self.spans)


def ports_of(resolved: list[dict[str, Any]] | None) -> Ports:
    """An endpoint's port list as the agent reads it: empty means every port of every protocol."""
    if not resolved:
        return Ports.all()
    out = Ports()
    for q in resolved:
        if q.get("port") is None:
            out = out.union(Ports.all(q["protocol"]))
        else:
            out = out.union(Ports.of((q["protocol"], int(q["port"]), int(q.get("endPort") or q["port"]))))
    return out


# --- objects ----------------------------------------------------------------------------------------------
def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """``metav1.LabelSelectorAsSelector(sel).Matches(labels)``: matchLabels and matchExpressions; an empty (or
    absent) selector matches everything."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or ():
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


@dataclass(eq=False)
class Pod:
    """The pods of one workload (a Job, CronJob, Deployment ... template): every replica alike."""

    name: str
    namespace: str
    labels: dict[str, str]
    spec: dict[str, Any]
    owner: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    """How many of these pods run at once (a Job's parallelism, a Deployment's replicas)."""

    @property
    def container_ports(self) -> list[dict[str, Any]]:
        return [{"name": p.get("name", ""), "containerPort": int(p["containerPort"]),
                 "protocol": p.get("protocol", "TCP")}
                for c in self.spec.get("containers") or () for p in c.get("ports") or ()]

    def lookup_port(self, port: int | str, protocol: str) -> tuple[int, str] | None:
        """``LookupContainerPortAndName``: a named port needs a container port of that name and protocol; a
        number matches a declared port or, undeclared, stands for itself."""
        for p in self.container_ports:
            if p["protocol"] != protocol:
                continue
            if (isinstance(port, str) and p["name"] == port) or (isinstance(port, int) and p["containerPort"] == port):
                return p["containerPort"], p["name"]
        return (port, "") if isinstance(port, int) else None

    def __repr__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(eq=False)
class Service:
    name: str
    namespace: str
    selector: dict[str, str] | None
    headless: bool
    ports: list[dict[str, Any]]

    def __repr__(self) -> str:
        return f"Service {self.namespace}/{self.name}"


def port_value(v: Any) -> int | str:
    return int(v) if isinstance(v, (int, float)) or (isinstance(v, str) and v.isdigit()) else v


def exclude(a: Net, x: Net) -> list[Net]:
    if x.supernet_of(a):
        return []
    return list(a.address_exclude(x)) if x.subnet_of(a) else [a]


def subtract(nets: Iterable[Net], minus: Iterable[Net]) -> list[Net]:
    """``nets`` without ``minus`` (CIDR arithmetic)."""
    out = list(nets)
    for x in minus:
        out = [r for a in out for r in (exclude(a, x) if a.overlaps(x) else [a])]
    return out


# --- from manifests ---------------------------------------------------------------------------------------
TEMPLATE_PATHS = {"Deployment": ("spec", "template"), "StatefulSet": ("spec", "template"),
                  "DaemonSet": ("spec", "template"), "ReplicaSet": ("spec", "template"), "Job": ("spec", "template"),
                  "CronJob": ("spec", "jobTemplate", "spec", "template")}


def pods_of(manifests: Iterable[dict[str, Any]]) -> list[Pod]:
    """One :class:`Pod` per workload template (and per bare Pod), with the labels the controllers add (a Job's
    pods carry ``job-name`` and ``batch.kubernetes.io/job-name``)."""
    out = []
    for m in manifests:
        kind, meta = m.get("kind"), m.get("metadata") or {}
        if kind == "Pod":
            tmpl = m
        elif kind in TEMPLATE_PATHS:
            tmpl = m
            for k in TEMPLATE_PATHS[kind]:
                tmpl = (tmpl or {}).get(k) or {}
        else:
            continue
        labels = dict((tmpl.get("metadata") or {}).get("labels") or {})
        if kind == "Job":
            labels.update({"job-name": meta["name"], "batch.kubernetes.io/job-name": meta["name"]})
        spec = m.get("spec") or {}
        if kind == "CronJob":
            spec = (spec.get("jobTemplate") or {}).get("spec") or {}
        at_once = spec.get("parallelism", 1) if kind in ("Job", "CronJob") else spec.get("replicas", 1)
        out.append(Pod(name=f"{kind}/{meta['name']}", namespace=meta.get("namespace", "default"), labels=labels,
                       spec=tmpl.get("spec") or {}, owner=m, replicas=2 if kind == "DaemonSet" else int(at_once)))
    return out


def services_of(manifests: Iterable[dict[str, Any]]) -> list[Service]:
    out = []
    for m in manifests:
        if m.get("kind") != "Service" or (m.get("spec") or {}).get("type") == "ExternalName":
            continue
        spec = m.get("spec") or {}
        # At plan time an absent clusterIP is one the API server allocates: headless only when it says "None".
        ports = [{"name": p.get("name", ""), "port": int(p["port"]), "protocol": p.get("protocol", "TCP"),
                  "targetPort": port_value(p.get("targetPort", p["port"]))} for p in spec.get("ports") or ()]
        out.append(Service(name=m["metadata"]["name"], namespace=m["metadata"].get("namespace", "default"),
                           selector=spec.get("selector"), headless=spec.get("clusterIP") == "None", ports=ports))
    return out


COREDNS = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", "namespace": "kube-system"},
           "spec": {"template": {"metadata": {"labels": {"k8s-app": "kube-dns", "eks.amazonaws.com/component": "coredns"}},
                                 "spec": {"containers": [{"name": "coredns", "ports": [
                                     {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                     {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                     {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}]}]}}}}
KUBE_DNS = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", "namespace": "kube-system"},
            "spec": {"selector": {"k8s-app": "kube-dns"}, "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}}
API_SERVER = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kubernetes", "namespace": "default"},
              "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 443}]}}
PLATFORM = (COREDNS, KUBE_DNS, API_SERVER)
"""What every EKS cluster has that the plan does not create: the CoreDNS add-on's Deployment and its ``kube-dns``
Service in kube-system (selector ``k8s-app: kube-dns``, UDP and TCP 53; the add-on's manifests), and the API
server's ``kubernetes`` Service in default (no selector: its endpoints are the control plane's ENIs)."""
