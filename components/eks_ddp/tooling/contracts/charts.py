"""What a pinned Helm chart renders, as far as the network contract must see it.

Helm releases render in the cluster, so the plan's manifests (``plan.render_manifests``) hold none of their objects.
Where the stack isolates a chart's pods with a NetworkPolicy of its own, the contract needs those pods to judge it:
this module rebuilds them from the release's recorded values with the chart's own templates' rules. It registers no
contract itself.

* **dcgm-exporter** (NVIDIA/dcgm-exporter ``deployment/``, chart 4.8.2): ``templates/_helpers.tpl``
  ``dcgm-exporter.fullname`` (the release name when it contains the chart name, else ``<release>-dcgm-exporter``,
  or ``fullnameOverride``) and ``dcgm-exporter.selectorLabels`` (``app.kubernetes.io/name``, ``/instance``,
  ``/component``); ``templates/daemonset.yaml`` (pod labels = selector labels + ``podLabels``; ``hostNetwork``;
  ``automountServiceAccountToken`` true only with ``kubernetes.enablePodLabels`` or ``enablePodUID`` and
  ``kubernetes.rbac.create``, or ``kubernetesDRA.enabled``; container port ``metrics`` = ``service.port``; the
  arguments); ``templates/service.yaml`` (only with ``service.enable``: port ``service.port`` to the same target
  port, the selector labels); ``templates/serviceaccount.yaml``.
* **kueue** (kubernetes-sigs/kueue ``charts/kueue``, chart 0.16.4): ``templates/_helpers.tpl`` ``kueue.fullname``
  (as above, chart name ``kueue``) and ``kueue.selectorLabels`` (``app.kubernetes.io/name``, ``/instance``,
  ``control-plane: controller-manager``); ``templates/manager/manager.yaml`` (Deployment
  ``<full>-controller-manager``: pod labels = selector labels, one container ``manager`` with ports ``visibility``
  8082, ``webhook-server`` 9443, ``metrics`` 8443, probes on 8081, image ``"<repository>:<tag or appVersion>"``,
  ``podSecurityContext``/``containerSecurityContext``/``nodeSelector``/``tolerations`` from the values, service
  account ``<full>-controller-manager``, no ``automountServiceAccountToken``: the token is mounted);
  ``templates/rbac/service_account.yaml``; ``templates/webhook/service.yaml`` (``<full>-webhook-service``,
  ``webhookService.ports``: 443 -> 9443); ``templates/visibility/service.yaml`` (``<full>-visibility-server``, 443 ->
  8082); ``templates/manager/auth_proxy_service.yaml`` (``<full>-controller-manager-metrics-service``,
  ``metricsService.ports``); ``templates/webhook/manifests.yaml`` (the Mutating/ValidatingWebhookConfigurations,
  every webhook's ``clientConfig.service`` the webhook Service, port unset: 443; ``failurePolicy: Fail``; the Job
  webhooks' ``namespaceSelector`` is the config's ``managedJobsNamespaceSelector`` when it has one);
  ``templates/visibility/apiservice_v1beta1.yaml``/``_v1beta2.yaml`` (APIServices on the visibility Service);
  ``templates/kueueviz/*`` only with ``enableKueueViz`` (two more Deployments and images).
"""

from __future__ import annotations

from typing import Any

import yaml

from eks_ddp.tooling.mocks import ProgramResult, Recorded

DCGM_EXPORTER = "dcgm-exporter"
RELEASE = "kubernetes:helm.sh/v3:Release"
# The chart's values.yaml defaults the rules read (chart 4.8.2).
_DCGM_DEFAULTS: dict[str, Any] = {
    "arguments": ["-f", "/etc/dcgm-exporter/default-counters.csv"], "hostNetwork": False, "podLabels": {},
    "nameOverride": "", "fullnameOverride": "", "namespaceOverride": "",
    "service": {"enable": True, "type": "ClusterIP", "port": 9400},
    "serviceAccount": {"create": True, "name": None},
    "kubernetes": {"enablePodLabels": False, "enablePodUID": False, "rbac": {"create": True}},
    "kubernetesDRA": {"enabled": False},
}


def _merged(defaults: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps merge key by key, anything else replaces."""
    out = dict(defaults)
    for k, v in (values or {}).items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def dcgm_exporter(release: Recorded) -> list[dict[str, Any]]:
    """The DaemonSet, Service and ServiceAccount the dcgm-exporter chart renders for ``release``."""
    v = _merged(_DCGM_DEFAULTS, release.inputs.get("values") or {})
    name = str(release.inputs.get("name") or release.name)
    chart = v["nameOverride"] or DCGM_EXPORTER
    full = (v["fullnameOverride"] or (name if chart in name else f"{name}-{chart}"))[:63].rstrip("-")
    namespace = v["namespaceOverride"] or release.inputs.get("namespace") or "default"
    selector = {"app.kubernetes.io/name": chart, "app.kubernetes.io/instance": name, "app.kubernetes.io/component": chart}
    k8s = v["kubernetes"]
    token = bool(((k8s.get("enablePodLabels") or k8s.get("enablePodUID")) and (k8s.get("rbac") or {}).get("create"))
                 or v["kubernetesDRA"].get("enabled"))
    account = (v["serviceAccount"].get("name") or full) if v["serviceAccount"].get("create") else \
        (v["serviceAccount"].get("name") or "default")
    port = int(v["service"]["port"])
    meta = {"name": full, "namespace": namespace}
    out: list[dict[str, Any]] = [{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": dict(meta),
        "spec": {"selector": {"matchLabels": selector}, "template": {
            "metadata": {"labels": {**selector, **(v["podLabels"] or {})}},
            "spec": {"hostNetwork": bool(v["hostNetwork"]), "serviceAccountName": account,
                     "automountServiceAccountToken": token,
                     "containers": [{"name": "exporter", "args": [str(a) for a in v["arguments"]],
                                     "ports": [{"name": "metrics", "containerPort": port}]}]}}}}]
    if v["service"].get("enable"):
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": dict(meta), "spec": {
            "type": v["service"].get("type", "ClusterIP"), "selector": selector,
            "ports": [{"name": "metrics", "port": port, "targetPort": port, "protocol": "TCP"}]}})
    if v["serviceAccount"].get("create"):
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace},
                    "automountServiceAccountToken": token})
    return out


KUEUE = "kueue"
KUEUE_CHART_PREFIX = "oci://registry.k8s.io/kueue/charts/"
_KUEUE_APP_VERSION = "v0.16.4"
# The chart's values.yaml defaults the rules read (chart 0.16.4).
_KUEUE_DEFAULTS: dict[str, Any] = {
    "nameOverride": "", "fullnameOverride": "", "enableKueueViz": False,
    "controllerManager": {
        "replicas": 1, "nodeSelector": {}, "tolerations": [],
        "manager": {"image": {"repository": "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue",
                              "tag": "release-0.16", "pullPolicy": "Always"},
                    "podAnnotations": {},
                    "podSecurityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containerSecurityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                                 "capabilities": {"drop": ["ALL"]}},
                    "resources": {}}},
    "managerConfig": {"controllerManagerConfigYaml": ""},
    "metricsService": {"ports": [{"name": "https", "port": 8443, "protocol": "TCP", "targetPort": 8443}],
                       "type": "ClusterIP"},
    "webhookService": {"ports": [{"port": 443, "protocol": "TCP", "targetPort": 9443}], "type": "ClusterIP"},
    "kueueViz": {"backend": {"image": {"repository": "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueueviz-backend",
                                       "tag": "release-0.16"}},
                 "frontend": {"image": {"repository": "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueueviz-frontend",
                                        "tag": "release-0.16"}}},
}
_JOB_WEBHOOKS = (("mjob.kb.io", "/mutate-batch-v1-job"), ("vjob.kb.io", "/validate-batch-v1-job"))


def _whole(value: Any) -> Any:
    """Numbers as Helm renders them: the engine carries every number as a float, ``toYaml`` writes 65532.0 as 65532."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


def _chart_of(release: Recorded) -> str:
    chart = str(release.inputs.get("chart") or "")
    return chart.removeprefix(KUEUE_CHART_PREFIX) if chart.startswith(KUEUE_CHART_PREFIX) else chart


def kueue(release: Recorded) -> list[dict[str, Any]]:
    """The Deployment, ServiceAccount, Services, webhook configurations and APIServices the kueue chart renders for
    ``release`` (the objects the network contract and the pod checks need; RBAC and CRDs left out)."""
    v = _merged(_KUEUE_DEFAULTS, _whole(release.inputs.get("values") or {}))
    name = str(release.inputs.get("name") or release.name)
    chart = v["nameOverride"] or KUEUE
    full = (v["fullnameOverride"] or (name if chart in name else f"{name}-{chart}"))[:63].rstrip("-")
    namespace = str(release.inputs.get("namespace") or "default")
    selector = {"app.kubernetes.io/name": chart, "app.kubernetes.io/instance": name, "control-plane": "controller-manager"}
    cm, mgr = v["controllerManager"], v["controllerManager"]["manager"]
    config = yaml.safe_load(v["managerConfig"]["controllerManagerConfigYaml"] or "{}") or {}
    account = f"{full}-controller-manager"
    pod_spec: dict[str, Any] = {
        "serviceAccountName": account, "securityContext": mgr["podSecurityContext"],
        "terminationGracePeriodSeconds": 10,
        "containers": [{
            "name": "manager", "command": ["/manager"],
            "args": ["--config=/controller_manager_config.yaml", "--zap-log-level=2"],
            "image": f"{mgr['image']['repository']}:{mgr['image'].get('tag') or _KUEUE_APP_VERSION}",
            "imagePullPolicy": mgr["image"].get("pullPolicy"),
            "ports": [{"containerPort": 8082, "name": "visibility", "protocol": "TCP"},
                      {"containerPort": 9443, "name": "webhook-server", "protocol": "TCP"},
                      {"containerPort": 8443, "name": "metrics", "protocol": "TCP"}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8081}},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}},
            "resources": mgr["resources"], "securityContext": mgr["containerSecurityContext"]}]}
    if cm["nodeSelector"]:
        pod_spec["nodeSelector"] = dict(cm["nodeSelector"])
    if cm["tolerations"]:
        pod_spec["tolerations"] = [dict(t) for t in cm["tolerations"]]
    meta = {"namespace": namespace}
    svc = {"name": f"{full}-webhook-service", "namespace": namespace}
    job_selector = config.get("managedJobsNamespaceSelector")

    def hooks(kind: str) -> dict[str, Any]:
        webhooks = []
        for hook, path in _JOB_WEBHOOKS:
            if (hook[0] == "m") == (kind == "MutatingWebhookConfiguration"):
                webhooks.append({"name": hook, "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
                                 "sideEffects": "None", "clientConfig": {"service": {**svc, "path": path}},
                                 **({"namespaceSelector": job_selector} if job_selector else {}),
                                 "rules": [{"apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"],
                                            "operations": ["CREATE"] if hook[0] == "m" else ["CREATE", "UPDATE"]}]})
        prefix = "mutating" if kind.startswith("Mutating") else "validating"
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                "metadata": {"name": f"{full}-{prefix}-webhook-configuration"}, "webhooks": webhooks}

    out: list[dict[str, Any]] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{full}-controller-manager", **meta},
         "spec": {"replicas": int(cm["replicas"]), "selector": {"matchLabels": selector}, "template": {
             "metadata": {"labels": dict(selector), "annotations": {"kubectl.kubernetes.io/default-container": "manager",
                                                                    **(mgr["podAnnotations"] or {})}},
             "spec": pod_spec}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, **meta}},
        {"apiVersion": "v1", "kind": "Service", "metadata": dict(svc), "spec": {
            "type": v["webhookService"]["type"], "selector": dict(selector), "ports": list(v["webhookService"]["ports"])}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{full}-visibility-server", **meta}, "spec": {
            "selector": dict(selector), "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8082}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{full}-controller-manager-metrics-service", **meta},
         "spec": {"type": v["metricsService"]["type"], "selector": dict(selector),
                  "ports": list(v["metricsService"]["ports"])}},
        hooks("MutatingWebhookConfiguration"), hooks("ValidatingWebhookConfiguration"),
        *({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
           "metadata": {"name": f"{version}.visibility.kueue.x-k8s.io"},
           "spec": {"group": "visibility.kueue.x-k8s.io", "version": version, "insecureSkipTLSVerify": True,
                    "groupPriorityMinimum": 100, "versionPriority": 100,
                    "service": {"name": f"{full}-visibility-server", "namespace": namespace}}}
          for version in ("v1beta1", "v1beta2")),
    ]
    if v["enableKueueViz"]:
        for part in ("backend", "frontend"):
            image = v["kueueViz"][part]["image"]
            out.append({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": f"{full}-kueueviz-{part}", **meta},
                        "spec": {"selector": {"matchLabels": {"app": f"{full}-kueueviz-{part}"}}, "template": {
                            "metadata": {"labels": {"app": f"{full}-kueueviz-{part}"}},
                            "spec": {"containers": [{"name": part, "image": f"{image['repository']}:{image['tag']}"}]}}}})
    return out


CHARTS = {DCGM_EXPORTER: dcgm_exporter, KUEUE: kueue}
"""Chart name -> what it renders, for the charts whose pods the stack's own NetworkPolicies select."""


def rendered_by_charts(result: ProgramResult) -> list[dict[str, Any]]:
    """The objects of every modelled chart's release in the plan."""
    return [m for r in result.of_type(RELEASE) if (fn := CHARTS.get(_chart_of(r))) for m in fn(r)]
