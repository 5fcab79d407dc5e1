"""Validate a rendered Kueue object against the CRD of the pinned release (tests/fixtures/kueue, v0.16.4) as the API
server would on create.

- The version: ``apiVersion`` must name a version the CRD serves (``spec.versions[].served``).
- The structural schema (``openAPIV3Schema``) with jsonschema, read as the API server reads it: an object schema with
  ``properties`` and no ``additionalProperties`` refuses unknown fields (strict field validation; the server would
  otherwise prune them); ``x-kubernetes-int-or-string`` is an integer or a string; ``x-kubernetes-list-type: set``
  has unique items and ``map`` unique ``x-kubernetes-list-map-keys``; ``nullable`` admits null. ``default``,
  ``x-kubernetes-map-type`` and ``x-kubernetes-preserve-unknown-fields`` (none in these CRDs) change nothing on create.
- The CEL rules (``x-kubernetes-validations``) at every node the object has, each implemented below from its text
  (:data:`CEL`). Transition rules (they read ``oldSelf``) run only on update and are skipped; a rule met that has no
  implementation is reported, so a new rule in a bumped CRD cannot pass unseen (:data:`NOT_EXPRESSED` lists those
  left out on purpose).
- Kueue's own validating webhook for a ClusterQueue's quotas (pkg/webhooks/clusterqueue_webhook.go,
  validateResourceGroups / validateFlavorQuotas): covered resources and flavors each once, and a flavor's i-th
  quota names the i-th covered resource, with a non-negative amount.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "kueue"
PLURAL = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
          "AdmissionCheck": "admissionchecks", "ProvisioningRequestConfig": "provisioningrequestconfigs",
          "WorkloadPriorityClass": "workloadpriorityclasses"}

_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _all(xs: Any, pred: Callable[[Any], bool]) -> bool:
    return all(pred(x) for x in xs or [])


#: CEL rule text (as in the CRD, whitespace collapsed) -> the same predicate over ``self``.
CEL: dict[str, Callable[[Any], bool]] = {
    # ClusterQueue
    "self.flavors.all(x, size(x.resources) == size(self.coveredResources))":
        lambda s: _all(s["flavors"], lambda f: len(f["resources"]) == len(s["coveredResources"])),
    "!(self.reclaimWithinCohort == 'Never' && has(self.borrowWithinCohort) && self.borrowWithinCohort.policy != "
    "'Never')":
        lambda s: not (s.get("reclaimWithinCohort", "Never") == "Never" and "borrowWithinCohort" in s
                       and s["borrowWithinCohort"].get("policy", "Never") != "Never"),
    "!has(self.cohortName) && has(self.resourceGroups) ? self.resourceGroups.all(rg, rg.flavors.all(f, "
    "f.resources.all(r, !has(r.borrowingLimit)))) : true":
        lambda s: "cohortName" in s or "resourceGroups" not in s or _all(s["resourceGroups"], lambda rg: _all(
            rg["flavors"], lambda f: _all(f["resources"], lambda r: "borrowingLimit" not in r))),
    "!has(self.preference) || (self.whenCanBorrow == 'TryNextFlavor' && self.whenCanPreempt == 'TryNextFlavor')":
        lambda s: "preference" not in s or (s.get("whenCanBorrow") == "TryNextFlavor"
                                            and s.get("whenCanPreempt") == "TryNextFlavor"),
    # ResourceFlavor
    "self.all(x, x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])":
        lambda s: _all(s, lambda x: x.get("effect") in _EFFECTS),
    "self.all(x, !has(x.key) ? x.operator == 'Exists' : true)":
        lambda s: _all(s, lambda x: "key" in x or x.get("operator") == "Exists"),
    "self.all(x, has(x.tolerationSeconds) ? x.effect == 'NoExecute' : true)":
        lambda s: _all(s, lambda x: "tolerationSeconds" not in x or x.get("effect") == "NoExecute"),
    "self.all(x, !has(x.operator) || x.operator in ['Equal', 'Exists'])":
        lambda s: _all(s, lambda x: x.get("operator", "Equal") in ("Equal", "Exists")),
    "self.all(x, has(x.operator) && x.operator == 'Exists' ? !has(x.value) : true)":
        lambda s: _all(s, lambda x: not (x.get("operator") == "Exists" and "value" in x)),
    "self.all(x, !has(x.effect) || x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])":
        lambda s: _all(s, lambda x: x.get("effect", "NoSchedule") in _EFFECTS),
    "!has(self.topologyName) || self.nodeLabels.size() >= 1":
        lambda s: "topologyName" not in s or len(s.get("nodeLabels") or {}) >= 1,
}

NOT_EXPRESSED: dict[str, str] = {}
"""Rules of these CRDs a rendered object reaches that :data:`CEL` does not implement, with why (none today)."""


def _norm(rule: str) -> str:
    return " ".join(rule.split()).replace("( ", "(").replace(" )", ")")


@cache
def crd(kind: str) -> dict[str, Any]:
    return yaml.safe_load((CRDS / f"kueue.x-k8s.io_{PLURAL[kind]}.yaml").read_text())


def served_versions(kind: str) -> list[str]:
    return [v["name"] for v in crd(kind)["spec"]["versions"] if v.get("served")]


def _structural(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD schema as jsonschema reads the API server's rules (see the module docstring)."""
    s = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k not in ("default", "nullable")}
    if "pattern" in s and "(?i)" in s["pattern"][1:]:  # Go's RE2 takes a flag anywhere; Python's re only first
        s["pattern"] = "(?i)" + s["pattern"].replace("(?i)", "")
    if schema.get("x-kubernetes-int-or-string"):
        s.pop("type", None)
        s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in s:
        s["type"] = [s["type"], "null"]
    if "properties" in s:
        s["properties"] = {k: _structural(v) for k, v in s["properties"].items()}
        if "additionalProperties" not in s and not schema.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = _structural(s["additionalProperties"])
    if "items" in s:
        s["items"] = _structural(s["items"])
    if schema.get("x-kubernetes-list-type") == "set":
        s["uniqueItems"] = True
    return s


def _openapi(kind: str, version: str) -> dict[str, Any]:
    [v] = [v for v in crd(kind)["spec"]["versions"] if v["name"] == version]
    return v["schema"]["openAPIV3Schema"]


def _walk(schema: dict[str, Any], value: Any, path: str, errors: list[str], missing: set[str]) -> None:
    """The CEL rules and list-map keys at every node of ``value``."""
    if value is None:
        return
    for v in schema.get("x-kubernetes-validations") or []:
        rule = _norm(v["rule"])
        if "oldSelf" in rule:
            continue  # a transition rule: evaluated on update only
        check = CEL.get(rule)
        if check is None:
            if rule not in NOT_EXPRESSED:
                missing.add(rule)
            continue
        if not check(value):
            errors.append(f"{path}: {v.get('message', rule)} (rule {rule})")
    keys = schema.get("x-kubernetes-list-map-keys")
    if keys and isinstance(value, list):
        seen = [tuple(json.dumps(item.get(k)) for k in keys) for item in value]
        if len(seen) != len(set(seen)):
            errors.append(f"{path}: duplicate entries for the map keys {keys}")
    if isinstance(value, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k in value:
                _walk(sub, value[k], f"{path}.{k}", errors, missing)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for k, item in value.items():
                _walk(extra, item, f"{path}.{k}", errors, missing)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _walk(schema["items"], item, f"{path}[{i}]", errors, missing)


def problems(obj: dict[str, Any]) -> list[str]:
    """What the API server would refuse in ``obj`` (a rendered Kueue object), one line each; [] when valid.

    A CEL rule the object reaches that :data:`CEL` does not implement is a problem too (``unexpressed rule``)."""
    obj = copy.deepcopy(obj)
    kind, api = obj.get("kind"), str(obj.get("apiVersion", ""))
    if kind not in PLURAL:
        return [f"kind: got {kind!r}; expected one of {sorted(PLURAL)}"]
    group, _, version = api.partition("/")
    if group != "kueue.x-k8s.io" or version not in served_versions(kind):
        return [f"apiVersion: got {api!r}; expected kueue.x-k8s.io/<one of {served_versions(kind)}>"]
    schema = _openapi(kind, version)
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
              for e in jsonschema.Draft7Validator(_structural(schema)).iter_errors(obj)]
    missing: set[str] = set()
    _walk(schema, obj, kind, errors, missing)
    if kind == "ClusterQueue" and not errors:
        errors += _quota_webhook(obj.get("spec", {}).get("resourceGroups") or [])
    return errors + [f"unexpressed rule: {r}" for r in sorted(missing)]


def _quota_webhook(groups: list[dict[str, Any]]) -> list[str]:
    errors: list[str] = []
    covered = [r for rg in groups for r in rg["coveredResources"]]
    flavors = [f["name"] for rg in groups for f in rg["flavors"]]
    for what, names in (("coveredResources", covered), ("flavors", flavors)):
        if len(names) != len(set(names)):
            errors.append(f"spec.resourceGroups: {what} listed twice: {names}")
    for i, rg in enumerate(groups):
        for j, f in enumerate(rg["flavors"]):
            for k, (r, name) in enumerate(zip(f["resources"], rg["coveredResources"], strict=False)):
                where = f"spec.resourceGroups[{i}].flavors[{j}].resources[{k}]"
                if r["name"] != name:
                    errors.append(f"{where}.name: got {r['name']!r}; must match the name in coveredResources ({name!r})")
                if str(r["nominalQuota"]).lstrip().startswith("-"):
                    errors.append(f"{where}.nominalQuota: got {r['nominalQuota']!r}; must be greater than or equal to 0")
    return errors


def all_rules(kind: str, version: str = "v1beta2") -> list[str]:
    """Every CEL rule of ``kind``'s schema at ``version`` (normalised)."""
    found: list[str] = []

    def visit(s: Any) -> None:
        if isinstance(s, dict):
            found.extend(_norm(v["rule"]) for v in s.get("x-kubernetes-validations") or [])
            for v in s.values():
                visit(v)
        elif isinstance(s, list):
            for v in s:
                visit(v)
    visit(_openapi(kind, version))
    return found


def strict_problems(doc: dict[str, Any], kubernetes_version: str) -> list[str]:
    """A rendered manifest against its schema: a Kueue object against the pinned CRD (:func:`problems`), anything
    else with ``kubernetes-validate`` (strict, for the cluster's version; an unknown kind is an error)."""
    if str(doc.get("apiVersion", "")).startswith("kueue.x-k8s.io/"):
        return problems(doc)
    from kubernetes_validate import validate

    try:
        validate(doc, kubernetes_version, strict=True)
    except Exception as err:  # noqa: BLE001 - every failure, as a line
        return [str(getattr(err, "message", err))]
    return []

