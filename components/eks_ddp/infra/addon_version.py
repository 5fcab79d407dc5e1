"""The build of an EKS add-on a cluster installs: the pin from the calendar (core/k8s_versions.py), else EKS's
default build for the cluster's version, looked up at deploy time."""

from __future__ import annotations

import pulumi_aws as aws

from eks_ddp.core import k8s_versions


def addon_version(addon: str, kubernetes_version: str, *, opts=None):
    """The build of an EKS add-on for a cluster version: the pin, else EKS's default build (an Output).

    ``opts`` are the invoke options (parent) for the lookup. KeyError names an unknown version/add-on.
    """
    try:
        pinned = k8s_versions.ADDON_VERSIONS[kubernetes_version][addon]
    except KeyError:
        raise KeyError(f"no {addon} build known for Kubernetes {kubernetes_version}; "
                       f"supported versions: {', '.join(sorted(k8s_versions.ADDON_VERSIONS))}") from None
    if pinned is not None:
        return pinned
    return aws.eks.get_addon_version_output(addon_name=addon, kubernetes_version=kubernetes_version,
                                            most_recent=False, opts=opts).version
