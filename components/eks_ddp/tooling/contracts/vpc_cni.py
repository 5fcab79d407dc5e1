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
  pod's ``LookupListenPortFromPodSpec``), and a numeric policy port skipped when the Service port's *named*
  targetPort resolves on any backing pod to a port the rule does not allow (``hasTargetPortBypass``,
  ``isNumericPortAllowed``; read at ecc7e6a).
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .netobjects import (
    EKS_SERVICE_CIDRS,
    PLATFORM,
    PRIVATE_RANGES,
    Net,
    Pod,
    Ports,
    Service,
    exclude,
    pods_of,
    port_value,
    ports_of,
    selector_matches,
    services_of,
)


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
        return [{"protocol": q.get("protocol", "TCP"), "port": port_value(q["port"]) if q.get("port") is not None
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

    def _target_port_bypass(self, svc: Service, listen: int, protocol: str, ports: list[dict[str, Any]]) -> bool:
        """``hasTargetPortBypass`` (commit 7134cca, "fix: NamedTarget Port bypass issue (#223)"): for a numeric
        policy port, a Service port with a *named* targetPort whose name resolves, on any pod the Service selects
        (``firstNamedPort``: the first container port of that name and protocol), to a port the rule's ports do not
        allow (``isNumericPortAllowed``: a port-less entry allows all; a numeric one its ``endPort`` range; named
        ones are skipped) makes the controller skip that ClusterIP port."""
        name = next((sp["targetPort"] for sp in svc.ports if sp["port"] == listen and sp["protocol"] == protocol
                     and isinstance(sp["targetPort"], str)), None)
        if name is None:
            return False
        for pod in self._pods({"matchLabels": svc.selector or {}}, svc.namespace):
            found = pod.lookup_port(name, protocol)
            if found is not None and not any(
                    q["protocol"] == protocol and (q["port"] is None or (
                        isinstance(q["port"], int) and q["port"] <= found[0] <= (q.get("endPort") or q["port"])))
                    for q in ports):
                return True
        return False

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
                        if isinstance(q["port"], int) and self._target_port_bypass(svc, listen, q["protocol"], ports):
                            continue
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
            allowed = [r for a in allowed for r in (exclude(a, x) if a.overlaps(x) else [a])]
        ranges = list(ranges)
        if definite:
            return all(any(r.subnet_of(a) for a in allowed) for r in ranges)
        return any(r.overlaps(a) for r in ranges for a in allowed)

    def egress(self, src: Pod, dst: Pod | Service | Net, *, definite: bool = True, cidrs: bool = True) -> Ports:
        """Ports on which ``src`` may send to ``dst`` (a pod's IP, a Service's ClusterIP, or a network)."""
        if not self.isolated(src, "egress"):
            return Ports.all()
        out = Ports()
        ranges = (self.vpc_cidrs if isinstance(dst, Pod) else self.service_cidrs
                  if isinstance(dst, Service) else (dst,))
        # For sure: the address lies in one of the ranges, so a port passes if, for every range, some ipBlock covers
        # that whole range on it (two blocks may split the ranges between them).
        per_range: dict[Net, Ports] = {r: Ports() for r in ranges}
        for policy in self._selecting(src, "egress"):
            for e in self.endpoints(policy, "egress"):
                if "cidr" in e:
                    if not cidrs:
                        continue
                    if definite:
                        for r in ranges:
                            if self._in_range(e, (r,), True):
                                per_range[r] = per_range[r].union(ports_of(e["ports"]))
                        continue
                    hit = self._in_range(e, ranges, definite)
                else:
                    hit = e.get("pod") is dst or e.get("svc") is dst
                if hit:
                    out = out.union(ports_of(e["ports"]))
        if cidrs and definite and per_range:
            sure = None
            for got in per_range.values():
                sure = got if sure is None else sure.intersect(got)
            out = out.union(sure or Ports())
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


def cluster_of(manifests: list[dict[str, Any]], *, vpc_cidrs: tuple[Net, ...] = PRIVATE_RANGES,
               mode: str = "standard") -> Cluster:
    objs = [*manifests, *PLATFORM]
    namespaces: dict[str, dict[str, str]] = {"default": {}, "kube-system": {}}
    for m in objs:
        if m.get("kind") == "Namespace":
            namespaces[m["metadata"]["name"]] = dict(m["metadata"].get("labels") or {})
        elif ns := (m.get("metadata") or {}).get("namespace"):
            namespaces.setdefault(ns, {})
    return Cluster(namespaces=namespaces, pods=pods_of(objs), services=services_of(objs),
                   policies=[m for m in objs if m.get("kind") == "NetworkPolicy"], vpc_cidrs=vpc_cidrs, mode=mode,
                   service_accounts={(m["metadata"].get("namespace", "default"), m["metadata"]["name"]): m
                                     for m in objs if m.get("kind") == "ServiceAccount"})
