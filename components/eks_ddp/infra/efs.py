"""Shared storage: an encrypted EFS file system, the EFS CSI driver, per-workload access points and claims, a policy.

The trainer's pods on every node share ReadWriteMany volumes under ``/shared`` (the dataset, this
run's checkpoints and metrics). EFS gives that without a storage operator:

* an ``aws.efs.FileSystem`` encrypted with a KMS key of its own (rotation on),
  elastic throughput (pay per use; bursts for checkpoint writes), and lifecycle management
  (:class:`EfsLifecycle`): files not read for 30 days move to Infrequent Access, after 90 to Archive, and back to
  Standard on their first access, so old checkpoints and a file system kept after ``pulumi destroy`` stop costing
  Standard's price (EFS user guide, "Managing storage lifecycle"; one transition per policy object, as
  ``PutLifecycleConfiguration`` requires);
* one mount target per zone (EFS allows one per zone; with several private
  subnets in a zone, the first), behind a security group that admits NFS
  (tcp 2049) only from the cluster's node security group;
* the EFS CSI driver as an EKS add-on (build per Kubernetes version: ``k8s_versions.ADDON_VERSIONS``) with one
  IAM role through IRSA. The add-on's ``service_account_role_arn`` annotates *both* of its service accounts,
  the controller's and the node DaemonSet's (AWS's EKS user guide, "Amazon EFS CSI driver" add-on page, widens
  the role's trust to ``efs-csi-*`` for that reason; its configuration schema has no separate node role:
  aws/containers-roadmap#2820; the driver's own docs,
  https://github.com/kubernetes-sigs/aws-efs-csi-driver/blob/master/docs/iam-policy-create.md, give the node account a
  role of its own, by Pod Identity or the IRSA annotation, which the add-on cannot set separately), so the
  role trusts exactly those two accounts,
  ``kube-system:efs-csi-controller-sa`` and ``kube-system:efs-csi-node-sa``, and nothing else. Its permissions
  are two inline policies: :func:`csi_controller_policy` (access points only on this file system, not the
  managed policy's every file system in the account) and :func:`csi_node_policy` (``ClientMount`` and
  ``ClientWrite`` on this file system only through this stack's access points; never ``ClientRootAccess``).
  The node plugin mounts with the ``iam`` option, so efs-utils signs the mount with that role (aws/efs-utils
  ``src/efs_utils_common/aws_credentials.py``, ``get_aws_security_credentials``: the web identity the IRSA
  webhook puts into the pod's environment comes before the instance profile);
* one EFS access point per workload, both owned by uid/gid 1000 (the non-root trainer) with
  mode 700: ``data`` (root ``/eks-ddp/<namespace>/<claim>/data``, the dataset) and ``run``
  (root ``/eks-ddp/<namespace>/<claim>/runs/<run_id>``, this run's checkpoints and results);
  each is a statically provisioned PersistentVolume (``volumeHandle: <fs-id>::<fsap-id>``; the
  driver mounts an access point over TLS, and ``encryptInTransit`` is set explicitly; ``mountOptions: [iam]``
  makes it an IAM-authorised mount) bound to a claim in the training namespace. A run's pods mount its
  ``run`` claim and the dataset: the data stage the ``data`` claim, every other pod the ``data-ro`` claim (a
  third access point on the same directory, which the policy refuses every write through, so the dataset is
  read-only at EFS, not only in the pod spec), never the whole file system, so one run cannot reach
  another run's directory. The paths are the ones the earlier dynamically provisioned claim
  ``shared`` used, so data and checkpoints written before carry over;
* a file-system policy (``file_system_policy``): every client request must use TLS
  (``aws:SecureTransport``) and one of this stack's access points
  (``elasticfilesystem:AccessPointArn``, through a mount target); root access
  (``ClientRootAccess``) is denied to every client; the only client allowed at all is the CSI role, so an
  anonymous client (a mount without ``iam``, from any pod or host that reaches a mount target) is refused:
  EFS sets ``AccessPointArn`` for IAM clients (EFS user guide, "Using access points in IAM policies"), and
  no statement allows an anonymous one (EFS user guide, "Creating file system policies", "Prevent anonymous
  access"). Without a policy EFS grants full access, root included, to any client that reaches a mount
  target. With ``file_system_id`` the stack puts its policy on the adopted file system too (replacing
  whatever policy it had). ``eks_ddp.tooling.contracts.storage`` checks every mount of the plan against it.

Keeping data on ``pulumi destroy``
----------------------------------
With ``retain_on_destroy`` (the default) ``pulumi destroy`` removes the
mount targets, the claims and the driver, but leaves the file system, its KMS
key, its access points and its policy in the account (Pulumi's ``retain_on_delete``):
the kept file system stays locked to TLS and those access points. Checkpoints survive an
accidental destroy; the file system keeps costing its storage.

Re-attaching after a destroy: a later ``pulumi up`` creates a *new* file system
unless ``file_system_id`` (``eks-ddp:storage.fileSystemId``) names the kept one.
Then nothing is created for the file system or its key; mount targets go into
the new VPC, and the access points land on the same ``/eks-ddp/<namespace>/<claim>/...``
directories, so a run with the same ``runId`` resumes from its checkpoints.

To delete them on purpose: either set ``eks-ddp:storage.retainOnDestroy false``,
run ``pulumi up`` (it records the new option) and then ``pulumi destroy``; or,
after a destroy, delete by hand: ``aws efs describe-access-points --file-system-id
<id>`` + ``aws efs delete-access-point``, ``aws efs delete-file-system
--file-system-id <id>``, and ``aws kms schedule-key-deletion --key-id <key>``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from eks_ddp.core import k8s_versions, rules
from eks_ddp.core import storage as storage_rules
from eks_ddp.infra.addon_version import addon_version
from eks_ddp.infra.iam import TRAINER_GID, TRAINER_UID, irsa_trust_policy

_FS_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
EFS_CSI_CONTROLLER_SA = "efs-csi-controller-sa"
EFS_CSI_NODE_SA = "efs-csi-node-sa"
"""The node DaemonSet's service account (aws-efs-csi-driver chart, ``node.serviceAccount.name``): it mounts."""
MOUNT_OPTIONS = ("iam",)
"""The PersistentVolumes' ``mountOptions``: the driver passes them to efs-utils (aws-efs-csi-driver
``pkg/driver/node.go``, NodePublishVolume: the volume capability's mount flags), which then authenticates the
mount with the node plugin's IAM role. TLS comes from ``encryptInTransit`` and the access point."""
CLIENT_ACTIONS = ("elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite")
"""What a mount through an access point needs: read (mount) and write. ``ClientRootAccess`` never."""
EFS_CSI_NAMESPACE = "kube-system"
DRIVER_TAG = "efs.csi.aws.com/cluster"
"""The tag the EFS CSI controller puts on every access point it creates (value ``true``)."""


def csi_controller_policy(file_system_arn: str) -> dict:
    """The EFS CSI controller's permissions, instead of the AWS-managed AmazonEFSCSIDriverPolicy, which may create
    access points on every file system in the account: here only on this stack's file system.

    Delete stays conditioned on the driver's tag, as in the managed policy: an access point's ARN does not name its
    file system, and a cluster-specific tag would need the driver's ``controller.tags``, which the EKS add-on's
    configuration does not accept (aws/containers-roadmap#2755, open). So the controller could still delete another
    cluster's CSI access points in the account; a self-managed driver (Helm, ``controller.tags``) could close it."""
    driver = {"StringEquals": {f"aws:ResourceTag/{DRIVER_TAG}": "true"}}
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "DescribeThisFileSystem", "Effect": "Allow", "Resource": file_system_arn, "Action": [
            "elasticfilesystem:DescribeAccessPoints", "elasticfilesystem:DescribeFileSystems",
            "elasticfilesystem:DescribeMountTargets"]},
        {"Sid": "DescribeZones", "Effect": "Allow", "Resource": "*", "Action": ["ec2:DescribeAvailabilityZones"]},
        {"Sid": "CreateAccessPointsOnThisFileSystem", "Effect": "Allow",
         "Action": ["elasticfilesystem:CreateAccessPoint"], "Resource": file_system_arn,
         "Condition": {"StringEquals": {f"aws:RequestTag/{DRIVER_TAG}": "true"}}},
        {"Sid": "TagDriverAccessPoints", "Effect": "Allow", "Action": ["elasticfilesystem:TagResource"],
         "Resource": "*", "Condition": driver},
        {"Sid": "DeleteDriverAccessPoints", "Effect": "Allow", "Action": ["elasticfilesystem:DeleteAccessPoint"],
         "Resource": "*", "Condition": driver},
    ]}


def csi_node_policy(file_system_arn: str, access_point_arns: Sequence[str]) -> dict:
    """The node plugin's mount permissions: read and write on this file system, only through ``access_point_arns``
    and a mount target; no ``ClientRootAccess`` (EFS user guide, "Using IAM to control file system data access":
    an allow in either the identity or the file-system policy suffices; "Using access points in IAM policies"
    for the ``elasticfilesystem:AccessPointArn`` condition)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "MountThroughStackAccessPoints", "Effect": "Allow", "Action": list(CLIENT_ACTIONS),
         "Resource": file_system_arn,
         "Condition": {"StringEquals": {"elasticfilesystem:AccessPointArn": sorted(access_point_arns)},
                       "Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}},
    ]}


NFS_PORT = 2049
DIRECTORY_MODE = "700"
EFS_CSI_DRIVER = "efs.csi.aws.com"
CLAIM_SIZE = "100Gi"
"""Required by Kubernetes; EFS is elastic and ignores it."""


@dataclass(frozen=True, kw_only=True)
class EfsLifecycle:
    """EFS lifecycle management: when files move between storage classes (None: never)."""

    transition_to_ia: str | None = "AFTER_30_DAYS"
    """Files not read for this long move to Infrequent Access ($0.016/GB-month instead of Standard's $0.30)."""
    transition_to_archive: str | None = "AFTER_90_DAYS"
    """... and to Archive ($0.008/GB-month); needs ``transition_to_ia`` earlier, elastic throughput and
    General Purpose mode (both set here)."""
    transition_to_primary_storage_class: str | None = "AFTER_1_ACCESS"
    """A file read from IA or Archive moves back to Standard (a resumed run reads its checkpoint once)."""

    def problems(self, key: str = "lifecycle") -> list[str]:
        return storage_rules.efs_lifecycle_problems(
            self.transition_to_ia, self.transition_to_archive, self.transition_to_primary_storage_class,
            (f"{key}.transition_to_ia", f"{key}.transition_to_archive", f"{key}.transition_to_primary_storage_class"))

    def policies(self) -> list[aws.efs.FileSystemLifecyclePolicyArgs]:
        """One policy object per transition (``PutLifecycleConfiguration``: "Each LifecyclePolicy object can have
        only a single transition")."""
        out = []
        if self.transition_to_ia:
            out.append(aws.efs.FileSystemLifecyclePolicyArgs(transition_to_ia=self.transition_to_ia))
        if self.transition_to_archive:
            out.append(aws.efs.FileSystemLifecyclePolicyArgs(transition_to_archive=self.transition_to_archive))
        if self.transition_to_primary_storage_class:
            out.append(aws.efs.FileSystemLifecyclePolicyArgs(
                transition_to_primary_storage_class=self.transition_to_primary_storage_class))
        return out


@dataclass(frozen=True, kw_only=True)
class EfsStoreArgs:
    """Inputs of :class:`EfsStore`."""

    cluster_name: pulumi.Input[str]
    """EKS cluster that gets the CSI driver add-on."""
    vpc_id: pulumi.Input[str]
    """VPC of the mount targets."""
    subnet_ids: Sequence[pulumi.Input[str]]
    """Private subnets, one per zone: one mount target in each (EFS allows one per zone)."""
    node_security_group_id: pulumi.Input[str]
    """The nodes' security group: the only source NFS admits."""
    oidc_provider_arn: pulumi.Input[str]
    """The cluster's IAM OIDC provider (IRSA)."""
    oidc_provider_url: pulumi.Input[str]
    """The cluster's OIDC issuer URL (with or without https://)."""
    namespace: pulumi.Input[str]
    """Namespace of the claim (the training namespace)."""
    run_id: str
    """The run whose directory (``runs/<run_id>``) gets the ``run`` access point and claim."""
    more_run_ids: tuple[str, ...] = ()
    """Further runs of the stack: each gets an access point and claim of its own (``run_claim_names``)."""
    claim_name: str = "shared"
    """Stem of the claims' names (``<claim>-data``, ``<claim>-run-<run_id>``) and of their directory
    ``/eks-ddp/<namespace>/<claim>``."""
    retain_on_destroy: bool = True
    """Keep the file system and its key on ``pulumi destroy`` (see the module docstring)."""
    kubernetes_version: str = k8s_versions.DEFAULT_VERSION
    """The cluster's Kubernetes version: picks the CSI driver add-on build made for it."""
    file_system_id: str | None = None
    """Use this existing file system (e.g. one kept by an earlier ``pulumi destroy``) instead of creating one;
    it is never deleted by this stack."""
    tags: dict[str, str] | None = None
    """Extra tags for the AWS resources."""
    lifecycle: EfsLifecycle = EfsLifecycle()
    """When files move to Infrequent Access and Archive, and back (not applied to an adopted ``file_system_id``:
    its owner sets it)."""
    lookupcache_positive: bool = True
    """Mount with ``lookupcache=positive``: the NFS client never answers "no such file" from its cache (Linux
    ``fs/nfs/dir.c`` ``nfs_neg_need_reval`` with ``NFS_MOUNT_LOOKUP_CACHE_NONEG``), so a name another node created is
    seen by the next lookup. Every run's commit check looks up the next fence file by name (docs/rendezvous.md: the
    c10d backend's fences are the files alone, and with a store the files are what two live stores' worlds share), so
    the stack always mounts with it; False only for a volume no eks-ddp run writes to. efs-utils hands every option
    but its own to ``mount.nfs4`` (aws/efs-utils ``src/mount_efs/__init__.py`` ``get_nfs_mount_options``: all but
    ``EFS_ONLY_OPTIONS``). A mounted volume keeps its options until its pods mount it again."""


def validate(args: EfsStoreArgs) -> None:
    """Raise ValueError naming the bad field."""
    if not list(args.subnet_ids):
        raise ValueError("subnet_ids: got []; expected the private subnets (one mount target per zone)")
    if args.file_system_id is not None and not _FS_ID.match(args.file_system_id):
        raise ValueError(f"file_system_id: got {args.file_system_id!r}; expected an EFS id such as fs-0123456789abcdef0")
    if not args.claim_name:
        raise ValueError("claim_name: got ''; expected a name such as 'shared'")
    if bad := args.lifecycle.problems("lifecycle"):
        raise ValueError("; ".join(bad))
    rules.require(rules.run_id("run_id", args.run_id),
                  *(rules.run_id(f"more_run_ids[{i}]", r) for i, r in enumerate(args.more_run_ids)))
    if len({args.run_id, *args.more_run_ids}) != 1 + len(args.more_run_ids):
        raise ValueError(f"more_run_ids: got {args.more_run_ids!r} with run_id {args.run_id!r}; expected distinct "
                         "run ids")


def file_system_policy(access_point_arns: Sequence[str], client_role_arn: str | None = None,
                       read_only_arns: Sequence[str] = ()) -> str:
    """Client access only over TLS, only through ``access_point_arns`` (via a mount target), never as root, and
    only for ``client_role_arn`` (the CSI driver's role, which the node plugin mounts with); no writes through
    ``read_only_arns`` (a subset of ``access_point_arns``).

    The Deny statements also bind IAM-authenticated clients whose identity policy would allow more. Without
    ``client_role_arn`` the allow names every principal (``AWS: *``), anonymous clients included.
    """
    client = [*CLIENT_ACTIONS, "elasticfilesystem:ClientRootAccess"]
    anyone = {"AWS": "*"}
    allowed = {"AWS": client_role_arn} if client_role_arn else anyone
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "DenyWithoutTls", "Effect": "Deny", "Principal": anyone, "Action": client,
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
        {"Sid": "DenyOtherThanStackAccessPoints", "Effect": "Deny", "Principal": anyone, "Action": client,
         "Condition": {"StringNotEquals": {"elasticfilesystem:AccessPointArn": list(access_point_arns)}}},
        {"Sid": "DenyRootAccess", "Effect": "Deny", "Principal": anyone,
         "Action": "elasticfilesystem:ClientRootAccess"},
        *([{"Sid": "DenyWritesThroughReadOnlyAccessPoints", "Effect": "Deny", "Principal": anyone,
            "Action": "elasticfilesystem:ClientWrite",
            "Condition": {"StringEquals": {"elasticfilesystem:AccessPointArn": list(read_only_arns)}}}]
          if read_only_arns else []),
        {"Sid": "AllowStackAccessPoints", "Effect": "Allow", "Principal": allowed,
         "Action": list(CLIENT_ACTIONS),
         "Condition": {"StringEquals": {"elasticfilesystem:AccessPointArn": list(access_point_arns)},
                       "Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}},
    ]})


class EfsStore(pulumi.ComponentResource):
    """Encrypted EFS + CSI driver + per-workload access points and claims + a file-system policy."""

    file_system_id: pulumi.Output[str]
    data_claim_name: pulumi.Output[str]
    """The dataset's claim (``/shared/data``): read-write, for the data stage."""
    data_read_only_claim_name: pulumi.Output[str]
    """The dataset's read-only claim (the same directory through an access point EFS refuses writes through):
    for every pod that only reads the dataset."""
    run_claim_name: pulumi.Output[str]
    """This run's claim (``/shared/runs/<run_id>``): checkpoints, final model, metrics."""
    run_claim_names: dict[str, pulumi.Output[str]]
    """Every run's claim by run id (``run_id`` and ``more_run_ids``)."""

    def __init__(self, name: str, args: EfsStoreArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:efs:EfsStore", name, None, opts)
        validate(args)
        tags = {"eks-ddp/storage": name, **(args.tags or {})}
        child = pulumi.ResourceOptions(parent=self)
        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy)

        if args.file_system_id is not None:
            # Adopted, not imported: this stack never owns (or deletes) a file system it did not create.
            fs_id: pulumi.Input[str] = args.file_system_id
        else:
            # Retained with the file system: without its key the data could not be read.
            key = aws.kms.Key(f"{name}-efs", description=f"EFS encryption for {name}", enable_key_rotation=True,
                              deletion_window_in_days=30, tags=tags, opts=keep)
            fs_id = aws.efs.FileSystem(
                f"{name}-fs", encrypted=True, kms_key_id=key.arn, throughput_mode="elastic",
                performance_mode="generalPurpose", lifecycle_policies=args.lifecycle.policies() or None,
                tags={**tags, "Name": f"{name}-shared"}, opts=keep).id

        nfs_sg = aws.ec2.SecurityGroup(f"{name}-nfs", vpc_id=args.vpc_id,
                                       description="NFS to the EFS mount targets, from cluster nodes only",
                                       tags={**tags, "Name": f"{name}-nfs"}, opts=child)
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-nfs-from-nodes", security_group_id=nfs_sg.id,
            referenced_security_group_id=args.node_security_group_id, ip_protocol="tcp",
            from_port=NFS_PORT, to_port=NFS_PORT, description="NFS from cluster nodes", opts=child)

        mount_targets = [
            aws.efs.MountTarget(f"{name}-mt-{i}", file_system_id=fs_id, subnet_id=subnet_id,
                                security_groups=[nfs_sg.id], opts=child)
            for i, subnet_id in enumerate(args.subnet_ids)
        ]

        role = aws.iam.Role(
            f"{name}-efs-csi",
            description="EFS CSI driver (IRSA): the controller manages access points, the node plugin mounts",
            assume_role_policy=pulumi.Output.all(args.oidc_provider_arn, args.oidc_provider_url).apply(
                lambda a: irsa_trust_policy(a[0], a[1], EFS_CSI_NAMESPACE, (EFS_CSI_CONTROLLER_SA, EFS_CSI_NODE_SA))),
            tags=tags, opts=child)
        invoke = pulumi.InvokeOptions(parent=self)
        fs_arn = pulumi.Output.concat(
            "arn:", aws.get_partition(opts=invoke).partition, ":elasticfilesystem:", aws.get_region(opts=invoke).region,
            ":", aws.get_caller_identity(opts=invoke).account_id, ":file-system/", fs_id)
        attach = aws.iam.RolePolicy(
            f"{name}-efs-csi", role=role.id,
            policy=fs_arn.apply(lambda arn: json.dumps(csi_controller_policy(arn))),
            opts=child)
        base = pulumi.Output.concat("/eks-ddp/", args.namespace, f"/{args.claim_name}")
        keep_ap = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy)
        data_ap = self._access_point(f"{name}-data", fs_id, pulumi.Output.concat(base, "/data"), tags, keep_ap)
        # The same directory for the pods that only read it: EFS refuses every write through this one.
        data_ro_ap = self._access_point(f"{name}-data-ro", fs_id, pulumi.Output.concat(base, "/data"), tags, keep_ap)
        run_ap = self._access_point(f"{name}-run", fs_id, pulumi.Output.concat(base, f"/runs/{args.run_id}"), tags,
                                    keep_ap)
        more_aps = {rid: self._access_point(f"{name}-run-{rid}", fs_id, pulumi.Output.concat(base, f"/runs/{rid}"),
                                            tags, keep_ap) for rid in args.more_run_ids}
        ap_arns = [data_ap.arn, run_ap.arn, *(ap.arn for ap in more_aps.values()), data_ro_ap.arn]
        mount = aws.iam.RolePolicy(
            f"{name}-efs-csi-mount", role=role.id,
            policy=pulumi.Output.all(fs_arn, *ap_arns).apply(lambda a: json.dumps(csi_node_policy(a[0], a[1:]))),
            opts=child)
        # Kept with the file system: a retained file system must not fall back to EFS's open default policy.
        aws.efs.FileSystemPolicy(
            f"{name}-policy", file_system_id=fs_id,
            policy=pulumi.Output.all(role.arn, *ap_arns).apply(lambda a: file_system_policy(a[1:], a[0], a[-1:])),
            opts=keep_ap)

        addon = aws.eks.Addon(
            f"{name}-efs-csi-driver",
            cluster_name=args.cluster_name,
            addon_name="aws-efs-csi-driver",
            addon_version=addon_version(k8s_versions.EFS_CSI_DRIVER, args.kubernetes_version,
                                                     opts=pulumi.InvokeOptions(parent=self)),
            service_account_role_arn=role.arn,
            # The node plugin must also run on the tainted GPU nodes, where the trainer mounts the volume.
            configuration_values=json.dumps({"node": {"tolerations": [{"operator": "Exists"}]}}),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[attach, mount]))

        after = [addon, *mount_targets]
        self.data_claim_name = self._static_claim(f"{name}-data", f"{args.claim_name}-data", fs_id, data_ap, args,
                                                  after)
        self.data_read_only_claim_name = self._static_claim(
            f"{name}-data-ro", f"{args.claim_name}-data-ro", fs_id, data_ro_ap, args, after, read_only=True)
        self.run_claim_name = self._static_claim(f"{name}-run", f"{args.claim_name}-run-{args.run_id}", fs_id, run_ap,
                                                 args, after)
        self.run_claim_names = {args.run_id: self.run_claim_name, **{
            rid: self._static_claim(f"{name}-run-{rid}", f"{args.claim_name}-run-{rid}", fs_id, ap, args, after)
            for rid, ap in more_aps.items()}}
        self.file_system_id = pulumi.Output.from_input(fs_id)
        self.register_outputs({"file_system_id": self.file_system_id, "data_claim_name": self.data_claim_name,
                               "data_read_only_claim_name": self.data_read_only_claim_name,
                               "run_claim_name": self.run_claim_name})

    def _access_point(self, name: str, fs_id: pulumi.Input[str], path: pulumi.Input[str], tags: dict[str, str],
                      opts: pulumi.ResourceOptions) -> aws.efs.AccessPoint:
        """Every request through it runs as the trainer's uid/gid, confined to ``path`` (created 700 on first use)."""
        return aws.efs.AccessPoint(
            name, file_system_id=fs_id,
            posix_user=aws.efs.AccessPointPosixUserArgs(uid=TRAINER_UID, gid=TRAINER_GID),
            root_directory=aws.efs.AccessPointRootDirectoryArgs(
                path=path, creation_info=aws.efs.AccessPointRootDirectoryCreationInfoArgs(
                    owner_uid=TRAINER_UID, owner_gid=TRAINER_GID, permissions=DIRECTORY_MODE)),
            tags={**tags, "Name": name}, opts=opts)

    def _static_claim(self, name: str, claim: str, fs_id: pulumi.Input[str], ap: aws.efs.AccessPoint,
                      args: EfsStoreArgs, after: list[pulumi.Resource], read_only: bool = False) -> pulumi.Output[str]:
        """A PersistentVolume on one access point, pre-bound to a claim of the same name in the namespace
        (``ReadOnlyMany`` with ``read_only``: the policy refuses writes through that access point)."""
        modes = ["ReadOnlyMany"] if read_only else ["ReadWriteMany"]
        labels = {"app.kubernetes.io/part-of": "eks-ddp"}
        pv_name = pulumi.Output.concat(args.namespace, f"-{claim}")  # cluster-scoped: unique per namespace
        pv = k8s.core.v1.PersistentVolume(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=pv_name, labels=labels),
            spec=k8s.core.v1.PersistentVolumeSpecArgs(
                capacity={"storage": CLAIM_SIZE}, access_modes=modes, volume_mode="Filesystem",
                persistent_volume_reclaim_policy="Retain", storage_class_name="",
                claim_ref=k8s.core.v1.ObjectReferenceArgs(namespace=args.namespace, name=claim),
                csi=k8s.core.v1.CSIPersistentVolumeSourceArgs(
                    driver=EFS_CSI_DRIVER,
                    # <fs-id>:<subpath>:<access point>: the driver mounts an access point with TLS (efs-utils).
                    volume_handle=pulumi.Output.concat(fs_id, "::", ap.id),
                    volume_attributes={"encryptInTransit": "true"}),
                mount_options=[*MOUNT_OPTIONS, *(["lookupcache=positive"] if args.lookupcache_positive else [])]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=after))
        pvc = k8s.core.v1.PersistentVolumeClaim(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=claim, namespace=args.namespace, labels=labels),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=modes, storage_class_name="", volume_name=pv.metadata.name,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": CLAIM_SIZE})),
            opts=pulumi.ResourceOptions(parent=self, depends_on=after))
        return pvc.metadata.name
