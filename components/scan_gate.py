"""ScanGate: the trainer image's ECR scan findings gate the jobs that run it.

ECR scans the image on push. This resource waits (bounded) for that scan to finish and fails ``pulumi up`` if it
found anything at or above ``fail_at`` severity, naming the image, the counts and the config key. Its output
``image_ref`` is the image reference it checked, and the jobs take their image from that output: a data
dependency, so Kubernetes never receives a Job spec for an image that has not passed (a ``depends_on`` on a
component would not hold its children back). A failed gate leaves the image in ECR and the previous Jobs as they
were; fix the finding (or raise ``image.scanFailSeverity``) and run ``pulumi up`` again.

The check runs in the Pulumi program (a dynamic provider) with boto3 and the stack's AWS profile. Images outside
ECR are not gated (there is no scan to read): :func:`scan_target` returns None for them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import pulumi
import pulumi.dynamic

Severity = Literal["CRITICAL", "HIGH", "MEDIUM", "LOW", "INFORMATIONAL", "disabled"]
SEVERITIES = ("CRITICAL", "HIGH", "MEDIUM", "LOW", "INFORMATIONAL", "UNDEFINED")
"""ECR's severities, worst first (basic scanning's ``findingSeverityCounts`` keys)."""
WAIT_SECONDS = 900
"""How long to wait for ECR's scan on push to finish (basic scans take seconds to minutes)."""
POLL_SECONDS = 10
DONE = ("COMPLETE", "ACTIVE")  # ACTIVE: enhanced scanning (Amazon Inspector) keeps scanning continuously
_ECR_REF = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?"
    r"/(?P<repo>[^@:]+)(?::[^@]+)?@(?P<digest>sha256:[0-9a-f]{64})$")


class ScanGateError(Exception):
    """The image's scan found what the stack refuses to run, or never finished."""


def scan_target(image_ref: str) -> dict[str, str] | None:
    """Registry, region, repository and digest of an ECR image reference by digest; None for other registries."""
    m = _ECR_REF.match(image_ref)
    return None if m is None else {k: m[k] for k in ("account", "region", "repo", "digest")}


def blocking(counts: Mapping[str, int], fail_at: str) -> dict[str, int]:
    """The counts at or above ``fail_at`` that are not zero."""
    worst = SEVERITIES[: SEVERITIES.index(fail_at) + 1]
    return {sev: int(counts[sev]) for sev in worst if int(counts.get(sev, 0)) > 0}


def check_image(ecr: Any, image_ref: str, fail_at: str, *, wait_s: float = WAIT_SECONDS,
                poll_s: float = POLL_SECONDS, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> dict[str, int]:
    """Wait for the ECR scan of ``image_ref`` and return its severity counts; raise ScanGateError if any count
    is at or above ``fail_at``, the scan failed, or it did not finish within ``wait_s``."""
    target = scan_target(image_ref)
    if target is None:
        raise ScanGateError(f"{image_ref}: not an ECR image by digest; nothing to gate")
    key = "eks-ddp:image.scanFailSeverity"
    deadline = clock() + wait_s
    while True:
        try:
            found = ecr.describe_image_scan_findings(
                registryId=target["account"], repositoryName=target["repo"],
                imageId={"imageDigest": target["digest"]})
            status = found["imageScanStatus"]["status"]
        except ecr.exceptions.ScanNotFoundException:
            found, status = {}, "PENDING"  # scan on push not started yet
        if status in DONE:
            counts = dict(found.get("imageScanFindings", {}).get("findingSeverityCounts") or {})
            bad = blocking(counts, fail_at)
            if bad:
                raise ScanGateError(
                    f"{image_ref}: ECR scan found {bad} (all counts: {counts}), at or above {key} {fail_at!r}; "
                    f"fix the image, or set {key} to a higher severity or 'disabled' (aws ecr describe-image-scan-"
                    f"findings --repository-name {target['repo']} --image-id imageDigest={target['digest']})")
            return counts
        if status not in ("IN_PROGRESS", "PENDING"):
            raise ScanGateError(f"{image_ref}: ECR scan status {status!r} "
                                f"({found.get('imageScanStatus', {}).get('description', '')}); expected COMPLETE")
        if clock() >= deadline:
            raise ScanGateError(f"{image_ref}: ECR scan still {status} after {wait_s:.0f} s; run `pulumi up` again")
        sleep(poll_s)


class _Provider(pulumi.dynamic.ResourceProvider):
    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        import boto3  # the program's environment: botocore ships with pulumi_aws's users, and the trainer pins it

        target = scan_target(props["image_ref"])
        session = boto3.Session(profile_name=props.get("profile") or None,
                                region_name=target["region"] if target else None)
        counts = check_image(session.client("ecr"), props["image_ref"], props["fail_at"])
        return pulumi.dynamic.CreateResult(id_=props["image_ref"].rsplit("@", 1)[1], outs={**props, "counts": counts})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = [k for k in ("image_ref", "fail_at") if olds.get(k) != news.get(k)]
        return pulumi.dynamic.DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)


class ScanGate(pulumi.dynamic.Resource):
    """Passes ``image_ref`` through only once ECR's scan of it shows nothing at or above ``fail_at``."""

    image_ref: pulumi.Output[str]
    counts: pulumi.Output[dict]

    def __init__(self, name: str, *, image_ref: pulumi.Input[str], fail_at: str, profile: str | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        if fail_at not in SEVERITIES[:-1]:
            raise ValueError(f"fail_at: got {fail_at!r}; expected one of {', '.join(SEVERITIES[:-1])}")
        super().__init__(_Provider(), name, {"image_ref": image_ref, "fail_at": fail_at, "profile": profile,
                                             "counts": None}, opts)
