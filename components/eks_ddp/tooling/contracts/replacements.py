"""The replacements contract: under the ProvisioningRequest check, a node an admitted run lacks must be asked for again.

Two rules that belong to others, implemented here from their source, and what follows from them together:

* **Kueue's pod-template update** (kubernetes-sigs/kueue v0.16.4). When a workload's ProvisioningRequest is
  ``Provisioned``, the provisioning admission check turns Ready with ``podSetUpdates`` carrying the annotations
  ``autoscaling.x-k8s.io/consume-provisioning-request: <request>`` and
  ``autoscaling.x-k8s.io/provisioning-class-name: <class>`` for each pod set
  (``pkg/controller/admissionchecks/provisioning/controller.go`` ``syncCheckStates`` case ``isProvisioned``,
  ``podSetUpdates``); on admission the Job reconciler merges them into the Job's pod template
  (``pkg/controller/jobframework/reconciler.go``, ``info.Merge(podset.FromUpdate(&podSetUpdate))``), where they
  stay until the workload is evicted (``RestorePodSetsInfo``). Every pod the Job controller makes in between,
  replacements included, carries them. :func:`admitted_template` applies that update.
* **The cluster autoscaler's pods filter** (kubernetes/autoscaler ``cluster-autoscaler/processors/provreq/pods_filter.go``
  ``ProvisioningRequestPodsFilter.Process`` and ``provisioningRequestName``, in the pipeline when the autoscaler
  runs with ``--enable-provisioning-requests``): an unschedulable pod carrying
  ``autoscaling.x-k8s.io/consume-provisioning-request`` (or the deprecated
  ``cluster-autoscaler.kubernetes.io/consume-provisioning-request``) is dropped from scale-up, whatever the
  request's state ("Unschedulable pod didn't trigger scale-up, because it's consuming ProvisioningRequest").
  :func:`triggers_scale_up` is that filter.

So a replacement pod of an admitted run, or a pod whose instance EC2 never delivered (on AWS, Provisioned only means
the group's desired size was raised: ``provisioningrequest/besteffortatomic/provisioning_class.go``, and the group
shrinks back to what launched), never makes the autoscaler add a node. Kueue admits no workload twice and does not
retry on ``BookingExpired`` once admitted (``controller.go`` ``syncOwnedProvisionRequest``). The one path back to
capacity is an eviction that restores the pod template and queues the run for a new request: Kueue's
``waitForPodsReady`` (``apis/config/v1beta2/configuration_types.go``): ``timeout`` for pods that never became Ready
after admission, ``recoveryTimeout`` (defaults to ``timeout``; ``"0s"`` turns it off,
``pkg/controller/core/workload_controller.go`` ``admittedNotReadyWorkload``) for a pod lost later. The timeout must
also be longer than the autoscaler's ``max-node-provision-time``, or runs whose nodes are only booting are evicted.

The contract reports each queued GPU Job (or CronJob template) that such a check admits when Kueue's configuration in
the plan (its release's ``managerConfig``) gives no such path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from eks_ddp.core.rules import DURATION, duration_minutes

from . import PlanView, Violation, contract
from .queue import admission, cronjob_jobs, read_plan, workload_name, workload_of

NAME = "replacements"
CONTROLLER = "kueue.x-k8s.io/provisioning-request"
CONSUME = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS = "autoscaling.x-k8s.io/provisioning-class-name"
DEPRECATED_CONSUME = "cluster-autoscaler.kubernetes.io/consume-provisioning-request"
RELEASE = "kubernetes:helm.sh/v3:Release"


def admitted_template(template: Mapping[str, Any], request: str, provisioning_class: str) -> dict[str, Any]:
    """The Job's pod template once Kueue admitted it through a Provisioned request (the podSetUpdates merge)."""
    meta = dict(template.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), CONSUME: request, CLASS: provisioning_class}
    return {**template, "metadata": meta}


def triggers_scale_up(pod_template: Mapping[str, Any]) -> bool:
    """Whether an unschedulable pod of this template passes the autoscaler's ProvisioningRequest pods filter."""
    annotations = (pod_template.get("metadata") or {}).get("annotations") or {}
    return CONSUME not in annotations and DEPRECATED_CONSUME not in annotations


def kueue_config(view: PlanView) -> dict[str, Any] | None:
    """Kueue's manager configuration from its release in the plan (None: no Kueue release)."""
    for r in view.aws(RELEASE):
        if str(r.inputs.get("chart") or "").rsplit("/", 1)[-1] == "kueue":
            raw = ((r.inputs.get("values") or {}).get("managerConfig") or {}).get("controllerManagerConfigYaml")
            return yaml.safe_load(raw) if isinstance(raw, str) else {}
    return None


def max_node_provision_time(view: PlanView) -> str | None:
    for r in view.aws(RELEASE):
        if r.inputs.get("chart") == "cluster-autoscaler":
            value = ((r.inputs.get("values") or {}).get("extraArgs") or {}).get("max-node-provision-time")
            return str(value) if value is not None else "15m"  # the autoscaler's default
    return None


def recovery_problem(config: Mapping[str, Any], provision_time: str | None) -> str | None:
    """Why Kueue's configuration gives an admitted run no way back to capacity (None: it does)."""
    ready = config.get("waitForPodsReady")
    if not isinstance(ready, Mapping):
        return "Kueue's waitForPodsReady is off: nothing evicts the run to ask for them again"
    timeout = str(ready.get("timeout") or "")
    recovery = str(ready.get("recoveryTimeout", timeout) or "")
    for key, value in (("timeout", timeout), ("recoveryTimeout", recovery)):
        if not DURATION.match(value) or duration_minutes(value) <= 0:
            return (f"Kueue's waitForPodsReady.{key} is {value!r}: "
                    + ("a lost node is never asked for again" if key == "recoveryTimeout" else
                       "a node never delivered is never asked for again"))
    if provision_time and DURATION.match(provision_time) and duration_minutes(timeout) <= duration_minutes(
            provision_time):
        return (f"Kueue's waitForPodsReady.timeout {timeout} is not above the autoscaler's max-node-provision-time "
                f"{provision_time}: runs whose nodes are still booting would be evicted")
    return None


def findings(manifests: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None,
             provision_time: str | None) -> list[Violation]:
    """The queued GPU Jobs whose replacement pods could never trigger a scale-up, and why."""
    if config is None:
        return []
    checks = {m["metadata"]["name"]: m for m in manifests if m.get("kind") == "AdmissionCheck"
              and (m.get("spec") or {}).get("controllerName") == CONTROLLER}
    if not checks:
        return []
    configs = {m["metadata"]["name"]: m for m in manifests if m.get("kind") == "ProvisioningRequestConfig"}
    problem = recovery_problem(config, provision_time)
    if problem is None:
        return []
    plan = read_plan(manifests)
    others = [m for m in manifests if m.get("kind") != "Job"]
    out = []
    for i, job in enumerate((*plan.jobs, *cronjob_jobs(manifests))):
        w = workload_of(job, i, plan.priorities)
        if w.queue is None or w.pod_requests.get("nvidia.com/gpu", 0) <= 0:
            continue
        alone = admission([*others, {**job, "kind": "Job"}]).get(w.name)
        via = [c for c in (alone.checks if alone is not None else ()) if c in checks]
        if not via:
            continue
        params = (checks[via[0]].get("spec") or {}).get("parameters") or {}
        cls = ((configs.get(params.get("name")) or {}).get("spec") or {}).get("provisioningClassName", "")
        request = f"{workload_name(w.name, '<uid>')}-{via[0]}-1"
        template = admitted_template((job.get("spec") or {}).get("template") or {}, request, cls)
        if triggers_scale_up(template):
            continue
        out.append(Violation(NAME, w.subject, (
            f"admitted through admission check {via[0]}, its pods carry {CONSUME} (Kueue's podSetUpdates), which "
            "the cluster autoscaler's pods filter never scales up for: a node EC2 did not deliver or a node lost "
            f"later is never replaced; {problem}; expected waitForPodsReady with a timeout and recoveryTimeout "
            "above the autoscaler's max-node-provision-time (eks_ddp.KueueArgs.pods_ready_timeout)")))
    return out


@contract(NAME)
def replacements(view: PlanView) -> list[Violation]:
    """A queued GPU run admitted through a ProvisioningRequest gets lost or undelivered nodes back (module docstring)."""
    return findings(view.manifests, kueue_config(view), max_node_provision_time(view))
