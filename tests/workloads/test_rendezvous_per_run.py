"""Every etcd run of a stack has a rendezvous store of its own: its own CA and client certificate, Service and
NetworkPolicy. A run's pods mount only their store's client certificate and reach only their store, and a store
admits only its run's pods, so code in one run (a custom workload included) can neither read nor write another
run's rendezvous state, which that run's agents unpickle (torch ``dynamic_rendezvous.py`` ``_sync``)."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error

import pytest

from eks_ddp.config import ConfigError, load_stack_config
from eks_ddp.tooling.plan import render_manifests
from tests.config.test_runs import DIGEST, with_runs
from tests.support.util import run

STORE = "eks-ddp:etcd:EtcdRendezvous"
JOB = "kubernetes:batch/v1:Job"


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.fixture(scope="module")
def two_runs():
    cfg = with_runs({"runId": "a", "nodes": 1, "fabricCheck": True},
                    {"runId": "b", "nodes": 1, "fabricCheck": True,
                     "workload": {"image": DIGEST, "module": "bert.train"}})
    return run(cfg)


def _pods_by_run(result) -> dict[str, list[dict]]:
    """Each run's training pod template (rendered; its init container runs the fabric check), by runId."""
    out: dict[str, list[dict]] = {"a": [], "b": []}
    for m in render_manifests(result):
        if m["kind"] != "Job":
            continue
        name = m["metadata"]["name"]
        owner = "b" if name.startswith("training-b-") else "a"
        if m["metadata"]["labels"].get("app.kubernetes.io/component") == "train":
            out[owner].append(m["spec"]["template"])
    return out


def test_two_runs_get_two_stores_and_each_runs_pods_mount_only_their_own_certificate(two_runs):
    stores = sorted(r.name for r in two_runs.of_type(STORE))
    assert stores == ["rendezvous", "rendezvous-b"]
    pods = _pods_by_run(two_runs)
    assert [len(pods["a"]), len(pods["b"])] == [1, 1]  # each run's training pods, the fabric check their first phase
    secrets = {"a": "rendezvous-etcd-tls-client-tls", "b": "rendezvous-b-etcd-tls-client-tls"}
    endpoints = {"a": "rendezvous-etcd.training.svc", "b": "rendezvous-b-etcd.training.svc"}
    for run_id, templates in pods.items():
        for t in templates:
            mounted = {v["secret"]["secretName"] for v in t["spec"]["volumes"] if "secret" in v}
            assert mounted == {secrets[run_id]}, (run_id, mounted)
            [init] = t["spec"]["initContainers"]  # the fabric check reaches the run's own store too
            for c in (t["spec"]["containers"][0], init):
                command = " ".join(c["command"])
                assert f"--rdzv-endpoint={endpoints[run_id]}" in command, command


def test_each_store_admits_only_its_runs_pods_and_each_run_reaches_only_its_store(two_runs):
    docs = render_manifests(two_runs)
    pods = _pods_by_run(two_runs)
    everyone = [(run_id, t["metadata"]["labels"]) for run_id, ts in pods.items() for t in ts]
    store_pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
                  for d in docs if d["kind"] == "StatefulSet"}
    owner = {"rendezvous-etcd": "a", "rendezvous-b-etcd": "b"}
    assert set(store_pods) == set(owner)
    checked = []
    for d in docs:
        if d["kind"] != "NetworkPolicy" or d["metadata"]["name"] not in owner:
            continue
        checked.append(d["metadata"]["name"])
        peers = [p["podSelector"]["matchLabels"] for rule in d["spec"]["ingress"] for p in rule["from"]]
        admitted = {run_id for run_id, labels in everyone if any(_matches(p, labels) for p in peers)}
        assert admitted == {owner[d["metadata"]["name"]]}, (d["metadata"]["name"], peers)
        # every pod of that run (training, whose init container runs the fabric check) is admitted
        assert all(any(_matches(p, t["metadata"]["labels"]) for p in peers) for t in pods[owner[d["metadata"]["name"]]])
    assert sorted(checked) == sorted(owner)
    checked = []
    services = {d["metadata"]["name"]: d["spec"]["selector"] for d in docs
                if d["kind"] == "Service" and d["metadata"]["name"] in owner}
    for d in docs:
        if d["kind"] != "NetworkPolicy" or d["metadata"]["name"] not in ("training-train", "training-b-train"):
            continue
        checked.append(d["metadata"]["name"])
        run_id = "b" if "-b-" in d["metadata"]["name"] else "a"
        to_etcd = [p["podSelector"]["matchLabels"] for rule in d["spec"]["egress"]
                   if any(port.get("port") == 2379 for port in rule.get("ports") or [])
                   for p in rule["to"]]
        reached = {owner[name] for name, labels in store_pods.items() if any(_matches(s, labels) for s in to_etcd)}
        assert reached == {run_id}, (d["metadata"]["name"], to_etcd)
        # the selector is the store Service's own, the label set the VPC CNI policy agent resolves a ClusterIP for
        assert any(s == services[next(n for n, o in owner.items() if o == run_id)] for s in to_etcd)
    assert len(checked) == 2, checked


def test_the_one_run_stacks_keep_their_store_names(dev_result, p4de_result):
    for result in (dev_result, p4de_result):
        [store] = result.of_type(STORE)
        assert store.name == "rendezvous"
        [train] = [j for j in result.of_type(JOB) if j.name == "training-train"]
        volumes = train.inputs["spec"]["template"]["spec"]["volumes"]
        assert {v["secret"]["secretName"] for v in volumes if "secret" in v} == {"rendezvous-etcd-tls-client-tls"}


def test_a_later_runs_run_id_must_leave_room_for_its_stores_names():
    def load(run_id: str, backend: str = "etcd"):
        raw = with_runs({"runId": "a", "nodes": 1}, {"runId": run_id, "nodes": 1, "rdzvBackend": backend})
        return load_stack_config({k: v if isinstance(v, str) else json.dumps(v)
                                  for k, v in raw.items() if k.startswith("eks-ddp:")},
                                 region="us-west-2", stack="dev")
    load("b" * 33)
    with pytest.raises(ConfigError) as err:
        load("b" * 34)
    assert "runs[1].runId: got 'bbbb" in str(err.value) and "at most 33" in str(err.value)
    load("b" * 34, "c10d")  # control: no store of its own


@pytest.mark.slow
def test_a_runs_store_refuses_another_runs_client_certificate(tmp_path):
    """Two stores from two CAs, as two runs get them: run B's certificate is refused by run A's store (real etcd
    with the Deployment's flags), run A's own is accepted."""
    from eks_ddp.workloads.etcd import etcd_args
    from eks_ddp_local.etcd_server import make_tls
    from tests.workloads.test_etcd import _kv, _run_member

    a, b = make_tls(tmp_path / "a"), make_tls(tmp_path / "b")
    proc: subprocess.Popen | None = None
    try:
        proc, endpoint = _run_member(etcd_args("rendezvous-etcd", "training"), tmp_path / "data",
                                     tmp_path / "etcd.log", a.ca_cert.parent)
        assert proc.poll() is None, (tmp_path / "etcd.log").read_text()
        _kv(endpoint, "torch/elastic/rendezvous/a/state", "round-1", a.client_context())
        foreign = b.client_context()
        foreign.load_verify_locations(cafile=str(a.ca_cert))  # B trusts A's server; A must still refuse B
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _kv(endpoint, "torch/elastic/rendezvous/a/state", "evil", foreign)
        assert _kv(endpoint, "torch/elastic/rendezvous/a/state", context=a.client_context()) == "round-1"
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
