"""The autoscaler's chart RBAC against what its image lists and watches (review 2026-11-24, A1).

The pinned chart's ClusterRole is vendored per chart version in ``tests/fixtures/autoscaler`` (rendered
for eks-ddp's values from the chart's ``templates/clusterrole.yaml`` at its tag). What each image minor
lists and watches comes from reading the autoscaler's sources at the pinned tags (``informerFactory``
users, the scheduler framework's volume plugins, ``config/flags/flags.go``):

* every minor: the core, apps, batch, policy and storage listers of the scheduler simulation;
* from 1.35: ``--enable-dynamic-resource-allocation`` is locked to true, and ``main.go`` blocks on
  ``WaitForCacheSync`` of the ``resource.k8s.io`` ResourceClaims/ResourceSlices/DeviceClasses informers
  before the first loop (in 1.32-1.34 the flag defaults to false and eks-ddp does not set it);
* with ``--enable-provisioning-requests`` (``ClusterAutoscalerArgs.provisioning_requests``, for Kueue's
  all-or-nothing admission check), at every pinned minor: ``provreqclient.NewProvisioningRequestClient`` waits for
  the ProvisioningRequest and PodTemplate informers' caches (``newPRsLister``/``newPodTemplatesLister``) before the
  first loop, then writes the requests' status and deletes old requests. Only chart 9.59.0 grants these; the
  component adds its own ClusterRole (``autoscaler.provisioning_request_rules``), checked here against every pin.

A forbidden list/watch blocks the start forever while /health-check stays green (monitoring starts after
the build): the autoscaler never scales, silently. Hence this test.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml

from eks_ddp.config import SUPPORTED_KUBERNETES_VERSIONS
from eks_ddp.infra import autoscaler
from tests.support.util import at_version, run, stack_config

FIXTURES = Path(__file__).parents[1] / "fixtures" / "autoscaler"
READ = {"list", "watch"}

CORE_NEEDS = frozenset({
    ("", "pods"), ("", "nodes"), ("", "namespaces"), ("", "services"), ("", "replicationcontrollers"),
    ("", "persistentvolumeclaims"), ("", "persistentvolumes"),
    ("apps", "daemonsets"), ("apps", "replicasets"), ("apps", "statefulsets"),
    ("batch", "jobs"), ("policy", "poddisruptionbudgets"),
    ("storage.k8s.io", "storageclasses"), ("storage.k8s.io", "csinodes"), ("storage.k8s.io", "csidrivers"),
    ("storage.k8s.io", "csistoragecapacities"),
})
DRA_NEEDS = frozenset({("resource.k8s.io", "resourceslices"), ("resource.k8s.io", "deviceclasses"),
                       ("resource.k8s.io", "resourceclaims")})
PROVREQ_NEEDS = frozenset({("autoscaling.x-k8s.io", "provisioningrequests"), ("", "podtemplates")})
PROVREQ_WRITES = {("autoscaling.x-k8s.io", "provisioningrequests/status"): {"update", "patch"},
                  ("autoscaling.x-k8s.io", "provisioningrequests"): {"delete"}}
"""UpdateStatus (1.32-1.33), server-side apply of the status (ApplyProvisioningRequest, from 1.34), DeleteOldProvReqs."""


def minor(v: str) -> tuple[int, int]:
    major, mnr = v.lstrip("v").split(".")[:2]
    return int(major), int(mnr)


def needs(image_tag: str, provisioning_requests: bool = False) -> frozenset[tuple[str, str]]:
    """(apiGroup, resource) pairs the image lists and watches before its first loop."""
    return (CORE_NEEDS | (DRA_NEEDS if minor(image_tag) >= (1, 35) else frozenset())
            | (PROVREQ_NEEDS if provisioning_requests else frozenset()))


@cache
def chart_rules(chart_version: str) -> list[dict]:
    path = FIXTURES / f"clusterrole-{chart_version}.yaml"
    assert path.exists(), (f"chart {chart_version} is pinned but its ClusterRole is not vendored: render "
                           f"templates/clusterrole.yaml at cluster-autoscaler-chart-{chart_version} into {path}")
    doc = yaml.safe_load(path.read_text())
    assert doc["chart"] == chart_version
    return doc["rules"]


def granted(rules: list[dict]) -> set[tuple[str, str]]:
    """(apiGroup, resource) pairs on which every object (no resourceNames) may be listed and watched."""
    out: set[tuple[str, str]] = set()
    for r in rules:
        if r.get("resourceNames") or not READ <= set(r["verbs"]) and "*" not in r["verbs"]:
            continue
        out |= {(g, res) for g in r["apiGroups"] for res in r["resources"]}
    return out


def missing(chart_version: str, image_tag: str, provisioning_requests: bool = False,
            extra: list[dict] | None = None) -> set[tuple[str, str]]:
    return set(needs(image_tag, provisioning_requests)) - granted([*chart_rules(chart_version), *(extra or [])])


def unwritable(rules: list[dict]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of :data:`PROVREQ_WRITES` that no rule grants on every object."""
    have = {(g, res, v) for r in rules if not r.get("resourceNames") for g in r["apiGroups"] for res in r["resources"]
            for v in r["verbs"]}
    return {(g, res, v) for (g, res), verbs in PROVREQ_WRITES.items() for v in verbs
            if (g, res, v) not in have and (g, res, "*") not in have}


@pytest.mark.parametrize("version", sorted(autoscaler.PINS))
def test_chart_rbac_covers_image_minor(version):
    p = autoscaler.PINS[version]
    assert p.image_tag.startswith(f"v{version}.")
    assert not missing(p.chart_version, p.image_tag), (version, p)


def test_the_check_sees_a_chart_without_dra_rbac():
    """Negative control: the chart pinned before (9.46.6) with the 1.35 image lacks exactly the DRA rules;
    a grant with resourceNames or without watch does not count."""
    assert missing("9.46.6", "v1.35.1") == set(DRA_NEEDS)
    assert not missing("9.46.6", "v1.34.4")
    assert not granted([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"],
                         "resourceNames": ["x"]}])
    assert not granted([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])


@pytest.mark.parametrize("stack", ["dev", "p4de"])
def test_every_supported_version_renders_an_autoscaler_whose_rbac_its_image_needs(stack):
    """The plans of both example stacks at every supported minor: the release's chart grants every list/watch
    of the release's image."""
    for version in SUPPORTED_KUBERNETES_VERSIONS:
        raw = at_version(stack_config(stack), version)
        release = run(raw, stack).one("kubernetes:helm.sh/v3:Release", "autoscaler-release").inputs
        tag = release["values"]["image"]["tag"]
        assert minor(tag) == minor(version), (version, tag)
        assert not missing(release["version"], tag), (stack, version, release["version"], tag)


def test_a_stuck_loop_turns_health_red():
    """/health-check answers 500 when the loop records no activity for --max-inactivity or no success for
    --max-failing-time (metrics/liveness.go); both are set tighter than upstream's 10m/15m, and above the 10 s
    scan interval so a healthy loop never trips them."""
    args = autoscaler.helm_values(autoscaler.ClusterAutoscalerArgs(
        cluster_name="c", region="us-west-2", kubernetes_version="1.35", oidc_provider_arn="a",
        oidc_provider_url="u", node_selector={}), "arn")["extraArgs"]

    def seconds(d: str) -> int:
        return int(d[:-1]) * {"s": 1, "m": 60, "h": 3600}[d[-1]]
    assert 60 <= seconds(args["max-inactivity"]) < 10 * 60
    assert seconds(args["max-inactivity"]) <= seconds(args["max-failing-time"]) < 15 * 60


@pytest.mark.parametrize("version", sorted(autoscaler.PINS))
def test_provisioning_requests_are_granted_with_every_pin(version):
    """With ``provisioning_requests`` the image also lists/watches ProvisioningRequests and PodTemplates and writes
    the requests' status: the chart's ClusterRole plus the component's own covers it at every pin."""
    p = autoscaler.PINS[version]
    extra = autoscaler.provisioning_request_rules()
    assert not missing(p.chart_version, p.image_tag, True, extra), (version, p)
    assert not unwritable(extra)


def test_the_check_sees_charts_without_provisioning_request_rbac():
    """Negative control: the charts pinned for 1.32-1.35 alone lack exactly the ProvisioningRequest informers (the
    image would block its start); 9.59.0 has them; rules without delete or status writes are caught."""
    for version in ("1.32", "1.33", "1.34", "1.35"):
        p = autoscaler.PINS[version]
        assert missing(p.chart_version, p.image_tag, True) == set(PROVREQ_NEEDS), version
    assert not missing("9.59.0", "v1.36.1", True)
    assert unwritable([{"apiGroups": ["autoscaling.x-k8s.io"], "resources": ["provisioningrequests"],
                        "verbs": ["get", "list", "watch"]}]) == {
        ("autoscaling.x-k8s.io", "provisioningrequests/status", "update"),
        ("autoscaling.x-k8s.io", "provisioningrequests/status", "patch"),
        ("autoscaling.x-k8s.io", "provisioningrequests", "delete")}


def test_the_provisioning_request_rules_are_bound_to_the_autoscaler_s_account():
    from eks_ddp.tooling.mocks import run_program

    def program() -> None:
        autoscaler.ClusterAutoscaler("autoscaler", autoscaler.ClusterAutoscalerArgs(
            cluster_name="c", region="us-west-2", oidc_provider_arn="a", oidc_provider_url="u", node_selector={},
            provisioning_requests=True))
    result = run_program({}, program=program)
    role = result.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole").inputs
    binding = result.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding").inputs
    assert role["rules"] == autoscaler.provisioning_request_rules()
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": autoscaler.SERVICE_ACCOUNT,
                                    "namespace": autoscaler.NAMESPACE}]
