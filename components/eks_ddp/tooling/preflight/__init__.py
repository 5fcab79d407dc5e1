"""Preflight: check, before anything billable exists, what otherwise fails 15 minutes into ``pulumi up``.

For the stack's region it asks EC2 and Service Quotas whether

- every node group's instance type is offered in each zone its nodes may land in
  (the group's ``availabilityZone``, else ``network.availabilityZones``, else the
  zones ``config.choose_zones`` gives the new VPC: pinned zones first, the same
  zones ``__main__.py`` picks);
- the type supports EFA where the group asks for it;
- running + requested vCPUs fit the on-demand or spot vCPU quota of the type's
  class (G and VT, P, Standard), counting every group at ``maxSize`` (this
  cluster's own running nodes are part of that, not on top of it) and, for
  on-demand, the unused slots of every active capacity reservation in the region
  (reserved capacity counts against the quota even while unused);
- a named capacity reservation exists, is active, matches the group's type and
  zone, and has at least ``desiredSize`` instances free; a capacity block's window
  (``capacityBlockStart``/``End``) is the block's own;
- a new VPC and its NAT gateways' Elastic IPs fit the VPC and Elastic IP quotas
  (:mod:`eks_ddp.tooling.preflight.network_quotas`);
- the group's ``placementGroupName`` is the placement group the reservation was
  created in (instances that target such a reservation must launch in that group,
  so a mismatch or a missing name cannot use the reservation), and a named
  placement group exists in the region (a *cluster* group for EFA).

:func:`check` is pure (clients in, :class:`Report` out, no Pulumi) so tests drive
it with moto; :func:`run_or_raise` is what ``__main__.py`` calls. Every failure is
one line naming the stack key to change. API errors (no credentials, no network,
a denied action) become warnings naming what could not be checked: preflight
never stops a deployment it could not evaluate.

With an EKS client and the cluster name it also checks what the stack already runs
(:mod:`eks_ddp.tooling.preflight.live`): the cluster name's owner, the version step, resizes
against live desired sizes, and this cluster's own nodes (not counted twice).

On an FSx for Lustre stack it also checks the backup ``storage.fsxBackupId`` restores, and refuses a change that
would replace the live file system with an empty one unless ``storage.fsxReplace`` names it
(:mod:`eks_ddp.tooling.preflight.fsx`).

With ECR clients it also checks that every ECR image the stack names (``image.prebuilt``,
``runs[i].workload.image``) exists by its digest (:mod:`eks_ddp.tooling.preflight.images`).

IAM actions used (all read-only): ecr:DescribeImages, eks:DescribeCluster, eks:ListNodegroups, eks:DescribeNodegroup,
ec2:DescribeAvailabilityZones, ec2:DescribeSubnets,
ec2:DescribeInstanceTypeOfferings, ec2:DescribeInstanceTypes, ec2:DescribeInstances,
ec2:DescribeCapacityReservations, ec2:DescribePlacementGroups, ec2:DescribeVpcs, ec2:DescribeAddresses,
servicequotas:GetServiceQuota,
servicequotas:GetAWSDefaultServiceQuota; for stacks that name buckets (components/eks_ddp/tooling/preflight/s3.py) also
sts:GetCallerIdentity, s3:ListBucket (HeadBucket), s3:GetEncryptionConfiguration, kms:DescribeKey; for FSx for Lustre
stacks (components/eks_ddp/tooling/preflight/fsx.py) also fsx:DescribeBackups, fsx:DescribeFileSystems,
ec2:DescribeSecurityGroups.
"""


from eks_ddp.tooling.preflight.capacity import placement_group_of
from eks_ddp.tooling.preflight.checker import QUOTAS, Report, check, quota_class, run_or_raise
from eks_ddp.tooling.preflight.clients import clients, clients_sts, ecr_clients, logs_client

__all__ = ["QUOTAS", "Report", "check", "clients", "clients_sts", "ecr_clients", "logs_client", "placement_group_of",
           "quota_class", "run_or_raise"]
