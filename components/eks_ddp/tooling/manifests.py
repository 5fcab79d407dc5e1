"""The Kubernetes objects a recorded program would apply, as the API server would receive them: what the offline
plan writes (``eks-ddp-plan --out``) and what the platform contracts read (``tooling/contracts``)."""

from __future__ import annotations

from typing import Any

from eks_ddp.tooling.mocks import ProgramResult, Recorded

# Not manifests: providers, and Helm releases (their charts render in the cluster).
_NOT_MANIFESTS = ("pulumi:providers:", "kubernetes:helm.sh/")


def render_manifests(result: ProgramResult) -> list[dict[str, Any]]:
    """Kubernetes objects as they would be applied, from the recorded inputs."""
    manifests = []
    for r in result.resources:
        if not r.type.startswith("kubernetes:") or r.type.startswith(_NOT_MANIFESTS) or not r.custom:
            continue
        manifests.append(_manifest(r))
    return manifests


def _manifest(r: Recorded) -> dict[str, Any]:
    inputs = _ints(r.inputs)
    body = {k: v for k, v in inputs.items() if k not in ("apiVersion", "kind", "metadata")}
    metadata = dict(inputs.get("metadata") or {})
    metadata.setdefault("name", r.name)
    return {"apiVersion": inputs.get("apiVersion"), "kind": inputs.get("kind"), "metadata": metadata, **body}


_SECRET_SIG = "4dabf18193072939515e22adb298388d"
"""Pulumi's marker of a secret value on the wire (``{sig: ..., value: ...}``)."""


def _ints(value: Any) -> Any:
    """Whole-number floats back to ints: the engine's wire format carries every number as a float,
    and the API server (and scanners) reject ``replicas: 1.0``. Secret envelopes (a Secret's stringData;
    under mocks they hold placeholders) are opened to their value, as the API server receives it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict) and _SECRET_SIG in value and "value" in value:
        return _ints(value["value"])
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value
