"""ScanGate: an image's ECR scan findings gate the jobs that run it (the trainer image and every run image).

ECR scans the image on push. This resource waits (bounded) for that scan to finish and fails ``pulumi up`` if it
found anything at or above ``fail_at`` severity, naming the image, the counts and the config key. Its output
``image_ref`` is the image reference it checked, and the jobs take their image from that output: a data
dependency, so Kubernetes never receives a Job spec for an image that has not passed (a ``depends_on`` on a
component would not hold its children back). A failed gate leaves the image in ECR and the previous Jobs as they
were; fix the finding (or raise the severity setting) and run ``pulumi up`` again. Every message names the
setting of the caller's context (``setting``): the stack key ``eks-ddp:image.scanFailSeverity`` for the stack's
program, the Args field (``TrainerImageArgs.scan_fail_severity`` ...) for a program of your own.

An image that has no scan at all (its repository does not scan on push, or it was pushed before scanning was
turned on) fails at once with what to do, instead of waiting for a scan that never comes: ECR answers
``ScanNotFoundException`` for it ("The specified image scan could not be found. Ensure that image scanning is
enabled on the repository", botocore's ECR service model), and an image pushed more than ``NOT_FOUND_GRACE_S``
ago will not get a scan on push any more. A freshly pushed image (the stack's own build) is given that grace.

The check runs in the Pulumi program (a dynamic provider) with boto3 and the stack's AWS profile. Images outside
ECR are not gated (there is no scan to read): :func:`scan_target` returns None for them.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import pulumi
import pulumi.dynamic
from botocore.exceptions import BotoCoreError, ClientError

SEVERITIES = ("CRITICAL", "HIGH", "MEDIUM", "LOW", "INFORMATIONAL", "UNDEFINED")
"""ECR's severities, worst first (basic scanning's ``findingSeverityCounts`` keys)."""
WAIT_SECONDS = 900
"""How long to wait for ECR's scan on push to finish (basic scans take seconds to minutes)."""
POLL_SECONDS = 10
NOT_FOUND_GRACE_S = 120
"""How long after its push an image may have no scan yet (scan on push starts within seconds); past that, a
missing scan is final."""
STACK_SETTING = "eks-ddp:image.scanFailSeverity"
"""The stack config's key for the severity (the repository's program); library callers name their Args field."""
DONE = ("COMPLETE", "ACTIVE")  # ACTIVE: enhanced scanning (Amazon Inspector) keeps scanning continuously
_ECR_REF = re.compile(  # the IPv4 (and FIPS) registry host, or the dual-stack one (<id>.dkr-ecr.<region>.on.aws)
    r"^(?P<account>\d{12})\.(?:dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?"
    r"|dkr-ecr\.(?P<dual>[a-z0-9-]+)\.on\.aws)/(?P<repo>[^@:]+)(?::[^@]+)?@(?P<digest>sha256:[0-9a-f]{64})$")


class ScanGateError(Exception):
    """The image's scan found what the stack refuses to run, or never finished."""


def scan_target(image_ref: str) -> dict[str, str] | None:
    """Registry, region, repository and digest of an ECR image reference by digest; None for other registries."""
    m = _ECR_REF.match(image_ref)
    if m is None:
        return None
    return {"account": m["account"], "region": m["region"] or m["dual"], "repo": m["repo"], "digest": m["digest"]}


def blocking(counts: Mapping[str, int], fail_at: str) -> dict[str, int]:
    """The counts at or above ``fail_at`` that are not zero."""
    worst = SEVERITIES[: SEVERITIES.index(fail_at) + 1]
    return {sev: int(counts[sev]) for sev in worst if int(counts.get(sev, 0)) > 0}


def check_image(ecr: Any, image_ref: str, fail_at: str, *, setting: str, wait_s: float = WAIT_SECONDS,
                poll_s: float = POLL_SECONDS, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic,
                now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> dict[str, int]:
    """Wait for the ECR scan of ``image_ref`` and return its severity counts; raise ScanGateError if any count
    is at or above ``fail_at``, the scan failed, there is no scan of the image, or it did not finish within
    ``wait_s``. ``setting`` names the knob the caller sets the severity with (in every message)."""
    target = scan_target(image_ref)
    if target is None:
        raise ScanGateError(f"{image_ref}: not an ECR image by digest; nothing to gate")
    ids = {"registryId": target["account"], "repositoryName": target["repo"]}
    deadline = clock() + wait_s
    missing_since: float | None = None
    while True:
        try:
            found = ecr.describe_image_scan_findings(**ids, imageId={"imageDigest": target["digest"]})
            status = found["imageScanStatus"]["status"]
        except ecr.exceptions.ScanNotFoundException:
            found, status = {}, "NOT_FOUND"
        except (ClientError, BotoCoreError) as err:  # say which permission or setting, not a traceback
            raise ScanGateError(_api_error(image_ref, target, setting, err)) from None
        if status in DONE:
            counts = dict(found.get("imageScanFindings", {}).get("findingSeverityCounts") or {})
            bad = blocking(counts, fail_at)
            if bad:
                raise ScanGateError(
                    f"{image_ref}: ECR scan found {bad} (all counts: {counts}), at or above {setting} {fail_at!r}; "
                    f"fix the image, or set {setting} to a higher severity or 'disabled' (aws ecr describe-image-scan-"
                    f"findings --registry-id {target['account']} --repository-name {target['repo']} "
                    f"--image-id imageDigest={target['digest']})")
            return counts
        if status == "NOT_FOUND":
            missing_since = clock() if missing_since is None else missing_since
            age = _pushed_seconds_ago(ecr, ids, target["digest"], now)
            waited = clock() - missing_since
            if (age if age is not None else waited) >= NOT_FOUND_GRACE_S:
                raise ScanGateError(_no_scan(image_ref, target, setting, age))
        elif status not in ("IN_PROGRESS", "PENDING"):
            raise ScanGateError(f"{image_ref}: ECR scan status {status!r} "
                                f"({found.get('imageScanStatus', {}).get('description', '')}); expected COMPLETE, "
                                f"or set {setting} to 'disabled' to run the image unscanned")
        if clock() >= deadline:
            raise ScanGateError(f"{image_ref}: ECR scan still {status} after {wait_s:.0f} s; run `pulumi up` again")
        sleep(poll_s)


def _pushed_seconds_ago(ecr: Any, ids: dict[str, str], digest: str, now: Callable[[], dt.datetime]) -> float | None:
    """Seconds since the image was pushed (``ecr:DescribeImages``), or None when ECR does not say."""
    try:
        details = ecr.describe_images(**ids, imageIds=[{"imageDigest": digest}])["imageDetails"]
        pushed = details[0]["imagePushedAt"]
    except (ClientError, BotoCoreError, KeyError, IndexError, AttributeError):
        # no permission, or no push time: fall back to the time spent waiting
        return None
    if pushed.tzinfo is None:
        pushed = pushed.replace(tzinfo=dt.UTC)
    return max(0.0, (now() - pushed).total_seconds())


def _no_scan(image_ref: str, target: dict[str, str], setting: str, age: float | None) -> str:
    where = f"--registry-id {target['account']} --repository-name {target['repo']}"
    pushed = f"pushed {age / 60:.0f} min ago" if age is not None else f"none after {NOT_FOUND_GRACE_S} s"
    return (f"{image_ref}: ECR has no scan of this image ({pushed}; ScanNotFoundException): its repository does not "
            f"scan on push, or the image was pushed before scanning was turned on, so no scan will come. Scan it "
            f"now: aws ecr start-image-scan {where} --image-id imageDigest={target['digest']}, then run `pulumi up` "
            f"again; scan later images on push: aws ecr put-image-scanning-configuration {where} "
            f"--image-scanning-configuration scanOnPush=true; or set {setting} to 'disabled' to run it unscanned")


def _api_error(image_ref: str, target: dict[str, str], setting: str, err: Exception) -> str:
    code = getattr(err, "response", {}).get("Error", {}).get("Code", type(err).__name__)
    text = f"{image_ref}: could not read its ECR scan (ecr:DescribeImageScanFindings: {code}: {err})"
    if "Denied" in code or "Unauthorized" in code:
        text += (f"; allow ecr:DescribeImageScanFindings on arn:*:ecr:{target['region']}:{target['account']}:"
                 f"repository/{target['repo']} to the principal that runs `pulumi up` (for another account's "
                 "repository, in its repository policy too)")
    return f"{text}; or set {setting} to 'disabled' to run the image unscanned"


class _Provider(pulumi.dynamic.ResourceProvider):
    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        import boto3  # the program's environment: botocore ships with pulumi_aws's users, and the trainer pins it

        target = scan_target(props["image_ref"])
        session = boto3.Session(profile_name=props.get("profile") or None,
                                region_name=target["region"] if target else None)
        counts = check_image(session.client("ecr"), props["image_ref"], props["fail_at"],
                             setting=props.get("setting") or STACK_SETTING)
        return pulumi.dynamic.CreateResult(id_=props["image_ref"].rsplit("@", 1)[1], outs={**props, "counts": counts})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changed = [k for k in ("image_ref", "fail_at") if olds.get(k) != news.get(k)]  # not ``setting``: a name
        return pulumi.dynamic.DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)


class ScanGate(pulumi.dynamic.Resource):
    """Passes ``image_ref`` through only once ECR's scan of it shows nothing at or above ``fail_at``."""

    image_ref: pulumi.Output[str]
    counts: pulumi.Output[dict]

    def __init__(self, name: str, *, image_ref: pulumi.Input[str], fail_at: str, setting: str,
                 profile: str | None = None, opts: pulumi.ResourceOptions | None = None):
        """``setting``: what the caller sets ``fail_at`` with, named in every failure (a stack key such as
        :data:`STACK_SETTING`, or an Args field such as ``TrainerImageArgs.scan_fail_severity``)."""
        if fail_at not in SEVERITIES[:-1]:
            raise ValueError(f"fail_at: got {fail_at!r}; expected one of {', '.join(SEVERITIES[:-1])}")
        super().__init__(_Provider(), name, {"image_ref": image_ref, "fail_at": fail_at, "profile": profile,
                                             "setting": setting, "counts": None}, opts)
