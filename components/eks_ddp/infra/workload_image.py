"""WorkloadImage: a run's own image made pullable by the nodes, and gated on its ECR scan like the stack's image.

Nodes pull images with the node IAM role: "Permissions for the kubelet to use container images from Amazon
Elastic Container Registry (Amazon ECR), such as provided by the AmazonEC2ContainerRegistryPullOnly policy"
(EKS user guide, "Amazon EKS node IAM role", create-node-role.html; ECR user guide "Using Amazon ECR Images with
Amazon EKS": "The Amazon EKS worker node IAM role ... must contain the following IAM policy permissions").
:class:`eks_ddp.infra.cluster.EksCluster`'s node role pulls only what it is granted (the EKS add-on registry, and
the repositories granted to it), so an image in any other repository stays in ImagePullBackOff unless it gets a
grant. This component gives ``node_role_name`` a pull-only inline policy on exactly the image's repository
(:func:`eks_ddp.infra.image.pull_policy`, partition-aware ARN) and passes the image through the ECR scan gate
(:class:`eks_ddp.infra.scan_gate.ScanGate`): ``image_ref`` resolves only once the scan passed and the grant exists,
so no Job receives the image before either.

Images outside ECR (Docker Hub, ghcr.io, nvcr.io, public.ecr.aws) get neither: the kubelet pulls them without
the node role (anonymously, or with an imagePullSecret), and ECR has no scan of them. They are still pinned by
digest: every image reference a run takes is validated as ``repo@sha256:<64 hex>``.

An image in another account's repository also needs that repository's policy to allow this account (or the
node role): across accounts both the identity policy and the resource policy must allow (IAM user guide,
"Cross-account policy evaluation logic"). The plan cannot see the other account's policy; preflight's
``ecr:DescribeImages`` reports the image missing or unreadable before anything is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import pulumi
import pulumi_aws as aws

from eks_ddp.core import rules
from eks_ddp.core.types import ScanSeverity
from eks_ddp.infra.image import ecr_repository_arn, pull_policy
from eks_ddp.infra.scan_gate import ScanGate, scan_target

SCAN_SEVERITIES = get_args(ScanSeverity)


@dataclass(frozen=True, kw_only=True)
class WorkloadImageArgs:
    """Arguments of :class:`WorkloadImage`."""

    image: str
    """The image, pinned by digest: ``repo@sha256:<64 hex>``."""
    node_role_name: pulumi.Input[str] | None = None
    """IAM role of the nodes that run it (``EksCluster.node_role_name``): gets pull rights on exactly the image's
    ECR repository. None: no grant (the role must already be allowed to pull it)."""
    scan_fail_severity: str = "CRITICAL"
    """Fail ``pulumi up`` before any Job gets the image if ECR's scan finds anything at or above this severity
    (CRITICAL, HIGH, MEDIUM, LOW, INFORMATIONAL), or ``disabled``. Images outside ECR are not gated."""
    scan_setting: str = "WorkloadImageArgs.scan_fail_severity"
    """What the scan gate's failures tell you to change: this field, or the caller's own name for it."""
    aws_profile: str | None = None
    """The AWS profile the scan gate reads ECR with (it runs in the program, with boto3)."""

    def __post_init__(self) -> None:
        rules.require(
            rules.image_by_digest("image", self.image),
            None if self.scan_fail_severity in SCAN_SEVERITIES else
            f"scan_fail_severity: got {self.scan_fail_severity!r}; expected one of {', '.join(SCAN_SEVERITIES)}")


class WorkloadImage(pulumi.ComponentResource):
    """A run image: a pull-only grant on its ECR repository for the nodes, and the scan gate."""

    image_ref: pulumi.Output[str]
    """The image reference, once the scan passed and the grant exists: what the pods run."""
    repository_arn: str | None
    """The image's ECR repository (None outside ECR)."""

    def __init__(self, name: str, args: WorkloadImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("eks-ddp:workload_image:WorkloadImage", name, None, opts)
        self.repository_arn = ecr_repository_arn(args.image)
        child = pulumi.ResourceOptions(parent=self)
        self.node_policy = None
        ref: pulumi.Output[str] = pulumi.Output.from_input(args.image)
        if args.scan_fail_severity != "disabled" and scan_target(args.image):
            ref = ScanGate(f"{name}-scan", image_ref=args.image, fail_at=args.scan_fail_severity,
                           setting=args.scan_setting, profile=args.aws_profile, opts=child).image_ref
        if args.node_role_name is not None and self.repository_arn is not None:
            self.node_policy = aws.iam.RolePolicy(
                f"{name}-node-pull", role=args.node_role_name,
                policy=pull_policy(self.repository_arn, sid="PullWorkloadImage"), opts=child)
            # The pods wait for the grant too: a pull before it would back off for minutes.
            ref = pulumi.Output.all(ref, self.node_policy.id).apply(lambda v: v[0])
        self.image_ref = ref
        self.register_outputs({"image_ref": self.image_ref, "repository_arn": self.repository_arn})


def workload_image_name(image: str) -> str:
    """A stable, readable resource name for an image: ``<last repository path part>-<8 hex of the digest>``."""
    repo, _, digest = image.partition("@")
    last = repo.rsplit("/", 1)[-1].split(":", 1)[0].lower()
    return f"{''.join(c if c.isalnum() or c == '-' else '-' for c in last)[:40]}-{digest.removeprefix('sha256:')[:8]}"
