"""The network contract: every flow a workload needs passes our NetworkPolicies as EKS enforces them, nothing else.

The policies are evaluated by :mod:`.vpc_cni`, a model of the EKS network policy controller and node agent
(aws/amazon-network-policy-controller-k8s ``pkg/resolvers/endpoints.go``; aws/aws-network-policy-agent): a
Service's ClusterIP passes an egress rule only if the rule's podSelector matches the Service's spec.selector
(``getMatchingServiceClusterIPs``), a headless Service is reached on its pods' IPs, named ports are looked up in the
target pod's containers, a pod selected by a policy (the namespace's default-deny selects all) gets only what some
policy allows, and a flow needs the source's egress **and** the destination's ingress.

What a pod needs is read from the rendered manifests, never from our own constants (the pods of a chart the stack
isolates with its own NetworkPolicy, dcgm-exporter, are rebuilt from its release by the chart's templates' rules,
:mod:`.charts`):

* **store**: the launcher dials the host:port of torchrun's ``--rdzv-endpoint`` (torch/distributed/run.py; our
  launcher takes the same flag) in the container's command line. A ``<svc>.<ns>[.svc[.cluster.local]]`` name is that
  Service (ClusterIP: egress to the ClusterIP on the Service port, ingress at every backing pod on the target port);
  ``<host>.<svc>.<ns>...`` is a pod behind a headless Service (its pod IP). A name outside the cluster's domain
  is reached only through declared egress.
* **peers**: a launcher with ``--nnodes`` above 1 talks to the other pods of its own workload on any TCP port
  (torch's TCPStore, gloo and NCCL's bootstrap and socket transports pick ports at run time).
* **DNS**: a pod that dials anything by name needs UDP and TCP 53 to the ``kube-dns`` Service in kube-system
  (its ClusterIP, then a CoreDNS pod).
* **S3/AWS**: a container argument or env value ``s3://...`` needs HTTPS (TCP 443) to every public address (S3's
  regional endpoints are published public ranges; the gateway endpoint routes them, the addresses stay public);
  a ServiceAccount with an IRSA role (``eks.amazonaws.com/role-arn``) needs the same for STS (the EKS pod identity
  webhook injects ``AWS_ROLE_ARN`` and a web-identity token; the SDK exchanges it at STS's regional endpoint,
  EKS user guide "IAM roles for service accounts").
* **downloads**: ``python -m eks_ddp_trainer.prepare_data`` fetches CIFAR-10 over HTTPS from a public host
  (training/eks_ddp_trainer/prepare_data.py ``URL``).
* **declared egress**: the CIDRs and ports a workload declares, recorded on its Job as the annotation
  ``eks-ddp/egress`` (components/eks_ddp/core/workload.py ``Egress``) — rendered into its policy, and allowed for no other pod.
* **API server**: a pod that mounts a service-account token (``automountServiceAccountToken`` not false on the pod,
  else on its ServiceAccount; Kubernetes "Configure Service Accounts for Pods") needs TCP 443 to the ``kubernetes``
  Service; no other pod may reach it (its ClusterIP, or the control plane's ENIs in the VPC).
* **the control plane's calls**: a Service of the plan that a MutatingWebhookConfiguration or
  ValidatingWebhookConfiguration (``webhooks[].clientConfig.service``, port 443 unless given) or an APIService
  (``spec.service``) names is called by the API server, which on EKS reaches the backing pods from its ENIs in the
  cluster's subnets (an address somewhere in the VPC): each backing pod must admit the whole VPC on the Service
  port's target port (Kubernetes "Dynamic Admission Control"; "Configure the Aggregation Layer"). An ingress ipBlock
  is justified by nothing else: one that admits more ports, or addresses outside the VPC, is extra.

"Nothing else": no pod of the plan, and no pod outside it (a stranger in another namespace, or one without our
labels in ours), reaches a pod or Service of the plan beyond those needs (DNS to kube-dns is always tolerated);
no egress ipBlock opens addresses or ports beyond the declared and derived needs; every pod of the plan is
isolated both ways (selected by a policy of each type).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import PlanView, Violation, contract
from .charts import rendered_by_charts
from .netobjects import PLATFORM, PRIVATE_RANGES, Net, Pod, Ports, Service, ports_of, subtract
from .vpc_cni import Cluster, cluster_of

EGRESS_ANNOTATION = "eks-ddp/egress"
"""A Job's declared egress (JSON: ``[{"cidr": ..., "except": [...], "ports": [...], "protocol": "TCP"}]``)."""
LAUNCHERS = ("eks_ddp_runtime.launch", "torch.distributed.run", "torchrun")
NOT_PUBLIC = (*PRIVATE_RANGES, Net("0.0.0.0/8"), Net("127.0.0.0/8"), Net("169.254.0.0/16"), Net("192.0.0.0/24"),
              Net("198.18.0.0/15"), Net("224.0.0.0/4"), Net("240.0.0.0/4"))
"""Special-purpose IPv4 ranges (RFC 6890): no AWS public endpoint lives there."""
PUBLIC = tuple(subtract([Net("0.0.0.0/0")], NOT_PUBLIC))
LINK_LOCAL = Net("169.254.0.0/16")
"""The instance metadata service (the node's credentials) and the EKS Pod Identity agent live here."""
HTTPS = Ports.of(("TCP", 443, 443))
DNS = Ports.of(("UDP", 53, 53), ("TCP", 53, 53))
ANY_TCP = Ports.all("TCP")
NAME = "network"
STRANGER = "Pod/stranger"
ELSEWHERE = "eks-ddp-contract-elsewhere"
"""A namespace of someone else's, where a pod without our labels probes what reaches the plan's pods."""


@dataclass
class Need:
    """A flow ``src`` needs to ``dst`` (a pod, a Service, or networks every address of which must be allowed) on
    ``ports``; for networks, ``may`` is the wider region the need justifies (the check for extra egress)."""

    src: Pod
    dst: Pod | Service | tuple[Net, ...]
    ports: Ports
    why: str
    may: tuple[Net, ...] = ()


def _args(pod: Pod) -> list[str]:
    return [str(a) for c in pod.spec.get("containers") or () for a in (*(c.get("command") or ()), *(c.get("args") or ()))]


def _env(pod: Pod) -> list[str]:
    return [str(e["value"]) for c in pod.spec.get("containers") or () for e in c.get("env") or ()
            if isinstance(e.get("value"), str)]


def _flag(args: list[str], *names: str) -> str | None:
    for i, a in enumerate(args):
        for n in names:
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
            if a == n and i + 1 < len(args):
                return args[i + 1]
    return None


def _launches(pod: Pod) -> bool:
    args = _args(pod)
    return any(x in args for x in LAUNCHERS) or any(a.rsplit("/", 1)[-1] == "torchrun" for a in args[:1])


def _resolve_host(c: Cluster, pod: Pod, host: str) -> Pod | Service | None:
    """A cluster DNS name as CoreDNS answers it: ``svc[.ns[.svc[.cluster.local]]]`` or, under a headless Service,
    ``hostname.svc.ns...`` (the pods whose ``subdomain`` is that Service)."""
    labels = host.rstrip(".").removesuffix(".cluster.local").removesuffix(".svc").split(".")
    svc_by = {(s.namespace, s.name): s for s in c.services}
    if len(labels) <= 2:
        return svc_by.get((labels[1] if len(labels) == 2 else pod.namespace, labels[0]))
    if len(labels) == 3 and (s := svc_by.get((labels[2], labels[1]))) and s.headless:
        return next((p for p in c.backing(s) if p.spec.get("subdomain") == s.name), None)
    return None


def _platform(pod: Pod) -> bool:
    """A pod every EKS cluster runs (``netobjects.PLATFORM``: CoreDNS), not one the plan deploys; the plan's own pods
    in kube-system (a chart's, :mod:`.charts`) are the plan's."""
    return any(pod.owner is m for m in PLATFORM)


def needs(c: Cluster) -> tuple[list[Need], list[Violation]]:
    """Every flow the plan's pods need, from their command lines, env, ServiceAccounts and declarations."""
    out: list[Need] = []
    bad: list[Violation] = []
    dns = next(s for s in c.services if (s.namespace, s.name) == ("kube-system", "kube-dns"))
    api = next(s for s in c.services if (s.namespace, s.name) == ("default", "kubernetes"))
    internet = tuple(subtract([Net("0.0.0.0/0")], [LINK_LOCAL, *c.vpc_cidrs, *c.service_cidrs]))
    for pod in c.pods:
        if _platform(pod) or pod.name == STRANGER:
            continue
        args, named = _args(pod), False
        endpoint = _flag(args, "--rdzv-endpoint", "--rdzv_endpoint")
        if endpoint:
            host, _, port = endpoint.rpartition(":")
            target = _resolve_host(c, pod, host)
            if target is None:
                if ".svc" in host or "." not in host:
                    bad.append(Violation(NAME, repr(pod), f"--rdzv-endpoint {endpoint}: no Service of the plan "
                                                          "answers this name"))
            else:
                out.append(Need(pod, target, Ports.of(("TCP", int(port), int(port))), f"the store ({endpoint})"))
            named = True
        nnodes = _flag(args, "--nnodes")
        if _launches(pod) and nnodes and int(nnodes.split(":")[-1]) > 1:
            out.append(Need(pod, pod, ANY_TCP, f"its peers (--nnodes={nnodes}: NCCL/gloo/TCPStore ports)"))
        values = [*args, *_env(pod)]
        sa = c.service_accounts.get((pod.namespace, pod.spec.get("serviceAccountName") or "default"))
        irsa = sa is not None and "eks.amazonaws.com/role-arn" in ((sa.get("metadata") or {}).get("annotations") or {})
        for why, wanted in (("S3 (an s3:// location it is given)", any(v.startswith("s3://") for v in values)),
                            ("STS (its ServiceAccount's IRSA role)", irsa),
                            ("the CIFAR-10 download (eks_ddp_trainer.prepare_data)", "eks_ddp_trainer.prepare_data" in args)):
            if wanted:
                out.append(Need(pod, PUBLIC, HTTPS, why, may=internet))
                named = True
        for d in _declared(pod, bad):
            region = tuple(subtract([Net(d["cidr"], strict=False)], [Net(x, strict=False) for x in d.get("except", [])]))
            out.append(Need(pod, region, Ports.of(*((d.get("protocol", "TCP"), int(p), int(p)) for p in d["ports"])),
                            f"its declared egress {d['cidr']}", may=region))
            named = True
        if _mounts_token(pod, sa):
            out.append(Need(pod, api, HTTPS, "the API server (it mounts a service-account token)",
                            may=(*c.vpc_cidrs, *c.service_cidrs)))
            named = True
        if named:
            out.append(Need(pod, dns, DNS, "DNS (it dials names)"))
    return out, bad


def _mounts_token(pod: Pod, sa: dict[str, Any] | None) -> bool:
    """The kubelet mounts an API token unless the pod, or else its ServiceAccount, says false."""
    own = pod.spec.get("automountServiceAccountToken")
    if own is not None:
        return bool(own)
    return sa is None or sa.get("automountServiceAccountToken") is not False


def _declared(pod: Pod, bad: list[Violation]) -> list[dict[str, Any]]:
    raw = ((pod.owner.get("metadata") or {}).get("annotations") or {}).get(EGRESS_ANNOTATION)
    if raw is None:
        return []
    try:
        items = json.loads(raw)
        for d in items:
            ipaddress.ip_network(d["cidr"], strict=False)
            [int(p) for p in d["ports"]]
        return items
    except (ValueError, KeyError, TypeError) as err:
        bad.append(Violation(NAME, repr(pod), f"annotation {EGRESS_ANNOTATION}: got {raw!r}; expected a JSON list "
                                              f"of {{cidr, except, ports, protocol}} ({err})"))
        return []


def _fmt_nets(nets: Iterable[Net], limit: int = 3) -> str:
    nets = list(nets)
    return ", ".join(map(str, nets[:limit])) + (f" (+{len(nets) - limit} more)" if len(nets) > limit else "")


def _why_not(c: Cluster, need: Need) -> str:
    """The controller's reason a Service's ClusterIP stays out of the source's egress rules, when that is it."""
    if not isinstance(need.dst, Service) or need.dst.headless:
        return ""
    if c.egress(need.src, need.dst).intersect(need.ports) == need.ports:
        return ""
    tried = [peer.get("podSelector") for p in c._selecting(need.src, "egress") for r in p["spec"].get("egress") or ()
             for peer in r.get("to") or () if not peer.get("ipBlock")]
    return (f"; the EKS network policy controller admits {need.dst!r}'s ClusterIP only under an egress rule whose "
            f"podSelector matches the Service's selector {need.dst.selector} (getMatchingServiceClusterIPs), and the "
            f"rules' podSelectors are {tried}")


def check_needs(c: Cluster, all_needs: list[Need]) -> list[Violation]:
    out = []
    for n in all_needs:
        if isinstance(n.dst, Service):
            reached = c.via_service(n.src, n.dst)
            short = {repr(p) if p else n.dst.name: n.ports.minus(got) for p, got in reached.items()}
            if not reached:
                short = {n.dst.name: n.ports}
        elif isinstance(n.dst, Pod):
            got = c.egress(n.src, n.dst).intersect(c.ingress(n.dst, n.src))
            short = {repr(n.dst): n.ports.minus(got)}
        else:
            got = _covering(c, n.src, n.dst)
            short = {_fmt_nets(n.dst): n.ports.minus(got)}
        for where, missing in short.items():
            if missing:
                out.append(Violation(NAME, repr(n.src), f"needs {missing} to {where} for {n.why}, which the "
                                                       f"policies as EKS enforces them do not allow{_why_not(c, n)}"))
    return out


def _covering(c: Cluster, src: Pod, nets: tuple[Net, ...]) -> Ports:
    """Ports on which ``src`` may reach every address of ``nets``."""
    got: Ports | None = None
    for net in nets:
        here = c.egress(src, net)
        got = here if got is None else got.intersect(here)
    return got or Ports()


def check_extra(c: Cluster, all_needs: list[Need]) -> list[Violation]:
    out = []
    plan = [p for p in c.pods if not _platform(p) and p.name != STRANGER]
    dns = next(s for s in c.services if (s.namespace, s.name) == ("kube-system", "kube-dns"))
    tolerated_dns = {id(dns), *(id(p) for p in c.backing(dns))}
    for ns in {p.namespace for p in plan}:
        for d in ("ingress", "egress"):
            for p in plan:
                if p.namespace == ns and not c.isolated(p, d):
                    out.append(Violation(NAME, repr(p), f"no NetworkPolicy selects it for {d}: everything passes"))
    strangers = [p for p in c.pods if p.name == STRANGER]
    justified: dict[tuple[int, int], Ports] = {}
    for n in all_needs:
        if isinstance(n.dst, (Pod, Service)):
            justified[(id(n.src), id(n.dst))] = justified.get((id(n.src), id(n.dst)), Ports()).union(n.ports)
            if isinstance(n.dst, Service):  # the same flow lands on the backing pods' target ports
                for pod in c.backing(n.dst):
                    tps = Ports.of(*((sp["protocol"], t, t) for sp in n.dst.ports
                                     if n.ports.has(sp["protocol"], sp["port"])
                                     and (t := c.target_port(pod, sp)) is not None))
                    justified[(id(n.src), id(pod))] = justified.get((id(n.src), id(pod)), Ports()).union(tps)
    ours = {id(x) for x in (*plan, *(s for s in c.services if s.namespace in {p.namespace for p in plan}))}
    for src in [*plan, *strangers]:
        for dst in c.pods:
            if (src in strangers and id(dst) not in ours) or (dst is src and src.replicas < 2):
                continue  # a lone pod has no replica to talk to
            got = c.egress(src, dst, definite=False, cidrs=False).intersect(
                c.ingress(dst, src, definite=False, cidrs=False))
            extra = got if src in strangers else got.minus(justified.get((id(src), id(dst)), Ports()))
            if id(dst) in tolerated_dns:
                extra = extra.minus(DNS)
            if extra:
                out.append(Violation(NAME, repr(src), f"may reach {dst!r} on {extra}, which nothing it runs needs"))
        for svc in c.services:
            if svc.headless or (src in strangers and id(svc) not in ours):
                continue  # a headless Service has no ClusterIP: its pods' own check covers it
            for got in c.via_service(src, svc, definite=False, cidrs=False).values():
                extra = got if src in strangers else got.minus(justified.get((id(src), id(svc)), Ports()))
                if id(svc) in tolerated_dns:
                    extra = extra.minus(DNS)
                if extra:
                    out.append(Violation(NAME, repr(src), f"may reach {svc!r} (ClusterIP) on {extra}, which nothing "
                                                          "it runs needs"))
        if src not in strangers:
            out += _extra_cidrs(c, src, [n for n in all_needs if n.src is src and n.may])
    return out


def _extra_cidrs(c: Cluster, src: Pod, own: list[Need]) -> list[Violation]:
    """Every egress ipBlock of ``src``, less what its network needs justify (per port), must be empty."""
    out: list[Violation] = []
    if not c.isolated(src, "egress"):
        return out
    for policy in c._selecting(src, "egress"):
        for e in c.endpoints(policy, "egress"):
            if "cidr" not in e:
                continue
            left = [(subtract([e["cidr"]], e.get("except", ())), ports_of(e["ports"]))]
            for n in own:
                nxt = []
                for nets, ports in left:
                    if rest := ports.minus(n.ports):
                        nxt.append((nets, rest))
                    if (both := ports.intersect(n.ports)) and (nets2 := subtract(nets, n.may)):
                        nxt.append((nets2, both))
                left = nxt
            for nets, ports in left:
                out.append(Violation(NAME, repr(src), f"egress to {_fmt_nets(nets)} on {ports} "
                                                      f"({policy['metadata']['name']}), which nothing it runs or "
                                                      "declares needs"))
    return out


CONTROL_PLANE = Pod(name="control-plane", namespace="", labels={}, spec={})
"""The API server as a caller: no pod of the cluster, an address in the VPC (its ENIs)."""


def control_plane_needs(c: Cluster, manifests: list[dict[str, Any]]) -> tuple[dict[int, Ports], list[Violation]]:
    """Per backing pod (by id), the ports the control plane must reach it on; violations where it cannot."""
    wanted: list[tuple[str, str, int, str]] = []
    for m in manifests:
        if m.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in m.get("webhooks") or ():
                ref = (hook.get("clientConfig") or {}).get("service")
                if ref:
                    wanted.append((ref.get("namespace", "default"), ref["name"], int(ref.get("port", 443)),
                                   f"{m['kind']} {m['metadata']['name']} webhook {hook.get('name')}"))
        elif m.get("kind") == "APIService" and (ref := (m.get("spec") or {}).get("service")):
            wanted.append((ref.get("namespace", "default"), ref["name"], int(ref.get("port", 443)),
                           f"APIService {m['metadata']['name']}"))
    svc_by = {(s.namespace, s.name): s for s in c.services}
    justified: dict[int, Ports] = {}
    bad: list[Violation] = []
    for ns, name, port, why in wanted:
        svc = svc_by.get((ns, name))
        if svc is None:
            bad.append(Violation(NAME, why, f"calls Service {ns}/{name}, which the plan does not have"))
            continue
        for sp in (p for p in svc.ports if p["port"] == port):
            for pod in c.backing(svc):
                tp = c.target_port(pod, sp)
                if tp is None:
                    continue
                need = Ports.of((sp["protocol"], tp, tp))
                justified[id(pod)] = justified.get(id(pod), Ports()).union(need)
                if missing := need.minus(c.ingress(pod, CONTROL_PLANE)):
                    bad.append(Violation(NAME, repr(pod), f"needs {missing} from the control plane (its ENIs in "
                                                          f"the VPC: {_fmt_nets(c.vpc_cidrs)}) for {why}, which the "
                                                          "policies as EKS enforces them do not allow"))
    return justified, bad


def _extra_ingress_cidrs(c: Cluster, pod: Pod, justified: Ports) -> list[Violation]:
    """Every ingress ipBlock of ``pod`` must be the VPC (the control plane) on ports the control plane needs."""
    out: list[Violation] = []
    if not c.isolated(pod, "ingress"):
        return out
    for policy in c._selecting(pod, "ingress"):
        for e in c.endpoints(policy, "ingress"):
            if "cidr" not in e:
                continue
            nets, ports = subtract([e["cidr"]], e.get("except", ())), ports_of(e["ports"])
            beyond = subtract(nets, c.vpc_cidrs)
            if extra := ports.minus(justified):
                out.append(Violation(NAME, repr(pod), f"ingress from {_fmt_nets(nets)} on {extra} "
                                                      f"({policy['metadata']['name']}), which nothing calling it needs"))
            if beyond and ports.intersect(justified):
                out.append(Violation(NAME, repr(pod), f"ingress from {_fmt_nets(beyond)} "
                                                      f"({policy['metadata']['name']}): outside the VPC, where "
                                                      "the control plane's ENIs are"))
    return out


def check_cluster(c: Cluster, manifests: list[dict[str, Any]] | None = None) -> list[Violation]:
    all_needs, bad = needs(c)
    justified, cp_bad = control_plane_needs(c, manifests or [])
    extra_in = [v for p in c.pods if not _platform(p) and p.name != STRANGER
                for v in _extra_ingress_cidrs(c, p, justified.get(id(p), Ports()))]
    return bad + cp_bad + check_needs(c, all_needs) + check_extra(c, all_needs) + extra_in


def check_manifests(manifests: list[dict[str, Any]], *, vpc_cidrs: tuple[Net, ...] = PRIVATE_RANGES,
                    mode: str = "standard") -> list[Violation]:
    """The contract over rendered manifests (the plan's, or a set built to break it)."""
    namespaces = {m["metadata"].get("namespace") for m in manifests if m.get("metadata", {}).get("namespace")}
    strangers = [{"kind": "Pod", "metadata": {"name": "stranger", "namespace": ns}, "spec": {}}
                 for ns in sorted({ELSEWHERE, *namespaces})]
    return check_cluster(cluster_of([*manifests, *strangers], vpc_cidrs=vpc_cidrs, mode=mode), manifests)


def vpc_cidrs_of(view: PlanView) -> tuple[Net, ...]:
    found = [Net(str(r.inputs["cidrBlock"])) for r in view.aws("aws:ec2/vpc:Vpc") if r.inputs.get("cidrBlock")]
    return tuple(found) or PRIVATE_RANGES


@contract(NAME)
def network(view: PlanView) -> list[Violation]:
    """Our NetworkPolicies as EKS's VPC CNI enforces them: every needed flow allowed, nothing else. The pods of the
    charts the stack isolates itself (:mod:`.charts`: dcgm-exporter, kueue) are the plan's pods too."""
    return check_manifests([*view.manifests, *rendered_by_charts(view.result)], vpc_cidrs=vpc_cidrs_of(view))

