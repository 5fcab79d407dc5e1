"""The network contract (components/eks_ddp/tooling/contracts/network.py) over the dev and p4de plans, and its negative controls:
manifest sets built to break each rule it checks, and the model of the EKS policy controller on small cases."""

from __future__ import annotations

import copy
from ipaddress import IPv4Network as Net

import pytest

from eks_ddp.tooling.contracts import PlanView, check
from eks_ddp.tooling.contracts.netobjects import Ports
from eks_ddp.tooling.contracts.network import check_manifests, vpc_cidrs_of
from eks_ddp.tooling.contracts.vpc_cni import cluster_of
from eks_ddp.workloads.etcd import SERVER_LABELS
from tests.support.job_args import job_args

NS = "training"


@pytest.fixture(scope="module")
def dev_view(dev_result) -> PlanView:
    return PlanView.of(dev_result)


def manifests(view: PlanView) -> list[dict]:
    return copy.deepcopy(view.manifests)


def policy(ms: list[dict], name: str) -> dict:
    return next(m for m in ms if m["kind"] == "NetworkPolicy" and m["metadata"]["name"] == name)


def run(ms: list[dict], view: PlanView, **kw) -> list[str]:
    return [str(v) for v in check_manifests(ms, vpc_cidrs=vpc_cidrs_of(view), **kw)]


@pytest.mark.parametrize("stack", ["dev_result", "p4de_result"])
def test_the_plans_allow_every_needed_flow_and_nothing_else(stack, request):
    assert [str(v) for v in check(request.getfixturevalue(stack), only=("network",))] == []


def test_the_store_selector_of_the_old_code_is_reported(dev_view):
    # The egress rule of the old code selected the members by {name, component, part-of}; the store's Service
    # selects {name, instance}: the controller leaves the ClusterIP out, and the agents never reach the store.
    ms = manifests(dev_view)
    for rule in policy(ms, "training-train")["spec"]["egress"]:
        if any(p.get("port") == 2379 for p in rule.get("ports", [])):
            rule["to"] = [{"podSelector": {"matchLabels": dict(SERVER_LABELS)}}]
    found = run(ms, dev_view)
    assert len(found) == 1, found
    assert "needs TCP 2379 to training/StatefulSet/rendezvous-etcd for the store" in found[0]
    assert "getMatchingServiceClusterIPs" in found[0]


def test_a_second_store_pod_mapping_client_to_another_port_is_reported(dev_view):
    """The review's control for the named targetPort rule: the store Service's targetPort is the name ``client``; a
    second backing pod where ``client`` is 2380 makes the controller skip the ClusterIP, so the agents lose the
    store although the egress rule allows 2379."""
    ms = manifests(dev_view)
    sts = next(m for m in ms if m["kind"] == "StatefulSet" and m["metadata"]["name"] == "rendezvous-etcd")
    twin = copy.deepcopy(sts)
    twin["metadata"]["name"] = "rendezvous-etcd-twin"
    for c in twin["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports", []):
            if p.get("name") == "client":
                p["containerPort"] = 2380
    assert run([*ms, sts], dev_view) == run(ms, dev_view) == []  # the same pod twice changes nothing
    found = run([*ms, twin], dev_view)
    assert any("needs TCP 2379 to training/StatefulSet/rendezvous-etcd for the store" in m for m in found), found


@pytest.mark.parametrize("labels", [None, dict(SERVER_LABELS)])
def test_the_components_with_the_old_default_store_labels_are_reported(labels):
    # ElasticJob and EtcdRendezvous as a program of your own builds them; SERVER_LABELS was the old default of
    # rdzv_server_labels: every training pod's egress missed the store's ClusterIP.
    import pulumi

    from eks_ddp.tooling.mocks import run_program
    from eks_ddp.workloads.elastic_job import ElasticJob
    from eks_ddp.workloads.etcd import EtcdRendezvous, EtcdRendezvousArgs
    from eks_ddp.workloads.namespace import NamespaceBaseline

    def program() -> None:
        NamespaceBaseline("ns", NS)
        etcd = EtcdRendezvous("rendezvous", EtcdRendezvousArgs(namespace=NS))
        job = ElasticJob("training", job_args(
            namespace=NS, image="r.example/t@sha256:" + "a" * 64, pvc_name="shared", instance_type="g4dn.xlarge",
            nodes=2, rdzv_endpoint=etcd.endpoint, rdzv_tls_secret=etcd.client_tls_secret, rdzv_server_labels=labels))
        pulumi.export("job", job.job_name)

    found = [str(v) for v in check(run_program({}, program=program), only=("network",))]
    if labels is None:
        assert found == []
    else:
        assert len(found) == 1 and "for the store" in found[0] and "getMatchingServiceClusterIPs" in found[0]


def test_the_pod_ip_alone_does_not_reach_a_clusterip_store(dev_view):
    # The same rule by pod labels admits the member's pod IP, which the agents never dial: still reported.
    ms = manifests(dev_view)
    for rule in policy(ms, "training-train")["spec"]["egress"]:
        if any(p.get("port") == 2379 for p in rule.get("ports", [])):
            rule["to"] = [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "rendezvous"}}}]
    assert any("for the store" in v for v in run(ms, dev_view))


def test_a_missing_dns_rule_is_reported(dev_view):
    ms = manifests(dev_view)
    train = policy(ms, "training-train")["spec"]
    train["egress"] = [r for r in train["egress"] if not any(p.get("port") == 53 for p in r.get("ports", []))]
    found = run(ms, dev_view)
    assert len(found) == 1 and found[0].startswith(
        "[network] training/Job/training-run-1: needs TCP 53, UDP 53 to kube-system/Deployment/coredns for DNS (it "
        "dials names), which the policies as EKS enforces them do not allow; the EKS network policy controller "
        "admits Service kube-system/kube-dns's ClusterIP only under"), found


@pytest.mark.parametrize("mutate, expected", [
    # The evaluation pods may reach anything on the internet: no command of theirs needs it.
    (lambda ms: policy(ms, "training-evaluate")["spec"]["egress"].append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}),
     "training/CronJob/training-evaluate: egress to 0.0.0.0/0 on SCTP 1-65535, TCP 1-65535"),
    # The store admits pods of every namespace.
    (lambda ms: policy(ms, "rendezvous-etcd")["spec"]["ingress"][0].update({"from": [{"namespaceSelector": {}}]}),
     "eks-ddp-contract-elsewhere/Pod/stranger: may reach training/StatefulSet/"
                                      "rendezvous-etcd on TCP 2379"),
    # The store admits every pod of its namespace, and data preparation (which never dials it) may send to it.
    (lambda ms: policy(ms, "rendezvous-etcd")["spec"]["ingress"][0].update({"from": [{"podSelector": {}}]}) or
     policy(ms, "training-prepare-data")["spec"]["egress"].append(
         {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "etcd"}}}]}),
     "training/Job/training-prepare-data: may reach training/StatefulSet/rendezvous-etcd on TCP 2379"),
    # Data preparation may also talk to the training pods.
    (lambda ms: policy(ms, "training-prepare-data")["spec"]["egress"].append(
        {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "training-run-1"}}}]}) or
     policy(ms, "training-train")["spec"]["ingress"].append(
         {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "eks-ddp-prepare-data"}}}]}),
     "training/Job/training-prepare-data: may reach training/Job/training-run-1 on SCTP 1-65535, TCP 1-65535"),
])
def test_an_extra_flow_is_reported(dev_view, mutate, expected):
    ms = manifests(dev_view)
    mutate(ms)
    found = run(ms, dev_view)
    assert any(v.startswith(f"[network] {expected}") for v in found), found


def test_a_pod_that_mounts_an_api_token_needs_the_api_server(dev_view):
    ms = manifests(dev_view)
    cron = next(m for m in ms if m["kind"] == "CronJob")
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["automountServiceAccountToken"] = True
    assert any("needs TCP 443 to kubernetes for the API server" in v for v in run(ms, dev_view))


def test_a_pod_without_a_policy_is_reported(dev_view):
    ms = [m for m in manifests(dev_view) if m["kind"] != "NetworkPolicy" or
          m["metadata"]["name"] not in ("default-deny", "training-evaluate")]
    found = run(ms, dev_view)
    assert "[network] training/CronJob/training-evaluate: no NetworkPolicy selects it for egress: everything " \
           "passes" in found


def test_strict_mode_would_cut_every_pod_off_dns_today(dev_view):
    # NETWORK_POLICY_ENFORCING_MODE=strict isolates unselected pods too, CoreDNS among them: the plan has no
    # policy for kube-system, so lookups would fail (why the stack keeps 'standard').
    found = run(manifests(dev_view), dev_view, mode="strict")
    assert any("coredns for DNS" in v for v in found)


# --- the model of the EKS controller on small cases ------------------------------------------------------------
def pod(name: str, labels: dict, ports: list[dict] | None = None) -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"containers": [{"name": "c", "ports": ports or []}]}}


def netpol(name: str, selector: dict, egress: list | None = None, ingress: list | None = None) -> dict:
    return {"kind": "NetworkPolicy", "metadata": {"name": name, "namespace": NS},
            "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress", "Egress"],
                     "egress": egress or [], "ingress": ingress or []}}


def service(name: str, selector: dict, target, headless: bool = False) -> dict:
    return {"kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"selector": selector, **({"clusterIP": "None"} if headless else {}),
                     "ports": [{"name": "p", "port": 80, "targetPort": target}]}}


SERVER = pod("server", {"app": "db", "tier": "data"}, [{"name": "api", "containerPort": 8080}])
CLIENT = pod("client", {"app": "client"})
OPEN_SERVER = netpol("server", {"app": "db"}, ingress=[{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}])


def reach(objs: list[dict], to: str) -> Ports:
    c = cluster_of(objs)
    client = next(p for p in c.pods if p.name == "Pod/client")
    target = next(s for s in c.services if s.name == to)
    return next(iter(c.via_service(client, target).values()))


@pytest.mark.parametrize("rule_selector, admitted", [
    ({"app": "db"}, True),                  # a subset of the Service's selector
    ({"app": "db", "tier": "data"}, False),  # more than the Service selects on, though every pod carries it
    ({}, True),                             # an empty selector matches every Service
])
def test_a_clusterip_passes_only_under_a_rule_matching_the_service_selector(rule_selector, admitted):
    egress = [{"to": [{"podSelector": {"matchLabels": rule_selector}}], "ports": [{"port": 8080}]}]
    objs = [SERVER, CLIENT, OPEN_SERVER, netpol("client", {"app": "client"}, egress=egress),
            service("db", {"app": "db"}, "api")]
    assert bool(reach(objs, "db")) is admitted


def test_a_headless_service_is_reached_on_its_pods_ips():
    egress = [{"to": [{"podSelector": {"matchLabels": {"tier": "data"}}}], "ports": [{"port": 8080}]}]
    objs = [SERVER, CLIENT, OPEN_SERVER, netpol("client", {"app": "client"}, egress=egress)]
    assert not reach([*objs, service("db", {"app": "db"}, 8080)], "db")
    assert reach([*objs, service("db", {"app": "db"}, 8080, headless=True)], "db").has("TCP", 80)


@pytest.mark.parametrize("other_api, rule_ports, admitted", [
    (9090, [{"port": 8080}], False),                   # another backing pod maps 'api' to a port the rule refuses
    (8080, [{"port": 8080}], True),                    # every backing pod maps it to the allowed port
    (9090, [{"port": 8080, "endPort": 9090}], True),   # the rule's range allows both
    (9090, [{"port": "api"}], True),                   # a named policy port is not checked for the bypass
])
def test_a_named_target_port_resolving_to_a_refused_port_on_any_backing_pod_skips_the_clusterip(
        other_api, rule_ports, admitted):
    """The controller's ``hasTargetPortBypass`` (amazon-network-policy-controller-k8s pkg/resolvers/endpoints.go)."""
    second = pod("server-2", {"app": "db"}, [{"name": "api", "containerPort": other_api}])
    egress = [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}], "ports": rule_ports}]
    objs = [SERVER, second, CLIENT, OPEN_SERVER, netpol("client", {"app": "client"}, egress=egress),
            service("db", {"app": "db"}, "api")]
    assert bool(reach(objs, "db")) is admitted


def test_named_ports_resolve_against_the_target_pod_and_never_in_an_ip_block():
    c = cluster_of([SERVER, CLIENT, pod("other", {"app": "other"}), netpol("client", {"app": "client"}, egress=[
        {"to": [{"podSelector": {}}], "ports": [{"port": "api"}]},
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": "api"}]}])])
    client, server, other = (next(p for p in c.pods if p.name == f"Pod/{n}") for n in ("client", "server", "other"))
    assert c.egress(client, server) == Ports.of(("TCP", 8080, 8080))
    assert not c.egress(client, other)  # no container port named 'api': that pod is left out
    assert not c.egress(client, Net("8.8.8.8/32"))  # a named port cannot open a CIDR


def test_egress_and_ingress_must_both_allow():
    egress = [{"to": [{"podSelector": {"matchLabels": {"app": "db"}}}]}]
    c = cluster_of([SERVER, CLIENT, netpol("client", {"app": "client"}, egress=egress),
                    netpol("server", {"app": "db"})])
    client, server = (next(p for p in c.pods if p.name == f"Pod/{n}") for n in ("client", "server"))
    assert c.egress(client, server) and not c.ingress(server, client)


def test_two_ip_blocks_that_split_the_service_ranges_reach_the_api_server_for_sure():
    """EKS puts the ClusterIP in 10.100.0.0/16 or 172.20.0.0/16: one ipBlock for each covers it whichever it is.
    Negative control: either block alone does not."""
    from eks_ddp.tooling.contracts.netobjects import API_SERVER

    def api(blocks: list[str]) -> Ports:
        egress = [{"to": [{"ipBlock": {"cidr": b}} for b in blocks], "ports": [{"port": 443, "protocol": "TCP"}]}]
        c = cluster_of([CLIENT, netpol("client", {"app": "client"}, egress=egress)])
        client = next(p for p in c.pods if p.name == "Pod/client")
        svc = next(s for s in c.services if s.name == API_SERVER["metadata"]["name"])
        return c.egress(client, svc)

    assert api(["10.100.0.0/16", "172.20.0.0/16"]) == Ports.of(("TCP", 443, 443))
    assert not api(["10.100.0.0/16"]) and not api(["172.20.0.0/16"])


def test_api_server_egress_through_the_service_cidr_is_not_extra_in_a_smaller_vpc():
    """The ClusterIP lies in the service CIDR, outside a 10.0.0.0/16 VPC: egress there for the API server is needed,
    not extra. Negative control: the same block on port 80 is extra."""
    def found(port: int) -> list[str]:
        egress = [{"to": [{"ipBlock": {"cidr": c}} for c in ("10.100.0.0/16", "172.20.0.0/16")],
                   "ports": [{"port": port, "protocol": "TCP"}]}]
        objs = [pod("client", {"app": "client"}), netpol("client", {"app": "client"}, egress=egress, ingress=[])]
        return [str(v) for v in check_manifests(objs, vpc_cidrs=(Net("10.0.0.0/16"),))
                if "Pod/client: egress to" in str(v)]
    assert found(443) == []
    assert any("egress to 10.100.0.0/16" in f and "TCP 80" in f for f in found(80)), found(80)


# --- a stack with a workload of its own: declared egress, an S3 data set --------------------------------------
BERT = "123456789012.dkr.ecr.us-west-2.amazonaws.com/bert@sha256:" + "a" * 64


@pytest.fixture(scope="module")
def custom_view() -> PlanView:
    from tests.support.util import run as run_stack
    from tests.support.util import stack_config

    cfg = {k: v for k, v in stack_config("dev").items() if k != "eks-ddp:job"}
    cfg["eks-ddp:runs"] = [{"runId": "cifar", "nodes": 1}, {"runId": "bert", "nodes": 2, "workload": {
        "image": BERT, "module": "bert.train", "data": {"s3": "s3://my-data/wiki/"},
        "egress": ["https", "10.20.0.0/16:5432"],
        "iamStatements": [{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::ckpt/*"]}]}}]
    return PlanView.of(run_stack(cfg))


def bert_policy(ms: list[dict]) -> dict:
    return policy(ms, "training-bert-train")


def test_a_custom_workload_gets_what_it_declares_and_nothing_else(custom_view):
    assert run(manifests(custom_view), custom_view) == []


def test_declared_egress_that_is_not_rendered_is_reported(custom_view):
    ms = manifests(custom_view)
    spec = bert_policy(ms)["spec"]
    spec["egress"] = [r for r in spec["egress"] if not any(p.get("port") == 5432 for p in r.get("ports", []))]
    assert run(ms, custom_view) == [
        "[network] training/Job/training-bert-bert: needs TCP 5432 to 10.20.0.0/16 for its declared egress "
        "10.20.0.0/16, which the policies as EKS enforces them do not allow"]


def test_rendered_egress_that_is_not_declared_is_reported(custom_view):
    ms = manifests(custom_view)
    job = next(m for m in ms if m["kind"] == "Job" and m["metadata"]["name"] == "training-bert-bert")
    del job["metadata"]["annotations"]["eks-ddp/egress"]
    assert run(ms, custom_view) == [
        "[network] training/Job/training-bert-bert: egress to 10.20.0.0/16 on TCP 5432 (training-bert-train), "
        "which nothing it runs or declares needs"]


# --- c10d: the store on the pod of index 0, behind a headless Service -----------------------------------------
@pytest.fixture(scope="module")
def c10d_view() -> PlanView:
    from tests.support.util import run as run_stack
    from tests.support.util import set_path, stack_config

    cfg = set_path(stack_config("dev"), "eks-ddp:job.rdzvBackend", "c10d")
    cfg.pop("eks-ddp:etcd", None)
    return PlanView.of(run_stack(cfg))


def test_c10d_reaches_index_zero_through_the_headless_service(c10d_view):
    assert run(manifests(c10d_view), c10d_view) == []
    ms = manifests(c10d_view)
    spec = policy(ms, "training-train")["spec"]
    spec["egress"] = [r for r in spec["egress"] if not any("podSelector" in t and "namespaceSelector" not in t
                                                           for t in r.get("to", []))]
    found = run(ms, c10d_view)
    assert any(v.startswith("[network] training/Job/training-run-1: needs TCP 29400 to training/Job/training-run-1 "
                            "for the store (training-run-1-0.training-run-1.training.svc.cluster.local:29400)")
               for v in found), found


# --- a chart's pods the stack isolates itself: dcgm-exporter in kube-system -------------------------------------

def _with_charts(view: PlanView) -> list[dict]:
    from eks_ddp.tooling.contracts.charts import rendered_by_charts

    return [*manifests(view), *rendered_by_charts(view.result)]


def test_the_exporter_pods_are_the_charts_and_the_policy_selects_them(dev_view):
    from eks_ddp.infra.observability import dcgm_selector
    from eks_ddp.tooling.contracts.netobjects import selector_matches

    ms = _with_charts(dev_view)
    [ds] = [m for m in ms if m["kind"] == "DaemonSet" and m["metadata"]["name"] == "dcgm-exporter"]
    assert ds["metadata"]["namespace"] == "kube-system"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert labels == dcgm_selector() and ds["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert selector_matches(policy(ms, "dcgm-exporter")["spec"]["podSelector"], labels)
    assert run(ms, dev_view) == []


def test_an_unisolated_exporter_is_reported(dev_view):
    ms = [m for m in _with_charts(dev_view) if not (m["kind"] == "NetworkPolicy"
                                                   and m["metadata"]["name"] == "dcgm-exporter")]
    found = run(ms, dev_view)
    assert any("kube-system/DaemonSet/dcgm-exporter: no NetworkPolicy selects it for ingress" in f for f in found), found


def test_an_exporter_open_to_every_namespace_is_reported(dev_view):
    ms = _with_charts(dev_view)
    policy(ms, "dcgm-exporter")["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {}}]
    found = run(ms, dev_view)
    # A stranger pod anywhere now reaches it (the training pods' own egress policies still keep them out).
    assert any("stranger" in f and "dcgm-exporter on TCP 9400" in f for f in found), found


def test_an_exporter_with_pod_labels_needs_the_api_server_its_policy_refuses(dev_view):
    """With pod labels on, the chart mounts an API token and the exporter lists pods: a flow its policy (no egress)
    would cut, which the contract reports instead of a silently label-less exporter."""
    from eks_ddp.tooling.contracts.charts import dcgm_exporter

    release = next(r for r in dev_view.result.of_type("kubernetes:helm.sh/v3:Release")
                   if r.inputs["chart"] == "dcgm-exporter")
    values = copy.deepcopy(release.inputs["values"])
    values["kubernetes"]["enablePodLabels"] = True
    labelled = copy.copy(release)
    labelled.inputs = {**release.inputs, "values": values}
    ms = [*manifests(dev_view), *dcgm_exporter(labelled)]
    found = run(ms, dev_view)
    assert any("kube-system/DaemonSet/dcgm-exporter: needs TCP 443" in f and "API server" in f for f in found), found


def test_the_old_kube_system_exemption_would_not_see_the_exporter(dev_view, monkeypatch):
    """Negative control for the contract itself: before, every kube-system pod was skipped as the platform's, so an
    exporter open to every pod passed."""
    from eks_ddp.tooling.contracts import network

    ms = _with_charts(dev_view)
    policy(ms, "dcgm-exporter")["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {}}]
    monkeypatch.setattr(network, "_platform", lambda pod: pod.namespace == "kube-system")
    assert [f for f in run(ms, dev_view) if "dcgm-exporter" in f] == []
