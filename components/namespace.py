"""The training namespace, with Pod Security Admission enforcing the 'restricted' profile."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}


def training_namespace(name: str, opts: pulumi.ResourceOptions | None = None) -> k8s.core.v1.Namespace:
    """Create ``name``; every pod in it must be non-root, drop capabilities and use seccomp."""
    return k8s.core.v1.Namespace(
        f"ns-{name}",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=name, labels={"app.kubernetes.io/part-of": "eks-ddp", **POD_SECURITY_LABELS}),
        opts=opts,
    )
