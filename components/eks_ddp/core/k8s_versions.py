"""The EKS Kubernetes version calendar, and the add-on builds pinned for each version.

EKS supports a minor version for 14 months from its EKS release ("standard support", control plane
$0.10/h) and then for 12 more months ("extended support", $0.60/h) before upgrading the cluster itself.
A cluster's ``upgradePolicy.supportType`` decides what happens at the end of standard support:
``EXTENDED`` (the EKS default) keeps the version and bills extended support; ``STANDARD`` upgrades the
cluster to the next version instead. eks-ddp defaults to ``STANDARD`` and to a version in standard support,
so a stack never bills extended support unless asked to (``cluster.upgradePolicy: EXTENDED``).

Dates: the EKS release calendar (docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html,
mirrored at endoflife.date/amazon-eks), checked 2026-11-22. 1.36's dates (:data:`_CALENDAR_1_36`) come
from endoflife.date's amazon-eks entry as quoted elsewhere, not from the EKS page itself: check them against
``aws eks describe-cluster-versions --cluster-version 1.36`` at the next review. Nothing here is looked up at run time: the
calendar is data, reviewed when a version is added (tests/core/test_k8s_versions.py fails once the default
version is within 30 days of leaving standard support).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Literal

from eks_ddp.core.types import UpgradePolicy

Support = Literal["standard", "extended", "ended", "unreleased"]

_CALENDAR_PAGE = "EKS Kubernetes release calendar (kubernetes-versions.html), as endoflife.date/amazon-eks lists it"
_CALENDAR_1_36 = ("endoflife.date/amazon-eks 1.36 entry as quoted in a third-party document (released 2026-06-02, "
                  "standard to 2027-08-02, extended to 2028-08-02); unconfirmed against kubernetes-versions.html")


@dataclass(frozen=True, kw_only=True)
class KubernetesRelease:
    """One Kubernetes minor version on EKS."""

    version: str
    """Minor version, e.g. ``"1.35"``."""
    released: dt.date
    """Available on EKS from this day."""
    end_of_standard: dt.date
    """Last day of standard support ($0.10/h per cluster)."""
    end_of_extended: dt.date
    """Last day of extended support ($0.60/h per cluster); EKS upgrades the cluster after it."""
    source: str
    """Where the dates come from."""


KUBERNETES_SUPPORT_CALENDAR: dict[str, KubernetesRelease] = {r.version: r for r in (
    KubernetesRelease(version="1.31", released=dt.date(2024, 9, 26), end_of_standard=dt.date(2025, 11, 26),
                      end_of_extended=dt.date(2026, 11, 26), source=_CALENDAR_PAGE),
    KubernetesRelease(version="1.32", released=dt.date(2025, 1, 23), end_of_standard=dt.date(2026, 3, 23),
                      end_of_extended=dt.date(2027, 3, 23), source=_CALENDAR_PAGE),
    KubernetesRelease(version="1.33", released=dt.date(2025, 5, 28), end_of_standard=dt.date(2026, 7, 29),
                      end_of_extended=dt.date(2027, 7, 29), source=_CALENDAR_PAGE),
    KubernetesRelease(version="1.34", released=dt.date(2025, 10, 2), end_of_standard=dt.date(2026, 12, 2),
                      end_of_extended=dt.date(2027, 12, 2), source=_CALENDAR_PAGE),
    KubernetesRelease(version="1.35", released=dt.date(2026, 1, 28), end_of_standard=dt.date(2027, 3, 27),
                      end_of_extended=dt.date(2028, 3, 27), source=_CALENDAR_PAGE),
    KubernetesRelease(version="1.36", released=dt.date(2026, 6, 2), end_of_standard=dt.date(2027, 8, 2),
                      end_of_extended=dt.date(2028, 8, 2), source=_CALENDAR_1_36),
)}
"""Kubernetes version -> its EKS support dates. Read by the cost estimate (control-plane price per support
phase: :func:`support_on`) and by preflight/plan warnings (:func:`support_notice`)."""
CALENDAR = KUBERNETES_SUPPORT_CALENDAR

STANDARD_SUPPORT_USD_PER_HOUR = 0.10
"""EKS control plane, per cluster-hour, in standard support (AWS EKS pricing)."""
EXTENDED_SUPPORT_USD_PER_HOUR = 0.60
"""EKS control plane, per cluster-hour, in extended support (AWS EKS pricing)."""

DEFAULT_VERSION = "1.35"
"""The default: the newest version in the calendar, in standard support until 2027-03-27."""
SUPPORTED_VERSIONS = ("1.32", "1.33", "1.34", "1.35", "1.36")
"""Versions a stack may ask for: every version EKS offers in 2026-11 (1.31's extended support ends 2026-11-26,
days after this calendar was last reviewed), each with an add-on build (:data:`ADDON_VERSIONS`) and an
autoscaler pin (``autoscaler.PINS``). Which of them a stack may use on a given day with its upgrade policy:
:func:`policy_problem`."""
DEFAULT_SUPPORT_TYPE: UpgradePolicy = "STANDARD"

# --- add-on builds per Kubernetes version -------------------------------------------------------------
# CreateAddon rejects a build that is not compatible with the cluster's version (InvalidParameterException).
# A build is pinned only where its compatibility with that version is confirmed; for the other supported
# versions the program asks EKS for the version's default build (aws.eks.get_addon_version, most_recent
# False), which is compatible by definition and moves only when EKS changes that default.
# tests/core/test_k8s_versions.py checks every supported version resolves for every add-on.
EFS_CSI_DRIVER = "aws-efs-csi-driver"
METRICS_SERVER = "metrics-server"
COREDNS = "coredns"
CLOUDWATCH_OBSERVABILITY = "amazon-cloudwatch-observability"
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"
# amazon-cloudwatch-observability and eks-node-monitoring-agent take EKS's default build on every version: no
# build of either could be confirmed per Kubernetes version here (that needs `aws eks describe-addon-versions
# --addon-name <name> --kubernetes-version <v>`). Their upstream charts, which the add-ons package, were read at
# aws-observability/helm-charts 6.4.0 (2026-07-21) and aws/eks-node-monitoring-agent 1.7.0 (image
# v1.7.0-eksbuild.1). The configuration eks_ddp.infra.observability sends uses keys the CloudWatch chart reads from
# 4.3.0 (2025-07-24; dcgmExporter.enabled is the newest) and that the agent's configuration.schema.json accepts in
# every version it was published in (from 2026-02). Pin a build here once its compatibility is confirmed, as for 1.33.
FSX_CSI_DRIVER = "aws-fsx-csi-driver"
"""The FSx for Lustre CSI driver's EKS add-on (``storage.backend: fsxLustre``): EKS's default build per version."""
EKS_ADDONS = (EFS_CSI_DRIVER, METRICS_SERVER, COREDNS, CLOUDWATCH_OBSERVABILITY, NODE_MONITORING_AGENT)
"""The add-ons of every stack."""
OPTIONAL_ADDONS = (FSX_CSI_DRIVER,)
"""Add-ons only some stacks install (each has a build entry per version, like :data:`EKS_ADDONS`)."""

EFS_CSI_ADDON_VERSION_1_33 = "v2.1.10-eksbuild.1"
"""aws-efs-csi-driver build listed for Kubernetes 1.33 (``aws eks describe-addon-versions --kubernetes-version 1.33``)."""
METRICS_SERVER_ADDON_VERSION_1_33 = "v0.8.0-eksbuild.2"
"""metrics-server build listed for Kubernetes 1.33 (same source)."""

ADDON_VERSIONS: dict[str, dict[str, str | None]] = {
    version: dict.fromkeys((*EKS_ADDONS, *OPTIONAL_ADDONS)) for version in ("1.32", "1.34", "1.35", "1.36")
}
ADDON_VERSIONS["1.33"] = {**dict.fromkeys((*EKS_ADDONS, *OPTIONAL_ADDONS)), EFS_CSI_DRIVER: EFS_CSI_ADDON_VERSION_1_33,
                          METRICS_SERVER: METRICS_SERVER_ADDON_VERSION_1_33}
"""Kubernetes version -> EKS add-on -> pinned build, or None: EKS's default build for that version."""


# --- node AMI releases ---------------------------------------------------------------------------------
# A managed node group keeps the AMI release it was created with until its release version changes (EKS user guide,
# "Update a managed node group": the AMI changes only through UpdateNodegroupVersion), so nodes the autoscaler
# launches months later would boot an old kernel, NVIDIA driver and containerd. Every node group therefore names
# its release: ``cluster.amiReleaseVersion``, default the pin below for the cluster's version.
#
# The pins: the newest AMI release in awslabs/amazon-eks-ami CHANGELOG.md, "AMI Release v20260714" (the newest
# entry of the stored copy, 81fec2e, 2026-07-23), column "Release version" of amazon-eks-node-al2023-x86_64-nvidia-
# <minor>-v20260714 (the same release version covers the standard AL2023 AMI the system group runs).
# Monthly bump (docs/capacity-and-cost.md): read the newest entry of that CHANGELOG (or
# aws ssm get-parameter --name /aws/service/eks/optimized-ami/<minor>/amazon-linux-2023/x86_64/nvidia/recommended/
# release_version), update AMI_RELEASE_VERSIONS and AMI_RELEASE_DATE, `pulumi up`: every group rolls its nodes
# (MINIMAL in a reservation; a capacity-block group only while it has none: preflight).
AMI_RELEASE_DATE = "2026-07-14"
"""When :data:`AMI_RELEASE_VERSIONS` were the newest releases."""
AMI_RELEASE_VERSIONS: dict[str, str] = {
    "1.32": "1.32.13-20260714", "1.33": "1.33.13-20260714", "1.34": "1.34.9-20260714",
    "1.35": "1.35.6-20260714", "1.36": "1.36.2-20260714",
}
"""Kubernetes minor -> the EKS AL2023 AMI release version pinned for it."""


def ami_release_version(kubernetes_version: str, configured: str | None = None) -> str:
    """The AMI release every node group of a cluster at ``kubernetes_version`` runs: ``configured``, else the pin."""
    return configured or AMI_RELEASE_VERSIONS[kubernetes_version]


def ami_release_problem(key: str, value: str | None, kubernetes_version: str) -> str | None:
    """Why EKS would refuse ``value`` as the release of a node group at ``kubernetes_version`` (release versions are
    ``<major>.<minor>.<patch>-<yyyymmdd>`` of the group's minor), or None."""
    if value is None:
        return None
    m = re.fullmatch(r"(\d+\.\d+)\.\d+-(\d{8})", value)
    if m is None or m.group(1) != kubernetes_version:
        return (f"{key}: got {value!r}; expected an EKS AMI release version of Kubernetes {kubernetes_version}, "
                f"<{kubernetes_version}.patch>-<yyyymmdd>, e.g. {AMI_RELEASE_VERSIONS.get(kubernetes_version, '')}")
    return None


def support_on(version: str, day: dt.date) -> Support:
    """Which EKS support phase ``version`` is in on ``day``."""
    r = CALENDAR[version]
    if day < r.released:
        return "unreleased"
    if day <= r.end_of_standard:
        return "standard"
    if day <= r.end_of_extended:
        return "extended"
    return "ended"


def policy_problem(version: str, support_type: str, day: dt.date) -> str | None:
    """Why EKS would refuse this version with this upgrade policy on ``day``, or None.

    STANDARD means "upgrade me when standard support ends": EKS takes it only for a version still in standard
    support (extended support, once entered, cannot be left: "Disable extended support"). A version past
    extended support, or not yet released, cannot be created at all."""
    r = CALENDAR.get(version)
    if r is None:
        return None
    key = "cluster.kubernetesVersion"
    phase = support_on(version, day)
    if phase == "ended":
        return f"{key}: got {version!r}; EKS extended support for it ended on {r.end_of_extended}; expected " \
               f"one of {', '.join(v for v in SUPPORTED_VERSIONS if support_on(v, day) != 'ended')}"
    if phase == "unreleased":
        return f"{key}: got {version!r}; it is not released on EKS before {r.released}"
    if phase == "extended" and support_type == "STANDARD":
        newer = [v for v in SUPPORTED_VERSIONS if support_on(v, day) == "standard"]
        return (f"cluster.upgradePolicy: got 'STANDARD' with {key} {version!r}, which left EKS standard support "
                f"on {r.end_of_standard}; EKS takes STANDARD only for a version in standard support. Expected "
                f"{key} one of {', '.join(newer)}, or cluster.upgradePolicy 'EXTENDED' (billed $0.60/h)")
    return None


def support_notice(version: str, support_type: str, day: dt.date) -> str | None:
    """A warning when the version costs extended support, or will be upgraded, on ``day``; else None."""
    r = CALENDAR.get(version)
    if r is None:
        return None
    phase = support_on(version, day)
    key = "eks-ddp:cluster.kubernetesVersion"
    if phase == "extended":
        if support_type == "EXTENDED":
            return (f"{key}: Kubernetes {version} left EKS standard support on {r.end_of_standard}; with "
                    f"cluster.upgradePolicy EXTENDED the control plane bills extended support ($0.60/h instead "
                    f"of $0.10/h) until {r.end_of_extended}. Choose {DEFAULT_VERSION} to avoid it.")
        return (f"{key}: Kubernetes {version} left EKS standard support on {r.end_of_standard}, and EKS accepts "
                f"cluster.upgradePolicy STANDARD only for a version in standard support. Choose "
                f"{DEFAULT_VERSION}, or set eks-ddp:cluster.upgradePolicy EXTENDED (billed $0.60/h).")
    if phase == "ended":
        return f"{key}: Kubernetes {version} left EKS extended support on {r.end_of_extended}; choose {DEFAULT_VERSION}."
    if phase == "unreleased":
        return f"{key}: Kubernetes {version} is not released on EKS before {r.released}."
    days_left = (r.end_of_standard - day).days
    if days_left <= 30:
        return (f"{key}: Kubernetes {version} leaves EKS standard support on {r.end_of_standard} "
                f"({days_left} days); then it is upgraded (STANDARD) or billed extended support (EXTENDED).")
    return None
