"""The all-or-nothing contract: a Kueue ProvisioningRequest admission check in the plan has an autoscaler that answers it.

Kueue's ``kueue.x-k8s.io/provisioning-request`` admission check (kubernetes-sigs/kueue v0.16.4
``pkg/controller/admissionchecks/provisioning``) creates a ProvisioningRequest (autoscaling.x-k8s.io/v1) per
workload and admits the workload when the request is ``Provisioned``. Nothing else answers it, so the check is only
satisfiable when, in the same plan:

* the cluster autoscaler runs with ``--enable-provisioning-requests=true`` (kubernetes/autoscaler
  ``config/flags/flags.go``; default false): without it no request is ever Provisioned and every GPU run waits
  forever, showing only "waiting for ProvisioningRequest";
* the ProvisioningRequest CRD exists, and Kueue's release depends on it: ``cmd/kueue/main.go`` starts the
  provisioning controller only if the API is there when Kueue starts (``ServerSupportsProvisioningRequest``);
  otherwise the AdmissionCheck stays inactive and workloads wait;
* the ProvisioningRequestConfig's ``provisioningClassName`` is one the autoscaler handles
  (``provisioningrequest/supported_classes.go`` at every pinned tag: ``check-capacity.autoscaling.x-k8s.io``,
  ``best-effort-atomic-scale-up.autoscaling.x-k8s.io``).

A plan without such an admission check passes whatever the autoscaler's flag says.
"""

from __future__ import annotations

from typing import Any

from . import PlanView, Violation, contract

NAME = "provisioning"
CONTROLLER = "kueue.x-k8s.io/provisioning-request"
CRD_NAME = "provisioningrequests.autoscaling.x-k8s.io"
CLASSES = ("check-capacity.autoscaling.x-k8s.io", "best-effort-atomic-scale-up.autoscaling.x-k8s.io")
RELEASE = "kubernetes:helm.sh/v3:Release"
CRD_TYPE = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"


def _kueue_objects(view: PlanView, kind: str) -> list[dict[str, Any]]:
    return [m for m in view.kind(kind) if str(m.get("apiVersion", "")).startswith("kueue.x-k8s.io/")]


@contract(NAME)
def provisioning(view: PlanView) -> list[Violation]:
    """Every ProvisioningRequest admission check has an autoscaler with the flag, the CRD, and Kueue started after it."""
    checks = [m for m in _kueue_objects(view, "AdmissionCheck") if (m.get("spec") or {}).get("controllerName") == CONTROLLER]
    if not checks:
        return []
    out: list[Violation] = []
    subject = ", ".join(f"AdmissionCheck {m['metadata']['name']}" for m in checks)
    releases = view.aws(RELEASE)
    scalers = [r for r in releases if r.inputs.get("chart") == "cluster-autoscaler"]
    if not scalers:
        out.append(Violation(NAME, subject, "no cluster autoscaler in the plan answers its ProvisioningRequests: "
                                            "every GPU workload would wait for ever"))
    for r in scalers:
        flag = ((r.inputs.get("values") or {}).get("extraArgs") or {}).get("enable-provisioning-requests")
        if str(flag).lower() != "true":
            out.append(Violation(NAME, f"Release {r.name}", f"extraArgs.enable-provisioning-requests: got {flag!r}; "
                                                            f"expected 'true' ({subject} waits on ProvisioningRequests "
                                                            "that only the autoscaler marks Provisioned)"))
    crds = [r for r in view.aws(CRD_TYPE) if (r.inputs.get("metadata") or {}).get("name") == CRD_NAME]
    if not crds:
        out.append(Violation(NAME, subject, f"no CustomResourceDefinition {CRD_NAME} in the plan: Kueue would not "
                                            "start its provisioning controller"))
    for r in releases:
        chart = str(r.inputs.get("chart") or "")
        if chart.rsplit("/", 1)[-1] == "kueue" and crds and not any(c.urn in r.dependencies for c in crds):
            out.append(Violation(NAME, f"Release {r.name}", f"does not depend on the {CRD_NAME} CRD: Kueue may start "
                                                            "before it and never run its provisioning controller"))
    configs = {m["metadata"]["name"]: m for m in _kueue_objects(view, "ProvisioningRequestConfig")}
    for m in checks:
        params = (m.get("spec") or {}).get("parameters") or {}
        config = configs.get(params.get("name")) if params.get("kind") == "ProvisioningRequestConfig" else None
        if config is None:
            out.append(Violation(NAME, f"AdmissionCheck {m['metadata']['name']}",
                                 f"parameters: got {params!r}; expected a ProvisioningRequestConfig of the plan"))
            continue
        cls = (config.get("spec") or {}).get("provisioningClassName")
        if cls not in CLASSES:
            out.append(Violation(NAME, f"ProvisioningRequestConfig {config['metadata']['name']}",
                                 f"provisioningClassName: got {cls!r}; expected one of {', '.join(CLASSES)} (what "
                                 "the pinned autoscalers handle)"))
    return out
