"""EtcdRendezvous alone under mocks: TLS with client certificates, a store a drain can move, NetworkPolicy,
hardening, validation; and the rendered flags run by a real etcd 3.5."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pulumi
import pytest

from eks_ddp.tooling.mocks import ProgramResult, run_program
from eks_ddp.tooling.plan import render_manifests
from eks_ddp.workloads.elastic_job import EVALUATE_LABELS, PREPARE_LABELS, TRAINER_LABELS
from eks_ddp.workloads.etcd import (
    CLIENT_PORT,
    DATA_DIR,
    DEFAULT_CLIENT_LABELS,
    METRICS_PORT,
    PEER_PORT,
    SERVER_LABELS,
    TLS_DIR,
    EtcdRendezvous,
    EtcdRendezvousArgs,
    etcd_args,
)
from eks_ddp_local.etcd_server import find_etcd, free_port, make_tls

SYSTEM = {"eks-ddp/pool": "system"}


def run_etcd(**overrides) -> ProgramResult:
    def program() -> None:
        args = {"namespace": "training", "node_selector": SYSTEM, **overrides}
        etcd = EtcdRendezvous("rendezvous", EtcdRendezvousArgs(**args))
        pulumi.export("endpoint", etcd.endpoint)
        pulumi.export("client_tls_secret", etcd.client_tls_secret)

    return run_program({}, program=program)


def member(result: ProgramResult) -> dict:
    return result.one("kubernetes:apps/v1:StatefulSet").inputs


def container(result: ProgramResult) -> dict:
    return member(result)["spec"]["template"]["spec"]["containers"][0]


def flags(result: ProgramResult) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container(result)["args"])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_one_member_serves_only_tls_with_client_certificates():
    # Review S1: plain HTTP without authentication, and agents unpickle what they read.
    result = run_etcd()
    f = flags(result)
    assert f["client-cert-auth"] == "true"
    assert (f["trusted-ca-file"], f["cert-file"], f["key-file"]) == (
        f"{TLS_DIR}/ca.crt", f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key")
    for key in ("listen-client-urls", "advertise-client-urls"):
        assert all(u.startswith("https://") for u in f[key].split(",")), f[key]
    # One member: its peer port listens on loopback only; the probes' plain listener serves no keys.
    for key in ("listen-peer-urls", "initial-advertise-peer-urls"):
        assert f[key] == f"http://127.0.0.1:{PEER_PORT}"
    assert f["listen-metrics-urls"] == f"http://0.0.0.0:{METRICS_PORT}"
    assert "enable-v2" not in f and f["initial-cluster-state"] == "new"  # the agents speak v3 only (E13)
    assert f["advertise-client-urls"] == f"https://rendezvous-etcd.training.svc.cluster.local:{CLIENT_PORT}"
    pod = member(result)["spec"]["template"]["spec"]
    [tls] = [v for v in pod["volumes"] if "secret" in v]
    [mount] = [m for m in container(result)["volumeMounts"] if m["name"] == tls["name"]]
    assert mount["mountPath"] == TLS_DIR and mount["readOnly"] is True
    server = result.one("kubernetes:core/v1:Secret", "rendezvous-etcd-tls-server").inputs
    assert tls["secret"]["secretName"] == server["metadata"]["name"] and int(tls["secret"]["defaultMode"]) == 0o440


def test_the_stack_makes_a_ca_a_server_and_a_client_certificate():
    result = run_etcd()
    server = result.one("tls:index/certRequest:CertRequest", "rendezvous-etcd-tls-server-csr").inputs
    assert "rendezvous-etcd.training.svc.cluster.local" in server["dnsNames"]
    assert "rendezvous-etcd.training.svc" in server["dnsNames"]
    certs = {r.name: r.inputs for r in result.of_type("tls:index/locallySignedCert:LocallySignedCert")}
    # The server certificate is also the v3 gateway's client certificate (its key is mounted in etcd's pod only; the
    # real-etcd check with its negative control: tests/runtime/test_rendezvous_store.py
    # ::test_the_v3_gateway_needs_a_server_certificate_that_may_be_a_client).
    assert {"server_auth", "client_auth"} <= set(certs["rendezvous-etcd-tls-server-cert"]["allowedUses"])
    assert "client_auth" in certs["rendezvous-etcd-tls-client-cert"]["allowedUses"]
    assert "server_auth" not in certs["rendezvous-etcd-tls-client-cert"]["allowedUses"]
    ca = result.one("tls:index/selfSignedCert:SelfSignedCert").inputs
    assert ca["isCaCertificate"] is True
    for key in result.of_type("tls:index/privateKey:PrivateKey"):
        assert key.inputs["algorithm"] == "ECDSA"
    secrets = {r.name: r.inputs for r in result.of_type("kubernetes:core/v1:Secret")}
    assert set(secrets) == {"rendezvous-etcd-tls-server", "rendezvous-etcd-tls-client"}
    for s in secrets.values():
        # pulumi-kubernetes marks stringData secret (the mocks see it wrapped in Pulumi's secret envelope).
        data = s["stringData"].get("value", s["stringData"])
        s["stringData"] = data
        assert s["type"] == "kubernetes.io/tls" and set(data) == {"tls.crt", "tls.key", "ca.crt"}
        assert "BEGIN PRIVATE KEY" in data["tls.key"] and "BEGIN CERTIFICATE" in data["ca.crt"]
        assert s["metadata"]["namespace"] == "training"
    # The CA's key never enters the cluster: no Secret carries it.
    ca_key = result.one("tls:index/privateKey:PrivateKey", "rendezvous-etcd-tls-ca-key")
    assert ca_key.name and all(v != "rendezvous-etcd-tls-ca-key" for s in secrets.values() for v in s["stringData"])
    assert result.outputs["client_tls_secret"] == "rendezvous-etcd-tls-client-tls"


def test_one_member_that_cannot_exist_twice_and_a_drain_moves_it():
    # E3: a one-replica Deployment replaced the member evicted from a node that had lost the control plane while it
    # still served: two stores, two worlds. A StatefulSet creates a pod of an identity only once the old one is gone.
    # Review K5: minAvailable 1 of 1 failed every system node-group update (PodEvictionFailure after 15 min).
    result = run_etcd()
    sts = member(result)
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert int(sts["spec"]["replicas"]) == 1 and sts["spec"]["podManagementPolicy"] == "OrderedReady"
    assert sts["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert sts["spec"]["serviceName"] == "rendezvous-etcd"
    assert not result.of_type("kubernetes:apps/v1:Deployment")
    pdb = result.one("kubernetes:policy/v1:PodDisruptionBudget").inputs
    assert "minAvailable" not in pdb["spec"] and int(pdb["spec"]["maxUnavailable"]) >= 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    pod = sts["spec"]["template"]["spec"]
    # No short NoExecute tolerations: an eviction from a lost node replaces nothing and would only restart a store
    # that still serves; the defaults (300 s) apply.
    assert not [t for t in pod["tolerations"] if t.get("effect") == "NoExecute"]
    svc = result.one("kubernetes:core/v1:Service", "rendezvous-etcd-client").inputs
    assert svc["spec"]["publishNotReadyAddresses"] is True  # reachable while its node is NotReady
    priority = result.one("kubernetes:scheduling.k8s.io/v1:PriorityClass").inputs
    assert pod["priorityClassName"] == priority["metadata"]["name"]
    assert 0 < int(priority["value"]) < 2_000_000_000 and priority["globalDefault"] is False


def test_a_certificate_rotation_restarts_the_member():
    # T7: etcd reads its certificates at start; the pod template carries their fingerprint, so a rotation rolls it.
    from eks_ddp.workloads.etcd import CERT_ANNOTATION

    annotations = member(run_etcd())["spec"]["template"]["metadata"]["annotations"]
    assert re.fullmatch(r"[0-9a-f]{64}", annotations[CERT_ANNOTATION])


def test_members_carry_the_labels_the_trainers_egress_selects():
    pod_labels = member(run_etcd())["spec"]["template"]["metadata"]["labels"]
    assert matches(SERVER_LABELS, pod_labels)


def _run_member(args: list[str], data_dir: Path, log: Path, tls_dir: Path,
                pod_uid: str = "8c1f4e2a-0000-4000-8000-000000000001") -> tuple[subprocess.Popen, str]:
    """The StatefulSet's member, with its flags as rendered, on loopback: DNS names, ports and the Secret's
    mount point rewritten, ``$(POD_UID)`` expanded as the kubelet does from the pod's env (a new UID per pod);
    the Secret's files are a throw-away CA's (server certificate for 127.0.0.1)."""
    client, peer, metrics = free_port(), free_port(), free_port()
    subst = {"rendezvous-etcd.training.svc.cluster.local": "127.0.0.1", "0.0.0.0": "127.0.0.1",
             f":{CLIENT_PORT}": f":{client}", f":{PEER_PORT}": f":{peer}", f":{METRICS_PORT}": f":{metrics}",
             DATA_DIR: str(data_dir), f"{TLS_DIR}/tls.": f"{tls_dir}/server.", TLS_DIR: str(tls_dir),
             "$(POD_UID)": pod_uid}
    flags = []
    for a in args:
        for old, new in subst.items():
            a = a.replace(old, new)
        flags.append(a)
    assert not [f for f in flags if "cluster.local" in f or TLS_DIR in f or "$(" in f]
    with open(log, "ab") as out:
        proc = subprocess.Popen([find_etcd(), *flags], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:  # the probes' path: plain HTTP on the metrics listener
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/health", timeout=1) as r:
                if b'"true"' in r.read():
                    break
        except OSError:
            time.sleep(0.1)
    return proc, f"127.0.0.1:{client}"


def _kv(endpoint: str, key: str, value: str | None = None, context=None) -> str | None:
    """Put ``value`` at ``key`` (or read it, None when absent) through etcd's v3 JSON API, as the agents do."""
    import base64

    b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    body = {"key": b64(key), **({} if value is None else {"value": b64(value)})}
    req = urllib.request.Request(f"https://{endpoint}/v3/kv/{'range' if value is None else 'put'}",
                                 data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5, context=context) as r:
        kvs = json.loads(r.read()).get("kvs") or []
    return base64.b64decode(kvs[0]["value"]).decode() if value is None and kvs else value if value is not None else None


def _cluster_id(endpoint: str, context) -> str:
    """The store's cluster ID, as etcd reports it in every v3 response header."""
    req = urllib.request.Request(f"https://{endpoint}/v3/maintenance/status", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5, context=context) as r:
        return json.loads(r.read())["header"]["cluster_id"]


@pytest.mark.slow
def test_the_member_requires_client_certificates_and_survives_its_restart_and_rescheduling(tmp_path):
    # etcd 3.5.1 with the StatefulSet's own flags: a request without a client certificate is refused; a
    # container restart (same pod, same data dir) keeps the keys and the cluster ID; a new pod (a new UID, a new
    # empty emptyDir) starts a fresh one-member store with a cluster ID of its own instead of crash-looping.
    import ssl

    args = etcd_args("rendezvous-etcd", "training")
    data, log = tmp_path / "data", tmp_path / "etcd.log"
    tls = make_tls(tmp_path / "tls")
    ok = tls.client_context()
    procs: list[subprocess.Popen] = []
    try:
        proc, endpoint = _run_member(args, data, log, tls.ca_cert.parent)
        procs.append(proc)
        assert proc.poll() is None, log.read_text()
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _kv(endpoint, "torch/elastic/rendezvous/job/state", "evil",
                ssl.create_default_context(cafile=str(tls.ca_cert)))
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(f"http://{endpoint}/v3/kv/range", data=b"{}", timeout=5).close()
        _kv(endpoint, "torch/elastic/rendezvous/job/state", "round-7", ok)
        first_id = _cluster_id(endpoint, ok)
        proc.kill()
        proc.wait(timeout=10)

        proc, endpoint = _run_member(args, data, log, tls.ca_cert.parent)  # container restart: emptyDir kept
        procs.append(proc)
        assert proc.poll() is None, log.read_text()[-2000:]
        assert _kv(endpoint, "torch/elastic/rendezvous/job/state", context=ok) == "round-7"
        assert _cluster_id(endpoint, ok) == first_id
        proc.kill()
        proc.wait(timeout=10)

        shutil.rmtree(data)  # a new pod: a new emptyDir and a new UID
        proc, endpoint = _run_member(args, data, log, tls.ca_cert.parent, "8c1f4e2a-0000-4000-8000-000000000002")
        procs.append(proc)
        assert proc.poll() is None, log.read_text()[-2000:]
        assert _kv(endpoint, "torch/elastic/rendezvous/job/state", context=ok) is None
        assert _cluster_id(endpoint, ok) != first_id  # a client can tell the new, empty store from the old one
        _kv(endpoint, "torch/elastic/rendezvous/job/state", "round-0", ok)
        assert _kv(endpoint, "torch/elastic/rendezvous/job/state", context=ok) == "round-0"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def test_endpoint_is_the_client_service():
    result = run_etcd()
    svc = result.one("kubernetes:core/v1:Service", "rendezvous-etcd-client").inputs
    assert svc["spec"]["type"] == "ClusterIP"
    assert [int(p["port"]) for p in svc["spec"]["ports"]] == [CLIENT_PORT]
    assert result.outputs["endpoint"] == f"rendezvous-etcd.training.svc.cluster.local:{CLIENT_PORT}"


def test_network_policy_admits_only_trainer_pods():
    result = run_etcd()
    policy = result.one("kubernetes:networking.k8s.io/v1:NetworkPolicy").inputs["spec"]
    pod_labels = member(result)["spec"]["template"]["metadata"]["labels"]
    assert matches(policy["podSelector"]["matchLabels"], pod_labels)
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    by_port = {}
    for rule in policy["ingress"]:
        assert rule.get("from"), "an ingress rule without 'from' admits every source"
        for port in rule["ports"]:
            by_port[int(port["port"])] = rule["from"]
    assert set(by_port) == {CLIENT_PORT}
    # Client port: only pods with the trainer labels, same namespace (no namespaceSelector, no ipBlock).
    assert by_port[CLIENT_PORT] == [{"podSelector": {"matchLabels": dict(DEFAULT_CLIENT_LABELS)}}]
    assert matches(DEFAULT_CLIENT_LABELS, dict(TRAINER_LABELS))
    assert not matches(DEFAULT_CLIENT_LABELS, PREPARE_LABELS)
    assert not matches(DEFAULT_CLIENT_LABELS, EVALUATE_LABELS)
    # One member talks to nobody.
    assert policy.get("egress", []) == []


def test_custom_client_labels_reach_the_policy():
    result = run_etcd(client_labels={"team": "vision"})
    policy = result.one("kubernetes:networking.k8s.io/v1:NetworkPolicy").inputs["spec"]
    assert {"podSelector": {"matchLabels": {"team": "vision"}}} in [r["from"][0] for r in policy["ingress"]]


def test_members_are_hardened_probed_and_bounded():
    result = run_etcd()
    pod = member(result)["spec"]["template"]["spec"]
    c = container(result)
    assert "@sha256:" in c["image"] and c["imagePullPolicy"] == "IfNotPresent"
    assert pod["nodeSelector"] == SYSTEM
    assert pod["automountServiceAccountToken"] is False
    sa = result.one("kubernetes:core/v1:ServiceAccount").inputs
    assert pod["serviceAccountName"] == sa["metadata"]["name"] and sa["automountServiceAccountToken"] is False
    psc, csc = pod["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and int(psc["runAsUser"]) >= 10000
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"]["drop"] == ["ALL"]
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) == {"cpu", "memory"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health?serializable=true"
    assert {c["readinessProbe"]["httpGet"]["port"], c["livenessProbe"]["httpGet"]["port"]} == {"metrics"}
    [volume] = [v for v in pod["volumes"] if "emptyDir" in v]
    assert volume["emptyDir"]["sizeLimit"]
    [mount] = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert flags(result)["data-dir"].startswith(mount["mountPath"])


def test_children_are_parented_to_the_component():
    result = run_etcd()
    children = [r for r in result.resources if r.type.startswith("kubernetes:") and r.type != "kubernetes:core/v1:Secret"]
    assert sorted(r.type.split(":")[-1] for r in children) == [
        "NetworkPolicy", "PodDisruptionBudget", "PriorityClass", "ResourceQuota", "Service", "ServiceAccount",
        "StatefulSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert all(r.parent_type == "eks-ddp:etcd:EtcdRendezvous" for r in children)
    certs = [r for r in result.resources if r.type.startswith("tls:") or r.type == "kubernetes:core/v1:Secret"]
    assert len(certs) == 2 + 2 * 3 + 2  # the CA's key and certificate; key, request, certificate per leaf; 2 Secrets
    assert all(r.parent_type == "eks-ddp:etcd_tls:RendezvousTls" for r in certs)


@pytest.mark.parametrize("overrides, field", [
    ({"replicas": 2}, "replicas"),
    ({"replicas": 0}, "replicas"),
    # Finding B-6: 3 members on emptyDir crash-loop once a member is rescheduled ("already bootstrapped").
    ({"replicas": 3}, "replicas"),
    ({"client_labels": {}}, "client_labels"),
    ({"more_client_labels": [{"app.kubernetes.io/instance": "training-run-1-fabric"}, {}]}, "more_client_labels"),
    ({"image": "quay.io/coreos/etcd:v3.5.18"}, "image"),
])
def test_rejects_bad_args(overrides, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        run_etcd(**overrides)


def drain_allowed(pdb_spec: dict, replicas: int) -> bool:
    """Whether a PodDisruptionBudget lets a drain evict one pod of a healthy workload of ``replicas`` pods."""
    def count(v) -> int:
        return -(-int(str(v).rstrip("%")) * replicas // 100) if str(v).endswith("%") else int(v)
    if "maxUnavailable" in pdb_spec:
        return count(pdb_spec["maxUnavailable"]) >= 1
    return count(pdb_spec.get("minAvailable", 0)) < replicas


def test_drain_allowed_sees_a_blocking_budget():
    # Negative control: the budget 22dfc96 shipped (minAvailable 1 of 1 member) blocks every drain.
    assert not drain_allowed({"minAvailable": 1}, 1)
    assert not drain_allowed({"maxUnavailable": 0}, 3)
    assert not drain_allowed({"minAvailable": "100%"}, 2)
    assert drain_allowed({"minAvailable": 1}, 2) and drain_allowed({"maxUnavailable": 1}, 1)


@pytest.mark.parametrize("stack", ["dev", "p4de"])
def test_no_budget_of_the_stack_blocks_a_system_node_group_update(stack, dev_result, p4de_result):
    # Review K5 / A4: an EKS managed node-group update drains every node; a pod it cannot evict within
    # 15 minutes fails the update (PodEvictionFailure) and `pulumi up` with it.
    from eks_ddp.tooling.plan import render_manifests

    docs = render_manifests(dev_result if stack == "dev" else p4de_result)
    workloads = [m for m in docs if m["kind"] in ("Deployment", "StatefulSet", "ReplicaSet")]
    budgets = [m for m in docs if m["kind"] == "PodDisruptionBudget"]
    assert budgets, "the rendezvous store's budget is rendered"
    for pdb in budgets:
        selected = [w for w in workloads if w["metadata"].get("namespace") == pdb["metadata"].get("namespace")
                    and matches(pdb["spec"]["selector"]["matchLabels"], w["spec"]["template"]["metadata"]["labels"])]
        assert selected, f"budget {pdb['metadata']['name']} selects no workload"
        for w in selected:
            assert drain_allowed(pdb["spec"], int(w["spec"].get("replicas", 1))), (pdb, w["metadata"]["name"])


@pytest.mark.parametrize("stack", ["dev_result", "p4de_result"])
def test_clients_egress_admits_the_store_service_clusterip(stack, request):
    # The EKS network policy controller puts a Service's ClusterIP into an egress rule only if the rule's
    # podSelector matches the Service's spec.selector as a label set (amazon-network-policy-controller-k8s,
    # pkg/resolvers/endpoints.go getMatchingServiceClusterIPs); the agents dial the ClusterIP.
    manifests = render_manifests(request.getfixturevalue(stack))
    [svc] = [m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"] == "rendezvous-etcd"]
    rules = [(p["metadata"]["name"], r) for p in manifests if p["kind"] == "NetworkPolicy"
             for r in p["spec"].get("egress", []) if any(q.get("port") == CLIENT_PORT for q in r.get("ports", []))]
    assert rules
    for name, rule in rules:
        for peer in rule["to"]:
            assert matches(peer["podSelector"]["matchLabels"], svc["spec"]["selector"]), name


def test_certificates_expire_apart_and_leaf_keys_are_remade_each_period():
    # T7: the CA and both leaves lasted two years and expired together; the keys were never re-made.
    from eks_ddp.workloads.etcd_tls import CA_VALIDITY_HOURS, VALIDITY_HOURS, rotation_period

    result = run_etcd()
    ca = result.one("tls:index/selfSignedCert:SelfSignedCert").inputs
    certs = {r.name: r.inputs for r in result.of_type("tls:index/locallySignedCert:LocallySignedCert")}
    server, client = certs["rendezvous-etcd-tls-server-cert"], certs["rendezvous-etcd-tls-client-cert"]
    lives = [int(ca["validityPeriodHours"]), int(server["validityPeriodHours"]), int(client["validityPeriodHours"])]
    assert lives == [CA_VALIDITY_HOURS, VALIDITY_HOURS, VALIDITY_HOURS * 2 // 3] and len(set(lives)) == 3
    assert int(server["validityPeriodHours"]) <= 397 * 24  # a leaf's ceiling
    for leaf in (server, client):  # renewed on any `up` in the last third of its life
        assert int(leaf["earlyRenewalHours"]) == int(leaf["validityPeriodHours"]) // 3
    keys = {r.name: r for r in result.of_type("tls:index/privateKey:PrivateKey")}
    assert keys["rendezvous-etcd-tls-server-key"].replacement_trigger == rotation_period(3)
    assert keys["rendezvous-etcd-tls-client-key"].replacement_trigger == rotation_period(2)
    assert keys["rendezvous-etcd-tls-ca-key"].replacement_trigger is None  # re-made with the CA's renewal


def test_rotation_periods_change_at_their_boundaries_only():
    import datetime as dt

    from eks_ddp.workloads.etcd_tls import rotation_period

    assert rotation_period(3, dt.date(2026, 7, 1)) == rotation_period(3, dt.date(2026, 9, 30)) == "2026-p7"
    assert rotation_period(3, dt.date(2026, 10, 1)) == "2026-p10" != rotation_period(3, dt.date(2026, 9, 30))
    assert rotation_period(2, dt.date(2027, 2, 28)) == "2027-p1" and rotation_period(2, dt.date(2027, 3, 1)) == "2027-p3"


def _write_at_a_steady_rate(client, seconds: float) -> Exception | None:
    """4 KB values at ~50 writes/s for ``seconds`` (~200 KB/s: the history a fleet's re-forms write, sped up); the
    store's first refusal, or None."""
    from eks_ddp_runtime.rendezvous.etcd_client import EtcdAnswerError

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            client.put(b"/torch/elastic/rendezvous/soak", b"x" * 4000)
        except EtcdAnswerError as e:
            return e
        time.sleep(0.02)
    return None


@pytest.mark.slow
def test_the_rendered_compaction_keeps_a_tiny_quota_from_filling_and_a_full_store_is_named(tmp_path, caplog):
    # The rendered flags with the quota and the compaction period scaled down 256x (1 MiB, 1 s): 2 MB written
    # over 10 s leave the store far from its quota. The same store without the compaction flags (the flags before
    # this change: the negative control) fills within seconds, and an agent's call then logs one line naming the
    # NOSPACE alarm and its fix.
    import logging

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    from eks_ddp.core.rendezvous_store import store_size
    from eks_ddp_runtime.rendezvous.etcd_backend import NO_SPACE_LINE, Retrier
    from eks_ddp_runtime.rendezvous.etcd_client import NO_SPACE, EtcdV3Client

    size = store_size(2).scaled(256)
    tls = make_tls(tmp_path / "tls")
    for compacted in (True, False):
        args = etcd_args("rendezvous-etcd", "training", size)
        assert {"--auto-compaction-mode=periodic", f"--auto-compaction-retention={size.compaction_retention}",
                f"--quota-backend-bytes={1 << 20}"} <= set(args)
        if not compacted:
            args = [a for a in args if "auto-compaction" not in a]
        run = tmp_path / f"compacted-{compacted}"
        run.mkdir()
        proc, endpoint = _run_member(args, run / "data", run / "etcd.log", tls.ca_cert.parent)
        try:
            assert proc.poll() is None, (run / "etcd.log").read_text()[-2000:]
            host, port = endpoint.split(":")
            client = EtcdV3Client(host, int(port), read_timeout=5, context=tls.client_context())
            refused = _write_at_a_steady_rate(client, 10)
            status = client.call("maintenance/status", {})
            if compacted:
                assert refused is None and int(status["dbSize"]) < (1 << 20) // 2, status
                assert not client.call("maintenance/alarm", {"action": "GET"}).get("alarms")
                continue
            assert refused is not None and NO_SPACE in str(refused), refused
            params = RendezvousParameters(backend="eks-etcd", endpoint=endpoint, run_id="full", min_nodes=1,
                                          max_nodes=1, protocol="https", ca_cert=str(tls.ca_cert),
                                          ssl_cert=str(tls.client_cert), ssl_cert_key=str(tls.client_key))
            caplog.set_level(logging.ERROR, logger="training.rendezvous")
            with pytest.raises(RendezvousConnectionError):
                Retrier(params, 1.5)("set_state", lambda c: c.put(b"/torch/elastic/rendezvous/full", b"{}"))
            lines = [r.getMessage() for r in caplog.records if "NOSPACE" in r.getMessage()]
            assert lines == [NO_SPACE_LINE], lines
        finally:
            proc.kill()
            proc.wait(timeout=10)
