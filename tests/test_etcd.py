"""EtcdRendezvous alone under mocks: peer configuration, NetworkPolicy, hardening, validation."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pulumi
import pytest

from components.elastic_job import EVALUATE_LABELS, PREPARE_LABELS, TRAINER_LABELS
from components.etcd import (
    CLIENT_PORT,
    DATA_DIR,
    DEFAULT_CLIENT_LABELS,
    PEER_PORT,
    SERVER_LABELS,
    EtcdRendezvous,
    EtcdRendezvousArgs,
    etcd_args,
)
from components.mocks import ProgramResult, run_program
from training.etcd_local import find_etcd, free_port

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


def test_one_member_bootstraps_from_its_stable_dns_name():
    result = run_etcd()
    sts = statefulset(result)
    assert int(sts["spec"]["replicas"]) == 1
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    peers = result.one("kubernetes:core/v1:Service", "rendezvous-etcd-peers").inputs
    assert sts["spec"]["serviceName"] == peers["metadata"]["name"] == "rendezvous-etcd-peers"
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True
    assert {int(p["port"]) for p in peers["spec"]["ports"]} == {CLIENT_PORT, PEER_PORT}

    f = flags(result)
    dns = "rendezvous-etcd-peers.training.svc.cluster.local"
    assert f["initial-cluster"] == f"rendezvous-etcd-0=http://rendezvous-etcd-0.{dns}:{PEER_PORT}"
    assert f["initial-cluster-state"] == "new"
    assert f["name"] == "$(POD_NAME)"
    assert f["initial-advertise-peer-urls"] == f"http://$(POD_NAME).{dns}:{PEER_PORT}"
    assert f["advertise-client-urls"] == f"http://$(POD_NAME).{dns}:{CLIENT_PORT}"
    assert f["enable-v2"] == "true"
    env = {e["name"]: e for e in container(result)["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_the_member_is_neither_drained_nor_evicted_first():
    # Finding B-5: no PodDisruptionBudget, no priority; a drain took the only member freely.
    result = run_etcd()
    pod_labels = statefulset(result)["spec"]["template"]["metadata"]["labels"]
    pdb = result.one("kubernetes:policy/v1:PodDisruptionBudget").inputs
    assert int(pdb["spec"]["minAvailable"]) == 1
    assert matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["metadata"]["namespace"] == "training"
    priority = result.one("kubernetes:scheduling.k8s.io/v1:PriorityClass").inputs
    assert statefulset(result)["spec"]["template"]["spec"]["priorityClassName"] == priority["metadata"]["name"]
    assert 0 < int(priority["value"]) < 2_000_000_000 and priority["globalDefault"] is False


def test_members_carry_the_labels_the_trainers_egress_selects():
    pod_labels = statefulset(run_etcd())["spec"]["template"]["metadata"]["labels"]
    assert matches(SERVER_LABELS, pod_labels)


def _run_member(args: list[str], data_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """The StatefulSet's member, with its flags as rendered, on loopback: DNS names and ports rewritten."""
    client, peer = free_port(), free_port()
    host = "rendezvous-etcd-0.rendezvous-etcd-peers.training.svc.cluster.local"
    subst = {"$(POD_NAME)": "rendezvous-etcd-0", host: "127.0.0.1", "0.0.0.0": "127.0.0.1",
             f":{CLIENT_PORT}": f":{client}", f":{PEER_PORT}": f":{peer}", DATA_DIR: str(data_dir)}
    flags = []
    for a in args:
        for old, new in subst.items():
            a = a.replace(old, new)
        flags.append(a)
    assert not [f for f in flags if "cluster.local" in f]
    with open(log, "ab") as out:
        proc = subprocess.Popen([find_etcd(), *flags], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"127.0.0.1:{client}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1) as r:
                if b'"true"' in r.read():
                    break
        except OSError:
            time.sleep(0.1)
    return proc, endpoint


def _v2(endpoint: str, key: str, value: str | None = None) -> str | None:
    data = None if value is None else urllib.parse.urlencode({"value": value}).encode()
    req = urllib.request.Request(f"http://{endpoint}/v2/keys/{key}", data=data, method="GET" if data is None else "PUT")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())["node"]["value"]
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


@pytest.mark.slow
def test_the_member_survives_its_restart_and_its_rescheduling(tmp_path):
    # etcd 3.5.1 with the StatefulSet's own flags: a container restart (same data dir) keeps the v2 keys; a
    # rescheduled pod (a new, empty emptyDir) starts a fresh one-member store instead of crash-looping.
    args = etcd_args("rendezvous-etcd", "rendezvous-etcd-peers", "training", 1)
    data, log = tmp_path / "data", tmp_path / "etcd.log"
    procs: list[subprocess.Popen] = []
    try:
        proc, endpoint = _run_member(args, data, log)
        procs.append(proc)
        assert proc.poll() is None, log.read_text()
        _v2(endpoint, "torch/elastic/rendezvous/job/state", "round-7")
        proc.kill()
        proc.wait(timeout=10)

        proc, endpoint = _run_member(args, data, log)  # container restart: the emptyDir is kept
        procs.append(proc)
        assert proc.poll() is None, log.read_text()[-2000:]
        assert _v2(endpoint, "torch/elastic/rendezvous/job/state") == "round-7"
        proc.kill()
        proc.wait(timeout=10)

        shutil.rmtree(data)  # rescheduled pod: a new emptyDir
        proc, endpoint = _run_member(args, data, log)
        procs.append(proc)
        assert proc.poll() is None, log.read_text()[-2000:]
        assert _v2(endpoint, "torch/elastic/rendezvous/job/state") is None
        _v2(endpoint, "torch/elastic/rendezvous/job/state", "round-0")
        assert _v2(endpoint, "torch/elastic/rendezvous/job/state") == "round-0"
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


def test_network_policy_admits_only_trainer_pods_and_peers():
    result = run_etcd()
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
    # Egress names its destinations: the member itself (peer port) and the cluster DNS.
    for rule in policy["egress"]:
        assert rule.get("to"), f"egress rule without a destination: {rule}"


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
        "NetworkPolicy", "PodDisruptionBudget", "PriorityClass", "ResourceQuota", "Service", "Service", "ServiceAccount",
        "StatefulSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert all(r.parent_type == "eks-ddp:etcd:EtcdRendezvous" for r in children)


@pytest.mark.parametrize("overrides, field", [
    ({"replicas": 2}, "replicas"),
    ({"replicas": 0}, "replicas"),
    # Finding B-6: 3 members on emptyDir crash-loop once a member is rescheduled ("already bootstrapped").
    ({"replicas": 3}, "replicas"),
    ({"client_labels": {}}, "client_labels"),
    ({"image": "quay.io/coreos/etcd:v3.5.18"}, "image"),
])
def test_rejects_bad_args(overrides, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        run_etcd(**overrides)
