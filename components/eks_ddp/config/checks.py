"""Cross-field checks of the stack config: pure functions over the typed config.

Each returns one message per problem, naming its YAML key, the bad value and what is allowed.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from eks_ddp.config import run_rules
from eks_ddp.config.schema import (
    DNS_LABEL,
    SUPPORTED_KUBERNETES_VERSIONS,
    TRAINER_ONLY_KEYS,
    ClusterConfig,
    NetworkConfig,
    NodeGroupConfig,
    RunConfig,
    StackConfig,
    WorkloadConfig,
)
from eks_ddp.core import catalog, k8s_versions, rules, storage
from eks_ddp.core.workload import Egress, iam_statement_problems

RDZV_RUN_ID_MAX = 44 - len("rendezvous-")
"""The longest runId of a run after the first with a store of its own (its name is 'rendezvous-<runId>')."""

_AZ = rules.AZ
_ODCR = rules.ODCR
_IAM_PRINCIPAL = rules.IAM_PRINCIPAL
_EFS_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
_PLACEMENT_GROUP = re.compile(r"^[\x21-\x7e]{1,255}$")


def validate(cfg: StackConfig, *, placeholders_ok: bool = False, today: dt.date | None = None) -> list[str]:
    """Cross-field checks; one message per problem, each naming its key. ``today`` (default: the real date)
    decides which Kubernetes versions EKS still takes with the upgrade policy."""
    p: list[str] = []
    p += _check_network(cfg.network, cfg.region)
    p += _check_cluster(cfg.cluster, placeholders_ok)
    if cfg.cluster.kubernetes_version in SUPPORTED_KUBERNETES_VERSIONS and (bad := k8s_versions.policy_problem(
            cfg.cluster.kubernetes_version, cfg.cluster.upgrade_policy, today or dt.date.today())):
        p.append(bad)
    names: set[str] = set()
    for i, g in enumerate(cfg.node_groups):
        p += _check_group(g, f"nodeGroups[{i}]", cfg.region)
        if g.name in names:
            p.append(f"nodeGroups[{i}].name: got {g.name!r}; expected a name not used by another group")
        names.add(g.name)
    p += _check_runs(cfg)
    p += run_rules.problems(cfg)
    if bad := rules.retention_days("observability.logRetentionDays", cfg.observability.log_retention_days):
        p.append(bad)
    if cfg.image.prebuilt is not None and (bad := rules.image_by_digest("image.prebuilt", cfg.image.prebuilt)):
        p.append(bad)
    bucket = cfg.storage.results_bucket
    if bucket is not None and not re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket):
        p.append(f"storage.resultsBucket: got {bucket!r}; expected an S3 bucket name (3-63 lowercase letters, "
                 "digits, '.' and '-')")
    key_arn = cfg.storage.results_kms_key_arn
    if key_arn is not None and (bucket is None or not _KMS_KEY_ARN.match(key_arn)):
        p.append(f"storage.resultsKmsKeyArn: got {key_arn!r}; expected the ARN of a KMS key "
                 "(arn:aws:kms:<region>:<account>:key/<id>), and only with storage.resultsBucket")
    for i, extra in enumerate(cfg.network.s3_endpoint_extra_buckets):
        if bad := rules.s3_bucket(f"network.s3EndpointExtraBuckets[{i}]", extra):
            p.append(bad)
    fs_id = cfg.storage.file_system_id
    if fs_id is not None and not _EFS_ID.match(fs_id):
        p.append(f"storage.fileSystemId: got {fs_id!r}; expected an EFS file system id like fs-0123456789abcdef0")
    pinned = {g.availability_zone for g in cfg.node_groups if g.availability_zone}
    if not cfg.network.availability_zones and len(pinned) > cfg.network.az_count:
        p.append(f"network.azCount: got {cfg.network.az_count}; expected at least the {len(pinned)} zones node "
                 f"groups are pinned to ({', '.join(sorted(pinned))})")
    for i, g in enumerate(cfg.node_groups):
        if cfg.network.availability_zones and g.availability_zone \
                and g.availability_zone not in cfg.network.availability_zones:
            p.append(f"nodeGroups[{i}].availabilityZone: got {g.availability_zone!r}; expected one of "
                     f"network.availabilityZones ({', '.join(cfg.network.availability_zones)}): the group's "
                     "nodes need a subnet there")
    if cfg.image.keep_images < 1:
        p.append(f"image.keepImages: got {cfg.image.keep_images!r}; expected a whole number >= 1")
    p += _check_storage_backend(cfg)
    p += _check_capacity_windows(cfg, today)
    if bad := k8s_versions.ami_release_problem("cluster.amiReleaseVersion", cfg.cluster.ami_release_version,
                                                cfg.cluster.kubernetes_version):
        p.append(bad)
    if cfg.etcd.replicas != 1:
        p.append(f"etcd.replicas: got {cfg.etcd.replicas!r}; expected 1 (a quorum of etcd members on emptyDir "
                 "cannot take back a rescheduled member; the launcher rides out a restart of the one member)")
    return p


def _positive(key: str, value: int, minimum: int = 1) -> list[str]:
    return [] if value >= minimum else [f"{key}: got {value!r}; expected a whole number >= {minimum}"]


def _check_network(n: NetworkConfig, region: str) -> list[str]:
    p: list[str] = []
    if bad := rules.vpc_cidr("network.vpcCidr", n.vpc_cidr):
        p.append(bad)
    if not 2 <= n.az_count <= 6:
        p.append(f"network.azCount: got {n.az_count!r}; expected 2 to 6 (EKS needs subnets in 2 zones)")
    for i, az in enumerate(n.availability_zones):
        if not _AZ.match(az) or (region and not az.startswith(region)):
            p.append(f"network.availabilityZones[{i}]: got {az!r}; expected a zone of region {region!r}")
    seen: set[str] = set()
    for i, az in enumerate(n.availability_zones):
        if az in seen:
            p.append(f"network.availabilityZones[{i}]: got {az!r} twice; expected distinct zones")
        seen.add(az)
    if n.availability_zones and len(n.availability_zones) != n.az_count:
        p.append(f"network.availabilityZones: got {len(n.availability_zones)} zones; "
                 f"expected exactly azCount ({n.az_count})")
    if n.bring_your_own:
        if len(n.private_subnet_ids) < 2:
            p.append(f"network.privateSubnetIds: got {list(n.private_subnet_ids)!r}; expected at least "
                     "2 private subnets (in 2 zones) with network.vpcId")
    elif n.public_subnet_ids or n.private_subnet_ids:
        p.append("network.privateSubnetIds: subnet ids given without network.vpcId; "
                 "expected both (bring your own VPC) or neither (a new VPC)")
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
            if not _IAM_PRINCIPAL.match(arn):
                p.append(f"cluster.{key}[{i}]: got {arn!r}; expected an IAM role or user ARN such as "
                         "arn:aws:iam::123456789012:role/ci-deployer")
            elif arn in seen:
                p.append(f"cluster.{key}[{i}]: got {arn!r} a second time; expected each principal once, in "
                         "cluster.adminPrincipalArns or cluster.viewerPrincipalArns (one EKS access entry each)")
            seen.add(arn)
    if c.kubernetes_version not in SUPPORTED_KUBERNETES_VERSIONS:
        p.append(f"cluster.kubernetesVersion: got {c.kubernetes_version!r}; expected one of "
                 + ", ".join(SUPPORTED_KUBERNETES_VERSIONS))
    if c.system_instance_type not in catalog.cpu_types():
        p.append(f"cluster.systemInstanceType: got {c.system_instance_type!r}; expected one of "
                 + ", ".join(catalog.cpu_types()) + "; or describe it under eks-ddp:catalog (an x86_64 type with "
                 "gpus 0, its vcpus, memoryGiB and priceUsdPerHour)")
    p += _positive("cluster.systemNodeCount", c.system_node_count)
    if bad := rules.retention_days("cluster.logRetentionDays", c.log_retention_days):
        p.append(bad)
    if bad := rules.scale_down_time("cluster.scaleDownUnneededTime", c.scale_down_unneeded_time):
        p.append(bad)
    return p


duration_minutes = rules.duration_minutes


def _check_group(g: NodeGroupConfig, key: str, region: str) -> list[str]:
    p: list[str] = []
    if not DNS_LABEL.match(g.name) or len(g.name) > 40:
        p.append(f"{key}.name: got {g.name!r}; expected lowercase letters, digits and '-' (max 40)")
    it = catalog.CATALOG.get(g.instance_type)
    for i, other in enumerate(g.spot_instance_types):
        alt = catalog.CATALOG.get(other)
        if g.capacity_type != "spot":
            p.append(f"{key}.spotInstanceTypes: got {list(g.spot_instance_types)!r} with capacityType "
                     f"{g.capacity_type!r}; expected capacityType 'spot', or no spotInstanceTypes")
            break
        if it is not None and (alt is None or (alt.gpus, alt.gpu_model) != (it.gpus, it.gpu_model)
                               or other == g.instance_type):
            p.append(f"{key}.spotInstanceTypes[{i}]: got {other!r}; expected another catalog type with "
                     f"{it.gpus} x {it.gpu_model} GPU like {g.instance_type}")
        elif it is not None and alt is not None and (alt.vcpus < it.vcpus or alt.memory_gib < it.memory_gib):
            # The training pod is sized from instanceType, and the autoscaler simulates the first type only:
            # a smaller alternate is launched for a pod it cannot hold (Pending, idle node, repeat).
            p.append(f"{key}.spotInstanceTypes[{i}]: got {other!r} ({alt.vcpus} vCPUs, {alt.memory_gib} GiB); "
                     f"expected at least the {it.vcpus} vCPUs and {it.memory_gib} GiB of instanceType "
                     f"{g.instance_type} (the pods are sized for it), e.g. a larger size of the same GPU")
    if it is None or it.gpus == 0:
        p.append(f"{key}.instanceType: got {g.instance_type!r}; expected a GPU type from the catalog: "
                 + ", ".join(catalog.gpu_types()) + "; or describe it under eks-ddp:catalog (gpus, gpuModel, "
                 "gpuMemoryGiB, vcpus, memoryGiB, efaInterfaces, priceUsdPerHour)")
    p += _positive(f"{key}.minSize", g.min_size, 0)
    p += _positive(f"{key}.maxSize", g.max_size, 1)
    if bad := rules.root_volume_gib(f"{key}.rootVolumeGiB", g.root_volume_gib):
        p.append(bad)
    if g.min_size > g.max_size:
        p.append(f"{key}.minSize: got {g.min_size}; expected <= maxSize ({g.max_size})")
    if not g.min_size <= g.desired_size <= g.max_size:
        p.append(f"{key}.desiredSize: got {g.desired_size}; expected between minSize ({g.min_size}) "
                 f"and maxSize ({g.max_size})")
    if g.efa and it is not None and not it.has_efa:
        efa_types = ", ".join(n for n in catalog.gpu_types() if catalog.CATALOG[n].has_efa)
        p.append(f"{key}.efa: got true for {g.instance_type!r}, which has no EFA; "
                 f"expected false, or an EFA type: {efa_types}")
    if g.capacity_reservation_id is not None:
        if not _ODCR.match(g.capacity_reservation_id):
            p.append(f"{key}.capacityReservationId: got {g.capacity_reservation_id!r}; "
                     "expected an id like cr-0123456789abcdef0")
        if g.availability_zone is None:
            p.append(f"{key}.availabilityZone: required with capacityReservationId "
                     f"({g.capacity_reservation_id}); expected the reservation's zone, e.g. {region or 'us-west-2'}a")
        if g.capacity_type == "spot":
            p.append(f"{key}.capacityType: got 'spot' with capacityReservationId; "
                     "expected 'onDemand' or 'capacityBlock'")
        if g.placement_group_name is not None and g.capacity_type == "capacityBlock":
            p.append(f"{key}.placementGroupName: got {g.placement_group_name!r} with capacityType 'capacityBlock'; "
                     "expected no placementGroupName (a capacity block is already co-located in an UltraCluster)")
    elif g.capacity_type == "capacityBlock":
        p.append(f"{key}.capacityReservationId: required with capacityType 'capacityBlock'; "
                 "expected the capacity block's reservation id (cr-...)")
    if g.placement_group_name is not None and not _PLACEMENT_GROUP.match(g.placement_group_name):
        p.append(f"{key}.placementGroupName: got {g.placement_group_name!r}; expected a placement group name "
                 "(1-255 printable ASCII characters, no spaces)")
    if g.availability_zone is not None and (not _AZ.match(g.availability_zone)
                                            or (region and not g.availability_zone.startswith(region))):
        p.append(f"{key}.availabilityZone: got {g.availability_zone!r}; expected a zone of region {region!r}")
    return p


def _check_runs(cfg: StackConfig) -> list[str]:
    p: list[str] = []
    for i, run in enumerate(cfg.runs):
        p += _check_run(cfg, run, cfg.run_key(i))
    seen: dict[str, int] = {}
    for i, run in enumerate(cfg.runs):
        if run.run_id in seen:
            p.append(f"runs[{i}].runId: got {run.run_id!r}, already the runId of runs[{seen[run.run_id]}]; expected "
                     "a runId of its own (it names the run's Job and its checkpoint and results folders)")
        seen.setdefault(run.run_id, i)
    for i, run in enumerate(cfg.runs[1:], 1):
        # Its own rendezvous store, 'rendezvous-<runId>' (__main__.py), whose Secret names must stay DNS labels
        # (EtcdRendezvous: a name of at most 44 characters).
        if run.rdzv_backend == "etcd-v2" and len(run.run_id) > RDZV_RUN_ID_MAX:
            p.append(f"runs[{i}].runId: got {run.run_id!r} ({len(run.run_id)} characters); expected at most "
                     f"{RDZV_RUN_ID_MAX} with rdzvBackend 'etcd-v2' (it names the run's own rendezvous store)")
    first = cfg.runs[0].namespace
    for i, run in enumerate(cfg.runs[1:], 1):
        if run.namespace != first:
            # One namespace holds the stack's training workloads: its quota, NetworkPolicies and service accounts.
            p.append(f"runs[{i}].namespace: got {run.namespace!r}; expected the namespace of runs[0] ({first!r}): "
                     "the stack's runs share one namespace")
    return p


def _check_run(cfg: StackConfig, j: RunConfig, key: str) -> list[str]:
    p: list[str] = []
    names = [g.name for g in cfg.node_groups]
    if j.node_group is not None and j.node_group not in names:
        p.append(f"{key}.nodeGroup: got {j.node_group!r}; expected one of {', '.join(names)}")
    p += _positive(f"{key}.nodes", j.nodes)
    p += _positive(f"{key}.minNodes", j.min_nodes)
    p += _positive(f"{key}.maxRestarts", j.max_restarts, 0)
    p += _positive(f"{key}.faultBudget", j.fault_budget, 0)
    if not 0 < j.active_deadline_hours <= 24 * 365:
        p.append(f"{key}.activeDeadlineHours: got {j.active_deadline_hours!r}; expected a number of hours in "
                 "(0, 8760]")
    p += _positive(f"{key}.epochs", j.epochs)
    if bad := rules.global_batch(f"{key}.globalBatchSize", j.global_batch_size):
        p.append(bad)
    if j.min_nodes > j.nodes:
        p.append(f"{key}.minNodes: got {j.min_nodes}; expected <= {key}.nodes ({j.nodes})")
    if bad := rules.learning_rate(f"{key}.learningRate", j.learning_rate):
        p.append(bad)
    if bad := rules.run_id(f"{key}.runId", j.run_id):
        p.append(bad)
    if bad := rules.namespace(f"{key}.namespace", j.namespace):
        p.append(bad)
    if j.node_group is None or j.node_group in names:
        g = cfg.node_group(j.node_group or names[0])
        if j.nodes > g.max_size:
            p.append(f"{key}.nodes: got {j.nodes}; expected <= nodeGroups maxSize of group {g.name!r} "
                     f"({g.max_size}): one pod per node")
    p += _check_workload(j.workload, f"{key}.workload")
    return p


def _check_workload(w: WorkloadConfig, key: str) -> list[str]:
    if not w.custom:
        return []
    p: list[str] = []
    if w.image is not None and (bad := rules.image_by_digest(f"{key}.image", w.image)):
        p.append(bad)
    if (w.module is None) == (w.script is None):
        got = f"module {w.module!r} and script {w.script!r}" if w.module else "neither module nor script"
        p.append(f"{key}: got {got}; expected exactly one of {key}.module (python -m NAME) or {key}.script "
                 "(a .py file in the image)")
    if w.module is not None and (bad := rules.python_module(f"{key}.module", w.module)):
        p.append(bad)
    if w.script is not None and (bad := rules.script_path(f"{key}.script", w.script)):
        p.append(bad)
    p += rules.env_names(f"{key}.env", w.env)
    if w.s3_uri is not None and (bad := rules.s3_prefix(f"{key}.data.s3", w.s3_uri)):
        p.append(bad)
    if bad := rules.manifest_sha256(f"{key}.data.sha256", w.s3_sha256):
        p.append(bad)
    for i, text in enumerate(w.egress):
        try:
            Egress.parse(f"{key}.egress[{i}]", text)
        except ValueError as err:
            p.append(str(err))
    p += iam_statement_problems(f"{key}.iamStatements", w.iam_statements)
    return p


# --- storage backend, node storage, capacity-block windows ---------------------------------------------------------

LOCAL_STORAGE = ("RAID0", "none")


def _check_storage_backend(cfg: StackConfig) -> list[str]:
    st, p = cfg.storage, []
    if st.backend not in storage.BACKENDS:
        p.append(f"storage.backend: got {st.backend!r}; expected one of {', '.join(map(repr, storage.BACKENDS))}")
    elif st.backend == "fsxLustre":
        p += [b for b in (storage.fsx_capacity_problem("storage.fsxStorageCapacityGiB", st.fsx_storage_capacity_gib),
                          storage.fsx_throughput_problem("storage.fsxThroughputPerTiB", st.fsx_throughput_per_tib))
              if b]
        if st.file_system_id is not None:
            p.append(f"storage.fileSystemId: got {st.file_system_id!r} with storage.backend 'fsxLustre'; expected "
                     "none (it names an EFS file system to adopt; the FSx backend creates its own)")
    t = st.efs_transitions
    p += storage.efs_lifecycle_problems(t["transition_to_ia"], t["transition_to_archive"],
                                        t["transition_to_primary_storage_class"],
                                        ("storage.efsTransitionToIA", "storage.efsTransitionToArchive",
                                         "storage.efsTransitionToPrimary"))
    return p


def parse_utc(key: str, text: str | None) -> tuple[dt.datetime | None, str | None]:
    """An ISO 8601 UTC time (``2026-12-01T11:30:00Z``), or the problem with it."""
    if text is None:
        return None, None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.utcoffset() != dt.timedelta(0):
        return None, f"{key}: got {text!r}; expected a UTC time such as 2026-12-01T11:30:00Z"
    return when, None


def _check_capacity_windows(cfg: StackConfig, today: dt.date | None) -> list[str]:
    """A capacity block's window: no run asks for its nodes before the start, none after the end."""
    now = (dt.datetime.combine(today, dt.time(), dt.UTC) if today is not None
           else dt.datetime.now(dt.UTC))
    p: list[str] = []
    for i, g in enumerate(cfg.node_groups):
        key = f"nodeGroups[{i}]"
        if g.local_storage not in LOCAL_STORAGE:
            p.append(f"{key}.localStorage: got {g.local_storage!r}; expected 'RAID0' or 'none'")
        if g.capacity_block_start is None and g.capacity_block_end is None:
            continue
        if g.capacity_type != "capacityBlock":
            p.append(f"{key}.capacityBlockStart: set with capacityType {g.capacity_type!r}; expected capacityType "
                     "'capacityBlock' (the window is a capacity block's), or no capacityBlockStart/End")
            continue
        start, bad_start = parse_utc(f"{key}.capacityBlockStart", g.capacity_block_start)
        end, bad_end = parse_utc(f"{key}.capacityBlockEnd", g.capacity_block_end)
        p += [b for b in (bad_start, bad_end) if b]
        if (g.capacity_block_start is None) != (g.capacity_block_end is None):
            p.append(f"{key}.capacityBlockEnd: expected capacityBlockStart and capacityBlockEnd together (the "
                     "block's StartDate and EndDate: aws ec2 describe-capacity-reservations --capacity-reservation-"
                     f"ids {g.capacity_reservation_id})")
        if start is None or end is None:
            continue
        if end <= start:
            p.append(f"{key}.capacityBlockEnd: got {g.capacity_block_end!r}; expected a time after "
                     f"capacityBlockStart ({g.capacity_block_start})")
        elif end <= now:
            p.append(f"{key}.capacityBlockEnd: the block ended at {g.capacity_block_end}; expected the window of a "
                     "block that has not ended (set the new block's capacityReservationId, start and end)")
        elif start > now:
            if g.desired_size > 0:
                p.append(f"{key}.desiredSize: got {g.desired_size} before the block starts ({g.capacity_block_start});"
                         " expected 0: no node can launch before then")
            for r, run in enumerate(cfg.runs):
                if cfg.group_of(run).name == g.name and run.state == "run":
                    p.append(f"{cfg.run_key(r)}.state: 'run' on group {g.name!r}, whose capacity block starts at "
                             f"{g.capacity_block_start}; expected 'cancelled' until then (its pods would ask for "
                             "nodes that cannot launch, and the autoscaler would back off), then 'run'")
    return p


def ignored_settings(cfg: StackConfig, data: dict[str, Any]) -> list[str]:
    """Keys that are set (in the stack file's ``data``) but would have no effect: say so instead of ignoring them."""
    p: list[str] = []
    raw = data.get("network")
    net = raw if isinstance(raw, dict) else {}
    if cfg.network.bring_your_own:
        for key in ("vpcCidr", "azCount", "availabilityZones", "natGateways", "s3EndpointExtraBuckets"):
            if key in net:
                p.append(f"network.{key}: set together with network.vpcId, which uses your VPC as it is; "
                         f"expected no network.{key} (it only shapes a new VPC)")
    if not cfg.uses_etcd and data.get("etcd"):
        which = "every run's rdzvBackend" if cfg.runs_listed else "job.rdzvBackend"
        p.append(f"etcd: got {data['etcd']!r} with {which} 'c10d', which deploys no etcd; "
                 f"expected no eks-ddp:etcd, or {which} 'etcd-v2'")
    if cfg.runs_listed:
        for i, (run, raw) in enumerate(zip(cfg.runs, data["runs"], strict=True)):
            if run.workload.custom:
                p += [f"runs[{i}].{key}: set with a workload of your own, which never reads it (only the bundled "
                      f"cifar10 trainer does); expected no runs[{i}].{key}: pass your own flags in "
                      f"runs[{i}].workload.args" for key in TRAINER_ONLY_KEYS if key in raw]
    return p
