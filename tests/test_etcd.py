"""EtcdRendezvous alone under mocks: peer configuration, NetworkPolicy, hardening, validation."""

from __future__ import annotations

import pulumi
import pytest

from components.elastic_job import EVALUATE_LABELS, PREPARE_LABELS, TRAINER_LABELS
from components.etcd import CLIENT_PORT, DEFAULT_CLIENT_LABELS, PEER_PORT, EtcdRendezvous, EtcdRendezvousArgs
from components.mocks import ProgramResult, run_program

SYSTEM = {"eks-ddp/pool": "system"}


def run_etcd(**overrides) -> ProgramResult:
    def program() -> None:
        args = {"namespace": "training", "node_selector": SYSTEM, **overrides}
        etcd = EtcdRendezvous("rendezvous", EtcdRendezvousArgs(**args))
        pulumi.export("endpoint", etcd.endpoint)

    return run_program({}, program=program)


def statefulset(result: ProgramResult) -> dict:
    return result.one("kubernetes:apps/v1:StatefulSet").inputs


def container(result: ProgramResult) -> dict:
    return statefulset(result)["spec"]["template"]["spec"]["containers"][0]


def flags(result: ProgramResult) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container(result)["args"])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_three_members_bootstrap_from_stable_dns_names():
    result = run_etcd(replicas=3)
    sts = statefulset(result)
    assert int(sts["spec"]["replicas"]) == 3
    # Members must start together: OrderedReady would deadlock on quorum.
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    peers = result.one("kubernetes:core/v1:Service", "rendezvous-etcd-peers").inputs
    assert sts["spec"]["serviceName"] == peers["metadata"]["name"] == "rendezvous-etcd-peers"
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True
    assert {int(p["port"]) for p in peers["spec"]["ports"]} == {CLIENT_PORT, PEER_PORT}

    f = flags(result)
    dns = "rendezvous-etcd-peers.training.svc.cluster.local"
    assert f["initial-cluster"] == ",".join(
        f"rendezvous-etcd-{i}=http://rendezvous-etcd-{i}.{dns}:{PEER_PORT}" for i in range(3))
    assert f["initial-cluster-state"] == "new"
    assert f["name"] == "$(POD_NAME)"
    assert f["initial-advertise-peer-urls"] == f"http://$(POD_NAME).{dns}:{PEER_PORT}"
    assert f["listen-peer-urls"] == f"http://0.0.0.0:{PEER_PORT}"
    assert f["advertise-client-urls"] == f"http://$(POD_NAME).{dns}:{CLIENT_PORT}"
    assert f["enable-v2"] == "true"
    env = {e["name"]: e for e in container(result)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_single_member_by_default():
    result = run_etcd()
    assert int(statefulset(result)["spec"]["replicas"]) == 1
    assert flags(result)["initial-cluster"].count("=http://") == 1


def test_endpoint_is_the_client_service():
    result = run_etcd()
    svc = result.one("kubernetes:core/v1:Service", "rendezvous-etcd-client").inputs
    assert svc["spec"]["type"] == "ClusterIP"
    assert [int(p["port"]) for p in svc["spec"]["ports"]] == [CLIENT_PORT]
    assert result.outputs["endpoint"] == f"rendezvous-etcd.training.svc.cluster.local:{CLIENT_PORT}"


def test_network_policy_admits_only_trainer_pods_and_peers():
    result = run_etcd(replicas=3)
    policy = result.one("kubernetes:networking.k8s.io/v1:NetworkPolicy").inputs["spec"]
    pod_labels = statefulset(result)["spec"]["template"]["metadata"]["labels"]
    assert matches(policy["podSelector"]["matchLabels"], pod_labels)
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    by_port = {}
    for rule in policy["ingress"]:
        assert rule.get("from"), "an ingress rule without 'from' admits every source"
        for port in rule["ports"]:
            by_port[int(port["port"])] = rule["from"]
    assert set(by_port) == {CLIENT_PORT, PEER_PORT}
    # Client port: only pods with the trainer labels, same namespace (no namespaceSelector, no ipBlock).
    assert by_port[CLIENT_PORT] == [{"podSelector": {"matchLabels": dict(DEFAULT_CLIENT_LABELS)}}]
    assert matches(DEFAULT_CLIENT_LABELS, dict(TRAINER_LABELS))
    assert not matches(DEFAULT_CLIENT_LABELS, PREPARE_LABELS)
    assert not matches(DEFAULT_CLIENT_LABELS, EVALUATE_LABELS)
    # Peer port: only the members themselves.
    [peer] = by_port[PEER_PORT]
    assert matches(peer["podSelector"]["matchLabels"], pod_labels) and "namespaceSelector" not in peer


def test_custom_client_labels_reach_the_policy():
    result = run_etcd(client_labels={"team": "vision"})
    policy = result.one("kubernetes:networking.k8s.io/v1:NetworkPolicy").inputs["spec"]
    assert {"podSelector": {"matchLabels": {"team": "vision"}}} in [r["from"][0] for r in policy["ingress"]]


def test_members_are_hardened_probed_and_bounded():
    result = run_etcd()
    pod = statefulset(result)["spec"]["template"]["spec"]
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
    # Liveness checks the member alone: a lost quorum must not restart every member.
    assert c["livenessProbe"]["httpGet"]["path"] == "/health?serializable=true"
    [volume] = pod["volumes"]
    assert "emptyDir" in volume and volume["emptyDir"]["sizeLimit"]
    assert c["volumeMounts"][0]["name"] == volume["name"]
    assert flags(result)["data-dir"].startswith(c["volumeMounts"][0]["mountPath"])


def test_children_are_parented_to_the_component():
    result = run_etcd()
    children = [r for r in result.resources if r.type.startswith("kubernetes:")]
    assert sorted(r.type.split(":")[-1] for r in children) == [
        "NetworkPolicy", "Service", "Service", "ServiceAccount", "StatefulSet"]
    assert all(r.parent_type == "eks-ddp:etcd:EtcdRendezvous" for r in children)


@pytest.mark.parametrize("overrides, field", [
    ({"replicas": 2}, "replicas"),
    ({"replicas": 0}, "replicas"),
    ({"client_labels": {}}, "client_labels"),
    ({"image": "quay.io/coreos/etcd:v3.5.18"}, "image"),
])
def test_rejects_bad_args(overrides, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        run_etcd(**overrides)
