"""Kueue installed by the stack (components/eks_ddp/infra/kueue.py): the pinned OCI chart, the controller image by
digest and no other image, the system nodes, a restricted namespace whose pods meet the profile, the manager config,
strict-schema manifests, NetworkPolicies the network contract accepts, and the ProvisioningRequest CRD ordering.

The chart's objects are rebuilt from the recorded release by the chart model (tooling/contracts/charts.py ``kueue``),
as the network contract sees them; each property has a negative control."""

from __future__ import annotations

import copy
import json
import subprocess
from ipaddress import IPv4Network as Net
from pathlib import Path

import pulumi_kubernetes as k8s
import pytest
import yaml
from kubernetes_validate import validate

import eks_ddp
from eks_ddp.core import k8s_versions
from eks_ddp.infra import kueue
from eks_ddp.infra.autoscaler import ClusterAutoscaler, ClusterAutoscalerArgs
from eks_ddp.tooling.contracts.charts import kueue as chart_objects
from eks_ddp.tooling.contracts.charts import rendered_by_charts
from eks_ddp.tooling.contracts.identity import DIGEST
from eks_ddp.tooling.contracts.network import check_manifests
from eks_ddp.tooling.mocks import ProgramResult, run_program
from eks_ddp.tooling.plan import render_manifests, write_manifests
from eks_ddp.workloads.namespace import POD_SECURITY_LABELS
from tests.support.util import ROOT

RELEASE = "kubernetes:helm.sh/v3:Release"
VPC = "10.0.0.0/16"
SYSTEM = {"eks-ddp/pool": "system"}


def args(**kw) -> kueue.KueueArgs:
    return kueue.KueueArgs(**{"node_selector": SYSTEM, "managed_namespaces": ["training"], "vpc_cidrs": [VPC], **kw})


def build(provreq: bool = False, **kw) -> ProgramResult:
    def program() -> None:
        crd = None
        if provreq:
            scaler = ClusterAutoscaler("autoscaler", ClusterAutoscalerArgs(
                cluster_name="c", region="us-west-2", oidc_provider_arn="arn", oidc_provider_url="url",
                node_selector=SYSTEM, provisioning_requests=True))
            crd = scaler.provisioning_request_crd
        kueue.Kueue("kueue", args(provisioning_request_crd=crd, **kw))
    return run_program({}, program=program)


@pytest.fixture(scope="module")
def result() -> ProgramResult:
    return build()


def release(result: ProgramResult):
    return result.one(RELEASE, "kueue-release")


def deployment(objs: list[dict]) -> dict:
    [d] = [m for m in objs if m["kind"] == "Deployment" and m["metadata"]["name"] == "kueue-controller-manager"]
    return d


def images(objs: list[dict]) -> list[str]:
    return [c["image"] for m in objs if m["kind"] == "Deployment"
            for c in m["spec"]["template"]["spec"]["containers"]]


def test_the_release_is_the_pinned_oci_chart_in_its_own_namespace(result):
    r = release(result).inputs
    assert (r["chart"], r["version"], r["name"], r["namespace"]) == (
        "oci://registry.k8s.io/kueue/charts/kueue", "0.16.4", "kueue", "kueue-system")
    assert "repositoryOpts" not in r  # an OCI reference carries its registry
    assert r["atomic"] is True
    assert release(result).parent_type == "eks-ddp:kueue:Kueue"


def test_the_controller_image_renders_by_digest_and_no_other_image(result):
    objs = chart_objects(release(result))
    assert images(objs) == ["registry.k8s.io/kueue/kueue:v0.16.4@sha256:"
                            "dd67ad37e1f960277cfada27d3a144b73c8edcf7ad679ad62eb723262b4d793d"]
    assert all(DIGEST.search(i) for i in images(objs))
    assert deployment(objs)["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"


def test_a_tag_without_digest_and_kueueviz_are_caught(result):
    """Negative controls: the chart's default tag (no digest) and KueueViz turned on both render unpinned images."""
    r = copy.deepcopy(release(result))
    r.inputs["values"]["controllerManager"]["manager"]["image"]["tag"] = "v0.16.4"
    assert [i for i in images(chart_objects(r)) if not DIGEST.search(i)] == ["registry.k8s.io/kueue/kueue:v0.16.4"]
    r = copy.deepcopy(release(result))
    r.inputs["values"]["enableKueueViz"] = True
    assert len([i for i in images(chart_objects(r)) if not DIGEST.search(i)]) == 2


def tolerates(pod: dict, taint: dict) -> bool:
    """Kubernetes' toleration match (``v1.Toleration.ToleratesTaint``): key (empty with Exists: any), effect (empty:
    any), Equal compares the value."""
    for t in pod.get("tolerations") or ():
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value") == taint.get("value"):
            return True
    return False


def test_the_controller_runs_on_the_system_nodes_and_tolerates_their_taints():
    taint = {"key": "eks-ddp/system", "value": "true", "effect": "NoSchedule"}
    tolerating = build(tolerations=[{"key": "eks-ddp/system", "operator": "Equal", "value": "true",
                                     "effect": "NoSchedule"}])
    pod = deployment(chart_objects(release(tolerating)))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == SYSTEM and tolerates(pod, taint)
    # Negative control: without the args' toleration the pod would never schedule on a tainted system pool.
    bare = deployment(chart_objects(release(build())))["spec"]["template"]["spec"]
    assert bare["nodeSelector"] == SYSTEM and not tolerates(bare, taint)


def restricted_violations(pod: dict) -> list[str]:
    """Pod Security Standards, Restricted (kubernetes.io/docs/concepts/security/pod-security-standards/): the
    baseline's host namespaces and privileged, plus runAsNonRoot, seccomp RuntimeDefault/Localhost, no privilege
    escalation, capabilities drop ALL, and the allowed volume types."""
    bad = [f for f in ("hostNetwork", "hostPID", "hostIPC") if pod.get(f)]
    for c in pod["containers"]:
        own = c.get("securityContext") or {}
        sc = {**(pod.get("securityContext") or {}), **own}
        bad += [f"{c['name']}: {why}" for why, ok in (
            ("runAsNonRoot", sc.get("runAsNonRoot") is True),
            ("seccompProfile", (sc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")),
            ("allowPrivilegeEscalation", own.get("allowPrivilegeEscalation") is False),
            ("capabilities", "ALL" in ((own.get("capabilities") or {}).get("drop") or [])),
            ("privileged", not own.get("privileged"))) if not ok]
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
    bad += [f"volume {k}" for v in pod.get("volumes") or () for k in v if k != "name" and k not in allowed]
    return bad


def test_the_namespace_enforces_restricted_and_the_controller_meets_it(result):
    [ns] = result.of_type("kubernetes:core/v1:Namespace")
    assert ns.inputs["metadata"]["name"] == "kueue-system"
    assert kueue.POD_SECURITY_LABELS == POD_SECURITY_LABELS  # the same profile as the training namespace
    assert {k: ns.inputs["metadata"]["labels"][k] for k in POD_SECURITY_LABELS} == POD_SECURITY_LABELS
    pod = deployment(chart_objects(release(result)))["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    # Negative control: values that let the container escalate and keep its capabilities fail it.
    r = copy.deepcopy(release(result))
    r.inputs["values"]["controllerManager"]["manager"]["containerSecurityContext"].update(
        {"allowPrivilegeEscalation": True, "capabilities": {"drop": []}})
    pod = deployment(chart_objects(r))["spec"]["template"]["spec"]
    assert restricted_violations(pod) == ["manager: allowPrivilegeEscalation", "manager: capabilities"]


def test_the_manager_config_manages_labelled_jobs_of_the_training_namespace_only(result):
    values = release(result).inputs["values"]
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2" and config["kind"] == "Configuration"
    assert config["integrations"] == {"frameworks": ["batch/job"]}
    assert config["manageJobsWithoutQueueName"] is False
    assert config["managedJobsNamespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["training"]}]}
    assert config["webhook"]["port"] == kueue.WEBHOOK_PORT and "featureGates" not in values["controllerManager"]
    # The chart copies the selector into the Job webhooks: a Job in kube-system never waits on Kueue.
    hooks = [h for m in chart_objects(release(result)) if m["kind"].endswith("WebhookConfiguration")
             for h in m["webhooks"]]
    assert {h["name"] for h in hooks} == {"mjob.kb.io", "vjob.kb.io"}
    assert all(h["namespaceSelector"] == config["managedJobsNamespaceSelector"] and h["failurePolicy"] == "Fail"
               for h in hooks)


def test_pods_ready_is_on_by_default_and_requeues_a_run_that_lacks_or_lost_nodes_a_bounded_number_of_times():
    """A run admitted through the ProvisioningRequest check never gets missing nodes back by itself (the pods filter,
    kueue.py docstring): by default Kueue evicts and requeues it when its pods are not all Ready 45 minutes after
    admission, or after one went away (recoveryTimeout; "0s", the old value, never recovers a lost node)."""
    config = kueue.manager_config(args())
    assert config["waitForPodsReady"] == {
        "timeout": "45m", "blockAdmission": False, "recoveryTimeout": "45m",
        "requeuingStrategy": {"timestamp": "Eviction", "backoffLimitCount": 3, "backoffBaseSeconds": 60,
                              "backoffMaxSeconds": 600}}
    assert kueue.manager_config(args(pods_ready_timeout="1h", pods_ready_requeues=5))["waitForPodsReady"][
        "requeuingStrategy"]["backoffLimitCount"] == 5
    assert "waitForPodsReady" not in kueue.manager_config(args(pods_ready_timeout=None))  # only when asked
    # Above the autoscaler's own wait for a node, which the release passes it.
    from eks_ddp.core.rules import duration_minutes
    from eks_ddp.infra.autoscaler import MAX_NODE_PROVISION_TIME
    assert duration_minutes(config["waitForPodsReady"]["timeout"]) > duration_minutes(MAX_NODE_PROVISION_TIME) + 10


GO_TYPES = ROOT / "tests" / "fixtures" / "kueue" / "configuration_types.go"


def go_fields() -> dict[str, dict[str, str]]:
    """Struct name -> JSON field -> Go type, from Kueue's config types at v0.16.4 (vendored unchanged)."""
    import re
    out: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"^type (\w+) struct \{\n(.*?)^\}", GO_TYPES.read_text(), re.S | re.M):
        fields = re.findall(r"^\s*\w+\s+([\w.*\[\]]+)\s+`json:\"([\w]+)", m.group(2), re.M)
        out[m.group(1)] = {name: typ for typ, name in fields}
    return out


def unknown_config_fields(config: dict) -> list[str]:
    """Fields of the manager config that Kueue's strict decoder (pkg/config/config.go: serializer.EnableStrict)
    refuses, for the parts this stack sets below the top level."""
    types = go_fields()
    nested = {"waitForPodsReady": "WaitForPodsReady", "integrations": "Integrations", "webhook": "ControllerWebhook",
              "health": "ControllerHealth", "metrics": "ControllerMetrics", "leaderElection": None,
              "controller": "ControllerConfigurationSpec", "clientConnection": "ClientConnection"}
    bad = [f".{k}" for k in config if k not in {**types["Configuration"], **types["ControllerManager"], "apiVersion": 1,
                                              "kind": 1}]
    for key, struct in nested.items():
        if struct is None or key not in config:
            continue
        for k, v in config[key].items():
            if k not in types[struct]:
                bad.append(f".{key}.{k}")
            elif types[struct][k].lstrip("*") in types and isinstance(v, dict):
                sub = types[types[struct][k].lstrip("*")]
                bad += [f".{key}.{k}.{x}" for x in v if x not in sub]
    return sorted(bad)


def test_every_manager_config_field_is_one_kueue_decodes():
    assert {"WaitForPodsReady", "RequeuingStrategy", "Configuration"} <= set(go_fields())
    assert unknown_config_fields(kueue.manager_config(args())) == []
    # Negative control: a misspelt field anywhere the test looks.
    bad = kueue.manager_config(args())
    bad["waitForPodsReady"]["requeuingStrategy"]["backoffLimit"] = 3
    bad["waitForPodsReady"]["recoverTimeout"] = "1m"
    assert unknown_config_fields(bad) == [".waitForPodsReady.recoverTimeout",
                                          ".waitForPodsReady.requeuingStrategy.backoffLimit"]


def test_every_object_passes_the_strict_schema():
    result = build(provreq=True)
    docs = [*render_manifests(result), *rendered_by_charts(result)]
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "NetworkPolicy", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
            "Deployment", "Service", "MutatingWebhookConfiguration", "APIService"} <= kinds, kinds
    errors = []
    for d in docs:
        try:
            validate(d, k8s_versions.DEFAULT_VERSION, strict=True)
        except Exception as err:  # noqa: BLE001 - collect every failure
            errors.append(f"{d['kind']}/{d['metadata']['name']}: {getattr(err, 'message', err)}")
    assert errors == []
    # Negative control: a policy field misspelt is refused.
    bad = next(d for d in docs if d["kind"] == "NetworkPolicy")
    bad = {**bad, "spec": {**bad["spec"], "podSelectr": {}}}
    with pytest.raises(Exception, match="podSelectr"):
        validate(bad, k8s_versions.DEFAULT_VERSION, strict=True)


def contract(result: ProgramResult, mutate=None) -> list[str]:
    docs = [*render_manifests(result), *rendered_by_charts(result)]
    if mutate:
        mutate(next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "kueue-controller"))
    return [str(v) for v in check_manifests(docs, vpc_cidrs=(Net(VPC),))]


def test_the_network_contract_accepts_the_kueue_policies(result):
    assert contract(result) == []


def _drop_webhook(p: dict) -> None:
    p["spec"]["ingress"][0]["ports"] = [x for x in p["spec"]["ingress"][0]["ports"] if x["port"] != kueue.WEBHOOK_PORT]


def _open_metrics(p: dict) -> None:
    p["spec"]["ingress"][0]["ports"].append({"port": kueue.METRICS_PORT, "protocol": "TCP"})


def _from_anywhere(p: dict) -> None:
    p["spec"]["ingress"][0]["from"] = [{"ipBlock": {"cidr": "0.0.0.0/0"}}]


def _no_api(p: dict) -> None:
    p["spec"]["egress"] = p["spec"]["egress"][1:]


def _all_pods(p: dict) -> None:
    p["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})


@pytest.mark.parametrize(("mutate", "expected"), [
    (_drop_webhook, "needs TCP 9443 from the control plane"),
    (_open_metrics, "on TCP 8443 (kueue-controller), which nothing calling it needs"),
    (_from_anywhere, "outside the VPC, where the control plane's ENIs are"),
    (_no_api, "needs TCP 443 to kubernetes for the API server"),
    (_all_pods, "stranger"),
])
def test_the_contract_catches_a_broken_kueue_policy(result, mutate, expected):
    """Negative controls: a policy that blocks the webhook, opens the metrics port, admits the internet, cuts the API
    server, or lets every pod of the cluster in."""
    found = contract(result, mutate)
    assert any(expected in f and "kueue-controller-manager" in f or expected == "stranger" and "stranger" in f
               for f in found), found


def test_the_control_plane_s_needs_come_from_the_chart_s_objects(result):
    """Negative control for the model: without the chart's webhook configurations and APIServices nothing calls the
    controller, so the webhook rule is no longer needed and its ingress ipBlock is reported as extra."""
    docs = [d for d in [*render_manifests(result), *rendered_by_charts(result)]
            if not d["kind"].endswith("WebhookConfiguration") and d["kind"] != "APIService"]
    found = [str(v) for v in check_manifests(docs, vpc_cidrs=(Net(VPC),))]
    assert found == ["[network] kueue-system/Deployment/kueue-controller-manager: ingress from 10.0.0.0/16 on TCP "
                     "8082, TCP 9443 (kueue-controller), which nothing calling it needs"], found


def test_kueue_starts_after_the_provisioning_request_crd():
    result = build(provreq=True)
    [crd] = result.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    rel = release(result)
    assert crd.urn in rel.dependencies
    annotations = rel.inputs["values"]["controllerManager"]["manager"]["podAnnotations"]
    assert annotations == {kueue.PROVREQ_ANNOTATION: "provisioningrequests.autoscaling.x-k8s.io"}
    # Negative control: without the CRD, no such dependency and the annotation says so (turning the CRD on later
    # changes it, which rolls the controller so it starts its provisioning controller).
    bare = release(build())
    assert not [d for d in bare.dependencies if "CustomResourceDefinition" in d]
    assert bare.inputs["values"]["controllerManager"]["manager"]["podAnnotations"] == {kueue.PROVREQ_ANNOTATION: "none"}


def test_the_policies_exist_before_the_release(result):
    policies = [r.urn for r in result.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")]
    assert len(policies) == 2 and set(policies) <= set(release(result).dependencies)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("managed_namespaces", [], "managed_namespaces: got []"),
    ("vpc_cidrs", [], "vpc_cidrs: got none"),
    ("vpc_cidrs", ["10.0.0.0/33"], "vpc_cidrs: got '10.0.0.0/33'"),
    ("vpc_cidrs", ["0.0.0.0/0"], "vpc_cidrs: got '0.0.0.0/0'; expected a CIDR narrower than /0"),
    ("service_cidrs", ["x"], "service_cidrs: got 'x'"),
    ("tolerations", [{"key": "a", "operator": "Maybe"}], "tolerations: got"),
    ("pods_ready_timeout", "30", "pods_ready_timeout: got '30'"),
    ("pods_ready_timeout", "20m", "pods_ready_timeout: got '20m'; expected at least 35m"),
    ("pods_ready_requeues", -1, "pods_ready_requeues: got -1; expected an integer from 0 to 10"),
])
def test_each_bad_field_is_named(field, value, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        kueue.validate(args(**{field: value}))


def test_the_component_is_exported():
    assert eks_ddp.Kueue is kueue.Kueue and eks_ddp.KueueArgs is kueue.KueueArgs
    assert isinstance(kueue.policies(args())["default-deny"], k8s.networking.v1.NetworkPolicySpecArgs)


CHECKOV_ACCEPTED = {"CKV_K8S_38": "the controller is an API client (it watches Jobs, Workloads, queues and writes "
                                  "their status): its service-account token is needed"}


def test_checkov_finds_only_the_needed_api_token(tmp_path: Path):
    """checkov over Kueue's objects: the plan's (namespace, policies, CRD, RBAC) and the chart's Deployment as the
    model renders it. Negative control, in the same scan: the Deployment without the image's high uid fails
    CKV_K8S_40."""
    result = build(provreq=True)
    chart = [d for d in rendered_by_charts(result) if d["kind"] == "Deployment"]
    low = copy.deepcopy(chart[0])
    low["metadata"]["name"] = "low-uid"
    for sc in (low["spec"]["template"]["spec"]["securityContext"],
               low["spec"]["template"]["spec"]["containers"][0]["securityContext"]):
        sc.pop("runAsUser", None)
    write_manifests([*render_manifests(result), *chart, low], tmp_path / "kueue")
    checkov = ROOT / ".venv-scan" / "bin" / "checkov"
    assert checkov.exists(), f"{checkov} missing: run `make install` (checkov lives in its own environment)"
    proc = subprocess.run([str(checkov), "-d", str(tmp_path), "--framework", "kubernetes", "--skip-download",
                           "--output", "json"], capture_output=True, text=True, timeout=300, check=False)
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = {(c["check_id"], c["resource"]) for r in reports for c in r["results"]["failed_checks"]}
    ours = {f for f in failed if "low-uid" not in f[1]}
    assert ours == {("CKV_K8S_38", "Deployment.kueue-system.kueue-controller-manager")}, ours
    assert ("CKV_K8S_40", "Deployment.kueue-system.low-uid") in failed
    assert all(len(why.split()) >= 10 for why in CHECKOV_ACCEPTED.values())


def test_a_brought_vpc_admits_the_webhook_calls_from_each_of_its_blocks():
    """The control plane's ENIs sit in the VPC's subnets: a brought VPC's every associated block is looked up
    (the mock VPC has a primary 10.0.0.0/16 and a secondary 100.64.0.0/16) and admitted; a new VPC's own block is
    the control."""
    from tests.support.util import run, set_path, stack_config

    def sources(config: dict) -> set[str]:
        [policy] = [p for p in run(config).of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
                    if p.inputs["metadata"]["namespace"] == kueue.NAMESPACE and p.inputs["spec"].get("ingress")]
        return {f["ipBlock"]["cidr"] for f in policy.inputs["spec"]["ingress"][0]["from"]}

    byo = set_path(stack_config("dev"), "eks-ddp:network", {
        "vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-a", "subnet-b"]})
    assert sources(byo) == {"10.0.0.0/16", "100.64.0.0/16"}
    new = stack_config("dev")
    assert sources(new) == {new["eks-ddp:network"]["vpcCidr"]}
