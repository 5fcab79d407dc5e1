"""Which stack owns a cluster and its log group: the owner tag's name and value (pure; no AWS SDK).

The EKS cluster and its log group carry ``eks-ddp/stack = <organization>/<project>/<stack>[/<cluster.ownerId>]``;
the infrastructure writes it and preflight and the log group's adoption compare it.
"""

from __future__ import annotations

STACK_TAG = "eks-ddp/stack"
"""Tag on the EKS cluster naming the stack that owns it (``<organization>/<project>/<stack>``); set by
components/eks_ddp/infra/cluster.py and read by preflight (components/eks_ddp/tooling/preflight/live.py)."""
DIY_ORGANIZATION = "organization"
"""What ``pulumi.get_organization()`` returns on every self-managed (DIY) backend."""


def owner_id(organization: str, project: str, stack: str, stack_owner_id: str | None = None) -> str:
    """The stack's owner tag: ``<organization>/<project>/<stack>``, plus ``/<cluster.ownerId>`` when set (unique on
    a self-managed backend, where the organization is always ``organization``)."""
    base = f"{organization}/{project}/{stack}"
    return f"{base}/{stack_owner_id}" if stack_owner_id else base


def legacy_owner(stack_id: str | None) -> str | None:
    """The owner tag a DIY stack wrote before it had ``cluster.ownerId``."""
    if stack_id is None or stack_id.count("/") != 3 or not stack_id.startswith(DIY_ORGANIZATION + "/"):
        return None
    return stack_id.rsplit("/", 1)[0]
