"""Cross-field checks of the stack config: pure functions over the typed config, run once every key reads.

Each returns one message per problem, naming its YAML key, the bad value and what is allowed.
"""

from __future__ import annotations

import datetime as dt
import re
from types import SimpleNamespace
from typing import Any

from eks_ddp.config import run_rules
from eks_ddp.config.schema import (
    PROJECT,
    TRAINER_ONLY_KEYS,
    CatalogEntryConfig,
    ClusterConfig,
    NetworkConfig,
    NodeGroupConfig,
    RunConfig,
    StackConfig,
    WorkloadConfig,
    cluster_name_for,
)
from eks_ddp.core import catalog, k8s_versions, rules, storage
from eks_ddp.core.workload import Egress, iam_statement_problems

RDZV_RUN_ID_MAX = 44 - len("rendezvous-")
"""The longest runId of a run after the first with a store of its own (its name is 'rendezvous-<runId>')."""

_EFS_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
_FSX_BACKUP_ID = re.compile(r"^backup-[0-9a-f]{8,}$")  # FSx API reference, Backup.BackupId
_FSX_FILE_SYSTEM_ID = re.compile(r"^fs-[0-9a-f]{8,}$")  # FSx API reference, FileSystem.FileSystemId
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
_PLACEMENT_GROUP = re.compile(r"^[\x21-\x7e]{1,255}$")


_GRAVITON = re.compile(r"^[a-z]+\d+g[a-z]*\.")
"""An EC2 Graviton (arm64) type: a family whose generation digit is followed by 'g' (m7g, c6gn, t4g, r8gd)."""

def _found(*problems: object) -> list[str]:
    """The messages among checks' results (``None``, ``False`` or empty: no problem)."""
    return [p for p in problems if isinstance(p, str) and p]


def validate(cfg: StackConfig, *, stack: str | None = None, placeholders_ok: bool = False,
             today: dt.date | None = None) -> list[str]:
    """Cross-field checks; one message per problem, each naming its key. ``stack`` (the Pulumi stack's name) names
    the cluster when ``cluster.name`` does not; ``today`` (default: the real date) decides which Kubernetes versions
    EKS still takes with the upgrade policy."""
    c, st, net = cfg.cluster, cfg.storage, cfg.network
    bucket, key_arn, fs_id = st.results_bucket, st.results_kms_key_arn, st.file_system_id
    stack_bad = rules.cluster_name("stack name", cluster_name_for(stack)) if stack and c.name is None else None
    p = _found(
        rules.region("aws:region", cfg.region),
        c.name and rules.cluster_name("cluster.name", c.name),
        stack_bad and f"{stack_bad} (the cluster is named eks-ddp-<stack>: rename the stack with 'pulumi stack "
                      "rename', or set eks-ddp:cluster.name)",
        c.owner_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]{8,64}", c.owner_id)
        and f"cluster.ownerId: got {c.owner_id!r}; expected 8-64 letters, digits, '.', '_' or '-', unique to this "
            "stack (e.g. a uuid4 hex)",
        k8s_versions.policy_problem(c.kubernetes_version, c.upgrade_policy, today or dt.date.today()),
        rules.retention_days("observability.logRetentionDays", cfg.observability.log_retention_days),
        cfg.image.prebuilt and rules.image_by_digest("image.prebuilt", cfg.image.prebuilt),
        bucket is not None and rules.s3_bucket("storage.resultsBucket", bucket),
        key_arn is not None and (bucket is None or not _KMS_KEY_ARN.match(key_arn))
        and f"storage.resultsKmsKeyArn: got {key_arn!r}; expected the ARN of a KMS key "
            "(arn:aws:kms:<region>:<account>:key/<id>), and only with storage.resultsBucket",
        *(rules.s3_bucket(f"network.s3EndpointExtraBuckets[{i}]", b) for i, b in enumerate(net.s3_endpoint_extra_buckets)),
        fs_id is not None and not _EFS_ID.match(fs_id)
        and f"storage.fileSystemId: got {fs_id!r}; expected an EFS file system id like fs-0123456789abcdef0",
        rules.whole("image.keepImages", cfg.image.keep_images),
        k8s_versions.ami_release_problem("cluster.amiReleaseVersion", c.ami_release_version, c.kubernetes_version),
        cfg.etcd.replicas != 1
        and f"etcd.replicas: got {cfg.etcd.replicas!r}; expected 1 (a quorum of etcd members on emptyDir cannot take "
            "back a rescheduled member; the launcher rides out a restart of the one member)")
    p += _check_network(net, cfg.region) + _check_cluster(c, placeholders_ok)
    names: set[str] = set()
    for i, g in enumerate(cfg.node_groups):
        p += _check_group(g, f"nodeGroups[{i}]", cfg.region)
        if g.name in names:
            p.append(f"nodeGroups[{i}].name: got {g.name!r}; expected a name not used by another group")
        names.add(g.name)
        if net.availability_zones and g.availability_zone and g.availability_zone not in net.availability_zones:
            p.append(f"nodeGroups[{i}].availabilityZone: got {g.availability_zone!r}; expected one of "
                     f"network.availabilityZones ({', '.join(net.availability_zones)}): the group's nodes need a "
                     "subnet there")
    pinned = {g.availability_zone for g in cfg.node_groups if g.availability_zone}
    if not net.availability_zones and len(pinned) > net.az_count:
        p.append(f"network.azCount: got {net.az_count}; expected at least the {len(pinned)} zones node groups are "
                 f"pinned to ({', '.join(sorted(pinned))})")
    return (p + _check_runs(cfg) + run_rules.problems(cfg) + _check_storage_backend(cfg)
            + _check_capacity_windows(cfg, today))


def _check_network(n: NetworkConfig, region: str) -> list[str]:
    azs = n.availability_zones
    p = _found(rules.vpc_cidr("network.vpcCidr", n.vpc_cidr),
               not 2 <= n.az_count <= 6
               and f"network.azCount: got {n.az_count!r}; expected 2 to 6 (EKS needs subnets in 2 zones)",
               *(rules.zone(f"network.availabilityZones[{i}]", az, region) for i, az in enumerate(azs)),
               *(f"network.availabilityZones[{i}]: got {az!r} twice; expected distinct zones"
                 for i, az in enumerate(azs) if az in azs[:i]),
               azs and len(azs) != n.az_count
               and f"network.availabilityZones: got {len(azs)} zones; expected exactly azCount ({n.az_count})")
    if n.bring_your_own and len(n.private_subnet_ids) < 2:
        p.append(f"network.privateSubnetIds: got {list(n.private_subnet_ids)!r}; expected at least 2 private "
                 "subnets (in 2 zones) with network.vpcId")
    elif not n.bring_your_own and (n.public_subnet_ids or n.private_subnet_ids):
        p.append("network.privateSubnetIds: subnet ids given without network.vpcId; expected both (bring your own "
                 "VPC) or neither (a new VPC)")
    return p


def _check_cluster(c: ClusterConfig, placeholders_ok: bool = False) -> list[str]:
    p: list[str] = []
    if not c.endpoint_public_access:
        if c.public_access_cidrs:
            p.append(f"cluster.publicAccessCidrs: got {list(c.public_access_cidrs)!r}; expected none with "
                     "cluster.endpointPublicAccess false (the API endpoint is private only)")
    elif not c.public_access_cidrs:
        p.append("cluster.publicAccessCidrs: required while cluster.endpointPublicAccess is true; CIDRs allowed "
                 f"to reach the Kubernetes API endpoint, e.g. your IP as a /32 ({rules.MY_IP}); or set "
                 "cluster.endpointPublicAccess false for a private-only endpoint")
    else:
        p += rules.public_access_cidrs("cluster.publicAccessCidrs", c.public_access_cidrs,
                                       placeholders_ok=placeholders_ok)
    seen: set[str] = set()
    for key, arns in (("adminPrincipalArns", c.admin_principal_arns), ("viewerPrincipalArns", c.viewer_principal_arns)):
        for i, arn in enumerate(arns):
            if bad := rules.iam_principal(f"cluster.{key}[{i}]", arn):
                p.append(bad)
            elif arn in seen:
                p.append(f"cluster.{key}[{i}]: got {arn!r} a second time; expected each principal once, in "
                         "cluster.adminPrincipalArns or cluster.viewerPrincipalArns (one EKS access entry each)")
            seen.add(arn)
    if c.system_instance_type not in catalog.cpu_types() and _GRAVITON.match(c.system_instance_type):
        p.append(f"cluster.systemInstanceType: got {c.system_instance_type!r}, a Graviton (arm64) type; expected an "
                 "x86_64 type (the system nodes run the x86_64 AMI, AL2023_x86_64_STANDARD, and the stack's images "
                 "are built for amd64): " + ", ".join(catalog.cpu_types()))
    elif c.system_instance_type not in catalog.cpu_types():
        p.append(f"cluster.systemInstanceType: got {c.system_instance_type!r}; expected one of "
                 + ", ".join(catalog.cpu_types()) + "; or describe it under eks-ddp:catalog (an x86_64 type with "
                 "gpus 0, its vcpus, memoryGiB and priceUsdPerHour)")
    return p + _found(rules.whole("cluster.systemNodeCount", c.system_node_count),
                      rules.retention_days("cluster.logRetentionDays", c.log_retention_days),
                      rules.scale_down_time("cluster.scaleDownUnneededTime", c.scale_down_unneeded_time))


def _check_group(g: NodeGroupConfig, key: str, region: str) -> list[str]:
    it = catalog.CATALOG.get(g.instance_type)
    cr, pg = g.capacity_reservation_id, g.placement_group_name
    p = _found(
        rules.dns_label(f"{key}.name", g.name, 40),
        g.spot_instance_types and g.capacity_type != "spot"
        and f"{key}.spotInstanceTypes: got {list(g.spot_instance_types)!r} with capacityType {g.capacity_type!r}; "
            "expected capacityType 'spot', or no spotInstanceTypes",
        *(_spot_problem(g, it, i, other, key) for i, other in enumerate(g.spot_instance_types)
          if g.capacity_type == "spot"),
        (it is None or it.gpus == 0)
        and f"{key}.instanceType: got {g.instance_type!r}; expected a GPU type from the catalog: "
            + ", ".join(catalog.gpu_types()) + "; or describe it under eks-ddp:catalog (gpus, gpuModel, "
            "gpuMemoryGiB, vcpus, memoryGiB, efaInterfaces, priceUsdPerHour)",
        rules.whole(f"{key}.minSize", g.min_size, 0),
        rules.whole(f"{key}.maxSize", g.max_size),
        rules.root_volume_gib(f"{key}.rootVolumeGiB", g.root_volume_gib),
        g.min_size > g.max_size and f"{key}.minSize: got {g.min_size}; expected <= maxSize ({g.max_size})",
        g.min_size <= g.max_size and not g.min_size <= g.desired_size <= g.max_size  # else minSize's error says it
        and f"{key}.desiredSize: got {g.desired_size}; expected between minSize ({g.min_size}) and maxSize "
            f"({g.max_size})",
        g.efa and it is not None and not it.has_efa
        and f"{key}.efa: got true for {g.instance_type!r}, which has no EFA; expected false, or an EFA type: "
            + ", ".join(n for n in catalog.gpu_types() if catalog.CATALOG[n].has_efa),
        cr is not None and rules.capacity_reservation_id(f"{key}.capacityReservationId", cr),
        cr is not None and g.availability_zone is None
        and f"{key}.availabilityZone: required with capacityReservationId ({cr}); expected the reservation's zone, "
            f"e.g. {region or 'us-west-2'}a",
        cr is not None and g.capacity_type == "spot"
        and f"{key}.capacityType: got 'spot' with capacityReservationId; expected 'onDemand' or 'capacityBlock'",
        cr is not None and pg is not None and g.capacity_type == "capacityBlock"
        and f"{key}.placementGroupName: got {pg!r} with capacityType 'capacityBlock'; expected no "
            "placementGroupName (a capacity block is already co-located in an UltraCluster)",
        cr is None and g.capacity_type == "capacityBlock"
        and f"{key}.capacityReservationId: required with capacityType 'capacityBlock'; expected the capacity "
            "block's reservation id (cr-...)",
        pg is not None and not _PLACEMENT_GROUP.match(pg)
        and f"{key}.placementGroupName: got {pg!r}; expected a placement group name (1-255 printable ASCII "
            "characters, no spaces)",
        g.availability_zone and rules.zone(f"{key}.availabilityZone", g.availability_zone, region))
    return p


def _spot_problem(g: NodeGroupConfig, it: Any, i: int, other: str, key: str) -> str | None:
    alt = catalog.CATALOG.get(other)
    if it is None:
        return None
    if alt is None or (alt.gpus, alt.gpu_model) != (it.gpus, it.gpu_model) or other == g.instance_type:
        return (f"{key}.spotInstanceTypes[{i}]: got {other!r}; expected another catalog type with {it.gpus} x "
                f"{it.gpu_model} GPU like {g.instance_type}")
    if alt.vcpus < it.vcpus or alt.memory_gib < it.memory_gib:
        # The training pod is sized from instanceType, and the autoscaler simulates the first type only:
        # a smaller alternate is launched for a pod it cannot hold (Pending, idle node, repeat).
        return (f"{key}.spotInstanceTypes[{i}]: got {other!r} ({alt.vcpus} vCPUs, {alt.memory_gib} GiB); expected "
                f"at least the {it.vcpus} vCPUs and {it.memory_gib} GiB of instanceType {g.instance_type} (the pods "
                "are sized for it), e.g. a larger size of the same GPU")
    return None


def _check_runs(cfg: StackConfig) -> list[str]:
    p = [bad for i, run in enumerate(cfg.runs) for bad in _check_run(cfg, run, cfg.run_key(i))]
    first, ids = cfg.runs[0].namespace, [r.run_id for r in cfg.runs]
    for i, run in enumerate(cfg.runs[1:], 1):
        if run.run_id in ids[:i]:
            p.append(f"runs[{i}].runId: got {run.run_id!r}, already the runId of runs[{ids.index(run.run_id)}]; "
                     "expected a runId of its own (it names the run's Job and its checkpoint and results folders)")
        # Its own rendezvous store, 'rendezvous-<runId>' (__main__.py), whose Secret names must stay DNS labels
        # (EtcdRendezvous: a name of at most 44 characters).
        if run.rdzv_backend == "etcd" and len(run.run_id) > RDZV_RUN_ID_MAX:
            p.append(f"runs[{i}].runId: got {run.run_id!r} ({len(run.run_id)} characters); expected at most "
                     f"{RDZV_RUN_ID_MAX} with rdzvBackend 'etcd' (it names the run's own rendezvous store)")
        if run.namespace != first:
            # One namespace holds the stack's training workloads: its quota, NetworkPolicies and service accounts.
            p.append(f"runs[{i}].namespace: got {run.namespace!r}; expected the namespace of runs[0] ({first!r}): "
                     "the stack's runs share one namespace")
    return p


def _check_run(cfg: StackConfig, j: RunConfig, key: str) -> list[str]:
    names = [g.name for g in cfg.node_groups]
    g = cfg.group_of(j) if j.node_group in (None, *names) else None
    return _found(
        j.node_group is not None and j.node_group not in names
        and f"{key}.nodeGroup: got {j.node_group!r}; expected one of {', '.join(names)}",
        *(rules.whole(f"{key}.{k}", v, m) for k, v, m in (("nodes", j.nodes, 1), ("minNodes", j.min_nodes, 1),
          ("maxRestarts", j.max_restarts, 0), ("faultBudget", j.fault_budget, 0), ("epochs", j.epochs, 1))),
        not 0 < j.active_deadline_hours <= 24 * 365
        and f"{key}.activeDeadlineHours: got {j.active_deadline_hours!r}; expected a number of hours in (0, 8760]",
        rules.global_batch(f"{key}.globalBatchSize", j.global_batch_size),
        j.min_nodes > j.nodes and f"{key}.minNodes: got {j.min_nodes}; expected <= {key}.nodes ({j.nodes})",
        rules.learning_rate(f"{key}.learningRate", j.learning_rate),
        rules.run_id(f"{key}.runId", j.run_id),
        rules.namespace(f"{key}.namespace", j.namespace),
        g is not None and j.nodes > g.max_size
        and f"{key}.nodes: got {j.nodes}; expected <= nodeGroups maxSize of group {g.name!r} ({g.max_size}): one "
            "pod per node") + _check_workload(j.workload, f"{key}.workload")


def _check_workload(w: WorkloadConfig, key: str) -> list[str]:
    if not w.custom:
        return []
    got = f"module {w.module!r} and script {w.script!r}" if w.module else "neither module nor script"
    p = _found(w.image and rules.image_by_digest(f"{key}.image", w.image),
               (w.module is None) == (w.script is None)
               and f"{key}: got {got}; expected exactly one of {key}.module (python -m NAME) or {key}.script (a .py "
                   "file in the image)",
               w.module and rules.python_module(f"{key}.module", w.module),
               w.script and rules.script_path(f"{key}.script", w.script),
               *rules.env_names(f"{key}.env", w.env),
               w.s3_uri and rules.s3_prefix(f"{key}.data.s3", w.s3_uri),
               w.data and rules.manifest_sha256(f"{key}.data.sha256", w.data.sha256))
    for i, text in enumerate(w.egress):
        try:
            Egress.parse(f"{key}.egress[{i}]", text)
        except ValueError as err:
            p.append(str(err))
    return p + iam_statement_problems(f"{key}.iamStatements", w.iam_statements)


# --- storage backend, capacity-block windows -----------------------------------------------------------------------

def _check_storage_backend(cfg: StackConfig) -> list[str]:
    st, p = cfg.storage, []
    if st.backend == "fsxLustre":
        p += [b for b in (storage.fsx_capacity_problem("storage.fsxStorageCapacityGiB", st.fsx_storage_capacity_gib),
                          storage.fsx_throughput_problem("storage.fsxThroughputPerTiB", st.fsx_throughput_per_tib))
              if b]
        if st.file_system_id is not None:
            p.append(f"storage.fileSystemId: got {st.file_system_id!r} with storage.backend 'fsxLustre'; expected "
                     "none (it names an EFS file system to adopt; the FSx backend creates its own)")
        if st.fsx_backup_id is not None and not _FSX_BACKUP_ID.match(st.fsx_backup_id):
            p.append(f"storage.fsxBackupId: got {st.fsx_backup_id!r}; expected an FSx backup id like "
                     "backup-0123456789abcdef0 (aws fsx describe-backups)")
        if st.fsx_replace is not None and not _FSX_FILE_SYSTEM_ID.match(st.fsx_replace):
            p.append(f"storage.fsxReplace: got {st.fsx_replace!r}; expected the id of the stack's file system that "
                     "this up may replace, like fs-0123456789abcdef0 (pulumi stack output fsxId)")
    elif st.fsx_replace is not None:
        p.append(f"storage.fsxReplace: got {st.fsx_replace!r} with storage.backend {st.backend!r}; expected none "
                 "(it lets an up replace the stack's FSx for Lustre file system)")
    if st.backend != "fsxLustre" and st.fsx_backup_id is not None:
        p.append(f"storage.fsxBackupId: got {st.fsx_backup_id!r} with storage.backend {st.backend!r}; expected none "
                 "(it restores an FSx for Lustre backup; an EFS file system is adopted with storage.fileSystemId)")
    t = st.efs_transitions
    p += storage.efs_lifecycle_problems(t["transition_to_ia"], t["transition_to_archive"],
                                        t["transition_to_primary_storage_class"],
                                        ("storage.efsTransitionToIA", "storage.efsTransitionToArchive",
                                         "storage.efsTransitionToPrimary"))
    return p


def _utc(key: str, text: str | None) -> tuple[dt.datetime | None, str | None]:
    """An ISO 8601 UTC time (``2026-12-01T11:30:00Z``), or the problem with it."""
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text is not None else None
    except ValueError:
        when = None
    if text is not None and (when is None or when.utcoffset() != dt.timedelta(0)):
        return None, f"{key}: got {text!r}; expected a UTC time such as 2026-12-01T11:30:00Z"
    return when, None


def _check_capacity_windows(cfg: StackConfig, today: dt.date | None) -> list[str]:
    """A capacity block's window: no run asks for its nodes before the start, none after the end."""
    now = dt.datetime.combine(today, dt.time(), dt.UTC) if today is not None else dt.datetime.now(dt.UTC)
    p: list[str] = []
    for i, g in enumerate(cfg.node_groups):
        key, first, last = f"nodeGroups[{i}]", g.capacity_block_start, g.capacity_block_end
        if first is None and last is None:
            continue
        if g.capacity_type != "capacityBlock":
            p.append(f"{key}.capacityBlockStart: set with capacityType {g.capacity_type!r}; expected capacityType "
                     "'capacityBlock' (the window is a capacity block's), or no capacityBlockStart/End")
            continue
        (start, bad_start), (end, bad_end) = _utc(f"{key}.capacityBlockStart", first), _utc(f"{key}.capacityBlockEnd",
                                                                                            last)
        p += _found(bad_start, bad_end, (first is None) != (last is None)
                    and f"{key}.capacityBlockEnd: expected capacityBlockStart and capacityBlockEnd together (the "
                        "block's StartDate and EndDate: aws ec2 describe-capacity-reservations --capacity-reservation-"
                        f"ids {g.capacity_reservation_id})")
        if start is None or end is None:
            continue
        if end <= start:
            p.append(f"{key}.capacityBlockEnd: got {last!r}; expected a time after capacityBlockStart ({first})")
        elif end <= now:
            p.append(f"{key}.capacityBlockEnd: the block ended at {last}; expected the window of a block that has "
                     "not ended (set the new block's capacityReservationId, start and end)")
        elif start > now:
            p += _found(g.desired_size > 0 and f"{key}.desiredSize: got {g.desired_size} before the block starts "
                                               f"({first}); expected 0: no node can launch before then")
            p += [f"{cfg.run_key(r)}.state: 'run' on group {g.name!r}, whose capacity block starts at {first}; "
                  "expected 'cancelled' until then (its pods would ask for nodes that cannot launch, and the "
                  "autoscaler would back off), then 'run'"
                  for r, run in enumerate(cfg.runs) if cfg.group_of(run).name == g.name and run.state == "run"]
    return p


def ignored_settings(cfg: StackConfig, data: dict[str, Any]) -> list[str]:
    """Keys that are set (in the stack file's ``data``) but would have no effect: say so instead of ignoring them."""
    net, which = data.get("network") or {}, "every run's rdzvBackend" if cfg.runs_listed else "job.rdzvBackend"
    return _found(
        "job" in data and "runs" in data
        and f"{PROJECT}:job and {PROJECT}:runs: both set; expected one of them: job (one run of the bundled trainer) "
            "or runs (a list of runs, each with the job keys plus workload)",
        *(f"network.{key}: set together with network.vpcId, which uses your VPC as it is; expected no network.{key} "
          "(it only shapes a new VPC)" for key in ("vpcCidr", "azCount", "availabilityZones", "natGateways",
                                                    "s3EndpointExtraBuckets") if cfg.network.bring_your_own and key in net),
        not cfg.uses_etcd and data.get("etcd")
        and f"etcd: got {data['etcd']!r} with {which} 'c10d', which deploys no etcd; expected no eks-ddp:etcd, or "
            f"{which} 'etcd'",
        *(f"runs[{i}].{key}: set with a workload of your own, which never reads it (only the bundled cifar10 trainer "
          f"does); expected no runs[{i}].{key}: pass your own flags in runs[{i}].workload.args"
          for i, (run, raw) in enumerate(zip(cfg.runs, data["runs"] if cfg.runs_listed else [], strict=False))
          if run.workload.custom for key in TRAINER_ONLY_KEYS if key in raw))


#: The stack key of each InstanceType field, for messages.
_CATALOG_KEYS = {"gpu_model": "gpuModel", "gpu_memory_gib": "gpuMemoryGiB", "memory_gib": "memoryGiB",
                 "efa_interfaces": "efaInterfaces", "price_per_hour": "priceUsdPerHour", "network_gbps": "networkGbps"}


def catalog_problems(entries: tuple[CatalogEntryConfig, ...]) -> list[str]:
    """``eks-ddp:catalog``: each entry checked like a built-in row, once, and not a built-in type nor one
    registered with other values (run before the entries are registered)."""
    p: list[str] = []
    for i, e in enumerate(entries):
        key = f"catalog[{i}]"
        bad = catalog.instance_type_problems(SimpleNamespace(**e._fields()), key, names=_CATALOG_KEYS)
        if e.name in catalog.BUILTIN:
            bad.append(f"{key}.name: got {e.name!r}, which the built-in catalog lists; expected a type it does "
                       "not list (python: catalog.register(..., replace=True) corrects a built-in row)")
        elif (known := catalog.CATALOG.get(e.name)) is not None and not bad and known != e.instance_type():
            bad.append(f"{key}.name: got {e.name!r}, already registered with other values ({known}); expected "
                       "one description per type")
        if e.efa_interfaces and e.gpus and e.network_gbps is None:
            bad.append(f"{key}.networkGbps: required with efaInterfaces ({e.efa_interfaces}); expected the type's "
                       "network bandwidth in Gbps (the fabric check's floor is a quarter of it)")
        if e.name in [o.name for o in entries[:i]]:
            bad.append(f"{key}.name: got {e.name!r} twice; expected each type once")
        p += bad
    return p


def advice(cfg: StackConfig) -> list[str]:
    """What a valid stack may not mean (``pulumi up`` and the plan print each as a warning): a multi-node run on an
    EFA type with ``efa`` off, and, with FSx for Lustre, a run whose group is pinned to another zone than the file
    system's."""
    out = []
    keys = [cfg.run_key(i) for i in range(len(cfg.runs))]
    for key, run in zip(keys, cfg.runs, strict=True):
        g = cfg.group_of(run)
        it = catalog.CATALOG.get(g.instance_type)
        if it is not None and it.has_efa and not g.efa and run.nodes > 1:
            i = cfg.node_groups.index(g)
            out.append(f"nodeGroups[{i}].efa: false on {g.instance_type}, which has {it.efa_interfaces} EFA "
                       f"interface(s), while {key} trains on {run.nodes} nodes: its all-reduce between nodes goes over "
                       "TCP, far below the fabric's bandwidth; expected efa: true for a multi-node run (docs/efa.md)")
    if cfg.storage.backend == "fsxLustre":
        fsx_zone = cfg.job_group.availability_zone
        where = fsx_zone or "the zone of the first private subnet"
        for key, run in zip(keys, cfg.runs, strict=True):
            g = cfg.group_of(run)
            if g.availability_zone and g.availability_zone != fsx_zone:
                out.append(f"storage.backend: fsxLustre lives in one subnet, in {where} (the group of {keys[0]}); "
                           f"{key}'s group {g.name!r} is pinned to {g.availability_zone}, so its nodes mount it across "
                           "zones (slower, and the traffic is billed); expected the runs' groups in one zone, or "
                           "storage.backend efs (a mount target in every zone)")
    return out
