"""The training namespace, with Pod Security Admission enforcing the 'restricted' profile."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}


KUBE_DNS_LABELS = {"k8s-app": "kube-dns"}
"""Labels of the cluster DNS pods (CoreDNS on EKS) in kube-system."""


def dns_egress() -> k8s.networking.v1.NetworkPolicyEgressRuleArgs:
    """An egress rule to the cluster DNS only (UDP and TCP 53), for pods whose policy restricts egress.

    The VPC CNI policy agent resolves the kube-dns Service to these pods, so the selector admits lookups
    through the Service's ClusterIP."""
    net = k8s.networking.v1
    return net.NetworkPolicyEgressRuleArgs(
        to=[net.NetworkPolicyPeerArgs(
            namespace_selector=k8s.meta.v1.LabelSelectorArgs(
                match_labels={"kubernetes.io/metadata.name": "kube-system"}),
            pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dict(KUBE_DNS_LABELS)))],
        ports=[net.NetworkPolicyPortArgs(port=53, protocol="UDP"), net.NetworkPolicyPortArgs(port=53, protocol="TCP")])


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
    """A pod security context for the 'restricted' profile, running as ``uid``.

    fsGroup makes ``uid`` the group of emptyDir and block volumes. It does nothing on the EFS volume: the
    EFS CSI driver declares no fsGroupPolicy, so kubelet never changes ownership of an RWX volume without
    fsType; there the access point's PosixUser (1000:1000) is applied to every NFS call instead."""
    return k8s.core.v1.PodSecurityContextArgs(
        run_as_non_root=True, run_as_user=uid, run_as_group=uid, fs_group=uid,
        seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"), **extra)
