"""Shared storage on FSx for Lustre: the second backend for data and checkpoints (``storage.backend: fsxLustre``).

EFS (``efs.py``) bills every GB written and caps a client near 1.5 GiB/s; a 500 GB checkpoint of a p4de-scale model
costs about $30 in writes there. FSx for Lustre bills provisioned capacity instead, with throughput that scales with
it. The workloads see exactly what they see on EFS: the same claims (``<claim>-data``, ``<claim>-data-ro``,
``<claim>-run-<runId>``) mounted at ``/shared/data`` and ``/shared/runs/<runId>``, owned by the trainer's uid 1000:

* an ``aws.fsx.LustreFileSystem``, ``PERSISTENT_2`` SSD (``storage_capacity_gib``, ``throughput_per_tib``), Lustre
  2.15, LZ4 compression, encrypted with a KMS key of its own (rotation on), in one private subnet (the zone of the
  GPU nodes that mount it). ``pulumi destroy`` deletes it, because its network interfaces sit in the stack's
  subnet and security group (EC2 refuses to delete a subnet or group an interface still uses, and an FSx file
  system cannot move to another VPC): with ``retain_on_destroy`` the delete takes a final backup
  (``skip_final_backup=False``, tagged ``eks-ddp/final-backup``) and the key stays, so a later ``up`` restores the
  data with ``backup_id`` (``storage.fsxBackupId``). Create, update and delete wait as long as a backup of the
  capacity takes (``core.storage.fsx_timeouts``: hours, where the provider's default is 30 minutes). The destroy
  contract (``tooling.contracts.destroy``) checks that nothing kept sits inside what destroy deletes. A restored file
  system carries the backup's id in ``eks-ddp/restored-from``. No ``protect``: it would block ``pulumi destroy`` too;
  instead preflight (``tooling.preflight.fsx``) refuses a change that would replace the file system with an empty one
  unless ``storage.fsxReplace`` names it. The nodes that mount it install the Lustre client of ``LUSTRE_VERSION``
  from their own user data (``infra.node_user_data``);
* a security group admitting TCP 988 and 1018-1023 (``core.storage.LUSTRE_PORTS``) from the cluster's node
  security group and from itself (the file servers talk to each other), nothing else inbound; outbound open, as
  the EKS user guide's FSx page leaves it ("You can leave the outbound rules alone to allow All traffic"); and the
  client half of the FSx for Lustre user guide's table ("Lustre client VPC security group rules": the clients'
  groups admit 988 and 1018-1023 from the file system's group, which opens connections back to the clients): two
  ingress rules on the node security group;
* the FSx CSI driver as the EKS add-on ``aws-fsx-csi-driver`` (build per Kubernetes version: ``k8s_versions``) with
  an IRSA role that only ``kube-system:fsx-csi-controller-sa`` may assume and that may only describe file systems:
  static volumes need no more (kubernetes-sigs/aws-fsx-csi-driver ``pkg/driver/controller.go``: only CreateVolume,
  DeleteVolume and ControllerExpandVolume, which static, retained volumes never reach, create, delete or update a
  file system; ``ValidateVolumeCapabilities`` describes one). The node plugin mounts with no AWS call
  (``pkg/driver/node.go`` ``NodePublishVolume``: ``mount -t lustre <dnsname>@tcp:/<mountname> <target>``);
* one statically provisioned PersistentVolume per claim (``pkg/driver/node.go``: volume attributes ``dnsname`` and
  ``mountname``, ``volumeHandle`` the file system id; the driver's ``examples/kubernetes/static_provisioning``),
  whose ``mountname`` is ``<mount name>/eks-ddp/<namespace>/<claim>/data`` or ``.../runs/<runId>``: a Lustre
  fileset (subdirectory) mount, so a run's pods see only their own directory, as EFS's access points give;
* one ``aws.fsx.DataRepositoryAssociation`` per S3 data set of the stack's runs, linking
  ``/eks-ddp/<namespace>/<claim>/data/<name>`` (where the S3 stage puts it) to its prefix, import only (new,
  changed and deleted objects): the stage then finds the objects in place, read through Lustre from S3;
* a layout Job (kube-system, on the system nodes, as root with only ``CHOWN``, ``DAC_OVERRIDE`` and ``FOWNER``, no
  network, no token) that creates
  those directories owned by uid/gid 1000 with mode 700 (the access points' ``creation_info`` on EFS): a fileset
  mount of a directory that does not exist fails, and the file system's root belongs to root. It mounts the whole
  file system through a claim in kube-system that no training pod can name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from eks_ddp.core import k8s_versions, rules
from eks_ddp.core import storage as storage_rules
from eks_ddp.infra.addon_version import addon_version
from eks_ddp.infra.iam import TRAINER_GID, TRAINER_UID, irsa_trust_policy

FSX_CSI_DRIVER = "fsx.csi.aws.com"
FSX_CSI_NAMESPACE = "kube-system"
FSX_CSI_CONTROLLER_SA = "fsx-csi-controller-sa"
"""The controller's service account (aws-fsx-csi-driver chart ``controller.serviceAccount.name``): the only one the
driver role trusts; the node plugin (``fsx-csi-node-sa``) makes no AWS call."""
DRIVER_ACTIONS = ("fsx:DescribeFileSystems",)
"""All the controller needs for static volumes (``ValidateVolumeCapabilities``)."""
BACKUP_ID = re.compile(r"^backup-[0-9a-f]{8,}$")
"""FSx's backup id pattern (FSx API reference, ``Backup.BackupId``: ``^(backup-[0-9a-f]{8,})$``)."""
FINAL_BACKUP_TAG = "eks-ddp/final-backup"
"""Tag of the final backup destroy takes (its value: the stack's storage name); ``aws fsx describe-backups`` finds it."""
LUSTRE_VERSION = storage_rules.LUSTRE_VERSION
DEPLOYMENT_TYPE = "PERSISTENT_2"
STORAGE_TYPE = "SSD"
LUSTRE_SG_DESCRIPTION = "Lustre (TCP 988, 1018-1023) from cluster nodes and the file servers"
"""The file system's security group's description: ForceNew on ``aws_security_group``, and the group's id is ForceNew
on the file system, so preflight compares the live group's with it (``tooling.preflight.fsx``)."""
RESTORED_FROM_TAG = "eks-ddp/restored-from"
"""Tag of a file system created from a backup (its value: the backup id): FSx does not report a file system's source
backup, and preflight needs it to tell ``storage.fsxBackupId`` left in place after a restore (fine) from one set on a
file system that already exists (ignored by the provider: refused)."""
MOUNT_OPTIONS = ("flock",)
"""The driver's static-provisioning example mounts with ``flock`` (POSIX locks across nodes)."""
LAYOUT_ROOT = "/fsx"
DIRECTORY_MODE = 0o700
DATA_IMPORT_EVENTS = ("NEW", "CHANGED", "DELETED")
LAYOUT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER")
"""What the layout Job's root needs once directories are the trainer's (700): enter and create in them, chmod and
chown them. All three are in Pod Security's baseline set; nothing else."""


@dataclass(frozen=True, kw_only=True)
class FsxLustreStoreArgs:
    """Inputs of :class:`FsxLustreStore`."""

    cluster_name: pulumi.Input[str]
    """EKS cluster that gets the CSI driver add-on."""
    vpc_id: pulumi.Input[str]
    """VPC of the file system's security group."""
    subnet_id: pulumi.Input[str]
    """The private subnet of the file system (FSx for Lustre takes one): the zone of the GPU nodes that mount it."""
    node_security_group_id: pulumi.Input[str]
    """The nodes' security group: the only client the file system admits."""
    oidc_provider_arn: pulumi.Input[str]
    oidc_provider_url: pulumi.Input[str]
    namespace: pulumi.Input[str]
    """Namespace of the claims (the training namespace)."""
    run_id: str
    """The run whose directory gets the ``run`` claim."""
    layout_image: pulumi.Input[str]
    """Image of the layout Job (it runs ``python -c``; the stack's trainer image)."""
    system_node_selector: Mapping[str, str]
    """Labels of the system nodes, where the layout Job runs."""
    more_run_ids: tuple[str, ...] = ()
    claim_name: str = "shared"
    """Stem of the claims' names and of their directory ``/eks-ddp/<namespace>/<claim>``."""
    storage_capacity_gib: int = 1200
    throughput_per_tib: int = 250
    data_repositories: tuple[tuple[str, str], ...] = ()
    """(data set name, ``s3://bucket/prefix/``) of the runs' S3 data sets: each linked under ``data/<name>``."""
    retain_on_destroy: bool = True
    """Take a final backup when destroy deletes the file system, and keep its KMS key (the backup's)."""
    backup_id: str | None = None
    """Create the file system from this FSx backup (an earlier destroy's final backup): its data comes back."""
    kubernetes_version: str = k8s_versions.DEFAULT_VERSION
    tags: dict[str, str] | None = None


def validate(args: FsxLustreStoreArgs) -> None:
    """Raise ValueError naming the bad field."""
    rules.require(
        storage_rules.fsx_capacity_problem("storage_capacity_gib", args.storage_capacity_gib),
        storage_rules.fsx_throughput_problem("throughput_per_tib", args.throughput_per_tib),
        rules.run_id("run_id", args.run_id),
        *(rules.run_id(f"more_run_ids[{i}]", r) for i, r in enumerate(args.more_run_ids)),
        *(rules.s3_prefix(f"data_repositories[{i}]", uri) for i, (_, uri) in enumerate(args.data_repositories)))
    if not args.claim_name:
        raise ValueError("claim_name: got ''; expected a name such as 'shared'")
    if len({args.run_id, *args.more_run_ids}) != 1 + len(args.more_run_ids):
        raise ValueError(f"more_run_ids: got {args.more_run_ids!r} with run_id {args.run_id!r}; expected distinct "
                         "run ids")
    names = [n for n, _ in args.data_repositories]
    if len(set(names)) != len(names) or any(not n or "/" in n for n in names):
        raise ValueError(f"data_repositories: got names {names!r}; expected distinct directory names")
    if args.backup_id is not None and not BACKUP_ID.match(args.backup_id):
        raise ValueError(f"backup_id: got {args.backup_id!r}; expected an FSx backup id like backup-0123456789abcdef0")


def driver_policy() -> dict:
    """The controller's permissions for static volumes: describe, nothing else."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "DescribeFileSystems", "Effect": "Allow", "Action": list(DRIVER_ACTIONS), "Resource": "*"}]}


LAYOUT_SCRIPT = """\
import os, sys
root, mode = sys.argv[1], int(sys.argv[2], 8)
uid, gid = int(sys.argv[3]), int(sys.argv[4])
for rel in sys.argv[5:]:
    path = os.path.join(root, rel)
    os.makedirs(path, mode=0o755, exist_ok=True)
    os.chmod(path, mode)
    os.chown(path, uid, gid)
    print("ready", path, oct(mode), uid, gid, flush=True)
"""
"""Creates each directory (parents 755, root's), then makes it the trainer's, mode 700; rerunning changes nothing."""


class FsxLustreStore(pulumi.ComponentResource):
    """FSx for Lustre + CSI driver + per-workload fileset volumes and claims, with the same claims as EfsStore."""

    file_system_id: pulumi.Output[str]
    data_claim_name: pulumi.Output[str]
    data_read_only_claim_name: pulumi.Output[str]
    run_claim_name: pulumi.Output[str]
    run_claim_names: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: FsxLustreStoreArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:fsx:FsxLustreStore", name, None, opts)
        validate(args)
        tags = {"eks-ddp/storage": name, **(args.tags or {})}
        child = pulumi.ResourceOptions(parent=self)
        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy)  # the key: not in a VPC

        sg = aws.ec2.SecurityGroup(f"{name}-lustre", vpc_id=args.vpc_id,
                                   description=LUSTRE_SG_DESCRIPTION,
                                   tags={**tags, "Name": f"{name}-lustre"}, opts=child)
        for source, ref in (("nodes", args.node_security_group_id), ("self", sg.id)):
            for low, high in storage_rules.LUSTRE_PORTS:
                aws.vpc.SecurityGroupIngressRule(
                    f"{name}-lustre-{low}-from-{source}", security_group_id=sg.id, referenced_security_group_id=ref,
                    ip_protocol="tcp", from_port=low, to_port=high,
                    description=f"Lustre {low}-{high} from the {'cluster nodes' if source == 'nodes' else 'servers'}",
                    opts=child)
        for low, high in storage_rules.LUSTRE_PORTS:  # the client half: servers open connections back to clients
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-lustre-client-{low}-from-servers", security_group_id=args.node_security_group_id,
                referenced_security_group_id=sg.id, ip_protocol="tcp", from_port=low, to_port=high,
                description=f"Lustre {low}-{high} from the FSx file servers", opts=child)
        aws.vpc.SecurityGroupEgressRule(f"{name}-lustre-egress", security_group_id=sg.id, cidr_ipv4="0.0.0.0/0",
                                        ip_protocol="-1", description="Outbound (replies, S3 data repository)",
                                        opts=child)

        key = aws.kms.Key(f"{name}-fsx", description=f"FSx for Lustre encryption for {name}", enable_key_rotation=True,
                          deletion_window_in_days=30, tags=tags, opts=keep)
        fs = aws.fsx.LustreFileSystem(
            f"{name}-fsx", deployment_type=DEPLOYMENT_TYPE, storage_type=STORAGE_TYPE,
            storage_capacity=args.storage_capacity_gib, per_unit_storage_throughput=args.throughput_per_tib,
            subnet_ids=args.subnet_id, security_group_ids=[sg.id], kms_key_id=key.arn,
            file_system_type_version=LUSTRE_VERSION, data_compression_type="LZ4",
            log_configuration=aws.fsx.LustreFileSystemLogConfigurationArgs(level="WARN_ERROR"),
            backup_id=args.backup_id, skip_final_backup=not args.retain_on_destroy,
            final_backup_tags={**tags, FINAL_BACKUP_TAG: name} if args.retain_on_destroy else None,
            tags={**tags, "Name": f"{name}-shared", **({RESTORED_FROM_TAG: args.backup_id} if args.backup_id else {})},
            # backupId matters only at creation: dropping the key after a restore must not replace the file system
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["backupId"], custom_timeouts=pulumi.CustomTimeouts(
                **storage_rules.fsx_timeouts(args.storage_capacity_gib, restoring=args.backup_id is not None))))

        base = pulumi.Output.concat("eks-ddp/", args.namespace, f"/{args.claim_name}")
        associations = [aws.fsx.DataRepositoryAssociation(
            f"{name}-data-{data_name}", file_system_id=fs.id,
            file_system_path=pulumi.Output.concat("/", base, f"/data/{data_name}"), data_repository_path=uri,
            batch_import_meta_data_on_create=True, delete_data_in_filesystem=False,
            s3=aws.fsx.DataRepositoryAssociationS3Args(
                auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(
                    events=list(DATA_IMPORT_EVENTS))),
            tags=tags, opts=pulumi.ResourceOptions(parent=self, custom_timeouts=pulumi.CustomTimeouts(
                **storage_rules.DATA_REPOSITORY_TIMEOUTS))) for data_name, uri in args.data_repositories]

        role = aws.iam.Role(
            f"{name}-fsx-csi", description="FSx CSI driver controller (IRSA): describes file systems only",
            assume_role_policy=pulumi.Output.all(args.oidc_provider_arn, args.oidc_provider_url).apply(
                lambda a: irsa_trust_policy(a[0], a[1], FSX_CSI_NAMESPACE, FSX_CSI_CONTROLLER_SA)),
            tags=tags, opts=child)
        policy = aws.iam.RolePolicy(f"{name}-fsx-csi", role=role.id, policy=json.dumps(driver_policy()), opts=child)
        addon = aws.eks.Addon(
            f"{name}-fsx-csi-driver", cluster_name=args.cluster_name, addon_name=k8s_versions.FSX_CSI_DRIVER,
            addon_version=addon_version(k8s_versions.FSX_CSI_DRIVER, args.kubernetes_version,
                                                     opts=pulumi.InvokeOptions(parent=self)),
            service_account_role_arn=role.arn, resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE", tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]))

        dirs = ["data", *(f"data/{n}" for n, _ in args.data_repositories),
                *(f"runs/{r}" for r in (args.run_id, *args.more_run_ids))]
        layout = self._layout_job(name, args, fs, dirs, after=[addon, *associations])
        after = [addon, layout]
        claims = {"data": (f"{args.claim_name}-data", "data", False),
                  "data-ro": (f"{args.claim_name}-data-ro", "data", True),
                  **{f"run-{r}": (f"{args.claim_name}-run-{r}", f"runs/{r}", False)
                     for r in (args.run_id, *args.more_run_ids)}}
        made = {key: self._static_claim(f"{name}-{key}", claim, fs, pulumi.Output.concat(base, f"/{sub}"), args, after,
                                        read_only=ro)
                for key, (claim, sub, ro) in claims.items()}
        self.data_claim_name = made["data"]
        self.data_read_only_claim_name = made["data-ro"]
        self.run_claim_name = made[f"run-{args.run_id}"]
        self.run_claim_names = {r: made[f"run-{r}"] for r in (args.run_id, *args.more_run_ids)}
        self.file_system_id = fs.id
        self.file_system = fs
        """The ``aws.fsx.LustreFileSystem`` (dnsName, mountName)."""
        self.register_outputs({"file_system_id": self.file_system_id, "data_claim_name": self.data_claim_name,
                               "data_read_only_claim_name": self.data_read_only_claim_name,
                               "run_claim_name": self.run_claim_name})

    def _pv(self, name: str, pv_name: pulumi.Input[str], fs: aws.fsx.LustreFileSystem,
            mount_path: pulumi.Input[str] | None,
            claim_ref: k8s.core.v1.ObjectReferenceArgs, modes: list[str], args: FsxLustreStoreArgs,
            after: Sequence[pulumi.Resource]) -> k8s.core.v1.PersistentVolume:
        return k8s.core.v1.PersistentVolume(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=pv_name, labels={"app.kubernetes.io/part-of": "eks-ddp"}),
            spec=k8s.core.v1.PersistentVolumeSpecArgs(
                capacity={"storage": f"{args.storage_capacity_gib}Gi"}, access_modes=modes, volume_mode="Filesystem",
                persistent_volume_reclaim_policy="Retain", storage_class_name="", claim_ref=claim_ref,
                csi=k8s.core.v1.CSIPersistentVolumeSourceArgs(
                    driver=FSX_CSI_DRIVER, volume_handle=fs.id,
                    volume_attributes={"dnsname": fs.dns_name,
                                       "mountname": fs.mount_name if mount_path is None
                                       else pulumi.Output.concat(fs.mount_name, "/", mount_path)}),
                mount_options=list(MOUNT_OPTIONS)),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(after)))

    def _static_claim(self, name: str, claim: str, fs: aws.fsx.LustreFileSystem, path: pulumi.Input[str],
                      args: FsxLustreStoreArgs, after: Sequence[pulumi.Resource],
                      read_only: bool = False) -> pulumi.Output[str]:
        """A PersistentVolume on one directory (a Lustre fileset mount), pre-bound to a claim of the same name."""
        modes = ["ReadOnlyMany"] if read_only else ["ReadWriteMany"]
        pv = self._pv(name, pulumi.Output.concat(args.namespace, f"-{claim}"), fs, path,
                      k8s.core.v1.ObjectReferenceArgs(namespace=args.namespace, name=claim), modes, args, after)
        pvc = k8s.core.v1.PersistentVolumeClaim(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=claim, namespace=args.namespace,
                                                labels={"app.kubernetes.io/part-of": "eks-ddp"}),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=modes, storage_class_name="", volume_name=pv.metadata.name,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(
                    requests={"storage": f"{args.storage_capacity_gib}Gi"})),
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(after)))
        return pvc.metadata.name

    def _layout_job(self, name: str, args: FsxLustreStoreArgs, fs: aws.fsx.LustreFileSystem, dirs: list[str],
                    after: Sequence[pulumi.Resource]) -> k8s.batch.v1.Job:
        """The directories of the claims, made the trainer's (see the module docstring)."""
        stem = pulumi.Output.concat("eks-ddp-", args.namespace, f"-{args.claim_name}")
        labels = {"app.kubernetes.io/name": "eks-ddp-fsx-layout", "app.kubernetes.io/part-of": "eks-ddp"}
        child = pulumi.ResourceOptions(parent=self, depends_on=list(after))
        claim = pulumi.Output.concat(stem, "-root")
        self._pv(f"{name}-root", claim, fs, None, k8s.core.v1.ObjectReferenceArgs(namespace=FSX_CSI_NAMESPACE,
                                                                               name=claim),
                 ["ReadWriteMany"], args, after)
        pvc = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-root",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=claim, namespace=FSX_CSI_NAMESPACE, labels=labels),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=["ReadWriteMany"], storage_class_name="", volume_name=claim,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(
                    requests={"storage": f"{args.storage_capacity_gib}Gi"})),
            opts=child)
        k8s.networking.v1.NetworkPolicy(
            f"{name}-layout", metadata=k8s.meta.v1.ObjectMetaArgs(
                name=pulumi.Output.concat(stem, "-layout"), namespace=FSX_CSI_NAMESPACE, labels=labels),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(  # the mount is the node's; the pod needs no network
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels), policy_types=["Ingress", "Egress"]),
            opts=pulumi.ResourceOptions(parent=self))
        paths = pulumi.Output.all(base=pulumi.Output.concat("eks-ddp/", args.namespace, f"/{args.claim_name}")).apply(
            lambda a: [f"{a['base']}/{d}" for d in dirs])
        command = paths.apply(lambda p: ["python", "-c", LAYOUT_SCRIPT, LAYOUT_ROOT, oct(DIRECTORY_MODE)[2:],
                                         str(TRAINER_UID), str(TRAINER_GID), *p])
        return k8s.batch.v1.Job(
            f"{name}-layout",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=pulumi.Output.concat(stem, "-layout"),
                                                namespace=FSX_CSI_NAMESPACE, labels=labels),
            spec=k8s.batch.v1.JobSpecArgs(
                backoff_limit=6,
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        restart_policy="Never", automount_service_account_token=False,
                        node_selector=dict(args.system_node_selector),
                        security_context=k8s.core.v1.PodSecurityContextArgs(
                            run_as_user=0, run_as_group=0, run_as_non_root=False,
                            seccomp_profile=k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault")),
                        containers=[k8s.core.v1.ContainerArgs(
                            name="layout", image=args.layout_image, command=command,
                            security_context=k8s.core.v1.SecurityContextArgs(
                                allow_privilege_escalation=False, read_only_root_filesystem=True, privileged=False,
                                capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"], add=list(LAYOUT_CAPABILITIES))),
                            resources=k8s.core.v1.ResourceRequirementsArgs(
                                requests={"cpu": "50m", "memory": "64Mi"}, limits={"cpu": "200m", "memory": "128Mi"}),
                            volume_mounts=[k8s.core.v1.VolumeMountArgs(name="fsx", mount_path=LAYOUT_ROOT)])],
                        volumes=[k8s.core.v1.VolumeArgs(
                            name="fsx", persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                                claim_name=pvc.metadata.name))]))),
            opts=child)
