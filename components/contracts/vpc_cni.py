"""NetworkPolicies as the EKS VPC CNI evaluates them: the policy controller's resolution, the node agent's verdict.

A model of two upstream programs, for the network contract (network.py); it registers no contract itself.

* **aws/amazon-network-policy-controller-k8s** turns each NetworkPolicy into PolicyEndpoints (addresses and
  ports) in ``pkg/resolvers/endpoints.go``: ``computeIngressEndpoints``/``computeEgressEndpoints`` (a rule with
  no peers allows ``0.0.0.0/0`` through ``getAllowAllNetworkPeers``), ``resolveNetworkPeers`` (an ipBlock keeps
  only numeric ports, ``convertToPolicyInfoPortForCIDRs``; a pod peer's named ports are looked up in the
  *target* pod's containers, ``getPortList`` with ``pkg/k8s/pod_utils.go`` ``LookupContainerPortAndName``, and
  a pod whose ports all fail to resolve is left out; an ingress rule's ports are resolved against the pods the
  policy selects, ``getIngressRulesPorts``), and, for egress only, ``resolveServiceClusterIPs`` →
  ``getMatchingServiceClusterIPs``: a Service's ClusterIP is added only if the Service is not headless and
  **the rule's podSelector matches the Service's spec.selector as a label set**
  (``svcSelector.Matches(labels.Set(svc.Spec.Selector))``), its ports mapped to the Service's listen ports by
  ``getMatchingServicePort`` (``pkg/k8s/service_utils.go`` ``LookupServiceListenPort``, else the first backing
  pod's ``LookupListenPortFromPodSpec``).
* **The VPC CNI node agent** (aws/aws-network-policy-agent) enforces egress with eBPF on the pod's veth before
  kube-proxy's DNAT (the comment on ``getMatchingServiceClusterIPs``), so a connection to a ClusterIP is judged
  by the ClusterIP, and ingress at the destination pod after it. A pod selected by no policy of a direction
  is not isolated in that direction in the default ``standard`` mode; in ``strict`` mode
  (``NETWORK_POLICY_ENFORCING_MODE``, EKS user guide "Restrict Pod network traffic with Kubernetes network
  policies"; aws-network-policy-agent #209) every pod starts default-deny and stays so without a policy.
  Policies add up: a flow passes a direction if any policy selecting the pod for it allows it.

Addresses are abstract: a pod's IP lies somewhere in the VPC's CIDRs (the VPC CNI gives pods VPC addresses), a
ClusterIP somewhere in the service CIDR. An ipBlock admits such an address *for sure* only if it covers the
whole range, and *possibly* if it overlaps it; ``definite`` picks the reading.
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


def _port_value(v: Any) -> int | str:
    return int(v) if isinstance(v, (int, float)) or (isinstance(v, str) and v.isdigit()) else v


@dataclass
class Cluster:
    """What the controller and the agent see: namespaces, pods, Services and NetworkPolicies."""

    namespaces: dict[str, dict[str, str]]
    pods: list[Pod]
    services: list[Service]
    policies: list[dict[str, Any]]
    vpc_cidrs: tuple[Net, ...] = PRIVATE_RANGES
    service_cidrs: tuple[Net, ...] = EKS_SERVICE_CIDRS
    mode: str = "standard"
    service_accounts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """ServiceAccount manifests by (namespace, name)."""

    def __post_init__(self) -> None:
        for name, labels in self.namespaces.items():  # the API server sets it on every namespace (1.22+)
            labels.setdefault("kubernetes.io/metadata.name", name)
        self._cache: dict[tuple[int, str], list[dict[str, Any]]] = {}

    # --- the controller: NetworkPolicy -> endpoints -------------------------------------------------------
    def _namespaces(self, peer: Mapping[str, Any], policy_ns: str) -> list[str]:
        if peer.get("namespaceSelector") is None:
            return [policy_ns]
        return [n for n, labels in self.namespaces.items() if selector_matches(peer["namespaceSelector"], labels)]

    def _pods(self, selector: Mapping[str, Any] | None, namespace: str) -> list[Pod]:
        return [p for p in self.pods if p.namespace == namespace and selector_matches(selector, p.labels)]

    @staticmethod
    def _rule_ports(ports: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        return [{"protocol": q.get("protocol", "TCP"), "port": _port_value(q["port"]) if q.get("port") is not None
                 else None, "endPort": q.get("endPort")} for q in ports or ()]

    @staticmethod
    def _cidr_ports(ports: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """``convertToPolicyInfoPortForCIDRs``: named ports cannot be resolved without a pod and are dropped;
        None when the rule named ports and none is left (the peer is skipped rather than opened to all)."""
        kept = [q for q in ports if not isinstance(q["port"], str)]
        return None if ports and not kept else kept

    @staticmethod
    def _port_list(pod: Pod, ports: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``getPortList``: the rule's ports resolved against ``pod``'s containers; unresolved ones dropped."""
        out = []
        for q in ports:
            if q["port"] is None:
                out.append(q)
            elif (found := pod.lookup_port(q["port"], q["protocol"])) is not None:
                out.append({**q, "port": found[0]})
        return out

    def _service_port(self, svc: Service, port: int | str, protocol: str) -> int | None:
        """``getMatchingServicePort``: a Service port whose targetPort is the rule's port, else through the
        first backing pod's container port (``LookupListenPortFromPodSpec``)."""
        for sp in svc.ports:
            if sp["protocol"] == protocol and type(sp["targetPort"]) is type(port) and sp["targetPort"] == port:
                return sp["port"]
        backing = self._pods({"matchLabels": svc.selector or {}}, svc.namespace)
        if backing:
            found = backing[0].lookup_port(port, protocol)
            if found is not None:
                for sp in svc.ports:
                    if sp["protocol"] == protocol and (sp["targetPort"] == found[1] if isinstance(sp["targetPort"], str)
                                                       else sp["targetPort"] == found[0]):
                        return sp["port"]
        return None

    def _cluster_ips(self, peer: Mapping[str, Any], policy_ns: str, ports: list[dict[str, Any]]) -> list[dict]:
        """``resolveServiceClusterIPs`` → ``getMatchingServiceClusterIPs`` (egress only)."""
        out = []
        for ns in self._namespaces(peer, policy_ns):
            for svc in self.services:
                # The rule's podSelector must match the Service's selector as a label set.
                if svc.namespace != ns or svc.headless or not selector_matches(peer.get("podSelector"),
                                                                               svc.selector or {}):
                    continue
                resolved = []
                for q in ports:
                    if q["port"] is None:
                        resolved.append(q)
                    elif (listen := self._service_port(svc, q["port"], q["protocol"])) is not None:
                        resolved.append({**q, "port": listen})
                if ports and not resolved:
                    continue
                out.append({"svc": svc, "ports": resolved})
        return out

    def endpoints(self, policy: dict[str, Any], direction: str) -> list[dict[str, Any]]:
        """A policy's resolved endpoints for ``direction`` ('ingress' or 'egress'): dicts with one of ``cidr``
        (with ``except``), ``pod``, ``svc``, and ``ports`` (empty: all)."""
        key = (id(policy), direction)
        if key in self._cache:
            return self._cache[key]
        spec, ns = policy.get("spec") or {}, policy["metadata"].get("namespace", "default")
        out: list[dict[str, Any]] = []
        for rule in spec.get(direction) or ():
            ports = self._rule_ports(rule.get("ports"))
            peers = rule.get("to" if direction == "egress" else "from") or []
            if not peers:  # getAllowAllNetworkPeers
                cidr_ports = self._cidr_ports(ports)
                if cidr_ports is not None:
                    out.append({"cidr": Net("0.0.0.0/0"), "except": (), "ports": cidr_ports})
                continue
            for peer in peers:
                if peer.get("ipBlock"):
                    cidr_ports = self._cidr_ports(ports)
                    if cidr_ports is not None and ":" not in peer["ipBlock"]["cidr"]:  # an IPv4 cluster
                        out.append({"cidr": Net(peer["ipBlock"]["cidr"], strict=False), "ports": cidr_ports,
                                    "except": tuple(Net(e, strict=False) for e in peer["ipBlock"].get("except") or ())})
                    continue
                applied = None
                if direction == "ingress":  # getIngressRulesPorts: resolved against the policy's own pods
                    applied = [q for p in self._pods(spec.get("podSelector"), ns) for q in self._port_list(p, ports)]
                for pns in self._namespaces(peer, ns):
                    for pod in self._pods(peer.get("podSelector"), pns):
                        listed = self._port_list(pod, ports)
                        if ports and not listed:
                            continue
                        out.append({"pod": pod, "ports": applied if direction == "ingress" else listed})
                if direction == "egress":
                    out += self._cluster_ips(peer, ns, ports)
        self._cache[key] = out
        return out

    # --- the agent: a verdict per direction -----------------------------------------------------------------
    def _selecting(self, pod: Pod, direction: str) -> list[dict[str, Any]]:
        found = []
        for policy in self.policies:
            spec = policy.get("spec") or {}
            types = spec.get("policyTypes") or ["Ingress", *(["Egress"] if spec.get("egress") else [])]
            if (policy["metadata"].get("namespace", "default") == pod.namespace and direction.capitalize() in types
                    and selector_matches(spec.get("podSelector"), pod.labels)):
                found.append(policy)
        return found

    def isolated(self, pod: Pod, direction: str) -> bool:
        return self.mode == "strict" or bool(self._selecting(pod, direction))

    def _in_range(self, e: dict[str, Any], ranges: Iterable[Net], definite: bool) -> bool:
        allowed = [e["cidr"]]
        for x in e.get("except", ()):
            allowed = [r for a in allowed for r in (_exclude(a, x) if a.overlaps(x) else [a])]
        ranges = list(ranges)
        if definite:
            return all(any(r.subnet_of(a) for a in allowed) for r in ranges)
        return any(r.overlaps(a) for r in ranges for a in allowed)

    def egress(self, src: Pod, dst: Pod | Service | Net, *, definite: bool = True, cidrs: bool = True) -> Ports:
        """Ports on which ``src`` may send to ``dst`` (a pod's IP, a Service's ClusterIP, or a network)."""
        if not self.isolated(src, "egress"):
            return Ports.all()
        out = Ports()
        for policy in self._selecting(src, "egress"):
            for e in self.endpoints(policy, "egress"):
                if "cidr" in e:
                    if not cidrs:
                        continue
                    ranges = (self.vpc_cidrs if isinstance(dst, Pod) else self.service_cidrs
                              if isinstance(dst, Service) else (dst,))
                    hit = self._in_range(e, ranges, definite)
                else:
                    hit = e.get("pod") is dst or e.get("svc") is dst
                if hit:
                    out = out.union(ports_of(e["ports"]))
        return out

    def ingress(self, dst: Pod, src: Pod, *, definite: bool = True, cidrs: bool = True) -> Ports:
        """Ports (the destination pod's) on which ``dst`` accepts from ``src``."""
        if not self.isolated(dst, "ingress"):
            return Ports.all()
        out = Ports()
        for policy in self._selecting(dst, "ingress"):
            for e in self.endpoints(policy, "ingress"):
                hit = (cidrs and self._in_range(e, self.vpc_cidrs, definite)) if "cidr" in e else e.get("pod") is src
                if hit:
                    out = out.union(ports_of(e["ports"]))
        return out

    def backing(self, svc: Service) -> list[Pod]:
        return self._pods({"matchLabels": svc.selector}, svc.namespace) if svc.selector else []

    @staticmethod
    def target_port(pod: Pod, listen: dict[str, Any]) -> int | None:
        """The pod port a Service port forwards to (a named targetPort looked up in the pod's containers)."""
        found = pod.lookup_port(listen["targetPort"], listen["protocol"])
        return found[0] if found else None

    def via_service(self, src: Pod, svc: Service, *, definite: bool = True, cidrs: bool = True
                    ) -> dict[Pod | None, Ports]:
        """What ``src`` reaches through ``svc``: per backing pod (None for a Service without pods, the API
        server's) the Service ports whose ClusterIP egress and the pod's ingress on the target port both allow.
        A headless Service's name resolves to the pods themselves, so egress is judged on their IPs."""
        out: dict[Pod | None, Ports] = {}
        pods = self.backing(svc)
        if not pods:
            return {None: self.egress(src, svc, definite=definite, cidrs=cidrs)} if not svc.headless else {}
        for pod in pods:
            sent = None if svc.headless else self.egress(src, svc, definite=definite, cidrs=cidrs)
            got = Ports()
            for sp in svc.ports:
                tp = self.target_port(pod, sp)
                if tp is None:
                    continue
                first = sent.has(sp["protocol"], sp["port"]) if sent is not None else \
                    self.egress(src, pod, definite=definite, cidrs=cidrs).has(sp["protocol"], tp)
                if first and self.ingress(pod, src, definite=definite, cidrs=cidrs).has(sp["protocol"], tp):
                    got = got.union(Ports.of((sp["protocol"], sp["port"], sp["port"])))
            out[pod] = got
        return out


def _exclude(a: Net, x: Net) -> list[Net]:
    if x.supernet_of(a):
        return []
    return list(a.address_exclude(x)) if x.subnet_of(a) else [a]


def subtract(nets: Iterable[Net], minus: Iterable[Net]) -> list[Net]:
    """``nets`` without ``minus`` (CIDR arithmetic)."""
    out = list(nets)
    for x in minus:
        out = [r for a in out for r in (_exclude(a, x) if a.overlaps(x) else [a])]
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
                  "targetPort": _port_value(p.get("targetPort", p["port"]))} for p in spec.get("ports") or ()]
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


def cluster_of(manifests: list[dict[str, Any]], *, vpc_cidrs: tuple[Net, ...] = PRIVATE_RANGES,
               mode: str = "standard") -> Cluster:
    objs = [*manifests, *PLATFORM]
    namespaces = {"default": {}, "kube-system": {}}
    for m in objs:
        if m.get("kind") == "Namespace":
            namespaces[m["metadata"]["name"]] = dict(m["metadata"].get("labels") or {})
        elif ns := (m.get("metadata") or {}).get("namespace"):
            namespaces.setdefault(ns, {})
    return Cluster(namespaces=namespaces, pods=pods_of(objs), services=services_of(objs),
                   policies=[m for m in objs if m.get("kind") == "NetworkPolicy"], vpc_cidrs=vpc_cidrs, mode=mode,
                   service_accounts={(m["metadata"].get("namespace", "default"), m["metadata"]["name"]): m
                                     for m in objs if m.get("kind") == "ServiceAccount"})
