"""The training namespace, with Pod Security Admission enforcing the 'restricted' profile."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}


CLUSTER_NAMESPACES = ("default", "kube-public", "kube-node-lease")
"""The namespaces every cluster has besides kube-system (whose add-ons need host access and which Pod Security
Admission exempts in practice): :func:`label_cluster_namespaces` gives each a Pod Security profile."""
CLUSTER_NAMESPACE_PSA = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}
"""'baseline' enforced (no privileged, hostNetwork, hostPID, hostIPC or hostPath pod: from the host network a pod
reaches the instance metadata service past the hop limit, and with it the node role), 'restricted' warned and
audited: a hand-made ``kubectl run`` in ``default`` still works, and says what it would need."""


def label_cluster_namespaces(name: str, opts: pulumi.ResourceOptions | None = None) -> list[k8s.core.v1.NamespacePatch]:
    """Patch (server-side apply) the Pod Security labels onto :data:`CLUSTER_NAMESPACES`: the cluster creates them,
    so they are patched, not created; ``pulumi destroy`` gives the labels back (EKS Best Practices, pod security:
    "Use Pod Security Admission labels on every namespace"; CIS EKS 4.2.1-4.2.5)."""
    return [k8s.core.v1.NamespacePatch(
        f"{name}-{ns}", metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=ns, labels=dict(CLUSTER_NAMESPACE_PSA)),
        opts=opts) for ns in CLUSTER_NAMESPACES]


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
    """Create ``name``; every pod in it must be non-root, drop capabilities and use seccomp, and gets no
    traffic and no API token unless a policy or ServiceAccount of its own grants it (:class:`NamespaceBaseline`)."""
    ns = k8s.core.v1.Namespace(
        f"ns-{name}",
        metadata=k8s.meta.v1.ObjectMetaArgs(
            name=name, labels={"app.kubernetes.io/part-of": "eks-ddp", **POD_SECURITY_LABELS}),
        opts=opts,
    )
    NamespaceBaseline(f"ns-{name}", ns.metadata.name, opts=opts)
    return ns


class NamespaceBaseline(pulumi.ComponentResource):
    """Deny by default in a namespace: a NetworkPolicy selecting every pod for both directions with no rule
    (NetworkPolicies add up, so each workload's own policy opens exactly what it needs; CIS EKS 4.3.2, EKS Best
    Practices "Create a default deny policy"), and the ``default`` ServiceAccount patched to mount no API token
    (CIS EKS 4.1.5): a hand-made pod (``kubectl run``, ``kubectl debug``) gets neither."""

    def __init__(self, name: str, namespace: pulumi.Input[str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:namespace:NamespaceBaseline", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        net = k8s.networking.v1
        net.NetworkPolicy(
            f"{name}-default-deny",
            metadata=k8s.meta.v1.ObjectMetaArgs(name="default-deny", namespace=namespace),
            spec=net.NetworkPolicySpecArgs(pod_selector=k8s.meta.v1.LabelSelectorArgs(),
                                           policy_types=["Ingress", "Egress"]),
            opts=child)
        # A patch (server-side apply), not a ServiceAccount: the namespace controller creates "default" itself.
        k8s.core.v1.ServiceAccountPatch(
            f"{name}-default-sa",
            metadata=k8s.meta.v1.ObjectMetaPatchArgs(name="default", namespace=namespace),
            automount_service_account_token=False, opts=child)
        self.register_outputs({})


def priority_class_guard(name: str, class_name: pulumi.Input[str], namespace: pulumi.Input[str], max_pods: int,
                         opts: pulumi.ResourceOptions) -> None:
    """Let only ``max_pods`` pods of ``namespace``, and no pod anywhere else, use the PriorityClass ``class_name``.

    A PriorityClass is cluster-scoped: without this any pod in any namespace could name it and preempt other work
    (EKS Best Practices, multi-tenancy "Pod priority and preemption"). Inside ``namespace`` a ResourceQuota scoped to
    the class caps its pods; everywhere else a ValidatingAdmissionPolicy (GA since Kubernetes 1.30, so on every
    supported version; EKS does not let us set the API server's ``limitedResources`` quota configuration) denies
    pods that name it."""
    both = pulumi.Output.all(class_name, namespace)
    k8s.core.v1.ResourceQuota(
        f"{name}-priority-quota",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{name}-priority", namespace=namespace),
        spec=k8s.core.v1.ResourceQuotaSpecArgs(
            hard={"pods": str(max_pods)},
            scope_selector=k8s.core.v1.ScopeSelectorArgs(match_expressions=[
                k8s.core.v1.ScopedResourceSelectorRequirementArgs(
                    scope_name="PriorityClass", operator="In", values=[class_name])])),
        opts=opts)
    adm = k8s.admissionregistration.v1
    vap = adm.ValidatingAdmissionPolicy(
        f"{name}-priority-policy",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=both.apply(lambda v: f"{v[0]}-only-in-{v[1]}")),
        spec=adm.ValidatingAdmissionPolicySpecArgs(
            failure_policy="Fail",
            match_constraints=adm.MatchResourcesArgs(resource_rules=[adm.NamedRuleWithOperationsArgs(
                api_groups=[""], api_versions=["v1"], operations=["CREATE", "UPDATE"], resources=["pods"])]),
            validations=[adm.ValidationArgs(
                # has() first: most pods name no class, and an error on a missing field would deny them all.
                expression=both.apply(
                    lambda v: f"!has(object.spec.priorityClassName) || object.spec.priorityClassName != '{v[0]}'"),
                message=both.apply(lambda v: f"the PriorityClass {v[0]} is reserved for namespace {v[1]}"))]),
        opts=opts)
    adm.ValidatingAdmissionPolicyBinding(
        f"{name}-priority-binding",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=vap.metadata.name),
        spec=adm.ValidatingAdmissionPolicyBindingSpecArgs(
            policy_name=vap.metadata.name, validation_actions=["Deny"],
            match_resources=adm.MatchResourcesArgs(namespace_selector=k8s.meta.v1.LabelSelectorArgs(
                match_expressions=[k8s.meta.v1.LabelSelectorRequirementArgs(
                    key="kubernetes.io/metadata.name", operator="NotIn", values=[namespace])]))),
        opts=opts)


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
