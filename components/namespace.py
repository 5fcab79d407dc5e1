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


def restricted_container_security(uid: int) -> k8s.core.v1.SecurityContextArgs:
    """A container security context that the 'restricted' profile admits, running as ``uid``."""
    return k8s.core.v1.SecurityContextArgs(
        run_as_non_root=True, run_as_user=uid, run_as_group=uid,
        allow_privilege_escalation=False, read_only_root_filesystem=True,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"))


def restricted_pod_security(uid: int, **extra: str) -> k8s.core.v1.PodSecurityContextArgs:
    """A pod security context for the 'restricted' profile: ``uid`` owns mounted volumes (fsGroup)."""
    return k8s.core.v1.PodSecurityContextArgs(
        run_as_non_root=True, run_as_user=uid, run_as_group=uid, fs_group=uid,
        seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"), **extra)
