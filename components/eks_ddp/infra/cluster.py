"""The EKS control plane, the node IAM role and security group, and the CPU system node group.

``pulumi_eks.Cluster`` runs the control plane with no default node group, API
authentication (access entries, no aws-auth ConfigMap), an OIDC provider for
IRSA, all control-plane log types (kept ``log_retention_days`` in CloudWatch),
Kubernetes secrets encrypted with a KMS key of its own (rotation on), and an API
endpoint that is private plus public only to ``public_access_cidrs`` (or private only, with
``endpoint_public_access=False``).

Security groups are ours, not pulumi_eks's defaults, so every rule is visible
and testable: every node carries the EKS-created *cluster* security group (which
lets the control plane and the nodes talk, as EKS sets it up for managed node
groups) and our *node* security group, which admits traffic only from itself and
is what EFS and EFA open to. No rule admits 0.0.0.0/0.

The node role gets the two AWS policies a node needs (worker, VPC CNI: kept on the node role rather
than given to ``aws-node`` through IRSA, because the vpc-cni add-on is pulumi_eks's and the IMDS hop
limit of 1 already keeps pods from borrowing the node's credentials; only host-network pods could) plus an
inline policy that pulls images only from the regional EKS add-on registry
(``ADDON_REGISTRY_ACCOUNTS``). It deliberately lacks AmazonEC2ContainerRegistryReadOnly
(pull from every repository in the account): the trainer image component grants
pull on its own repository to ``node_role_name``, and :class:`eks_ddp.infra.workload_image.WorkloadImage` (which an
``ElasticJob`` given ``node_role_name`` makes) on each run image's repository.

The system node group (``eks-ddp/pool=system``) runs CoreDNS, add-on controllers
and etcd; GPU groups are :class:`eks_ddp.infra.gpu_nodegroup.GpuNodeGroup`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from eks_ddp.core import catalog, k8s_versions, rules
from eks_ddp.core.ownership import STACK_TAG, legacy_owner  # noqa: F401 (STACK_TAG: the owner tag, as cluster.STACK_TAG)
from eks_ddp.core.types import UpgradePolicy
from eks_ddp.infra.addon_version import addon_version
from eks_ddp.infra.node_user_data import node_user_data

LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
"""Every EKS control-plane log type."""

CLOUDWATCH_RETENTION_DAYS = rules.CLOUDWATCH_RETENTION_DAYS

SYSTEM_POOL_LABELS = {"eks-ddp/pool": "system"}
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
SYSTEM_ROOT_VOLUME_GIB = 50

CLUSTER_ADMIN_POLICY_ARN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
"""In the ``aws`` partition; :func:`cluster_admin_policy_arn` for the region's."""


def cluster_admin_policy_arn(partition: str) -> str:
    return CLUSTER_ADMIN_POLICY_ARN.replace("arn:aws:", f"arn:{partition}:", 1)


VIEW_POLICY_ARN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"
"""EKS's counterpart of Kubernetes' ``view`` role: read most objects and pod logs, no Secrets, no changes (EKS user
guide, "Review access policy permissions")."""

DEFAULT_ADDON_REGISTRY_ACCOUNT = "602401143452"
ADDON_REGISTRY_ACCOUNTS = {
    # Regions whose EKS add-on images live outside the default account, from the AWS EKS user guide
    # "View Amazon container image registries for Amazon EKS add-ons" (add-ons-images.html).
    "af-south-1": "877085696533",
    "ap-east-1": "800184023465",
    "ap-east-2": "533267051163",
    "ap-south-2": "900889452093",
    "ap-southeast-3": "296578399912",
    "ap-southeast-4": "491585149902",
    "ap-southeast-5": "151610086707",
    "ap-southeast-6": "333609536671",
    "ap-southeast-7": "121268973566",
    "ca-west-1": "761377655185",
    "cn-north-1": "918309763551",
    "cn-northwest-1": "961992271922",
    "eu-central-2": "900612956339",
    "eu-south-1": "590381155156",
    "eu-south-2": "455263428931",
    "il-central-1": "066635153087",
    "me-central-1": "759879836304",
    "me-south-1": "558608220178",
    "mx-central-1": "730335286997",
    "us-gov-east-1": "151742754352",
    "us-gov-west-1": "013241004608",
}

EFA_PLUGIN_IMAGE_REPOSITORY_ARN = "arn:aws:ecr:us-west-2:602401143452:repository/eks/aws-efa-k8s-device-plugin"
"""The EFA device plugin chart pulls from the us-west-2 EKS registry in every region (its values.yaml default)."""


def addon_registry_account(region: str) -> str:
    """AWS account of the EKS add-on image registry in ``region``."""
    return ADDON_REGISTRY_ACCOUNTS.get(region, DEFAULT_ADDON_REGISTRY_ACCOUNT)


def node_image_pull_policy(region: str, partition: str = "aws") -> dict:
    """Least-privilege image pulls for nodes: the EKS add-on registry of ``region`` and the EFA plugin image."""
    account = addon_registry_account(region)
    efa_repo = EFA_PLUGIN_IMAGE_REPOSITORY_ARN.replace("arn:aws:", f"arn:{partition}:", 1)
    return {
        "Version": "2012-10-17",
        "Statement": [
            # GetAuthorizationToken has no resource-level permissions: "*" is the only valid resource.
            {"Sid": "EcrLogin", "Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
            {"Sid": "PullEksAddonImages", "Effect": "Allow",
             "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
             "Resource": sorted({f"arn:{partition}:ecr:{region}:{account}:repository/*", efa_repo})},
        ],
    }


@dataclass(frozen=True, kw_only=True)
class EksClusterArgs:
    """Inputs of :class:`EksCluster`."""

    cluster_name: str
    """Physical EKS cluster name (fixed, so log group and tags can name it up front)."""
    vpc_id: pulumi.Input[str]
    """VPC of the cluster."""
    public_subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    """Public subnets, for internet-facing load balancers only (no nodes go there)."""
    private_subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    """Private subnets for the control-plane ENIs and every node (an Output is taken as it is: its count is then
    EKS's to check)."""
    public_access_cidrs: pulumi.Input[Sequence[pulumi.Input[str]]] = ()
    """CIDRs allowed to reach the public API endpoint, e.g. your IP as a /32 (none with
    ``endpoint_public_access=False``). Checked like the stack config's; an Output (or Output entry) is
    passed through unchecked."""
    endpoint_public_access: bool = True
    """Also serve the API on a public endpoint, to ``public_access_cidrs`` only. False: private only (CIS EKS
    5.4.2); the deploy then runs from the VPC or a network joined to it."""
    kubernetes_version: str = k8s_versions.DEFAULT_VERSION
    """Pinned EKS Kubernetes version; upgrade deliberately."""
    ami_release_version: str | None = None
    """EKS AMI release of the system nodes; None: ``k8s_versions.AMI_RELEASE_VERSIONS`` for the version."""
    upgrade_policy: UpgradePolicy = k8s_versions.DEFAULT_SUPPORT_TYPE
    """``STANDARD``: EKS upgrades the cluster at the end of standard support ($0.10/h); ``EXTENDED`` (the
    EKS default when unset, so always set here) keeps the version and bills extended support ($0.60/h)."""
    system_instance_type: str = "t3.large"
    """CPU instance type of the system node group."""
    system_node_count: int = 2
    """Nodes in the system node group."""
    lustre_client: bool = False
    """Install the Lustre client on the system nodes at boot (``infra.node_user_data.lustre_client_script``): with FSx
    for Lustre as shared storage, its layout Job mounts the file system there."""
    log_retention_days: int = 30
    """CloudWatch retention of the control-plane logs (one of CloudWatch's allowed values)."""
    aws_profile: str | None = None
    """The stack's ``aws:profile``: the kubeconfig's ``aws eks get-token`` runs with it, so the Kubernetes
    provider authenticates as the same principal as the AWS provider (not the default credential chain)."""
    admin_principal_arns: Sequence[str] = ()
    """IAM roles/users that get cluster-admin (an access entry with AmazonEKSClusterAdminPolicy), besides the
    principal that creates the cluster: a teammate or a CI role."""
    viewer_principal_arns: Sequence[str] = ()
    """IAM roles/users that may only look: follow a run's logs and see its objects, no Secrets, no changes (an
    access entry with AmazonEKSViewPolicy, cluster scope)."""
    tags: dict[str, str] | None = None
    """Extra tags for the AWS resources."""
    stack_id: str | None = None
    """The stack's owner id (``eks_ddp.core.ownership.owner_id``: ``<organization>/<project>/<stack>``, plus
    ``/<cluster.ownerId>`` on a self-managed backend), tagged on the EKS cluster and its log group
    (``eks-ddp/stack``) so preflight and the log group's adoption can tell this stack's from another's."""


def validate(args: EksClusterArgs) -> None:
    """Raise ValueError naming the bad field: the stack config's rules. A field the program needs as a value
    (names, counts, the version) refuses an Output with a message; Input fields skip their value checks."""
    need = "known when the program runs"
    rules.require(
        rules.known("cluster_name", args.cluster_name, "a string", "it names the log group and the roles")
        or rules.cluster_name("cluster_name", args.cluster_name),
        *[rules.known(f, getattr(args, f), "a plain value", need) for f in (
            "kubernetes_version", "system_instance_type", "endpoint_public_access", "admin_principal_arns",
            "viewer_principal_arns")],
        rules.whole("system_node_count", args.system_node_count, 1),
        rules.known("log_retention_days", args.log_retention_days, "a number of days", need)
        or rules.retention_days("log_retention_days", args.log_retention_days))
    if args.kubernetes_version not in k8s_versions.SUPPORTED_VERSIONS:
        raise ValueError(f"kubernetes_version: got {args.kubernetes_version!r}; expected one of "
                         + ", ".join(k8s_versions.SUPPORTED_VERSIONS))
    if bad := k8s_versions.ami_release_problem("ami_release_version", args.ami_release_version,
                                               args.kubernetes_version):
        raise ValueError(bad)
    if args.system_instance_type not in catalog.cpu_types():
        raise ValueError(f"system_instance_type: got {args.system_instance_type!r}; expected one of "
                         + ", ".join(catalog.cpu_types()) + ", or a type added with catalog.register(InstanceType(...))")
    # Documentation-range placeholders are the stack config's to reject (its message says which
    # `pulumi config set` fixes them); the offline plan renders example stacks that still hold them.
    # An Output (a StackReference's list) is passed through unchecked, as are Output entries.
    cidrs = rules.plain_list(args.public_access_cidrs)
    if cidrs is not None and args.endpoint_public_access and (rules.outputs_skipped(cidrs) or not cidrs):
        rules.require(*rules.public_access_cidrs("public_access_cidrs", rules.outputs_skipped(cidrs),
                                                 placeholders_ok=True))
    elif cidrs and not args.endpoint_public_access:
        raise ValueError(f"public_access_cidrs: got {cidrs!r}; expected none with "
                         "endpoint_public_access=False (the API endpoint is private only)")
    if (subnets := rules.plain_list(args.private_subnet_ids)) is not None and len(subnets) < 2:
        raise ValueError("private_subnet_ids: expected at least 2 subnets in 2 zones (EKS requires two)")
    rules.require(*[rules.iam_principal(f"{key}[{i}]", arn)
                    for key in ("admin_principal_arns", "viewer_principal_arns")
                    for i, arn in enumerate(getattr(args, key))])
    # EKS takes one access entry per principal (CreateAccessEntry: ResourceInUseException).
    seen: set[str] = set()
    for key in ("admin_principal_arns", "viewer_principal_arns"):
        for i, arn in enumerate(getattr(args, key)):
            if arn in seen:
                raise ValueError(f"{key}[{i}]: got {arn!r} a second time; expected each principal once, in "
                                 "admin_principal_arns or viewer_principal_arns (one access entry each)")
            seen.add(arn)
    if args.upgrade_policy not in ("STANDARD", "EXTENDED"):
        raise ValueError(f"upgrade_policy: got {args.upgrade_policy!r}; expected 'STANDARD' or 'EXTENDED'")


def _assume_role_policy(service: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})


def log_group_name(cluster_name: str) -> str:
    """The CloudWatch log group EKS writes a cluster's control-plane logs to."""
    return f"/aws/eks/{cluster_name}/cluster"


class EksCluster(pulumi.ComponentResource):
    """An EKS cluster with a CPU system node group; GPU groups attach to its node role and security group."""

    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    """The kubeconfig as a JSON string (secret)."""
    node_role_arn: pulumi.Output[str]
    node_role_name: pulumi.Output[str]
    node_security_group_id: pulumi.Output[str]
    """Our node security group: ingress only from itself."""
    cluster_security_group_id: pulumi.Output[str]
    """The EKS-created cluster security group (control plane <-> nodes)."""
    oidc_provider_arn: pulumi.Output[str]
    oidc_provider_url: pulumi.Output[str]
    system_node_labels: dict[str, str]

    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:cluster:EksCluster", name, None, opts)
        validate(args)
        self._name, self._args = name, args
        self._tags = {"eks-ddp/cluster": args.cluster_name, **(args.tags or {})}
        child = pulumi.ResourceOptions(parent=self)
        # aws, aws-cn or aws-us-gov: AWS-managed policy ARNs name it.
        self._partition = aws.get_partition(opts=pulumi.InvokeOptions(parent=self)).partition

        secrets_key = aws.kms.Key(
            f"{name}-secrets", description=f"Envelope encryption of Kubernetes secrets in {args.cluster_name}",
            enable_key_rotation=True, deletion_window_in_days=30, tags=self._tags, opts=child)
        log_group = self._create_log_group()

        self._create_node_role()
        node_sg = self._create_node_security_group()

        cluster = eks.Cluster(
            name,
            name=args.cluster_name,
            version=args.kubernetes_version,
            # pulumi-eks passes an unset policy through, and EKS then defaults to EXTENDED support.
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=args.upgrade_policy),
            vpc_id=args.vpc_id,
            public_subnet_ids=rules.listed(args.public_subnet_ids),
            private_subnet_ids=rules.listed(args.private_subnet_ids),
            skip_default_node_group=True,
            # Our node security group (below) instead of pulumi_eks's, so every rule is visible here.
            skip_default_security_groups=True,
            authentication_mode=eks.AuthenticationMode.API,
            create_oidc_provider=True,
            enabled_cluster_log_types=list(LOG_TYPES),
            encryption_config_key_arn=secrets_key.arn,
            endpoint_private_access=True,
            endpoint_public_access=args.endpoint_public_access,
            public_access_cidrs=rules.listed(args.public_access_cidrs) if args.endpoint_public_access else None,
            # Without this the VPC CNI accepts NetworkPolicy objects but does not enforce them, and
            # etcd and the trainers would be reachable from every pod in the cluster.
            vpc_cni_options=eks.VpcCniOptionsArgs(enable_network_policy=True),
            access_entries={
                f"admin-{i}": eks.AccessEntryArgs(
                    principal_arn=arn,
                    access_policies={"cluster-admin": eks.AccessPolicyAssociationArgs(
                        policy_arn=cluster_admin_policy_arn(self._partition),
                        access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"))})
                for i, arn in enumerate(args.admin_principal_arns)} | {
                f"viewer-{i}": eks.AccessEntryArgs(
                    principal_arn=arn,
                    access_policies={"view": eks.AccessPolicyAssociationArgs(
                        policy_arn=VIEW_POLICY_ARN.replace("arn:aws:", f"arn:{self._partition}:", 1),
                        access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"))})
                for i, arn in enumerate(args.viewer_principal_arns)},
            tags=self._tags,
            # Only on the cluster: on every resource it would change the launch templates' instance tags, and so
            # roll the nodes, on an existing stack.
            cluster_tags={**self._tags, STACK_TAG: args.stack_id} if args.stack_id else None,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[log_group]),
        )
        # Derived from a cluster output so dependents wait for the control plane.
        self.cluster_name = cluster.cluster_security_group_id.apply(lambda _: args.cluster_name)
        self.cluster_security_group_id = cluster.cluster_security_group_id
        # pulumi-eks's kubeconfig output never names a profile (it is built for the default chain).
        self.kubeconfig = pulumi.Output.secret(
            cluster.get_kubeconfig(profile_name=args.aws_profile) if args.aws_profile else cluster.kubeconfig_json)
        self.eks_cluster = cluster
        """The ``pulumi_eks.Cluster``: its ``eks_cluster`` output carries the endpoint and certificate authority, for a
        composing program's own Kubernetes provider (or use ``kubeconfig``)."""
        self.oidc_provider_arn = cluster.oidc_provider_arn
        self.oidc_provider_url = cluster.oidc_provider_url
        self.node_security_group_id = node_sg.id

        # No EC2_LINUX access entry for the node role: EKS creates (and owns) one for every managed node
        # group's role; a second owner would delete EKS's entry on destroy.
        self.system_node_labels = dict(SYSTEM_POOL_LABELS)
        self.kubernetes_version = args.kubernetes_version
        """The cluster's minor version: what the autoscaler, the add-ons and the node groups must follow."""
        self._create_system_node_group()
        self._create_coredns_addon()

        self.register_outputs({
            "cluster_name": self.cluster_name,
            "kubeconfig": self.kubeconfig,
            "node_role_arn": self.node_role_arn,
            "node_role_name": self.node_role_name,
            "node_security_group_id": self.node_security_group_id,
            "cluster_security_group_id": self.cluster_security_group_id,
            "oidc_provider_arn": self.oidc_provider_arn,
            "oidc_provider_url": self.oidc_provider_url,
            "system_node_labels": self.system_node_labels,
        })

    def _create_log_group(self) -> aws.cloudwatch.LogGroup:
        # EKS creates this group on first log write with no expiry; creating it first sets the retention.
        # EKS also re-creates it while a deleted control plane flushes its last logs, so a deleted group
        # comes back and the next `pulumi up` of the stack would fail with ResourceAlreadyExists. So the
        # group is never deleted (skip_destroy; it expires by retention) and an existing one is adopted.
        # A group whose owner tag names another stack is never adopted: that would rewrite another team's
        # retention and tags (and its cluster of this name makes our CreateCluster fail anyway).
        log_name = log_group_name(self._args.cluster_name)
        invoke = pulumi.InvokeOptions(parent=self)
        found = aws.cloudwatch.get_log_groups(log_group_name_prefix=log_name, opts=invoke)
        existing = log_name in (found.log_group_names or [])
        stack_id = self._args.stack_id
        if existing and stack_id is not None:
            owner = (aws.cloudwatch.get_log_group(name=log_name, opts=invoke).tags or {}).get(STACK_TAG)

            if owner is not None and owner != stack_id and owner != legacy_owner(stack_id):
                raise ValueError(f"cluster_name: the log group {log_name} belongs to stack {owner!r}, not to this "
                                 f"stack ({stack_id}); it is never adopted; expected a cluster name no other stack's "
                                 "cluster or log group has (stack config: cluster.name)")
        return aws.cloudwatch.LogGroup(
            f"{self._name}-logs", name=log_name, retention_in_days=self._args.log_retention_days,
            skip_destroy=True, tags={**self._tags, STACK_TAG: stack_id} if stack_id else self._tags,
            opts=pulumi.ResourceOptions(parent=self, import_=log_name if existing else None))

    def _create_node_role(self) -> None:
        name = self._name
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(f"{name}-node", assume_role_policy=_assume_role_policy(rules.ec2_principal(self._partition)),
                            description="EKS worker nodes (system and GPU groups)", tags=self._tags, opts=child)
        self._node_policy_attachments = [
            aws.iam.RolePolicyAttachment(f"{name}-node-{short}", role=role.name,
                                         policy_arn=f"arn:{self._partition}:iam::aws:policy/{policy}",
                                         opts=child)
            for short, policy in (("worker", "AmazonEKSWorkerNodePolicy"), ("cni", "AmazonEKS_CNI_Policy"))
        ]
        invoke = pulumi.InvokeOptions(parent=self)
        region = aws.get_region(opts=invoke).region
        partition = self._partition
        self._node_policy_attachments.append(aws.iam.RolePolicy(
            f"{name}-node-addon-images", role=role.id,
            policy=json.dumps(node_image_pull_policy(region, partition)), opts=child))
        self.node_role_arn = role.arn
        self.node_role_name = role.name

    def _create_node_security_group(self) -> aws.ec2.SecurityGroup:
        name = self._name
        child = pulumi.ResourceOptions(parent=self)
        sg = aws.ec2.SecurityGroup(
            f"{name}-node", vpc_id=self._args.vpc_id,
            description=f"Nodes of {self._args.cluster_name}: traffic between nodes; EFS and EFA open to it",
            tags={**self._tags, "Name": f"{self._args.cluster_name}-node"}, opts=child)
        # Pod-to-pod and node-to-node traffic (NCCL, etcd, rendezvous) on any port, only among our nodes.
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-node-from-nodes", security_group_id=sg.id, referenced_security_group_id=sg.id,
            ip_protocol="-1", description="All traffic between cluster nodes", opts=child)
        # Egress stays open: nodes pull images and reach AWS APIs through NAT and the S3 endpoint.
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-node-egress", security_group_id=sg.id, cidr_ipv4="0.0.0.0/0", ip_protocol="-1",
            description="Outbound: image registries, AWS APIs (through NAT)", opts=child)
        return sg

    def _create_coredns_addon(self) -> None:
        # pulumi_eks makes CoreDNS a managed add-on only with a default node group; without one CoreDNS would
        # stay the unmanaged bootstrap copy that no add-on update ever touches. Created once the system nodes
        # exist (its pods need them to become ACTIVE), taking over the bootstrap copy (OVERWRITE).
        self.coredns_addon = aws.eks.Addon(
            f"{self._name}-coredns",
            cluster_name=self.cluster_name,
            addon_name=k8s_versions.COREDNS,
            addon_version=addon_version(k8s_versions.COREDNS, self._args.kubernetes_version,
                                                     opts=pulumi.InvokeOptions(parent=self)),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            tags=self._tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.system_node_group]))

    def _create_system_node_group(self) -> None:
        name, args = self._name, self._args
        child = pulumi.ResourceOptions(parent=self)
        lt = aws.ec2.LaunchTemplate(
            f"{name}-system",
            description=f"System nodes of {args.cluster_name}",
            # IMDSv2 only, hop limit 1: pods on the system nodes (CoreDNS, etcd, controllers with IRSA) need
            # no instance metadata, and a hop limit of 1 keeps pods from borrowing the node role's credentials.
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1,
                instance_metadata_tags="disabled"),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name="/dev/xvda",
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=SYSTEM_ROOT_VOLUME_GIB, volume_type="gp3", encrypted="true",
                    delete_on_termination="true"))],
            vpc_security_group_ids=[self.cluster_security_group_id, self.node_security_group_id],
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(
                resource_type="instance", tags={**self._tags, "Name": f"{args.cluster_name}-system"})],
            user_data=node_user_data(lustre_client=args.lustre_client),
            update_default_version=True,
            tags=self._tags,
            opts=child)
        self.system_node_group = aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=self.cluster_name,
            node_role_arn=self.node_role_arn,
            subnet_ids=rules.listed(args.private_subnet_ids),
            ami_type=SYSTEM_AMI_TYPE,
            # Follows the control plane: an upgrade moves these nodes in the same `pulumi up` (after the
            # cluster, which cluster_name depends on), so the next upgrade is not refused for stale nodes.
            version=args.kubernetes_version,
            release_version=k8s_versions.ami_release_version(args.kubernetes_version, args.ami_release_version),
            # The rolling update drains each node; the etcd member's PodDisruptionBudget (1 of 1) would block
            # the drain until EKS gives up (PodEvictionFailure) and `pulumi up` fails. The rendezvous is soft
            # state the agents rebuild, so the update may evict it.
            force_update_version=True,
            capacity_type="ON_DEMAND",
            instance_types=[args.system_instance_type],
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=args.system_node_count, desired_size=args.system_node_count,
                max_size=args.system_node_count),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            labels=dict(SYSTEM_POOL_LABELS),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=lt.id, version=lt.latest_version.apply(str)),
            tags=self._tags,
            # desiredSize is NOT ignored: min == max == desired and nothing else resizes this group, while an
            # ignored desired size would be sent from state on a resize (1 -> 2: "Minimum capacity 2 can't be
            # greater than desired size 1").
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self._node_policy_attachments)),
        )
