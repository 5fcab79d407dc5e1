"""A GPU managed node group: ``aws.eks.NodeGroup`` plus its own launch template.

Every property is set here, where it can be read and tested:

* AMI ``AL2023_x86_64_NVIDIA`` (NVIDIA driver, container toolkit, EFA software).
* IMDSv2 required with a hop limit of 1: nothing in a training pod needs the
  instance's credentials or metadata (the device plugins talk to the kubelet and
  the devices, not IMDS), and hop limit 1 stops containers from reaching IMDS and
  borrowing the node role.
* An encrypted gp3 root volume sized for multi-GB training images; where the type has NVMe instance store
  (catalog ``local_nvme_gb``), nodeadm stripes it as RAID0 under the kubelet's and containerd's directories
  (``local_storage``), so images are extracted and scratch is written there.
* Taint ``nvidia.com/gpu=true:NoSchedule`` (only pods that tolerate it land here)
  and labels ``eks-ddp/node-group``, ``eks-ddp/pool=gpu`` and the instance type,
  used as the job's nodeSelector.
* ``min_size`` may be 0 (pay nothing while idle); ``desired_size`` applies at
  creation only (``ignore_changes``), so scaling by hand or by an autoscaler sticks.
  A min/max change sends the whole scaling config, the ignored desired size taken
  from state: ``Pulumi.yaml`` refreshes before every operation (``options.refresh:
  always``) so that is the live size, and preflight refuses a ``minSize`` above or a
  ``maxSize`` below the live desired size (EKS would refuse the first, and the second
  would scale in running nodes) with the ``aws eks update-nodegroup-config`` to run.
* ``version``: the cluster's Kubernetes version, so nodes follow control-plane upgrades.
* Capacity: ``ON_DEMAND``, ``SPOT``, or ``CAPACITY_BLOCK`` (market type
  ``capacity-block`` and the block's reservation as target). An on-demand
  capacity reservation (``capacity_reservation_id``) is targeted the same way.
* EFA: one interface per EFA-capable network card from the catalog (device index
  0 on card 0, 1 on the others, as AWS documents for multi-card types such as
  p4d/p5; ``efa-only`` on the other cards where the catalog says so, p5), and a
  security group open only to itself (EFA traffic must be allowed to and from the
  group) on every interface. With interfaces in the launch template, security
  groups go on the interfaces. No public-IP flag: EC2 rejects it on multi-interface
  launches and the private subnets assign none anyway.
* Placement: ``placement_group_name`` (an existing group, e.g. the one an on-demand
  capacity reservation was created in: instances that target such a reservation
  must launch in it) is used as is. Otherwise an EFA group without a reservation
  gets a new *cluster* placement group; with a reservation none is created (a new
  group can never be the reservation's), and never with a capacity block (blocks
  are already co-located in an UltraCluster).
* Updates: groups in a reservation or capacity block replace nodes with the
  ``MINIMAL`` strategy (terminate, then launch): a full reservation has no room for
  the surge instances the default strategy launches first.
* Node auto repair (``node_repair``): EKS replaces or reboots a node that turns
  NotReady or that the ``eks-node-monitoring-agent`` add-on reports unhealthy
  (``AcceleratedHardwareReady`` for GPU XID/ECC/NVLink faults). In a reservation or
  capacity block at most one node is repaired at a time (:func:`node_repair_config`).
* The Lustre client (``lustre_client``, stacks on FSx for Lustre): installed by the node's own user data
  (:mod:`eks_ddp.infra.node_user_data`).
* Single-zone groups (EFA, a reservation, or an explicit ``availability_zone``)
  use only the private subnet of that zone; others use every private subnet.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from eks_ddp.core import catalog, k8s_versions, rules, scheduling
from eks_ddp.core.types import CapacityType, LocalStorage
from eks_ddp.infra.node_user_data import MEMLOCK_BYTES, node_config_user_data, node_user_data  # noqa: F401 (as before)

GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_POOL = "gpu"
IMDS_HOP_LIMIT = 1
MIN_ROOT_VOLUME_GIB = rules.MIN_ROOT_VOLUME_GIB

#: Longest group name: the stack config's limit (the name goes into the EKS node group's and resources' names).
GROUP_NAME_MAX = 40

_EKS_CAPACITY = {"onDemand": "ON_DEMAND", "spot": "SPOT", "capacityBlock": "CAPACITY_BLOCK"}


@dataclass(frozen=True, kw_only=True)
class GpuNodeGroupArgs:
    """Inputs of :class:`GpuNodeGroup`."""

    group_name: str
    """Short name of the group (a DNS label): the ``eks-ddp/node-group`` label value."""
    cluster_name: pulumi.Input[str]
    """EKS cluster to join."""
    node_role_arn: pulumi.Input[str]
    """IAM role of the nodes (needs an EC2_LINUX access entry on the cluster)."""
    subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    """Private subnets the group may use (all zones); an Output is passed through whole."""
    subnet_by_az: Mapping[str, pulumi.Input[str]]
    """Zone -> private subnet, for single-zone groups (EFA, reservations)."""
    node_security_group_id: pulumi.Input[str]
    """The cluster's node security group (EFS and node-to-node traffic)."""
    cluster_security_group_id: pulumi.Input[str]
    """The EKS cluster security group: EKS adds it only when a template sets no groups, so we add it."""
    instance_type: str
    """GPU instance type from the catalog."""
    vpc_id: pulumi.Input[str] | None = None
    """VPC of the subnets; required with ``efa`` (for the EFA security group)."""
    min_size: int = 0
    """Minimum nodes; 0 lets the group scale to zero."""
    desired_size: int = 0
    """Nodes at creation; ignored afterwards."""
    max_size: int = 2
    """Maximum nodes."""
    capacity_type: CapacityType = "onDemand"
    """'onDemand', 'spot' or 'capacityBlock'."""
    efa: bool = False
    """Attach the type's EFA interfaces, a cluster placement group, and keep the group in one zone."""
    capacity_reservation_id: str | None = None
    """On-demand capacity reservation or capacity block (cr-...) to launch into."""
    availability_zone: str | None = None
    """Pin the group to this zone (the reservation's zone when one is given)."""
    placement_group_name: str | None = None
    """Existing placement group to launch into (the reservation's, if it was made in one); not with a capacity block."""
    root_volume_gib: int = 200
    """gp3 root volume size in GiB."""
    spot_instance_types: Sequence[str] = ()
    """More types a ``spot`` group may launch besides ``instance_type`` (EKS recommends several for spot:
    fewer interruptions and InsufficientCapacity): each with the same GPU count and model, so the job's
    processes per node and its labels hold on every node."""
    tags: dict[str, str] | None = None
    """Extra tags for the AWS resources."""
    kubernetes_version: pulumi.Input[str] | None = None
    """The cluster's Kubernetes minor version: the group's nodes follow it, so a control-plane upgrade
    (one minor) moves the nodes in the same ``pulumi up`` and the next upgrade is not refused for nodes
    left behind. None leaves the group at the cluster's version at creation (EKS's default)."""
    node_repair: bool = True
    """EKS node auto repair: replace (or reboot) a node that is NotReady or that the node monitoring agent reports
    unhealthy; a GPU that throws XIDs otherwise leaves its node Ready and the same rank failing."""
    release_version: str | None = None
    """EKS AMI release of the nodes (``1.35.6-20260714``): pinned, so nodes launched later boot the same release;
    None: ``k8s_versions.AMI_RELEASE_VERSIONS`` for ``kubernetes_version`` (EKS's newest at creation without one)."""
    capacity_block_window: tuple[dt.datetime, dt.datetime] | None = None
    """With ``capacityBlock``: the block's (start, end), UTC. Scheduled actions on the group's Auto Scaling group open
    it at the start and close it (0 nodes, max 0) :data:`BLOCK_SCALE_DOWN_BEFORE_END` before the end."""
    local_storage: LocalStorage = "RAID0"
    """``RAID0``: the type's NVMe instance store (catalog ``local_nvme_gb``) as one RAID0 array for images and
    scratch (nodeadm ``localStorage``); ``none``: everything on the root volume. No effect on a type without one."""
    lustre_client: bool = False
    """Install the Lustre client at boot (``infra.node_user_data.lustre_client_script``): the stack's shared storage is
    FSx for Lustre, which the nodes mount (the AL2023 NVIDIA AMI has no Lustre client)."""


def validate(args: GpuNodeGroupArgs) -> catalog.InstanceType:
    """Raise ValueError naming the bad field (the stack config's rules); return the catalog entry.

    Fields the program needs as values (names, sizes, zones, choices) refuse an Output with a message saying
    so; ``pulumi.Input`` fields (ids, ARNs, the subnet list) are passed through unchecked."""
    why = "the program compares and labels with it"
    rules.require(
        rules.known("group_name", args.group_name, "a name", "it names and labels the nodes")
        or rules.dns_label("group_name", args.group_name, GROUP_NAME_MAX),
        rules.known("instance_type", args.instance_type, "an instance type", "it sizes pods and EFA interfaces"),
        rules.whole("min_size", args.min_size, 0), rules.whole("desired_size", args.desired_size, 0),
        rules.whole("max_size", args.max_size, 1),
        *[rules.known(f, getattr(args, f), "a plain value", why) for f in (
            "capacity_type", "efa", "availability_zone", "subnet_by_az", "spot_instance_types", "root_volume_gib",
            "node_repair", "local_storage")],
        None if args.capacity_reservation_id is None
        else rules.capacity_reservation_id("capacity_reservation_id", args.capacity_reservation_id),
        None if args.availability_zone is None or rules.is_output(args.availability_zone)
        else rules.zone("availability_zone", args.availability_zone))
    it = catalog.CATALOG.get(args.instance_type)
    if it is None or it.gpus == 0:
        raise ValueError(f"instance_type: got {args.instance_type!r}; expected a GPU type from the catalog: "
                         + ", ".join(catalog.gpu_types()) + "; or one added with catalog.register(InstanceType(...))")
    if args.min_size < 0:
        raise ValueError(f"min_size: got {args.min_size}; expected >= 0")
    if args.max_size < 1:
        raise ValueError(f"max_size: got {args.max_size}; expected >= 1")
    if args.min_size > args.max_size:
        raise ValueError(f"min_size: got {args.min_size}; expected <= max_size ({args.max_size})")
    if not args.min_size <= args.desired_size <= args.max_size:
        raise ValueError(f"desired_size: got {args.desired_size}; expected between min_size ({args.min_size}) "
                         f"and max_size ({args.max_size})")
    if args.capacity_block_window is not None:
        start, end = args.capacity_block_window
        if args.capacity_type != "capacityBlock":
            raise ValueError(f"capacity_block_window: set with capacity_type {args.capacity_type!r}; expected "
                             "'capacityBlock'")
        if start.utcoffset() != dt.timedelta(0) or end.utcoffset() != dt.timedelta(0) or end <= start:
            raise ValueError(f"capacity_block_window: got ({start.isoformat()}, {end.isoformat()}); expected (start, "
                             "end) in UTC with end after start")
    if args.release_version is not None and isinstance(args.kubernetes_version, str) and (
            bad := k8s_versions.ami_release_problem("release_version", args.release_version, args.kubernetes_version)):
        raise ValueError(bad)
    if args.local_storage not in ("RAID0", "none"):
        raise ValueError(f"local_storage: got {args.local_storage!r}; expected 'RAID0' or 'none'")
    if args.capacity_type not in _EKS_CAPACITY:
        raise ValueError(f"capacity_type: got {args.capacity_type!r}; expected one of {', '.join(_EKS_CAPACITY)}")
    if args.efa and not it.has_efa:
        raise ValueError(f"efa: got True for {args.instance_type!r}, which has no EFA interfaces; expected False "
                         "or an EFA type (" + ", ".join(n for n in catalog.gpu_types() if catalog.CATALOG[n].has_efa)
                         + ")")
    for i, other in enumerate(args.spot_instance_types):
        alt = catalog.CATALOG.get(other)
        if args.capacity_type != "spot":
            raise ValueError(f"spot_instance_types: got {list(args.spot_instance_types)!r} with capacity_type "
                             f"{args.capacity_type!r}; expected capacity_type 'spot' (or no extra types)")
        if alt is None or (alt.gpus, alt.gpu_model) != (it.gpus, it.gpu_model) or other == args.instance_type:
            raise ValueError(f"spot_instance_types[{i}]: got {other!r}; expected another catalog type with "
                             f"{it.gpus} x {it.gpu_model} GPU like {args.instance_type}")
    if args.capacity_type == "capacityBlock" and not args.capacity_reservation_id:
        raise ValueError("capacity_reservation_id: required with capacity_type 'capacityBlock'")
    if args.capacity_reservation_id and args.capacity_type == "spot":
        raise ValueError("capacity_type: got 'spot' with capacity_reservation_id; expected 'onDemand' or "
                         "'capacityBlock'")
    if args.placement_group_name and args.capacity_type == "capacityBlock":
        raise ValueError(f"placement_group_name: got {args.placement_group_name!r} with capacity_type "
                         "'capacityBlock'; expected None (capacity blocks are already co-located)")
    if args.capacity_reservation_id and not args.availability_zone:
        raise ValueError("availability_zone: required with capacity_reservation_id (the reservation's zone)")
    rules.require(rules.root_volume_gib("root_volume_gib", args.root_volume_gib))
    if not rules.is_output(args.subnet_ids) and not args.subnet_ids:
        raise ValueError("subnet_ids: got []; expected the cluster's private subnets")
    if args.availability_zone is not None and args.availability_zone not in args.subnet_by_az:
        raise ValueError(f"availability_zone: got {args.availability_zone!r}; expected a zone with a private "
                         f"subnet: {', '.join(args.subnet_by_az) or '(none)'}")
    if args.efa and args.vpc_id is None:
        raise ValueError("vpc_id: required with efa (the EFA security group lives in the VPC)")
    if args.efa and not args.availability_zone and not args.subnet_by_az:
        raise ValueError("subnet_by_az: got {}; expected zone -> subnet so the EFA group can stay in one zone")
    return it


def efa_device_index(card: int) -> int:
    """Device index of the EFA interface on network card ``card``: 0 on the primary card, 1 elsewhere."""
    return 0 if card == 0 else 1


def efa_interface_type(it: catalog.InstanceType, card: int) -> str:
    """``efa`` on the primary card; ``efa-only`` (no IP address, EFA traffic only) elsewhere where the type wants it."""
    return "efa-only" if card > 0 and it.efa_only_secondary else "efa"


BLOCK_HOLD_CRON = "*/5 * * * *"
"""How often the "hold" action re-closes a capacity block's group before the block starts (Auto Scaling recurring
scheduled actions take a Unix cron expression, UTC)."""
BLOCK_HOLD_LEAD = dt.timedelta(minutes=5)
"""The hold ends this long before the block's start, so it never runs at the same time as "open"."""
BLOCK_SCALE_DOWN_BEFORE_END = dt.timedelta(minutes=60)
"""How long before a capacity block's end the group is scaled to zero: EC2 starts terminating the instances 30
minutes before the end and EKS scales the group down 40 minutes before it (EKS user guide, "Create a managed node
group with Capacity Blocks for ML", awsdocs/amazon-eks-user-guide latest/ug/ml/capacity-blocks-mng.adoc); an hour
leaves the elastic job time to checkpoint and the autoscaler no room to launch into the block again."""


def release_version(args: GpuNodeGroupArgs) -> str | None:
    """The AMI release the group's nodes run: ``release_version``, else the pin for its Kubernetes version."""
    if args.release_version is not None or not isinstance(args.kubernetes_version, str):
        return args.release_version
    return k8s_versions.AMI_RELEASE_VERSIONS.get(args.kubernetes_version)


def uses_raid0(args: GpuNodeGroupArgs, it: catalog.InstanceType) -> bool:
    """Whether the group's nodes put their instance store under the kubelet and containerd as RAID0."""
    return args.local_storage == "RAID0" and it.local_nvme_gb > 0


def update_strategy(args: GpuNodeGroupArgs) -> str:
    """``MINIMAL`` in a reservation or capacity block (no room to surge), else EKS's ``DEFAULT``."""
    return "MINIMAL" if args.capacity_reservation_id else "DEFAULT"


RESERVED_PARALLEL_REPAIRS = 1
"""Repairs at once in a reservation or capacity block."""


def node_repair_config(args: GpuNodeGroupArgs) -> aws.eks.NodeGroupNodeRepairConfigArgs:
    """Node auto repair on or off (explicitly: turning it off must reach EKS). In a reservation or capacity block
    repairs go one node at a time: a repair terminates the node and its replacement launches into the slot that
    frees, so every further repair at once takes one more of the run's nodes away with no capacity to replace it
    sooner (the elastic job shrinks by one node, not by several); elsewhere EKS's default applies."""
    if not args.node_repair:
        return aws.eks.NodeGroupNodeRepairConfigArgs(enabled=False)
    return aws.eks.NodeGroupNodeRepairConfigArgs(
        enabled=True,
        max_parallel_nodes_repaired_count=RESERVED_PARALLEL_REPAIRS if args.capacity_reservation_id else None)


class GpuNodeGroup(pulumi.ComponentResource):
    """A tainted GPU managed node group with its own launch template (optionally EFA, reservation, spot)."""

    node_group_name: pulumi.Output[str]
    node_labels: dict[str, str]
    """Labels every node of the group carries (the job's nodeSelector)."""
    zone: str | None
    """The single zone of the group, or None when it spans every private subnet."""
    max_size: int
    """The most nodes the group (and so a job on it: one agent per node) can get."""
    instance_type: str
    """The group's GPU instance type (a job on it: ``Placement.on(group)``)."""
    efa: bool
    """The group's nodes attach EFA interfaces."""

    def __init__(self, name: str, args: GpuNodeGroupArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:gpu_nodegroup:GpuNodeGroup", name, None, opts)
        it = validate(args)
        self._name, self._args = name, args
        self.group_name = args.group_name
        self.max_size = args.max_size
        self.instance_type, self.efa = args.instance_type, args.efa
        self._tags = {"eks-ddp/node-group": args.group_name, **(args.tags or {})}
        child = pulumi.ResourceOptions(parent=self)

        single_zone = args.efa or args.capacity_reservation_id is not None or args.availability_zone is not None
        self.zone = (args.availability_zone or next(iter(args.subnet_by_az))) if single_zone else None
        subnet_ids = [args.subnet_by_az[self.zone]] if self.zone else rules.listed(args.subnet_ids)

        self.node_labels = {
            "eks-ddp/node-group": args.group_name,
            "eks-ddp/pool": GPU_POOL,
            "eks-ddp/instance-type": args.instance_type,
        }

        # The label the autoscaler's AWS provider reads to know a node has GPUs: it then waits for the device
        # plugin to advertise them on a new node instead of launching more nodes for the still-Pending pods.
        group_labels = {**self.node_labels, scheduling.AWS_GPU_LABEL: f"nvidia-{it.gpu_model.lower()}"}

        placement = None
        network_interfaces = None
        node_sgs = [args.cluster_security_group_id, args.node_security_group_id]
        pg_name: pulumi.Input[str] | None = args.placement_group_name
        if args.efa and pg_name is None and args.capacity_reservation_id is None:
            pg = aws.ec2.PlacementGroup(f"{name}-pg", strategy="cluster", tags=self._tags, opts=child)
            pg_name = pg.name
        if args.efa:
            efa_sg = self._create_efa_security_group()
            network_interfaces = [
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=card, device_index=efa_device_index(card),
                    interface_type=efa_interface_type(it, card), delete_on_termination="true",
                    security_groups=[*node_sgs, efa_sg.id])
                for card in range(it.efa_interfaces)
            ]
        if pg_name is not None or self.zone is not None:
            placement = aws.ec2.LaunchTemplatePlacementArgs(group_name=pg_name, availability_zone=self.zone)

        reservation = None
        if args.capacity_reservation_id:
            reservation = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(  # noqa: E501
                    capacity_reservation_id=args.capacity_reservation_id))
        capacity_block = args.capacity_type == "capacityBlock"

        lt = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"GPU nodes {args.group_name} ({args.instance_type})",
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=IMDS_HOP_LIMIT,
                instance_metadata_tags="disabled"),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name="/dev/xvda",
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=args.root_volume_gib, volume_type="gp3", encrypted="true",
                    delete_on_termination="true"))],
            # With interfaces in the template, groups must go on the interfaces, not here.
            vpc_security_group_ids=None if network_interfaces else node_sgs,
            network_interfaces=network_interfaces,
            placement=placement,
            capacity_reservation_specification=reservation,
            instance_market_options=aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
            if capacity_block else None,
            # EKS wants a capacity block's instance type in the template, not on the node group.
            instance_type=args.instance_type if capacity_block else None,
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(
                resource_type="instance", tags={**self._tags, "Name": f"{name}"})],
            user_data=node_user_data(efa=args.efa, raid0=uses_raid0(args, it), lustre_client=args.lustre_client),
            update_default_version=True,
            tags=self._tags,
            opts=child)

        group = aws.eks.NodeGroup(
            f"{name}",
            cluster_name=args.cluster_name,
            node_role_arn=args.node_role_arn,
            subnet_ids=subnet_ids,
            ami_type=GPU_AMI_TYPE,
            version=args.kubernetes_version,
            release_version=release_version(args),
            capacity_type=_EKS_CAPACITY[args.capacity_type],
            instance_types=None if capacity_block else [args.instance_type, *args.spot_instance_types],
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=args.min_size, desired_size=args.desired_size, max_size=args.max_size),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1, update_strategy=update_strategy(args)),
            node_repair_config=node_repair_config(args),
            labels=group_labels,
            taints=[aws.eks.NodeGroupTaintArgs(key=GPU_TAINT_KEY, value="true", effect="NO_SCHEDULE")],
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=lt.id, version=lt.latest_version.apply(str)),
            tags=self._tags,
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["scalingConfig.desiredSize"]),
        )
        self.node_group_name = group.node_group_name
        self.node_group = group
        """The ``aws.eks.NodeGroup`` (for a composing program's own dependencies and outputs)."""
        self.launch_template = lt
        """Its ``aws.ec2.LaunchTemplate`` (IMDSv2, root volume, EFA interfaces, placement)."""
        self._tag_node_template(group, scheduling.node_template_tags(
            labels=group_labels, taints=[(GPU_TAINT_KEY, "true", "NoSchedule")], instance_type=args.instance_type,
            efa=args.efa, root_volume_gib=args.root_volume_gib))
        self._schedule_capacity_block(group)
        self.register_outputs({"node_group_name": self.node_group_name, "node_labels": self.node_labels})

    def _tag_node_template(self, group: aws.eks.NodeGroup, tags: Mapping[str, str]) -> None:
        """Node-template tags on the group's Auto Scaling group, so the cluster autoscaler can scale it up from
        zero (see components/eks_ddp/core/scheduling.py). EKS does not copy node group tags to the ASG; the tag list is
        fixed here, only the ASG name is known after the group exists."""
        asg_name = group.resources.apply(lambda r: r[0].autoscaling_groups[0].name)
        for key, value in sorted(tags.items()):
            # Named by the tag key, not its position: adding a label later must not re-key the other tags.
            short = key.removeprefix(scheduling.TAG_PREFIX + "node-template/").replace("/", "-")
            aws.autoscaling.Tag(f"{self._name}-{short}", autoscaling_group_name=asg_name,
                                tag=aws.autoscaling.TagTagArgs(key=key, value=value, propagate_at_launch=False),
                                opts=pulumi.ResourceOptions(parent=self))

    def _schedule_capacity_block(self, group: aws.eks.NodeGroup) -> None:
        """A capacity block's window on the group's Auto Scaling group: held closed until the start, open (max
        ``max_size``) at the start, closed (min, max and desired 0) :data:`BLOCK_SCALE_DOWN_BEFORE_END` before the
        end, so the autoscaler neither launches into the block before it starts nor after EC2 begins reclaiming it
        (30 minutes before the end; EKS's own scale-down comes 40 minutes before it). EKS creates the group's Auto
        Scaling group with max ``maxSize`` (and refuses a node group max of 0), so "open" alone changes nothing
        before the start: a recurring "hold" action (every :data:`BLOCK_HOLD_CRON`, ending before "open") keeps
        max at 0 until then, also after an ``up`` re-applies the node group's max. An action already due is not
        created (Auto Scaling refuses a time in the past)."""
        window = self._args.capacity_block_window
        if window is None:
            return
        asg_name = group.resources.apply(lambda r: r[0].autoscaling_groups[0].name)
        start, end = window
        now = dt.datetime.now(dt.UTC)
        cr = self._args.capacity_reservation_id
        if start - BLOCK_HOLD_LEAD > now:
            aws.autoscaling.Schedule(
                f"{self._name}-{cr}-hold", scheduled_action_name=f"eks-ddp-{cr}-hold",
                autoscaling_group_name=asg_name, recurrence=BLOCK_HOLD_CRON,
                end_time=(start - BLOCK_HOLD_LEAD).strftime("%Y-%m-%dT%H:%M:%SZ"),
                min_size=0, max_size=0, desired_capacity=0, opts=pulumi.ResourceOptions(parent=self))
        for action, when, (low, high, desired) in (("open", start, (0, self._args.max_size, -1)),
                                                   ("close", end - BLOCK_SCALE_DOWN_BEFORE_END, (0, 0, 0))):
            if when <= now:
                continue
            aws.autoscaling.Schedule(
                f"{self._name}-{cr}-{action}", scheduled_action_name=f"eks-ddp-{cr}-{action}",
                autoscaling_group_name=asg_name, start_time=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                min_size=low, max_size=high, desired_capacity=desired,
                opts=pulumi.ResourceOptions(parent=self))

    def _create_efa_security_group(self) -> aws.ec2.SecurityGroup:
        name = self._name
        child = pulumi.ResourceOptions(parent=self)
        sg = aws.ec2.SecurityGroup(f"{name}-efa", vpc_id=self._args.vpc_id,
                                   description=f"EFA traffic within node group {self._args.group_name}",
                                   tags={**self._tags, "Name": f"{name}-efa"}, opts=child)
        # EFA's OS-bypass traffic is only allowed between interfaces whose groups admit each other.
        aws.vpc.SecurityGroupIngressRule(f"{name}-efa-in", security_group_id=sg.id,
                                         referenced_security_group_id=sg.id, ip_protocol="-1",
                                         description="All traffic from EFA peers", opts=child)
        aws.vpc.SecurityGroupEgressRule(f"{name}-efa-out", security_group_id=sg.id,
                                        referenced_security_group_id=sg.id, ip_protocol="-1",
                                        description="All traffic to EFA peers", opts=child)
        return sg
