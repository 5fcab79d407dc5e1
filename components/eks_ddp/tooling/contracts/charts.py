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
"""

from __future__ import annotations

from typing import Any

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


CHARTS = {DCGM_EXPORTER: dcgm_exporter}
"""Chart name -> what it renders, for the charts whose pods the stack's own NetworkPolicies select."""


def rendered_by_charts(result: ProgramResult) -> list[dict[str, Any]]:
    """The objects of every modelled chart's release in the plan."""
    return [m for r in result.of_type(RELEASE) if (fn := CHARTS.get(str(r.inputs.get("chart")))) for m in fn(r)]
